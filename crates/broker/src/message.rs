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

/// Format version of a message stored in a queue's log. Version 1 (fixed 4-byte properties
/// length and an 8-byte expiry on every message) cost 10 more bytes per message: 1 % of the
/// disk writes of 1 KB messages, whose whole budget beyond the body is 10 %.
const STORED_VERSION: u8 = 2;
/// Flag: an expiry follows the properties.
const STORED_HAS_EXPIRY: u8 = 1;
/// Flag: BCC routing keys follow the expiry, so a message read back from disk and
/// dead-lettered without a new routing key still goes to them. A flag rather than a new
/// version: messages without BCC (almost all) are stored as before, and older logs read as
/// they were.
const STORED_HAS_BCC: u8 = 2;
/// Flag: the message died in its (single-node, at-least-once) quorum queue and waits there for
/// its dead-letter targets; the reason (u8, [`dead_letter_reason_code`]) and the delivery count
/// (LEB128) follow the BCC keys. Recovery puts such an entry back among the queue's waiting
/// dead letters, never among its ready messages.
const STORED_DEAD_LETTER: u8 = 4;

/// What a dead letter waiting in its queue's log is stored with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredDeath {
    pub reason: &'static str,
    pub delivery_count: u32,
}

/// The reasons RabbitMQ writes in x-death, as one byte in a stored dead letter.
const DEAD_LETTER_REASONS: [&str; 4] = ["rejected", "expired", "maxlen", "delivery_limit"];

fn dead_letter_reason_code(reason: &str) -> u8 {
    DEAD_LETTER_REASONS
        .iter()
        .position(|r| *r == reason)
        .expect("a reason x-death knows") as u8
}

/// Encodes a message for a durable queue's log: what recovery needs to rebuild it. `expires_at`
/// is wall-clock milliseconds since the Unix epoch (0: never), so a TTL survives a restart.
///
/// Layout: version u8, flags u8, exchange (u8 len + bytes), routing key (u8 len + bytes),
/// properties (LEB128 len + bytes), expires_at u64 big endian if flagged, BCC keys if flagged
/// (LEB128 count, then each as LEB128 len + bytes), body (the rest).
pub fn encode_stored(m: &Message, expires_at_unix_ms: u64) -> Bytes {
    encode_stored_with(m, expires_at_unix_ms, None)
}

/// A dead letter waiting in its queue's log for its targets: the message as it died (no
/// expiry: it is past that), flagged with why.
pub fn encode_stored_dead_letter(m: &Message, death: StoredDeath) -> Bytes {
    encode_stored_with(m, 0, Some(death))
}

fn encode_stored_with(m: &Message, expires_at_unix_ms: u64, death: Option<StoredDeath>) -> Bytes {
    let mut out = Vec::with_capacity(stored_len(m));
    encode_stored_into(&mut out, m, expires_at_unix_ms, death);
    Bytes::from(out)
}

/// At least the bytes [`encode_stored`] writes for `m`, for a buffer that takes it whole.
pub fn stored_len(m: &Message) -> usize {
    let bcc_bytes: usize = m.bcc.iter().map(|k| 5 + k.len()).sum();
    2 + 2
        + m.exchange.len()
        + m.routing_key.len()
        + 5
        + m.properties.len()
        + 8
        + bcc_bytes
        + 6
        + m.body.len()
}

