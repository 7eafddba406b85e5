//! Generators of stream protocol commands, shared by the codec's round-trip and differential
//! tests.
#![allow(dead_code)]

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::{BoxedStrategy, Union};
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{
    Broker, Command, CommandVersion, OffsetSpec, PublishedMessage, StreamMetadata,
};

/// Which strings a generator may produce. The official Rust client reads an empty string as
/// null and then fails on it, so what is compared with it uses non-empty strings only.
#[derive(Clone, Copy)]
pub struct Text {
    pub allow_empty: bool,
}

impl Text {
    pub fn s(self) -> BoxedStrategy<String> {
        if self.allow_empty {
            "\\PC{0,12}".boxed()
        } else {
            "\\PC{1,12}".boxed()
        }
    }

    pub fn strings(self) -> BoxedStrategy<Vec<String>> {
        vec(self.s(), 0..4).boxed()
    }

    /// Distinct keys: the client keeps string maps in a `HashMap`.
    pub fn map(self) -> BoxedStrategy<Vec<(String, String)>> {
        proptest::collection::btree_map(self.s(), self.s(), 0..4)
            .prop_map(|m| m.into_iter().collect())
            .boxed()
    }
}

pub fn code() -> impl Strategy<Value = u16> {
    RESPONSE_CODE_OK..=RESPONSE_CODE_NO_OFFSET
}

pub fn offset_spec() -> impl Strategy<Value = OffsetSpec> {
    prop_oneof![
        Just(OffsetSpec::First),
        Just(OffsetSpec::Last),
        Just(OffsetSpec::Next),
        any::<u64>().prop_map(OffsetSpec::Offset),
        any::<i64>().prop_map(OffsetSpec::Timestamp),
    ]
}

pub fn payload() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

pub fn versions() -> impl Strategy<Value = Vec<CommandVersion>> {
    vec(
        (any::<u16>(), any::<u16>(), any::<u16>()).prop_map(|(key, min, max)| CommandVersion {
            key,
            min,
            max,
        }),
        0..4,
    )
}

