//! Our stream codec in a real conversation with RabbitMQ 3.10's stream plugin: handshake, create,
//! metadata, declare a publisher, publish and be confirmed, deduplication's sequence, subscribe,
//! take the chunk delivered, credit errors, and the close RabbitMQ sends for an unknown frame.
//!
//! Needs `WARREN_STREAM_TEST_ADDR` pointing at a stream port, e.g. after
//! `RMQ_PLUGINS=rabbitmq_stream ../shared/rabbitmq/rabbitmq.sh start` it is 127.0.0.1:5560;
//! without it the test prints why it skipped, as the repo's other tests against a broker do.

use bytes::{BufMut, Bytes, BytesMut};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{self, Command, OffsetSpec, PublishedMessage};

struct Conn {
    socket: TcpStream,
    read: BytesMut,
    frame_max: u32,
}

impl Conn {
    fn send(&mut self, c: &Command) {
        let mut out = BytesMut::new();
        stream::encode(&mut out, c);
        self.socket.write_all(&out).unwrap();
    }

    /// The next command from the server, heartbeats skipped.
    fn recv(&mut self) -> Command {
        loop {
            match stream::decode(&mut self.read, self.frame_max) {
                Ok(Some(Command::Heartbeat)) => continue,
                Ok(Some(c)) => return c,
                Ok(None) => {}
                Err(e) => panic!("RabbitMQ sent what our decoder refuses: {e}"),
            }
            let mut chunk = [0u8; 65536];
            let n = self
                .socket
                .read(&mut chunk)
                .expect("RabbitMQ answered within 10 s");
            assert!(n > 0, "RabbitMQ closed the connection");
            self.read.put_slice(&chunk[..n]);
        }
    }

    fn expect_ok(&mut self, key: u16, correlation_id: u32) {
        match self.recv() {
            Command::Response {
                key: k,
                correlation_id: c,
                code,
            } if k == key && c == correlation_id => {
                assert_eq!(code, RESPONSE_CODE_OK, "{}", response_code_name(code))
            }
            other => panic!("expected the response to key {key:#x}, got {other:?}"),
        }
    }
}

/// An AMQP 1.0 message of one data section, as stream clients publish them.
fn amqp10_data(body: &[u8]) -> Bytes {
    let mut m = BytesMut::new();
    m.put_slice(&[0x00, 0x53, 0x75, 0xb0]); // descriptor 0x75 (data), vbin32
    m.put_u32(body.len() as u32);
    m.put_slice(body);
    m.freeze()
}

