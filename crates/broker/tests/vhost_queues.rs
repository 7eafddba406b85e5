//! Queue life cycle: declare (counts, passive, equivalence, exclusivity), purge, delete
//! (if-unused, if-empty, cancels consumers), exclusive and auto-delete queues, x-expires.

mod support;

use support::*;
use warren_protocol::AMQPValue;

const LOCKED: &str = "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'ex' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.";

fn declare_exclusive(h: &mut Harness, conn: u64, name: &str) {
    h.vh.queue_declare(
        conn,
        name,
        false,
        false,
        true,
        false,
        Default::default(),
        h.now_ms,
    )
    .unwrap();
}

fn declare_auto_delete(h: &mut Harness, name: &str) {
    h.vh.queue_declare(
        1,
        name,
        false,
        false,
        false,
        true,
        Default::default(),
        h.now_ms,
    )
    .unwrap();
}

fn passive(
    h: &mut Harness,
    conn: u64,
    name: &str,
) -> Result<warren_broker::vhost::DeclareOk, warren_broker::error::AmqpError> {
    h.vh.queue_declare(
        conn,
        name,
        true,
        false,
        false,
        false,
        Default::default(),
        h.now_ms,
    )
}

#[test]
fn declare_ok_counts_ready_messages_and_consumers() {
    let mut h = Harness::new();
    let ok = h.declare("q");
    assert_eq!(
        (ok.queue.as_str(), ok.message_count, ok.consumer_count),
        ("q", 0, 0)
    );
    for i in 0..3 {
        h.publish("", "q", &i.to_string());
    }
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    let ok = h.declare("q");
    assert_eq!(
        (ok.message_count, ok.consumer_count),
        (2, 0),
        "unacked is not counted"
    );
    h.consume(ch, "q", "c", false);
    let ok = passive(&mut h, 1, "q").unwrap();
    assert_eq!((ok.message_count, ok.consumer_count), (0, 1));
}

#[test]
fn passive_declare_of_a_missing_queue_is_404() {
    let mut h = Harness::new();
    let err = passive(&mut h, 1, "nope").unwrap_err();
    assert_eq!(err.code, 404);
    assert_eq!(err.text, "NOT_FOUND - no queue 'nope' in vhost '/'");
}

#[test]
fn an_empty_name_gets_a_server_generated_one() {
    let mut h = Harness::new();
    let a = h.declare("");
    let b = h.declare("");
    assert!(a.queue.starts_with("amq.gen-"), "{}", a.queue);
    assert_ne!(a.queue, b.queue);
    assert!(h.exists(&a.queue));
}

#[test]
fn a_reserved_amq_name_is_403() {
    let mut h = Harness::new();
    let err = h.declare_args("amq.mine", Default::default()).unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.text,
        "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'"
    );
}

#[test]
fn redeclare_with_other_durable_or_auto_delete_is_406() {
    let mut h = Harness::new();
    h.declare("q");
    let err = h
        .declare_with(1, "q", true, Default::default())
        .unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
    );
    let err =
        h.vh.queue_declare(
            1,
            "q",
            false,
            false,
            false,
            true,
            Default::default(),
            h.now_ms,
        )
        .unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue 'q' in vhost '/': received 'true' but current is 'false'"
    );
}

#[test]
fn redeclare_with_other_arguments_is_406() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-message-ttl", AMQPValue::LongInt(100))]))
        .unwrap();
    let err = h
        .declare_args("q", table(&[("x-message-ttl", AMQPValue::LongInt(200))]))
        .unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received '200' but current is '100'"
    );
    let err = h.declare_args("q", Default::default()).unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received none but current is the value '100' of type 'signedint'"
    );
    // The same number in another integer type is equivalent, as in RabbitMQ.
    h.declare_args("q", table(&[("x-message-ttl", int(100))]))
        .unwrap();
    // Arguments RabbitMQ does not compare may differ.
    h.declare_args(
        "q",
        table(&[
            ("x-message-ttl", int(100)),
            ("x-custom", long_str("anything")),
        ]),
    )
    .unwrap();
}

#[test]
fn redeclare_of_a_classic_queue_with_explicit_classic_type_is_equivalent() {
    let mut h = Harness::new();
    h.declare("q");
    h.declare_args("q", table(&[("x-queue-type", long_str("classic"))]))
        .unwrap();
}