/// [`encode_stored`] appended to `out`: a quorum queue's log entry carries the stored message
/// after a header of its own, and writing it in place copies the body once, not twice.
pub fn encode_stored_into(
    out: &mut Vec<u8>,
    m: &Message,
    expires_at_unix_ms: u64,
    death: Option<StoredDeath>,
) {
    out.push(STORED_VERSION);
    let mut flags = 0;
    if expires_at_unix_ms != 0 {
        flags |= STORED_HAS_EXPIRY;
    }
    if !m.bcc.is_empty() {
        flags |= STORED_HAS_BCC;
    }
    if death.is_some() {
        flags |= STORED_DEAD_LETTER;
    }
    out.push(flags);
    out.push(m.exchange.len() as u8);
    out.extend_from_slice(&m.exchange);
    out.push(m.routing_key.len() as u8);
    out.extend_from_slice(&m.routing_key);
    push_leb128(out, m.properties.len());
    out.extend_from_slice(&m.properties);
    if expires_at_unix_ms != 0 {
        out.extend_from_slice(&expires_at_unix_ms.to_be_bytes());
    }
    if !m.bcc.is_empty() {
        push_leb128(out, m.bcc.len());
        for key in &m.bcc {
            push_leb128(out, key.len());
            out.extend_from_slice(key);
        }
    }
    if let Some(d) = death {
        out.push(dead_letter_reason_code(d.reason));
        push_leb128(out, d.delivery_count as usize);
    }
    out.extend_from_slice(&m.body);
}

