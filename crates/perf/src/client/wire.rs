//! AMQP 0-9-1 framing for the load generator: encoders that append to a caller-owned buffer and a
//! decoder that borrows frames out of the read buffer, so the hot path (publish, deliver, ack,
//! confirm) never allocates per message.
//!
//! Only the methods a measuring client needs are here. Every frame is `type u8, channel u16,
//! size u32, payload, 0xCE`; a method payload is `class u16, method u16, arguments`.

use bytes::{BufMut, BytesMut};
use std::fmt;
use warren_protocol::{content as wp_content, frame as wp_frame, method as wp_method};

pub const FRAME_METHOD: u8 = 1;
pub const FRAME_HEADER: u8 = 2;
pub const FRAME_BODY: u8 = 3;
pub const FRAME_HEARTBEAT: u8 = 8;
pub const FRAME_END: u8 = 0xCE;
/// Header (7 bytes) plus frame-end (1 byte): what a frame costs on top of its payload.
pub const FRAME_OVERHEAD_BYTES: usize = 8;
/// The largest frame we accept before the broker has told us its own limit in connection.tune.
pub const FRAME_SIZE_MAX: u32 = 4 * 1024 * 1024;

pub const CLASS_CONNECTION: u16 = 10;
pub const CLASS_CHANNEL: u16 = 20;
pub const CLASS_EXCHANGE: u16 = 40;
pub const CLASS_QUEUE: u16 = 50;
pub const CLASS_BASIC: u16 = 60;
pub const CLASS_CONFIRM: u16 = 85;

/// (class, method) ids of the methods this client sends or understands.
pub mod method {
    pub const CONNECTION_START: (u16, u16) = (10, 10);
    pub const CONNECTION_START_OK: (u16, u16) = (10, 11);
    pub const CONNECTION_TUNE: (u16, u16) = (10, 30);
    pub const CONNECTION_TUNE_OK: (u16, u16) = (10, 31);
    pub const CONNECTION_OPEN: (u16, u16) = (10, 40);
    pub const CONNECTION_OPEN_OK: (u16, u16) = (10, 41);
    pub const CONNECTION_CLOSE: (u16, u16) = (10, 50);
    pub const CONNECTION_CLOSE_OK: (u16, u16) = (10, 51);
    pub const CONNECTION_BLOCKED: (u16, u16) = (10, 60);
    pub const CONNECTION_UNBLOCKED: (u16, u16) = (10, 61);
    pub const CHANNEL_OPEN: (u16, u16) = (20, 10);
    pub const CHANNEL_OPEN_OK: (u16, u16) = (20, 11);
    pub const CHANNEL_CLOSE: (u16, u16) = (20, 40);
    pub const CHANNEL_CLOSE_OK: (u16, u16) = (20, 41);
    pub const EXCHANGE_DECLARE: (u16, u16) = (40, 10);
    pub const EXCHANGE_DECLARE_OK: (u16, u16) = (40, 11);
    pub const QUEUE_DECLARE: (u16, u16) = (50, 10);
    pub const QUEUE_DECLARE_OK: (u16, u16) = (50, 11);
    pub const QUEUE_BIND: (u16, u16) = (50, 20);
    pub const QUEUE_BIND_OK: (u16, u16) = (50, 21);
    pub const QUEUE_PURGE: (u16, u16) = (50, 30);
    pub const QUEUE_PURGE_OK: (u16, u16) = (50, 31);
    pub const QUEUE_DELETE: (u16, u16) = (50, 40);
    pub const QUEUE_DELETE_OK: (u16, u16) = (50, 41);
    pub const BASIC_QOS: (u16, u16) = (60, 10);
    pub const BASIC_QOS_OK: (u16, u16) = (60, 11);
    pub const BASIC_CONSUME: (u16, u16) = (60, 20);
    pub const BASIC_CONSUME_OK: (u16, u16) = (60, 21);
    pub const BASIC_CANCEL: (u16, u16) = (60, 30);
    pub const BASIC_CANCEL_OK: (u16, u16) = (60, 31);
    pub const BASIC_PUBLISH: (u16, u16) = (60, 40);
    pub const BASIC_RETURN: (u16, u16) = (60, 50);
    pub const BASIC_DELIVER: (u16, u16) = (60, 60);
    pub const BASIC_ACK: (u16, u16) = (60, 80);
    pub const BASIC_NACK: (u16, u16) = (60, 120);
    pub const CONFIRM_SELECT: (u16, u16) = (85, 10);
    pub const CONFIRM_SELECT_OK: (u16, u16) = (85, 11);
}

