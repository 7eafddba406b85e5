//! The storage engine: one shared write-ahead log per node and per-log segment files. Knows nothing of AMQP.
//!
//! - [`journal`]: the small durable journal of metadata records.

pub mod journal;
