//! The AMQP 1.0 message codec against itself and hostile bytes: every value and message
//! round-trips, any input is a message or an error (never a panic, a stack overflow or an
//! allocation larger than the input), and sections out of the format's order are refused.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use warren_protocol::amqp10::types::*;
use warren_protocol::amqp10::{Body, Header, Message, Properties, TypeError, Value};
use warren_protocol::wire::Reader;

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,10}"
}

fn long_text() -> impl Strategy<Value = String> {
    prop_oneof![text(), "[a-z]{250,300}"]
}

pub fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u8>().prop_map(Value::Ubyte),
        any::<u16>().prop_map(Value::Ushort),
        any::<u32>().prop_map(Value::Uint),
        (0u32..300).prop_map(Value::Uint),
        any::<u64>().prop_map(Value::Ulong),
        (0u64..300).prop_map(Value::Ulong),
        any::<i8>().prop_map(Value::Byte),
        any::<i16>().prop_map(Value::Short),
        any::<i32>().prop_map(Value::Int),
        (-200i32..200).prop_map(Value::Int),
        any::<i64>().prop_map(Value::Long),
        (-200i64..200).prop_map(Value::Long),
        any::<f32>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(Value::Float),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(Value::Double),
        any::<[u8; 4]>().prop_map(Value::Decimal32),
        any::<[u8; 8]>().prop_map(Value::Decimal64),
        any::<[u8; 16]>().prop_map(Value::Decimal128),
        any::<char>().prop_map(Value::Char),
        any::<i64>().prop_map(Value::Timestamp),
        any::<[u8; 16]>().prop_map(Value::Uuid),
        vec(any::<u8>(), 0..300).prop_map(|b| Value::Binary(Bytes::from(b))),
        long_text().prop_map(Value::String),
        long_text().prop_map(Value::Symbol),
    ]
    .boxed()
}

/// Arrays hold one type; nulls (zero bytes each) are left out, see `zero_width_arrays_...`.
fn array() -> BoxedStrategy<Value> {
    prop_oneof![
        vec(any::<u32>().prop_map(Value::Uint), 0..5),
        vec(any::<i64>().prop_map(Value::Long), 0..5),
        vec(any::<bool>().prop_map(Value::Bool), 0..5),
        vec(text().prop_map(Value::Symbol), 0..5),
        vec(
            vec(any::<u8>(), 0..5).prop_map(|b| Value::Binary(Bytes::from(b))),
            0..5
        ),
        vec(
            text().prop_map(|s| Value::Described(
                Box::new(Value::Ulong(7)),
                Box::new(Value::String(s))
            )),
            1..4
        ),
    ]
    .prop_map(Value::Array)
    .boxed()
}

pub fn value() -> BoxedStrategy<Value> {
    prop_oneof![leaf(), array()]
        .prop_recursive(3, 40, 6, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(Value::List),
                vec((inner.clone(), inner.clone()), 0..4).prop_map(Value::Map),
                (inner.clone(), inner)
                    .prop_map(|(d, v)| Value::Described(Box::new(d), Box::new(v))),
                // Lists long enough for the 32-bit form.
                vec(any::<u64>().prop_map(Value::Ulong), 30..40).prop_map(Value::List),
            ]
        })
        .boxed()
}

fn message_id() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::Ulong),
        any::<[u8; 16]>().prop_map(Value::Uuid),
        vec(any::<u8>(), 0..20).prop_map(|b| Value::Binary(Bytes::from(b))),
        text().prop_map(Value::String),
    ]
}

fn annotations() -> impl Strategy<Value = Vec<(Value, Value)>> {
    vec((text().prop_map(Value::Symbol), value()), 0..4)
}

