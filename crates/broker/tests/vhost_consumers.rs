//! Consumers and acknowledgements: round-robin, priorities, single-active and exclusive
//! consumers, prefetch, ack/nack/reject/recover, and what closing a channel gives back.

mod support;

use support::*;
use warren_protocol::AMQPValue;

fn publish_n(h: &mut Harness, queue: &str, n: usize) {
    for i in 1..=n {
        h.publish("", queue, &format!("m{i}"));
    }
}

fn tags(ds: &[Delivery]) -> Vec<u64> {
    ds.iter().map(|d| d.delivery_tag).collect()
}

fn bodies(ds: &[Delivery]) -> Vec<&str> {
    ds.iter().map(|d| d.body_str()).collect()
}

// ---- distribution ------------------------------------------------------------------------

#[test]
fn consumers_on_one_queue_get_messages_round_robin() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(1);
    let b = h.open(2);
    let c = h.open(2);
    h.consume(a, "q", "a", true);
    h.consume(b, "q", "b", true);
    h.consume(c, "q", "c", true);
    publish_n(&mut h, "q", 7);
    assert_eq!(h.bodies(a), ["m1", "m4", "m7"]);
    assert_eq!(h.bodies(b), ["m2", "m5"]);
    assert_eq!(h.bodies(c), ["m3", "m6"]);
}

#[test]
fn two_consumers_on_one_channel_share_its_delivery_tags() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "a", false);
    h.consume(ch, "q", "b", false);
    publish_n(&mut h, "q", 4);
    let got = h.deliveries(ch);
    assert_eq!(tags(&got), [1, 2, 3, 4]);
    let ctags: Vec<_> = got
        .iter()
        .map(|d| d.consumer_tag.clone().unwrap())
        .collect();
    assert_eq!(ctags, ["a", "b", "a", "b"]);
}

#[test]
fn a_backlog_is_delivered_when_a_consumer_arrives() {
    let mut h = Harness::new();
    h.declare("q");
    publish_n(&mut h, "q", 3);
    assert_eq!(h.ready("q"), 3);
    let ch = h.open(1);
    h.consume(ch, "q", "c", false);
    assert_eq!(h.bodies(ch), ["m1", "m2", "m3"]);
    assert_eq!((h.ready("q"), h.unacked("q")), (0, 3));
}

#[test]
fn higher_priority_consumers_get_messages_while_they_have_credit() {
    let mut h = Harness::new();
    h.declare("q");
    let low = h.open(1);
    let high = h.open(1);
    h.consume_with(
        low,
        "q",
        "low",
        false,
        false,
        table(&[("x-priority", int(1))]),
    )
    .unwrap();
    h.qos(high, 2, false);
    h.consume_with(
        high,
        "q",
        "high",
        false,
        false,
        table(&[("x-priority", AMQPValue::LongInt(10))]),
    )
    .unwrap();
    publish_n(&mut h, "q", 5);
    assert_eq!(h.bodies(high), ["m1", "m2"]);
    assert_eq!(h.bodies(low), ["m3", "m4", "m5"]);
    // Once the high-priority consumer has credit again it is preferred again.
    h.ack(high, 1, false).unwrap();
    publish_n(&mut h, "q", 1);
    assert_eq!(h.bodies(high), ["m1"]);
    assert!(h.bodies(low).is_empty());
}

#[test]
fn consumers_of_equal_priority_round_robin_above_lower_ones() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    for (tag, p) in [("a", 5), ("low", 0), ("b", 5)] {
        h.consume_with(ch, "q", tag, true, false, table(&[("x-priority", int(p))]))
            .unwrap();
    }
    publish_n(&mut h, "q", 4);
    let got = h.deliveries(ch);
    let ctags: Vec<_> = got
        .iter()
        .map(|d| d.consumer_tag.clone().unwrap())
        .collect();
    assert_eq!(ctags, ["a", "b", "a", "b"]);
}

#[test]
fn x_priority_that_is_not_an_integer_is_406() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    let err = h
        .consume_with(
            ch,
            "q",
            "c",
            false,
            false,
            table(&[("x-priority", long_str("high"))]),
        )
        .unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'q' in vhost '/': \"expected integer, got longstr\""
    );
}