/// A protocol error found while decoding what the broker sent: cheap to build, no allocation
/// beyond the static message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AMQP framing error: {}", self.0)
    }
}

impl std::error::Error for WireError {}

/// A value in an AMQP field table, limited to the kinds PerfTest sends as queue arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Bool(bool),
    Long(i64),
    Str(String),
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Starts a frame and returns the offset of its size field, patched by [`end_frame`].
pub fn begin_frame(buf: &mut BytesMut, kind: u8, channel: u16) -> usize {
    wp_frame::begin(buf, kind, channel)
}

pub fn end_frame(buf: &mut BytesMut, start: usize) {
    wp_frame::finish(buf, start)
}

pub fn put_shortstr(buf: &mut BytesMut, s: &str) {
    let bytes = s.as_bytes();
    assert!(
        bytes.len() <= 255,
        "short string longer than 255 bytes: {s}"
    );
    buf.put_u8(bytes.len() as u8);
    buf.extend_from_slice(bytes);
}

pub fn put_longstr(buf: &mut BytesMut, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    buf.extend_from_slice(bytes);
}

pub fn put_table(buf: &mut BytesMut, table: &[(String, FieldValue)]) {
    let size_at = buf.len();
    buf.extend_from_slice(&[0, 0, 0, 0]);
    for (key, value) in table {
        put_shortstr(buf, key);
        match value {
            FieldValue::Bool(b) => {
                buf.put_u8(b't');
                buf.put_u8(u8::from(*b));
            }
            FieldValue::Long(v) => {
                buf.put_u8(b'l');
                buf.extend_from_slice(&v.to_be_bytes());
            }
            FieldValue::Str(s) => {
                buf.put_u8(b'S');
                put_longstr(buf, s.as_bytes());
            }
        }
    }
    let size = buf.len() - size_at - 4;
    buf[size_at..size_at + 4].copy_from_slice(&(size as u32).to_be_bytes());
}

fn method_frame(
    buf: &mut BytesMut,
    channel: u16,
    id: (u16, u16),
    args: impl FnOnce(&mut BytesMut),
) {
    let at = begin_frame(buf, FRAME_METHOD, channel);
    buf.extend_from_slice(&id.0.to_be_bytes());
    buf.extend_from_slice(&id.1.to_be_bytes());
    args(buf);
    end_frame(buf, at);
}

pub fn protocol_header(buf: &mut BytesMut) {
    buf.extend_from_slice(b"AMQP\x00\x00\x09\x01");
}

pub fn connection_start_ok(buf: &mut BytesMut, user: &str, password: &str, connection_name: &str) {
    method_frame(buf, 0, method::CONNECTION_START_OK, |b| {
        let capabilities = vec![
            ("publisher_confirms".to_string(), FieldValue::Bool(true)),
            ("basic.nack".to_string(), FieldValue::Bool(true)),
            ("consumer_cancel_notify".to_string(), FieldValue::Bool(true)),
            ("connection.blocked".to_string(), FieldValue::Bool(true)),
        ];
        // The capabilities entry is a nested table, which FieldValue does not model: write it
        // by hand after the flat entries.
        let props = [
            ("product".to_string(), FieldValue::Str("warren perf".into())),
            (
                "version".to_string(),
                FieldValue::Str(env!("CARGO_PKG_VERSION").into()),
            ),
            (
                "connection_name".to_string(),
                FieldValue::Str(connection_name.into()),
            ),
        ];
        let size_at = b.len();
        b.extend_from_slice(&[0, 0, 0, 0]);
        let mut inner = BytesMut::new();
        put_table(&mut inner, &props);
        b.extend_from_slice(&inner[4..]);
        put_shortstr(b, "capabilities");
        b.put_u8(b'F');
        put_table(b, &capabilities);
        let size = b.len() - size_at - 4;
        b[size_at..size_at + 4].copy_from_slice(&(size as u32).to_be_bytes());
        put_shortstr(b, "PLAIN");
        let mut response = Vec::<u8>::with_capacity(user.len() + password.len() + 2);
        response.push(0);
        response.extend_from_slice(user.as_bytes());
        response.push(0);
        response.extend_from_slice(password.as_bytes());
        put_longstr(b, &response);
        put_shortstr(b, "en_US");
    });
}

