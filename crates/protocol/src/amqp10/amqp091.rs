//! How RabbitMQ 3.10 maps between an AMQP 0-9-1 message and the AMQP 1.0 message a stream keeps
//! (`rabbit_msg_record` and the stream queue), so a 0-9-1 publisher's messages read the same from
//! a stream client as from RabbitMQ, and the other way round. The section order and contents
//! below are what a RabbitMQ 3.10.8 node stores (checked against one by `tests/amqp10_rabbitmq.rs`).
//!
//! 0-9-1 to 1.0 ([`from_amqp091`]):
//! - the routing key and exchange become message annotations `x-routing-key` and `x-exchange`,
//!   then priority, delivery mode and expiration `x-basic-priority`, `x-basic-delivery-mode`
//!   (ubyte) and `x-basic-expiration` (string);
//! - message id, user id, reply-to, correlation id, content type and encoding and the timestamp
//!   (seconds, times 1000) become properties;
//! - headers become application properties (tables and arrays are left out; a long string is a
//!   string), after `x-basic-type` (unless the type is `amqp-1.0`) and `x-basic-app-id`;
//! - headers `x-amqp-1.0-message-annotations`, `-properties` and `-app-properties` carry those
//!   sections already encoded, and replace them whole;
//! - the body is one data section, unless the type is `amqp-1.0`: then it is the sections.
//!
//! 1.0 to 0-9-1 ([`to_amqp091`]) undoes that; a body other than one data section is delivered
//! as its encoded sections with type `amqp-1.0`; uuid, ulong and binary ids become strings with
//! an `x-message-id-type` (`x-correlation-id-type`) header, and ids too long for a short string
//! move to an `x-message-id` (`x-correlation-id`) header. The header section is not carried.
//!
//! Where 3.10 fails on a message warren delivers it as the mapping intends: 3.10 closes a 0-9-1
//! consumer's connection with INTERNAL_ERROR for an amqp-value or amqp-sequence body and for a
//! message without a body section (warren: the sections typed `amqp-1.0`; an empty body), and
//! delivers only the last of several data sections (warren: all of them, as sections typed
//! `amqp-1.0`). Where 3.10 fails on a value (a decimal header, an application property of a type 0-9-1
//! headers lack: symbol, char, ulong, uuid, decimal, list, map, array, described) or would write
//! a short string over 255 bytes, warren leaves that one value out instead, so a message never
//! stops a stream; long strings that are not UTF-8 become binary.

use super::message::{Body, Message, Properties};
use super::types::Value;
use crate::content;
use crate::wire::Truncated;
use amq_protocol_types::{AMQPValue, ByteArray, FieldTable, LongString, ShortString};
use bytes::{Bytes, BytesMut};

pub const AMQP10_TYPE: &str = "amqp-1.0";
pub const HEADER_PROPERTIES: &str = "x-amqp-1.0-properties";
pub const HEADER_APP_PROPERTIES: &str = "x-amqp-1.0-app-properties";
pub const HEADER_MESSAGE_ANNOTATIONS: &str = "x-amqp-1.0-message-annotations";
pub const ANNOTATION_ROUTING_KEY: &str = "x-routing-key";
pub const ANNOTATION_EXCHANGE: &str = "x-exchange";
pub const ANNOTATION_PRIORITY: &str = "x-basic-priority";
pub const ANNOTATION_DELIVERY_MODE: &str = "x-basic-delivery-mode";
pub const ANNOTATION_EXPIRATION: &str = "x-basic-expiration";
pub const APP_PROPERTY_TYPE: &str = "x-basic-type";
pub const APP_PROPERTY_APP_ID: &str = "x-basic-app-id";
/// The longest 0-9-1 short string: ids longer than this travel in a header instead.
const SHORT_STRING_BYTES_MAX: usize = 255;

fn text(b: &Bytes) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_owned()),
        Err(_) => Value::Binary(b.clone()),
    }
}