#[test]
fn an_exclusive_queue_is_locked_to_its_connection() {
    let mut h = Harness::new();
    declare_exclusive(&mut h, 1, "ex");
    let other = h.open(2);
    let err = passive(&mut h, 2, "ex").unwrap_err();
    assert_eq!((err.code, err.text.as_str()), (405, LOCKED));
    let err =
        h.vh.queue_declare(
            2,
            "ex",
            false,
            false,
            true,
            false,
            Default::default(),
            h.now_ms,
        )
        .unwrap_err();
    assert_eq!(err.text, LOCKED);
    let err = h
        .consume_with(other, "ex", "c", false, false, Default::default())
        .unwrap_err();
    assert_eq!(err.text, LOCKED);
    let err = h.try_get(other, "ex", false).unwrap_err();
    assert_eq!(err.text, LOCKED);
    let err = h.vh.queue_purge(2, "ex").unwrap_err();
    assert_eq!(err.code, 405);
    let err = h.vh.queue_delete(2, "ex", false, false).unwrap_err();
    assert_eq!(err.code, 405);
    let err =
        h.vh.queue_bind(2, "ex", "amq.fanout", "", &Default::default())
            .unwrap_err();
    assert_eq!(err.code, 405);
    // The owner may use it; anyone may publish to it.
    let own = h.open(1);
    h.consume(own, "ex", "c", true);
    h.publish("", "ex", "m");
    assert_eq!(h.bodies(own), ["m"]);
}

#[test]
fn redeclaring_a_queue_with_another_exclusive_flag_is_405() {
    let mut h = Harness::new();
    h.declare("q");
    let err =
        h.vh.queue_declare(
            1,
            "q",
            false,
            false,
            true,
            false,
            Default::default(),
            h.now_ms,
        )
        .unwrap_err();
    assert_eq!(err.code, 405);
}

#[test]
fn exclusive_queues_are_deleted_when_their_connection_closes() {
    let mut h = Harness::new();
    declare_exclusive(&mut h, 1, "ex");
    h.declare("shared");
    let ch = h.open(1);
    h.consume(ch, "ex", "c", false);
    h.publish("", "ex", "m");
    h.close_connection(2);
    assert!(h.exists("ex"), "another connection closing leaves it");
    h.close_connection(1);
    assert!(!h.exists("ex"));
    assert!(h.exists("shared"));
    assert!(!h.publish("", "ex", "m").routed);
}

#[test]
fn auto_delete_queue_goes_when_its_last_consumer_is_cancelled() {
    let mut h = Harness::new();
    declare_auto_delete(&mut h, "ad");
    let ch = h.open(1);
    h.consume(ch, "ad", "a", false);
    h.consume(ch, "ad", "b", false);
    h.cancel(ch, "a");
    assert!(h.exists("ad"), "one consumer is left");
    h.cancel(ch, "b");
    assert!(!h.exists("ad"));
}

#[test]
fn auto_delete_queue_stays_until_it_had_a_consumer() {
    let mut h = Harness::new();
    declare_auto_delete(&mut h, "ad");
    let ch = h.open(1);
    h.publish("", "ad", "m");
    h.get(ch, "ad", false).unwrap();
    h.ack(ch, 1, false).unwrap();
    h.close(ch);
    h.advance(3_600_000);
    h.tick();
    assert!(
        h.exists("ad"),
        "basic.get and time do not delete an auto-delete queue"
    );
}

#[test]
fn auto_delete_queue_goes_when_its_consumers_channel_closes() {
    let mut h = Harness::new();
    declare_auto_delete(&mut h, "ad");
    let ch = h.open(1);
    h.consume(ch, "ad", "a", false);
    h.publish("", "ad", "m");
    h.close(ch);
    assert!(!h.exists("ad"));
}

