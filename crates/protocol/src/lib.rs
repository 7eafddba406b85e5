//! AMQP 0-9-1 codec: frames, methods and content headers, with no I/O.
//!
//! The map:
//! - [`frame`]: the 7-byte frame header, frame-end octet and size limits; splits a byte stream
//!   into frames without copying payloads.
//! - [`method`]: method frames. The data-plane methods (basic.publish, deliver, get-ok, ack,
//!   nack, reject, return) are hand-coded because they run once per message; every other
//!   method goes through `amq-protocol`'s generated codec.
//! - [`content`]: content headers. The encoded property list is kept as raw bytes so that
//!   properties and headers travel byte-exact from publisher to consumer; fields are parsed
//!   only when routing or queue semantics need them.
//! - [`constants`]: reply codes and class ids.
//! - [`wire`]: the primitive readers and writers shared by the hand-coded parts.
//! - [`amqp10`]: the AMQP 1.0 message format that stream messages are stored and read in.
//! - [`stream`]: RabbitMQ's stream protocol (port 5552): its frames and commands, a codec of its
//!   own beside the 0-9-1 one.
//!
//! A byte stream flows `frame::decode` -> `method::Method::decode` / `content::ContentHeader::decode`;
//! outbound traffic is appended to a `BytesMut` by the `encode` functions, so a caller can build
//! many frames into one buffer and write them with one syscall.

pub mod amqp10;
pub mod constants;
pub mod content;
pub mod frame;
pub mod method;
pub mod stream;
pub mod wire;

pub use amq_protocol::protocol as amqp;
pub use amq_protocol_types as types;
pub use amq_protocol_types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

/// The header a 0-9-1 client sends first; also what we answer a wrong header with.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
