//! Byte compatibility with what real clients speak: the codec of the official Rust stream client
//! (`rabbitmq-stream-protocol`, the one `rabbitmq-stream-client` sends and reads with) against
//! ours, both ways, for every command both know.
//!
//! - client requests, encoded by the client, decode with ours to the same values;
//! - our encoding of those requests decodes with the client to the same values;
//! - what a server sends, encoded by us, decodes with the client to the same values, and where
//!   the client can encode it (its types with public constructors), the reverse.
//!
//! Where the client cannot follow the protocol, the generators stay inside what it can: it reads
//! an empty string as null and then fails (so strings here are non-empty when the client
//! decodes), it reads Publish only as version 1, it never decodes a ConsumerUpdate answer (it
//! matches the key with the response bit after stripping it), and it panics on offset type 0.

mod stream_support;

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use rabbitmq_stream_protocol as client;
use rabbitmq_stream_protocol::codec::{Decoder, Encoder};
use rabbitmq_stream_protocol::commands as cc;
use std::collections::HashMap;
use stream_support::{command, Text};
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{self, Command, OffsetSpec, PublishedMessage};

fn client_code(code: u16) -> client::ResponseCode {
    client::ResponseCode::try_from(code).expect("generators give codes 1-19")
}

fn client_offset(o: OffsetSpec) -> cc::subscribe::OffsetSpecification {
    use cc::subscribe::OffsetSpecification as C;
    match o {
        OffsetSpec::First => C::First,
        OffsetSpec::Last => C::Last,
        OffsetSpec::Next => C::Next,
        OffsetSpec::Offset(o) => C::Offset(o),
        OffsetSpec::Timestamp(t) => C::Timestamp(t),
    }
}

fn map(m: &[(String, String)]) -> HashMap<String, String> {
    m.iter().cloned().collect()
}

/// A client AMQP 1.0 message carrying `body`, and its encoding (what travels in a Publish).
fn client_message(body: &[u8]) -> (client::message::Message, Bytes) {
    let m = client::message::Message::builder()
        .body(body.to_vec())
        .build();
    let mut wire = Vec::new();
    m.encode(&mut wire).unwrap();
    (m, Bytes::from(wire))
}

/// Our Publish's messages replaced by client-encoded AMQP 1.0 messages (the client parses them).
fn with_client_messages(c: Command) -> Command {
    match c {
        Command::Publish {
            publisher_id,
            messages,
        } => Command::Publish {
            publisher_id,
            messages: messages
                .into_iter()
                .map(|m| PublishedMessage {
                    sub_batch: None,
                    message: client_message(&m.message).1,
                    ..m
                })
                .collect(),
        },
        other => other,
    }
}

