//! RabbitMQ's stream protocol through the official Rust client (`rabbitmq-stream-client`), the
//! second half of issue 36's proof beside the Java suite in `../java-stream`. Every expectation
//! was read off RabbitMQ 3.10.8 first; warren's stream listener must pass the same tests.
//!
//! The broker is named by WARREN_TEST_STREAM_HOST/PORT/USER/PASSWORD; scripts/interop.sh sets
//! them, and skips this suite (saying why) while warren has no stream listener.
//!
//! The client is pinned at 0.4.4, the last release that speaks to RabbitMQ 3.10: from 0.5.0 on
//! it sends ExchangeCommandVersions (3.13's command 0x1b) on every connect, which 3.10 answers
//! by closing the connection ("unknown command"). 0.4.4 has no super streams and no single
//! active consumer, so those are proved by the Java suite alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use rabbitmq_stream_client::error::{
    ClientError, ConsumerCreateError, ProducerCreateError, StreamCreateError, StreamDeleteError,
};
use rabbitmq_stream_client::types::{ByteCapacity, Message, OffsetSpecification, ResponseCode};
use rabbitmq_stream_client::{Client, ClientOptions, Consumer, Environment};

const WAIT: Duration = Duration::from_secs(10);
/// How long a consumer is given to receive what it is not owed: a stream never delivers what it
/// does not hold, so a longer wait only slows the tests that expect nothing.
const SETTLE: Duration = Duration::from_millis(600);

struct Endpoint {
    host: String,
    port: u16,
    user: String,
    password: String,
}

fn endpoint() -> Endpoint {
    let port = std::env::var("WARREN_TEST_STREAM_PORT").expect(
        "WARREN_TEST_STREAM_PORT names the stream listener under test (scripts/interop.sh)",
    );
    Endpoint {
        host: std::env::var("WARREN_TEST_STREAM_HOST").unwrap_or_else(|_| "127.0.0.1".into()),
        port: port
            .parse()
            .expect("WARREN_TEST_STREAM_PORT is a port number"),
        user: std::env::var("WARREN_TEST_STREAM_USER").unwrap_or_else(|_| "guest".into()),
        password: std::env::var("WARREN_TEST_STREAM_PASSWORD").unwrap_or_else(|_| "guest".into()),
    }
}

fn broker_is_rabbitmq() -> bool {
    std::env::var("WARREN_TEST_BROKER").as_deref() == Ok("rabbitmq")
}

async fn environment() -> Environment {
    let e = endpoint();
    Environment::builder()
        .host(&e.host)
        .port(e.port)
        .username(&e.user)
        .password(&e.password)
        .build()
        .await
        .expect("connect to the stream listener")
}

async fn client_as(user: &str, password: &str) -> Result<Client, ClientError> {
    let e = endpoint();
    Client::connect(
        ClientOptions::builder()
            .host(&e.host)
            .port(e.port)
            .user(user)
            .password(password)
            .build(),
    )
    .await
}

async fn client() -> Client {
    let e = endpoint();
    client_as(&e.user, &e.password).await.expect("connect")
}

fn unique(what: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "rust-stream.{what}.{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A stream made for one test and deleted by it at the end.
async fn created(env: &Environment, what: &str) -> String {
    let s = unique(what);
    env.stream_creator()
        .create(&s)
        .await
        .expect("create stream");
    s
}

/// Publishes each body with its own confirm awaited, so every message is a chunk of its own.
async fn publish_each(env: &Environment, stream: &str, bodies: &[String]) {
    let producer = env.producer().build(stream).await.expect("producer");
    for body in bodies {
        let status = producer
            .send_with_confirm(Message::builder().body(body.clone()).build())
            .await
            .expect("send");
        assert!(
            status.confirmed(),
            "confirm for {body}: {:?}",
            status.status()
        );
    }
    producer.close().await.expect("close producer");
}

fn bodies(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

/// Reads deliveries until `done` says enough, failing after WAIT; then keeps reading for
/// `settle` to catch anything delivered beyond what was owed.
async fn read(consumer: &mut Consumer, want: usize, settle: Duration) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let d = tokio::time::timeout(left, consumer.next())
            .await
            .unwrap_or_else(|_| {
                panic!("timed out with {} of {want} deliveries: {got:?}", got.len())
            })
            .expect("consumer ended")
            .expect("delivery");
        got.push((d.offset(), body_of(d.message())));
    }
    let until = Instant::now() + settle;
    while let Ok(Some(d)) = tokio::time::timeout(
        until.saturating_duration_since(Instant::now()),
        consumer.next(),
    )
    .await
    {
        let d = d.expect("delivery");
        got.push((d.offset(), body_of(d.message())));
    }
    got
}

