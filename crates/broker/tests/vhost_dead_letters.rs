//! Message TTL, length limits, priorities, dead-lettering with RabbitMQ's x-death bookkeeping,
//! and quorum queues' delivery counting.

mod support;

use support::*;
use warren_protocol::{AMQPValue, FieldTable};

/// A queue "dead" bound to exchange "dlx" (fanout) with a no-ack consumer on its own channel.
fn dead_letter_sink(h: &mut Harness) -> u64 {
    h.exchange("dlx", "fanout");
    h.declare("dead");
    h.bind("dead", "dlx", "");
    let ch = h.open(50);
    h.consume(ch, "dead", "sink", true);
    ch
}

fn dlx_args(extra: &[(&str, AMQPValue)]) -> FieldTable {
    let mut pairs = vec![("x-dead-letter-exchange", long_str("dlx"))];
    pairs.extend(extra.iter().cloned());
    table(&pairs)
}

fn publish_n(h: &mut Harness, queue: &str, n: usize) {
    for i in 1..=n {
        h.publish("", queue, &format!("m{i}"));
    }
}

fn field(t: &FieldTable, key: &str) -> AMQPValue {
    t.inner()
        .get(key)
        .cloned()
        .unwrap_or_else(|| panic!("x-death entry has no {key}: {t:?}"))
}

/// Arguments of a queue that dead-letters to queue `key` through the default exchange, with a
/// message TTL when given.
fn dead_letters_to(key: &str, ttl: Option<i64>) -> FieldTable {
    let mut pairs = vec![
        ("x-dead-letter-exchange", long_str("")),
        ("x-dead-letter-routing-key", long_str(key)),
    ];
    pairs.extend(ttl.map(|t| ("x-message-ttl", int(t))));
    table(&pairs)
}

fn quorum(h: &mut Harness, name: &str, extra: &[(&str, AMQPValue)]) {
    let mut pairs = vec![("x-queue-type", long_str("quorum"))];
    pairs.extend(extra.iter().cloned());
    h.declare_with(1, name, true, table(&pairs)).unwrap();
}

// ---- TTL ---------------------------------------------------------------------------------

#[test]
fn queue_ttl_expired_messages_are_not_delivered() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-message-ttl", int(100))]))
        .unwrap();
    h.publish("", "q", "old");
    h.advance(50);
    h.publish("", "q", "young");
    h.advance(51);
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "q"), ["young"]);
    h.publish("", "q", "late");
    h.advance(101);
    h.consume(ch, "q", "c", true);
    assert!(
        h.bodies(ch).is_empty(),
        "an expired head is not delivered to a consumer"
    );
}

#[test]
fn per_message_expiration_is_honoured_and_the_smaller_ttl_wins() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-message-ttl", int(1000))]))
        .unwrap();
    h.publish_props("", "q", with_expiration("100"), "short")
        .unwrap();
    h.publish_props("", "q", with_expiration("5000"), "queue-ttl")
        .unwrap();
    h.publish("", "q", "plain");
    h.advance(101);
    let ch = h.open(1);
    let got = h.get(ch, "q", true).unwrap();
    assert_eq!(got.body_str(), "queue-ttl");
    assert_eq!(
        got.properties.expiration.as_deref(),
        Some(&b"5000"[..]),
        "the expiration property is delivered as published"
    );
    h.advance(900);
    assert!(
        h.get(ch, "q", true).is_none(),
        "the queue TTL caps the message's"
    );
}

#[test]
fn messages_that_have_not_expired_stay_ready() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-message-ttl", int(100))]))
        .unwrap();
    publish_n(&mut h, "q", 2);
    h.advance(99);
    h.tick();
    assert_eq!(h.ready("q"), 2);
}