pub fn connection_tune_ok(buf: &mut BytesMut, channel_max: u16, frame_max: u32, heartbeat_s: u16) {
    method_frame(buf, 0, method::CONNECTION_TUNE_OK, |b| {
        b.extend_from_slice(&channel_max.to_be_bytes());
        b.extend_from_slice(&frame_max.to_be_bytes());
        b.extend_from_slice(&heartbeat_s.to_be_bytes());
    });
}

pub fn connection_open(buf: &mut BytesMut, vhost: &str) {
    method_frame(buf, 0, method::CONNECTION_OPEN, |b| {
        put_shortstr(b, vhost);
        put_shortstr(b, "");
        b.put_u8(0);
    });
}

pub fn connection_close(buf: &mut BytesMut, code: u16, text: &str) {
    method_frame(buf, 0, method::CONNECTION_CLOSE, |b| {
        b.extend_from_slice(&code.to_be_bytes());
        put_shortstr(b, text);
        b.extend_from_slice(&[0, 0, 0, 0]);
    });
}

pub fn connection_close_ok(buf: &mut BytesMut) {
    method_frame(buf, 0, method::CONNECTION_CLOSE_OK, |_| {});
}

pub fn channel_open(buf: &mut BytesMut, channel: u16) {
    method_frame(buf, channel, method::CHANNEL_OPEN, |b| put_shortstr(b, ""));
}

pub fn channel_close_ok(buf: &mut BytesMut, channel: u16) {
    method_frame(buf, channel, method::CHANNEL_CLOSE_OK, |_| {});
}

pub fn confirm_select(buf: &mut BytesMut, channel: u16) {
    method_frame(buf, channel, method::CONFIRM_SELECT, |b| b.put_u8(0));
}

pub fn exchange_declare(buf: &mut BytesMut, channel: u16, name: &str, kind: &str, durable: bool) {
    method_frame(buf, channel, method::EXCHANGE_DECLARE, |b| {
        b.extend_from_slice(&0u16.to_be_bytes());
        put_shortstr(b, name);
        put_shortstr(b, kind);
        // passive, durable, auto-delete, internal, no-wait
        b.put_u8(u8::from(durable) << 1);
        put_table(b, &[]);
    });
}

#[derive(Debug, Clone, Default)]
pub struct QueueDeclare<'a> {
    pub name: &'a str,
    pub passive: bool,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    pub arguments: &'a [(String, FieldValue)],
}

pub fn queue_declare(buf: &mut BytesMut, channel: u16, q: &QueueDeclare<'_>) {
    method_frame(buf, channel, method::QUEUE_DECLARE, |b| {
        b.extend_from_slice(&0u16.to_be_bytes());
        put_shortstr(b, q.name);
        let bits = u8::from(q.passive)
            | (u8::from(q.durable) << 1)
            | (u8::from(q.exclusive) << 2)
            | (u8::from(q.auto_delete) << 3);
        b.put_u8(bits);
        put_table(b, q.arguments);
    });
}

pub fn queue_bind(
    buf: &mut BytesMut,
    channel: u16,
    queue: &str,
    exchange: &str,
    routing_key: &str,
) {
    method_frame(buf, channel, method::QUEUE_BIND, |b| {
        b.extend_from_slice(&0u16.to_be_bytes());
        put_shortstr(b, queue);
        put_shortstr(b, exchange);
        put_shortstr(b, routing_key);
        b.put_u8(0);
        put_table(b, &[]);
    });
}

