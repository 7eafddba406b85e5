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

/// Why an `expiration` property is refused, in RabbitMQ's words (Erlang's
/// `string:to_integer` reasons): the text after `invalid expiration '...': `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidExpiration(pub String);

/// Parses an `expiration` property as RabbitMQ does: a non-negative integer in a string.
pub fn parse_expiration(raw: &[u8]) -> Result<u64, InvalidExpiration> {
    let s = String::from_utf8_lossy(raw);
    let sign_len = usize::from(s.starts_with('-') || s.starts_with('+'));
    let digits = s[sign_len..].bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(InvalidExpiration("no_integer".into()));
    }
    let (number, rest) = s.split_at(sign_len + digits);
    if !rest.is_empty() {
        return Err(InvalidExpiration(format!("{{leftover_string,\"{rest}\"}}")));
    }
    let n: i128 = number
        .parse()
        .map_err(|_| InvalidExpiration("no_integer".into()))?;
    if n < 0 {
        return Err(InvalidExpiration(format!("{{value_negative,{n}}}")));
    }
    u64::try_from(n).map_err(|_| InvalidExpiration(format!("{{value_too_large,{n}}}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiration_is_parsed_and_refused_as_rabbitmq_does() {
        assert_eq!(parse_expiration(b"1500"), Ok(1500));
        assert_eq!(
            parse_expiration(b"abc"),
            Err(InvalidExpiration("no_integer".into()))
        );
        assert_eq!(
            parse_expiration(b""),
            Err(InvalidExpiration("no_integer".into()))
        );
        assert_eq!(
            parse_expiration(b"-1"),
            Err(InvalidExpiration("{value_negative,-1}".into()))
        );
        assert_eq!(
            parse_expiration(b"1.5"),
            Err(InvalidExpiration("{leftover_string,\".5\"}".into()))
        );
    }
}
