//! Every command of the stream protocol (RabbitMQ 3.9-3.13), both directions: the enum and
//! what each variant is on the wire; `encode` and `decode` write and read its body.
//!
//! One enum holds requests, responses and one-way commands alike, so a decoder answers one
//! question ("what did the peer send?") and a test can round-trip any of them. Strings are
//! `String` (the protocol says UTF-8; names end up as broker names); opaque payloads (messages,
//! SASL data, chunks) are `Bytes` sliced out of the frame, never copied.

mod decode;
mod encode;

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
    /// An AMQP 1.0 message as the client encoded it; the broker stores it as it came. For a
    /// sub-entry batch, the batch's data (its messages, compressed or not).
    pub message: Bytes,
    /// Set when the entry is a sub-entry batch (the Java client's `subEntrySize`): many
    /// messages under one publishing id, stored as one osiris sub-batch entry.
    pub sub_batch: Option<SubBatch>,
}

/// The header of a sub-entry batch: `1:1, compression:3, reserved:4`, then these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubBatch {
    /// 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd (the client's codes; the broker never decodes).
    pub compression: u8,
    /// Messages in the batch: the offsets it takes.
    pub records: u16,
    pub uncompressed_bytes: u32,
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
}
