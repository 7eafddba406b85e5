//! RabbitMQ's stream protocol (port 5552), as `deps/rabbitmq_stream/docs/PROTOCOL.adoc` defines it
//! for RabbitMQ 3.9-3.13: frames and every command, with no I/O.
//!
//! The map:
//! - [`frame`]: the size-prefixed frame; an incremental [`frame::decode`] over the read buffer
//!   that returns a command, "need more" (`Ok(None)`) or an error carrying the response code to
//!   close with; [`frame::encode`] and the Deliver header for chunks sent from the store.
//! - [`command`]: [`Command`], one variant per request, response and one-way command, each with
//!   its body's encoding; offset specifications, published messages, metadata.
//! - [`constants`]: command keys, the response bit, response codes, offset types, versions and
//!   limits.
//! - [`wire`]: the protocol's strings, bytes, arrays and maps over [`crate::wire::Reader`].
//!
//! Bytes flow `frame::decode` -> `Command` -> the server's connection state machine, which
//! answers with `Command`s that `frame::encode` appends to its write buffer. A Deliver's chunk is
//! the store's bytes, carried unparsed.

pub mod command;
pub mod constants;
pub mod frame;
pub mod wire;

pub use command::{
    Broker, Command, CommandVersion, OffsetSpec, PublishedMessage, StreamMetadata, SubBatch,
};
pub use frame::{decode, encode, encode_deliver_header, DecodeError};
