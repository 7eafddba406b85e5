//! A command read from a frame's body, whose version the frame decoder checked.

use super::*;

impl Command {
    /// Decodes the body of a frame whose version the caller checked against [`version_max`];
    /// the whole body must be consumed.
    pub(in crate::stream) fn decode_body(
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
                            // A sub-entry batch's first byte has its top bit set; a
                            // message's size never does (31 bits).
                            let first = r.peek_u8()?;
                            if first & 0x80 == 0 {
                                return Ok(PublishedMessage {
                                    publishing_id,
                                    filter_value,
                                    message: bytes(r)?,
                                    sub_batch: None,
                                });
                            }
                            let flags = r.u8()?;
                            let records = r.u16()?;
                            let uncompressed_bytes = r.u32()?;
                            Ok(PublishedMessage {
                                publishing_id,
                                filter_value,
                                message: bytes(r)?,
                                sub_batch: Some(SubBatch {
                                    compression: (flags >> 4) & 0x07,
                                    records,
                                    uncompressed_bytes,
                                }),
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
