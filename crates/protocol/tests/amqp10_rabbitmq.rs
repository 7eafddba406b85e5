//! The 0-9-1 <-> stream message mapping against RabbitMQ 3.10 itself: messages published over
//! 0-9-1 into a stream are read back over the stream protocol and must be the AMQP 1.0 messages
//! `amqp091::from_amqp091` makes; AMQP 1.0 messages published over the stream protocol are
//! consumed over 0-9-1 and must carry what `amqp091::to_amqp091` gives. Only our codecs speak.
//!
//! Left out on purpose, where 3.10 fails (see `amqp10::amqp091`): it closes the 0-9-1 consumer's
//! connection with INTERNAL_ERROR for an amqp-value or amqp-sequence body or a message with no
//! body section, and delivers only the last of several data sections.
//!
//! Needs `WARREN_STREAM_TEST_ADDR` (a RabbitMQ stream port) and `WARREN_STREAM_TEST_AMQP_ADDR`
//! (the same node's AMQP port), e.g. 127.0.0.1:5560 and 127.0.0.1:5680 after
//! `RMQ_PLUGINS=rabbitmq_stream ../shared/rabbitmq/rabbitmq.sh start`; without them the test
//! prints why it skipped.

use amq_protocol_types::{AMQPValue, FieldTable, LongString, ShortString};
use bytes::{BufMut, Bytes, BytesMut};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use warren_protocol::amqp::{basic, channel, connection, queue, AMQPClass};
use warren_protocol::amqp10::amqp091::{from_amqp091, to_amqp091};
use warren_protocol::amqp10::{Body, Message, Properties, Value};
use warren_protocol::constants::CLASS_BASIC;
use warren_protocol::content::{self, ContentHeader};
use warren_protocol::frame::{self, FRAME_BODY, FRAME_HEADER, FRAME_METHOD};
use warren_protocol::method::Method;
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{self, Command, OffsetSpec, PublishedMessage};
use warren_protocol::PROTOCOL_HEADER;

/// A 0-9-1 connection with one channel, spoken through our codec.
struct Amqp {
    socket: TcpStream,
    read: BytesMut,
    frame_max: u32,
}