pub fn message() -> impl Strategy<Value = Message> {
    let header = (
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<u8>()),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(
            |(durable, priority, ttl_ms, first_acquirer, delivery_count)| Header {
                durable,
                priority,
                ttl_ms,
                first_acquirer,
                delivery_count,
            },
        );
    use proptest::option::of as o;
    let properties = (
        (
            o(message_id()),
            o(vec(any::<u8>(), 0..8).prop_map(Bytes::from)),
            o(text()),
            o(text()),
            o(text()),
        ),
        (
            o(message_id()),
            o(text()),
            o(text()),
            o(any::<i64>()),
            o(any::<i64>()),
        ),
        (o(text()), o(any::<u32>()), o(text())),
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
        });
    let body = prop_oneof![
        Just(Body::None),
        vec(vec(any::<u8>(), 0..300).prop_map(Bytes::from), 1..3).prop_map(Body::Data),
        vec(vec(value(), 0..3), 1..3).prop_map(Body::Sequence),
        value().prop_map(Body::Value),
    ];
    (
        o(header),
        o(annotations()),
        o(annotations()),
        o(properties),
        o(vec((text(), leaf()), 0..4)),
        body,
        o(annotations()),
    )
        .prop_map(
            |(
                header,
                delivery_annotations,
                message_annotations,
                properties,
                application_properties,
                body,
                footer,
            )| {
                Message {
                    header,
                    delivery_annotations,
                    message_annotations,
                    properties,
                    application_properties,
                    body,
                    footer,
                }
            },
        )
}

fn encoded(v: &Value) -> Bytes {
    let mut out = BytesMut::new();
    v.encode(&mut out);
    out.freeze()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_value_round_trips(v in value()) {
        prop_assert_eq!(Value::decode_bytes(&encoded(&v)), Ok(v));
    }

    #[test]
    fn every_message_round_trips(m in message()) {
        prop_assert_eq!(Message::decode(m.to_bytes()), Ok(m));
    }

    #[test]
    fn arbitrary_bytes_are_a_message_or_an_error(input in vec(any::<u8>(), 0..400)) {
        if let Ok(m) = Message::decode(Bytes::from(input)) {
            // Whatever decodes re-encodes to an equal message (floats compared as encodings).
            let again = m.to_bytes();
            prop_assert_eq!(Message::decode(again.clone()).map(|m| m.to_bytes()), Ok(again));
        }
    }

    #[test]
    fn values_spliced_from_sections_never_panic(m in message(), cut in any::<prop::sample::Index>(), flip in any::<u8>()) {
        let mut raw = BytesMut::from(&m.to_bytes()[..]);
        if !raw.is_empty() {
            let i = cut.index(raw.len());
            raw[i] ^= flip;
            let _ = Message::decode(raw.clone().freeze());
            raw.truncate(i);
            let _ = Message::decode(raw.freeze());
        }
    }
}

#[test]
fn compact_and_wide_encodings_decode_to_the_same_value() {
    let cases: [(&[u8], Value); 8] = [
        (&[CODE_UINT0], Value::Uint(0)),
        (&[CODE_SMALLUINT, 7], Value::Uint(7)),
        (&[CODE_UINT, 0, 0, 0, 7], Value::Uint(7)),
        (&[CODE_ULONG0], Value::Ulong(0)),
        (&[CODE_SMALLLONG, 0xff], Value::Long(-1)),
        (&[CODE_BOOLEAN, 1], Value::Bool(true)),
        (
            &[CODE_STR32, 0, 0, 0, 2, b'h', b'i'],
            Value::String(String::from("hi")),
        ),
        (
            &[CODE_LIST32, 0, 0, 0, 5, 0, 0, 0, 1, CODE_NULL],
            Value::List(vec![Value::Null]),
        ),
    ];
    for (raw, want) in cases {
        assert_eq!(
            Value::decode_bytes(&Bytes::copy_from_slice(raw)),
            Ok(want),
            "{raw:02x?}"
        );
    }
}

