//! Routing through the vhost: every exchange type, exchange-to-exchange bindings, alternate
//! exchanges and CC/BCC, observed as the deliveries a consumer gets.

mod support;

use support::*;
use warren_protocol::content::Properties;

/// Declares queues q1..qn, each with a no-ack consumer on its own channel.
fn queues_with_consumers(h: &mut Harness, names: &[&str]) -> Vec<u64> {
    names
        .iter()
        .map(|q| {
            h.declare(q);
            let ch = h.open(1);
            h.consume(ch, q, "c", true);
            ch
        })
        .collect()
}

#[test]
fn default_exchange_routes_by_queue_name() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["a", "b"]);
    let out = h.publish("", "b", "hello");
    assert!(out.routed && !out.rejected);
    assert!(h.bodies(chans[0]).is_empty());
    let got = h.deliveries(chans[1]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].exchange, "");
    assert_eq!(got[0].routing_key, "b");
    assert_eq!(got[0].consumer_tag.as_deref(), Some("c"));
    assert_eq!(got[0].delivery_tag, 1);
    assert!(!got[0].redelivered);
    assert_eq!(got[0].body_str(), "hello");
}

#[test]
fn default_exchange_to_a_missing_queue_is_unroutable() {
    let mut h = Harness::new();
    let out = h.publish("", "nobody", "x");
    assert!(!out.routed);
}

#[test]
fn publish_to_a_missing_exchange_is_404() {
    let mut h = Harness::new();
    let err = h
        .publish_props("nope", "k", Properties::default(), "x")
        .unwrap_err();
    assert_eq!(err.code, 404);
    assert_eq!(err.text, "NOT_FOUND - no exchange 'nope' in vhost '/'");
}

#[test]
fn publish_to_an_internal_exchange_is_403() {
    let mut h = Harness::new();
    let err = h
        .publish_props("amq.rabbitmq.trace", "k", Properties::default(), "x")
        .unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.text,
        "ACCESS_REFUSED - cannot publish to internal exchange 'amq.rabbitmq.trace' in vhost '/'"
    );
}

#[test]
fn direct_exchange_routes_on_exact_key_only() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["a", "b"]);
    h.bind("a", "amq.direct", "red");
    h.bind("b", "amq.direct", "blue");
    h.bind("b", "amq.direct", "red");
    h.publish("amq.direct", "red", "r");
    h.publish("amq.direct", "blue", "b");
    assert!(!h.publish("amq.direct", "green", "g").routed);
    assert_eq!(h.bodies(chans[0]), ["r"]);
    assert_eq!(h.bodies(chans[1]), ["r", "b"]);
}

#[test]
fn fanout_exchange_ignores_the_key() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["a", "b"]);
    h.bind("a", "amq.fanout", "");
    h.bind("b", "amq.fanout", "whatever");
    h.publish("amq.fanout", "anything", "m");
    assert_eq!(h.bodies(chans[0]), ["m"]);
    assert_eq!(h.bodies(chans[1]), ["m"]);
}

#[test]
fn topic_exchange_matches_star_and_hash() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["star", "hash", "exact"]);
    h.bind("star", "amq.topic", "stock.*.nyse");
    h.bind("hash", "amq.topic", "stock.#");
    h.bind("exact", "amq.topic", "stock.ibm.nyse");
    h.publish("amq.topic", "stock.ibm.nyse", "1");
    h.publish("amq.topic", "stock.nyse", "2");
    h.publish("amq.topic", "stock", "3");
    h.publish("amq.topic", "stock.a.b.nyse", "4");
    assert!(!h.publish("amq.topic", "bond.ibm.nyse", "5").routed);
    assert_eq!(h.bodies(chans[0]), ["1"]);
    assert_eq!(h.bodies(chans[1]), ["1", "2", "3", "4"]);
    assert_eq!(h.bodies(chans[2]), ["1"]);
}

