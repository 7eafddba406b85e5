//! AMQP 0-9-1 framing for the load generator.
//!
//! Encoding goes through the project's codec, `warren-protocol`: its hand-coded data-plane
//! encoders for publish, content header, body and ack, its `amq-protocol` path for every
//! control-plane method. Decoding stays here on purpose: a consumer needs only the delivery tag
//! and the first 12 body bytes of each message, so frames are parsed in place as slices of the
//! read buffer, with no reference-counted buffer per frame.
//!
//! Every frame is `type u8, channel u16, size u32, payload, 0xCE`; a method payload is
//! `class u16, method u16, arguments`.

use bytes::BytesMut;
use std::fmt;
use warren_protocol::amqp::{basic, channel, confirm, connection, exchange, queue, AMQPClass};
use warren_protocol::{content as wp_content, frame as wp_frame, method as wp_method};
use warren_protocol::{AMQPValue, FieldTable};

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
    pub const EXCHANGE_DELETE: (u16, u16) = (40, 20);
    pub const EXCHANGE_DELETE_OK: (u16, u16) = (40, 21);
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

/// Converts queue arguments to the codec's field table; integers go as signed 64-bit ('l'),
/// as the Java client sends a `Long`.
pub fn field_table(table: &[(String, FieldValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in table {
        let value = match v {
            FieldValue::Bool(b) => AMQPValue::Boolean(*b),
            FieldValue::Long(n) => AMQPValue::LongLongInt(*n),
            FieldValue::Str(s) => AMQPValue::LongString(s.as_str().into()),
        };
        t.insert(k.as_str().into(), value);
    }
    t
}

/// Control-plane methods go through the protocol crate's `amq-protocol` path: one frame each.
fn control(buf: &mut BytesMut, channel: u16, class: AMQPClass) {
    wp_method::Method::Other(class).encode(channel, buf);
}

pub fn protocol_header(buf: &mut BytesMut) {
    buf.extend_from_slice(warren_protocol::PROTOCOL_HEADER);
}

pub fn connection_start_ok(buf: &mut BytesMut, user: &str, password: &str, connection_name: &str) {
    let mut capabilities = FieldTable::default();
    for cap in [
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
    ] {
        capabilities.insert(cap.into(), AMQPValue::Boolean(true));
    }
    let mut props = FieldTable::default();
    props.insert(
        "product".into(),
        AMQPValue::LongString("warren perf".into()),
    );
    props.insert(
        "version".into(),
        AMQPValue::LongString(env!("CARGO_PKG_VERSION").into()),
    );
    props.insert(
        "connection_name".into(),
        AMQPValue::LongString(connection_name.into()),
    );
    props.insert("capabilities".into(), AMQPValue::FieldTable(capabilities));
    let mut response = Vec::with_capacity(user.len() + password.len() + 2);
    response.push(0);
    response.extend_from_slice(user.as_bytes());
    response.push(0);
    response.extend_from_slice(password.as_bytes());
    control(
        buf,
        0,
        AMQPClass::Connection(connection::AMQPMethod::StartOk(connection::StartOk {
            client_properties: props,
            mechanism: "PLAIN".into(),
            response: response.into(),
            locale: "en_US".into(),
        })),
    );
}

pub fn connection_tune_ok(buf: &mut BytesMut, channel_max: u16, frame_max: u32, heartbeat_s: u16) {
    control(
        buf,
        0,
        AMQPClass::Connection(connection::AMQPMethod::TuneOk(connection::TuneOk {
            channel_max,
            frame_max,
            heartbeat: heartbeat_s,
        })),
    );
}

pub fn connection_open(buf: &mut BytesMut, vhost: &str) {
    control(
        buf,
        0,
        AMQPClass::Connection(connection::AMQPMethod::Open(connection::Open {
            virtual_host: vhost.into(),
        })),
    );
}

pub fn connection_close(buf: &mut BytesMut, code: u16, text: &str) {
    control(
        buf,
        0,
        AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: code,
            reply_text: text.into(),
            class_id: 0,
            method_id: 0,
        })),
    );
}

pub fn connection_close_ok(buf: &mut BytesMut) {
    control(
        buf,
        0,
        AMQPClass::Connection(connection::AMQPMethod::CloseOk(connection::CloseOk {})),
    );
}

pub fn channel_open(buf: &mut BytesMut, channel: u16) {
    control(
        buf,
        channel,
        AMQPClass::Channel(channel::AMQPMethod::Open(channel::Open {})),
    );
}

pub fn channel_close_ok(buf: &mut BytesMut, channel: u16) {
    control(
        buf,
        channel,
        AMQPClass::Channel(channel::AMQPMethod::CloseOk(channel::CloseOk {})),
    );
}

pub fn confirm_select(buf: &mut BytesMut, channel: u16) {
    control(
        buf,
        channel,
        AMQPClass::Confirm(confirm::AMQPMethod::Select(confirm::Select {
            nowait: false,
        })),
    );
}