fn push_leb128(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The inverse of [`encode_stored`]; `None` when the bytes are not a stored message (the
/// store verified their checksum, so this means a format this version does not know).
pub fn decode_stored(raw: &Bytes) -> Option<(Message, u64)> {
    decode_stored_with_death(raw).map(|(m, expires_at, _)| (m, expires_at))
}

/// [`decode_stored`], with the death of a dead letter waiting in its queue's log.
pub fn decode_stored_with_death(raw: &Bytes) -> Option<(Message, u64, Option<StoredDeath>)> {
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Option<Bytes> {
        raw.get(*at..*at + n)?;
        let b = raw.slice(*at..*at + n);
        *at += n;
        Some(b)
    };
    let byte = |at: &mut usize| -> Option<u8> {
        let b = *raw.get(*at)?;
        *at += 1;
        Some(b)
    };
    if byte(&mut at)? != STORED_VERSION {
        return None;
    }
    let flags = byte(&mut at)?;
    let n = byte(&mut at)? as usize;
    let exchange = take(&mut at, n)?;
    let n = byte(&mut at)? as usize;
    let routing_key = take(&mut at, n)?;
    let leb128 = |at: &mut usize| -> Option<usize> {
        let mut n = 0usize;
        for shift in (0..35).step_by(7) {
            let b = byte(at)?;
            n |= ((b & 0x7f) as usize) << shift;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    };
    let n = leb128(&mut at)?;
    let properties = take(&mut at, n)?;
    let expires_at = if flags & STORED_HAS_EXPIRY != 0 {
        u64::from_be_bytes(take(&mut at, 8)?[..].try_into().ok()?)
    } else {
        0
    };
    let mut bcc = Vec::new();
    if flags & STORED_HAS_BCC != 0 {
        let count = leb128(&mut at)?;
        // Each key takes at least its length byte: a count beyond that is not ours.
        if count > raw.len() - at {
            return None;
        }
        for _ in 0..count {
            let n = leb128(&mut at)?;
            bcc.push(take(&mut at, n)?);
        }
    }
    let death = if flags & STORED_DEAD_LETTER != 0 {
        let reason = *DEAD_LETTER_REASONS.get(byte(&mut at)? as usize)?;
        let delivery_count = u32::try_from(leb128(&mut at)?).ok()?;
        Some(StoredDeath {
            reason,
            delivery_count,
        })
    } else {
        None
    };
    let body = raw.slice(at..);
    let props = Properties::decode(&properties).ok()?;
    let mut message = Message::new(exchange, routing_key, properties, &props, body);
    message.bcc = bcc;
    Some((message, expires_at, death))
}

#[cfg(test)]
mod stored_tests {
    use super::*;

    #[test]
    fn a_stored_message_decodes_to_the_same_message() {
        let props = Properties {
            delivery_mode: Some(2),
            priority: Some(3),
            ..Default::default()
        }
        .encode();
        let p = Properties::decode(&props).unwrap();
        let m = Message::new(
            Bytes::from_static(b"ex"),
            Bytes::from_static(b"rk"),
            props.clone(),
            &p,
            Bytes::from_static(b"body"),
        );
        let raw = encode_stored(&m, 1234);
        let (back, expires) = decode_stored(&raw).unwrap();
        assert_eq!(expires, 1234);
        assert_eq!(
            (&back.exchange[..], &back.routing_key[..], &back.body[..]),
            (&b"ex"[..], &b"rk"[..], &b"body"[..])
        );
        assert_eq!(back.properties, props);
        assert!(back.persistent);
        assert_eq!(back.priority, 3);
        assert!(decode_stored(&raw.slice(..5)).is_none());
    }

    #[test]
    fn bcc_keys_are_stored_with_the_message_and_read_back() {
        let props = Properties {
            delivery_mode: Some(2),
            ..Default::default()
        }
        .encode();
        let p = Properties::decode(&props).unwrap();
        let mut m = Message::new(
            Bytes::new(),
            Bytes::from_static(b"rk"),
            props,
            &p,
            Bytes::from_static(b"body"),
        );
        m.bcc = vec![Bytes::from_static(b"b1"), Bytes::from("k".repeat(300))];
        for expires in [0, 99] {
            let raw = encode_stored(&m, expires);
            let (back, e) = decode_stored(&raw).unwrap();
            assert_eq!(
                (e, &back.bcc, &back.body[..]),
                (expires, &m.bcc, &b"body"[..])
            );
        }
        let raw = encode_stored(&m, 0);
        let body_at = raw.len() - 4;
        for cut in 0..body_at {
            assert!(decode_stored(&raw.slice(..cut)).is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn a_waiting_dead_letter_reads_back_with_its_death_and_others_without() {
        let props = Properties::default().encode();
        let p = Properties::decode(&props).unwrap();
        let mut m = Message::new(
            Bytes::new(),
            Bytes::from_static(b"rk"),
            props,
            &p,
            Bytes::from_static(b"body"),
        );
        m.bcc = vec![Bytes::from_static(b"b1")];
        for reason in DEAD_LETTER_REASONS {
            let death = StoredDeath {
                reason,
                delivery_count: 300,
            };
            let raw = encode_stored_dead_letter(&m, death);
            let (back, expires, d) = decode_stored_with_death(&raw).unwrap();
            assert_eq!((expires, d), (0, Some(death)));
            assert_eq!((&back.bcc, &back.body[..]), (&m.bcc, &b"body"[..]));
            // The plain decoder reads it as the message it was (paging code).
            assert_eq!(decode_stored(&raw).unwrap().0.body, m.body);
        }
        let plain = encode_stored(&m, 0);
        assert_eq!(decode_stored_with_death(&plain).unwrap().2, None);
    }

    #[test]
    fn without_expiry_the_envelope_is_small_and_long_properties_round_trip() {
        let headers = Properties {
            delivery_mode: Some(2),
            content_type: Some("x".repeat(200).into()),
            ..Default::default()
        }
        .encode();
        assert!(headers.len() > 128, "needs a two-byte length");
        let p = Properties::decode(&headers).unwrap();
        let m = Message::new(
            Bytes::new(),
            Bytes::from_static(b"q"),
            headers.clone(),
            &p,
            Bytes::from(vec![7u8; 1024]),
        );
        let raw = encode_stored(&m, 0);
        assert_eq!(raw.len(), 1024 + headers.len() + 2 + 1 + 2 + 2);
        let (back, expires) = decode_stored(&raw).unwrap();
        assert_eq!(
            (expires, &back.properties, back.body.len()),
            (0, &headers, 1024)
        );
        for cut in 0..raw.len() - 1024 {
            assert!(decode_stored(&raw.slice(..cut)).is_none(), "cut at {cut}");
        }
    }
}