#[test]
fn headers_exchange_matches_all_and_any() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["all", "any"]);
    h.bind_args(
        "all",
        "amq.headers",
        "",
        table(&[
            ("x-match", long_str("all")),
            ("format", long_str("pdf")),
            ("type", long_str("report")),
        ]),
    );
    h.bind_args(
        "any",
        "amq.headers",
        "",
        table(&[
            ("x-match", long_str("any")),
            ("format", long_str("pdf")),
            ("type", long_str("report")),
        ]),
    );
    let both = with_headers(table(&[
        ("format", long_str("pdf")),
        ("type", long_str("report")),
    ]));
    let one = with_headers(table(&[("format", long_str("pdf"))]));
    let none = with_headers(table(&[("format", long_str("zip"))]));
    h.publish_props("amq.headers", "", both, "both").unwrap();
    h.publish_props("amq.headers", "", one, "one").unwrap();
    let out = h.publish_props("amq.headers", "", none, "none").unwrap();
    assert!(!out.routed);
    assert_eq!(h.bodies(chans[0]), ["both"]);
    assert_eq!(h.bodies(chans[1]), ["both", "one"]);
}

#[test]
fn headers_binding_with_a_bad_x_match_is_406() {
    let mut h = Harness::new();
    h.declare("q");
    let err =
        h.vh.queue_bind(
            1,
            "q",
            "amq.headers",
            "",
            &table(&[("x-match", long_str("some"))]),
        )
        .unwrap_err();
    assert_eq!(err.code, 406);
}

#[test]
fn exchange_to_exchange_bindings_forward_with_the_original_key() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["logs"]);
    h.exchange("front", "fanout");
    h.exchange("back", "topic");
    h.vh.exchange_bind("back", "front", "", &Default::default())
        .unwrap();
    h.bind("logs", "back", "*.error");
    h.publish("front", "app.error", "e");
    assert!(!h.publish("front", "app.info", "i").routed);
    let got = h.deliveries(chans[0]);
    assert_eq!(got.len(), 1);
    // The delivery names the exchange the publisher used, as RabbitMQ does.
    assert_eq!(got[0].exchange, "front");
    assert_eq!(got[0].routing_key, "app.error");
}

#[test]
fn a_queue_reached_by_several_paths_gets_one_copy() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["q"]);
    h.exchange("x", "topic");
    h.bind("q", "x", "a.*");
    h.bind("q", "x", "#");
    h.bind("q", "amq.fanout", "");
    h.vh.exchange_bind("amq.fanout", "x", "#", &Default::default())
        .unwrap();
    h.publish("x", "a.b", "once");
    assert_eq!(h.bodies(chans[0]), ["once"]);
}

#[test]
fn exchange_to_exchange_cycle_terminates() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["q"]);
    h.exchange("x1", "fanout");
    h.exchange("x2", "fanout");
    h.vh.exchange_bind("x2", "x1", "", &Default::default())
        .unwrap();
    h.vh.exchange_bind("x1", "x2", "", &Default::default())
        .unwrap();
    h.bind("q", "x2", "");
    h.publish("x1", "k", "m");
    assert_eq!(h.bodies(chans[0]), ["m"]);
}

#[test]
fn alternate_exchange_takes_unroutable_messages_only() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["main", "unrouted"]);
    h.exchange("ae", "fanout");
    h.bind("unrouted", "ae", "");
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    h.bind("main", "x", "good");
    assert!(h.publish("x", "good", "routed").routed);
    let out = h.publish("x", "bad", "lost");
    assert!(out.routed, "a message the AE routed counts as routed");
    assert_eq!(h.bodies(chans[0]), ["routed"]);
    let got = h.deliveries(chans[1]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body_str(), "lost");
    assert_eq!(got[0].exchange, "x");
    assert_eq!(got[0].routing_key, "bad");
}

