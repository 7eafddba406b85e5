//! The AMQP 1.0 message format, which RabbitMQ stores stream messages in and stream clients
//! publish and read; no AMQP 1.0 connections or links.
//!
//! The map:
//! - [`types`]: AMQP 1.0's type system: [`Value`], its encodings, bounded decoding.
//! - [`message`]: [`Message`] and its sections (header, annotations, properties, application
//!   properties, data / amqp-sequence / amqp-value body, footer).
//! - [`amqp091`]: RabbitMQ 3.10's mapping between a 0-9-1 message and a stream's AMQP 1.0 one.
//!
//! A stream publish carries a message as bytes that are stored as they came; a server decodes
//! one only to show it to a consumer of another protocol.

pub mod amqp091;
pub mod message;
pub mod types;

pub use message::{Body, Header, Message, Properties};
pub use types::{TypeError, Value};