#[test]
fn expired_messages_are_dead_lettered_on_tick_with_reason_expired() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[("x-message-ttl", int(100))]))
        .unwrap();
    let mut props = with_headers(table(&[("app", long_str("kept"))]));
    props.expiration = Some("60".into());
    h.publish_props("", "q", props, "m1").unwrap();
    h.publish("", "q", "m2");
    let published_s = h.now_ms / 1000;
    h.advance(61);
    h.tick();
    let got = h.deliveries(sink);
    assert_eq!(got.len(), 1, "only the per-message TTL has passed");
    h.advance(40);
    h.tick();
    let got2 = h.deliveries(sink);
    assert_eq!(got2.len(), 1);
    assert_eq!(h.ready("q"), 0);

    let d = &got[0];
    assert_eq!(d.body_str(), "m1");
    assert_eq!(d.exchange, "dlx", "the dead letter is published to the DLX");
    assert_eq!(d.routing_key, "q", "with its original routing key");
    assert_eq!(d.properties.expiration, None, "the expiration is removed");
    assert_eq!(d.header("app"), Some(long_str("kept")));
    let deaths = x_death(d);
    assert_eq!(deaths.len(), 1);
    let x = &deaths[0];
    assert_eq!(integer(&field(x, "count")), 1);
    assert_eq!(text(&field(x, "reason")), "expired");
    assert_eq!(text(&field(x, "queue")), "q");
    assert_eq!(text(&field(x, "exchange")), "");
    assert_eq!(field(x, "routing-keys"), str_array(&["q"]));
    assert_eq!(text(&field(x, "original-expiration")), "60");
    assert_eq!(field(x, "time"), AMQPValue::Timestamp(published_s));
    assert_eq!(d.header("x-first-death-reason"), Some(long_str("expired")));
    assert_eq!(d.header("x-first-death-queue"), Some(long_str("q")));
    assert_eq!(d.header("x-first-death-exchange"), Some(long_str("")));

    let x2 = &x_death(&got2[0])[0];
    assert_eq!(got2[0].body_str(), "m2");
    assert!(
        !x2.inner().contains_key("original-expiration"),
        "no original-expiration without a per-message TTL"
    );
}

#[test]
fn expired_messages_are_dead_lettered_when_a_consumer_or_get_finds_them() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[("x-message-ttl", int(10))]))
        .unwrap();
    publish_n(&mut h, "q", 2);
    h.advance(11);
    let ch = h.open(1);
    assert!(h.get(ch, "q", false).is_none());
    assert_eq!(h.bodies(sink), ["m1", "m2"]);
}

// ---- length limits -----------------------------------------------------------------------

#[test]
fn max_length_drop_head_drops_the_oldest_and_dead_letters_it_as_maxlen() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[("x-max-length", int(2))]))
        .unwrap();
    publish_n(&mut h, "q", 4);
    let got = h.deliveries(sink);
    assert_eq!(
        got.iter().map(|d| d.body_str()).collect::<Vec<_>>(),
        ["m1", "m2"]
    );
    assert_eq!(text(&field(&x_death(&got[0])[0], "reason")), "maxlen");
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "q"), ["m3", "m4"]);
}

#[test]
fn max_length_counts_ready_messages_only() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-max-length", int(1))]))
        .unwrap();
    let ch = h.open(1);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 3);
    assert_eq!(h.deliveries(ch).len(), 3, "delivered messages leave room");
}

#[test]
fn max_length_zero_drops_everything_that_cannot_be_delivered() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-max-length", int(0))]))
        .unwrap();
    publish_n(&mut h, "q", 2);
    assert_eq!(h.ready("q"), 0);
}

#[test]
fn max_length_bytes_drop_head_keeps_the_newest_bodies() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-max-length-bytes", int(10))]))
        .unwrap();
    for body in ["aaaa", "bbbb", "cccc"] {
        h.publish("", "q", body);
    }
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "q"), ["bbbb", "cccc"]);
}

#[test]
fn reject_publish_refuses_new_messages_and_keeps_the_old() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args(
        "q",
        dlx_args(&[
            ("x-max-length", int(2)),
            ("x-overflow", long_str("reject-publish")),
        ]),
    )
    .unwrap();
    assert!(!h.publish("", "q", "m1").rejected);
    assert!(!h.publish("", "q", "m2").rejected);
    let out = h.publish("", "q", "m3");
    assert!(out.rejected, "the publisher gets a nack");
    assert!(
        h.bodies(sink).is_empty(),
        "reject-publish does not dead-letter"
    );
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "q"), ["m1", "m2"]);
    assert!(!h.publish("", "q", "m4").rejected, "room again");
}