#[test]
fn nesting_past_the_limit_is_refused_not_a_stack_overflow() {
    // A million nested list8s would overflow the stack of a naive recursive decoder.
    let mut raw = Vec::new();
    for _ in 0..1_000_000 {
        raw.extend_from_slice(&[CODE_DESCRIBED, CODE_NULL]);
    }
    raw.push(CODE_NULL);
    assert_eq!(
        Value::decode_bytes(&Bytes::from(raw)),
        Err(TypeError::TooDeep)
    );
    let mut nested = Value::Null;
    for _ in 0..DEPTH_MAX + 1 {
        nested = Value::List(vec![nested]);
    }
    assert_eq!(
        Value::decode_bytes(&encoded(&nested)),
        Err(TypeError::TooDeep)
    );
}

#[test]
fn zero_width_arrays_cannot_claim_more_elements_than_bytes() {
    // array32 of 2^32-1 nulls in 10 bytes: refused before anything is allocated.
    let raw = [CODE_ARRAY32, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, CODE_NULL];
    assert_eq!(
        Value::decode_bytes(&Bytes::copy_from_slice(&raw)),
        Err(TypeError::BadLength)
    );
    // A list claiming more elements than its bytes hold.
    let raw = [CODE_LIST8, 2, 200, CODE_NULL];
    assert_eq!(
        Value::decode_bytes(&Bytes::copy_from_slice(&raw)),
        Err(TypeError::BadLength)
    );
}

#[test]
fn sections_out_of_order_or_repeated_are_refused() {
    let section =
        |code: u64, v: Value| encoded(&Value::Described(Box::new(Value::Ulong(code)), Box::new(v)));
    let props = section(0x73, Value::List(vec![]));
    let header = section(0x70, Value::List(vec![]));
    let data = section(0x75, Value::Binary(Bytes::from_static(b"x")));
    let mut wrong = BytesMut::new();
    wrong.put_slice(&props);
    wrong.put_slice(&header);
    assert!(Message::decode(wrong.freeze()).is_err());
    let mut twice = BytesMut::new();
    twice.put_slice(&props);
    twice.put_slice(&props);
    assert!(Message::decode(twice.freeze()).is_err());
    // Data sections may repeat, and symbolic descriptors are accepted.
    let mut ok = BytesMut::new();
    ok.put_slice(&data);
    ok.put_slice(&data);
    let symbolic = Value::Described(
        Box::new(Value::Symbol("amqp:footer:map".into())),
        Box::new(Value::Map(vec![])),
    );
    ok.put_slice(&encoded(&symbolic));
    let m = Message::decode(ok.freeze()).unwrap();
    assert_eq!(
        m.body,
        Body::Data(vec![Bytes::from_static(b"x"), Bytes::from_static(b"x")])
    );
    assert_eq!(m.footer, Some(vec![]));
}

#[test]
fn a_message_of_one_data_section_is_the_bytes_stream_clients_send() {
    // What the Rust and Java stream clients write for a body "hello": 0x00 0x53 0x75 0xa0 ...
    let m = Message {
        body: Body::Data(vec![Bytes::from_static(b"hello")]),
        ..Message::default()
    };
    assert_eq!(
        &m.to_bytes()[..],
        &[0x00, 0x53, 0x75, 0xa0, 5, b'h', b'e', b'l', b'l', b'o']
    );
    let mut r = Reader::new(m.to_bytes());
    assert!(matches!(Value::decode(&mut r), Ok(Value::Described(..))));
}

/// The fuzzer's seeds (`fuzz/corpus/amqp10_message`) are what they claim: messages (one as a
/// RabbitMQ 3.10 node stored it) and a 0-9-1 property list.
#[test]
fn the_fuzz_seeds_decode() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/amqp10_message");
    let read = |name: &str| Bytes::from(std::fs::read(dir.join(name)).unwrap());
    for name in [
        "rabbitmq-3.10-stored-091-publish",
        "data-hello",
        "amqp-value-list",
    ] {
        Message::decode(read(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let p = warren_protocol::content::Properties::decode(&read("091-properties")).unwrap();
    assert_eq!(p.delivery_mode, Some(2));
    assert!(p.headers_table().unwrap().is_some());
}
