//! Every command of the stream protocol (RabbitMQ 3.9-3.13), both directions, and its body's
//! encoding.
//!
//! One enum holds requests, responses and one-way commands alike, so a decoder answers one
//! question ("what did the peer send?") and a test can round-trip any of them. Strings are
//! `String` (the protocol says UTF-8; names end up as broker names); opaque payloads (messages,
//! SASL data, chunks) are `Bytes` sliced out of the frame, never copied.

use super::constants::*;
use super::wire::{self, BodyError};
use crate::wire::Reader;
use bytes::{BufMut, Bytes, BytesMut};

/// Where a subscription starts reading (Subscribe, ConsumerUpdate's answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    First,
    /// The start of the last chunk.
    Last,
    /// The next message written after the subscription.
    Next,
    Offset(u64),
    /// Milliseconds since the epoch.
    Timestamp(i64),
}

impl OffsetSpec {
    fn decode(r: &mut Reader) -> Result<OffsetSpec, BodyError> {
        let kind = r.u16()?;
        OffsetSpec::decode_typed(kind, r)
    }

    fn decode_typed(kind: u16, r: &mut Reader) -> Result<OffsetSpec, BodyError> {
        match kind {
            OFFSET_TYPE_FIRST => Ok(OffsetSpec::First),
            OFFSET_TYPE_LAST => Ok(OffsetSpec::Last),
            OFFSET_TYPE_NEXT => Ok(OffsetSpec::Next),
            OFFSET_TYPE_OFFSET => Ok(OffsetSpec::Offset(r.u64()?)),
            OFFSET_TYPE_TIMESTAMP => Ok(OffsetSpec::Timestamp(r.u64()? as i64)),
            other => Err(BodyError::BadOffsetType(other)),
        }
    }

    fn encode(&self, out: &mut BytesMut) {
        match *self {
            OffsetSpec::First => out.put_u16(OFFSET_TYPE_FIRST),
            OffsetSpec::Last => out.put_u16(OFFSET_TYPE_LAST),
            OffsetSpec::Next => out.put_u16(OFFSET_TYPE_NEXT),
            OffsetSpec::Offset(o) => {
                out.put_u16(OFFSET_TYPE_OFFSET);
                out.put_u64(o);
            }
            OffsetSpec::Timestamp(t) => {
                out.put_u16(OFFSET_TYPE_TIMESTAMP);
                out.put_i64(t);
            }
        }
    }
}

/// One message of a Publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedMessage {
    pub publishing_id: u64,
    /// The filter value (3.13); `None` also for an empty one, which osiris treats as no filter.
    /// Any message with one makes the frame a version 2 Publish.
    pub filter_value: Option<String>,
    /// An AMQP 1.0 message as the client encoded it; the broker stores it as it came.
    pub message: Bytes,
}

/// A node in a Metadata response; streams name their leader and replicas by `reference`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub reference: u16,
    pub host: String,
    pub port: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMetadata {
    pub stream: String,
    pub code: u16,
    /// `u16::MAX` (RabbitMQ writes -1) when the stream has no leader or does not exist.
    pub leader: u16,
    pub replicas: Vec<u16>,
}

/// A command's version range, as ExchangeCommandVersions trades them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandVersion {
    pub key: u16,
    pub min: u16,
    pub max: u16,
}