pub fn queue_purge(buf: &mut BytesMut, channel: u16, queue: &str) {
    method_frame(buf, channel, method::QUEUE_PURGE, |b| {
        b.extend_from_slice(&0u16.to_be_bytes());
        put_shortstr(b, queue);
        b.put_u8(0);
    });
}

pub fn queue_delete(buf: &mut BytesMut, channel: u16, queue: &str) {
    method_frame(buf, channel, method::QUEUE_DELETE, |b| {
        b.extend_from_slice(&0u16.to_be_bytes());
        put_shortstr(b, queue);
        b.put_u8(0);
    });
}

pub fn basic_qos(buf: &mut BytesMut, channel: u16, prefetch_count: u16, global: bool) {
    method_frame(buf, channel, method::BASIC_QOS, |b| {
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&prefetch_count.to_be_bytes());
        b.put_u8(u8::from(global));
    });
}

pub fn basic_consume(buf: &mut BytesMut, channel: u16, queue: &str, tag: &str, no_ack: bool) {
    method_frame(buf, channel, method::BASIC_CONSUME, |b| {
        b.extend_from_slice(&0u16.to_be_bytes());
        put_shortstr(b, queue);
        put_shortstr(b, tag);
        // no-local, no-ack, exclusive, no-wait
        b.put_u8(u8::from(no_ack) << 1);
        put_table(b, &[]);
    });
}

pub fn basic_cancel(buf: &mut BytesMut, channel: u16, tag: &str) {
    method_frame(buf, channel, method::BASIC_CANCEL, |b| {
        put_shortstr(b, tag);
        b.put_u8(0);
    });
}

#[allow(clippy::too_many_arguments)]
/// Appends basic.publish, its content header and its body frames: the hot path of a producer.
/// The body is split into frames of at most `frame_max` bytes as the broker requires.
pub fn basic_publish(
    buf: &mut BytesMut,
    channel: u16,
    exchange: &str,
    routing_key: &str,
    mandatory: bool,
    persistent: bool,
    body: &[u8],
    frame_max: u32,
) {
    /// Property flags with only delivery-mode set, then delivery-mode 2 (persistent).
    const PERSISTENT_PROPERTIES: [u8; 3] = [0x10, 0x00, 2];
    wp_method::encode_publish(
        buf,
        channel,
        exchange.as_bytes(),
        routing_key.as_bytes(),
        mandatory,
    );
    let properties: &[u8] = if persistent {
        &PERSISTENT_PROPERTIES
    } else {
        &[]
    };
    wp_content::encode_header(buf, channel, CLASS_BASIC, body.len() as u64, properties);
    wp_frame::encode_body(buf, channel, body, frame_max);
}

pub fn basic_ack(buf: &mut BytesMut, channel: u16, delivery_tag: u64, multiple: bool) {
    wp_method::encode_ack(buf, channel, delivery_tag, multiple);
}

pub fn heartbeat(buf: &mut BytesMut) {
    wp_frame::encode_heartbeat(buf);
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// A frame borrowed from the read buffer.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub kind: u8,
    pub channel: u16,
    pub payload: &'a [u8],
}

/// Parses one frame at the start of `buf`: `Ok(None)` when more bytes are needed, otherwise
/// the frame and how many bytes it used.
pub fn parse_frame(buf: &[u8], frame_max: u32) -> Result<Option<(Frame<'_>, usize)>, WireError> {
    if buf.len() < 7 {
        return Ok(None);
    }
    let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]);
    if size > frame_max {
        return Err(WireError("frame larger than the negotiated frame_max"));
    }
    let total = 7 + size as usize + 1;
    if buf.len() < total {
        return Ok(None);
    }
    if buf[total - 1] != FRAME_END {
        return Err(WireError("frame does not end with 0xCE"));
    }
    let frame = Frame {
        kind: buf[0],
        channel: u16::from_be_bytes([buf[1], buf[2]]),
        payload: &buf[7..total - 1],
    };
    Ok(Some((frame, total)))
}