fn body_of(m: &Message) -> String {
    String::from_utf8_lossy(m.data().unwrap_or_default()).into_owned()
}

fn offsets(got: &[(u64, String)]) -> Vec<u64> {
    got.iter().map(|(o, _)| *o).collect()
}

async fn consumer_at(env: &Environment, stream: &str, spec: OffsetSpecification) -> Consumer {
    env.consumer()
        .offset(spec)
        .build(stream)
        .await
        .expect("consumer")
}

/// rabbitmqctl / rabbitmq-streams on RabbitMQ, `warren ctl` on warren.
fn cli(streams_tool: bool, args: &[&str]) {
    let mut cmd = if broker_is_rabbitmq() {
        let mut c = std::process::Command::new(std::env::var("RABBITMQ_SH").expect("RABBITMQ_SH"));
        if streams_tool {
            c.args(["tool", "1", "rabbitmq-streams"]);
        } else {
            c.args(["ctl", "1"]);
        }
        c
    } else {
        let mut c = std::process::Command::new(std::env::var("WARREN_BIN").expect("WARREN_BIN"));
        // `warren ctl` talks to the management API, not to AMQP.
        let uri = std::env::var("WARREN_TEST_MANAGEMENT_URI")
            .unwrap_or_else(|_| "http://guest:guest@127.0.0.1:15672".into());
        c.args(["ctl", "--uri", &uri]);
        c
    };
    let out = cmd.args(args).output().expect("run the broker's CLI");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || text.contains("already exists"),
        "{args:?} failed: {text}"
    );
}

// --- create and delete -------------------------------------------------------------------------

#[tokio::test]
async fn create_with_retention_arguments_then_delete() {
    let env = environment().await;
    let s = unique("create");
    env.stream_creator()
        .max_length(ByteCapacity::MB(10))
        .max_age(Duration::from_secs(12 * 3600))
        .max_segment_size(ByteCapacity::KB(500))
        .create(&s)
        .await
        .expect("create");
    let c = client().await;
    assert_eq!(
        c.metadata(vec![s.clone()]).await.unwrap()[&s].response_code,
        ResponseCode::Ok
    );
    env.delete_stream(&s).await.expect("delete");
    // A stream that does not exist comes back with no leader, which this client drops.
    assert!(!c.metadata(vec![s.clone()]).await.unwrap().contains_key(&s));
    match env.delete_stream(&s).await {
        Err(StreamDeleteError::Delete { status, .. }) => {
            assert_eq!(status, ResponseCode::StreamDoesNotExist)
        }
        other => panic!("second delete: {other:?}"),
    }
}

#[tokio::test]
async fn create_of_an_existing_stream_says_it_exists_only_when_the_arguments_match() {
    let env = environment().await;
    let c = client().await;
    let s = unique("exists");
    let args = HashMap::from([("max-length-bytes".to_string(), "1000".to_string())]);
    assert!(c.create_stream(&s, args.clone()).await.unwrap().is_ok());
    assert_eq!(
        c.create_stream(&s, args).await.unwrap().code(),
        &ResponseCode::StreamAlreadyExists
    );
    // Other arguments: RabbitMQ 3.10 answers as to an inequivalent redeclare.
    let other = HashMap::from([("max-length-bytes".to_string(), "2000".to_string())]);
    assert_eq!(
        c.create_stream(&s, other).await.unwrap().code(),
        &ResponseCode::PrecoditionFailed
    );
    assert_eq!(
        c.create_stream(&s, HashMap::new()).await.unwrap().code(),
        &ResponseCode::PrecoditionFailed
    );
    match env.stream_creator().create(&s).await {
        Err(StreamCreateError::Create { status, .. }) => {
            assert_eq!(status, ResponseCode::PrecoditionFailed)
        }
        other => panic!("create again through the environment: {other:?}"),
    }
    env.delete_stream(&s).await.unwrap();
}

// --- publish and consume -----------------------------------------------------------------------