#[test]
fn alternate_exchanges_chain_and_cycles_end() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["last"]);
    h.exchange_args(
        "a1",
        "direct",
        table(&[("alternate-exchange", long_str("a2"))]),
    );
    h.exchange_args(
        "a2",
        "direct",
        table(&[("alternate-exchange", long_str("a1"))]),
    );
    assert!(!h.publish("a1", "k", "nowhere").routed);
    h.exchange_args(
        "a3",
        "direct",
        table(&[("alternate-exchange", long_str("a4"))]),
    );
    h.exchange("a4", "fanout");
    h.bind("last", "a4", "");
    assert!(h.publish("a3", "k", "via-chain").routed);
    assert_eq!(h.bodies(chans[0]), ["via-chain"]);
}

#[test]
fn alternate_exchange_that_does_not_exist_leaves_the_message_unrouted() {
    let mut h = Harness::new();
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("missing"))]),
    );
    assert!(!h.publish("x", "k", "m").routed);
}

#[test]
fn cc_routes_to_extra_keys_and_stays_in_the_headers() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["a", "b", "c"]);
    h.bind("a", "amq.direct", "ka");
    h.bind("b", "amq.direct", "kb");
    h.bind("c", "amq.direct", "kc");
    let props = with_headers(table(&[("CC", str_array(&["kb"]))]));
    h.publish_props("amq.direct", "ka", props, "m").unwrap();
    let a = h.deliveries(chans[0]);
    let b = h.deliveries(chans[1]);
    assert_eq!(a.len(), 1);
    assert_eq!(b.len(), 1);
    assert!(h.bodies(chans[2]).is_empty());
    assert_eq!(b[0].routing_key, "ka", "the delivery keeps the publish key");
    assert_eq!(b[0].header("CC"), Some(str_array(&["kb"])));
}

#[test]
fn bcc_routes_to_extra_keys_and_is_stripped_from_every_delivery() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["a", "b", "c"]);
    h.bind("a", "amq.direct", "ka");
    h.bind("b", "amq.direct", "kb");
    h.bind("c", "amq.direct", "kc");
    let props = with_headers(table(&[
        ("BCC", str_array(&["kc"])),
        ("keep", long_str("me")),
    ]));
    h.publish_props("amq.direct", "ka", props, "m").unwrap();
    let a = h.deliveries(chans[0]);
    let c = h.deliveries(chans[2]);
    assert!(h.bodies(chans[1]).is_empty());
    for d in a.iter().chain(c.iter()) {
        assert_eq!(d.header("BCC"), None, "BCC must not reach consumers");
        assert_eq!(d.header("keep"), Some(long_str("me")));
    }
    assert_eq!((a.len(), c.len()), (1, 1));
}

#[test]
fn cc_and_bcc_work_through_the_default_exchange() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["a", "b", "c"]);
    let props = with_headers(table(&[
        ("CC", str_array(&["b"])),
        ("BCC", str_array(&["c"])),
    ]));
    h.publish_props("", "a", props, "m").unwrap();
    for ch in &chans {
        let got = h.deliveries(*ch);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].header("BCC"), None);
    }
}

#[test]
fn cc_with_a_queue_already_routed_delivers_once() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["a"]);
    h.bind("a", "amq.direct", "k1");
    h.bind("a", "amq.direct", "k2");
    let props = with_headers(table(&[("CC", str_array(&["k2", "k1"]))]));
    h.publish_props("amq.direct", "k1", props, "m").unwrap();
    assert_eq!(h.bodies(chans[0]), ["m"]);
}

#[test]
fn properties_arrive_as_published() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["q"]);
    let mut props = with_headers(table(&[("n", int(7))]));
    props.content_type = Some("text/plain".into());
    props.correlation_id = Some("corr".into());
    props.message_id = Some("id-1".into());
    props.delivery_mode = Some(2);
    props.timestamp = Some(123);
    h.publish_props("", "q", props.clone(), "m").unwrap();
    let got = h.deliveries(chans[0]);
    assert_eq!(got[0].properties, props);
}