#[test]
fn reject_publish_on_one_queue_does_not_stop_delivery_to_others() {
    let mut h = Harness::new();
    h.declare_args(
        "full",
        table(&[
            ("x-max-length", int(0)),
            ("x-overflow", long_str("reject-publish")),
        ]),
    )
    .unwrap();
    h.declare("open");
    h.bind("full", "amq.fanout", "");
    h.bind("open", "amq.fanout", "");
    let out = h.publish("amq.fanout", "", "m");
    assert!(out.rejected && out.routed);
    assert_eq!(h.ready("open"), 1);
}

#[test]
fn reject_publish_dlx_refuses_and_dead_letters() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args(
        "q",
        dlx_args(&[
            ("x-max-length", int(1)),
            ("x-overflow", long_str("reject-publish-dlx")),
        ]),
    )
    .unwrap();
    publish_n(&mut h, "q", 2);
    let got = h.deliveries(sink);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body_str(), "m2");
    assert_eq!(text(&field(&x_death(&got[0])[0], "reason")), "maxlen");
}

// ---- priorities --------------------------------------------------------------------------

#[test]
fn max_priority_queues_deliver_higher_priorities_first() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-max-priority", int(5))]))
        .unwrap();
    for (p, body) in [
        (1, "p1"),
        (5, "p5a"),
        (0, "p0"),
        (9, "p9-capped"),
        (5, "p5b"),
    ] {
        h.publish_props("", "q", with_priority(p), body).unwrap();
    }
    h.publish("", "q", "none");
    let ch = h.open(1);
    assert_eq!(
        h.drain(ch, "q"),
        ["p5a", "p9-capped", "p5b", "p1", "p0", "none"]
    );
}

#[test]
fn without_max_priority_the_priority_property_is_ignored() {
    let mut h = Harness::new();
    h.declare("q");
    h.publish_props("", "q", with_priority(1), "a").unwrap();
    h.publish_props("", "q", with_priority(9), "b").unwrap();
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "q"), ["a", "b"]);
}

#[test]
fn requeued_priority_messages_return_ahead_of_their_level() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-max-priority", int(2))]))
        .unwrap();
    h.publish_props("", "q", with_priority(2), "hi").unwrap();
    h.publish_props("", "q", with_priority(0), "lo").unwrap();
    let ch = h.open(1);
    let d = h.get(ch, "q", false).unwrap();
    assert_eq!(d.body_str(), "hi");
    h.publish_props("", "q", with_priority(2), "hi2").unwrap();
    h.nack(ch, d.delivery_tag, false, true).unwrap();
    assert_eq!(h.drain(ch, "q"), ["hi", "hi2", "lo"]);
}

// ---- dead-lettering ----------------------------------------------------------------------

#[test]
fn rejected_messages_are_dead_lettered_with_reason_rejected() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[])).unwrap();
    h.bind("q", "amq.direct", "key");
    let props = with_headers(table(&[("CC", str_array(&["cc-key"]))]));
    h.publish_props("amq.direct", "key", props, "m1").unwrap();
    let ch = h.open(1);
    let d = h.get(ch, "q", false).unwrap();
    h.nack(ch, d.delivery_tag, false, false).unwrap();
    let got = h.deliveries(sink);
    assert_eq!(got.len(), 1);
    let x = &x_death(&got[0])[0];
    assert_eq!(text(&field(x, "reason")), "rejected");
    assert_eq!(text(&field(x, "queue")), "q");
    assert_eq!(text(&field(x, "exchange")), "amq.direct");
    assert_eq!(field(x, "routing-keys"), str_array(&["key", "cc-key"]));
    assert_eq!(got[0].routing_key, "key");
    assert_eq!(got[0].exchange, "dlx");
    assert_eq!(h.unacked("q"), 0);
}

#[test]
fn nack_multiple_without_requeue_dead_letters_all_in_order() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[])).unwrap();
    let ch = h.open(1);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 3);
    h.nack(ch, 3, true, false).unwrap();
    assert_eq!(h.bodies(sink), ["m1", "m2", "m3"]);
}