#[tokio::test]
async fn published_batch_is_confirmed_and_read_back_in_order_with_offsets() {
    let env = environment().await;
    let s = created(&env, "publish").await;
    let producer = env.producer().build(&s).await.unwrap();
    let messages: Vec<Message> = bodies("m", 0..100)
        .into_iter()
        .map(|b| Message::builder().body(b).build())
        .collect();
    let statuses = producer.batch_send_with_confirm(messages).await.unwrap();
    assert_eq!(statuses.len(), 100);
    assert!(statuses.iter().all(|st| st.confirmed()));
    producer.close().await.unwrap();
    let mut consumer = consumer_at(&env, &s, OffsetSpecification::First).await;
    let got = read(&mut consumer, 100, SETTLE).await;
    assert_eq!(offsets(&got), (0..100).collect::<Vec<_>>());
    assert_eq!(
        got.iter().map(|(_, b)| b.clone()).collect::<Vec<_>>(),
        bodies("m", 0..100)
    );
    consumer.handle().close().await.unwrap();
    env.delete_stream(&s).await.unwrap();
}

#[tokio::test]
async fn every_offset_specification_starts_where_rabbitmq_starts() {
    let env = environment().await;
    let s = created(&env, "offsets").await;
    publish_each(&env, &s, &bodies("m", 0..5)).await;

    let mut first = consumer_at(&env, &s, OffsetSpecification::First).await;
    assert_eq!(
        offsets(&read(&mut first, 5, Duration::ZERO).await),
        vec![0, 1, 2, 3, 4]
    );

    // One message per chunk: `last` is the last chunk, offset 4 alone.
    let mut last = consumer_at(&env, &s, OffsetSpecification::Last).await;
    assert_eq!(offsets(&read(&mut last, 1, SETTLE).await), vec![4]);

    let mut next = consumer_at(&env, &s, OffsetSpecification::Next).await;
    assert!(read(&mut next, 0, SETTLE).await.is_empty());

    let mut at = consumer_at(&env, &s, OffsetSpecification::Offset(2)).await;
    assert_eq!(offsets(&read(&mut at, 3, SETTLE).await), vec![2, 3, 4]);

    publish_each(&env, &s, &bodies("m", 5..7)).await;
    assert_eq!(offsets(&read(&mut first, 2, SETTLE).await), vec![5, 6]);
    assert_eq!(offsets(&read(&mut last, 2, SETTLE).await), vec![5, 6]);
    assert_eq!(offsets(&read(&mut next, 2, SETTLE).await), vec![5, 6]);
    assert_eq!(offsets(&read(&mut at, 2, SETTLE).await), vec![5, 6]);
    for c in [first, last, next, at] {
        c.handle().close().await.unwrap();
    }
    env.delete_stream(&s).await.unwrap();
}

#[tokio::test]
async fn numeric_offset_past_the_end_delivers_from_that_offset_once_written() {
    let env = environment().await;
    let s = created(&env, "offset-past-end").await;
    publish_each(&env, &s, &bodies("m", 0..3)).await;
    let mut c = consumer_at(&env, &s, OffsetSpecification::Offset(5)).await;
    assert!(read(&mut c, 0, SETTLE).await.is_empty());
    publish_each(&env, &s, &bodies("m", 3..7)).await;
    // RabbitMQ attaches the reader at the end (3); this client drops every message before the
    // offset it asked for, so what it hands over starts at 5 (the Java suite shows the rest).
    assert_eq!(offsets(&read(&mut c, 2, SETTLE).await), vec![5, 6]);
    c.handle().close().await.unwrap();
    env.delete_stream(&s).await.unwrap();
}

#[tokio::test]
async fn timestamp_reads_from_the_first_chunk_written_at_or_after_it() {
    let env = environment().await;
    let s = created(&env, "timestamp").await;
    publish_each(&env, &s, &bodies("a", 0..3)).await;
    // The broker stamps a chunk with its own clock: leave a gap that clock surely sees, and
    // take the boundary from the middle of it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let boundary_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish_each(&env, &s, &bodies("b", 3..6)).await;
    let mut c = consumer_at(&env, &s, OffsetSpecification::Timestamp(boundary_ms)).await;
    let got = read(&mut c, 3, SETTLE).await;
    assert_eq!(offsets(&got), vec![3, 4, 5]);
    assert_eq!(
        got.iter().map(|(_, b)| b.clone()).collect::<Vec<_>>(),
        bodies("b", 3..6)
    );
    c.handle().close().await.unwrap();
    let mut all = consumer_at(&env, &s, OffsetSpecification::Timestamp(0)).await;
    assert_eq!(
        offsets(&read(&mut all, 6, SETTLE).await),
        (0..6).collect::<Vec<_>>()
    );
    all.handle().close().await.unwrap();
    env.delete_stream(&s).await.unwrap();
}

