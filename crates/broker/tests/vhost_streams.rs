//! A vhost's side of streams: routed messages are handed to the stream's writer as effects and
//! never enter a backlog; a consumer is registered in its channel, its deliveries take the
//! channel's tags, and their acks come back as credit; what a stream refuses is refused.

mod support;

use amq_protocol_types::{AMQPValue, FieldTable};
use bytes::Bytes;
use std::sync::Arc;
use support::{long_str, table, Harness};
use warren_broker::message::Message;
use warren_broker::relay::RemoteEffect;
use warren_broker::stream_args::StartOffset;
use warren_protocol::content::Properties;

fn stream_args() -> FieldTable {
    table(&[("x-queue-type", long_str("stream"))])
}

fn declare_stream(h: &mut Harness, name: &str) -> u64 {
    h.declare_with(1, name, true, stream_args())
        .expect("stream declare");
    h.vh.stream_of(name).expect("a stream").0
}

fn appended(h: &mut Harness) -> Vec<(Vec<u64>, String)> {
    h.vh.take_remote()
        .into_iter()
        .filter_map(|e| match e {
            RemoteEffect::StreamAppend { logs, message } => Some((
                logs,
                String::from_utf8(message.body.to_vec()).expect("utf-8"),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_message_routed_to_a_stream_goes_to_its_writer_not_to_a_backlog() {
    let mut h = Harness::new();
    let log = declare_stream(&mut h, "s");
    h.declare("classic");
    h.exchange("x", "fanout");
    h.bind("s", "x", "");
    h.bind("classic", "x", "");
    let outcome = h.publish("x", "", "m");
    assert!(outcome.routed);
    assert_eq!(appended(&mut h), vec![(vec![log], "m".to_string())]);
    assert_eq!(h.ready("s"), 0);
    assert_eq!(h.ready("classic"), 1);
    h.publish("", "classic", "only classic");
    assert!(appended(&mut h).is_empty(), "no effect for other queues");
}

#[test]
fn a_stream_with_members_in_a_cluster_takes_the_stream_path_not_the_quorum_one() {
    let mut h = Harness::new();
    h.vh.set_local_node("n1".into());
    let log = declare_stream(&mut h, "s");
    h.vh.set_queue_members("s", &["n1".to_string(), "n2".to_string()]);
    // Its members open its group (the metadata finds it replicated) ...
    assert_eq!(
        h.vh.replicated_queue("s").map(|(l, m)| (l, m.len())),
        Some((log, 2))
    );
    // ... but its publishes and consumers are a stream's, on every node.
    assert_eq!(h.vh.quorum_log("s"), None);
    assert_eq!(h.vh.remote_home("s"), None);
    h.publish("", "s", "m");
    assert_eq!(appended(&mut h), vec![(vec![log], "m".to_string())]);
}

#[test]
fn a_stream_consumer_needs_a_prefetch_and_acknowledgements() {
    let mut h = Harness::new();
    declare_stream(&mut h, "s");
    let ch = h.open(1);
    let none = FieldTable::default();
    let e =
        h.vh.consume_stream(ch, "s", "", false, &none, 0)
            .unwrap_err();
    assert_eq!(e.code, 406);
    h.qos(ch, 10, false);
    let e =
        h.vh.consume_stream(ch, "s", "", true, &none, 0)
            .unwrap_err();
    assert_eq!(e.code, 540);
    let args = table(&[("x-stream-offset", AMQPValue::LongLongInt(3))]);
    let c = h.vh.consume_stream(ch, "s", "", false, &args, 0).unwrap();
    assert_eq!((c.prefetch, c.start), (10, StartOffset::Offset(3)));
    assert_eq!(h.vh.stream_consumer_log(ch, &c.tag), Some(c.log));
}

fn delivery(body: &str) -> (Arc<Message>, Bytes) {
    let props = Properties::default();
    let encoded = props.encode();
    let m = Message::new(
        Bytes::new(),
        Bytes::from_static(b"s"),
        encoded.clone(),
        &props,
        Bytes::copy_from_slice(body.as_bytes()),
    );
    (Arc::new(m), encoded)
}

#[test]
fn acks_of_stream_deliveries_come_back_as_credit_and_nacks_are_540() {
    let mut h = Harness::new();
    let log = declare_stream(&mut h, "s");
    let ch = h.open(1);
    h.qos(ch, 10, false);
    let c =
        h.vh.consume_stream(ch, "s", "c", false, &FieldTable::default(), 0)
            .unwrap();
    for body in ["a", "b", "c"] {
        let (m, p) = delivery(body);
        assert!(h.vh.accept_stream_delivery(ch, c.tag.as_bytes(), m, p));
    }
    let got = h.deliveries(ch);
    assert_eq!(
        got.iter().map(|d| d.delivery_tag).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    h.ack(ch, 2, true).unwrap();
    let credit: Vec<_> =
        h.vh.take_remote()
            .into_iter()
            .filter_map(|e| match e {
                RemoteEffect::StreamSettle { log: l, count, .. } => Some((l, count)),
                _ => None,
            })
            .collect();
    assert_eq!(credit, [(log, 2)]);
    let e = h.nack(ch, 3, false, true).unwrap_err();
    assert_eq!(e.code, 540);
    assert!(e.text.contains("not supported by stream queues"));
    // Cancelled, the consumer takes no more: its reader stops.
    assert!(h.vh.cancel_stream_consumer(ch, "c"));
    let (m, p) = delivery("late");
    assert!(!h.vh.accept_stream_delivery(ch, b"c", m, p));
}

#[test]
fn closing_a_channel_stops_its_stream_consumers() {
    let mut h = Harness::new();
    let log = declare_stream(&mut h, "s");
    let ch = h.open(1);
    h.qos(ch, 1, false);
    h.vh.consume_stream(ch, "s", "c", false, &FieldTable::default(), 0)
        .unwrap();
    h.close(ch);
    let stopped: Vec<_> =
        h.vh.take_remote()
            .into_iter()
            .filter_map(|e| match e {
                RemoteEffect::StreamCancel {
                    log, consumer_tag, ..
                } => Some((log, consumer_tag)),
                _ => None,
            })
            .collect();
    assert_eq!(stopped, [(log, Bytes::from_static(b"c"))]);
}