/// The client's request for one of ours; `None` for what a client does not send.
fn client_request(c: &Command) -> Option<client::Request> {
    use Command::*;
    Some(match c.clone() {
        DeclarePublisher {
            correlation_id,
            publisher_id,
            reference,
            stream,
        } => cc::declare_publisher::DeclarePublisherCommand::new(
            correlation_id,
            publisher_id,
            Some(reference),
            stream,
        )
        .into(),
        Publish {
            publisher_id,
            messages,
        } => {
            let version = c.version();
            let messages = messages
                .into_iter()
                .map(|m| {
                    let (body, _) = decode_client_message(&m.message);
                    client::types::PublishedMessage::new(m.publishing_id, body, m.filter_value)
                })
                .collect();
            cc::publish::PublishCommand::new(publisher_id, messages, version).into()
        }
        QueryPublisherSequence {
            correlation_id,
            reference,
            stream,
        } => cc::query_publisher_sequence::QueryPublisherRequest::new(
            correlation_id,
            reference,
            stream,
        )
        .into(),
        DeletePublisher {
            correlation_id,
            publisher_id,
        } => cc::delete_publisher::DeletePublisherCommand::new(correlation_id, publisher_id).into(),
        Subscribe {
            correlation_id,
            subscription_id,
            stream,
            offset,
            credit,
            properties,
        } => cc::subscribe::SubscribeCommand::new(
            correlation_id,
            subscription_id,
            stream,
            client_offset(offset),
            credit,
            map(&properties),
        )
        .into(),
        Credit {
            subscription_id,
            credit,
        } => cc::credit::CreditCommand::new(subscription_id, credit).into(),
        StoreOffset {
            reference,
            stream,
            offset,
        } => cc::store_offset::StoreOffset::new(reference, stream, offset).into(),
        QueryOffset {
            correlation_id,
            reference,
            stream,
        } => cc::query_offset::QueryOffsetRequest::new(correlation_id, reference, stream).into(),
        Unsubscribe {
            correlation_id,
            subscription_id,
        } => cc::unsubscribe::UnSubscribeCommand::new(correlation_id, subscription_id).into(),
        Create {
            correlation_id,
            stream,
            arguments,
        } => cc::create_stream::CreateStreamCommand::new(correlation_id, stream, map(&arguments))
            .into(),
        Delete {
            correlation_id,
            stream,
        } => cc::delete::Delete::new(correlation_id, stream).into(),
        Metadata {
            correlation_id,
            streams,
        } => cc::metadata::MetadataCommand::new(correlation_id, streams).into(),
        PeerProperties {
            correlation_id,
            properties,
        } => {
            cc::peer_properties::PeerPropertiesCommand::new(correlation_id, map(&properties)).into()
        }
        SaslHandshake { correlation_id } => {
            cc::sasl_handshake::SaslHandshakeCommand::new(correlation_id).into()
        }
        SaslAuthenticate {
            correlation_id,
            mechanism,
            data,
        } => cc::sasl_authenticate::SaslAuthenticateCommand::new(
            correlation_id,
            mechanism,
            data.to_vec(),
        )
        .into(),
        Tune {
            frame_max,
            heartbeat_s,
        } => cc::tune::TunesCommand::new(frame_max, heartbeat_s).into(),
        Open {
            correlation_id,
            virtual_host,
        } => cc::open::OpenCommand::new(correlation_id, virtual_host).into(),
        Close {
            correlation_id,
            code,
            reason,
        } => cc::close::CloseRequest::new(correlation_id, client_code(code), reason).into(),
        Heartbeat => cc::heart_beat::HeartBeatCommand::default().into(),
        Route {
            correlation_id,
            routing_key,
            super_stream,
        } => cc::superstream_route::SuperStreamRouteRequest::new(
            correlation_id,
            routing_key,
            super_stream,
        )
        .into(),
        Partitions {
            correlation_id,
            super_stream,
        } => cc::superstream_partitions::SuperStreamPartitionsRequest::new(
            correlation_id,
            super_stream,
        )
        .into(),
        ExchangeCommandVersions {
            correlation_id,
            versions,
        } => cc::exchange_command_versions::ExchangeCommandVersionsRequest::new(
            correlation_id,
            versions
                .iter()
                .map(|v| {
                    cc::exchange_command_versions::ExchangeCommandVersion::new(v.key, v.min, v.max)
                })
                .collect(),
        )
        .into(),
        CreateSuperStream {
            correlation_id,
            name,
            partitions,
            binding_keys,
            arguments,
        } => cc::create_super_stream::CreateSuperStreamCommand::new(
            correlation_id,
            name,
            partitions,
            binding_keys,
            map(&arguments),
        )
        .into(),
        DeleteSuperStream {
            correlation_id,
            name,
        } => cc::delete_super_stream::DeleteSuperStreamCommand::new(correlation_id, name).into(),
        ConsumerUpdateResponse {
            correlation_id,
            code,
            offset: Some(offset),
        } => cc::consumer_update_request::ConsumerUpdateRequestCommand::new(
            correlation_id,
            code,
            client_offset(offset),
        )
        .into(),
        _ => return None,
    })
}

fn decode_client_message(wire: &[u8]) -> (client::message::Message, usize) {
    let (rest, m) = client::message::Message::decode(wire).expect("a client-encoded message");
    (m, rest.len())
}

