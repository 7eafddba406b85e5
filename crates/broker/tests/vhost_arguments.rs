//! Queue argument validation through queue.declare: every known x- argument with the wrong
//! type or value, worded as RabbitMQ 3.10.8 words it (rabbit_amqqueue:check_declare_arguments,
//! whose details are Erlang terms printed with ~p).

mod support;

use support::*;
use warren_protocol::{AMQPValue, FieldTable};

fn declare_classic(args: &[(&str, AMQPValue)]) -> Result<(), String> {
    let mut h = Harness::new();
    h.declare_args("q", table(args)).map(|_| ()).map_err(|e| {
        assert_eq!(e.code, 406, "{}", e.text);
        e.text
    })
}

fn declare_quorum(args: &[(&str, AMQPValue)]) -> Result<(), String> {
    let mut h = Harness::new();
    let mut pairs = vec![("x-queue-type", long_str("quorum"))];
    pairs.extend(args.iter().cloned());
    h.declare_with(1, "q", true, table(&pairs))
        .map(|_| ())
        .map_err(|e| {
            assert_eq!(e.code, 406, "{}", e.text);
            e.text
        })
}

fn invalid(key: &str, detail: &str) -> Result<(), String> {
    Err(format!(
        "PRECONDITION_FAILED - invalid arg '{key}' for queue 'q' in vhost '/': {detail}"
    ))
}

fn other_type(key: &str, module: &str) -> Result<(), String> {
    Err(format!(
        "PRECONDITION_FAILED - invalid arg '{key}' for queue 'q' in vhost '/' of queue type {module}"
    ))
}

fn s(v: &str) -> AMQPValue {
    long_str(v)
}

const TEN_YEARS_MS: i64 = 315_360_000_000;

#[test]
fn integer_arguments_accept_every_integer_type() {
    for v in [
        AMQPValue::ShortShortInt(5),
        AMQPValue::ShortShortUInt(5),
        AMQPValue::ShortInt(5),
        AMQPValue::ShortUInt(5),
        AMQPValue::LongInt(5),
        AMQPValue::LongUInt(5),
        AMQPValue::LongLongInt(5),
    ] {
        for key in [
            "x-message-ttl",
            "x-expires",
            "x-max-length",
            "x-max-length-bytes",
            "x-max-priority",
        ] {
            assert_eq!(declare_classic(&[(key, v.clone())]), Ok(()), "{key} {v:?}");
        }
    }
}

#[test]
fn integer_arguments_refuse_other_types() {
    for key in [
        "x-message-ttl",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
    ] {
        assert_eq!(
            declare_classic(&[(key, s("5"))]),
            invalid(key, "\"expected integer, got longstr\"")
        );
        assert_eq!(
            declare_classic(&[(key, AMQPValue::Boolean(true))]),
            invalid(key, "\"expected integer, got bool\"")
        );
        assert_eq!(
            declare_classic(&[(key, AMQPValue::Double(5.0))]),
            invalid(key, "\"expected integer, got double\"")
        );
    }
}

#[test]
fn message_ttl_may_be_zero_but_not_negative_nor_over_ten_years() {
    assert_eq!(declare_classic(&[("x-message-ttl", int(0))]), Ok(()));
    assert_eq!(
        declare_classic(&[("x-message-ttl", int(TEN_YEARS_MS))]),
        Ok(())
    );
    assert_eq!(
        declare_classic(&[("x-message-ttl", int(-1))]),
        invalid("x-message-ttl", "{value_negative,-1}")
    );
    assert_eq!(
        declare_classic(&[("x-message-ttl", int(TEN_YEARS_MS + 1))]),
        invalid("x-message-ttl", "{value_too_large,315360000001}")
    );
}

#[test]
fn expires_must_be_positive_and_at_most_ten_years() {
    assert_eq!(declare_classic(&[("x-expires", int(1))]), Ok(()));
    assert_eq!(
        declare_classic(&[("x-expires", int(0))]),
        invalid("x-expires", "{value_zero,0}")
    );
    assert_eq!(
        declare_classic(&[("x-expires", int(-5))]),
        invalid("x-expires", "{value_negative,-5}")
    );
    assert_eq!(
        declare_classic(&[("x-expires", int(TEN_YEARS_MS + 1))]),
        invalid("x-expires", "{value_too_large,315360000001}")
    );
}