#[test]
fn single_active_consumer_only_the_first_gets_messages() {
    let mut h = Harness::new();
    h.declare_args(
        "q",
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .unwrap();
    let a = h.open(1);
    let b = h.open(2);
    h.qos(a, 2, false);
    h.consume(a, "q", "a", false);
    h.consume(b, "q", "b", false);
    publish_n(&mut h, "q", 4);
    assert_eq!(h.bodies(a), ["m1", "m2"]);
    assert!(
        h.bodies(b).is_empty(),
        "the waiting consumer gets nothing, even when the active one is out of credit"
    );
    assert_eq!(h.ready("q"), 2);
}

#[test]
fn single_active_consumer_the_next_takes_over_on_cancel() {
    let mut h = Harness::new();
    h.declare_args(
        "q",
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .unwrap();
    let a = h.open(1);
    let b = h.open(2);
    h.consume(a, "q", "a", true);
    h.consume(b, "q", "b", true);
    publish_n(&mut h, "q", 2);
    assert_eq!(h.bodies(a), ["m1", "m2"]);
    assert!(h.cancel(a, "a"));
    publish_n(&mut h, "q", 1);
    assert_eq!(h.bodies(b), ["m1"]);
    assert!(h.bodies(a).is_empty());
}

#[test]
fn single_active_consumer_the_next_takes_over_the_requeued_messages_on_close() {
    let mut h = Harness::new();
    h.declare_args(
        "q",
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .unwrap();
    let a = h.open(1);
    let b = h.open(2);
    h.consume(a, "q", "a", false);
    h.consume(b, "q", "b", false);
    publish_n(&mut h, "q", 2);
    assert_eq!(h.bodies(a), ["m1", "m2"]);
    h.close(a);
    let got = h.deliveries(b);
    assert_eq!(bodies(&got), ["m1", "m2"]);
    assert!(got.iter().all(|d| d.redelivered));
}

#[test]
fn a_second_consumer_on_an_exclusively_consumed_queue_is_403() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(1);
    let b = h.open(2);
    h.consume_with(a, "q", "a", false, true, Default::default())
        .unwrap();
    let err = h
        .consume_with(b, "q", "b", false, false, Default::default())
        .unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.text,
        "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use"
    );
    // And the other way round: no exclusive consumer on a queue that already has one.
    h.declare("r");
    h.consume(b, "r", "plain", false);
    let err = h
        .consume_with(a, "r", "excl", false, true, Default::default())
        .unwrap_err();
    assert_eq!(err.code, 403);
    // Once the exclusive consumer is cancelled, others may consume.
    assert!(h.cancel(a, "a"));
    h.consume_with(b, "q", "b", false, false, Default::default())
        .unwrap();
}

#[test]
fn reusing_a_consumer_tag_on_a_channel_is_530() {
    let mut h = Harness::new();
    h.declare("q");
    h.declare("r");
    let ch = h.open(1);
    h.consume(ch, "q", "same", false);
    let err = h
        .consume_with(ch, "r", "same", false, false, Default::default())
        .unwrap_err();
    assert_eq!(err.code, 530);
    assert_eq!(
        err.text,
        "NOT_ALLOWED - attempt to reuse consumer tag 'same'"
    );
}

#[test]
fn consuming_from_a_missing_queue_is_404() {
    let mut h = Harness::new();
    let ch = h.open(1);
    let err = h
        .consume_with(ch, "nope", "c", false, false, Default::default())
        .unwrap_err();
    assert_eq!(err.code, 404);
    assert_eq!(err.text, "NOT_FOUND - no queue 'nope' in vhost '/'");
}

#[test]
fn an_empty_consumer_tag_gets_a_generated_one() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    let tag = h.consume(ch, "q", "", true);
    assert!(tag.starts_with("amq.ctag-"), "{tag}");
    publish_n(&mut h, "q", 1);
    assert_eq!(
        h.deliveries(ch)[0].consumer_tag.as_deref(),
        Some(tag.as_str())
    );
}

#[test]
fn cancelled_consumers_get_nothing_more() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "c", true);
    assert!(h.cancel(ch, "c"));
    assert!(!h.cancel(ch, "c"), "a second cancel finds no consumer");
    publish_n(&mut h, "q", 1);
    assert!(h.bodies(ch).is_empty());
    assert_eq!(h.ready("q"), 1);
}

// ---- prefetch ----------------------------------------------------------------------------

