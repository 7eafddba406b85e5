//! What a stream client relies on across a crash of the node, proved on warren nodes these tests
//! start and SIGKILL themselves (WARREN_BIN): a confirmed message is never lost, and a named
//! publisher's sequence (deduplication) and a consumer's stored offset come back. Against
//! RabbitMQ (WARREN_TEST_BROKER=rabbitmq) they are skipped: its node is not this suite's to
//! kill. Also the protocol's answers to frames no client sends (bad sizes, unknown keys).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::{Client, ClientOptions, Environment};

const WAIT: Duration = Duration::from_secs(20);

/// A warren node of the test's own: its ports and data dir stay across restarts.
struct Node {
    bin: String,
    dir: PathBuf,
    amqp: u16,
    stream: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The node under test, or `None` (with the reason printed) where this suite cannot start one.
fn node(what: &str) -> Option<Node> {
    if std::env::var("WARREN_TEST_BROKER").as_deref() == Ok("rabbitmq") {
        eprintln!("skipped: the RabbitMQ node is not this suite's to kill");
        return None;
    }
    let Ok(bin) = std::env::var("WARREN_BIN") else {
        eprintln!("skipped: WARREN_BIN names no warren binary to start");
        return None;
    };
    let dir = std::env::temp_dir().join(format!(
        "warren-rust-stream-{what}-{}-{}",
        std::process::id(),
        free_port()
    ));
    let mut n = Node {
        bin,
        dir,
        amqp: free_port(),
        stream: free_port(),
        child: None,
    };
    n.start();
    Some(n)
}

impl Node {
    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .unwrap();
        let child = Command::new(&self.bin)
            .args(["server", "--listen"])
            .arg(format!("127.0.0.1:{}", self.amqp))
            .arg("--stream-listen")
            .arg(format!("127.0.0.1:{}", self.stream))
            .args(["--management-listen", "none", "--data-dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start warren");
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        while TcpStream::connect(("127.0.0.1", self.stream)).is_err() {
            assert!(Instant::now() < deadline, "the stream listener never came up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: nothing is flushed, nothing is closed.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    async fn environment(&self) -> Environment {
        Environment::builder()
            .host("127.0.0.1")
            .port(self.stream)
            .build()
            .await
            .expect("connect to the stream listener")
    }

    async fn client(&self) -> Client {
        Client::connect(
            ClientOptions::builder()
                .host("127.0.0.1")
                .port(self.stream)
                .build(),
        )
        .await
        .expect("connect")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("log"));
    }
}

async fn read_all(env: &Environment, stream: &str, want: usize) -> Vec<String> {
    let mut consumer = env
        .consumer()
        .offset(OffsetSpecification::First)
        .build(stream)
        .await
        .expect("consumer");
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, consumer.next()).await {
            Ok(Some(Ok(d))) => got.push(
                String::from_utf8_lossy(d.message().data().unwrap_or_default()).into_owned(),
            ),
            _ => break,
        }
    }
    // Anything beyond what was owed (a duplicate) shows here.
    while let Ok(Some(Ok(d))) =
        tokio::time::timeout(Duration::from_millis(500), consumer.next()).await
    {
        got.push(String::from_utf8_lossy(d.message().data().unwrap_or_default()).into_owned());
    }
    let _ = consumer.handle().close().await;
    got
}

