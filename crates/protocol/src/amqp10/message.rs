//! The AMQP 1.0 message format (OASIS AMQP 1.0, part 3.2): header, delivery and message
//! annotations, properties, application properties, a body of data sections, an amqp-sequence
//! or an amqp-value, and a footer. This is what RabbitMQ keeps in a stream and what stream
//! clients publish and read.

use super::types::{TypeError, Value};
use crate::wire::Reader;
use bytes::{Bytes, BytesMut};

pub const DESCRIPTOR_HEADER: u64 = 0x70;
pub const DESCRIPTOR_DELIVERY_ANNOTATIONS: u64 = 0x71;
pub const DESCRIPTOR_MESSAGE_ANNOTATIONS: u64 = 0x72;
pub const DESCRIPTOR_PROPERTIES: u64 = 0x73;
pub const DESCRIPTOR_APPLICATION_PROPERTIES: u64 = 0x74;
pub const DESCRIPTOR_DATA: u64 = 0x75;
pub const DESCRIPTOR_AMQP_SEQUENCE: u64 = 0x76;
pub const DESCRIPTOR_AMQP_VALUE: u64 = 0x77;
pub const DESCRIPTOR_FOOTER: u64 = 0x78;

/// The symbolic descriptors a peer may use instead of the numeric ones.
const SYMBOLIC_DESCRIPTORS: [(&str, u64); 9] = [
    ("amqp:header:list", DESCRIPTOR_HEADER),
    (
        "amqp:delivery-annotations:map",
        DESCRIPTOR_DELIVERY_ANNOTATIONS,
    ),
    (
        "amqp:message-annotations:map",
        DESCRIPTOR_MESSAGE_ANNOTATIONS,
    ),
    ("amqp:properties:list", DESCRIPTOR_PROPERTIES),
    (
        "amqp:application-properties:map",
        DESCRIPTOR_APPLICATION_PROPERTIES,
    ),
    ("amqp:data:binary", DESCRIPTOR_DATA),
    ("amqp:amqp-sequence:list", DESCRIPTOR_AMQP_SEQUENCE),
    ("amqp:amqp-value:*", DESCRIPTOR_AMQP_VALUE),
    ("amqp:footer:map", DESCRIPTOR_FOOTER),
];

/// The header section; `None` fields were absent (their defaults apply).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Header {
    pub durable: Option<bool>,
    pub priority: Option<u8>,
    pub ttl_ms: Option<u32>,
    pub first_acquirer: Option<bool>,
    pub delivery_count: Option<u32>,
}

/// The properties section. Message and correlation ids are ulong, uuid, binary or string.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    pub message_id: Option<Value>,
    pub user_id: Option<Bytes>,
    pub to: Option<String>,
    pub subject: Option<String>,
    pub reply_to: Option<String>,
    pub correlation_id: Option<Value>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub absolute_expiry_time: Option<i64>,
    pub creation_time: Option<i64>,
    pub group_id: Option<String>,
    pub group_sequence: Option<u32>,
    pub reply_to_group_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// One or more data sections: opaque bytes, what a 0-9-1 body becomes.
    Data(Vec<Bytes>),
    /// One or more amqp-sequence sections, each a list.
    Sequence(Vec<Vec<Value>>),
    Value(Value),
    /// No body section at all.
    None,
}

/// A whole message. Annotation maps keep their wire order; keys are symbols or ulongs.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub header: Option<Header>,
    pub delivery_annotations: Option<Vec<(Value, Value)>>,
    pub message_annotations: Option<Vec<(Value, Value)>>,
    pub properties: Option<Properties>,
    /// Keys are strings; values are simple types (no lists, maps or arrays).
    pub application_properties: Option<Vec<(String, Value)>>,
    pub body: Body,
    pub footer: Option<Vec<(Value, Value)>>,
}

impl Default for Message {
    fn default() -> Self {
        Message {
            header: None,
            delivery_annotations: None,
            message_annotations: None,
            properties: None,
            application_properties: None,
            body: Body::None,
            footer: None,
        }
    }
}

fn described(code: u64, value: Value) -> Value {
    Value::Described(Box::new(Value::Ulong(code)), Box::new(value))
}

/// A list of optional fields with the trailing absent ones left out, as the spec recommends.
fn field_list(fields: Vec<Option<Value>>) -> Value {
    let last = fields
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    Value::List(
        fields
            .into_iter()
            .take(last)
            .map(|f| f.unwrap_or(Value::Null))
            .collect(),
    )
}

fn opt_string(s: &Option<String>) -> Option<Value> {
    s.clone().map(Value::String)
}