#[test]
fn per_consumer_prefetch_limits_unacked_deliveries_and_acks_resume_them() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.qos(ch, 2, false);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 5);
    assert_eq!(h.bodies(ch), ["m1", "m2"]);
    h.ack(ch, 1, false).unwrap();
    assert_eq!(h.bodies(ch), ["m3"]);
    h.ack(ch, 3, true).unwrap();
    assert_eq!(h.bodies(ch), ["m4", "m5"]);
    assert_eq!((h.ready("q"), h.unacked("q")), (0, 2));
}

#[test]
fn per_consumer_prefetch_applies_to_each_consumer_separately() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.qos(ch, 1, false);
    h.consume(ch, "q", "a", false);
    h.consume(ch, "q", "b", false);
    publish_n(&mut h, "q", 4);
    let got = h.deliveries(ch);
    assert_eq!(bodies(&got), ["m1", "m2"]);
    assert_eq!(h.ready("q"), 2);
}

#[test]
fn per_consumer_prefetch_applies_only_to_consumers_created_after_qos() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "before", false);
    h.qos(ch, 1, false);
    publish_n(&mut h, "q", 3);
    assert_eq!(h.bodies(ch), ["m1", "m2", "m3"]);
}

#[test]
fn per_channel_prefetch_is_shared_by_the_channels_consumers() {
    let mut h = Harness::new();
    h.declare("q1");
    h.declare("q2");
    let ch = h.open(1);
    h.qos(ch, 3, true);
    h.consume(ch, "q1", "a", false);
    h.consume(ch, "q2", "b", false);
    publish_n(&mut h, "q1", 2);
    publish_n(&mut h, "q2", 2);
    assert_eq!(h.deliveries(ch).len(), 3);
    assert_eq!(h.ready("q1") + h.ready("q2"), 1);
    h.ack(ch, 0, true).unwrap();
    assert_eq!(h.deliveries(ch).len(), 1);
}

#[test]
fn per_consumer_and_per_channel_limits_both_apply() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.qos(ch, 2, false);
    h.qos(ch, 3, true);
    h.consume(ch, "q", "a", false);
    h.consume(ch, "q", "b", false);
    publish_n(&mut h, "q", 10);
    assert_eq!(h.deliveries(ch).len(), 3, "the channel limit binds first");
    h.cancel(ch, "b");
    h.ack(ch, 0, true).unwrap();
    assert_eq!(h.deliveries(ch).len(), 2, "then the consumer limit");
}

#[test]
fn raising_the_prefetch_delivers_more_at_once() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.qos(ch, 1, true);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 4);
    assert_eq!(h.bodies(ch), ["m1"]);
    h.qos(ch, 3, true);
    assert_eq!(h.bodies(ch), ["m2", "m3"]);
}

#[test]
fn no_ack_consumers_ignore_prefetch() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.qos(ch, 1, false);
    h.qos(ch, 1, true);
    h.consume(ch, "q", "c", true);
    publish_n(&mut h, "q", 5);
    let got = h.deliveries(ch);
    assert_eq!(got.len(), 5);
    assert_eq!(h.unacked("q"), 0);
    // Acking a no-ack delivery is an unknown tag.
    let err = h.ack(ch, 1, false).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 1");
}

#[test]
fn basic_get_deliveries_do_not_count_towards_the_channel_prefetch() {
    // RabbitMQ's limiter counts consumer deliveries only: a basic.get neither takes channel
    // credit nor gives it back when acked (rabbit_channel:notify_limiter skips get tags).
    let mut h = Harness::new();
    h.declare("q");
    publish_n(&mut h, "q", 4);
    let ch = h.open(1);
    h.qos(ch, 1, true);
    let got = h.get(ch, "q", false).unwrap();
    assert_eq!(got.body_str(), "m1");
    h.consume(ch, "q", "c", false);
    assert_eq!(h.bodies(ch), ["m2"]);
    h.ack(ch, got.delivery_tag, false).unwrap();
    assert!(
        h.bodies(ch).is_empty(),
        "acking the get frees no consumer credit"
    );
    h.ack(ch, 2, false).unwrap();
    assert_eq!(h.bodies(ch), ["m3"]);
}

// ---- ack / nack / reject -----------------------------------------------------------------