#[test]
fn dead_letter_routing_key_replaces_the_key_and_drops_cc() {
    let mut h = Harness::new();
    h.exchange("dlx", "direct");
    h.declare("by-new-key");
    h.declare("by-cc");
    h.bind("by-new-key", "dlx", "new");
    h.bind("by-cc", "dlx", "cc-key");
    h.declare_args(
        "q",
        dlx_args(&[("x-dead-letter-routing-key", long_str("new"))]),
    )
    .unwrap();
    let props = with_headers(table(&[("CC", str_array(&["cc-key"]))]));
    h.publish_props("", "q", props, "m").unwrap();
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    h.nack(ch, 1, false, false).unwrap();
    let d = h.get(ch, "by-new-key", true).unwrap();
    assert_eq!(d.routing_key, "new");
    assert_eq!(
        d.header("CC"),
        None,
        "RabbitMQ drops CC when it replaces the key"
    );
    let x = &x_death(&d)[0];
    assert_eq!(field(x, "routing-keys"), str_array(&["q", "cc-key"]));
    assert_eq!(
        h.ready("by-cc"),
        0,
        "the CC key does not route the dead letter"
    );
}

#[test]
fn the_default_exchange_as_dlx_routes_by_the_dead_letter_routing_key() {
    let mut h = Harness::new();
    h.declare("parking");
    h.declare_args(
        "q",
        table(&[
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("parking")),
        ]),
    )
    .unwrap();
    h.publish("", "q", "m");
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    h.nack(ch, 1, false, false).unwrap();
    assert_eq!(h.drain(ch, "parking"), ["m"]);
}

#[test]
fn a_missing_dlx_drops_the_message() {
    let mut h = Harness::new();
    h.declare_args(
        "q",
        table(&[("x-dead-letter-exchange", long_str("nowhere"))]),
    )
    .unwrap();
    h.publish("", "q", "m");
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    h.nack(ch, 1, false, false).unwrap();
    assert_eq!((h.ready("q"), h.unacked("q")), (0, 0));
}

#[test]
fn x_death_counts_repeated_deaths_in_the_same_queue_for_the_same_reason() {
    let mut h = Harness::new();
    // q dead-letters to itself via the default exchange; rejections never count as a cycle.
    h.declare_args("q", table(&[("x-dead-letter-exchange", long_str(""))]))
        .unwrap();
    h.publish("", "q", "m");
    let ch = h.open(1);
    for round in 1..=3 {
        let d = h.get(ch, "q", false).expect("the message came back");
        if round > 1 {
            let deaths = x_death(&d);
            assert_eq!(deaths.len(), 1);
            assert_eq!(integer(&field(&deaths[0], "count")), round - 1);
        }
        h.nack(ch, d.delivery_tag, false, false).unwrap();
    }
}

/// One x-death entry as a publisher (or an older broker) might have set it.
fn death(queue: &str, reason: &str, count: Option<i64>) -> AMQPValue {
    let mut pairs = vec![("queue", long_str(queue)), ("reason", long_str(reason))];
    if let Some(c) = count {
        pairs.push(("count", int(c)));
    }
    AMQPValue::FieldTable(table(&pairs))
}

fn death_keys(d: &Delivery) -> Vec<(String, String, i64)> {
    x_death(d)
        .iter()
        .map(|t| {
            let count = integer(&field(t, "count"));
            (text(&field(t, "queue")), text(&field(t, "reason")), count)
        })
        .collect()
}

#[test]
fn x_death_entries_a_publisher_repeated_are_merged_by_queue_and_reason() {
    // RabbitMQ 3.10's group_by_queue_and_reason: the first entry of each (queue, reason) is
    // kept, with the number of entries it stood for when it had no count; the new death counts
    // on its entry, which goes first; the others keep their order (docs/dead-lettering.md).
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[])).unwrap();
    let sent = array(&[
        death("q", "rejected", Some(3)),
        death("elsewhere", "expired", Some(1)),
        death("q", "rejected", Some(5)),
        death("c", "maxlen", None),
        death("c", "maxlen", None),
    ]);
    h.publish_props("", "q", with_headers(table(&[("x-death", sent)])), "m")
        .unwrap();
    let ch = h.open(1);
    let d = h.get(ch, "q", false).unwrap();
    h.nack(ch, d.delivery_tag, false, false).unwrap();
    let got = h.deliveries(sink);
    assert_eq!(
        death_keys(&got[0]),
        [
            ("q".into(), "rejected".into(), 4),
            ("elsewhere".into(), "expired".into(), 1),
            ("c".into(), "maxlen".into(), 2),
        ]
    );
}