#[test]
fn length_limits_must_not_be_negative() {
    for key in ["x-max-length", "x-max-length-bytes"] {
        assert_eq!(declare_classic(&[(key, int(0))]), Ok(()));
        assert_eq!(
            declare_classic(&[(key, int(-1))]),
            invalid(key, "{value_negative,-1}")
        );
        assert_eq!(
            declare_quorum(&[(key, int(-1))]),
            invalid(key, "{value_negative,-1}")
        );
    }
}

#[test]
fn max_priority_is_between_0_and_255() {
    assert_eq!(declare_classic(&[("x-max-priority", int(255))]), Ok(()));
    assert_eq!(declare_classic(&[("x-max-priority", int(0))]), Ok(()));
    assert_eq!(
        declare_classic(&[("x-max-priority", int(256))]),
        invalid("x-max-priority", "{max_value_exceeded,256}")
    );
    assert_eq!(
        declare_classic(&[("x-max-priority", int(-1))]),
        invalid("x-max-priority", "{value_negative,-1}")
    );
}

#[test]
fn overflow_takes_the_three_modes_as_long_strings() {
    for mode in ["drop-head", "reject-publish", "reject-publish-dlx"] {
        assert_eq!(
            declare_classic(&[("x-overflow", s(mode))]),
            Ok(()),
            "{mode}"
        );
    }
    assert_eq!(
        declare_classic(&[("x-overflow", s("drop-tail"))]),
        invalid("x-overflow", "invalid_overflow")
    );
    assert_eq!(
        declare_classic(&[("x-overflow", int(1))]),
        invalid("x-overflow", "{unacceptable_type,long}")
    );
}

#[test]
fn queue_mode_is_default_or_lazy() {
    assert_eq!(declare_classic(&[("x-queue-mode", s("lazy"))]), Ok(()));
    assert_eq!(declare_classic(&[("x-queue-mode", s("default"))]), Ok(()));
    assert_eq!(
        declare_classic(&[("x-queue-mode", s("fast"))]),
        invalid("x-queue-mode", "\"unsupported queue mode 'fast'\"")
    );
    assert_eq!(
        declare_classic(&[("x-queue-mode", AMQPValue::LongInt(1))]),
        invalid("x-queue-mode", "{unacceptable_type,signedint}")
    );
}

#[test]
fn queue_version_is_1_or_2() {
    assert_eq!(declare_classic(&[("x-queue-version", int(1))]), Ok(()));
    assert_eq!(declare_classic(&[("x-queue-version", int(2))]), Ok(()));
    assert_eq!(
        declare_classic(&[("x-queue-version", int(3))]),
        invalid("x-queue-version", "\"unsupported queue version '3'\"")
    );
}

#[test]
fn single_active_consumer_must_be_a_bool() {
    assert_eq!(
        declare_classic(&[("x-single-active-consumer", AMQPValue::Boolean(false))]),
        Ok(())
    );
    assert_eq!(
        declare_classic(&[("x-single-active-consumer", s("true"))]),
        invalid("x-single-active-consumer", "{unacceptable_type,longstr}")
    );
    assert_eq!(
        declare_quorum(&[("x-single-active-consumer", int(1))]),
        invalid("x-single-active-consumer", "{unacceptable_type,long}")
    );
}

#[test]
fn queue_type_is_classic_or_quorum() {
    assert_eq!(declare_classic(&[("x-queue-type", s("classic"))]), Ok(()));
    assert_eq!(
        declare_classic(&[("x-queue-type", s("fifo"))]),
        invalid("x-queue-type", "\"unsupported queue type 'fifo'\"")
    );
    assert_eq!(
        declare_classic(&[("x-queue-type", int(1))]),
        invalid("x-queue-type", "{unacceptable_type,long}")
    );
}

