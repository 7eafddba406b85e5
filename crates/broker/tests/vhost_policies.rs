//! Policies applied to a vhost's existing and new queues and exchanges: the effective
//! configuration follows policy changes at once, a lowered max-length trims from the head (in
//! order, dead-lettering where the queue says so, releasing stored copies), quorum queues keep
//! their declared configuration, and an exchange's alternate follows its policy.

mod support;

use serde_json::json;
use support::*;
use warren_broker::policy::{Policy, PolicyKind};
use warren_protocol::content::Properties;

fn policy(
    kind: PolicyKind,
    name: &str,
    pattern: &str,
    apply_to: &str,
    def: serde_json::Value,
) -> Policy {
    Policy::new(kind, name, &json!(pattern), apply_to, &json!(0), &def).expect("valid policy")
}

fn set(h: &mut Harness, kind: PolicyKind, p: Policy) {
    let now = h.now_ms;
    h.vh.set_policy(kind, p, now);
    h.vh.enforce_limits(now);
}

#[test]
fn a_lowered_max_length_drops_the_oldest_messages_and_keeps_the_order() {
    let mut h = Harness::new();
    h.declare("q");
    for i in 1..=5 {
        h.publish("", "q", &format!("m{i}"));
    }
    set(
        &mut h,
        PolicyKind::Policy,
        policy(
            PolicyKind::Policy,
            "p",
            "^q$",
            "queues",
            json!({"max-length": 2}),
        ),
    );
    assert_eq!(h.ready("q"), 2);
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "q"), ["m4", "m5"]);
}

#[test]
fn trimming_dead_letters_with_reason_maxlen_and_releases_stored_copies() {
    let mut h = Harness::new();
    h.enable_paging(1 << 20);
    h.exchange("dlx", "fanout");
    h.declare("dead");
    h.bind("dead", "dlx", "");
    h.declare_with(1, "q", true, table(&[])).unwrap();
    for i in 1..=4 {
        let props = Properties {
            delivery_mode: Some(2),
            ..Properties::default()
        };
        h.publish_props("", "q", props, &format!("m{i}")).unwrap();
        h.settle_store();
    }
    let stored = h.store.as_ref().unwrap().live();
    assert_eq!(stored, 4);
    set(
        &mut h,
        PolicyKind::Policy,
        policy(
            PolicyKind::Policy,
            "p",
            "^q$",
            "queues",
            json!({"max-length": 1, "dead-letter-exchange": "dlx"}),
        ),
    );
    h.settle_store();
    assert_eq!(
        h.store.as_ref().unwrap().live(),
        1,
        "the three dropped are released"
    );
    let ch = h.open(1);
    let dead: Vec<Delivery> = (0..3).filter_map(|_| h.get(ch, "dead", true)).collect();
    assert_eq!(
        dead.iter().map(|d| d.body_str()).collect::<Vec<_>>(),
        ["m1", "m2", "m3"]
    );
    let death = match dead[0].header("x-death") {
        Some(warren_protocol::AMQPValue::FieldArray(a)) => a.as_slice()[0].clone(),
        other => panic!("no x-death: {other:?}"),
    };
    let warren_protocol::AMQPValue::FieldTable(death) = death else {
        panic!("x-death entry")
    };
    assert_eq!(death.inner().get("reason"), Some(&long_str("maxlen")));
    assert_eq!(h.drain(ch, "q"), ["m4"]);
}

#[test]
fn clearing_the_policy_restores_the_declared_arguments() {
    let mut h = Harness::new();
    h.declare_args("q", table(&[("x-max-length", int(3))]))
        .unwrap();
    set(
        &mut h,
        PolicyKind::Policy,
        policy(
            PolicyKind::Policy,
            "p",
            "^q$",
            "all",
            json!({"max-length": 1}),
        ),
    );
    assert_eq!(h.vh.queue_config("q").unwrap().max_length, Some(1));
    let now = h.now_ms;
    assert!(h.vh.clear_policy(PolicyKind::Policy, "p", now));
    assert_eq!(h.vh.queue_config("q").unwrap().max_length, Some(3));
    assert!(
        !h.vh.clear_policy(PolicyKind::Policy, "p", now),
        "cleared once"
    );
}

#[test]
fn an_operator_policy_caps_a_queue_declared_later() {
    let mut h = Harness::new();
    set(
        &mut h,
        PolicyKind::Policy,
        policy(
            PolicyKind::Policy,
            "p",
            "^q",
            "queues",
            json!({"max-length": 10, "message-ttl": 5000}),
        ),
    );
    set(
        &mut h,
        PolicyKind::Operator,
        policy(
            PolicyKind::Operator,
            "op",
            ".*",
            "queues",
            json!({"max-length": 4}),
        ),
    );
    h.declare("q1");
    let c = h.vh.queue_config("q1").unwrap();
    assert_eq!((c.max_length, c.message_ttl_ms), (Some(4), Some(5000)));
    let info =
        h.vh.queue_infos()
            .into_iter()
            .find(|q| q.name == "q1")
            .unwrap();
    assert_eq!(
        (info.policy.as_deref(), info.operator_policy.as_deref()),
        (Some("p"), Some("op"))
    );
    assert_eq!(
        serde_json::Value::Object(info.effective_policy_definition),
        json!({"max-length": 4, "message-ttl": 5000})
    );
}

#[test]
fn quorum_queues_show_their_policy_but_keep_their_declared_configuration() {
    let mut h = Harness::new();
    h.declare_with(
        1,
        "qq",
        true,
        table(&[("x-queue-type", long_str("quorum"))]),
    )
    .unwrap();
    set(
        &mut h,
        PolicyKind::Policy,
        policy(
            PolicyKind::Policy,
            "p",
            "^qq$",
            "quorum_queues",
            json!({"max-length": 1}),
        ),
    );
    assert_eq!(h.vh.queue_config("qq").unwrap().max_length, None);
    let info =
        h.vh.queue_infos()
            .into_iter()
            .find(|q| q.name == "qq")
            .unwrap();
    assert_eq!(info.policy.as_deref(), Some("p"));
}

#[test]
fn an_exchanges_alternate_follows_its_policy_and_its_argument_wins() {
    let mut h = Harness::new();
    h.exchange("x", "direct");
    h.exchange_args(
        "y",
        "direct",
        table(&[("alternate-exchange", long_str("mine"))]),
    );
    for ae in ["ae", "mine"] {
        h.exchange(ae, "fanout");
        h.declare(&format!("{ae}.q"));
        h.bind(&format!("{ae}.q"), ae, "");
    }
    set(
        &mut h,
        PolicyKind::Policy,
        policy(
            PolicyKind::Policy,
            "p",
            "^[xy]$",
            "exchanges",
            json!({"alternate-exchange": "ae"}),
        ),
    );
    assert!(h.publish("x", "nowhere", "to-ae").routed);
    assert!(h.publish("y", "nowhere", "to-mine").routed);
    assert_eq!((h.ready("ae.q"), h.ready("mine.q")), (1, 1));
    let now = h.now_ms;
    h.vh.clear_policy(PolicyKind::Policy, "p", now);
    assert!(
        !h.publish("x", "nowhere", "lost").routed,
        "no alternate once cleared"
    );
    assert_eq!(h.ready("ae.q"), 1);
}