/// A response that carries only a correlation id and a code. `key` is the request's key
/// (without the response bit): DeclarePublisher, DeletePublisher, Subscribe, Unsubscribe,
/// Create, Delete, Close, CreateSuperStream or DeleteSuperStream.
pub const GENERIC_RESPONSE_KEYS: [u16; 9] = [
    KEY_DECLARE_PUBLISHER,
    KEY_DELETE_PUBLISHER,
    KEY_SUBSCRIBE,
    KEY_UNSUBSCRIBE,
    KEY_CREATE,
    KEY_DELETE,
    KEY_CLOSE,
    KEY_CREATE_SUPER_STREAM,
    KEY_DELETE_SUPER_STREAM,
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    DeclarePublisher {
        correlation_id: u32,
        publisher_id: u8,
        /// Empty for a publisher without deduplication.
        reference: String,
        stream: String,
    },
    Publish {
        publisher_id: u8,
        messages: Vec<PublishedMessage>,
    },
    PublishConfirm {
        publisher_id: u8,
        publishing_ids: Vec<u64>,
    },
    PublishError {
        publisher_id: u8,
        /// (publishing id, response code) pairs.
        errors: Vec<(u64, u16)>,
    },
    QueryPublisherSequence {
        correlation_id: u32,
        reference: String,
        stream: String,
    },
    QueryPublisherSequenceResponse {
        correlation_id: u32,
        code: u16,
        sequence: u64,
    },
    DeletePublisher {
        correlation_id: u32,
        publisher_id: u8,
    },
    Subscribe {
        correlation_id: u32,
        subscription_id: u8,
        stream: String,
        offset: OffsetSpec,
        credit: u16,
        /// `single-active-consumer`, `name`, `super-stream`, `filter.N`, `match-unfiltered`, ...
        properties: Vec<(String, String)>,
    },
    /// A chunk for a subscription. The chunk (header, entries, trailer) is the store's format and
    /// travels as opaque bytes; `committed_offset` (PROTOCOL.adoc's CommittedChunkId: the first
    /// offset of the last chunk a majority has) makes it a version 2 Deliver (3.13).
    Deliver {
        subscription_id: u8,
        committed_offset: Option<u64>,
        chunk: Bytes,
    },
    Credit {
        subscription_id: u8,
        /// Chunks the server may send.
        credit: u16,
    },
    /// Sent only when a Credit failed (an unknown subscription); it has no correlation id.
    CreditResponse {
        code: u16,
        subscription_id: u8,
    },
    StoreOffset {
        reference: String,
        stream: String,
        offset: u64,
    },
    QueryOffset {
        correlation_id: u32,
        reference: String,
        stream: String,
    },
    QueryOffsetResponse {
        correlation_id: u32,
        code: u16,
        offset: u64,
    },
    Unsubscribe {
        correlation_id: u32,
        subscription_id: u8,
    },
    Create {
        correlation_id: u32,
        stream: String,
        /// `max-length-bytes`, `max-age`, `stream-max-segment-size-bytes`, ...
        arguments: Vec<(String, String)>,
    },
    Delete {
        correlation_id: u32,
        stream: String,
    },
    Metadata {
        correlation_id: u32,
        streams: Vec<String>,
    },
    MetadataResponse {
        correlation_id: u32,
        brokers: Vec<Broker>,
        streams: Vec<StreamMetadata>,
    },
    /// Tells a client a stream it uses changed (its leader moved, it was deleted).
    MetadataUpdate {
        code: u16,
        stream: String,
    },
    PeerProperties {
        correlation_id: u32,
        properties: Vec<(String, String)>,
    },
    PeerPropertiesResponse {
        correlation_id: u32,
        code: u16,
        properties: Vec<(String, String)>,
    },
    SaslHandshake {
        correlation_id: u32,
    },
    SaslHandshakeResponse {
        correlation_id: u32,
        code: u16,
        mechanisms: Vec<String>,
    },
    SaslAuthenticate {
        correlation_id: u32,
        mechanism: String,
        data: Bytes,
    },
    SaslAuthenticateResponse {
        correlation_id: u32,
        code: u16,
        /// Empty (and then absent on the wire) unless the code is SASL challenge.
        challenge: Bytes,
    },
    /// The server proposes, the client answers with the same command; either direction decodes
    /// here, with or without the response bit (clients differ).
    Tune {
        frame_max: u32,
        heartbeat_s: u32,
    },
    Open {
        correlation_id: u32,
        virtual_host: String,
    },
    OpenResponse {
        correlation_id: u32,
        code: u16,
        /// `advertised_host`, `advertised_port`; a server sends them only with code OK.
        properties: Vec<(String, String)>,
    },
    Close {
        correlation_id: u32,
        code: u16,
        reason: String,
    },
    Heartbeat,
    Route {
        correlation_id: u32,
        routing_key: String,
        super_stream: String,
    },
    RouteResponse {
        correlation_id: u32,
        code: u16,
        streams: Vec<String>,
    },
    Partitions {
        correlation_id: u32,
        super_stream: String,
    },
    PartitionsResponse {
        correlation_id: u32,
        code: u16,
        streams: Vec<String>,
    },
    /// Server to client: this subscription became the active (or an inactive) consumer.
    ConsumerUpdate {
        correlation_id: u32,
        subscription_id: u8,
        active: bool,
    },
    /// Client to server: where the newly active consumer starts (`None`: offset type 0).
    ConsumerUpdateResponse {
        correlation_id: u32,
        code: u16,
        offset: Option<OffsetSpec>,
    },
    ExchangeCommandVersions {
        correlation_id: u32,
        versions: Vec<CommandVersion>,
    },
    ExchangeCommandVersionsResponse {
        correlation_id: u32,
        code: u16,
        versions: Vec<CommandVersion>,
    },
    StreamStats {
        correlation_id: u32,
        stream: String,
    },
    StreamStatsResponse {
        correlation_id: u32,
        code: u16,
        /// `first_chunk_id`, `committed_chunk_id`, ...
        stats: Vec<(String, i64)>,
    },
    CreateSuperStream {
        correlation_id: u32,
        name: String,
        partitions: Vec<String>,
        binding_keys: Vec<String>,
        arguments: Vec<(String, String)>,
    },
    DeleteSuperStream {
        correlation_id: u32,
        name: String,
    },
    /// A response with only a code; `key` is one of [`GENERIC_RESPONSE_KEYS`].
    Response {
        key: u16,
        correlation_id: u32,
        code: u16,
    },
}