/// A queue with m1..m`n` delivered (unacked) to consumer "c" on a fresh channel.
fn delivered(h: &mut Harness, n: usize) -> u64 {
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "c", false);
    publish_n(h, "q", n);
    assert_eq!(h.deliveries(ch).len(), n);
    ch
}

#[test]
fn ack_single_settles_only_that_tag() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 3);
    h.ack(ch, 2, false).unwrap();
    assert_eq!(h.unacked("q"), 2);
    h.close(ch);
    let ch2 = h.open(2);
    let left: Vec<_> = std::iter::from_fn(|| h.get(ch2, "q", true))
        .map(|d| d.body_str().to_string())
        .collect();
    assert_eq!(left, ["m1", "m3"]);
}

#[test]
fn ack_multiple_settles_everything_up_to_the_tag() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 4);
    h.ack(ch, 3, true).unwrap();
    assert_eq!(h.unacked("q"), 1);
    h.close(ch);
    let ch2 = h.open(2);
    assert_eq!(h.drain(ch2, "q"), ["m4"]);
}

#[test]
fn ack_multiple_with_tag_zero_settles_everything() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 4);
    h.ack(ch, 0, true).unwrap();
    assert_eq!(h.unacked("q"), 0);
    h.close(ch);
    assert_eq!(h.ready("q"), 0);
}

#[test]
fn ack_of_an_unknown_tag_is_406() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 2);
    let err = h.ack(ch, 7, false).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 7");
    let err = h.ack(ch, 7, true).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 7");
    let err = h.ack(ch, 0, false).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 0");
    let err = h.nack(ch, 9, false, true).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 9");
    assert_eq!(h.unacked("q"), 2, "a failed ack settles nothing");
}

#[test]
fn acking_a_tag_twice_is_406() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 3);
    h.ack(ch, 2, false).unwrap();
    let err = h.ack(ch, 2, false).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 2");
    let err = h.ack(ch, 2, true).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 2");
    // multiple up to a live tag skips the one already settled.
    h.ack(ch, 3, true).unwrap();
    assert_eq!(h.unacked("q"), 0);
    let err = h.ack(ch, 1, false).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 1");
}

#[test]
fn ack_multiple_after_a_multiple_ack_with_tag_zero_is_406() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 2);
    h.ack(ch, 0, true).unwrap();
    // Nothing outstanding: multiple with tag 0 is fine in RabbitMQ (an empty ack).
    h.ack(ch, 0, true).unwrap();
    let err = h.ack(ch, 2, true).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 2");
}

#[test]
fn nack_requeue_puts_messages_back_at_the_head_in_order_and_redelivered() {
    let mut h = Harness::new();
    h.declare("q");
    publish_n(&mut h, "q", 5);
    let ch = h.open(1);
    let got: Vec<_> = (0..3).map(|_| h.get(ch, "q", false).unwrap()).collect();
    assert_eq!(bodies(&got), ["m1", "m2", "m3"]);
    assert!(got.iter().all(|d| !d.redelivered));
    assert_eq!(got[2].message_count, Some(2));
    h.nack(ch, 3, true, true).unwrap();
    let again: Vec<_> = std::iter::from_fn(|| h.get(ch, "q", true)).collect();
    assert_eq!(bodies(&again), ["m1", "m2", "m3", "m4", "m5"]);
    let redelivered: Vec<_> = again.iter().map(|d| d.redelivered).collect();
    assert_eq!(redelivered, [true, true, true, false, false]);
}

#[test]
fn nack_requeue_redelivers_to_the_consumer_in_order() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.qos(ch, 3, false);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 5);
    assert_eq!(tags(&h.deliveries(ch)), [1, 2, 3]);
    h.nack(ch, 0, true, true).unwrap();
    let got = h.deliveries(ch);
    assert_eq!(bodies(&got), ["m1", "m2", "m3"]);
    assert_eq!(
        tags(&got),
        [4, 5, 6],
        "redeliveries get fresh delivery tags"
    );
    assert!(got.iter().all(|d| d.redelivered));
}