#[test]
fn a_whole_stream_conversation_with_rabbitmq() {
    let Ok(addr) = std::env::var("WARREN_STREAM_TEST_ADDR") else {
        eprintln!("skipping: WARREN_STREAM_TEST_ADDR is not set (a RabbitMQ stream port)");
        return;
    };
    let socket = TcpStream::connect(&addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut conn = Conn {
        socket,
        read: BytesMut::new(),
        frame_max: FRAME_MAX_DEFAULT_BYTES,
    };

    conn.send(&Command::PeerProperties {
        correlation_id: 1,
        properties: vec![("product".into(), "warren stream codec test".into())],
    });
    match conn.recv() {
        Command::PeerPropertiesResponse {
            correlation_id: 1,
            code: RESPONSE_CODE_OK,
            properties,
        } => assert!(
            properties.iter().any(|(k, _)| k == "version"),
            "{properties:?}"
        ),
        other => panic!("{other:?}"),
    }
    conn.send(&Command::SaslHandshake { correlation_id: 2 });
    match conn.recv() {
        Command::SaslHandshakeResponse {
            correlation_id: 2,
            code: RESPONSE_CODE_OK,
            mechanisms,
        } => assert!(mechanisms.iter().any(|m| m == "PLAIN"), "{mechanisms:?}"),
        other => panic!("{other:?}"),
    }
    conn.send(&Command::SaslAuthenticate {
        correlation_id: 3,
        mechanism: "PLAIN".into(),
        data: Bytes::from_static(b"\0guest\0guest"),
    });
    match conn.recv() {
        Command::SaslAuthenticateResponse {
            correlation_id: 3,
            code: RESPONSE_CODE_OK,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    // The server proposes; the client answers with what it agrees to.
    let (frame_max, heartbeat_s) = match conn.recv() {
        Command::Tune {
            frame_max,
            heartbeat_s,
        } => (frame_max, heartbeat_s),
        other => panic!("{other:?}"),
    };
    assert!(frame_max > 0, "RabbitMQ offers a frame_max");
    conn.frame_max = frame_max;
    conn.send(&Command::Tune {
        frame_max,
        heartbeat_s,
    });
    conn.send(&Command::Open {
        correlation_id: 4,
        virtual_host: "/".into(),
    });
    match conn.recv() {
        Command::OpenResponse {
            correlation_id: 4,
            code: RESPONSE_CODE_OK,
            properties,
        } => assert!(
            properties.iter().any(|(k, _)| k == "advertised_host"),
            "{properties:?}"
        ),
        other => panic!("{other:?}"),
    }

    let name = format!("warren-codec-{}", std::process::id());
    conn.send(&Command::Create {
        correlation_id: 5,
        stream: name.clone(),
        arguments: vec![("max-length-bytes".into(), "10000000".into())],
    });
    conn.expect_ok(KEY_CREATE, 5);
    // Declaring it again: the same arguments are "already exists", others a failed precondition.
    conn.send(&Command::Create {
        correlation_id: 6,
        stream: name.clone(),
        arguments: vec![("max-length-bytes".into(), "10000000".into())],
    });
    assert_eq!(
        conn.recv(),
        Command::Response {
            key: KEY_CREATE,
            correlation_id: 6,
            code: RESPONSE_CODE_STREAM_ALREADY_EXISTS
        }
    );
    conn.send(&Command::Create {
        correlation_id: 6,
        stream: name.clone(),
        arguments: vec![],
    });
    assert_eq!(
        conn.recv(),
        Command::Response {
            key: KEY_CREATE,
            correlation_id: 6,
            code: RESPONSE_CODE_PRECONDITION_FAILED
        }
    );
    conn.send(&Command::Metadata {
        correlation_id: 7,
        streams: vec![name.clone(), "warren-codec-missing".into()],
    });
    match conn.recv() {
        Command::MetadataResponse {
            correlation_id: 7,
            brokers,
            streams,
        } => {
            assert_eq!(brokers.len(), 1, "{brokers:?}");
            let ours = streams.iter().find(|s| s.stream == name).unwrap();
            assert_eq!(ours.code, RESPONSE_CODE_OK);
            assert_eq!(ours.leader, brokers[0].reference);
            let missing = streams.iter().find(|s| s.stream != name).unwrap();
            assert_eq!(missing.code, RESPONSE_CODE_STREAM_DOES_NOT_EXIST);
        }
        other => panic!("{other:?}"),
    }

    conn.send(&Command::DeclarePublisher {
        correlation_id: 8,
        publisher_id: 1,
        reference: "warren-publisher".into(),
        stream: name.clone(),
    });
    conn.expect_ok(KEY_DECLARE_PUBLISHER, 8);
    let bodies: Vec<Vec<u8>> = (1..=3)
        .map(|i| format!("message {i}").into_bytes())
        .collect();
    conn.send(&Command::Publish {
        publisher_id: 1,
        messages: bodies
            .iter()
            .enumerate()
            .map(|(i, b)| PublishedMessage {
                sub_batch: None,
                publishing_id: i as u64 + 1,
                filter_value: None,
                message: amqp10_data(b),
            })
            .collect(),
    });
    let mut confirmed = Vec::new();
    while confirmed.len() < 3 {
        match conn.recv() {
            Command::PublishConfirm {
                publisher_id: 1,
                publishing_ids,
            } => confirmed.extend(publishing_ids),
            other => panic!("{other:?}"),
        }
    }
    confirmed.sort_unstable();
    assert_eq!(confirmed, vec![1, 2, 3]);
    conn.send(&Command::QueryPublisherSequence {
        correlation_id: 9,
        reference: "warren-publisher".into(),
        stream: name.clone(),
    });
    assert_eq!(
        conn.recv(),
        Command::QueryPublisherSequenceResponse {
            correlation_id: 9,
            code: RESPONSE_CODE_OK,
            sequence: 3
        }
    );

    conn.send(&Command::Subscribe {
        correlation_id: 10,
        subscription_id: 7,
        stream: name.clone(),
        offset: OffsetSpec::First,
        credit: 10,
        properties: vec![],
    });
    conn.expect_ok(KEY_SUBSCRIBE, 10);
    let mut records = 0;
    let mut chunks = Vec::new();
    while records < 3 {
        match conn.recv() {
            Command::Deliver {
                subscription_id: 7,
                committed_offset: None,
                chunk,
            } => {
                // Records are bytes 4-7 of osiris's chunk header, behind magic, type, entries.
                records += u32::from_be_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
                chunks.push(chunk);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(records, 3);
    for b in &bodies {
        let message = amqp10_data(b);
        assert!(
            chunks
                .iter()
                .any(|c| c.windows(message.len()).any(|w| w == message)),
            "a chunk carries {:?} as it was published",
            String::from_utf8_lossy(b)
        );
    }

    conn.send(&Command::Credit {
        subscription_id: 99,
        credit: 1,
    });
    assert_eq!(
        conn.recv(),
        Command::CreditResponse {
            code: RESPONSE_CODE_SUBSCRIPTION_ID_DOES_NOT_EXIST,
            subscription_id: 99
        }
    );
    conn.send(&Command::Unsubscribe {
        correlation_id: 11,
        subscription_id: 7,
    });
    conn.expect_ok(KEY_UNSUBSCRIBE, 11);
    conn.send(&Command::Delete {
        correlation_id: 12,
        stream: name.clone(),
    });
    loop {
        match conn.recv() {
            // The deleted stream's publisher hears about it too.
            Command::MetadataUpdate { .. } => continue,
            Command::Response {
                key: KEY_DELETE,
                correlation_id: 12,
                code,
            } => {
                assert_eq!(code, RESPONSE_CODE_OK);
                break;
            }
            other => panic!("{other:?}"),
        }
    }

    // A key no command has: RabbitMQ closes with UNKNOWN_FRAME, and our decoder reads its close.
    let mut unknown = BytesMut::new();
    unknown.put_u32(4);
    unknown.put_u16(0x0077);
    unknown.put_u16(1);
    conn.socket.write_all(&unknown).unwrap();
    loop {
        match conn.recv() {
            Command::MetadataUpdate { .. } => continue,
            Command::Close { code, reason, .. } => {
                assert_eq!(code, RESPONSE_CODE_UNKNOWN_FRAME, "{reason}");
                break;
            }
            other => panic!("{other:?}"),
        }
    }
}