#[test]
fn queue_delete_cancels_its_consumers_and_counts_ready_messages() {
    let mut h = Harness::new();
    h.declare("q");
    let a = h.open(1);
    let b = h.open(2);
    h.qos(a, 1, false);
    h.consume(a, "q", "ca", false);
    for i in 0..4 {
        h.publish("", "q", &i.to_string());
    }
    assert_eq!(h.deliveries(a).len(), 1);
    h.consume(b, "q", "cb", true);
    assert_eq!(h.deliveries(b).len(), 3);
    h.publish("", "q", "x");
    assert_eq!(h.deliveries(b).len(), 1);
    h.cancel(b, "cb");
    h.publish("", "q", "y");
    h.publish("", "q", "z");
    h.consume(b, "q", "cb2", false);
    h.qos(b, 1, false);
    let n = h.vh.queue_delete(1, "q", false, false).unwrap();
    assert_eq!(n, 0, "everything was delivered");
    assert_eq!(h.events(a), [Event::Cancel("ca".into())]);
    let ev = h.events(b);
    assert_eq!(ev.last(), Some(&Event::Cancel("cb2".into())));
    assert!(!h.exists("q"));
    // Acking a delivery of the deleted queue stays legal, as in RabbitMQ.
    h.ack(a, 1, false).unwrap();
}

#[test]
fn queue_delete_returns_the_ready_count() {
    let mut h = Harness::new();
    h.declare("q");
    for i in 0..3 {
        h.publish("", "q", &i.to_string());
    }
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    assert_eq!(h.vh.queue_delete(1, "q", false, false), Ok(2));
}

#[test]
fn queue_delete_if_unused_refuses_a_queue_with_consumers() {
    let mut h = Harness::new();
    h.declare("q");
    let ch = h.open(1);
    h.consume(ch, "q", "c", false);
    let err = h.vh.queue_delete(1, "q", true, false).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - queue 'q' in vhost '/' in use"
    );
    h.cancel(ch, "c");
    assert_eq!(h.vh.queue_delete(1, "q", true, false), Ok(0));
}

#[test]
fn queue_delete_if_empty_refuses_a_queue_with_messages() {
    let mut h = Harness::new();
    h.declare("q");
    h.publish("", "q", "m");
    let err = h.vh.queue_delete(1, "q", false, true).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty"
    );
    assert!(h.exists("q"));
}

#[test]
fn deleting_a_missing_queue_is_ok_with_zero() {
    let mut h = Harness::new();
    assert_eq!(h.vh.queue_delete(1, "nope", true, true), Ok(0));
}

#[test]
fn a_deleted_queue_can_be_declared_again_empty() {
    let mut h = Harness::new();
    h.declare("q");
    h.bind("q", "amq.fanout", "");
    h.publish("", "q", "old");
    h.vh.queue_delete(1, "q", false, false).unwrap();
    let ok = h.declare("q");
    assert_eq!(ok.message_count, 0);
    assert!(
        !h.publish("amq.fanout", "", "x").routed,
        "bindings went with the queue"
    );
}

#[test]
fn purge_removes_ready_messages_and_counts_them() {
    let mut h = Harness::new();
    h.declare("q");
    for i in 0..5 {
        h.publish("", "q", &i.to_string());
    }
    let ch = h.open(1);
    h.get(ch, "q", false).unwrap();
    assert_eq!(h.vh.queue_purge(1, "q"), Ok(4));
    assert_eq!((h.ready("q"), h.unacked("q")), (0, 1));
    assert_eq!(h.vh.queue_purge(1, "q"), Ok(0));
    // The unacked message is not purged: it comes back on requeue.
    h.nack(ch, 1, false, true).unwrap();
    assert_eq!(h.ready("q"), 1);
    let err = h.vh.queue_purge(1, "nope").unwrap_err();
    assert_eq!(err.text, "NOT_FOUND - no queue 'nope' in vhost '/'");
}

#[test]
fn x_expires_deletes_an_unused_queue_on_tick() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-expires", int(1000))]))
        .unwrap();
    h.publish("", "q", "m");
    h.advance(999);
    h.tick();
    assert!(h.exists("q"));
    h.advance(1);
    h.tick();
    assert!(!h.exists("q"));
}