impl Amqp {
    fn connect(addr: &str) -> Amqp {
        let socket = TcpStream::connect(addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut c = Amqp {
            socket,
            read: BytesMut::new(),
            frame_max: frame::FRAME_MIN_BYTES,
        };
        c.socket.write_all(PROTOCOL_HEADER).unwrap();
        c.expect(|m| matches!(m, AMQPClass::Connection(connection::AMQPMethod::Start(_))));
        c.send(AMQPClass::Connection(connection::AMQPMethod::StartOk(
            connection::StartOk {
                client_properties: FieldTable::default(),
                mechanism: "PLAIN".into(),
                response: LongString::from(&b"\0guest\0guest"[..]),
                locale: "en_US".into(),
            },
        )));
        let frame_max = match c.recv_method() {
            Method::Other(AMQPClass::Connection(connection::AMQPMethod::Tune(t))) => t.frame_max,
            other => panic!("{other:?}"),
        };
        c.send(AMQPClass::Connection(connection::AMQPMethod::TuneOk(
            connection::TuneOk {
                channel_max: 1,
                frame_max,
                heartbeat: 0,
            },
        )));
        c.frame_max = frame_max;
        c.send(AMQPClass::Connection(connection::AMQPMethod::Open(
            connection::Open {
                virtual_host: "/".into(),
            },
        )));
        c.expect(|m| matches!(m, AMQPClass::Connection(connection::AMQPMethod::OpenOk(_))));
        c.send(AMQPClass::Channel(channel::AMQPMethod::Open(
            channel::Open {},
        )));
        c.expect(|m| matches!(m, AMQPClass::Channel(channel::AMQPMethod::OpenOk(_))));
        c
    }

    fn send(&mut self, m: AMQPClass) {
        let channel = match m {
            AMQPClass::Connection(_) => 0,
            _ => 1,
        };
        let mut out = BytesMut::new();
        Method::Other(m).encode(channel, &mut out);
        self.socket.write_all(&out).unwrap();
    }

    fn recv_frame(&mut self) -> frame::Frame {
        loop {
            if let Some(f) = frame::decode(&mut self.read, 0).unwrap() {
                return f;
            }
            let mut chunk = [0u8; 65536];
            let n = self.socket.read(&mut chunk).expect("RabbitMQ answered");
            assert!(n > 0, "RabbitMQ closed the 0-9-1 connection");
            self.read.put_slice(&chunk[..n]);
        }
    }

    fn recv_method(&mut self) -> Method {
        let f = self.recv_frame();
        assert_eq!(f.kind, FRAME_METHOD, "expected a method frame");
        Method::decode(f.payload).unwrap()
    }

    fn expect(&mut self, what: impl Fn(&AMQPClass) -> bool) {
        match self.recv_method() {
            Method::Other(m) if what(&m) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    fn publish(&mut self, queue: &str, properties: &content::Properties, body: &[u8]) {
        let mut out = BytesMut::new();
        Method::Publish(warren_protocol::method::Publish {
            exchange: Bytes::new(),
            routing_key: Bytes::copy_from_slice(queue.as_bytes()),
            mandatory: false,
            immediate: false,
        })
        .encode(1, &mut out);
        content::encode_header(
            &mut out,
            1,
            CLASS_BASIC,
            body.len() as u64,
            &properties.encode(),
        );
        frame::encode_body(&mut out, 1, body, self.frame_max);
        self.socket.write_all(&out).unwrap();
    }

    /// The next delivery's properties and body.
    fn delivery(&mut self) -> (content::Properties, Bytes) {
        match self.recv_method() {
            Method::Deliver(_) => {}
            other => panic!("{other:?}"),
        }
        let f = self.recv_frame();
        assert_eq!(f.kind, FRAME_HEADER);
        let header = ContentHeader::decode(f.payload).unwrap();
        let mut body = BytesMut::new();
        while (body.len() as u64) < header.body_size {
            let f = self.recv_frame();
            assert_eq!(f.kind, FRAME_BODY);
            body.put_slice(&f.payload);
        }
        (
            content::Properties::decode(&header.properties).unwrap(),
            body.freeze(),
        )
    }
}

/// A stream protocol connection, handshake done.
struct Streams {
    socket: TcpStream,
    read: BytesMut,
}

impl Streams {
    fn connect(addr: &str) -> Streams {
        let socket = TcpStream::connect(addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut s = Streams {
            socket,
            read: BytesMut::new(),
        };
        s.send(&Command::PeerProperties {
            correlation_id: 1,
            properties: vec![],
        });
        s.recv();
        s.send(&Command::SaslHandshake { correlation_id: 2 });
        s.recv();
        s.send(&Command::SaslAuthenticate {
            correlation_id: 3,
            mechanism: "PLAIN".into(),
            data: Bytes::from_static(b"\0guest\0guest"),
        });
        s.recv();
        let tune = s.recv();
        s.send(&tune);
        s.send(&Command::Open {
            correlation_id: 4,
            virtual_host: "/".into(),
        });
        assert!(matches!(
            s.recv(),
            Command::OpenResponse {
                code: RESPONSE_CODE_OK,
                ..
            }
        ));
        s
    }

    fn send(&mut self, c: &Command) {
        let mut out = BytesMut::new();
        stream::encode(&mut out, c);
        self.socket.write_all(&out).unwrap();
    }

    fn recv(&mut self) -> Command {
        loop {
            match stream::decode(&mut self.read, 0).unwrap() {
                Some(Command::Heartbeat) => continue,
                Some(c) => return c,
                None => {}
            }
            let mut chunk = [0u8; 65536];
            let n = self.socket.read(&mut chunk).expect("RabbitMQ answered");
            assert!(n > 0, "RabbitMQ closed the stream connection");
            self.read.put_slice(&chunk[..n]);
        }
    }

    /// Every message stored in `stream`, read from its first chunk until `count` have come.
    fn read_all(&mut self, stream_name: &str, count: usize) -> Vec<Bytes> {
        self.send(&Command::Subscribe {
            correlation_id: 9,
            subscription_id: 1,
            stream: stream_name.into(),
            offset: OffsetSpec::First,
            credit: 100,
            properties: vec![],
        });
        let mut messages = Vec::new();
        while messages.len() < count {
            match self.recv() {
                Command::Response {
                    key: KEY_SUBSCRIBE,
                    code,
                    ..
                } => assert_eq!(code, RESPONSE_CODE_OK),
                Command::Deliver { chunk, .. } => messages.extend(simple_entries(&chunk)),
                other => panic!("{other:?}"),
            }
        }
        messages
    }
}

/// The entries of an osiris chunk (its layout is the store's; only what this test needs):
/// a 48-byte header, then entries of a 31-bit size and the bytes.
fn simple_entries(chunk: &Bytes) -> Vec<Bytes> {
    let records = u32::from_be_bytes(chunk[4..8].try_into().unwrap()) as usize;
    let mut at = 48;
    let mut out = Vec::new();
    for _ in 0..records {
        let head = u32::from_be_bytes(chunk[at..at + 4].try_into().unwrap());
        assert_eq!(
            head >> 31,
            0,
            "0-9-1 and single stream publishes are simple entries"
        );
        let size = head as usize;
        out.push(chunk.slice(at + 4..at + 4 + size));
        at += 4 + size;
    }
    out
}

fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(k), v);
    }
    t
}

fn declare_stream(amqp: &mut Amqp, name: &str) {
    amqp.send(AMQPClass::Queue(queue::AMQPMethod::Declare(
        queue::Declare {
            queue: name.into(),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            nowait: false,
            arguments: table(vec![(
                "x-queue-type",
                AMQPValue::LongString(LongString::from(&b"stream"[..])),
            )]),
        },
    )));
    amqp.expect(|m| matches!(m, AMQPClass::Queue(queue::AMQPMethod::DeclareOk(_))));
}

fn addrs() -> Option<(String, String)> {
    match (
        std::env::var("WARREN_STREAM_TEST_ADDR"),
        std::env::var("WARREN_STREAM_TEST_AMQP_ADDR"),
    ) {
        (Ok(s), Ok(a)) => Some((s, a)),
        _ => {
            eprintln!(
                "skipping: WARREN_STREAM_TEST_ADDR and WARREN_STREAM_TEST_AMQP_ADDR are not both set"
            );
            None
        }
    }
}

#[test]
fn messages_published_over_091_are_stored_as_from_amqp091_makes_them() {
    let Some((stream_addr, amqp_addr)) = addrs() else {
        return;
    };
    let mut amqp = Amqp::connect(&amqp_addr);
    let name = format!("warren-091-in-{}", std::process::id());
    declare_stream(&mut amqp, &name);

    let long = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    let mut rich = content::Properties {
        content_type: Some(Bytes::from_static(b"application/json")),
        content_encoding: Some(Bytes::from_static(b"gzip")),
        delivery_mode: Some(2),
        priority: Some(4),
        correlation_id: Some(Bytes::from_static(b"corr-1")),
        reply_to: Some(Bytes::from_static(b"replies")),
        message_id: Some(Bytes::from_static(b"id-1")),
        timestamp: Some(1_700_000_123),
        kind: Some(Bytes::from_static(b"order.created")),
        user_id: Some(Bytes::from_static(b"guest")),
        app_id: Some(Bytes::from_static(b"shop")),
        ..content::Properties::default()
    };
    rich.set_headers_table(Some(&table(vec![
        ("text", long("value")),
        ("i8", AMQPValue::ShortShortInt(-3)),
        ("u8", AMQPValue::ShortShortUInt(200)),
        ("i16", AMQPValue::ShortInt(-300)),
        ("i32", AMQPValue::LongInt(-70000)),
        ("u32", AMQPValue::LongUInt(4_000_000_000)),
        ("i64", AMQPValue::LongLongInt(-5_000_000_000)),
        ("f64", AMQPValue::Double(2.5)),
        ("bool", AMQPValue::Boolean(true)),
        ("when", AMQPValue::Timestamp(1_600_000_000)),
        ("void", AMQPValue::Void),
        (
            "nested",
            AMQPValue::FieldTable(table(vec![("a", long("b"))])),
        ),
        ("list", AMQPValue::FieldArray(vec![long("x")].into())),
    ])));
    let plain = content::Properties::default();
    let expiring = content::Properties {
        expiration: Some(Bytes::from_static(b"60000")),
        ..content::Properties::default()
    };
    let published = [
        (rich, Bytes::from_static(b"{\"n\":1}")),
        (plain, Bytes::from_static(b"")),
        (expiring, Bytes::from_static(b"expires")),
    ];
    for (p, body) in &published {
        amqp.publish(&name, p, body);
    }

    let mut streams = Streams::connect(&stream_addr);
    let stored = streams.read_all(&name, published.len());
    for ((p, body), stored) in published.iter().zip(&stored) {
        let ours = from_amqp091(b"", name.as_bytes(), p, body).unwrap();
        let theirs = Message::decode(stored.clone()).unwrap();
        assert_eq!(
            Message::decode(ours.clone()).unwrap(),
            theirs,
            "RabbitMQ stored {stored:02x?}"
        );
        eprintln!(
            "0-9-1 publish of {} body bytes: RabbitMQ stored {} bytes, ours {} ({})",
            body.len(),
            stored.len(),
            ours.len(),
            if ours == stored {
                "identical"
            } else {
                "same sections, other encodings"
            }
        );
    }
}

#[test]
fn messages_published_as_amqp_1_0_reach_091_consumers_as_to_amqp091_gives_them() {
    let Some((stream_addr, amqp_addr)) = addrs() else {
        return;
    };
    let mut amqp = Amqp::connect(&amqp_addr);
    let name = format!("warren-10-out-{}", std::process::id());
    declare_stream(&mut amqp, &name);

    let uuid = [7u8; 16];
    let messages = [
        Message {
            message_annotations: Some(vec![
                (Value::Symbol("x-basic-priority".into()), Value::Ubyte(3)),
                (
                    Value::Symbol("x-basic-delivery-mode".into()),
                    Value::Ubyte(2),
                ),
            ]),
            properties: Some(Properties {
                message_id: Some(Value::Uuid(uuid)),
                correlation_id: Some(Value::Ulong(99)),
                user_id: Some(Bytes::from_static(b"guest")),
                reply_to: Some("replies".into()),
                content_type: Some("text/plain".into()),
                creation_time: Some(1_700_000_000_999),
                subject: Some("3.10 does not carry subjects".into()),
                ..Properties::default()
            }),
            application_properties: Some(vec![
                ("x-basic-type".into(), Value::String("typed".into())),
                ("x-basic-app-id".into(), Value::String("app".into())),
                ("s".into(), Value::String("v".into())),
                ("n".into(), Value::Long(-12)),
                ("b".into(), Value::Bool(false)),
                ("u".into(), Value::Uint(5)),
                ("t".into(), Value::Timestamp(1_600_000_000_500)),
                ("bin".into(), Value::Binary(Bytes::from_static(b"\x01\x02"))),
            ]),
            body: Body::Data(vec![Bytes::from_static(b"hello")]),
            ..Message::default()
        },
        Message {
            message_annotations: Some(vec![(
                Value::Symbol("x-basic-expiration".into()),
                Value::String("60000".into()),
            )]),
            properties: Some(Properties {
                message_id: Some(Value::Binary(Bytes::from_static(b"\xff\x00raw"))),
                correlation_id: Some(Value::String("c".repeat(300))),
                ..Properties::default()
            }),
            body: Body::Data(vec![Bytes::from_static(b"binary id, long correlation id")]),
            ..Message::default()
        },
    ];
    let mut streams = Streams::connect(&stream_addr);
    streams.send(&Command::DeclarePublisher {
        correlation_id: 5,
        publisher_id: 0,
        reference: String::new(),
        stream: name.clone(),
    });
    assert!(matches!(
        streams.recv(),
        Command::Response {
            code: RESPONSE_CODE_OK,
            ..
        }
    ));
    streams.send(&Command::Publish {
        publisher_id: 0,
        messages: messages
            .iter()
            .enumerate()
            .map(|(i, m)| PublishedMessage {
                sub_batch: None,
                publishing_id: i as u64,
                filter_value: None,
                message: m.to_bytes(),
            })
            .collect(),
    });
    let mut confirmed = 0;
    while confirmed < messages.len() {
        match streams.recv() {
            Command::PublishConfirm { publishing_ids, .. } => confirmed += publishing_ids.len(),
            other => panic!("{other:?}"),
        }
    }

    amqp.send(AMQPClass::Basic(basic::AMQPMethod::Qos(basic::Qos {
        prefetch_count: 10,
        global: false,
    })));
    amqp.expect(|m| matches!(m, AMQPClass::Basic(basic::AMQPMethod::QosOk(_))));
    amqp.send(AMQPClass::Basic(basic::AMQPMethod::Consume(
        basic::Consume {
            queue: name.as_str().into(),
            consumer_tag: "c".into(),
            no_local: false,
            no_ack: false,
            exclusive: false,
            nowait: false,
            arguments: table(vec![(
                "x-stream-offset",
                AMQPValue::LongString(LongString::from(&b"first"[..])),
            )]),
        },
    )));
    amqp.expect(|m| matches!(m, AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(_))));
    for (i, m) in messages.iter().enumerate() {
        let (mut got, body) = amqp.delivery();
        // RabbitMQ adds each delivery's offset; the rest is the mapping.
        let mut headers = got.headers_table().unwrap().unwrap_or_default();
        assert_eq!(
            headers.inner().get("x-stream-offset"),
            Some(&AMQPValue::LongLongInt(i as i64))
        );
        let mut without = FieldTable::default();
        for (k, v) in headers
            .inner()
            .iter()
            .filter(|(k, _)| k.as_str() != "x-stream-offset")
        {
            without.insert(k.clone(), v.clone());
        }
        headers = without;
        got.set_headers_table((!headers.inner().is_empty()).then_some(&headers));
        let (want, want_body) = to_amqp091(m);
        assert_eq!(body, want_body, "message {i}");
        assert_eq!(
            got.headers_table().unwrap(),
            want.headers_table().unwrap(),
            "message {i}"
        );
        assert_eq!(
            content::Properties {
                headers: None,
                ..got
            },
            content::Properties {
                headers: None,
                ..want
            },
            "message {i}"
        );
    }
}