impl Command {
    /// The key as written on the wire, response bit included.
    pub fn wire_key(&self) -> u16 {
        use Command::*;
        match self {
            DeclarePublisher { .. } => KEY_DECLARE_PUBLISHER,
            Publish { .. } => KEY_PUBLISH,
            PublishConfirm { .. } => KEY_PUBLISH_CONFIRM,
            PublishError { .. } => KEY_PUBLISH_ERROR,
            QueryPublisherSequence { .. } => KEY_QUERY_PUBLISHER_SEQUENCE,
            QueryPublisherSequenceResponse { .. } => KEY_QUERY_PUBLISHER_SEQUENCE | RESPONSE_BIT,
            DeletePublisher { .. } => KEY_DELETE_PUBLISHER,
            Subscribe { .. } => KEY_SUBSCRIBE,
            Deliver { .. } => KEY_DELIVER,
            Credit { .. } => KEY_CREDIT,
            CreditResponse { .. } => KEY_CREDIT | RESPONSE_BIT,
            StoreOffset { .. } => KEY_STORE_OFFSET,
            QueryOffset { .. } => KEY_QUERY_OFFSET,
            QueryOffsetResponse { .. } => KEY_QUERY_OFFSET | RESPONSE_BIT,
            Unsubscribe { .. } => KEY_UNSUBSCRIBE,
            Create { .. } => KEY_CREATE,
            Delete { .. } => KEY_DELETE,
            Metadata { .. } => KEY_METADATA,
            MetadataResponse { .. } => KEY_METADATA | RESPONSE_BIT,
            MetadataUpdate { .. } => KEY_METADATA_UPDATE,
            PeerProperties { .. } => KEY_PEER_PROPERTIES,
            PeerPropertiesResponse { .. } => KEY_PEER_PROPERTIES | RESPONSE_BIT,
            SaslHandshake { .. } => KEY_SASL_HANDSHAKE,
            SaslHandshakeResponse { .. } => KEY_SASL_HANDSHAKE | RESPONSE_BIT,
            SaslAuthenticate { .. } => KEY_SASL_AUTHENTICATE,
            SaslAuthenticateResponse { .. } => KEY_SASL_AUTHENTICATE | RESPONSE_BIT,
            Tune { .. } => KEY_TUNE,
            Open { .. } => KEY_OPEN,
            OpenResponse { .. } => KEY_OPEN | RESPONSE_BIT,
            Close { .. } => KEY_CLOSE,
            Heartbeat => KEY_HEARTBEAT,
            Route { .. } => KEY_ROUTE,
            RouteResponse { .. } => KEY_ROUTE | RESPONSE_BIT,
            Partitions { .. } => KEY_PARTITIONS,
            PartitionsResponse { .. } => KEY_PARTITIONS | RESPONSE_BIT,
            ConsumerUpdate { .. } => KEY_CONSUMER_UPDATE,
            ConsumerUpdateResponse { .. } => KEY_CONSUMER_UPDATE | RESPONSE_BIT,
            ExchangeCommandVersions { .. } => KEY_EXCHANGE_COMMAND_VERSIONS,
            ExchangeCommandVersionsResponse { .. } => KEY_EXCHANGE_COMMAND_VERSIONS | RESPONSE_BIT,
            StreamStats { .. } => KEY_STREAM_STATS,
            StreamStatsResponse { .. } => KEY_STREAM_STATS | RESPONSE_BIT,
            CreateSuperStream { .. } => KEY_CREATE_SUPER_STREAM,
            DeleteSuperStream { .. } => KEY_DELETE_SUPER_STREAM,
            Response { key, .. } => key | RESPONSE_BIT,
        }
    }

