//! After the node's storage failed, every command that would change durable state is refused
//! with 541 INTERNAL_ERROR before it changes anything; what needs no write goes on.

mod support;

use support::*;
use warren_protocol::constants::{INTERNAL_ERROR, NOT_FOUND};
use warren_protocol::content::Properties;
use warren_protocol::FieldTable;

const WHY: &str = "storage failure: fdatasync of WAL file 1: Input/output error";

fn no_args() -> FieldTable {
    FieldTable::default()
}

/// A vhost with a durable queue `dq` bound to a durable direct exchange `dx` by key `k`,
/// journalled, then told that storage failed.
fn failed_with_durable_topology() -> Harness {
    let mut h = Harness::new();
    h.declare_with(1, "dq", true, no_args()).unwrap();
    h.vh.exchange_declare("dx", "direct", false, true, false, false, no_args())
        .unwrap();
    h.bind("dq", "dx", "k");
    h.vh.take_meta();
    h.vh.refuse_durable_changes(WHY);
    h
}

fn assert_refused<T: std::fmt::Debug>(r: Result<T, warren_broker::error::AmqpError>) {
    let e = r.expect_err("a durable change after a storage failure");
    assert_eq!(e.code, INTERNAL_ERROR, "{}", e.text);
    assert!(
        e.text.starts_with(&format!("INTERNAL_ERROR - {WHY}")),
        "{}",
        e.text
    );
}

#[test]
fn durable_changes_are_refused_with_541_and_leave_the_vhost_as_it_was() {
    let mut h = failed_with_durable_topology();

    assert_refused(h.declare_with(1, "new", true, no_args()));
    assert_eq!(
        h.vh.queue_declare(1, "new", true, false, false, false, no_args(), h.now_ms)
            .unwrap_err()
            .code,
        NOT_FOUND,
        "a refused declare must not create the queue"
    );
    assert_refused(h.vh.exchange_declare("newx", "fanout", false, true, false, false, no_args()));
    assert_eq!(
        h.vh.exchange_declare("newx", "fanout", true, true, false, false, no_args())
            .unwrap_err()
            .code,
        NOT_FOUND
    );
    assert_refused(h.vh.queue_bind(1, "dq", "dx", "k2", &no_args()));
    assert_refused(h.vh.queue_unbind(1, "dq", "dx", "k", &no_args()));
    assert_refused(h.vh.exchange_declare("dx2", "fanout", false, true, false, false, no_args()));
    assert_refused(h.vh.queue_delete(1, "dq", false, false));
    assert_refused(h.vh.exchange_delete("dx", false));
    assert!(!h.vh.has_meta(), "nothing was recorded for the journal");

    // The binding and both ends are still there and still route.
    h.publish("dx", "k", "still routed");
    assert_eq!(h.ready("dq"), 1);
    h.publish("dx", "k2", "never bound");
    assert_eq!(h.ready("dq"), 1);
}

#[test]
fn what_writes_nothing_goes_on_after_a_storage_failure() {
    let mut h = failed_with_durable_topology();
    // Clients that reconnect re-declare what they use: no change, nothing to write.
    h.declare_with(1, "dq", true, no_args()).unwrap();
    h.vh.exchange_declare("dx", "direct", false, true, false, false, no_args())
        .unwrap();
    h.bind("dq", "dx", "k");
    // Transient topology is never written.
    h.declare_with(1, "tq", false, no_args()).unwrap();
    h.exchange("tx", "fanout");
    h.bind("tq", "dx", "k");
    h.bind("tq", "tx", "");
    h.vh.exchange_bind("tx", "dx", "k", &no_args()).unwrap();
    assert!(!h.vh.has_meta());

    h.publish("dx", "k", "m");
    // Reached tq directly and through tx: queued once, as RabbitMQ does.
    assert_eq!((h.ready("dq"), h.ready("tq")), (1, 1));
    let ch = h.open(1);
    assert_eq!(h.get(ch, "dq", false).unwrap().body_str(), "m");
    h.ack(ch, 1, false).unwrap();
    assert_eq!(h.vh.queue_purge(1, "tq").unwrap(), 1);
    h.vh.queue_unbind(1, "tq", "dx", "k", &no_args()).unwrap();
    h.vh.queue_delete(1, "tq", false, false).unwrap();
    h.vh.exchange_delete("tx", false).unwrap();
    assert!(!h.vh.has_meta());
}

#[test]
fn purging_stored_messages_is_refused_since_the_releases_cannot_be_written() {
    let mut h = Harness::new();
    h.enable_paging(1 << 20);
    h.declare_with(1, "dq", true, no_args()).unwrap();
    h.declare_with(1, "empty", true, no_args()).unwrap();
    let props = Properties {
        delivery_mode: Some(2),
        ..Properties::default()
    };
    h.publish_props("", "dq", props, "stored").unwrap();
    h.settle_store();
    h.vh.take_meta();
    h.vh.refuse_durable_changes(WHY);

    assert_refused(h.vh.queue_purge(1, "dq"));
    assert_eq!(h.ready("dq"), 1, "a refused purge leaves the messages");
    assert_eq!(h.vh.queue_purge(1, "empty").unwrap(), 0);
}

#[test]
fn vhosts_created_after_the_failure_refuse_too() {
    let broker = warren_broker::broker::Broker::new();
    broker.refuse_durable_changes(WHY);
    assert!(broker.add_vhost("later"));
    let v = broker.vhost("later").unwrap();
    let mut v = v.lock().unwrap();
    assert_refused(v.queue_declare(1, "q", false, true, false, false, no_args(), 0));
    v.queue_declare(1, "t", false, false, false, false, no_args(), 0)
        .unwrap();
}
