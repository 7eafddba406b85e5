//! A command's body as it goes on the wire (everything after key and version).

use super::*;

impl Command {
    /// Appends the body (everything after key and version).
    pub(in crate::stream) fn encode_body(&self, out: &mut BytesMut) {
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
                    if let Some(b) = &m.sub_batch {
                        out.put_u8(0x80 | ((b.compression & 0x07) << 4));
                        out.put_u16(b.records);
                        out.put_u32(b.uncompressed_bytes);
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
}

fn put_versions(out: &mut BytesMut, versions: &[CommandVersion]) {
    wire::put_count(out, versions.len());
    for v in versions {
        out.put_u16(v.key);
        out.put_u16(v.min);
        out.put_u16(v.max);
    }
}