// --- retention ---------------------------------------------------------------------------------

#[tokio::test]
async fn max_length_bytes_drops_the_oldest_segments_and_keeps_the_last() {
    let env = environment().await;
    let s = unique("retention");
    env.stream_creator()
        .max_segment_size(ByteCapacity::B(2_000))
        .max_length(ByteCapacity::B(6_000))
        .create(&s)
        .await
        .unwrap();
    let pad = "x".repeat(200);
    publish_each(&env, &s, &bodies(&pad, 0..100)).await;
    // Retention runs in the background when a segment closes: wait until a reader from
    // `first` no longer starts at 0.
    let deadline = Instant::now() + WAIT;
    let first_kept = loop {
        let mut c = consumer_at(&env, &s, OffsetSpecification::First).await;
        let first = read(&mut c, 1, Duration::ZERO).await[0].0;
        c.handle().close().await.unwrap();
        if first > 0 || Instant::now() > deadline {
            break first;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(first_kept > 0, "no segment was removed");
    assert!(100 - first_kept < 60, "kept {} messages", 100 - first_kept);
    let mut c = consumer_at(&env, &s, OffsetSpecification::First).await;
    let kept = (100 - first_kept) as usize;
    let got = read(&mut c, kept, SETTLE).await;
    assert_eq!(offsets(&got), (first_kept..100).collect::<Vec<_>>());
    c.handle().close().await.unwrap();
    env.delete_stream(&s).await.unwrap();
}

// --- deduplication -----------------------------------------------------------------------------

#[tokio::test]
async fn named_producer_resends_are_confirmed_but_stored_once() {
    let env = environment().await;
    let s = created(&env, "dedup").await;
    let mut p = env
        .producer()
        .name("dedup-producer")
        .build(&s)
        .await
        .unwrap();
    for id in 1..=10u64 {
        let m = Message::builder()
            .body(format!("m{id}"))
            .publising_id(id)
            .build();
        assert!(p.send_with_confirm(m).await.unwrap().confirmed());
    }
    p.close().await.unwrap();
    let c = client().await;
    assert_eq!(
        c.query_publisher_sequence("dedup-producer", &s)
            .await
            .unwrap(),
        10
    );
    // RabbitMQ 3.10 answers 0 for a name it never saw.
    assert_eq!(c.query_publisher_sequence("nobody", &s).await.unwrap(), 0);

    let mut p = env
        .producer()
        .name("dedup-producer")
        .build(&s)
        .await
        .unwrap();
    for id in 6..=15u64 {
        let m = Message::builder()
            .body(format!("again{id}"))
            .publising_id(id)
            .build();
        let st = p.send_with_confirm(m).await.unwrap();
        assert!(st.confirmed(), "resent id {id}: {:?}", st.status());
    }
    p.close().await.unwrap();
    assert_eq!(
        c.query_publisher_sequence("dedup-producer", &s)
            .await
            .unwrap(),
        15
    );
    let mut consumer = consumer_at(&env, &s, OffsetSpecification::First).await;
    let got = read(&mut consumer, 15, SETTLE).await;
    let mut expected = bodies("m", 1..11);
    expected.extend(bodies("again", 11..16));
    assert_eq!(
        got.into_iter().map(|(_, b)| b).collect::<Vec<_>>(),
        expected
    );
    consumer.handle().close().await.unwrap();
    env.delete_stream(&s).await.unwrap();
}

// --- server-side offset tracking ---------------------------------------------------------------

#[tokio::test]
async fn stored_offset_is_returned_by_query_offset() {
    let env = environment().await;
    let s = created(&env, "tracking").await;
    publish_each(&env, &s, &bodies("m", 0..10)).await;
    let c = client().await;
    match c.query_offset("app".into(), &s).await {
        Err(ClientError::RequestError(code)) => assert_eq!(code, ResponseCode::OffsetNotFound),
        other => panic!("query before any store: {other:?}"),
    }
    c.store_offset("app", &s, 7).await.unwrap();
    wait_for_offset(&c, "app", &s, 7).await;
    c.store_offset("app", &s, 3).await.unwrap();
    wait_for_offset(&c, "app", &s, 3).await;

    let mut named = env
        .consumer()
        .name("reader")
        .offset(OffsetSpecification::First)
        .build(&s)
        .await
        .unwrap();
    read(&mut named, 10, Duration::ZERO).await;
    named.store_offset(4).await.unwrap();
    let deadline = Instant::now() + WAIT;
    while named.query_offset().await.ok() != Some(4) {
        assert!(Instant::now() < deadline, "offset 4 never stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    named.handle().close().await.unwrap();
    match c
        .query_offset("app".into(), "rust-stream.never-created")
        .await
    {
        Err(ClientError::RequestError(code)) => {
            assert_eq!(code, ResponseCode::StreamDoesNotExist)
        }
        other => panic!("query on a missing stream: {other:?}"),
    }
    env.delete_stream(&s).await.unwrap();
}

async fn wait_for_offset(c: &Client, reference: &str, stream: &str, offset: u64) {
    let deadline = Instant::now() + WAIT;
    while c.query_offset(reference.into(), stream).await.ok() != Some(offset) {
        assert!(Instant::now() < deadline, "offset {offset} never stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// --- metadata and errors -----------------------------------------------------------------------

#[tokio::test]
async fn metadata_names_the_leader_or_says_the_stream_does_not_exist() {
    let env = environment().await;
    let s = created(&env, "metadata").await;
    let c = client().await;
    let missing = "rust-stream.never-created".to_string();
    let m = c.metadata(vec![s.clone(), missing.clone()]).await.unwrap();
    assert_eq!(m[&s].response_code, ResponseCode::Ok);
    assert_eq!(m[&s].leader.port, endpoint().port as u32);
    assert!(m[&s].replicas.is_empty());
    // RabbitMQ answers StreamDoesNotExist with no leader (reference 0xFFFF): this client
    // drops such entries, so the stream is simply absent from the answer.
    assert!(!m.contains_key(&missing), "{m:?}");
    env.delete_stream(&s).await.unwrap();
}

#[tokio::test]
async fn producer_and_consumer_of_a_missing_stream_are_refused() {
    let env = environment().await;
    let missing = "rust-stream.never-created";
    assert!(matches!(
        env.producer().build(missing).await,
        Err(ProducerCreateError::StreamDoesNotExist { .. })
    ));
    match env.consumer().build(missing).await {
        Err(ConsumerCreateError::StreamDoesNotExist { .. }) => {}
        Err(ConsumerCreateError::Create { status, .. }) => {
            assert_eq!(status, ResponseCode::StreamDoesNotExist)
        }
        other => panic!("consumer of a missing stream: {:?}", other.err()),
    }
    let c = client().await;
    assert_eq!(
        c.declare_publisher(1, None, missing).await.unwrap().code(),
        &ResponseCode::StreamDoesNotExist
    );
}

#[tokio::test]
async fn wrong_password_and_missing_permissions_are_refused() {
    let e = endpoint();
    match client_as(&e.user, "not-the-password").await {
        Err(ClientError::RequestError(code)) => {
            assert_eq!(code, ResponseCode::AuthenticationFailure)
        }
        other => panic!("wrong password: {:?}", other.err()),
    }
    let user = "rust-stream-noperm";
    cli(false, &["add_user", user, "pw"]);
    cli(
        false,
        &["set_permissions", "-p", "/", user, "^$", "^$", "^$"],
    );
    let env = environment().await;
    let s = created(&env, "perm").await;
    let limited = client_as(user, "pw")
        .await
        .expect("a user with vhost access connects");
    assert_eq!(
        limited
            .create_stream(&unique("perm-create"), HashMap::new())
            .await
            .unwrap()
            .code(),
        &ResponseCode::AccessRefused
    );
    assert_eq!(
        limited.delete_stream(&s).await.unwrap().code(),
        &ResponseCode::AccessRefused
    );
    assert_eq!(
        limited.declare_publisher(1, None, &s).await.unwrap().code(),
        &ResponseCode::AccessRefused
    );
    env.delete_stream(&s).await.unwrap();

    let stranger = "rust-stream-novhost";
    cli(false, &["add_user", stranger, "pw"]);
    match client_as(stranger, "pw").await {
        Err(ClientError::RequestError(code)) => {
            assert_eq!(code, ResponseCode::VirtualHostAccessFailure)
        }
        other => panic!("user without the vhost: {:?}", other.err()),
    }
}
