//! A published message as queues hold it: shared by every queue it was routed to.

use bytes::Bytes;
use std::sync::Arc;
use warren_protocol::content::Properties;

#[derive(Debug)]
pub struct Message {
    pub exchange: Bytes,
    pub routing_key: Bytes,
    /// The content header's property bytes exactly as published.
    pub properties: Bytes,
    pub body: Bytes,
    pub persistent: bool,
    pub priority: u8,
    /// Per-message TTL from the `expiration` property, already validated.
    pub expiration_ms: Option<u64>,
}

impl Message {
    /// Builds a message from a publish, reading the properties the broker's semantics need.
    pub fn new(
        exchange: Bytes,
        routing_key: Bytes,
        properties: Bytes,
        props: &Properties,
        body: Bytes,
    ) -> Self {
        Message {
            exchange,
            routing_key,
            properties,
            body,
            persistent: props.delivery_mode == Some(2),
            priority: props.priority.unwrap_or(0),
            expiration_ms: props
                .expiration
                .as_ref()
                .and_then(|e| parse_expiration(e).ok()),
        }
    }

    pub fn size_bytes(&self) -> usize {
        self.body.len()
    }
}

pub type MessageRef = Arc<Message>;

/// An `expiration` property that is not a non-negative integer: RabbitMQ's 406
/// PRECONDITION_FAILED "invalid expiration".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidExpiration;

/// Parses an `expiration` property as RabbitMQ does: a non-negative integer in a string.
pub fn parse_expiration(raw: &[u8]) -> Result<u64, InvalidExpiration> {
    let s = std::str::from_utf8(raw).map_err(|_| InvalidExpiration)?;
    s.parse::<u64>().map_err(|_| InvalidExpiration)
}
