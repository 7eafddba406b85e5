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
    /// BCC routing keys: stripped from the headers consumers see, but still the message's
    /// routing keys if it is dead-lettered without a new key (RabbitMQ keeps them in
    /// `routing_keys`). Empty for almost every message, so no allocation.
    pub bcc: Vec<Bytes>,
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
            bcc: Vec::new(),
        }
    }

    pub fn size_bytes(&self) -> usize {
        self.body.len()
    }
}

pub type MessageRef = Arc<Message>;

/// Why an `expiration` property is refused: RabbitMQ's 406 PRECONDITION_FAILED
/// "invalid expiration 'X': REASON", where the reason (this type's `Display`) is the Erlang
/// term rabbit_basic:parse_expiration returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidExpiration {
    /// No digits where the number should start: `no_integer`.
    NoInteger,
    /// Characters after the number: `{leftover_string,"abc"}`.
    LeftoverString(String),
    /// A negative number: `{value_negative,-5}`.
    Negative(String),
    /// More than ten years: `{value_too_large,N}`.
    TooLarge(String),
}

impl std::fmt::Display for InvalidExpiration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidExpiration::NoInteger => write!(f, "no_integer"),
            InvalidExpiration::LeftoverString(s) => write!(f, "{{leftover_string,{s:?}}}"),
            InvalidExpiration::Negative(n) => write!(f, "{{value_negative,{n}}}"),
            InvalidExpiration::TooLarge(n) => write!(f, "{{value_too_large,{n}}}"),
        }
    }
}

/// The longest per-message TTL RabbitMQ accepts (rabbit_misc:check_expiry): ten years, which
/// also keeps `now + ttl` far from overflowing.
pub const EXPIRATION_MS_MAX: u64 = 315_360_000_000;

/// Parses an `expiration` property as RabbitMQ 3.10 does (Erlang's string:to_integer, then
/// check_expiry): an optionally signed integer with nothing after it, 0 to ten years.
pub fn parse_expiration(raw: &[u8]) -> Result<u64, InvalidExpiration> {
    let s = String::from_utf8_lossy(raw);
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(&s);
    let digits = unsigned.len()
        - unsigned
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .len();
    if digits == 0 {
        return Err(InvalidExpiration::NoInteger);
    }
    let sign_len = s.len() - unsigned.len();
    let (number, rest) = s.split_at(sign_len + digits);
    if !rest.is_empty() {
        return Err(InvalidExpiration::LeftoverString(rest.to_string()));
    }
    let magnitude = number[sign_len..].trim_start_matches('0');
    let value = if magnitude.is_empty() {
        0
    } else {
        magnitude.parse::<u64>().unwrap_or(u64::MAX)
    };
    let display = if magnitude.is_empty() { "0" } else { magnitude };
    if number.starts_with('-') && value > 0 {
        return Err(InvalidExpiration::Negative(format!("-{display}")));
    }
    if value > EXPIRATION_MS_MAX {
        return Err(InvalidExpiration::TooLarge(display.to_string()));
    }
    Ok(value)
}
