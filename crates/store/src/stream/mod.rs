//! Streams' logs: append-only sequences of chunks, read by any number of readers from any
//! offset, kept by size or age. Apart from the queues' WAL and segments: a stream is written
//! once, into its own segment files, in the very bytes that RabbitMQ's stream protocol delivers.
//!
//! # Map
//!
//! | module | concept |
//! |---|---|
//! | [`chunk`] | the chunk, osiris's byte layout: encoder from entries, decoder that never panics |
//! | [`index`] | segment and index files: names, headers, the 48-byte index record per chunk |
//! | `log` | [`StreamLog`], the writer: append, roll, sync, truncate, retention; [`StreamHandle`] for readers and lookups by chunk sequence number |
//! | `reader` | [`Reader`]: a consumer's, positioned by an [`OffsetSpec`], yields user [`ChunkSlice`]s up to the committed offset; a replication reader, every chunk up to the written end |
//! | `recovery` | opening after a crash: the last segment checked chunk by chunk, its torn tail cut |
//!
//! # How a chunk flows
//!
//! The stream layer above stamps a batch of messages with its clock and epoch and calls
//! [`StreamLog::append`]: the chunk is encoded once, written with one `pwrite` at the end of
//! the active segment, then its 48-byte index record with another; the segment summary and
//! the written end are published to readers. [`StreamLog::sync`] makes it durable when the
//! caller chooses. Replication (above) decides the committed offset and says so with
//! [`StreamHandle::set_commit_end`]; a [`Reader`] then finds the chunk through the index and
//! yields it as (file, position, length) for `sendfile`, or reads and checks it. When a segment
//! reaches `segment_bytes_max` the writer syncs it and starts the next; retention deletes
//! whole segments from the head, never the last.
//!
//! # As a Raft log
//!
//! Each chunk also has a sequence number, its place in the stream from 0, kept across
//! retention (each index file's header holds its first one): a Raft group whose entries are
//! the chunks finds entry `n` with [`StreamHandle::chunk_by_seq`] (one seek; the index record
//! says its epoch, the entry's term), reads entries for followers with
//! [`StreamHandle::replication_reader`], takes a leader's chunk whole with
//! [`StreamLog::append_chunk`], drops a conflicting suffix with
//! [`StreamLog::truncate_from_seq`], and stores its own entries as [`ChunkType::Empty`] and
//! [`ChunkType::Configuration`] chunks, which consumers' readers skip.
//!
//! # On disk
//!
//! One directory per stream: `NNNNNNNNNNNNNNNNNNNN.segment` and `.index` pairs named after
//! their first offset (layouts in [`chunk`] and [`index`]). Memory per stream is one
//! [`SegmentSummary`] per segment, whatever the stream's length.

pub mod chunk;
pub mod index;
mod log;
mod reader;
mod recovery;

pub use chunk::{Chunk, ChunkError, ChunkHeader, ChunkMeta, ChunkType, Entry};
pub use index::IndexRecord;
pub use log::{AppendMeta, Overview, RetentionOutcome, SegmentSummary, StreamHandle, StreamLog};
pub use reader::{ChunkSlice, OffsetSpec, ReadChunk, Reader};
pub use recovery::Recovered;

/// RabbitMQ's default `x-stream-max-segment-size-bytes`.
pub const SEGMENT_BYTES_DEFAULT: u64 = 500_000_000;
/// Largest accepted segment size: RabbitMQ's cap on `x-stream-max-segment-size-bytes`. With
/// one chunk of at most [`chunk::CHUNK_BYTES_MAX`] past it, positions fit the index's `u32`.
pub const SEGMENT_BYTES_LIMIT: u64 = 3_000_000_000;
/// Default most chunks per segment (osiris's): bounds an index file to 12 MB.
pub const SEGMENT_CHUNKS_DEFAULT: u32 = 256_000;
/// Largest accepted chunks per segment.
pub const SEGMENT_CHUNKS_LIMIT: u32 = 1 << 20;
/// Read window of recovery's scan of the last segment.
pub const RECOVERY_READ_BYTES: usize = 8 << 20;
/// The writer keeps its encoding buffer between appends up to this size; a larger one (one
/// huge chunk) is given back.
pub const WRITE_BUFFER_KEPT_BYTES_MAX: usize = 4 << 20;

/// How a stream's segments are cut. Fixed at declaration, as in RabbitMQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// A segment takes no new chunk once this full (`x-stream-max-segment-size-bytes`);
    /// a chunk larger than it gets a segment of its own. Clamped to 1..=[`SEGMENT_BYTES_LIMIT`].
    pub segment_bytes_max: u64,
    /// A segment takes at most this many chunks. Clamped to 1..=[`SEGMENT_CHUNKS_LIMIT`].
    pub segment_chunks_max: u32,
}

impl Default for StreamConfig {
    fn default() -> StreamConfig {
        StreamConfig {
            segment_bytes_max: SEGMENT_BYTES_DEFAULT,
            segment_chunks_max: SEGMENT_CHUNKS_DEFAULT,
        }
    }
}

impl StreamConfig {
    pub(crate) fn segment_bytes(&self) -> u64 {
        self.segment_bytes_max.clamp(1, SEGMENT_BYTES_LIMIT)
    }

    pub(crate) fn segment_chunks(&self) -> u32 {
        self.segment_chunks_max.clamp(1, SEGMENT_CHUNKS_LIMIT)
    }
}

/// What a stream keeps (`x-max-length-bytes`, `x-max-age`): may change at any time (policies),
/// so it is passed to each [`StreamLog::apply_retention`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Keep at most about this many bytes of segments (whole segments: the last one always).
    pub max_bytes: Option<u64>,
    /// Delete segments whose last chunk is older than this.
    pub max_age_ms: Option<u64>,
}