#[tokio::test]
async fn deduplication_and_stored_offsets_survive_a_sigkill() {
    let Some(mut node) = node("dedup-restart") else {
        return;
    };
    let env = node.environment().await;
    env.stream_creator().create("s").await.unwrap();
    let mut p = env.producer().name("app").build("s").await.unwrap();
    for id in 1..=30u64 {
        let m = Message::builder()
            .body(format!("m{id}"))
            .publising_id(id)
            .build();
        assert!(p.send_with_confirm(m).await.unwrap().confirmed());
    }
    let c = node.client().await;
    c.store_offset("reader", "s", 17).await.unwrap();
    let deadline = Instant::now() + WAIT;
    while c.query_offset("reader".into(), "s").await.ok() != Some(17) {
        assert!(Instant::now() < deadline, "offset 17 never stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A StoreOffset has no answer: a publish confirmed after it says that the round holding
    // it was synced too.
    let m = Message::builder().body("m31").publising_id(31).build();
    assert!(p.send_with_confirm(m).await.unwrap().confirmed());
    drop(p);
    drop(c);
    drop(env);
    node.kill();
    node.start();

    let env = node.environment().await;
    let c = node.client().await;
    assert_eq!(c.query_publisher_sequence("app", "s").await.unwrap(), 31);
    assert_eq!(c.query_offset("reader".into(), "s").await.unwrap(), 17);
    // The producer resends from 25 after its crash: 25..=31 are confirmed and dropped.
    let mut p = env.producer().name("app").build("s").await.unwrap();
    for id in 25..=40u64 {
        let m = Message::builder()
            .body(format!("again{id}"))
            .publising_id(id)
            .build();
        let st = p.send_with_confirm(m).await.unwrap();
        assert!(st.confirmed(), "resent id {id}: {:?}", st.status());
    }
    let mut expected: Vec<String> = (1..=31).map(|i| format!("m{i}")).collect();
    expected.extend((32..=40).map(|i| format!("again{i}")));
    assert_eq!(read_all(&env, "s", expected.len()).await, expected);
}

#[tokio::test]
async fn confirmed_messages_survive_a_sigkill_under_confirming_publishers() {
    let Some(mut node) = node("sigkill") else {
        return;
    };
    let env = node.environment().await;
    env.stream_creator().create("s").await.unwrap();
    let confirmed = Arc::new(Mutex::new(HashSet::new()));
    let mut tasks = Vec::new();
    for publisher in 0..4 {
        let env = env.clone();
        let confirmed = confirmed.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(p) = env.producer().build("s").await else {
                return;
            };
            for i in 0u64.. {
                let body = format!("p{publisher}-{i}");
                let m = Message::builder().body(body.clone()).build();
                match tokio::time::timeout(Duration::from_secs(5), p.send_with_confirm(m)).await
                {
                    Ok(Ok(st)) if st.confirmed() => {
                        confirmed.lock().unwrap().insert(body);
                    }
                    _ => return,
                }
            }
        }));
    }
    // Kill once a good number is confirmed, publishers still going.
    let deadline = Instant::now() + WAIT;
    while confirmed.lock().unwrap().len() < 400 {
        assert!(Instant::now() < deadline, "publishers too slow");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    node.kill();
    for t in tasks {
        let _ = t.await;
    }
    let confirmed = confirmed.lock().unwrap().clone();
    drop(env);
    node.start();
    let env = node.environment().await;
    let got: HashSet<String> = read_all(&env, "s", confirmed.len())
        .await
        .into_iter()
        .collect();
    let lost: Vec<_> = confirmed.difference(&got).collect();
    assert!(
        lost.is_empty(),
        "{} of {} confirmed messages lost, e.g. {:?}",
        lost.len(),
        confirmed.len(),
        lost.iter().take(5).collect::<Vec<_>>()
    );
}

/// Reads frames until the server's Close (key 0x0016) and returns its response code; the server
/// must then close the socket.
fn close_code_after(port: u16, bytes: &[u8]) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(bytes).unwrap();
    loop {
        let mut size = [0u8; 4];
        s.read_exact(&mut size).expect("a frame before the socket closes");
        let mut frame = vec![0u8; u32::from_be_bytes(size) as usize];
        s.read_exact(&mut frame).unwrap();
        let key = u16::from_be_bytes([frame[0], frame[1]]);
        if key == 0x0016 {
            // key, version, correlation id, then the code.
            let code = u16::from_be_bytes([frame[8], frame[9]]);
            let mut rest = Vec::new();
            let n = s.read_to_end(&mut rest).expect("the server closes the socket");
            assert_eq!(n, 0, "nothing follows the close");
            return code;
        }
    }
}

#[tokio::test]
async fn bad_frames_close_the_connection_with_the_protocols_codes() {
    let Some(node) = node("bad-frames") else {
        return;
    };
    // A size past the 1 MiB frame max: refused from the prefix, no bytes awaited.
    assert_eq!(close_code_after(node.stream, &[0x7f, 0xff, 0xff, 0xff]), 0x0e);
    // A key no command has.
    assert_eq!(
        close_code_after(node.stream, &[0, 0, 0, 4, 0x00, 0x7f, 0, 1]),
        0x0d
    );
    // A known command whose body does not parse (a Create with its string cut short).
    assert_eq!(
        close_code_after(node.stream, &[0, 0, 0, 8, 0, 0x0d, 0, 1, 0, 0, 0, 1]),
        0x0d
    );
    // A command before the handshake (Create before peer properties).
    let mut create = vec![0, 0x0d, 0, 1, 0, 0, 0, 1, 0, 1, b's', 0, 0, 0, 0];
    let mut framed = (create.len() as u32).to_be_bytes().to_vec();
    framed.append(&mut create);
    assert_eq!(close_code_after(node.stream, &framed), 0x0d);
    // The node is unharmed.
    let env = node.environment().await;
    env.stream_creator().create("after").await.unwrap();
}
