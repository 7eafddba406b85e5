//! Configuration and the engine's limits.
//!
//! Every queue, batch, buffer and cache of the engine has an upper bound named here with its unit,
//! so that memory stays bounded whatever the load: work beyond a bound is refused
//! ([`crate::Error::Backpressure`]) rather than silently grown.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::fault::Faults;

/// Default size at which the active WAL file is rolled over and handed to the segment writer.
pub const WAL_FILE_BYTES_DEFAULT: u64 = 256 << 20;
/// Smallest accepted rollover size: tests use tiny WAL files to exercise rollover often.
pub const WAL_FILE_BYTES_MIN: u64 = 4 << 10;
/// Largest accepted rollover size: WAL offsets are kept as `u32` in the per-entry index, and a
/// file may exceed the rollover size by one batch.
pub const WAL_FILE_BYTES_MAX: u64 = 1 << 30;
/// Most settled WAL files kept to be recycled as later ones (see `wal`): one is enough for a
/// steady stream, as each file is settled long before the next one fills; the second covers a
/// burst that rolls files faster than the segment writer settles them.
pub const WAL_SPARE_FILES_MAX: usize = 2;
/// Largest payload of one entry: what the record header's 28-bit length holds. It must take a
/// broker's largest message whole (RabbitMQ's max_message_size defaults to 128 MiB) with its
/// envelope; an entry above the pending budget is written in a batch of its own.
pub const PAYLOAD_BYTES_MAX: usize = (1 << 28) - 1;
/// Largest snapshot blob stored with a prefix release: the broker's per-queue state, not data.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 20;
/// Most records written by one WAL write + fdatasync (Ra uses 8192 as well).
pub const BATCH_ENTRIES_MAX: usize = 8192;
/// Most bytes of records written by one WAL write call (one record may exceed it alone).
pub const BATCH_BYTES_MAX: usize = 8 << 20;
/// Most appended entries waiting for the WAL writer; beyond it `append` answers
/// [`crate::Error::Backpressure`].
pub const PENDING_ENTRIES_MAX: usize = 65_536;
/// Most payload bytes waiting for the WAL writer.
pub const PENDING_BYTES_MAX: usize = 64 << 20;
/// Extra room for control records (release, truncate, snapshot, delete) beyond
/// [`PENDING_ENTRIES_MAX`], so acks keep flowing while publishers are pushed back.
pub const PENDING_CONTROL_MAX: usize = 65_536;
/// Default of [`Config::commit_window_us`]: 2 ms, a fraction of a publisher's confirm latency
/// that keeps bytes written within 10 % of the messages' at 30 000 1 KB messages a second.
pub const COMMIT_WINDOW_US_DEFAULT: u64 = 2_000;
/// Most entries in one `append` call.
pub const APPEND_ENTRIES_MAX: usize = 4096;
/// Default budget of the in-memory cache of recently appended payloads.
pub const CACHE_BYTES_DEFAULT: usize = 64 << 20;
/// Most entries tracked by the cache, whatever their size (bounds the eviction queue).
pub const CACHE_ENTRIES_MAX: usize = 1 << 20;
/// Most entries in one segment file (fixed size of its index area).
pub const SEGMENT_ENTRIES_MAX: u32 = 4096;
/// A segment file takes no new entry once its data area reaches this size.
pub const SEGMENT_DATA_BYTES_MAX: u64 = 64 << 20;
/// A full segment whose live entries are fewer than this percentage is rewritten by compaction.
pub const COMPACT_LIVE_PERCENT_MAX: u64 = 50;
/// A rolled WAL file whose live append records make up at least this percentage of its bytes is
/// adopted (kept in place as a data file, with a small index sidecar) instead of being copied
/// into segments: a backlog is then written once. Below it, copying the few live entries frees
/// more disk than it costs.
pub const ADOPT_LIVE_PERCENT_MIN: u64 = 50;
/// An adopted WAL file whose live records fall below this percentage of its bytes, and stay
/// there for [`ADOPTED_QUIET_MS`], has its live entries copied into segments and is deleted.
/// Lower than [`ADOPT_LIVE_PERCENT_MIN`] so that a file is not adopted and then copied soon after.
pub const ADOPTED_COMPACT_LIVE_PERCENT_MAX: u64 = 25;
/// How long an adopted file's live bytes must stay unchanged before it is compacted (a forced
/// pass does not wait). A backlog drained in order empties each file within moments: copying
/// the tail of a file that consumers are reading through would write it twice for nothing.
pub const ADOPTED_QUIET_MS: u64 = 2 * GC_INTERVAL_MS;
/// Most adopted WAL files compacted by one pass.
pub const ADOPTED_COMPACT_PER_PASS_MAX: usize = 4;
/// Most segments rewritten by one compaction pass, so that a pass stays short.
pub const COMPACT_SEGMENTS_PER_PASS_MAX: usize = 64;
/// Most entries returned by one `read_range` call.
pub const READ_ENTRIES_MAX: usize = 4096;
/// Most segment file descriptors kept open for reads.
pub const SEGMENT_FDS_MAX: usize = 256;
/// Most logs (queues) one engine holds.
pub const LOGS_MAX: usize = 1 << 20;
/// Wait between retries of a WAL write that failed with a full disk.
pub const DISK_FULL_RETRY_MS: u64 = 100;
/// How often the segment writer looks for released segments to delete when the WAL is idle.
pub const GC_INTERVAL_MS: u64 = 2_000;
/// Read buffer used to replay a WAL file at recovery.
pub const RECOVERY_READ_BYTES: usize = 8 << 20;