#[test]
fn dead_letter_arguments_are_strings_and_a_key_needs_an_exchange() {
    // Checked by rabbit_channel before the other arguments, in its own words.
    assert_eq!(
        declare_classic(&[
            ("x-dead-letter-exchange", int(1)),
            ("x-message-ttl", s("bad")),
        ]),
        Err("PRECONDITION_FAILED - invalid type 'long' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'".to_string())
    );
    assert_eq!(
        declare_classic(&[("x-dead-letter-routing-key", s("k"))]),
        invalid(
            "x-dead-letter-routing-key",
            "routing_key_but_no_dlx_defined"
        )
    );
    assert_eq!(
        declare_classic(&[
            ("x-dead-letter-exchange", s("dlx")),
            ("x-dead-letter-routing-key", int(1)),
        ]),
        invalid("x-dead-letter-routing-key", "{unacceptable_type,long}")
    );
    assert_eq!(
        declare_classic(&[
            ("x-dead-letter-exchange", s("dlx")),
            ("x-dead-letter-routing-key", s("k")),
        ]),
        Ok(())
    );
}

#[test]
fn quorum_only_arguments_are_refused_on_classic_queues() {
    for (key, v) in [
        ("x-delivery-limit", int(3)),
        ("x-max-in-memory-length", int(3)),
        ("x-max-in-memory-bytes", int(3)),
        ("x-quorum-initial-group-size", int(3)),
        ("x-dead-letter-strategy", s("at-most-once")),
        ("x-queue-leader-locator", s("client-local")),
        ("x-max-age", s("1D")),
        ("x-stream-max-segment-size-bytes", int(3)),
        ("x-initial-cluster-size", int(3)),
    ] {
        assert_eq!(
            declare_classic(&[(key, v)]),
            other_type(key, "rabbit_classic_queue")
        );
    }
}

#[test]
fn classic_only_arguments_are_refused_on_quorum_queues() {
    for (key, v) in [
        ("x-max-priority", int(3)),
        ("x-queue-mode", s("lazy")),
        ("x-queue-version", int(2)),
        ("x-queue-master-locator", s("min-masters")),
    ] {
        assert_eq!(
            declare_quorum(&[(key, v)]),
            other_type(key, "rabbit_quorum_queue")
        );
    }
}

#[test]
fn quorum_arguments_are_validated() {
    assert_eq!(
        declare_quorum(&[
            ("x-delivery-limit", int(3)),
            ("x-max-in-memory-length", int(3)),
            ("x-max-in-memory-bytes", int(3)),
            ("x-quorum-initial-group-size", int(3)),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-queue-leader-locator", s("balanced")),
            ("x-message-ttl", int(100)),
            ("x-single-active-consumer", AMQPValue::Boolean(true)),
        ]),
        Ok(())
    );
    assert_eq!(
        declare_quorum(&[("x-quorum-initial-group-size", int(0))]),
        invalid("x-quorum-initial-group-size", "{value_zero,0}")
    );
    assert_eq!(
        declare_quorum(&[("x-quorum-initial-group-size", int(-2))]),
        invalid("x-quorum-initial-group-size", "{value_negative,-2}")
    );
    assert_eq!(
        declare_quorum(&[("x-max-in-memory-length", int(-1))]),
        invalid("x-max-in-memory-length", "{value_negative,-1}")
    );
    assert_eq!(
        declare_quorum(&[("x-dead-letter-strategy", s("maybe"))]),
        invalid("x-dead-letter-strategy", "invalid_dlx_strategy")
    );
    assert_eq!(
        declare_quorum(&[("x-queue-leader-locator", s("nearest"))]),
        invalid("x-queue-leader-locator", "invalid_queue_locator_arg")
    );
}

#[test]
fn quorum_queues_accept_reject_publish_dlx_as_drop_head() {
    // RabbitMQ 3.10 logs a warning and keeps its default overflow behaviour.
    let mut h = Harness::new();
    h.declare_with(
        1,
        "qq",
        true,
        table(&[
            ("x-queue-type", s("quorum")),
            ("x-max-length", int(1)),
            ("x-overflow", s("reject-publish-dlx")),
        ]),
    )
    .unwrap();
    assert!(!h.publish("", "qq", "m1").rejected);
    assert!(!h.publish("", "qq", "m2").rejected);
    let ch = h.open(1);
    assert_eq!(h.drain(ch, "qq"), ["m2"]);
}

#[test]
fn unknown_arguments_are_ignored() {
    assert_eq!(
        declare_classic(&[("x-whatever", s("x")), ("no-prefix", int(1))]),
        Ok(())
    );
    assert_eq!(
        declare_quorum(&[("x-whatever", FieldTable::default().into())]),
        Ok(())
    );
}
