//! Our AMQP 1.0 message codec against the official Rust stream client's (the messages
//! `rabbitmq-stream-client` publishes and reads), both ways: a message the client builds and
//! encodes decodes with ours to the same sections, and our encoding of it decodes with the client
//! to a message equal to the one it built.
//!
//! Within what the client's message API can build: properties, message annotations with symbol
//! keys, application properties, one data section (no header, no other body kinds), simple values;
//! message ids of the types the spec allows (the client also takes `long`, which the spec does not).

use bytes::Bytes;
use chrono::{TimeZone, Utc};
use proptest::collection::vec;
use proptest::option::of;
use proptest::prelude::*;
use rabbitmq_stream_protocol::codec::{Decoder, Encoder};
use rabbitmq_stream_protocol::message::{
    Message as ClientMessage, SimpleValue, Value as ClientValue,
};
use warren_protocol::amqp10::{Body, Message, Properties, Value};

/// Millisecond timestamps the client's calendar type can hold.
fn millis() -> impl Strategy<Value = i64> {
    -100_000_000_000_000i64..100_000_000_000_000
}

fn simple() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u8>().prop_map(Value::Ubyte),
        any::<u16>().prop_map(Value::Ushort),
        any::<u32>().prop_map(Value::Uint),
        any::<u64>().prop_map(Value::Ulong),
        any::<i8>().prop_map(Value::Byte),
        any::<i16>().prop_map(Value::Short),
        any::<i32>().prop_map(Value::Int),
        any::<i64>().prop_map(Value::Long),
        any::<f32>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(Value::Float),
        any::<f64>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(Value::Double),
        any::<char>().prop_map(Value::Char),
        millis().prop_map(Value::Timestamp),
        any::<[u8; 16]>().prop_map(Value::Uuid),
        vec(any::<u8>(), 0..40).prop_map(|b| Value::Binary(Bytes::from(b))),
        "\\PC{0,20}".prop_map(Value::String),
        "[a-z:-]{0,20}".prop_map(Value::Symbol),
    ]
}

fn message_id() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::Ulong),
        any::<[u8; 16]>().prop_map(Value::Uuid),
        vec(any::<u8>(), 0..20).prop_map(|b| Value::Binary(Bytes::from(b))),
        "\\PC{0,20}".prop_map(Value::String),
    ]
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,16}"
}

fn properties() -> impl Strategy<Value = Properties> {
    (
        (
            of(message_id()),
            of(vec(any::<u8>(), 0..8).prop_map(Bytes::from)),
            of(text()),
            of(text()),
            of(text()),
        ),
        (
            of(message_id()),
            of("[a-z/+-]{1,20}"),
            of("[a-z]{1,8}"),
            of(millis()),
            of(millis()),
        ),
        (of(text()), of(any::<u32>()), of(text())),
    )
        .prop_map(|(a, b, c)| Properties {
            message_id: a.0,
            user_id: a.1,
            to: a.2,
            subject: a.3,
            reply_to: a.4,
            correlation_id: b.0,
            content_type: b.1,
            content_encoding: b.2,
            absolute_expiry_time: b.3,
            creation_time: b.4,
            group_id: c.0,
            group_sequence: c.1,
            reply_to_group_id: c.2,
        })
}

/// Messages the client's builder can make; maps have distinct keys (the client keeps a HashMap).
fn message() -> impl Strategy<Value = Message> {
    (
        of(properties()),
        of(proptest::collection::btree_map(
            "[a-z-]{1,12}",
            simple(),
            1..4,
        )),
        of(proptest::collection::btree_map(
            "\\PC{1,12}",
            simple(),
            1..4,
        )),
        vec(any::<u8>(), 0..200),
    )
        .prop_map(
            |(properties, annotations, application_properties, body)| Message {
                // The client's builder cannot make an empty properties section.
                properties: properties.filter(|p| *p != Properties::default()),
                message_annotations: annotations
                    .map(|m| m.into_iter().map(|(k, v)| (Value::Symbol(k), v)).collect()),
                application_properties: application_properties.map(|m| m.into_iter().collect()),
                body: Body::Data(vec![Bytes::from(body)]),
                ..Message::default()
            },
        )
}