    /// The version the frame is written with: 2 only where the command needs it.
    pub fn version(&self) -> u16 {
        match self {
            Command::Publish { messages, .. }
                if messages.iter().any(|m| m.filter_value.is_some()) =>
            {
                VERSION_2
            }
            Command::Deliver {
                committed_offset: Some(_),
                ..
            } => VERSION_2,
            _ => VERSION_1,
        }
    }

    /// The correlation id of a request or response; `None` for one-way commands.
    pub fn correlation_id(&self) -> Option<u32> {
        use Command::*;
        match self {
            DeclarePublisher { correlation_id, .. }
            | QueryPublisherSequence { correlation_id, .. }
            | QueryPublisherSequenceResponse { correlation_id, .. }
            | DeletePublisher { correlation_id, .. }
            | Subscribe { correlation_id, .. }
            | QueryOffset { correlation_id, .. }
            | QueryOffsetResponse { correlation_id, .. }
            | Unsubscribe { correlation_id, .. }
            | Create { correlation_id, .. }
            | Delete { correlation_id, .. }
            | Metadata { correlation_id, .. }
            | MetadataResponse { correlation_id, .. }
            | PeerProperties { correlation_id, .. }
            | PeerPropertiesResponse { correlation_id, .. }
            | SaslHandshake { correlation_id }
            | SaslHandshakeResponse { correlation_id, .. }
            | SaslAuthenticate { correlation_id, .. }
            | SaslAuthenticateResponse { correlation_id, .. }
            | Open { correlation_id, .. }
            | OpenResponse { correlation_id, .. }
            | Close { correlation_id, .. }
            | Route { correlation_id, .. }
            | RouteResponse { correlation_id, .. }
            | Partitions { correlation_id, .. }
            | PartitionsResponse { correlation_id, .. }
            | ConsumerUpdate { correlation_id, .. }
            | ConsumerUpdateResponse { correlation_id, .. }
            | ExchangeCommandVersions { correlation_id, .. }
            | ExchangeCommandVersionsResponse { correlation_id, .. }
            | StreamStats { correlation_id, .. }
            | StreamStatsResponse { correlation_id, .. }
            | CreateSuperStream { correlation_id, .. }
            | DeleteSuperStream { correlation_id, .. }
            | Response { correlation_id, .. } => Some(*correlation_id),
            Publish { .. }
            | PublishConfirm { .. }
            | PublishError { .. }
            | Deliver { .. }
            | Credit { .. }
            | CreditResponse { .. }
            | StoreOffset { .. }
            | MetadataUpdate { .. }
            | Tune { .. }
            | Heartbeat => None,
        }
    }