fn described(code: u64, v: Value) -> Value {
    Value::Described(Box::new(Value::Ulong(code)), Box::new(v))
}

/// An encoded section carried in a header (long string or byte array), used as it is.
fn raw_section(headers: Option<&FieldTable>, key: &str) -> Option<Bytes> {
    match headers?.inner().get(key)? {
        AMQPValue::LongString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        AMQPValue::ByteArray(b) => Some(Bytes::copy_from_slice(b.as_slice())),
        _ => None,
    }
}

/// A header value as an application property value; `None` for what 3.10 leaves out or fails on.
fn header_value(v: &AMQPValue) -> Option<Value> {
    Some(match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(x) => Value::Byte(*x),
        AMQPValue::ShortShortUInt(x) => Value::Ubyte(*x),
        AMQPValue::ShortInt(x) => Value::Short(*x),
        AMQPValue::ShortUInt(x) => Value::Ushort(*x),
        AMQPValue::LongInt(x) => Value::Int(*x),
        AMQPValue::LongUInt(x) => Value::Uint(*x),
        AMQPValue::LongLongInt(x) => Value::Long(*x),
        AMQPValue::Float(x) => Value::Float(*x),
        AMQPValue::Double(x) => Value::Double(*x),
        AMQPValue::LongString(s) => text(&Bytes::copy_from_slice(s.as_bytes())),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_owned()),
        AMQPValue::Timestamp(t) => Value::Timestamp((*t as i64).wrapping_mul(1000)),
        AMQPValue::ByteArray(b) => Value::Binary(Bytes::copy_from_slice(b.as_slice())),
        AMQPValue::Void => Value::Null,
        AMQPValue::DecimalValue(_) | AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_) => {
            return None
        }
    })
}

/// The AMQP 1.0 message RabbitMQ 3.10 stores for a 0-9-1 publish to `exchange` with
/// `routing_key`; `Err` when the headers table is malformed.
pub fn from_amqp091(
    exchange: &[u8],
    routing_key: &[u8],
    p: &content::Properties,
    body: &Bytes,
) -> Result<Bytes, Truncated> {
    let headers = p.headers_table()?;
    let headers = headers.as_ref();
    let mut out = BytesMut::new();

    // The stream queue puts routing key and exchange in front of whatever annotations the
    // message has, given ones included.
    let mut annotations = vec![
        (
            Value::Symbol(ANNOTATION_ROUTING_KEY.into()),
            text(&Bytes::copy_from_slice(routing_key)),
        ),
        (
            Value::Symbol(ANNOTATION_EXCHANGE.into()),
            text(&Bytes::copy_from_slice(exchange)),
        ),
    ];
    match raw_section(headers, HEADER_MESSAGE_ANNOTATIONS) {
        Some(raw) => match Value::decode_bytes(&raw) {
            Ok(Value::Described(d, v)) if *d == Value::Ulong(0x72) => match *v {
                Value::Map(given) => {
                    annotations.extend(given);
                    described(0x72, Value::Map(annotations)).encode(&mut out);
                }
                _ => out.extend_from_slice(&raw),
            },
            // Not annotations after all: stored as given, as RabbitMQ stores such a header.
            _ => out.extend_from_slice(&raw),
        },
        None => {
            if let Some(x) = p.priority {
                annotations.push((Value::Symbol(ANNOTATION_PRIORITY.into()), Value::Ubyte(x)));
            }
            if let Some(x) = p.delivery_mode {
                annotations.push((
                    Value::Symbol(ANNOTATION_DELIVERY_MODE.into()),
                    Value::Ubyte(x),
                ));
            }
            if let Some(x) = &p.expiration {
                annotations.push((Value::Symbol(ANNOTATION_EXPIRATION.into()), text(x)));
            }
            described(0x72, Value::Map(annotations)).encode(&mut out);
        }
    }

    match raw_section(headers, HEADER_PROPERTIES) {
        Some(raw) => out.extend_from_slice(&raw),
        None => {
            let properties = Properties {
                message_id: p.message_id.as_ref().map(text),
                user_id: p.user_id.clone(),
                reply_to: p
                    .reply_to
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned()),
                correlation_id: p.correlation_id.as_ref().map(text),
                content_type: p
                    .content_type
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned()),
                content_encoding: p
                    .content_encoding
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned()),
                creation_time: p.timestamp.map(|t| (t as i64).wrapping_mul(1000)),
                ..Properties::default()
            };
            if properties != Properties::default() {
                Message {
                    properties: Some(properties),
                    ..Message::default()
                }
                .encode(&mut out);
            }
        }
    }

    let is_amqp10 = p.kind.as_deref() == Some(AMQP10_TYPE.as_bytes());
    match raw_section(headers, HEADER_APP_PROPERTIES) {
        Some(raw) => out.extend_from_slice(&raw),
        None => {
            let mut application = Vec::new();
            if let (Some(x), false) = (&p.kind, is_amqp10) {
                application.push((APP_PROPERTY_TYPE.to_owned(), text(x)));
            }
            if let Some(x) = &p.app_id {
                application.push((APP_PROPERTY_APP_ID.to_owned(), text(x)));
            }
            for (k, v) in headers.map(|h| h.inner().iter()).into_iter().flatten() {
                let k = k.as_str();
                if [
                    HEADER_PROPERTIES,
                    HEADER_APP_PROPERTIES,
                    HEADER_MESSAGE_ANNOTATIONS,
                ]
                .contains(&k)
                {
                    continue;
                }
                if let Some(v) = header_value(v) {
                    application.push((k.to_owned(), v));
                }
            }
            if !application.is_empty() {
                Message {
                    application_properties: Some(application),
                    ..Message::default()
                }
                .encode(&mut out);
            }
        }
    }

    if is_amqp10 {
        out.extend_from_slice(body);
    } else {
        described(0x75, Value::Binary(body.clone())).encode(&mut out);
    }
    Ok(out.freeze())
}

