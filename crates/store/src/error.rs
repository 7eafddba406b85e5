//! The engine's error type: cheap to build on the hot path, distinct cases for what the broker
//! must answer differently (back-pressure, full disk, poisoned engine).

use std::fmt;
use std::io;

/// What can go wrong when using the store.
#[derive(Debug)]
pub enum Error {
    /// Too many appends wait for the WAL writer: wait ([`crate::Store::ready`]) and retry.
    Backpressure,
    /// The disk is full: nothing durable was damaged; block publishers until space returns.
    DiskFull,
    /// An fsync (or a write) failed: the engine refuses every later write, since the page cache
    /// may have dropped data that was never written. Restart to recover what is durable.
    Poisoned(String),
    /// The engine is shutting down.
    Closed,
    /// An append does not continue the log (wrong index, or a term going back).
    InvalidAppend {
        /// The log appended to.
        log_id: u64,
        /// The index the log expected next.
        expected_index: u64,
        /// The index that was given.
        index: u64,
    },
    /// An index outside what the log holds.
    OutOfRange {
        /// The log addressed.
        log_id: u64,
        /// The index asked for.
        index: u64,
    },
    /// A payload, snapshot, or batch above the engine's limits.
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The log does not exist.
    NoSuchLog(u64),
    /// Too many logs.
    TooManyLogs,
    /// Bytes on disk failed their checksum or do not say what the index says they should.
    Corrupt(String),
    /// Another engine (in this or another process) has these directories open.
    AlreadyOpen(std::path::PathBuf),
    /// An I/O error outside the write path (opening, reading).
    Io(io::Error),
    /// Bytes that are not a stream chunk (from a replica, say), or entries no chunk can hold.
    InvalidChunk(crate::stream::ChunkError),
    /// A stream chunk that does not continue the stream: its first offset is not the stream's
    /// next one, or its epoch is older than the last chunk's (a leader that was fenced off).
    ChunkOutOfOrder {
        /// The stream's next offset.
        expected_offset: u64,
        /// The chunk's first offset.
        offset: u64,
        /// The epoch of the stream's last chunk.
        last_epoch: u64,
        /// The chunk's epoch.
        epoch: u64,
    },
    /// A stream truncation that would remove committed chunks, or chunks no longer held.
    TruncateRefused {
        /// The chunk sequence number to truncate from.
        seq: u64,
        /// The first chunk sequence number held.
        first_seq: u64,
        /// Records below it are committed.
        commit_end: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Backpressure => write!(f, "too many pending appends"),
            Error::DiskFull => write!(f, "disk full"),
            Error::Poisoned(why) => write!(f, "storage poisoned by an earlier failure: {why}"),
            Error::Closed => write!(f, "storage closed"),
            Error::InvalidAppend {
                log_id,
                expected_index,
                index,
            } => write!(
                f,
                "log {log_id}: append at index {index}, expected {expected_index} (or term went back)"
            ),
            Error::OutOfRange { log_id, index } => {
                write!(f, "log {log_id}: index {index} out of range")
            }
            Error::TooLarge { what, bytes, max } => {
                write!(f, "{what} of {bytes} bytes is over the limit of {max}")
            }
            Error::NoSuchLog(id) => write!(f, "no log {id}"),
            Error::TooManyLogs => write!(f, "too many logs"),
            Error::Corrupt(why) => write!(f, "corrupt storage: {why}"),
            Error::AlreadyOpen(p) => write!(f, "{} is in use by another engine", p.display()),
            Error::Io(e) => write!(f, "i/o error: {e}"),
            Error::InvalidChunk(e) => write!(f, "invalid stream chunk: {e}"),
            Error::ChunkOutOfOrder {
                expected_offset,
                offset,
                last_epoch,
                epoch,
            } => write!(
                f,
                "stream chunk at offset {offset} epoch {epoch} does not follow offset \
                 {expected_offset} epoch {last_epoch}"
            ),
            Error::TruncateRefused {
                seq,
                first_seq,
                commit_end,
            } => write!(
                f,
                "stream truncation from chunk {seq} refused: chunks from {first_seq} are held, \
                 offsets below {commit_end} are committed"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(e)
    }
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