    /// Appends the body (everything after key and version).
    pub(super) fn encode_body(&self, out: &mut BytesMut) {
        use wire::{put_bytes, put_count, put_string, put_string_map, put_strings};
        use Command::*;
        match self {
            DeclarePublisher {
                correlation_id,
                publisher_id,
                reference,
                stream,
            } => {
                out.put_u32(*correlation_id);
                out.put_u8(*publisher_id);
                put_string(out, reference);
                put_string(out, stream);
            }
            Publish {
                publisher_id,
                messages,
            } => {
                let v2 = self.version() == VERSION_2;
                out.put_u8(*publisher_id);
                put_count(out, messages.len());
                for m in messages {
                    out.put_u64(m.publishing_id);
                    if v2 {
                        match &m.filter_value {
                            Some(f) => put_string(out, f),
                            None => out.put_i16(-1),
                        }
                    }
                    put_bytes(out, &m.message);
                }
            }
            PublishConfirm {
                publisher_id,
                publishing_ids,
            } => {
                out.put_u8(*publisher_id);
                put_count(out, publishing_ids.len());
                for id in publishing_ids {
                    out.put_u64(*id);
                }
            }
            PublishError {
                publisher_id,
                errors,
            } => {
                out.put_u8(*publisher_id);
                put_count(out, errors.len());
                for (id, code) in errors {
                    out.put_u64(*id);
                    out.put_u16(*code);
                }
            }
            QueryPublisherSequence {
                correlation_id,
                reference,
                stream,
            }
            | QueryOffset {
                correlation_id,
                reference,
                stream,
            } => {
                out.put_u32(*correlation_id);
                put_string(out, reference);
                put_string(out, stream);
            }
            QueryPublisherSequenceResponse {
                correlation_id,
                code,
                sequence: value,
            }
            | QueryOffsetResponse {
                correlation_id,
                code,
                offset: value,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                out.put_u64(*value);
            }
            DeletePublisher {
                correlation_id,
                publisher_id: id,
            }
            | Unsubscribe {
                correlation_id,
                subscription_id: id,
            } => {
                out.put_u32(*correlation_id);
                out.put_u8(*id);
            }
            Subscribe {
                correlation_id,
                subscription_id,
                stream,
                offset,
                credit,
                properties,
            } => {
                out.put_u32(*correlation_id);
                out.put_u8(*subscription_id);
                put_string(out, stream);
                offset.encode(out);
                out.put_u16(*credit);
                put_string_map(out, properties);
            }
            Deliver {
                subscription_id,
                committed_offset,
                chunk,
            } => {
                out.put_u8(*subscription_id);
                if let Some(c) = committed_offset {
                    out.put_u64(*c);
                }
                out.put_slice(chunk);
            }
            Credit {
                subscription_id,
                credit,
            } => {
                out.put_u8(*subscription_id);
                out.put_u16(*credit);
            }
            CreditResponse {
                code,
                subscription_id,
            } => {
                out.put_u16(*code);
                out.put_u8(*subscription_id);
            }
            StoreOffset {
                reference,
                stream,
                offset,
            } => {
                put_string(out, reference);
                put_string(out, stream);
                out.put_u64(*offset);
            }
            Create {
                correlation_id,
                stream,
                arguments,
            } => {
                out.put_u32(*correlation_id);
                put_string(out, stream);
                put_string_map(out, arguments);
            }
            Delete {
                correlation_id,
                stream: name,
            }
            | StreamStats {
                correlation_id,
                stream: name,
            }
            | DeleteSuperStream {
                correlation_id,
                name,
            }
            | Partitions {
                correlation_id,
                super_stream: name,
            }
            | Open {
                correlation_id,
                virtual_host: name,
            } => {
                out.put_u32(*correlation_id);
                put_string(out, name);
            }
            Metadata {
                correlation_id,
                streams,
            } => {
                out.put_u32(*correlation_id);
                put_strings(out, streams);
            }
            MetadataResponse {
                correlation_id,
                brokers,
                streams,
            } => {
                out.put_u32(*correlation_id);
                put_count(out, brokers.len());
                for b in brokers {
                    out.put_u16(b.reference);
                    put_string(out, &b.host);
                    out.put_u32(b.port);
                }
                put_count(out, streams.len());
                for s in streams {
                    put_string(out, &s.stream);
                    out.put_u16(s.code);
                    out.put_u16(s.leader);
                    put_count(out, s.replicas.len());
                    for r in &s.replicas {
                        out.put_u16(*r);
                    }
                }
            }
            MetadataUpdate { code, stream } => {
                out.put_u16(*code);
                put_string(out, stream);
            }
            PeerProperties {
                correlation_id,
                properties,
            } => {
                out.put_u32(*correlation_id);
                put_string_map(out, properties);
            }
            PeerPropertiesResponse {
                correlation_id,
                code,
                properties,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                put_string_map(out, properties);
            }
            SaslHandshake { correlation_id } => out.put_u32(*correlation_id),
            SaslHandshakeResponse {
                correlation_id,
                code,
                mechanisms,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                put_strings(out, mechanisms);
            }
            SaslAuthenticate {
                correlation_id,
                mechanism,
                data,
            } => {
                out.put_u32(*correlation_id);
                put_string(out, mechanism);
                put_bytes(out, data);
            }
            SaslAuthenticateResponse {
                correlation_id,
                code,
                challenge,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                if !challenge.is_empty() {
                    put_bytes(out, challenge);
                }
            }
            Tune {
                frame_max,
                heartbeat_s,
            } => {
                out.put_u32(*frame_max);
                out.put_u32(*heartbeat_s);
            }
            OpenResponse {
                correlation_id,
                code,
                properties,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                // RabbitMQ writes the map only with OK and clients read it only then; one given
                // with another code is written all the same, so that what decodes re-encodes.
                if *code == RESPONSE_CODE_OK || !properties.is_empty() {
                    put_string_map(out, properties);
                }
            }
            Close {
                correlation_id,
                code,
                reason,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                put_string(out, reason);
            }
            Heartbeat => {}
            Route {
                correlation_id,
                routing_key,
                super_stream,
            } => {
                out.put_u32(*correlation_id);
                put_string(out, routing_key);
                put_string(out, super_stream);
            }
            RouteResponse {
                correlation_id,
                code,
                streams,
            }
            | PartitionsResponse {
                correlation_id,
                code,
                streams,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                put_strings(out, streams);
            }
            ConsumerUpdate {
                correlation_id,
                subscription_id,
                active,
            } => {
                out.put_u32(*correlation_id);
                out.put_u8(*subscription_id);
                out.put_u8(u8::from(*active));
            }
            ConsumerUpdateResponse {
                correlation_id,
                code,
                offset,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                match offset {
                    Some(o) => o.encode(out),
                    None => out.put_u16(OFFSET_TYPE_NONE),
                }
            }
            ExchangeCommandVersions {
                correlation_id,
                versions,
            } => {
                out.put_u32(*correlation_id);
                put_versions(out, versions);
            }
            ExchangeCommandVersionsResponse {
                correlation_id,
                code,
                versions,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                put_versions(out, versions);
            }
            StreamStatsResponse {
                correlation_id,
                code,
                stats,
            } => {
                out.put_u32(*correlation_id);
                out.put_u16(*code);
                put_count(out, stats.len());
                for (k, v) in stats {
                    put_string(out, k);
                    out.put_i64(*v);
                }
            }
            CreateSuperStream {
                correlation_id,
                name,
                partitions,
                binding_keys,
                arguments,
            } => {
                out.put_u32(*correlation_id);
                put_string(out, name);
                put_strings(out, partitions);
                put_strings(out, binding_keys);
                put_string_map(out, arguments);
            }
            Response {
                key,
                correlation_id,
                code,
            } => {
                debug_assert!(
                    GENERIC_RESPONSE_KEYS.contains(key),
                    "key {key} has no generic response"
                );
                out.put_u32(*correlation_id);
                out.put_u16(*code);
            }
        }
    }

