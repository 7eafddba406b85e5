//! `warren perf stream`: RabbitMQ's stream-perf-test over the stream protocol, so the same client
//! measures warren's streams and RabbitMQ's.
//!
//! Map:
//! - `client`: one stream protocol connection (handshake, create/delete, declare publisher,
//!   subscribe) on `warren_protocol::stream`'s codec, and the hand-written Publish frame.
//! - `chunk`: the AMQP 1.0 message a producer sends and the osiris chunk a consumer receives.
//! - `workload`: producers, consumers and the reporter of one run; its result and output lines.
//!
//! A run flows: `cli::StreamCli` -> `workload::run` (create the streams, open a connection per
//! producer and consumer, a line per interval) -> `StreamRunResult` -> summary and JSON.

pub mod chunk;
pub mod client;
pub mod workload;

pub use workload::{run, StreamRunResult};
