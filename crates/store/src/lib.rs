//! The storage engine: one shared write-ahead log per node and per-log segment files. Knows nothing of AMQP.