/// Every command this codec knows, with any field values the wire can carry.
pub fn command(t: Text) -> BoxedStrategy<Command> {
    let s = || t.s();
    let corr = any::<u32>;
    let arms: Vec<BoxedStrategy<Command>> = vec![
        (corr(), any::<u8>(), s(), s())
            .prop_map(|(correlation_id, publisher_id, reference, stream)| {
                Command::DeclarePublisher {
                    correlation_id,
                    publisher_id,
                    reference,
                    stream,
                }
            })
            .boxed(),
        (
            any::<u8>(),
            vec(
                (any::<u64>(), proptest::option::of("\\PC{1,8}"), payload()),
                0..4,
            ),
        )
            .prop_map(|(publisher_id, messages)| Command::Publish {
                publisher_id,
                messages: messages
                    .into_iter()
                    .map(|(publishing_id, filter_value, message)| PublishedMessage {
                        sub_batch: None,
                        publishing_id,
                        filter_value,
                        message,
                    })
                    .collect(),
            })
            .boxed(),
        (any::<u8>(), vec(any::<u64>(), 0..6))
            .prop_map(|(publisher_id, publishing_ids)| Command::PublishConfirm {
                publisher_id,
                publishing_ids,
            })
            .boxed(),
        (any::<u8>(), vec((any::<u64>(), code()), 0..6))
            .prop_map(|(publisher_id, errors)| Command::PublishError {
                publisher_id,
                errors,
            })
            .boxed(),
        (corr(), s(), s())
            .prop_map(
                |(correlation_id, reference, stream)| Command::QueryPublisherSequence {
                    correlation_id,
                    reference,
                    stream,
                },
            )
            .boxed(),
        (corr(), code(), any::<u64>())
            .prop_map(
                |(correlation_id, code, sequence)| Command::QueryPublisherSequenceResponse {
                    correlation_id,
                    code,
                    sequence,
                },
            )
            .boxed(),
        (corr(), any::<u8>())
            .prop_map(|(correlation_id, publisher_id)| Command::DeletePublisher {
                correlation_id,
                publisher_id,
            })
            .boxed(),
        (
            corr(),
            any::<u8>(),
            s(),
            offset_spec(),
            any::<u16>(),
            t.map(),
        )
            .prop_map(
                |(correlation_id, subscription_id, stream, offset, credit, properties)| {
                    Command::Subscribe {
                        correlation_id,
                        subscription_id,
                        stream,
                        offset,
                        credit,
                        properties,
                    }
                },
            )
            .boxed(),
        (any::<u8>(), proptest::option::of(any::<u64>()), payload())
            .prop_map(
                |(subscription_id, committed_offset, chunk)| Command::Deliver {
                    subscription_id,
                    committed_offset,
                    chunk,
                },
            )
            .boxed(),
        (any::<u8>(), any::<u16>())
            .prop_map(|(subscription_id, credit)| Command::Credit {
                subscription_id,
                credit,
            })
            .boxed(),
        (code(), any::<u8>())
            .prop_map(|(code, subscription_id)| Command::CreditResponse {
                code,
                subscription_id,
            })
            .boxed(),
        (s(), s(), any::<u64>())
            .prop_map(|(reference, stream, offset)| Command::StoreOffset {
                reference,
                stream,
                offset,
            })
            .boxed(),
        (corr(), s(), s())
            .prop_map(|(correlation_id, reference, stream)| Command::QueryOffset {
                correlation_id,
                reference,
                stream,
            })
            .boxed(),
        (corr(), code(), any::<u64>())
            .prop_map(
                |(correlation_id, code, offset)| Command::QueryOffsetResponse {
                    correlation_id,
                    code,
                    offset,
                },
            )
            .boxed(),
        (corr(), any::<u8>())
            .prop_map(|(correlation_id, subscription_id)| Command::Unsubscribe {
                correlation_id,
                subscription_id,
            })
            .boxed(),
        (corr(), s(), t.map())
            .prop_map(|(correlation_id, stream, arguments)| Command::Create {
                correlation_id,
                stream,
                arguments,
            })
            .boxed(),
        (corr(), s())
            .prop_map(|(correlation_id, stream)| Command::Delete {
                correlation_id,
                stream,
            })
            .boxed(),
        (corr(), t.strings())
            .prop_map(|(correlation_id, streams)| Command::Metadata {
                correlation_id,
                streams,
            })
            .boxed(),
        (
            corr(),
            vec((any::<u16>(), s(), any::<u32>()), 0..3),
            vec((s(), code(), any::<u16>(), vec(any::<u16>(), 0..3)), 0..3),
        )
            .prop_map(
                |(correlation_id, brokers, streams)| Command::MetadataResponse {
                    correlation_id,
                    brokers: brokers
                        .into_iter()
                        .map(|(reference, host, port)| Broker {
                            reference,
                            host,
                            port,
                        })
                        .collect(),
                    streams: streams
                        .into_iter()
                        .map(|(stream, code, leader, replicas)| StreamMetadata {
                            stream,
                            code,
                            leader,
                            replicas,
                        })
                        .collect(),
                },
            )
            .boxed(),
        (code(), s())
            .prop_map(|(code, stream)| Command::MetadataUpdate { code, stream })
            .boxed(),
        (corr(), t.map())
            .prop_map(|(correlation_id, properties)| Command::PeerProperties {
                correlation_id,
                properties,
            })
            .boxed(),
        (corr(), code(), t.map())
            .prop_map(
                |(correlation_id, code, properties)| Command::PeerPropertiesResponse {
                    correlation_id,
                    code,
                    properties,
                },
            )
            .boxed(),
        corr()
            .prop_map(|correlation_id| Command::SaslHandshake { correlation_id })
            .boxed(),
        (corr(), code(), t.strings())
            .prop_map(
                |(correlation_id, code, mechanisms)| Command::SaslHandshakeResponse {
                    correlation_id,
                    code,
                    mechanisms,
                },
            )
            .boxed(),
        (corr(), s(), payload())
            .prop_map(
                |(correlation_id, mechanism, data)| Command::SaslAuthenticate {
                    correlation_id,
                    mechanism,
                    data,
                },
            )
            .boxed(),
        (corr(), code(), payload())
            .prop_map(
                |(correlation_id, code, challenge)| Command::SaslAuthenticateResponse {
                    correlation_id,
                    code,
                    challenge,
                },
            )
            .boxed(),
        (any::<u32>(), any::<u32>())
            .prop_map(|(frame_max, heartbeat_s)| Command::Tune {
                frame_max,
                heartbeat_s,
            })
            .boxed(),
        (corr(), s())
            .prop_map(|(correlation_id, virtual_host)| Command::Open {
                correlation_id,
                virtual_host,
            })
            .boxed(),
        (corr(), code(), t.map())
            .prop_map(|(correlation_id, code, properties)| Command::OpenResponse {
                correlation_id,
                code,
                // A server sends them only with OK, and the Rust client reads them only then.
                properties: if code == RESPONSE_CODE_OK {
                    properties
                } else {
                    Vec::new()
                },
            })
            .boxed(),
        (corr(), code(), s())
            .prop_map(|(correlation_id, code, reason)| Command::Close {
                correlation_id,
                code,
                reason,
            })
            .boxed(),
        Just(Command::Heartbeat).boxed(),
        (corr(), s(), s())
            .prop_map(
                |(correlation_id, routing_key, super_stream)| Command::Route {
                    correlation_id,
                    routing_key,
                    super_stream,
                },
            )
            .boxed(),
        (corr(), code(), t.strings())
            .prop_map(|(correlation_id, code, streams)| Command::RouteResponse {
                correlation_id,
                code,
                streams,
            })
            .boxed(),
        (corr(), s())
            .prop_map(|(correlation_id, super_stream)| Command::Partitions {
                correlation_id,
                super_stream,
            })
            .boxed(),
        (corr(), code(), t.strings())
            .prop_map(
                |(correlation_id, code, streams)| Command::PartitionsResponse {
                    correlation_id,
                    code,
                    streams,
                },
            )
            .boxed(),
        (corr(), any::<u8>(), any::<bool>())
            .prop_map(
                |(correlation_id, subscription_id, active)| Command::ConsumerUpdate {
                    correlation_id,
                    subscription_id,
                    active,
                },
            )
            .boxed(),
        (corr(), code(), proptest::option::of(offset_spec()))
            .prop_map(
                |(correlation_id, code, offset)| Command::ConsumerUpdateResponse {
                    correlation_id,
                    code,
                    offset,
                },
            )
            .boxed(),
        (corr(), versions())
            .prop_map(
                |(correlation_id, versions)| Command::ExchangeCommandVersions {
                    correlation_id,
                    versions,
                },
            )
            .boxed(),
        (corr(), code(), versions())
            .prop_map(
                |(correlation_id, code, versions)| Command::ExchangeCommandVersionsResponse {
                    correlation_id,
                    code,
                    versions,
                },
            )
            .boxed(),
        (corr(), s())
            .prop_map(|(correlation_id, stream)| Command::StreamStats {
                correlation_id,
                stream,
            })
            .boxed(),
        (corr(), code(), vec((s(), any::<i64>()), 0..4))
            .prop_map(
                |(correlation_id, code, stats)| Command::StreamStatsResponse {
                    correlation_id,
                    code,
                    stats,
                },
            )
            .boxed(),
        (corr(), s(), t.strings(), t.strings(), t.map())
            .prop_map(
                |(correlation_id, name, partitions, binding_keys, arguments)| {
                    Command::CreateSuperStream {
                        correlation_id,
                        name,
                        partitions,
                        binding_keys,
                        arguments,
                    }
                },
            )
            .boxed(),
        (corr(), s())
            .prop_map(|(correlation_id, name)| Command::DeleteSuperStream {
                correlation_id,
                name,
            })
            .boxed(),
        (
            proptest::sample::select(
                warren_protocol::stream::command::GENERIC_RESPONSE_KEYS.to_vec(),
            ),
            corr(),
            code(),
        )
            .prop_map(|(key, correlation_id, code)| Command::Response {
                key,
                correlation_id,
                code,
            })
            .boxed(),
    ];
    Union::new(arms).boxed()
}