/// String maps in a canonical order: the client keeps them in a `HashMap`.
fn canonical(mut c: Command) -> Command {
    use Command::*;
    match &mut c {
        Subscribe { properties: m, .. }
        | Create { arguments: m, .. }
        | PeerProperties { properties: m, .. }
        | PeerPropertiesResponse { properties: m, .. }
        | OpenResponse { properties: m, .. }
        | CreateSuperStream { arguments: m, .. } => m.sort(),
        _ => {}
    }
    c
}

fn ours(c: &Command) -> Vec<u8> {
    let mut out = BytesMut::new();
    stream::encode(&mut out, c);
    out.to_vec()
}

fn decode_ours(wire: &[u8]) -> Command {
    let mut buf = BytesMut::from(wire);
    let c = stream::decode(&mut buf, 0)
        .unwrap_or_else(|e| panic!("{e}: {wire:02x?}"))
        .expect("a whole frame");
    assert!(buf.is_empty(), "bytes left after the frame");
    c
}

/// A frame around a body the client encoded (the client frames only requests itself).
fn client_framed(key: u16, version: u16, body: &impl Encoder) -> Vec<u8> {
    let mut b = Vec::new();
    body.encode(&mut b).unwrap();
    let mut out = BytesMut::new();
    out.put_u32(4 + b.len() as u32);
    out.put_u16(key);
    out.put_u16(version);
    out.put_slice(&b);
    out.to_vec()
}