fn opt_symbol(s: &Option<String>) -> Option<Value> {
    s.clone().map(Value::Symbol)
}

impl Message {
    /// Appends the message's sections, in the order the format requires.
    pub fn encode(&self, out: &mut BytesMut) {
        if let Some(h) = &self.header {
            described(
                DESCRIPTOR_HEADER,
                field_list(vec![
                    h.durable.map(Value::Bool),
                    h.priority.map(Value::Ubyte),
                    h.ttl_ms.map(Value::Uint),
                    h.first_acquirer.map(Value::Bool),
                    h.delivery_count.map(Value::Uint),
                ]),
            )
            .encode(out);
        }
        if let Some(a) = &self.delivery_annotations {
            described(DESCRIPTOR_DELIVERY_ANNOTATIONS, Value::Map(a.clone())).encode(out);
        }
        if let Some(a) = &self.message_annotations {
            described(DESCRIPTOR_MESSAGE_ANNOTATIONS, Value::Map(a.clone())).encode(out);
        }
        if let Some(p) = &self.properties {
            described(
                DESCRIPTOR_PROPERTIES,
                field_list(vec![
                    p.message_id.clone(),
                    p.user_id.clone().map(Value::Binary),
                    opt_string(&p.to),
                    opt_string(&p.subject),
                    opt_string(&p.reply_to),
                    p.correlation_id.clone(),
                    opt_symbol(&p.content_type),
                    opt_symbol(&p.content_encoding),
                    p.absolute_expiry_time.map(Value::Timestamp),
                    p.creation_time.map(Value::Timestamp),
                    opt_string(&p.group_id),
                    p.group_sequence.map(Value::Uint),
                    opt_string(&p.reply_to_group_id),
                ]),
            )
            .encode(out);
        }
        if let Some(a) = &self.application_properties {
            let map = a
                .iter()
                .map(|(k, v)| (Value::String(k.clone()), v.clone()))
                .collect();
            described(DESCRIPTOR_APPLICATION_PROPERTIES, Value::Map(map)).encode(out);
        }
        match &self.body {
            Body::Data(sections) => {
                for d in sections {
                    described(DESCRIPTOR_DATA, Value::Binary(d.clone())).encode(out);
                }
            }
            Body::Sequence(lists) => {
                for l in lists {
                    described(DESCRIPTOR_AMQP_SEQUENCE, Value::List(l.clone())).encode(out);
                }
            }
            Body::Value(v) => described(DESCRIPTOR_AMQP_VALUE, v.clone()).encode(out),
            Body::None => {}
        }
        if let Some(f) = &self.footer {
            described(DESCRIPTOR_FOOTER, Value::Map(f.clone())).encode(out);
        }
    }

    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.freeze()
    }

    /// Reads a whole message: sections in the order the format requires, each at most once
    /// (data and amqp-sequence may repeat), one kind of body.
    pub fn decode(raw: Bytes) -> Result<Message, TypeError> {
        let mut r = Reader::new(raw);
        let mut m = Message::default();
        // Sections must come in this order; `stage` is the last one seen.
        let mut stage = 0u64;
        while r.remaining() > 0 {
            let (code, value) = match Value::decode(&mut r)? {
                Value::Described(d, v) => (section_code(&d)?, *v),
                _ => return Err(TypeError::Unexpected("a value that is not a section")),
            };
            let repeatable =
                (code == DESCRIPTOR_DATA || code == DESCRIPTOR_AMQP_SEQUENCE) && stage == code;
            if code < stage || (code == stage && !repeatable) {
                return Err(TypeError::Unexpected("a section out of order"));
            }
            stage = code;
            match code {
                DESCRIPTOR_HEADER => m.header = Some(header(value)?),
                DESCRIPTOR_DELIVERY_ANNOTATIONS => m.delivery_annotations = Some(map(value)?),
                DESCRIPTOR_MESSAGE_ANNOTATIONS => m.message_annotations = Some(map(value)?),
                DESCRIPTOR_PROPERTIES => m.properties = Some(properties(value)?),
                DESCRIPTOR_APPLICATION_PROPERTIES => {
                    m.application_properties = Some(
                        map(value)?
                            .into_iter()
                            .map(|(k, v)| match k {
                                Value::String(k) => Ok((k, v)),
                                _ => Err(TypeError::Unexpected(
                                    "an application property key that is not a string",
                                )),
                            })
                            .collect::<Result<_, _>>()?,
                    )
                }
                DESCRIPTOR_DATA => match (&mut m.body, value) {
                    (Body::Data(sections), Value::Binary(b)) => sections.push(b),
                    (Body::None, Value::Binary(b)) => m.body = Body::Data(vec![b]),
                    _ => return Err(TypeError::Unexpected("a data section that is not binary")),
                },
                DESCRIPTOR_AMQP_SEQUENCE => match (&mut m.body, value) {
                    (Body::Sequence(lists), Value::List(l)) => lists.push(l),
                    (Body::None, Value::List(l)) => m.body = Body::Sequence(vec![l]),
                    _ => return Err(TypeError::Unexpected("an amqp-sequence that is not a list")),
                },
                DESCRIPTOR_AMQP_VALUE => m.body = Body::Value(value),
                DESCRIPTOR_FOOTER => m.footer = Some(map(value)?),
                _ => return Err(TypeError::Unexpected("an unknown section")),
            }
        }
        Ok(m)
    }
}

