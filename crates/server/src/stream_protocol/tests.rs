//! The connection's state machine driven without a socket: commands in, the commands it sends
//! read back from its channel, on a node's shared state with a data dir of its own.

use super::connection::{Connection, Flow, Peer};
use crate::node::config::ServerConfig;
use crate::Shared;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use warren_broker::broker::Broker;
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{frame, Command, OffsetSpec, PublishedMessage};

struct Client {
    conn: Connection,
    rx: mpsc::UnboundedReceiver<Command>,
    _control: mpsc::UnboundedReceiver<super::registry::Control>,
    shared: Arc<Shared>,
    dir: std::path::PathBuf,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.conn.end();
        self.shared.streams.close_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn client(what: &str) -> Client {
    let dir = std::env::temp_dir().join(format!(
        "warren-stream-proto-{what}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let config = ServerConfig {
        data_dir: dir.clone(),
        ..ServerConfig::default()
    };
    let shared = Shared::standalone(config, Arc::new(Broker::new()));
    let (out, rx) = mpsc::unbounded_channel();
    let (control, control_rx) = mpsc::unbounded_channel();
    let who = Peer {
        peer: "127.0.0.1:40000".parse().unwrap(),
        local: "127.0.0.1:5552".parse().unwrap(),
        tls: false,
    };
    Client {
        conn: Connection::new(shared.clone(), who, out, control),
        rx,
        _control: control_rx,
        shared,
        dir,
    }
}

impl Client {
    /// What the connection sent so far.
    fn sent(&mut self) -> Vec<Command> {
        let mut out = Vec::new();
        while let Ok(c) = self.rx.try_recv() {
            out.push(c);
        }
        out
    }

    /// The next command it sends, waiting for it (a confirm, a chunk).
    async fn next(&mut self) -> Command {
        tokio::time::timeout(Duration::from_secs(10), self.rx.recv())
            .await
            .expect("the connection sent nothing in 10 s")
            .expect("channel open")
    }

    async fn call(&mut self, c: Command) -> Vec<Command> {
        assert_eq!(self.conn.handle(c).await, Flow::Continue);
        self.sent()
    }

    async fn open(&mut self, user: &str, password: &str) -> Vec<Command> {
        let peer = self
            .call(Command::PeerProperties {
                correlation_id: 1,
                properties: vec![("product".into(), "test".into())],
            })
            .await;
        assert!(matches!(
            &peer[..],
            [Command::PeerPropertiesResponse { code: RESPONSE_CODE_OK, properties, .. }]
                if properties.iter().any(|(k, v)| k == "version" && v.starts_with("3.11"))
        ));
        let hs = self
            .call(Command::SaslHandshake { correlation_id: 2 })
            .await;
        assert!(
            matches!(&hs[..], [Command::SaslHandshakeResponse { mechanisms, .. }]
            if mechanisms.iter().any(|m| m == "PLAIN"))
        );
        let mut data = vec![0u8];
        data.extend_from_slice(user.as_bytes());
        data.push(0);
        data.extend_from_slice(password.as_bytes());
        let flow = self
            .conn
            .handle(Command::SaslAuthenticate {
                correlation_id: 3,
                mechanism: "PLAIN".into(),
                data: Bytes::from(data),
            })
            .await;
        let sent = self.sent();
        if flow == Flow::Close {
            return sent;
        }
        assert!(
            matches!(
                &sent[..],
                [
                    Command::SaslAuthenticateResponse {
                        code: RESPONSE_CODE_OK,
                        ..
                    },
                    Command::Tune {
                        frame_max: FRAME_MAX_DEFAULT_BYTES,
                        heartbeat_s: 60
                    },
                ]
            ),
            "{sent:?}"
        );
        self.call(Command::Tune {
            frame_max: 65536,
            heartbeat_s: 20,
        })
        .await;
        assert_eq!(self.conn.frame_max(), 65536);
        assert_eq!(self.conn.heartbeat_s(), 20);
        let _ = self
            .conn
            .handle(Command::Open {
                correlation_id: 4,
                virtual_host: "/".into(),
            })
            .await;
        self.sent()
    }

    async fn create(&mut self, stream: &str, arguments: &[(&str, &str)]) -> u16 {
        let sent = self
            .call(Command::Create {
                correlation_id: 10,
                stream: stream.into(),
                arguments: arguments
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
            .await;
        match &sent[..] {
            [Command::Response {
                key: KEY_CREATE,
                code,
                ..
            }] => *code,
            other => panic!("create answered {other:?}"),
        }
    }
}

fn code_of(sent: &[Command]) -> u16 {
    match sent {
        [Command::Response { code, .. }] => *code,
        other => panic!("expected one response, got {other:?}"),
    }
}

#[tokio::test]
async fn the_handshake_opens_the_vhost_and_advertises_the_address_reached() {
    let mut c = client("handshake");
    let sent = c.open("guest", "guest").await;
    assert!(c.conn.is_open());
    assert!(
        matches!(&sent[..], [Command::OpenResponse { code: RESPONSE_CODE_OK, properties, .. }]
        if properties.contains(&("advertised_host".into(), "127.0.0.1".into()))
            && properties.contains(&("advertised_port".into(), "5552".into())))
    );
}

#[tokio::test]
async fn a_wrong_password_is_an_authentication_failure_and_closes() {
    let mut c = client("bad-password");
    let sent = c.open("guest", "nope").await;
    assert!(matches!(
        &sent[..],
        [Command::SaslAuthenticateResponse {
            code: RESPONSE_CODE_AUTHENTICATION_FAILURE,
            ..
        }]
    ));
    assert!(!c.conn.is_open());
}

#[tokio::test]
async fn a_missing_vhost_is_a_virtual_host_access_failure() {
    let mut c = client("vhost");
    c.call(Command::PeerProperties {
        correlation_id: 1,
        properties: vec![],
    })
    .await;
    c.call(Command::SaslAuthenticate {
        correlation_id: 2,
        mechanism: "PLAIN".into(),
        data: Bytes::from_static(b"\0guest\0guest"),
    })
    .await;
    c.call(Command::Tune {
        frame_max: 0,
        heartbeat_s: 0,
    })
    .await;
    assert_eq!(
        c.conn.frame_max(),
        FRAME_MAX_DEFAULT_BYTES,
        "0 is no limit: ours stays"
    );
    let flow = c
        .conn
        .handle(Command::Open {
            correlation_id: 3,
            virtual_host: "nowhere".into(),
        })
        .await;
    assert_eq!(flow, Flow::Close);
    assert!(matches!(
        &c.sent()[..],
        [Command::OpenResponse {
            code: RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE,
            ..
        }]
    ));
}

#[tokio::test]
async fn a_command_before_authentication_closes_with_unknown_frame() {
    let mut c = client("early");
    c.call(Command::PeerProperties {
        correlation_id: 1,
        properties: vec![],
    })
    .await;
    let flow = c
        .conn
        .handle(Command::Create {
            correlation_id: 2,
            stream: "s".into(),
            arguments: vec![],
        })
        .await;
    assert_eq!(flow, Flow::Close);
    assert!(matches!(
        &c.sent()[..],
        [Command::Close {
            code: RESPONSE_CODE_UNKNOWN_FRAME,
            ..
        }]
    ));
}

#[tokio::test]
async fn frames_over_the_negotiated_maximum_and_unknown_keys_get_their_codes() {
    let mut c = client("frames");
    c.open("guest", "guest").await;
    // A frame of 100 KB against the 64 KiB tuned: refused from its size prefix alone.
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&100_000u32.to_be_bytes());
    let e = frame::decode(&mut buf, c.conn.frame_max()).unwrap_err();
    assert_eq!(c.conn.bad_frame(&e), Flow::Close);
    assert!(matches!(
        &c.sent()[..],
        [Command::Close {
            code: RESPONSE_CODE_FRAME_TOO_LARGE,
            ..
        }]
    ));
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&[0, 0, 0, 4, 0x00, 0x7f, 0, 1]);
    let e = frame::decode(&mut buf, c.conn.frame_max()).unwrap_err();
    c.conn.bad_frame(&e);
    assert!(matches!(
        &c.sent()[..],
        [Command::Close {
            code: RESPONSE_CODE_UNKNOWN_FRAME,
            ..
        }]
    ));
}

#[tokio::test]
async fn create_says_exists_for_the_same_arguments_and_precondition_failed_for_others() {
    let mut c = client("create");
    c.open("guest", "guest").await;
    assert_eq!(
        c.create("s", &[("max-length-bytes", "1000")]).await,
        RESPONSE_CODE_OK
    );
    assert_eq!(
        c.create("s", &[("max-length-bytes", "1000")]).await,
        RESPONSE_CODE_STREAM_ALREADY_EXISTS
    );
    assert_eq!(
        c.create("s", &[("max-length-bytes", "2000")]).await,
        RESPONSE_CODE_PRECONDITION_FAILED
    );
    assert_eq!(
        c.create("t", &[("max-age", "bogus")]).await,
        RESPONSE_CODE_PRECONDITION_FAILED
    );
    let deleted = c
        .call(Command::Delete {
            correlation_id: 11,
            stream: "s".into(),
        })
        .await;
    assert_eq!(code_of(&deleted), RESPONSE_CODE_OK);
    let again = c
        .call(Command::Delete {
            correlation_id: 12,
            stream: "s".into(),
        })
        .await;
    assert_eq!(code_of(&again), RESPONSE_CODE_STREAM_DOES_NOT_EXIST);
}

#[tokio::test]
async fn published_messages_are_confirmed_deduplicated_and_delivered_as_chunks() {
    let mut c = client("publish");
    c.open("guest", "guest").await;
    assert_eq!(c.create("s", &[]).await, RESPONSE_CODE_OK);
    let declared = c
        .call(Command::DeclarePublisher {
            correlation_id: 20,
            publisher_id: 1,
            reference: "app".into(),
            stream: "s".into(),
        })
        .await;
    assert_eq!(code_of(&declared), RESPONSE_CODE_OK);
    let message = |id: u64| PublishedMessage {
        publishing_id: id,
        filter_value: None,
        message: Bytes::from(format!("m{id}")),
    };
    c.call(Command::Publish {
        publisher_id: 1,
        messages: (1..=3).map(message).collect(),
    })
    .await;
    let mut confirmed = Vec::new();
    while confirmed.len() < 3 {
        c.conn.settle_confirms();
        match tokio::time::timeout(Duration::from_millis(100), c.rx.recv()).await {
            Ok(Some(Command::PublishConfirm {
                publisher_id: 1,
                publishing_ids,
            })) => confirmed.extend(publishing_ids),
            Ok(other) => panic!("{other:?}"),
            Err(_) => {}
        }
    }
    assert_eq!(confirmed, vec![1, 2, 3]);
    // A resend of 2 and 3 with 4: confirmed all, 4 alone stored.
    c.call(Command::Publish {
        publisher_id: 1,
        messages: (2..=4).map(message).collect(),
    })
    .await;
    let mut confirmed = Vec::new();
    while confirmed.len() < 3 {
        c.conn.settle_confirms();
        if let Ok(Some(Command::PublishConfirm { publishing_ids, .. })) =
            tokio::time::timeout(Duration::from_millis(100), c.rx.recv()).await
        {
            confirmed.extend(publishing_ids)
        }
    }
    assert_eq!(confirmed, vec![2, 3, 4]);
    let seq = c
        .call(Command::QueryPublisherSequence {
            correlation_id: 21,
            reference: "app".into(),
            stream: "s".into(),
        })
        .await;
    assert!(matches!(
        &seq[..],
        [Command::QueryPublisherSequenceResponse {
            code: RESPONSE_CODE_OK,
            sequence: 4,
            ..
        }]
    ));

    let subscribed = c
        .call(Command::Subscribe {
            correlation_id: 22,
            subscription_id: 0,
            stream: "s".into(),
            offset: OffsetSpec::First,
            credit: 10,
            properties: vec![],
        })
        .await;
    assert_eq!(code_of(&subscribed), RESPONSE_CODE_OK);
    let mut bodies = Vec::new();
    while bodies.len() < 4 {
        match c.next().await {
            Command::Deliver {
                subscription_id: 0,
                committed_offset: None,
                chunk,
            } => {
                let chunk = warren_store::stream::Chunk::parse(&chunk).expect("a whole chunk");
                for (_, e) in chunk.entries() {
                    if let warren_store::stream::Entry::Simple(b) = e {
                        bodies.push(String::from_utf8(b.to_vec()).unwrap());
                    }
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(bodies, ["m1", "m2", "m3", "m4"]);
}

#[tokio::test]
async fn publishing_through_an_undeclared_publisher_is_a_publish_error() {
    let mut c = client("undeclared");
    c.open("guest", "guest").await;
    let sent = c
        .call(Command::Publish {
            publisher_id: 9,
            messages: vec![PublishedMessage {
                publishing_id: 5,
                filter_value: None,
                message: Bytes::from_static(b"x"),
            }],
        })
        .await;
    assert_eq!(
        sent,
        vec![Command::PublishError {
            publisher_id: 9,
            errors: vec![(5, RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST)],
        }]
    );
}

#[tokio::test]
async fn stored_offsets_are_answered_and_a_reference_without_one_says_no_offset() {
    let mut c = client("offsets");
    c.open("guest", "guest").await;
    assert_eq!(c.create("s", &[]).await, RESPONSE_CODE_OK);
    let query = |id| Command::QueryOffset {
        correlation_id: id,
        reference: "reader".into(),
        stream: "s".into(),
    };
    let none = c.call(query(30)).await;
    assert!(matches!(
        &none[..],
        [Command::QueryOffsetResponse {
            code: RESPONSE_CODE_NO_OFFSET,
            ..
        }]
    ));
    let nothing = c
        .call(Command::StoreOffset {
            reference: "reader".into(),
            stream: "s".into(),
            offset: 7,
        })
        .await;
    assert!(nothing.is_empty(), "StoreOffset has no response");
    let stored = c.call(query(31)).await;
    assert!(matches!(
        &stored[..],
        [Command::QueryOffsetResponse {
            code: RESPONSE_CODE_OK,
            offset: 7,
            ..
        }]
    ));
}
