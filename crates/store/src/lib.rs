//! warren's storage engine: many Raft-shaped logs (one per queue) on one shared write-ahead log
//! per node plus per-log segment files. It knows nothing of AMQP.
//!
//! # Map
//!
//! | module | concept |
//! |---|---|
//! | [`store`] | [`Store`], the public API: append, read, truncate, release, release a prefix, delete |
//! | `read` | reading entries back: cache, else the WAL file or segment holding them, planned under the lock and read after it |
//! | `log` | the in-memory index of one log: 16 bytes per entry, terms as runs, a payload cache |
//! | [`record`] | the record format shared by the WAL and segments, with its crc32c |
//! | [`wal`] | the WAL files and the writer thread: group commit, rollover, recycling, fault handling |
//! | `wal_reader` | reading a WAL file's records back, batch by batch, only what its batch ends vouch for |
//! | `sync_waiters` | callers told from the WAL writer's thread once their records are durable ([`Store::sync_then`]) |
//! | `segment_writer` | the thread settling rolled WAL files (copying their live entries into segments, or adopting mostly-live files in place), deleting and compacting segments and adopted files |
//! | `adopted` | adopted WAL files: the index sidecar that lets recovery find their entries without reading them |
//! | [`segment`] | the segment file format: header, index, data |
//! | `checkpoint` | the manifest in the meta dir that lets WAL files be deleted |
//! | `recovery` | rebuilding every log at open: checkpoint, segment indexes, WAL replay |
//! | [`config`] | directories, sizes, and every limit as a named constant |
//! | `fault` | fault injection for tests; what counts as a full disk |
//! | `id_hash` | the fast hasher for maps keyed by ids the broker numbers (log ids here; queues, channels, groups above) |
//! | [`error`] | the error type |
//! | [`journal`] | the small synced journal of metadata records (durable topology) |
//! | [`stream`] | streams' logs: osiris-layout chunks in segment files with an index, readers by offset spec, retention, recovery (apart from the WAL) |
//!
//! # How an entry flows
//!
//! [`Store::append`] puts the entry in the log's index and cache and queues a record. The WAL
//! writer thread takes all queued records of all logs, writes them with one `pwrite`, one
//! `fdatasync`, and calls [`DurabilityListener::on_durable`] per log. When the WAL file reaches
//! its size limit it rolls over; the segment writer copies the entries of the rolled file that
//! are still live into the logs' segment files (released ones are never written again), writes
//! the checkpoint, and deletes the WAL file; when most of the file is still live (a backlog) it
//! adopts the file in place instead, writing only a small index, so each byte is written once. Reads come from the cache, else from the WAL or
//! segment file, checksum verified. `docs/storage.md` has the byte layouts and the life cycle.

#![warn(missing_docs)]

mod adopted;
mod checkpoint;
pub mod config;
pub mod error;
mod fault;
mod id_hash;
pub mod journal;
mod log;
mod read;
pub mod record;
mod recovery;
pub mod segment;
mod segment_writer;
pub mod store;
pub mod stream;
mod sync_waiters;
pub mod wal;
mod wal_reader;

pub use config::Config;
pub use error::{Error, Result};
#[doc(hidden)]
pub use fault::{CrashPoint, Faults};
pub use id_hash::{IdHashMap, IdHashSet, IdHasher};
pub use store::{
    DurabilityListener, Entry, HardState, LogInfo, NoopListener, Ready, Snapshot, Stats, Store,
};
pub use sync_waiters::SyncDone;