/// Where the engine keeps its files and how big they get.
///
/// The three directories may sit on different disks: the WAL sees small sequential synced
/// writes, segments see bulk writes and reads of backlogs, meta sees a small checkpoint file.
#[derive(Clone, Debug)]
pub struct Config {
    /// Directory of the write-ahead log files.
    pub wal_dir: PathBuf,
    /// Directory of the per-log segment files.
    pub segment_dir: PathBuf,
    /// Directory of the checkpoint (the manifest of segments, snapshots and releases).
    pub meta_dir: PathBuf,
    /// Size at which the active WAL file rolls over, clamped to
    /// [`WAL_FILE_BYTES_MIN`]..=[`WAL_FILE_BYTES_MAX`].
    pub wal_file_bytes_max: u64,
    /// Budget of the in-memory payload cache: entries still waiting for the WAL writer are
    /// always kept, older ones are evicted first.
    pub cache_bytes_max: usize,
    /// A rolled WAL file is adopted in place when its live records are at least this percent
    /// of it (default [`ADOPT_LIVE_PERCENT_MIN`]); above 100 no file is ever adopted and every
    /// backlog is copied into segments (which also moves it to the segment directory's disk).
    pub adopt_live_percent_min: u64,
    /// While records stream in (several arrived during the last sync), the WAL writer starts
    /// a sync no sooner than this many microseconds after the previous one began, so that
    /// batches grow and the partly written page each sync costs is shared by more records
    /// (default [`COMMIT_WINDOW_US_DEFAULT`]; 0 syncs as soon as anything waits). A lone
    /// publisher waiting for each confirm is never held back.
    pub commit_window_us: u64,
    /// Fault injection for tests (a failing fsync, a full disk). Not for production use.
    #[doc(hidden)]
    pub faults: Arc<Faults>,
}

impl Config {
    /// Puts the WAL, segments and meta directories under one root (`wal/`, `segments/`, `meta/`).
    pub fn new(root: impl AsRef<Path>) -> Config {
        let root = root.as_ref();
        Config {
            wal_dir: root.join("wal"),
            segment_dir: root.join("segments"),
            meta_dir: root.join("meta"),
            wal_file_bytes_max: WAL_FILE_BYTES_DEFAULT,
            cache_bytes_max: CACHE_BYTES_DEFAULT,
            adopt_live_percent_min: ADOPT_LIVE_PERCENT_MIN,
            commit_window_us: COMMIT_WINDOW_US_DEFAULT,
            faults: Arc::new(Faults::default()),
        }
    }

    pub(crate) fn wal_file_bytes(&self) -> u64 {
        self.wal_file_bytes_max
            .clamp(WAL_FILE_BYTES_MIN, WAL_FILE_BYTES_MAX)
    }
}
