//! RabbitMQ 3.10's mapping between 0-9-1 messages and the AMQP 1.0 messages a stream keeps
//! (`rabbit_msg_record`): a 0-9-1 message goes into a stream and comes back out over 0-9-1
//! unchanged, and known messages map to the sections 3.10 writes.

use amq_protocol_types::{AMQPValue, ByteArray, FieldTable, LongString, ShortString};
use bytes::Bytes;
use proptest::collection::{btree_map, vec};
use proptest::option::of;
use proptest::prelude::*;
use warren_protocol::amqp10::amqp091::{from_amqp091, to_amqp091};
use warren_protocol::amqp10::{Body, Message, Properties, Value};
use warren_protocol::content;

fn utf8(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::string::string_regex(&format!("\\PC{{0,{}}}", max / 4))
        .unwrap()
        .prop_map(|s| Bytes::from(s.into_bytes()))
}

fn header_value() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f32>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(AMQPValue::Float),
        any::<f64>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(AMQPValue::Double),
        "\\PC{0,20}".prop_map(|s| AMQPValue::LongString(LongString::from(s.into_bytes()))),
        (0u64..9_000_000_000_000).prop_map(AMQPValue::Timestamp),
        vec(any::<u8>(), 0..20).prop_map(|b| AMQPValue::ByteArray(ByteArray::from(b))),
        Just(AMQPValue::Void),
    ]
}

