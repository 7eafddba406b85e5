//! What the broker asks of the storage engine, as effects: the vhost stays a plain state
//! machine, and the server carries these out (in order, right after the command that produced
//! them) against the shared WAL.

use bytes::Bytes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    /// A stored message entered a durable queue at `index` of the queue's log.
    Append {
        log: u64,
        index: u64,
        payload: Bytes,
    },
    /// The message at `index` left the queue for good (acked, dead-lettered, expired, purged):
    /// the engine never writes it again and reclaims its space.
    Release { log: u64, index: u64 },
    /// Every entry up to `index` is settled: the engine drops them from its index and its
    /// checkpoint (single releases alone would keep a slot each until then).
    ReleasePrefix { log: u64, index: u64 },
    /// The queue is gone.
    DeleteLog { log: u64 },
}