#[test]
fn x_expires_is_reset_by_use_and_suspended_by_consumers() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-expires", int(1000))]))
        .unwrap();
    let ch = h.open(1);
    h.advance(800);
    h.get(ch, "q", false);
    h.advance(800);
    h.tick();
    assert!(h.exists("q"), "basic.get counts as use");
    h.declare_args("q", table(&[("x-expires", int(1000))]))
        .unwrap();
    h.advance(800);
    h.tick();
    assert!(h.exists("q"), "a redeclare counts as use");
    h.consume(ch, "q", "c", false);
    h.advance(10_000);
    h.tick();
    assert!(h.exists("q"), "a queue with consumers does not expire");
    h.cancel(ch, "c");
    h.advance(999);
    h.tick();
    assert!(
        h.exists("q"),
        "cancelling the last consumer restarts the clock"
    );
    h.advance(1);
    h.tick();
    assert!(!h.exists("q"));
}

#[test]
fn an_expired_queue_cancels_nothing_and_drops_its_messages() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-expires", int(10))]))
        .unwrap();
    h.publish("", "q", "m");
    h.advance(10);
    h.tick();
    assert!(!h.exists("q"));
    let ok = h.declare("q");
    assert_eq!(ok.message_count, 0);
}

#[test]
fn exclusive_queues_are_never_durable() {
    let mut h = Harness::new();
    h.vh.queue_declare(
        1,
        "ex",
        false,
        true,
        true,
        false,
        Default::default(),
        h.now_ms,
    )
    .unwrap();
    // RabbitMQ declares it non-durable, so either durable flag is equivalent for the owner.
    h.vh.queue_declare(
        1,
        "ex",
        false,
        false,
        true,
        false,
        Default::default(),
        h.now_ms,
    )
    .unwrap();
    h.vh.queue_declare(
        1,
        "ex",
        false,
        true,
        true,
        false,
        Default::default(),
        h.now_ms,
    )
    .unwrap();
}

#[test]
fn settling_a_deleted_queues_delivery_does_not_touch_the_queue_that_reuses_its_id() {
    let mut h = Harness::new();
    h.declare("old");
    h.publish("", "old", "from-old");
    let ch = h.open(1);
    let old = h.get(ch, "old", false).unwrap();
    h.publish("", "old", "from-old-2");
    let old2 = h.get(ch, "old", false).unwrap();
    h.vh.queue_delete(1, "old", false, false).unwrap();
    h.declare("new");
    h.publish("", "new", "from-new");
    let new = h.get(ch, "new", false).unwrap();
    assert_eq!(new.body_str(), "from-new");
    h.ack(ch, old.delivery_tag, false).unwrap();
    h.nack(ch, old2.delivery_tag, false, true).unwrap();
    assert_eq!(
        (h.ready("new"), h.unacked("new")),
        (0, 1),
        "the old queue's deliveries neither settle nor land in the new one"
    );
    h.close(ch);
    let other = h.open(2);
    assert_eq!(h.drain(other, "new"), ["from-new"]);
}

#[test]
fn a_server_named_queue_can_be_declared_again_only_passively() {
    let mut h = Harness::new();
    let name = h.declare("").queue;
    let err = h.declare_args(&name, Default::default()).unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.text,
        format!("ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'")
    );
    let err = h
        .declare_args("amq.gen-mine", Default::default())
        .unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(passive(&mut h, 1, &name).unwrap().queue, name);
}

#[test]
fn redeclare_compares_the_arguments_of_the_queues_type() {
    let mut h = Harness::new();
    h.declare_args("c", table(&[("x-queue-version", int(1))]))
        .unwrap();
    let err = h
        .declare_args("c", table(&[("x-queue-version", int(2))]))
        .unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-version' for queue 'c' in vhost '/': received '2' but current is '1'"
    );
    let quorum = |extra: &[(&str, warren_protocol::AMQPValue)]| {
        let mut pairs = vec![("x-queue-type", long_str("quorum"))];
        pairs.extend(extra.iter().cloned());
        table(&pairs)
    };
    h.declare_with(1, "qq", true, quorum(&[("x-max-in-memory-length", int(5))]))
        .unwrap();
    let err = h
        .declare_with(1, "qq", true, quorum(&[("x-max-in-memory-length", int(6))]))
        .unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'x-max-in-memory-length' for queue 'qq' in vhost '/': received '6' but current is '5'"
    );
    let err = h
        .declare_with(1, "qq", true, Default::default())
        .unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'x-max-in-memory-length' for queue 'qq' in vhost '/': received none but current is the value '5' of type 'long'"
    );
}