#[test]
fn reject_of_a_middle_tag_requeues_only_it_at_the_head() {
    let mut h = Harness::new();
    h.declare("q");
    publish_n(&mut h, "q", 4);
    let ch = h.open(1);
    for _ in 0..3 {
        h.get(ch, "q", false).unwrap();
    }
    // basic.reject is a nack of one tag.
    h.nack(ch, 2, false, true).unwrap();
    let d = h.get(ch, "q", true).unwrap();
    assert_eq!((d.body_str(), d.redelivered), ("m2", true));
    assert_eq!(h.get(ch, "q", true).unwrap().body_str(), "m4");
    assert_eq!(h.unacked("q"), 2);
}

#[test]
fn nack_without_requeue_and_no_dlx_drops_the_messages() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 3);
    h.nack(ch, 2, true, false).unwrap();
    assert_eq!((h.ready("q"), h.unacked("q")), (0, 1));
    h.close(ch);
    let ch2 = h.open(2);
    assert_eq!(h.drain(ch2, "q"), ["m3"]);
}

#[test]
fn basic_recover_redelivers_every_unacked_message() {
    let mut h = Harness::new();
    let ch = delivered(&mut h, 3);
    h.ack(ch, 2, false).unwrap();
    h.recover(ch);
    let got = h.deliveries(ch);
    assert_eq!(bodies(&got), ["m1", "m3"]);
    assert!(got.iter().all(|d| d.redelivered));
    assert_eq!(tags(&got), [4, 5]);
    assert_eq!(h.unacked("q"), 2);
    let err = h.ack(ch, 1, false).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 1");
    h.ack(ch, 5, true).unwrap();
    assert_eq!(h.unacked("q"), 0);
}

#[test]
fn basic_recover_keeping_leaves_the_kept_tags_outstanding() {
    // A transactional channel's recover: what its open transaction acked stays unacked (for
    // the commit to settle) and is not delivered again; the rest is redelivered.
    let mut h = Harness::new();
    let ch = delivered(&mut h, 4);
    let now = h.now_ms;
    h.vh.basic_recover_keeping(ch, |tag| tag == 1 || tag == 3, now);
    let got = h.deliveries(ch);
    assert_eq!(bodies(&got), ["m2", "m4"]);
    assert_eq!(tags(&got), [5, 6]);
    assert_eq!(h.unacked("q"), 4);
    h.ack(ch, 3, false).unwrap();
    h.ack(ch, 1, false).unwrap();
    assert_eq!(h.unacked("q"), 2);
    let err = h.ack(ch, 2, false).unwrap_err();
    assert_eq!(err.text, "PRECONDITION_FAILED - unknown delivery tag 2");
}

#[test]
fn basic_get_on_an_empty_queue_is_get_empty_and_counts_remaining() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    assert!(h.get(ch, "q", false).is_none());
    publish_n(&mut h, "q", 2);
    let d = h.get(ch, "q", false).unwrap();
    assert_eq!(d.message_count, Some(1));
    assert_eq!(d.delivery_tag, 1);
    assert_eq!(d.exchange, "");
    assert_eq!(d.routing_key, "q");
    let err = h.try_get(ch, "nope", false).unwrap_err();
    assert_eq!(err.text, "NOT_FOUND - no queue 'nope' in vhost '/'");
}

// ---- closing -----------------------------------------------------------------------------

#[test]
fn channel_close_requeues_unacked_in_order_and_redelivered_to_another_consumer() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(1);
    h.consume(a, "q", "a", false);
    publish_n(&mut h, "q", 4);
    assert_eq!(h.deliveries(a).len(), 4);
    h.ack(a, 2, false).unwrap();
    let b = h.open(2);
    h.consume(b, "q", "b", false);
    h.close(a);
    let got = h.deliveries(b);
    assert_eq!(bodies(&got), ["m1", "m3", "m4"]);
    assert!(got.iter().all(|d| d.redelivered));
    assert_eq!(h.vh.queue_stats("q"), Some((0, 3, 1)));
}

#[test]
fn channel_close_cancels_its_consumers() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(1);
    h.consume(a, "q", "a", true);
    h.close(a);
    assert_eq!(h.vh.queue_stats("q"), Some((0, 0, 0)));
    publish_n(&mut h, "q", 1);
    assert_eq!(h.ready("q"), 1);
}

#[test]
fn requeued_messages_go_ahead_of_the_backlog() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(1);
    h.qos(a, 2, false);
    h.consume(a, "q", "a", false);
    publish_n(&mut h, "q", 4);
    assert_eq!(h.bodies(a), ["m1", "m2"]);
    h.close(a);
    let b = h.open(2);
    assert_eq!(h.drain(b, "q"), ["m1", "m2", "m3", "m4"]);
}