pub fn exchange_declare(buf: &mut BytesMut, channel: u16, name: &str, kind: &str, durable: bool) {
    control(
        buf,
        channel,
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
            exchange: name.into(),
            kind: kind.into(),
            passive: false,
            durable,
            auto_delete: false,
            internal: false,
            nowait: false,
            arguments: FieldTable::default(),
        })),
    );
}

/// A passive exchange.declare: declare-ok if it exists, else the broker closes the channel.
pub fn exchange_declare_passive(buf: &mut BytesMut, channel: u16, name: &str) {
    control(
        buf,
        channel,
        AMQPClass::Exchange(exchange::AMQPMethod::Declare(exchange::Declare {
            exchange: name.into(),
            kind: "".into(),
            passive: true,
            durable: false,
            auto_delete: false,
            internal: false,
            nowait: false,
            arguments: FieldTable::default(),
        })),
    );
}

pub fn exchange_delete(buf: &mut BytesMut, channel: u16, name: &str) {
    control(
        buf,
        channel,
        AMQPClass::Exchange(exchange::AMQPMethod::Delete(exchange::Delete {
            exchange: name.into(),
            if_unused: false,
            nowait: false,
        })),
    );
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
    control(
        buf,
        channel,
        AMQPClass::Queue(queue::AMQPMethod::Declare(queue::Declare {
            queue: q.name.into(),
            passive: q.passive,
            durable: q.durable,
            exclusive: q.exclusive,
            auto_delete: q.auto_delete,
            nowait: false,
            arguments: field_table(q.arguments),
        })),
    );
}

pub fn queue_bind(
    buf: &mut BytesMut,
    channel: u16,
    queue_name: &str,
    exchange_name: &str,
    routing_key: &str,
) {
    control(
        buf,
        channel,
        AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
            queue: queue_name.into(),
            exchange: exchange_name.into(),
            routing_key: routing_key.into(),
            nowait: false,
            arguments: FieldTable::default(),
        })),
    );
}

pub fn queue_purge(buf: &mut BytesMut, channel: u16, queue_name: &str) {
    control(
        buf,
        channel,
        AMQPClass::Queue(queue::AMQPMethod::Purge(queue::Purge {
            queue: queue_name.into(),
            nowait: false,
        })),
    );
}

pub fn queue_delete(buf: &mut BytesMut, channel: u16, queue_name: &str) {
    control(
        buf,
        channel,
        AMQPClass::Queue(queue::AMQPMethod::Delete(queue::Delete {
            queue: queue_name.into(),
            if_unused: false,
            if_empty: false,
            nowait: false,
        })),
    );
}

pub fn basic_qos(buf: &mut BytesMut, channel: u16, prefetch_count: u16, global: bool) {
    control(
        buf,
        channel,
        AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
            prefetch_count,
            global,
        })),
    );
}

pub fn basic_consume(
    buf: &mut BytesMut,
    channel: u16,
    queue_name: &str,
    tag: &str,
    no_ack: bool,
    arguments: &[(String, FieldValue)],
) {
    control(
        buf,
        channel,
        AMQPClass::Basic(basic::AMQPMethod::Consume(basic::Consume {
            queue: queue_name.into(),
            consumer_tag: tag.into(),
            no_local: false,
            no_ack,
            exclusive: false,
            nowait: false,
            arguments: field_table(arguments),
        })),
    );
}

pub fn basic_cancel(buf: &mut BytesMut, channel: u16, tag: &str) {
    control(
        buf,
        channel,
        AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
            consumer_tag: tag.into(),
            nowait: false,
        })),
    );
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
            kinds.push(frame.kind);
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
    fn queue_declare_arguments_reach_the_broker_as_typed_values() {
        let mut buf = BytesMut::new();
        let args = [
            ("x-max-length".to_string(), FieldValue::Long(10)),
            ("x-queue-type".to_string(), FieldValue::Str("quorum".into())),
        ];
        let q = QueueDeclare {
            name: "q",
            durable: true,
            arguments: &args,
            ..Default::default()
        };
        queue_declare(&mut buf, 3, &q);
        let f = wp_frame::decode(&mut buf, 0).unwrap().unwrap();
        assert_eq!(f.channel, 3);
        let wp_method::Method::Other(AMQPClass::Queue(queue::AMQPMethod::Declare(d))) =
            wp_method::Method::decode(f.payload).unwrap()
        else {
            panic!("not a queue.declare");
        };
        assert!(d.durable && !d.exclusive && !d.auto_delete);
        let t = d.arguments.inner();
        assert_eq!(t.get("x-max-length"), Some(&AMQPValue::LongLongInt(10)));
        assert_eq!(
            t.get("x-queue-type"),
            Some(&AMQPValue::LongString("quorum".into()))
        );
    }
}