// ---- exchange declare / delete ---------------------------------------------------------------

fn declare_x(
    h: &mut Harness,
    name: &str,
    kind: &str,
    durable: bool,
    auto_delete: bool,
    args: warren_protocol::FieldTable,
) -> Result<(), warren_broker::error::AmqpError> {
    h.vh.exchange_declare(name, kind, false, durable, auto_delete, false, args)
}

#[test]
fn exchange_redeclare_must_match_type_and_flags() {
    let mut h = Harness::new();
    h.exchange("x", "direct");
    h.exchange("x", "direct");
    let err = declare_x(&mut h, "x", "fanout", false, false, Default::default()).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x' in vhost '/': received 'fanout' but current is 'direct'"
    );
    let err = declare_x(&mut h, "x", "direct", true, false, Default::default()).unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'x' in vhost '/': received 'true' but current is 'false'"
    );
    let err = declare_x(&mut h, "x", "direct", false, true, Default::default()).unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange 'x' in vhost '/': received 'true' but current is 'false'"
    );
}

#[test]
fn exchange_redeclare_must_match_the_alternate_exchange() {
    let mut h = Harness::new();
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    let err = declare_x(
        &mut h,
        "x",
        "direct",
        false,
        false,
        table(&[("alternate-exchange", long_str("other"))]),
    )
    .unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': received 'other' but current is 'ae'"
    );
    let err = declare_x(&mut h, "x", "direct", false, false, Default::default()).unwrap_err();
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': received none but current is the value 'ae' of type 'longstr'"
    );
    // Other arguments are not compared.
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("ae")), ("other", int(1))]),
    );
}

#[test]
fn exchange_declare_errors_match_rabbitmq() {
    let mut h = Harness::new();
    let err = declare_x(&mut h, "x", "fifo", false, false, Default::default()).unwrap_err();
    assert_eq!(err.code, 503);
    assert_eq!(err.text, "COMMAND_INVALID - unknown exchange type 'fifo'");
    let err = declare_x(
        &mut h,
        "amq.mine",
        "direct",
        false,
        false,
        Default::default(),
    )
    .unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.text,
        "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'"
    );
    let err = declare_x(&mut h, "", "direct", false, false, Default::default()).unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.text,
        "ACCESS_REFUSED - operation not permitted on the default exchange"
    );
    let err =
        h.vh.exchange_declare(
            "nope",
            "direct",
            true,
            false,
            false,
            false,
            Default::default(),
        )
        .unwrap_err();
    assert_eq!(err.code, 404);
    assert_eq!(err.text, "NOT_FOUND - no exchange 'nope' in vhost '/'");
    // Redeclaring a standard exchange with its own properties is fine.
    h.vh.exchange_declare(
        "amq.direct",
        "direct",
        false,
        true,
        false,
        false,
        Default::default(),
    )
    .unwrap();
}

#[test]
fn exchange_delete_errors_match_rabbitmq() {
    let mut h = Harness::new();
    let err = h.vh.exchange_delete("amq.direct", false).unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(
        err.text,
        "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"
    );
    // RabbitMQ refuses the amq. prefix before looking the exchange up.
    let err = h.vh.exchange_delete("amq.missing", false).unwrap_err();
    assert_eq!(err.code, 403);
    let err = h.vh.exchange_delete("", false).unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(h.vh.exchange_delete("missing", true), Ok(()));
    h.exchange("x", "fanout");
    h.declare("q");
    h.bind("q", "x", "");
    let err = h.vh.exchange_delete("x", true).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use"
    );
    h.vh.exchange_delete("x", false).unwrap();
    let err = h
        .publish_props("x", "", Default::default(), "m")
        .unwrap_err();
    assert_eq!(err.code, 404);
}

#[test]
fn binding_to_or_from_the_default_exchange_is_403() {
    let mut h = Harness::new();
    h.declare("q");
    let err =
        h.vh.queue_bind(1, "q", "", "q", &Default::default())
            .unwrap_err();
    assert_eq!(err.code, 403);
    let err =
        h.vh.exchange_bind("", "amq.direct", "k", &Default::default())
            .unwrap_err();
    assert_eq!(err.code, 403);
}