#[test]
fn connection_close_requeues_from_all_its_channels() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(7);
    let b = h.open(7);
    h.qos(a, 1, false);
    h.qos(b, 1, false);
    h.consume(a, "q", "a", false);
    h.consume(b, "q", "b", false);
    publish_n(&mut h, "q", 3);
    h.close_connection(7);
    assert_eq!(h.vh.queue_stats("q"), Some((3, 0, 0)));
    let c = h.open(8);
    let got: Vec<_> = std::iter::from_fn(|| h.get(c, "q", true)).collect();
    assert_eq!(bodies(&got), ["m1", "m2", "m3"]);
    let redelivered: Vec<_> = got.iter().map(|d| d.redelivered).collect();
    assert_eq!(redelivered, [true, true, false]);
}

#[test]
fn a_cancelled_consumers_deliveries_stay_unacked_on_the_channel() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "c", false);
    publish_n(&mut h, "q", 3);
    assert_eq!(h.deliveries(ch).len(), 3);
    assert!(h.cancel(ch, "c"));
    assert_eq!(h.unacked("q"), 3, "cancel does not requeue");
    h.ack(ch, 1, false).unwrap();
    h.nack(ch, 2, false, true).unwrap();
    assert_eq!((h.ready("q"), h.unacked("q")), (1, 1));
    h.close(ch);
    let other = h.open(2);
    let left: Vec<_> = std::iter::from_fn(|| h.get(other, "q", true)).collect();
    assert_eq!(bodies(&left), ["m2", "m3"]);
    assert!(left.iter().all(|d| d.redelivered));
}

#[test]
fn basic_get_takes_from_a_queue_whose_consumers_have_no_credit() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(1);
    h.qos(a, 1, false);
    h.consume(a, "q", "c", false);
    publish_n(&mut h, "q", 3);
    assert_eq!(h.bodies(a), ["m1"]);
    let b = h.open(2);
    let d = h.get(b, "q", false).unwrap();
    assert_eq!((d.body_str(), d.message_count), ("m2", Some(1)));
    // Acking the consumer's delivery gives it m3, not the one basic.get holds.
    h.ack(a, 1, false).unwrap();
    assert_eq!(h.bodies(a), ["m3"]);
    h.nack(b, d.delivery_tag, false, true).unwrap();
    assert!(
        h.bodies(a).is_empty(),
        "the consumer is out of credit again"
    );
    assert_eq!(h.ready("q"), 1);
}

#[test]
fn single_active_consumer_with_no_ack_gets_everything() {
    let mut h = Harness::new();
    h.declare_args(
        "q",
        table(&[("x-single-active-consumer", AMQPValue::Boolean(true))]),
    )
    .unwrap();
    let a = h.open(1);
    h.consume(a, "q", "a", true);
    h.consume(a, "q", "b", true);
    publish_n(&mut h, "q", 3);
    let got = h.deliveries(a);
    assert!(got.iter().all(|d| d.consumer_tag.as_deref() == Some("a")));
    assert_eq!(got.len(), 3);
}

#[test]
fn a_congested_outbox_pauses_deliveries_until_the_connection_resumes() {
    use warren_broker::outbox::OUTBOX_BYTES_SOFT_MAX;
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "c", true);
    let body = "x".repeat(1 << 20);
    let n = OUTBOX_BYTES_SOFT_MAX / body.len() + 2;
    for _ in 0..n {
        h.publish("", "q", &body);
    }
    assert!(h.outbox(ch).is_congested());
    let first = h.deliveries(ch).len();
    assert!(
        first < n,
        "deliveries stop once the outbox is over its bound"
    );
    assert_eq!(h.ready("q"), n - first);
    h.vh.resume_connection(1, h.now_ms);
    assert_eq!(h.deliveries(ch).len(), n - first);
    assert_eq!(h.ready("q"), 0);
}

#[test]
fn channel_flow_off_pauses_every_consumer_of_the_channel_until_it_is_on() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "acking", false);
    h.consume(ch, "q", "no-ack", true);
    h.vh.channel_flow(ch, false, h.now_ms);
    publish_n(&mut h, "q", 4);
    assert!(h.bodies(ch).is_empty(), "no-ack consumers are paused too");
    h.vh.channel_flow(ch, true, h.now_ms);
    assert_eq!(h.bodies(ch), ["m1", "m2", "m3", "m4"]);
}