#[test]
fn x_death_keeps_each_queue_and_reason_where_its_latest_death_puts_it() {
    // a (rejected) -> b (expired) -> c (expired) -> b: the newest death first, each entry moved
    // to the front when it counts again, never reordered otherwise; is_cycle relies on it.
    let mut h = Harness::new();
    h.declare_args("a", dead_letters_to("b", None)).unwrap();
    h.declare_args("b", dead_letters_to("c", Some(10))).unwrap();
    h.declare_args("c", dead_letters_to("b", None)).unwrap();
    h.publish("", "a", "m");
    let ch = h.open(1);
    let d = h.get(ch, "a", false).unwrap();
    h.nack(ch, d.delivery_tag, false, false).unwrap();
    h.advance(11);
    h.tick();
    let d = h.get(ch, "c", false).expect("expired from b into c");
    let key = |q: &str, r: &str, n: i64| (q.to_string(), r.to_string(), n);
    assert_eq!(
        death_keys(&d),
        [key("b", "expired", 1), key("a", "rejected", 1)]
    );
    // Rejected in c, so b takes it again (a rejection since b) and it expires there again.
    h.nack(ch, d.delivery_tag, false, false).unwrap();
    h.advance(11);
    h.tick();
    let d = h
        .get(ch, "c", false)
        .expect("round again: a rejection since it died in c");
    assert_eq!(
        death_keys(&d),
        [
            key("b", "expired", 2),
            key("c", "rejected", 1),
            key("a", "rejected", 1)
        ]
    );
}

#[test]
fn a_dead_letter_cycle_without_rejection_is_dropped() {
    let mut h = Harness::new();
    // a expires into b, b expires back into a: the second death in a would be a cycle.
    h.declare_args(
        "a",
        table(&[
            ("x-message-ttl", int(10)),
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("b")),
        ]),
    )
    .unwrap();
    h.declare_args(
        "b",
        table(&[
            ("x-message-ttl", int(10)),
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("a")),
        ]),
    )
    .unwrap();
    h.publish("", "a", "m");
    for _ in 0..10 {
        h.advance(11);
        h.tick();
    }
    assert_eq!((h.ready("a"), h.ready("b")), (0, 0));
}

#[test]
fn a_message_expiring_into_its_own_queue_is_dropped() {
    let mut h = Harness::new();
    h.declare_args(
        "q",
        table(&[
            ("x-message-ttl", int(10)),
            ("x-dead-letter-exchange", long_str("")),
        ]),
    )
    .unwrap();
    h.publish("", "q", "m");
    h.advance(11);
    h.tick();
    assert_eq!(h.ready("q"), 0);
}

#[test]
fn dead_letters_chain_through_several_queues_with_the_history_newest_first() {
    let mut h = Harness::new();
    h.declare_args(
        "first",
        table(&[
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("second")),
        ]),
    )
    .unwrap();
    h.declare_args(
        "second",
        table(&[
            ("x-message-ttl", int(5)),
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("third")),
        ]),
    )
    .unwrap();
    h.declare("third");
    h.publish("", "first", "m");
    let ch = h.open(1);
    h.get(ch, "first", false).unwrap();
    h.nack(ch, 1, false, false).unwrap();
    h.advance(6);
    h.tick();
    let d = h.get(ch, "third", true).unwrap();
    let deaths = x_death(&d);
    let summary: Vec<(String, String)> = deaths
        .iter()
        .map(|t| (text(&field(t, "queue")), text(&field(t, "reason"))))
        .collect();
    assert_eq!(
        summary,
        [
            ("second".to_string(), "expired".to_string()),
            ("first".to_string(), "rejected".to_string())
        ]
    );
    assert_eq!(d.header("x-first-death-queue"), Some(long_str("first")));
    assert_eq!(d.header("x-first-death-reason"), Some(long_str("rejected")));
}

// ---- quorum queues -----------------------------------------------------------------------

#[test]
fn quorum_queues_must_be_durable_non_exclusive_and_not_auto_delete() {
    let mut h = Harness::new();
    let q = table(&[("x-queue-type", long_str("quorum"))]);
    let err = h.declare_with(1, "qq", false, q.clone()).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'qq' in vhost '/'"
    );
    let err =
        h.vh.queue_declare(1, "qq", false, true, true, false, q.clone(), h.now_ms)
            .unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'qq' in vhost '/'"
    );
    let err =
        h.vh.queue_declare(1, "qq", false, true, false, true, q.clone(), h.now_ms)
            .unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'qq' in vhost '/'"
    );
    // RabbitMQ checks auto-delete, then exclusive, then durable.
    let err =
        h.vh.queue_declare(1, "qq", false, false, true, true, q.clone(), h.now_ms)
            .unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'qq' in vhost '/'"
    );
    assert!(!h.exists("qq"));
    h.declare_with(1, "qq", true, q).unwrap();
}