#[test]
fn binding_missing_things_is_404() {
    let mut h = Harness::new();
    h.declare("q");
    let err =
        h.vh.queue_bind(1, "q", "nope", "k", &Default::default())
            .unwrap_err();
    assert_eq!(err.text, "NOT_FOUND - no exchange 'nope' in vhost '/'");
    let err =
        h.vh.queue_bind(1, "nope", "amq.direct", "k", &Default::default())
            .unwrap_err();
    assert_eq!(err.text, "NOT_FOUND - no queue 'nope' in vhost '/'");
}

#[test]
fn auto_delete_exchange_goes_when_its_last_binding_goes() {
    let mut h = Harness::new();
    declare_x(&mut h, "ad", "fanout", false, true, Default::default()).unwrap();
    h.declare("q1");
    h.declare("q2");
    h.bind("q1", "ad", "");
    h.bind("q2", "ad", "");
    h.vh.queue_unbind(1, "q1", "ad", "", &Default::default())
        .unwrap();
    assert!(h.vh.exchange_names().contains(&"ad".to_string()));
    h.vh.queue_delete(1, "q2", false, false).unwrap();
    assert!(
        !h.vh.exchange_names().contains(&"ad".to_string()),
        "deleting the last bound queue removes the auto-delete exchange"
    );
}

#[test]
fn auto_delete_exchange_stays_until_it_had_a_binding() {
    let mut h = Harness::new();
    declare_x(&mut h, "ad", "fanout", false, true, Default::default()).unwrap();
    h.publish("ad", "", "m");
    h.declare("q");
    h.vh.queue_delete(1, "q", false, false).unwrap();
    assert!(h.vh.exchange_names().contains(&"ad".to_string()));
}

#[test]
fn auto_delete_exchanges_cascade_through_exchange_bindings() {
    let mut h = Harness::new();
    declare_x(&mut h, "outer", "fanout", false, true, Default::default()).unwrap();
    declare_x(&mut h, "inner", "fanout", false, true, Default::default()).unwrap();
    h.vh.exchange_bind("inner", "outer", "", &Default::default())
        .unwrap();
    h.declare("q");
    h.bind("q", "inner", "");
    h.vh.queue_delete(1, "q", false, false).unwrap();
    let names = h.vh.exchange_names();
    assert!(!names.contains(&"inner".to_string()));
    assert!(!names.contains(&"outer".to_string()));
}

#[test]
fn an_alternate_exchange_that_is_not_a_long_string_is_406() {
    let mut h = Harness::new();
    let err = declare_x(
        &mut h,
        "x",
        "direct",
        false,
        false,
        table(&[("alternate-exchange", int(1))]),
    )
    .unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - invalid type 'long' for arg 'alternate-exchange' in exchange 'x' in vhost '/'"
    );
    assert!(!h.vh.exchange_names().contains(&"x".to_string()));
}

#[test]
fn headers_binding_errors_are_worded_as_rabbitmq_words_them() {
    let mut h = Harness::new();
    h.declare("q");
    let bind = |h: &mut Harness, v| {
        h.vh.queue_bind(1, "q", "amq.headers", "", &table(&[("x-match", v)]))
            .unwrap_err()
    };
    let err = bind(&mut h, long_str("some"));
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - Invalid x-match field value <<\"some\">>; expected all, any, all-with-x, or any-with-x"
    );
    let err = bind(&mut h, int(1));
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - Invalid x-match field type long (value 1); expected longstr"
    );
    let err = bind(&mut h, warren_protocol::AMQPValue::Boolean(true));
    assert_eq!(
        err.text,
        "PRECONDITION_FAILED - Invalid x-match field type bool (value true); expected longstr"
    );
}