fn client_simple(v: &Value) -> SimpleValue {
    match v.clone() {
        Value::Null => SimpleValue::Null,
        Value::Bool(x) => SimpleValue::Boolean(x),
        Value::Ubyte(x) => SimpleValue::Ubyte(x),
        Value::Ushort(x) => SimpleValue::Ushort(x),
        Value::Uint(x) => SimpleValue::Uint(x),
        Value::Ulong(x) => SimpleValue::Ulong(x),
        Value::Byte(x) => SimpleValue::Byte(x),
        Value::Short(x) => SimpleValue::Short(x),
        Value::Int(x) => SimpleValue::Int(x),
        Value::Long(x) => SimpleValue::Long(x),
        Value::Float(x) => SimpleValue::Float(x.into()),
        Value::Double(x) => SimpleValue::Double(x.into()),
        Value::Char(x) => SimpleValue::Char(x),
        Value::Timestamp(ms) => {
            SimpleValue::Timestamp(Utc.timestamp_millis_opt(ms).unwrap().into())
        }
        Value::Uuid(b) => SimpleValue::Uuid(uuid::Uuid::from_bytes(b)),
        Value::Binary(b) => SimpleValue::Binary(b.to_vec()),
        Value::String(s) => SimpleValue::String(s),
        Value::Symbol(s) => SimpleValue::Symbol(s.into()),
        other => panic!("not a simple value: {other:?}"),
    }
}

/// The same message built with the client's API.
fn client_message(m: &Message) -> ClientMessage {
    let Body::Data(data) = &m.body else {
        panic!("generators make data bodies")
    };
    let mut b = ClientMessage::builder().body(data[0].to_vec());
    if let Some(p) = &m.properties {
        let mut pb = b.properties();
        macro_rules! id {
            ($setter:ident, $v:expr) => {
                match $v.clone() {
                    Value::Ulong(x) => pb.$setter(x),
                    Value::Uuid(x) => pb.$setter(uuid::Uuid::from_bytes(x)),
                    Value::Binary(x) => pb.$setter(x.to_vec()),
                    Value::String(x) => pb.$setter(x),
                    other => panic!("{other:?}"),
                }
            };
        }
        if let Some(v) = &p.message_id {
            pb = id!(message_id, v);
        }
        if let Some(v) = &p.user_id {
            pb = pb.user_id(v.to_vec());
        }
        if let Some(v) = &p.to {
            pb = pb.to(v.clone());
        }
        if let Some(v) = &p.subject {
            pb = pb.subject(v.clone());
        }
        if let Some(v) = &p.reply_to {
            pb = pb.reply_to(v.clone());
        }
        if let Some(v) = &p.correlation_id {
            pb = id!(correlation_id, v);
        }
        if let Some(v) = &p.content_type {
            pb = pb.content_type(v.clone());
        }
        if let Some(v) = &p.content_encoding {
            pb = pb.content_encoding(v.clone());
        }
        if let Some(v) = p.absolute_expiry_time {
            pb = pb.absolute_expiry_time(Utc.timestamp_millis_opt(v).unwrap());
        }
        if let Some(v) = p.creation_time {
            pb = pb.creation_time(Utc.timestamp_millis_opt(v).unwrap());
        }
        if let Some(v) = &p.group_id {
            pb = pb.group_id(v.clone());
        }
        if let Some(v) = p.group_sequence {
            pb = pb.group_sequence(v);
        }
        if let Some(v) = &p.reply_to_group_id {
            pb = pb.reply_to_group_id(v.clone());
        }
        b = pb.message_builder();
    }
    if let Some(a) = &m.message_annotations {
        let mut ab = b.message_annotations();
        for (k, v) in a {
            let Value::Symbol(k) = k else {
                panic!("symbol keys")
            };
            ab = ab.insert(k.as_str(), ClientValue::Simple(client_simple(v)));
        }
        b = ab.message_builder();
    }
    if let Some(a) = &m.application_properties {
        let mut ab = b.application_properties();
        for (k, v) in a {
            ab = ab.insert(k.as_str(), client_simple(v));
        }
        b = ab.message_builder();
    }
    b.build()
}

/// Maps in key order: the client's are HashMaps.
fn canonical(mut m: Message) -> Message {
    if let Some(a) = &mut m.message_annotations {
        a.sort_by(|x, y| format!("{:?}", x.0).cmp(&format!("{:?}", y.0)));
    }
    if let Some(a) = &mut m.application_properties {
        a.sort_by(|x, y| x.0.cmp(&y.0));
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn messages_the_client_encodes_decode_with_ours(m in message()) {
        let mut wire = Vec::new();
        client_message(&m).encode(&mut wire).unwrap();
        let ours = Message::decode(Bytes::from(wire)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(canonical(ours), canonical(m));
    }

    #[test]
    fn messages_we_encode_decode_with_the_client(m in message()) {
        let wire = m.to_bytes();
        let (rest, theirs) = ClientMessage::decode(&wire)
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert!(rest.is_empty());
        prop_assert_eq!(theirs, client_message(&m));
    }
}