/// An application property as a 0-9-1 header value; `None` for types headers lack.
fn to_header_value(v: &Value) -> Option<AMQPValue> {
    Some(match v {
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Long(x) => AMQPValue::LongLongInt(*x),
        Value::Byte(x) => AMQPValue::ShortShortInt(*x),
        Value::Ubyte(x) => AMQPValue::ShortShortUInt(*x),
        Value::Short(x) => AMQPValue::ShortInt(*x),
        Value::Ushort(x) => AMQPValue::ShortUInt(*x),
        Value::Uint(x) => AMQPValue::LongUInt(*x),
        Value::Int(x) => AMQPValue::LongInt(*x),
        Value::Double(x) => AMQPValue::Double(*x),
        Value::Float(x) => AMQPValue::Float(*x),
        Value::Timestamp(ms) => AMQPValue::Timestamp((ms / 1000) as u64),
        Value::Binary(b) => AMQPValue::ByteArray(ByteArray::from(b.to_vec())),
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Null => AMQPValue::Void,
        _ => return None,
    })
}

fn short(s: &str) -> Option<Bytes> {
    (s.len() <= SHORT_STRING_BYTES_MAX).then(|| Bytes::copy_from_slice(s.as_bytes()))
}

fn short_bytes(b: &[u8]) -> Option<Bytes> {
    (b.len() <= SHORT_STRING_BYTES_MAX).then(|| Bytes::copy_from_slice(b))
}

fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn base64(b: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, x)| n | (*x as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// A message or correlation id as 0-9-1 carries it: the short string, and a header to add.
fn id_to_091(id: &Value, header: &str) -> (Option<Bytes>, Option<(String, AMQPValue)>) {
    let long = |b: &[u8]| AMQPValue::LongString(LongString::from(b.to_vec()));
    let type_header = format!("{header}-type");
    let typed = |t: &str| Some((type_header.clone(), long(t.as_bytes())));
    match id {
        Value::Uuid(u) => (short(&uuid_text(u)), typed("uuid")),
        Value::Ulong(n) => (short(&n.to_string()), typed("ulong")),
        Value::Binary(b) => {
            let encoded = base64(b);
            match short(&encoded) {
                Some(s) => (Some(s), typed("binary")),
                None => (None, Some((header.to_owned(), long(b)))),
            }
        }
        Value::String(s) => match short(s) {
            Some(s) => (Some(s), None),
            None => (None, Some((header.to_owned(), long(s.as_bytes())))),
        },
        _ => (None, None),
    }
}

/// The 0-9-1 properties and body RabbitMQ 3.10 delivers for a stream message.
pub fn to_amqp091(m: &Message) -> (content::Properties, Bytes) {
    let (body, is_amqp10) = match &m.body {
        Body::None => (Bytes::new(), false),
        Body::Data(sections) if sections.len() == 1 => (sections[0].clone(), false),
        other => {
            let mut out = BytesMut::new();
            Message {
                body: other.clone(),
                ..Message::default()
            }
            .encode(&mut out);
            (out.freeze(), true)
        }
    };
    let none = Properties::default();
    let props = m.properties.as_ref().unwrap_or(&none);
    let mut application: Vec<(String, Value)> =
        m.application_properties.clone().unwrap_or_default();
    let mut take_application = |key: &str| {
        let at = application.iter().position(|(k, _)| k == key)?;
        Some(application.remove(at).1)
    };
    let kind = match take_application(APP_PROPERTY_TYPE) {
        Some(Value::String(s)) => short(&s),
        Some(_) => None,
        None if is_amqp10 => Some(Bytes::from_static(AMQP10_TYPE.as_bytes())),
        None => None,
    };
    let app_id = match take_application(APP_PROPERTY_APP_ID) {
        Some(Value::String(s)) => short(&s),
        _ => None,
    };
    let annotations = m.message_annotations.clone().unwrap_or_default();
    let annotation = |key: &str| {
        annotations
            .iter()
            .find(|(k, _)| matches!(k, Value::Symbol(s) if s == key))
            .map(|(_, v)| v)
    };
    let ubyte = |v: Option<&Value>| match v {
        Some(Value::Ubyte(x)) => Some(*x),
        _ => None,
    };

    let mut headers: Vec<(String, AMQPValue)> = application
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), to_header_value(v)?)))
        .collect();
    let (message_id, h) = props
        .message_id
        .as_ref()
        .map_or((None, None), |id| id_to_091(id, "x-message-id"));
    headers.extend(h);
    let (correlation_id, h) = props
        .correlation_id
        .as_ref()
        .map_or((None, None), |id| id_to_091(id, "x-correlation-id"));
    headers.extend(h);
    let mut table = FieldTable::default();
    for (k, v) in headers {
        if let Ok(k) = ShortString::try_new(k) {
            table.insert(k, v);
        }
    }

    let mut p = content::Properties {
        message_id,
        correlation_id,
        delivery_mode: ubyte(annotation(ANNOTATION_DELIVERY_MODE)),
        priority: ubyte(annotation(ANNOTATION_PRIORITY)),
        expiration: match annotation(ANNOTATION_EXPIRATION) {
            Some(Value::String(s)) => short(s),
            _ => None,
        },
        user_id: props.user_id.as_deref().and_then(short_bytes),
        reply_to: props.reply_to.as_deref().and_then(short),
        content_type: props.content_type.as_deref().and_then(short),
        content_encoding: props.content_encoding.as_deref().and_then(short),
        timestamp: props.creation_time.map(|ms| (ms / 1000) as u64),
        kind,
        app_id,
        ..content::Properties::default()
    };
    if !table.inner().is_empty() {
        p.set_headers_table(Some(&table));
    }
    (p, body)
}