/// 0-9-1 properties that 3.10's mapping carries through a stream: UTF-8 text, headers of the
/// types it converts, keys clear of its own `x-basic-` and `x-amqp-1.0-` names, no cluster id
/// (3.10 drops it) and no `amqp-1.0` type (its body must be AMQP 1.0 sections, tested below).
fn properties() -> impl Strategy<Value = content::Properties> {
    (
        (
            of(utf8(60)),
            of(utf8(60)),
            of(any::<u8>()),
            of(any::<u8>()),
            of(utf8(255)),
        ),
        (
            of(utf8(255)),
            of(utf8(60)),
            of(utf8(255)),
            of(0u64..9_000_000_000_000),
            of("[a-z.]{1,20}"),
        ),
        (
            of(vec(any::<u8>(), 0..40)),
            of(utf8(60)),
            of(btree_map("[a-w][a-z0-9-]{0,20}", header_value(), 1..5)),
        ),
    )
        .prop_map(|(a, b, c)| {
            let mut p = content::Properties {
                content_type: a.0,
                content_encoding: a.1,
                delivery_mode: a.2,
                priority: a.3,
                correlation_id: a.4,
                reply_to: b.0,
                expiration: b.1,
                message_id: b.2,
                timestamp: b.3,
                kind: b.4.map(|s| Bytes::from(s.into_bytes())),
                user_id: c.0.map(Bytes::from),
                app_id: c.1,
                ..content::Properties::default()
            };
            if let Some(h) = c.2 {
                let mut t = FieldTable::default();
                for (k, v) in h {
                    t.insert(ShortString::from(k), v);
                }
                p.set_headers_table(Some(&t));
            }
            p
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_091_message_comes_back_out_of_a_stream_unchanged(
        p in properties(), body in vec(any::<u8>(), 0..200),
    ) {
        let body = Bytes::from(body);
        let stored = from_amqp091(b"", b"q", &p, &body).unwrap();
        let message = Message::decode(stored).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (back, back_body) = to_amqp091(&message);
        prop_assert_eq!(back_body, body);
        prop_assert_eq!(back.headers_table().unwrap(), p.headers_table().unwrap());
        prop_assert_eq!(content::Properties { headers: None, ..back }, content::Properties { headers: None, ..p });
    }
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

#[test]
fn a_091_publish_becomes_the_sections_rabbitmq_stores() {
    let mut p = content::Properties {
        priority: Some(5),
        delivery_mode: Some(2),
        expiration: Some(Bytes::from_static(b"60000")),
        content_type: Some(Bytes::from_static(b"text/plain")),
        message_id: Some(Bytes::from_static(b"m-1")),
        timestamp: Some(1_700_000_000),
        kind: Some(Bytes::from_static(b"order")),
        app_id: Some(Bytes::from_static(b"shop")),
        cluster_id: Some(Bytes::from_static(b"dropped")),
        ..content::Properties::default()
    };
    p.set_headers_table(Some(&table(&[
        ("count", AMQPValue::LongInt(3)),
        ("nested", AMQPValue::FieldTable(FieldTable::default())),
    ])));
    let stored = from_amqp091(b"shop", b"orders.new", &p, &Bytes::from_static(b"hi")).unwrap();
    let m = Message::decode(stored).unwrap();
    let sym = |s: &str| Value::Symbol(s.into());
    assert_eq!(
        m.message_annotations,
        Some(vec![
            (sym("x-routing-key"), Value::String("orders.new".into())),
            (sym("x-exchange"), Value::String("shop".into())),
            (sym("x-basic-priority"), Value::Ubyte(5)),
            (sym("x-basic-delivery-mode"), Value::Ubyte(2)),
            (sym("x-basic-expiration"), Value::String("60000".into())),
        ])
    );
    assert_eq!(
        m.properties,
        Some(Properties {
            message_id: Some(Value::String("m-1".into())),
            content_type: Some("text/plain".into()),
            creation_time: Some(1_700_000_000_000),
            ..Properties::default()
        })
    );
    // Type and app-id first, then the headers a stream can carry (not the nested table).
    assert_eq!(
        m.application_properties,
        Some(vec![
            ("x-basic-type".into(), Value::String("order".into())),
            ("x-basic-app-id".into(), Value::String("shop".into())),
            ("count".into(), Value::Int(3)),
        ])
    );
    assert_eq!(m.body, Body::Data(vec![Bytes::from_static(b"hi")]));
    assert!(m.header.is_none());
}

#[test]
fn a_091_publish_of_type_amqp_1_0_is_stored_as_its_own_sections() {
    let inner = Message {
        body: Body::Value(Value::Long(42)),
        application_properties: Some(vec![("k".into(), Value::Bool(true))]),
        ..Message::default()
    };
    let p = content::Properties {
        kind: Some(Bytes::from_static(b"amqp-1.0")),
        ..content::Properties::default()
    };
    let stored = from_amqp091(b"", b"q", &p, &inner.to_bytes()).unwrap();
    let m = Message::decode(stored.clone()).unwrap();
    assert_eq!(
        (m.application_properties, m.body),
        (inner.application_properties.clone(), inner.body.clone())
    );
    // And back out over 0-9-1: the sections again, typed amqp-1.0.
    let (back, body) = to_amqp091(&Message::decode(stored).unwrap());
    assert_eq!(back.kind.as_deref(), Some(&b"amqp-1.0"[..]));
    assert_eq!(
        Message::decode(body).unwrap().body,
        Body::Value(Value::Long(42))
    );
}

#[test]
fn sections_given_in_x_amqp_1_0_headers_are_stored_as_they_are() {
    let given = Message {
        properties: Some(Properties {
            subject: Some("kept whole".into()),
            ..Properties::default()
        }),
        ..Message::default()
    }
    .to_bytes();
    let mut p = content::Properties {
        message_id: Some(Bytes::from_static(b"ignored: the header wins")),
        ..content::Properties::default()
    };
    p.set_headers_table(Some(&table(&[(
        "x-amqp-1.0-properties",
        AMQPValue::LongString(LongString::from(given.to_vec())),
    )])));
    let m = Message::decode(from_amqp091(b"", b"q", &p, &Bytes::new()).unwrap()).unwrap();
    assert_eq!(m.properties.unwrap().subject.as_deref(), Some("kept whole"));
    assert_eq!(
        m.application_properties, None,
        "the x-amqp-1.0 headers are not headers"
    );
}

#[test]
fn stream_client_ids_reach_091_consumers_as_strings_with_their_type() {
    let uuid = [
        0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd,
        0xef,
    ];
    let m = Message {
        properties: Some(Properties {
            message_id: Some(Value::Uuid(uuid)),
            correlation_id: Some(Value::Binary(Bytes::from_static(b"\x00\xffab"))),
            user_id: Some(Bytes::from_static(b"guest")),
            ..Properties::default()
        }),
        body: Body::Data(vec![Bytes::from_static(b"x")]),
        ..Message::default()
    };
    let (p, body) = to_amqp091(&m);
    assert_eq!(&body[..], b"x");
    assert_eq!(p.kind, None, "one data section is a plain body");
    assert_eq!(
        p.message_id.as_deref(),
        Some(&b"12345678-9abc-def0-0123-456789abcdef"[..])
    );
    assert_eq!(p.correlation_id.as_deref(), Some(&b"AP9hYg=="[..]));
    let h = p.headers_table().unwrap().unwrap();
    let long = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    assert_eq!(h.inner().get("x-message-id-type"), Some(&long("uuid")));
    assert_eq!(
        h.inner().get("x-correlation-id-type"),
        Some(&long("binary"))
    );

    // A ulong id, and a string id too long for a short string, which moves to a header.
    let long_id = "i".repeat(300);
    let m = Message {
        properties: Some(Properties {
            message_id: Some(Value::Ulong(7)),
            correlation_id: Some(Value::String(long_id.clone())),
            ..Properties::default()
        }),
        ..Message::default()
    };
    let (p, body) = to_amqp091(&m);
    assert!(body.is_empty());
    assert_eq!(p.message_id.as_deref(), Some(&b"7"[..]));
    assert_eq!(p.correlation_id, None);
    let h = p.headers_table().unwrap().unwrap();
    assert_eq!(h.inner().get("x-message-id-type"), Some(&long("ulong")));
    assert_eq!(h.inner().get("x-correlation-id"), Some(&long(&long_id)));
}

#[test]
fn values_091_headers_cannot_hold_are_left_out_not_fatal() {
    let m = Message {
        application_properties: Some(vec![
            ("symbol".into(), Value::Symbol("s".into())),
            ("ulong".into(), Value::Ulong(1)),
            ("kept".into(), Value::Short(-2)),
            ("k".repeat(300), Value::Bool(true)),
        ]),
        message_annotations: Some(vec![(
            Value::Symbol("x-basic-priority".into()),
            Value::Ubyte(9),
        )]),
        ..Message::default()
    };
    let (p, _) = to_amqp091(&m);
    assert_eq!(p.priority, Some(9));
    let h = p.headers_table().unwrap().unwrap();
    assert_eq!(h.inner().len(), 1);
    assert_eq!(h.inner().get("kept"), Some(&AMQPValue::ShortInt(-2)));
}