    /// Decodes the body of a frame whose version the caller checked against [`version_max`];
    /// the whole body must be consumed.
    pub(super) fn decode_body(
        wire_key: u16,
        version: u16,
        body: Bytes,
    ) -> Result<Command, BodyError> {
        use wire::{bytes, count, string, string_map, strings};
        let mut r = Reader::new(body);
        let r = &mut r;
        let response = wire_key & RESPONSE_BIT != 0;
        let key = wire_key & !RESPONSE_BIT;
        let command = if response {
            match key {
                k if GENERIC_RESPONSE_KEYS.contains(&k) => Command::Response {
                    key: k,
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                },
                KEY_QUERY_PUBLISHER_SEQUENCE => Command::QueryPublisherSequenceResponse {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    sequence: r.u64()?,
                },
                KEY_CREDIT => Command::CreditResponse {
                    code: r.u16()?,
                    subscription_id: r.u8()?,
                },
                KEY_QUERY_OFFSET => Command::QueryOffsetResponse {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    offset: r.u64()?,
                },
                KEY_METADATA => {
                    let correlation_id = r.u32()?;
                    let n = count(r, 8)?;
                    let brokers = (0..n)
                        .map(|_| {
                            Ok(Broker {
                                reference: r.u16()?,
                                host: string(r)?,
                                port: r.u32()?,
                            })
                        })
                        .collect::<Result<_, BodyError>>()?;
                    let n = count(r, 10)?;
                    let streams = (0..n)
                        .map(|_| {
                            let stream = string(r)?;
                            let code = r.u16()?;
                            let leader = r.u16()?;
                            let n = count(r, 2)?;
                            let replicas = (0..n).map(|_| r.u16()).collect::<Result<_, _>>()?;
                            Ok(StreamMetadata {
                                stream,
                                code,
                                leader,
                                replicas,
                            })
                        })
                        .collect::<Result<_, BodyError>>()?;
                    Command::MetadataResponse {
                        correlation_id,
                        brokers,
                        streams,
                    }
                }
                KEY_PEER_PROPERTIES => Command::PeerPropertiesResponse {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    properties: string_map(r)?,
                },
                KEY_SASL_HANDSHAKE => Command::SaslHandshakeResponse {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    mechanisms: strings(r)?,
                },
                KEY_SASL_AUTHENTICATE => {
                    let correlation_id = r.u32()?;
                    let code = r.u16()?;
                    let challenge = if r.remaining() == 0 {
                        Bytes::new()
                    } else {
                        bytes(r)?
                    };
                    Command::SaslAuthenticateResponse {
                        correlation_id,
                        code,
                        challenge,
                    }
                }
                KEY_TUNE => Command::Tune {
                    frame_max: r.u32()?,
                    heartbeat_s: r.u32()?,
                },
                KEY_OPEN => {
                    let correlation_id = r.u32()?;
                    let code = r.u16()?;
                    // RabbitMQ leaves the map out when it is empty and when the code is not OK.
                    let properties = if r.remaining() == 0 {
                        Vec::new()
                    } else {
                        string_map(r)?
                    };
                    Command::OpenResponse {
                        correlation_id,
                        code,
                        properties,
                    }
                }
                KEY_ROUTE => Command::RouteResponse {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    streams: strings(r)?,
                },
                KEY_PARTITIONS => Command::PartitionsResponse {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    streams: strings(r)?,
                },
                KEY_CONSUMER_UPDATE => {
                    let correlation_id = r.u32()?;
                    let code = r.u16()?;
                    let offset = match r.u16()? {
                        OFFSET_TYPE_NONE => None,
                        kind => Some(OffsetSpec::decode_typed(kind, r)?),
                    };
                    Command::ConsumerUpdateResponse {
                        correlation_id,
                        code,
                        offset,
                    }
                }
                KEY_EXCHANGE_COMMAND_VERSIONS => Command::ExchangeCommandVersionsResponse {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    versions: versions(r)?,
                },
                KEY_STREAM_STATS => {
                    let correlation_id = r.u32()?;
                    let code = r.u16()?;
                    let n = count(r, 10)?;
                    let stats = (0..n)
                        .map(|_| Ok((string(r)?, r.u64()? as i64)))
                        .collect::<Result<_, BodyError>>()?;
                    Command::StreamStatsResponse {
                        correlation_id,
                        code,
                        stats,
                    }
                }
                _ => return Err(BodyError::UnknownKey),
            }
        } else {
            match key {
                KEY_DECLARE_PUBLISHER => Command::DeclarePublisher {
                    correlation_id: r.u32()?,
                    publisher_id: r.u8()?,
                    reference: string(r)?,
                    stream: string(r)?,
                },
                KEY_PUBLISH => {
                    let publisher_id = r.u8()?;
                    let n = count(r, if version == VERSION_2 { 14 } else { 12 })?;
                    let messages = (0..n)
                        .map(|_| {
                            let publishing_id = r.u64()?;
                            let filter_value = if version == VERSION_2 {
                                Some(string(r)?).filter(|f| !f.is_empty())
                            } else {
                                None
                            };
                            Ok(PublishedMessage {
                                publishing_id,
                                filter_value,
                                message: bytes(r)?,
                            })
                        })
                        .collect::<Result<_, BodyError>>()?;
                    Command::Publish {
                        publisher_id,
                        messages,
                    }
                }
                KEY_PUBLISH_CONFIRM => {
                    let publisher_id = r.u8()?;
                    let n = count(r, 8)?;
                    Command::PublishConfirm {
                        publisher_id,
                        publishing_ids: (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?,
                    }
                }
                KEY_PUBLISH_ERROR => {
                    let publisher_id = r.u8()?;
                    let n = count(r, 10)?;
                    Command::PublishError {
                        publisher_id,
                        errors: (0..n)
                            .map(|_| Ok((r.u64()?, r.u16()?)))
                            .collect::<Result<_, BodyError>>()?,
                    }
                }
                KEY_QUERY_PUBLISHER_SEQUENCE => Command::QueryPublisherSequence {
                    correlation_id: r.u32()?,
                    reference: string(r)?,
                    stream: string(r)?,
                },
                KEY_DELETE_PUBLISHER => Command::DeletePublisher {
                    correlation_id: r.u32()?,
                    publisher_id: r.u8()?,
                },
                KEY_SUBSCRIBE => {
                    let correlation_id = r.u32()?;
                    let subscription_id = r.u8()?;
                    let stream = string(r)?;
                    let offset = OffsetSpec::decode(r)?;
                    let credit = r.u16()?;
                    // RabbitMQ's own encoder leaves the map out when it is empty.
                    let properties = if r.remaining() == 0 {
                        Vec::new()
                    } else {
                        string_map(r)?
                    };
                    Command::Subscribe {
                        correlation_id,
                        subscription_id,
                        stream,
                        offset,
                        credit,
                        properties,
                    }
                }
                KEY_DELIVER => {
                    let subscription_id = r.u8()?;
                    let committed_offset = if version == VERSION_2 {
                        Some(r.u64()?)
                    } else {
                        None
                    };
                    let chunk = r.bytes(r.remaining())?;
                    Command::Deliver {
                        subscription_id,
                        committed_offset,
                        chunk,
                    }
                }
                KEY_CREDIT => Command::Credit {
                    subscription_id: r.u8()?,
                    credit: r.u16()?,
                },
                KEY_STORE_OFFSET => Command::StoreOffset {
                    reference: string(r)?,
                    stream: string(r)?,
                    offset: r.u64()?,
                },
                KEY_QUERY_OFFSET => Command::QueryOffset {
                    correlation_id: r.u32()?,
                    reference: string(r)?,
                    stream: string(r)?,
                },
                KEY_UNSUBSCRIBE => Command::Unsubscribe {
                    correlation_id: r.u32()?,
                    subscription_id: r.u8()?,
                },
                KEY_CREATE => Command::Create {
                    correlation_id: r.u32()?,
                    stream: string(r)?,
                    arguments: string_map(r)?,
                },
                KEY_DELETE => Command::Delete {
                    correlation_id: r.u32()?,
                    stream: string(r)?,
                },
                KEY_METADATA => Command::Metadata {
                    correlation_id: r.u32()?,
                    streams: strings(r)?,
                },
                KEY_METADATA_UPDATE => Command::MetadataUpdate {
                    code: r.u16()?,
                    stream: string(r)?,
                },
                KEY_PEER_PROPERTIES => Command::PeerProperties {
                    correlation_id: r.u32()?,
                    properties: string_map(r)?,
                },
                KEY_SASL_HANDSHAKE => Command::SaslHandshake {
                    correlation_id: r.u32()?,
                },
                KEY_SASL_AUTHENTICATE => Command::SaslAuthenticate {
                    correlation_id: r.u32()?,
                    mechanism: string(r)?,
                    data: bytes(r)?,
                },
                KEY_TUNE => Command::Tune {
                    frame_max: r.u32()?,
                    heartbeat_s: r.u32()?,
                },
                KEY_OPEN => Command::Open {
                    correlation_id: r.u32()?,
                    virtual_host: string(r)?,
                },
                KEY_CLOSE => Command::Close {
                    correlation_id: r.u32()?,
                    code: r.u16()?,
                    reason: string(r)?,
                },
                KEY_HEARTBEAT => Command::Heartbeat,
                KEY_ROUTE => Command::Route {
                    correlation_id: r.u32()?,
                    routing_key: string(r)?,
                    super_stream: string(r)?,
                },
                KEY_PARTITIONS => Command::Partitions {
                    correlation_id: r.u32()?,
                    super_stream: string(r)?,
                },
                KEY_CONSUMER_UPDATE => Command::ConsumerUpdate {
                    correlation_id: r.u32()?,
                    subscription_id: r.u8()?,
                    active: r.u8()? != 0,
                },
                KEY_EXCHANGE_COMMAND_VERSIONS => Command::ExchangeCommandVersions {
                    correlation_id: r.u32()?,
                    versions: versions(r)?,
                },
                KEY_STREAM_STATS => Command::StreamStats {
                    correlation_id: r.u32()?,
                    stream: string(r)?,
                },
                KEY_CREATE_SUPER_STREAM => Command::CreateSuperStream {
                    correlation_id: r.u32()?,
                    name: string(r)?,
                    partitions: strings(r)?,
                    binding_keys: strings(r)?,
                    arguments: string_map(r)?,
                },
                KEY_DELETE_SUPER_STREAM => Command::DeleteSuperStream {
                    correlation_id: r.u32()?,
                    name: string(r)?,
                },
                _ => return Err(BodyError::UnknownKey),
            }
        };
        if r.remaining() != 0 {
            return Err(BodyError::TrailingBytes);
        }
        Ok(command)
    }
}

fn versions(r: &mut Reader) -> Result<Vec<CommandVersion>, BodyError> {
    let n = wire::count(r, 6)?;
    (0..n)
        .map(|_| {
            Ok(CommandVersion {
                key: r.u16()?,
                min: r.u16()?,
                max: r.u16()?,
            })
        })
        .collect()
}

fn put_versions(out: &mut BytesMut, versions: &[CommandVersion]) {
    wire::put_count(out, versions.len());
    for v in versions {
        out.put_u16(v.key);
        out.put_u16(v.min);
        out.put_u16(v.max);
    }
}