#[test]
fn quorum_redelivery_carries_x_delivery_count() {
    let mut h = Harness::new();
    quorum(&mut h, "qq", &[]);
    h.publish("", "qq", "m");
    let ch = h.open(1);
    let d = h.get(ch, "qq", false).unwrap();
    assert_eq!(
        d.header("x-delivery-count"),
        Some(int(0)),
        "RabbitMQ 3.10.8 counts from the first delivery"
    );
    h.nack(ch, d.delivery_tag, false, true).unwrap();
    let d = h.get(ch, "qq", false).unwrap();
    assert!(d.redelivered);
    assert_eq!(d.header("x-delivery-count"), Some(int(1)));
    h.nack(ch, d.delivery_tag, false, true).unwrap();
    h.consume(ch, "qq", "c", false);
    let got = h.deliveries(ch);
    assert_eq!(got[0].header("x-delivery-count"), Some(int(2)));
}

#[test]
fn classic_redelivery_has_no_x_delivery_count() {
    let mut h = Harness::new();
    h.declare("q");
    h.publish("", "q", "m");
    let ch = h.open(1);
    let d = h.get(ch, "q", false).unwrap();
    h.nack(ch, d.delivery_tag, false, true).unwrap();
    let d = h.get(ch, "q", false).unwrap();
    assert!(d.redelivered);
    assert_eq!(d.header("x-delivery-count"), None);
}

#[test]
fn quorum_delivery_limit_dead_letters_after_n_redeliveries() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    quorum(
        &mut h,
        "qq",
        &[
            ("x-delivery-limit", int(2)),
            ("x-dead-letter-exchange", long_str("dlx")),
        ],
    );
    h.publish("", "qq", "m");
    let ch = h.open(1);
    // Delivered 1 + 2 times; the third return exceeds the limit.
    for _ in 0..3 {
        let d = h.get(ch, "qq", false).expect("still in the queue");
        h.nack(ch, d.delivery_tag, false, true).unwrap();
    }
    assert!(h.get(ch, "qq", false).is_none());
    let got = h.deliveries(sink);
    assert_eq!(got.len(), 1);
    assert_eq!(
        text(&field(&x_death(&got[0])[0], "reason")),
        "delivery_limit"
    );
}

#[test]
fn quorum_delivery_limit_counts_returns_from_closed_channels() {
    // rabbit_fifo returns a closed channel's messages one by one through the same path as a
    // nack, so they count towards the limit too.
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    quorum(
        &mut h,
        "qq",
        &[
            ("x-delivery-limit", int(1)),
            ("x-dead-letter-exchange", long_str("dlx")),
        ],
    );
    h.publish("", "qq", "m");
    for conn in [1, 2] {
        let ch = h.open(conn);
        assert!(h.get(ch, "qq", false).is_some());
        h.close(ch);
    }
    assert_eq!(h.ready("qq"), 0);
    assert_eq!(h.bodies(sink), ["m"]);
}

#[test]
fn a_waiting_consumer_gets_messages_even_from_a_max_length_zero_queue() {
    // RabbitMQ attempts delivery before it enqueues and applies drop-head.
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-max-length", int(0))]))
        .unwrap();
    let ch = h.open(1);
    h.qos(ch, 1, false);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 2);
    assert_eq!(
        h.bodies(ch),
        ["m1"],
        "the second had nowhere to go and was dropped"
    );
    assert_eq!(h.ready("q"), 0);
}

#[test]
fn a_requeue_into_a_full_drop_head_queue_drops_from_the_head() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[("x-max-length", int(2))]))
        .unwrap();
    let ch = h.open(1);
    h.publish("", "q", "m1");
    let d = h.get(ch, "q", false).unwrap();
    h.publish("", "q", "m2");
    h.publish("", "q", "m3");
    h.nack(ch, d.delivery_tag, false, true).unwrap();
    assert_eq!(h.bodies(sink), ["m1"]);
    assert_eq!(h.drain(ch, "q"), ["m2", "m3"]);
}