#[test]
fn unbinding_what_does_not_exist_is_ok() {
    // rabbit_binding:remove only reports absent (crashed) queues, never missing things.
    let mut h = Harness::new();
    h.declare("q");
    let none = warren_protocol::FieldTable::default();
    assert_eq!(h.vh.queue_unbind(1, "q", "amq.direct", "k", &none), Ok(()));
    assert_eq!(
        h.vh.queue_unbind(1, "nope", "amq.direct", "k", &none),
        Ok(())
    );
    assert_eq!(h.vh.queue_unbind(1, "q", "nope", "k", &none), Ok(()));
    assert_eq!(
        h.vh.exchange_unbind("nope", "amq.direct", "k", &none),
        Ok(())
    );
    assert_eq!(
        h.vh.exchange_unbind("amq.fanout", "nope", "k", &none),
        Ok(())
    );
    let err = h.vh.queue_unbind(1, "q", "", "k", &none).unwrap_err();
    assert_eq!(err.code, 403);
}

#[test]
fn unbinding_from_another_connections_exclusive_queue_is_405_only_if_bound() {
    let mut h = Harness::new();
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
    let none = warren_protocol::FieldTable::default();
    assert_eq!(h.vh.queue_unbind(2, "ex", "amq.direct", "k", &none), Ok(()));
    h.vh.queue_bind(1, "ex", "amq.direct", "k", &none).unwrap();
    let err =
        h.vh.queue_unbind(2, "ex", "amq.direct", "k", &none)
            .unwrap_err();
    assert_eq!(err.code, 405);
    h.vh.queue_unbind(1, "ex", "amq.direct", "k", &none)
        .unwrap();
    assert!(!h.publish("amq.direct", "k", "m").routed);
}

#[test]
fn binding_reports_the_missing_exchange_before_the_missing_queue() {
    let mut h = Harness::new();
    let none = warren_protocol::FieldTable::default();
    let err = h.vh.queue_bind(1, "noq", "nox", "k", &none).unwrap_err();
    assert_eq!(err.text, "NOT_FOUND - no exchange 'nox' in vhost '/'");
    let err =
        h.vh.exchange_bind("nodst", "nosrc", "k", &none)
            .unwrap_err();
    assert_eq!(err.text, "NOT_FOUND - no exchange 'nosrc' in vhost '/'");
    let err =
        h.vh.exchange_bind("nodst", "amq.direct", "k", &none)
            .unwrap_err();
    assert_eq!(err.text, "NOT_FOUND - no exchange 'nodst' in vhost '/'");
}

#[test]
fn an_exchange_reached_through_a_binding_uses_its_alternate_when_it_matches_nothing() {
    // RabbitMQ's rabbit_exchange:route1 applies alternate-exchange to every exchange it walks
    // whose own bindings matched nothing, not only to the one named in basic.publish.
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["ae-queue"]);
    h.exchange("ae", "fanout");
    h.bind("ae-queue", "ae", "");
    h.exchange("front", "fanout");
    h.exchange_args(
        "back",
        "direct",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    h.vh.exchange_bind("back", "front", "", &Default::default())
        .unwrap();
    assert!(h.publish("front", "nothing-bound", "m").routed);
    assert_eq!(h.bodies(chans[0]), ["m"]);
}

#[test]
fn an_exchange_whose_bindings_matched_does_not_use_its_alternate() {
    // Even when the exchange it forwarded to routes nowhere: the front exchange matched a
    // binding, so its alternate is not consulted.
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["ae-queue"]);
    h.exchange("ae", "fanout");
    h.bind("ae-queue", "ae", "");
    h.exchange_args(
        "front",
        "fanout",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    h.exchange("back", "direct");
    h.vh.exchange_bind("back", "front", "", &Default::default())
        .unwrap();
    assert!(!h.publish("front", "nothing-bound", "m").routed);
    assert!(h.bodies(chans[0]).is_empty());
}