/// Checks what the client decoded from our encoding of a server-sent `c`; `false` when the
/// client has no decoder for it.
fn client_read_same(c: &Command, wire: &[u8]) -> Result<bool, TestCaseError> {
    use client::ResponseKind as K;
    let (rest, decoded) = client::Response::decode(wire)
        .map_err(|e| TestCaseError::fail(format!("client failed on {c:?}: {e:?}")))?;
    prop_assert!(rest.is_empty(), "client left {} bytes of {c:?}", rest.len());
    prop_assert_eq!(decoded.correlation_id(), c.correlation_id());
    let kind = decoded.kind();
    match (c.clone(), kind) {
        (
            Command::Response {
                key,
                correlation_id,
                code,
            },
            kind,
        ) => match kind {
            K::Generic(g) => {
                prop_assert!(key != KEY_CLOSE);
                prop_assert_eq!(g.code(), &client_code(code));
            }
            K::Close(close) => {
                prop_assert_eq!(key, KEY_CLOSE);
                prop_assert_eq!(
                    close,
                    cc::close::CloseResponse::new(correlation_id, client_code(code))
                );
            }
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        },
        (Command::SaslAuthenticateResponse { code, .. }, K::Generic(g)) => {
            prop_assert_eq!(g.code(), &client_code(code))
        }
        (
            Command::PeerPropertiesResponse {
                correlation_id,
                code,
                properties,
            },
            K::PeerProperties(p),
        ) => prop_assert_eq!(
            p,
            cc::peer_properties::PeerPropertiesResponse::new(
                correlation_id,
                client_code(code),
                map(&properties)
            )
        ),
        (
            Command::SaslHandshakeResponse {
                code, mechanisms, ..
            },
            K::SaslHandshake(h),
        ) => {
            prop_assert_eq!(h.mechanisms(), &mechanisms);
            // The code has no accessor; its Debug form is all the client shows of it.
            let code_text = format!("code: {:?}", client_code(code));
            let shown = format!("{h:?}");
            prop_assert!(shown.contains(&code_text), "{} lacks {}", shown, code_text);
        }
        (
            Command::Tune {
                frame_max,
                heartbeat_s,
            },
            K::Tunes(t),
        ) => prop_assert_eq!(t, cc::tune::TunesCommand::new(frame_max, heartbeat_s)),
        (
            Command::OpenResponse {
                code, properties, ..
            },
            K::Open(o),
        ) => {
            prop_assert_eq!(o.code(), &client_code(code));
            prop_assert_eq!(o.connection_properties(), &map(&properties));
        }
        (Command::Heartbeat, K::Heartbeat(_)) => {}
        (
            Command::MetadataResponse {
                brokers, streams, ..
            },
            K::Metadata(m),
        ) => {
            let want_brokers: Vec<_> = brokers
                .iter()
                .map(|b| cc::metadata::Broker {
                    reference: b.reference,
                    host: b.host.clone(),
                    port: b.port,
                })
                .collect();
            let want_streams: Vec<_> = streams
                .iter()
                .map(|s| cc::metadata::StreamMetadata {
                    stream_name: s.stream.clone(),
                    code: client_code(s.code),
                    leader_reference: s.leader,
                    replicas_references: s.replicas.clone(),
                })
                .collect();
            prop_assert_eq!(m.brokers, want_brokers);
            prop_assert_eq!(m.stream_metadata, want_streams);
        }
        (Command::MetadataUpdate { .. }, K::MetadataUpdate(u)) => {
            // No accessors: the client's own encoding of what it read must be our body.
            let mut again = Vec::new();
            u.encode(&mut again).unwrap();
            prop_assert_eq!(&again[..], &wire[8..]);
        }
        (
            Command::PublishConfirm {
                publisher_id,
                publishing_ids,
            },
            K::PublishConfirm(p),
        ) => prop_assert_eq!(
            p,
            cc::publish_confirm::PublishConfirm::new(publisher_id, publishing_ids)
        ),
        (
            Command::PublishError {
                publisher_id,
                errors,
            },
            K::PublishError(p),
        ) => prop_assert_eq!(
            p,
            cc::publish_error::PublishErrorResponse::new(
                publisher_id,
                errors
                    .iter()
                    .map(|(id, code)| client::types::PublishingError::new(*id, client_code(*code)))
                    .collect()
            )
        ),
        (
            Command::QueryOffsetResponse {
                correlation_id,
                code,
                offset,
            },
            K::QueryOffset(q),
        ) => prop_assert_eq!(
            q,
            cc::query_offset::QueryOffsetResponse::new(correlation_id, client_code(code), offset)
        ),
        (Command::CreditResponse { .. }, K::Credit(cr)) => {
            let mut again = Vec::new();
            cr.encode(&mut again).unwrap();
            prop_assert_eq!(&again[..], &wire[8..]);
        }
        (
            Command::QueryPublisherSequenceResponse {
                correlation_id,
                code,
                sequence,
            },
            K::QueryPublisherSequence(q),
        ) => prop_assert_eq!(
            q,
            cc::query_publisher_sequence::QueryPublisherResponse::new(
                correlation_id,
                client_code(code),
                sequence
            )
        ),
        (
            Command::ExchangeCommandVersionsResponse {
                correlation_id,
                code,
                versions,
            },
            K::ExchangeCommandVersions(e),
        ) => prop_assert_eq!(
            e,
            cc::exchange_command_versions::ExchangeCommandVersionsResponse::new(
                correlation_id,
                client_code(code),
                versions
                    .iter()
                    .map(
                        |v| cc::exchange_command_versions::ExchangeCommandVersion::new(
                            v.key, v.min, v.max
                        )
                    )
                    .collect()
            )
        ),
        (
            Command::PartitionsResponse {
                correlation_id,
                code,
                streams,
            },
            K::SuperStreamPartitions(p),
        ) => prop_assert_eq!(
            p,
            cc::superstream_partitions::SuperStreamPartitionsResponse::new(
                correlation_id,
                streams,
                client_code(code)
            )
        ),
        (
            Command::RouteResponse {
                correlation_id,
                code,
                streams,
            },
            K::SuperStreamRoute(r),
        ) => prop_assert_eq!(
            r,
            cc::superstream_route::SuperStreamRouteResponse::new(
                correlation_id,
                streams,
                client_code(code)
            )
        ),
        (
            Command::ConsumerUpdate {
                correlation_id,
                subscription_id,
                active,
            },
            K::ConsumerUpdate(u),
        ) => prop_assert_eq!(
            u,
            cc::consumer_update::ConsumerUpdateCommand::new(
                correlation_id,
                subscription_id,
                u8::from(active)
            )
        ),
        (c, other) => {
            return Err(TestCaseError::fail(format!(
                "client read {c:?} as {other:?}"
            )))
        }
    }
    Ok(true)
}