#[test]
fn a_requeued_message_keeps_its_expiry() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[("x-message-ttl", int(100))]))
        .unwrap();
    h.publish("", "q", "m");
    let ch = h.open(1);
    let d = h.get(ch, "q", false).unwrap();
    h.advance(200);
    h.nack(ch, d.delivery_tag, false, true).unwrap();
    assert!(h.get(ch, "q", false).is_none());
    let got = h.deliveries(sink);
    assert_eq!(got.len(), 1);
    assert_eq!(text(&field(&x_death(&got[0])[0], "reason")), "expired");
}

#[test]
fn an_old_rejection_does_not_excuse_a_later_expiry_cycle() {
    // RabbitMQ's is_cycle only looks at the deaths since the message last died in the target
    // queue: a rejection before that does not break an automatic expired loop.
    let mut h = Harness::new();
    h.declare_args("a", dead_letters_to("b", None)).unwrap();
    h.declare_args("b", dead_letters_to("c", Some(10))).unwrap();
    h.declare_args("c", dead_letters_to("b", Some(10))).unwrap();
    h.publish("", "a", "m");
    let ch = h.open(1);
    h.get(ch, "a", false).unwrap();
    h.nack(ch, 1, false, false).unwrap();
    assert_eq!(h.ready("b"), 1);
    h.advance(11);
    h.tick();
    assert_eq!(h.ready("c"), 1);
    h.advance(11);
    h.tick();
    assert_eq!(
        (h.ready("a"), h.ready("b"), h.ready("c")),
        (0, 0, 0),
        "c -> b would repeat b's expiry: dropped"
    );
}

#[test]
fn a_rejection_inside_the_loop_lets_the_message_go_round_again() {
    let mut h = Harness::new();
    h.declare_args(
        "b",
        table(&[
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("c")),
        ]),
    )
    .unwrap();
    h.declare_args(
        "c",
        table(&[
            ("x-message-ttl", int(10)),
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("b")),
        ]),
    )
    .unwrap();
    h.publish("", "b", "m");
    let ch = h.open(1);
    for _ in 0..3 {
        let d = h.get(ch, "b", false).expect("back in b");
        h.nack(ch, d.delivery_tag, false, false).unwrap();
        h.advance(11);
        h.tick();
    }
}

#[test]
fn consuming_from_a_quorum_queue_with_global_qos_is_540() {
    let mut h = Harness::new();
    quorum(&mut h, "qq", &[]);
    let ch = h.open(1);
    h.qos(ch, 10, true);
    let err = h
        .consume_with(ch, "qq", "c", false, false, Default::default())
        .unwrap_err();
    assert_eq!(err.code, 540);
    assert_eq!(
        err.text,
        "NOT_IMPLEMENTED - queue 'qq' in vhost '/' does not support global qos"
    );
    // A per-consumer limit is fine, and so is a global limit of 0 (no limit).
    let other = h.open(1);
    h.qos(other, 10, false);
    h.qos(other, 0, true);
    h.consume_with(other, "qq", "c", false, false, Default::default())
        .unwrap();
}

#[test]
fn a_quorum_queue_cannot_be_server_named() {
    let mut h = Harness::new();
    let err = h
        .declare_with(1, "", true, table(&[("x-queue-type", long_str("quorum"))]))
        .unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue"
    );
}

#[test]
fn a_message_is_dead_from_publish_plus_ttl_on() {
    // rabbit_amqqueue_process drops a message when Now >= Expiry.
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-message-ttl", int(100))]))
        .unwrap();
    h.publish("", "q", "m");
    h.advance(99);
    let ch = h.open(1);
    assert!(h.get(ch, "q", false).is_some(), "alive 99 ms after publish");
    h.nack(ch, 1, false, true).unwrap();
    h.advance(1);
    assert!(h.get(ch, "q", false).is_none(), "dead 100 ms after publish");
}

#[test]
fn ttl_zero_delivers_to_a_waiting_consumer_or_expires_at_once() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args("q", dlx_args(&[("x-message-ttl", int(0))]))
        .unwrap();
    let ch = h.open(1);
    h.qos(ch, 1, false);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 2);
    assert_eq!(h.bodies(ch), ["m1"], "a consumer with credit gets it");
    let got = h.deliveries(sink);
    assert_eq!(got.len(), 1, "nobody could take m2: it expired at once");
    assert_eq!(got[0].body_str(), "m2");
    assert_eq!(text(&field(&x_death(&got[0])[0], "reason")), "expired");
    assert_eq!(h.ready("q"), 0);
}