/// A cursor over a method's arguments.
pub struct Args<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Args<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Args { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() - self.at < n {
            return Err(WireError("method arguments truncated"));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, WireError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    pub fn shortstr(&mut self) -> Result<&'a str, WireError> {
        let n = self.u8()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| WireError("short string is not UTF-8"))
    }

    pub fn longstr(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Field tables from the broker (server properties) carry nothing this client acts on.
    pub fn skip_table(&mut self) -> Result<(), WireError> {
        let n = self.u32()? as usize;
        self.take(n).map(|_| ())
    }
}

/// Splits a method frame's payload into its (class, method) id and its arguments.
pub fn method_of(payload: &[u8]) -> Result<((u16, u16), Args<'_>), WireError> {
    if payload.len() < 4 {
        return Err(WireError(
            "method frame shorter than its class and method ids",
        ));
    }
    let class = u16::from_be_bytes([payload[0], payload[1]]);
    let m = u16::from_be_bytes([payload[2], payload[3]]);
    Ok(((class, m), Args::new(&payload[4..])))
}

/// The body size announced by a content header frame.
pub fn content_body_size(payload: &[u8]) -> Result<u64, WireError> {
    if payload.len() < 14 {
        return Err(WireError("content header shorter than 14 bytes"));
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(&payload[4..12]);
    Ok(u64::from_be_bytes(a))
}

/// A connection.close or channel.close from the broker, kept to explain why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReason {
    pub code: u16,
    pub text: String,
    pub class_method: (u16, u16),
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (after method {}.{})",
            self.code, self.text, self.class_method.0, self.class_method.1
        )
    }
}

pub fn parse_close(mut args: Args<'_>) -> Result<CloseReason, WireError> {
    let code = args.u16()?;
    let text = args.shortstr()?.to_string();
    let class = args.u16()?;
    let m = args.u16()?;
    Ok(CloseReason {
        code,
        text,
        class_method: (class, m),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_round_trips_through_the_frame_parser() {
        let mut buf = BytesMut::new();
        let body = vec![7u8; 300];
        basic_publish(&mut buf, 1, "direct", "rk", true, true, &body, 136);
        let mut at = 0;
        let mut kinds = Vec::new();
        let mut body_seen = 0;
        while let Some((frame, used)) = parse_frame(&buf[at..], 4096).unwrap() {
            kinds.put_u8(frame.kind);
            if frame.kind == FRAME_HEADER {
                assert_eq!(content_body_size(frame.payload).unwrap(), 300);
                assert_eq!(&frame.payload[12..14], &0x1000u16.to_be_bytes());
            }
            if frame.kind == FRAME_BODY {
                assert!(frame.payload.len() <= 128);
                body_seen += frame.payload.len();
            }
            at += used;
        }
        assert_eq!(at, buf.len());
        assert_eq!(body_seen, 300);
        assert_eq!(kinds, vec![1, 2, 3, 3, 3]);
    }

    #[test]
    fn truncated_frame_asks_for_more_and_bad_end_is_refused() {
        let mut buf = BytesMut::new();
        basic_ack(&mut buf, 1, 42, true);
        assert!(parse_frame(&buf[..buf.len() - 1], 4096).unwrap().is_none());
        let last = buf.len() - 1;
        buf[last] = 0;
        assert!(parse_frame(&buf, 4096).is_err());
    }

    #[test]
    fn table_encodes_longs_and_strings() {
        let mut buf = BytesMut::new();
        put_table(
            &mut buf,
            &[
                ("x-max-length".into(), FieldValue::Long(10)),
                ("x-queue-type".into(), FieldValue::Str("quorum".into())),
            ],
        );
        let mut args = Args::new(&buf);
        let size = args.u32().unwrap() as usize;
        assert_eq!(size, buf.len() - 4);
        assert_eq!(args.shortstr().unwrap(), "x-max-length");
        assert_eq!(args.u8().unwrap(), b'l');
        assert_eq!(args.u64().unwrap(), 10);
        assert_eq!(args.shortstr().unwrap(), "x-queue-type");
        assert_eq!(args.u8().unwrap(), b'S');
        assert_eq!(args.longstr().unwrap(), b"quorum");
    }
}