#[test]
fn large_bodies_are_split_into_frames_within_frame_max() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open_with_frame_max(1, 4096);
    h.consume(ch, "q", "c", true);
    let body: String = (0..10_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    h.publish("", "q", &body);
    // The decoder checks every frame against the negotiated 4096-byte limit.
    let mut raw = h.outbox(ch).take();
    let mut frames = 0;
    while let Some(f) = warren_protocol::frame::decode(&mut raw, 4096).expect("within frame-max") {
        frames += 1;
        assert!(f.payload.len() <= 4096 - 8);
    }
    assert_eq!(frames, 2 + 3, "method, header and three body frames");
    h.publish("", "q", &body);
    let got = h.deliveries(ch);
    assert_eq!(got[0].body_str(), body);
}

#[test]
fn a_per_consumer_qos_lifts_an_earlier_channel_limit() {
    // rabbit_channel's basic.qos global=false calls rabbit_limiter:unlimit_prefetch: clients
    // wanting both limits set the per-consumer one first.
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.qos(ch, 3, true);
    h.qos(ch, 2, false);
    h.consume(ch, "q", "a", false);
    h.consume(ch, "q", "b", false);
    publish_n(&mut h, "q", 10);
    assert_eq!(
        h.deliveries(ch).len(),
        4,
        "2 per consumer, no channel limit left"
    );
}

#[test]
fn a_channel_limit_used_up_by_ack_consumers_holds_back_its_no_ack_consumers() {
    // RabbitMQ's limiter refuses every send at the limit, no-ack ones included, and counts
    // only the deliveries that need an ack (measured on 3.10.8).
    let mut h = Harness::new();
    h.declare("acked");
    h.declare("free");
    let ch = h.open(1);
    h.qos(ch, 1, true);
    h.consume(ch, "acked", "a", false);
    h.consume(ch, "free", "n", true);
    publish_n(&mut h, "acked", 2);
    publish_n(&mut h, "free", 2);
    let got = h.deliveries(ch);
    assert_eq!(bodies(&got), ["m1"], "the no-ack consumer waits too");
    h.ack(ch, got[0].delivery_tag, false).unwrap();
    let got = h.deliveries(ch);
    // The freed credit goes round the queues: the no-ack consumer's message does not use it,
    // the ack-mode one's then does, and the second no-ack message waits again.
    let from: Vec<_> = got
        .iter()
        .map(|d| (d.consumer_tag.clone().unwrap(), d.body_str().to_string()))
        .collect();
    assert_eq!(from, [("n".into(), "m1".into()), ("a".into(), "m2".into())]);
    assert_eq!(h.ready("free"), 1);
}

#[test]
fn a_channel_limit_serves_the_channels_queues_in_turn() {
    // Freed credit goes to the queue after the one served last, so a consumer set on several
    // queues gets from each in turn instead of draining one first (RabbitMQ's limiter resumes
    // its blocked queues from a random point for the same fairness).
    let mut h = Harness::new();
    for q in ["a", "b", "c"] {
        h.declare(q);
        for i in 1..=3 {
            h.publish("", q, &format!("{q}{i}"));
        }
    }
    let ch = h.open(1);
    h.qos(ch, 1, true);
    for q in ["a", "b", "c"] {
        h.consume(ch, q, q, false);
    }
    let mut order = Vec::new();
    for _ in 0..9 {
        let got = h.deliveries(ch);
        assert_eq!(got.len(), 1, "one at a time under the limit");
        order.push(got[0].body_str().to_string());
        h.ack(ch, got[0].delivery_tag, false).unwrap();
    }
    assert_eq!(
        order,
        ["a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"]
    );
    // With more credit freed at once (a raised limit), it is shared one message at a time.
    for q in ["a", "b", "c"] {
        h.publish("", q, &format!("{q}4"));
        h.publish("", q, &format!("{q}5"));
    }
    let first = h.deliveries(ch);
    assert_eq!(bodies(&first), ["a4"]);
    h.qos(ch, 4, true);
    assert_eq!(bodies(&h.deliveries(ch)), ["b4", "c4", "a5"]);
}