#[test]
fn per_message_expiration_zero_expires_at_once_without_a_consumer() {
    let mut h = Harness::new();
    h.declare("q");
    h.publish_props("", "q", with_expiration("0"), "gone")
        .unwrap();
    h.publish("", "q", "kept");
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "q"), ["kept"]);
}

#[test]
fn quorum_queues_put_rejected_messages_at_the_back_in_the_order_they_came_back() {
    // Measured on RabbitMQ 3.10.8 by the interop suite (test_quorum.py): a message a client
    // rejects or nacks with requeue goes behind the messages already waiting.
    let mut h = Harness::new();
    quorum(&mut h, "qq", &[]);
    publish_n(&mut h, "qq", 4);
    let ch = h.open(1);
    for _ in 0..3 {
        h.get(ch, "qq", false).unwrap();
    }
    h.nack(ch, 3, false, true).unwrap();
    h.nack(ch, 1, false, true).unwrap();
    assert_eq!(h.drain(ch, "qq"), ["m4", "m3", "m1"]);
    h.nack(ch, 2, false, true).unwrap();
    assert_eq!(h.drain(ch, "qq"), ["m2"]);
}

#[test]
fn classic_queues_put_returned_messages_back_in_their_original_place() {
    let mut h = Harness::new();
    h.declare("q");
    publish_n(&mut h, "q", 4);
    let ch = h.open(1);
    for _ in 0..3 {
        h.get(ch, "q", false).unwrap();
    }
    h.nack(ch, 3, false, true).unwrap();
    h.nack(ch, 1, false, true).unwrap();
    assert_eq!(h.drain(ch, "q"), ["m1", "m3", "m4"]);
}

#[test]
fn a_dead_letter_refused_by_a_full_reject_publish_dlx_queue_is_dead_lettered_again() {
    let mut h = Harness::new();
    let sink = dead_letter_sink(&mut h);
    h.declare_args(
        "full",
        dlx_args(&[
            ("x-max-length", int(0)),
            ("x-overflow", long_str("reject-publish-dlx")),
        ]),
    )
    .unwrap();
    h.declare_args(
        "q",
        table(&[
            ("x-dead-letter-exchange", long_str("")),
            ("x-dead-letter-routing-key", long_str("full")),
        ]),
    )
    .unwrap();
    h.publish("", "q", "m");
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    h.nack(ch, 1, false, false).unwrap();
    let got = h.deliveries(sink);
    assert_eq!(got.len(), 1);
    let summary: Vec<(String, String)> = x_death(&got[0])
        .iter()
        .map(|t| (text(&field(t, "queue")), text(&field(t, "reason"))))
        .collect();
    assert_eq!(
        summary,
        [
            ("full".to_string(), "maxlen".to_string()),
            ("q".to_string(), "rejected".to_string())
        ]
    );
}

#[test]
fn a_dead_letter_is_routed_by_its_bcc_keys_too_but_never_shows_them() {
    // RabbitMQ strips BCC from the content but keeps its keys among the message's routing
    // keys, which route the dead letter when the queue sets no dead-letter routing key.
    let mut h = Harness::new();
    h.exchange("dlx", "direct");
    h.declare("by-key");
    h.declare("by-bcc");
    h.bind("by-key", "dlx", "k");
    h.bind("by-bcc", "dlx", "hidden");
    h.declare_args("q", dlx_args(&[])).unwrap();
    h.bind("q", "amq.direct", "k");
    let props = with_headers(table(&[("BCC", str_array(&["hidden"]))]));
    h.publish_props("amq.direct", "k", props, "m").unwrap();
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    h.nack(ch, 1, false, false).unwrap();
    let a = h.get(ch, "by-key", true).expect("routed by its key");
    let b = h.get(ch, "by-bcc", true).expect("routed by its BCC key");
    for d in [&a, &b] {
        assert_eq!(d.header("BCC"), None);
        assert_eq!(field(&x_death(d)[0], "routing-keys"), str_array(&["k"]));
    }
}