fn section_code(descriptor: &Value) -> Result<u64, TypeError> {
    match descriptor {
        Value::Ulong(c) if (DESCRIPTOR_HEADER..=DESCRIPTOR_FOOTER).contains(c) => Ok(*c),
        Value::Symbol(s) => SYMBOLIC_DESCRIPTORS
            .iter()
            .find(|(name, _)| name == s)
            .map(|(_, c)| *c)
            .ok_or(TypeError::Unexpected("an unknown section descriptor")),
        _ => Err(TypeError::Unexpected("an unknown section descriptor")),
    }
}

fn map(v: Value) -> Result<Vec<(Value, Value)>, TypeError> {
    match v {
        Value::Map(pairs) => Ok(pairs),
        Value::Null => Ok(Vec::new()),
        _ => Err(TypeError::Unexpected("a section that should be a map")),
    }
}

fn list(v: Value) -> Result<Vec<Value>, TypeError> {
    match v {
        Value::List(items) => Ok(items),
        _ => Err(TypeError::Unexpected("a section that should be a list")),
    }
}

/// Field `i` of a section list; absent and null are both `None`.
fn field(items: &[Value], i: usize) -> Option<&Value> {
    items.get(i).filter(|v| **v != Value::Null)
}

macro_rules! typed {
    ($items:expr, $i:expr, $variant:ident, $what:literal) => {
        match field($items, $i) {
            None => None,
            Some(Value::$variant(x)) => Some(x.clone()),
            Some(_) => return Err(TypeError::Unexpected($what)),
        }
    };
}

fn header(v: Value) -> Result<Header, TypeError> {
    let f = list(v)?;
    Ok(Header {
        durable: typed!(&f, 0, Bool, "a header durable that is not a boolean"),
        priority: typed!(&f, 1, Ubyte, "a header priority that is not a ubyte"),
        ttl_ms: typed!(&f, 2, Uint, "a header ttl that is not a uint"),
        first_acquirer: typed!(&f, 3, Bool, "a header first-acquirer that is not a boolean"),
        delivery_count: typed!(&f, 4, Uint, "a header delivery-count that is not a uint"),
    })
}

fn message_id(v: Option<&Value>) -> Result<Option<Value>, TypeError> {
    match v {
        None => Ok(None),
        Some(v @ (Value::Ulong(_) | Value::Uuid(_) | Value::Binary(_) | Value::String(_))) => {
            Ok(Some(v.clone()))
        }
        Some(_) => Err(TypeError::Unexpected(
            "a message id of a type ids cannot have",
        )),
    }
}

fn properties(v: Value) -> Result<Properties, TypeError> {
    let f = list(v)?;
    Ok(Properties {
        message_id: message_id(field(&f, 0))?,
        user_id: typed!(&f, 1, Binary, "a user-id that is not binary"),
        to: typed!(&f, 2, String, "a to that is not a string"),
        subject: typed!(&f, 3, String, "a subject that is not a string"),
        reply_to: typed!(&f, 4, String, "a reply-to that is not a string"),
        correlation_id: message_id(field(&f, 5))?,
        content_type: typed!(&f, 6, Symbol, "a content-type that is not a symbol"),
        content_encoding: typed!(&f, 7, Symbol, "a content-encoding that is not a symbol"),
        absolute_expiry_time: typed!(
            &f,
            8,
            Timestamp,
            "an absolute-expiry-time that is not a timestamp"
        ),
        creation_time: typed!(&f, 9, Timestamp, "a creation-time that is not a timestamp"),
        group_id: typed!(&f, 10, String, "a group-id that is not a string"),
        group_sequence: typed!(&f, 11, Uint, "a group-sequence that is not a uint"),
        reply_to_group_id: typed!(&f, 12, String, "a reply-to-group-id that is not a string"),
    })
}