/// Whether the client has a decoder for this server-sent command.
fn client_reads_as_server_command(c: &Command) -> bool {
    use Command::*;
    match c {
        Response { .. }
        | PeerPropertiesResponse { .. }
        | SaslHandshakeResponse { .. }
        | Tune { .. }
        | OpenResponse { .. }
        | Heartbeat
        | MetadataResponse { .. }
        | MetadataUpdate { .. }
        | PublishConfirm { .. }
        | PublishError { .. }
        | QueryOffsetResponse { .. }
        | CreditResponse { .. }
        | QueryPublisherSequenceResponse { .. }
        | ExchangeCommandVersionsResponse { .. }
        | PartitionsResponse { .. }
        | RouteResponse { .. }
        | ConsumerUpdate { .. } => true,
        // The client reads a challenge-less SASL response only.
        SaslAuthenticateResponse { challenge, .. } => challenge.is_empty(),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn requests_the_client_encodes_decode_with_ours(c in command(Text { allow_empty: true })) {
        let c = with_client_messages(c);
        let Some(request) = client_request(&c) else { return Ok(()); };
        let mut wire = Vec::new();
        request.encode(&mut wire).unwrap();
        prop_assert_eq!(canonical(decode_ours(&wire)), canonical(c));
    }

    #[test]
    fn requests_we_encode_decode_with_the_client(c in command(Text { allow_empty: false })) {
        let c = with_client_messages(c);
        // The client reads Publish as version 1 only and cannot read a ConsumerUpdate answer.
        if c.version() != VERSION_1 || matches!(c, Command::ConsumerUpdateResponse { .. }) {
            return Ok(());
        }
        let Some(want) = client_request(&c) else { return Ok(()); };
        let wire = ours(&c);
        let (rest, got) = client::Request::decode(&wire)
            .map_err(|e| TestCaseError::fail(format!("client failed on {c:?}: {e:?}")))?;
        prop_assert!(rest.is_empty());
        prop_assert_eq!(got, want);
    }

    #[test]
    fn what_a_server_sends_decodes_with_the_client(c in command(Text { allow_empty: false })) {
        if !client_reads_as_server_command(&c) {
            return Ok(());
        }
        prop_assert!(client_read_same(&c, &ours(&c))?);
    }

    #[test]
    fn server_commands_the_client_encodes_decode_with_ours(
        corr in any::<u32>(), code in stream_support::code(), id in any::<u8>(),
        ids in proptest::collection::vec(any::<u64>(), 0..5), value in any::<u64>(),
        streams in Text { allow_empty: true }.strings(), versions in stream_support::versions(),
        active in any::<bool>(),
    ) {
        let response = |k: u16| k | RESPONSE_BIT;
        let cases: Vec<(Vec<u8>, Command)> = vec![
            (
                client_framed(KEY_PUBLISH_CONFIRM, 1, &cc::publish_confirm::PublishConfirm::new(id, ids.clone())),
                Command::PublishConfirm { publisher_id: id, publishing_ids: ids.clone() },
            ),
            (
                client_framed(KEY_PUBLISH_ERROR, 1, &cc::publish_error::PublishErrorResponse::new(
                    id, ids.iter().map(|i| client::types::PublishingError::new(*i, client_code(code))).collect())),
                Command::PublishError { publisher_id: id, errors: ids.iter().map(|i| (*i, code)).collect() },
            ),
            (
                client_framed(response(KEY_QUERY_OFFSET), 1, &cc::query_offset::QueryOffsetResponse::new(corr, client_code(code), value)),
                Command::QueryOffsetResponse { correlation_id: corr, code, offset: value },
            ),
            (
                client_framed(response(KEY_QUERY_PUBLISHER_SEQUENCE), 1,
                    &cc::query_publisher_sequence::QueryPublisherResponse::new(corr, client_code(code), value)),
                Command::QueryPublisherSequenceResponse { correlation_id: corr, code, sequence: value },
            ),
            (
                client_framed(KEY_TUNE, 1, &cc::tune::TunesCommand::new(corr, value as u32)),
                Command::Tune { frame_max: corr, heartbeat_s: value as u32 },
            ),
            (
                client_framed(response(KEY_EXCHANGE_COMMAND_VERSIONS), 1,
                    &cc::exchange_command_versions::ExchangeCommandVersionsResponse::new(corr, client_code(code),
                        versions.iter().map(|v| cc::exchange_command_versions::ExchangeCommandVersion::new(v.key, v.min, v.max)).collect())),
                Command::ExchangeCommandVersionsResponse { correlation_id: corr, code, versions: versions.clone() },
            ),
            (
                client_framed(response(KEY_PARTITIONS), 1,
                    &cc::superstream_partitions::SuperStreamPartitionsResponse::new(corr, streams.clone(), client_code(code))),
                Command::PartitionsResponse { correlation_id: corr, code, streams: streams.clone() },
            ),
            (
                client_framed(response(KEY_ROUTE), 1,
                    &cc::superstream_route::SuperStreamRouteResponse::new(corr, streams.clone(), client_code(code))),
                Command::RouteResponse { correlation_id: corr, code, streams: streams.clone() },
            ),
            (
                client_framed(KEY_CONSUMER_UPDATE, 1, &cc::consumer_update::ConsumerUpdateCommand::new(corr, id, u8::from(active))),
                Command::ConsumerUpdate { correlation_id: corr, subscription_id: id, active },
            ),
            (
                client_framed(response(KEY_CLOSE), 1, &cc::close::CloseResponse::new(corr, client_code(code))),
                Command::Response { key: KEY_CLOSE, correlation_id: corr, code },
            ),
        ];
        for (wire, want) in cases {
            prop_assert_eq!(decode_ours(&wire), want);
        }
    }

    /// A Deliver's chunk is opaque to our codec; the client parses it. A chunk of simple entries
    /// (osiris: top bit 0, 31-bit size) holding client messages reaches the client whole.
    #[test]
    fn a_deliver_we_encode_reaches_the_client_with_its_chunk_intact(
        subscription_id in any::<u8>(), chunk_type in 0u8..3, timestamp in any::<u64>(), epoch in any::<u64>(),
        first_offset in any::<u64>(), crc in any::<i32>(), trailer in any::<u32>(),
        bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..5),
    ) {
        let messages: Vec<_> = bodies.iter().map(|b| client_message(b)).collect();
        let mut entries = BytesMut::new();
        for (_, wire) in &messages {
            entries.put_u32(wire.len() as u32);
            entries.put_slice(wire);
        }
        let mut chunk = BytesMut::new();
        chunk.put_i8(5); // magic and version
        chunk.put_u8(chunk_type);
        chunk.put_u16(messages.len() as u16); // entries
        chunk.put_u32(messages.len() as u32); // records
        chunk.put_u64(timestamp);
        chunk.put_u64(epoch);
        chunk.put_u64(first_offset);
        chunk.put_i32(crc);
        chunk.put_u32(entries.len() as u32);
        chunk.put_u32(trailer);
        chunk.put_u32(0); // bloom size and reserved
        chunk.put_slice(&entries);
        let c = Command::Deliver { subscription_id, committed_offset: None, chunk: chunk.freeze() };
        let wire = ours(&c);
        let (rest, decoded) = client::Response::decode(&wire)
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert!(rest.is_empty());
        let want = cc::deliver::DeliverCommand::new(
            subscription_id, 5, chunk_type, messages.len() as u16, timestamp, epoch, first_offset, crc,
            trailer, 0, messages.into_iter().map(|(m, _)| m).collect());
        match decoded.kind() {
            client::ResponseKind::Deliver(d) => prop_assert_eq!(d, want),
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        }
    }
}