#[test]
fn an_alternate_declared_after_its_exchange_is_used() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["ae-queue"]);
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    assert!(!h.publish("x", "k", "before").routed);
    h.exchange("ae", "fanout");
    h.bind("ae-queue", "ae", "");
    assert!(h.publish("x", "k", "after").routed);
    assert_eq!(h.bodies(chans[0]), ["after"]);
}

#[test]
fn a_deleted_alternate_stops_being_used_even_when_its_id_is_reused() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["ae-queue", "other-queue"]);
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    h.exchange("ae", "fanout");
    h.bind("ae-queue", "ae", "");
    h.vh.exchange_delete("ae", false).unwrap();
    // The next exchange may get the deleted one's id; it is not x's alternate.
    h.exchange("other", "fanout");
    h.bind("other-queue", "other", "");
    assert!(!h.publish("x", "k", "m").routed);
    assert!(h.bodies(chans[0]).is_empty());
    assert!(h.bodies(chans[1]).is_empty());
    // Declared again, by name, it is the alternate again.
    h.exchange("ae", "fanout");
    h.bind("ae-queue", "ae", "");
    assert!(h.publish("x", "k", "m2").routed);
    assert_eq!(h.bodies(chans[0]), ["m2"]);
}

#[test]
fn an_exchange_can_be_its_own_alternate_and_be_deleted() {
    let mut h = Harness::new();
    h.exchange_args(
        "x",
        "direct",
        table(&[("alternate-exchange", long_str("x"))]),
    );
    assert!(!h.publish("x", "k", "m").routed);
    h.vh.exchange_delete("x", false).unwrap();
    h.exchange("y", "fanout");
    h.declare("q");
    h.bind("q", "y", "");
    assert!(h.publish("y", "k", "m").routed);
}

#[test]
fn cc_keys_route_together_so_one_match_keeps_the_alternate_out() {
    let mut h = Harness::new();
    let chans = queues_with_consumers(&mut h, &["q", "ae-queue"]);
    h.exchange("ae", "fanout");
    h.bind("ae-queue", "ae", "");
    h.exchange_args(
        "x",
        "topic",
        table(&[("alternate-exchange", long_str("ae"))]),
    );
    h.bind("q", "x", "k1");
    let props = with_headers(table(&[("CC", str_array(&["k2"]))]));
    h.publish_props("x", "k1", props, "m").unwrap();
    assert_eq!(h.bodies(chans[0]), ["m"]);
    assert!(
        h.bodies(chans[1]).is_empty(),
        "an unmatched CC key does not send a copy to the alternate"
    );
    let props = with_headers(table(&[("CC", str_array(&["k1"]))]));
    h.publish_props("x", "k2", props, "via-cc").unwrap();
    assert_eq!(h.bodies(chans[0]), ["via-cc"]);
    assert!(h.bodies(chans[1]).is_empty());
    let props = with_headers(table(&[("CC", str_array(&["k3"]))]));
    h.publish_props("x", "k2", props, "nowhere").unwrap();
    assert_eq!(
        h.bodies(chans[1]),
        ["nowhere"],
        "no key matched: the alternate takes it once"
    );
}

#[test]
fn cc_or_bcc_that_is_not_an_array_is_406() {
    let mut h = Harness::new();
    h.declare("q");
    for name in ["CC", "BCC"] {
        let props = with_headers(table(&[(name, long_str("q"))]));
        let err = h.publish_props("", "q", props, "m").unwrap_err();
        assert_eq!(err.code, 406);
        assert_eq!(
            err.text,
            format!(
                "PRECONDITION_FAILED - invalid message: {{unacceptable_type_in_header,\"{name}\",longstr}}"
            )
        );
    }
    assert_eq!(h.ready("q"), 0);
    // A missing exchange is reported first.
    let props = with_headers(table(&[("CC", int(1))]));
    let err = h.publish_props("nope", "q", props, "m").unwrap_err();
    assert_eq!(err.code, 404);
}
