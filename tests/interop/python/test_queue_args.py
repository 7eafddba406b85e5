"""Optional queue arguments (x-*): TTLs, length limits, overflow, dead-lettering, priorities,
single active consumer, and how ill-typed or out-of-range values are refused."""

import time

import pika
import pytest

from helpers import (drain, expect_channel_error, get, message_count, wait_for,
                     wait_message_count)

TTL_MS = 200
TTL_WAIT_S = 10.0   # a deadline for the polls: generous, they return once the TTL has acted


# ---------------------------------------------------------------- argument validation

INVALID_ARGS = [
    ({"x-message-ttl": "abc"}, "x-message-ttl", '"expected integer, got longstr"'),
    ({"x-message-ttl": -1}, "x-message-ttl", "{value_negative,-1}"),
    ({"x-message-ttl": 2**40}, "x-message-ttl", "{value_too_large,1099511627776}"),
    ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-expires": -5}, "x-expires", "{value_negative,-5}"),
    ({"x-expires": "x"}, "x-expires", '"expected integer, got longstr"'),
    ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length": "x"}, "x-max-length", '"expected integer, got longstr"'),
    ({"x-max-length-bytes": -1}, "x-max-length-bytes", "{value_negative,-1}"),
    ({"x-overflow": "bogus"}, "x-overflow", "invalid_overflow"),
    ({"x-overflow": 1}, "x-overflow", "{unacceptable_type,signedint}"),
    ({"x-max-priority": 256}, "x-max-priority", "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "x-max-priority", "{value_negative,-1}"),
    ({"x-max-priority": "x"}, "x-max-priority", '"expected integer, got longstr"'),
    ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key", "routing_key_but_no_dlx_defined"),
    ({"x-single-active-consumer": "yes"}, "x-single-active-consumer", "{unacceptable_type,longstr}"),
    ({"x-queue-type": "bogus"}, "x-queue-type", "\"unsupported queue type 'bogus'\""),
    ({"x-queue-mode": "bogus"}, "x-queue-mode", "\"unsupported queue mode 'bogus'\""),
]


@pytest.mark.parametrize("args,arg,reason", INVALID_ARGS,
                         ids=[f"{list(a)[0]}={list(a.values())[0]!r}" for a, _, _ in INVALID_ARGS])
def test_invalid_queue_argument_is_406_with_reason(ch, name, args, arg, reason):
    text = expect_channel_error(406, f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' "
                                "in vhost '/': ", ch.queue_declare, name, arguments=args)
    assert text.endswith(reason), text


def test_dead_letter_exchange_of_wrong_type_is_406(ch, name):
    expect_channel_error(406, "PRECONDITION_FAILED - invalid type 'signedint' for arg "
                         f"'x-dead-letter-exchange' in queue '{name}' in vhost '/'",
                         ch.queue_declare, name, arguments={"x-dead-letter-exchange": 1})


def test_delivery_limit_on_classic_queue_is_406(ch, name):
    expect_channel_error(406, f"PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue "
                         f"'{name}' in vhost '/' of queue type rabbit_classic_queue",
                         ch.queue_declare, name, arguments={"x-delivery-limit": 3})


def test_unknown_x_argument_is_accepted_and_ignored(ch, name):
    ch.queue_declare(name, arguments={"x-unknown-arg": "whatever", "not-x": 1})
    ch.queue_delete(name)


@pytest.mark.parametrize("exp,reason", [
    ("abc", "no_integer"), ("-1", "{value_negative,-1}"), ("", "no_integer"),
    ("1.5", '{leftover_string,".5"}')])
def test_invalid_per_message_expiration_is_406(conn, exp, reason):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration=exp))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, passive=True)
    assert excinfo.value.reply_code == 406
    assert excinfo.value.reply_text == f"PRECONDITION_FAILED - invalid expiration '{exp}': {reason}"


# ---------------------------------------------------------------- TTL and expiry


def test_queue_message_ttl_expires_messages(ch, name):
    ch.queue_declare(name, arguments={"x-message-ttl": TTL_MS})
    ch.basic_publish("", name, b"short-lived")
    wait_message_count(ch, name, 0, timeout=TTL_WAIT_S)
    assert ch.basic_get(name, auto_ack=True)[0] is None
    ch.queue_delete(name)


def test_queue_message_ttl_keeps_fresh_messages(ch, name):
    ch.queue_declare(name, arguments={"x-message-ttl": 60000})
    ch.basic_publish("", name, b"fresh")
    assert get(ch, name)[2] == b"fresh"
    ch.queue_delete(name)


def test_message_ttl_zero_drops_messages_without_consumer(ch, name):
    ch.queue_declare(name, arguments={"x-message-ttl": 0})
    ch.basic_publish("", name, b"gone")
    ch.basic_publish("", name, b"gone too")
    wait_message_count(ch, name, 0)
    ch.queue_delete(name)


def test_message_ttl_zero_still_delivers_to_waiting_consumer(conn, ch, name):
    ch.queue_declare(name, arguments={"x-message-ttl": 0})
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", name, b"immediate")
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or got, what="delivery")
    assert got == [b"immediate"]
    ch.queue_delete(name)


def test_per_message_expiration_expires_message(ch, name):
    ch.queue_declare(name)
    ch.basic_publish("", name, b"expires", pika.BasicProperties(expiration=str(TTL_MS)))
    ch.basic_publish("", name, b"stays")
    wait_message_count(ch, name, 1, timeout=TTL_WAIT_S)
    method, props, body = get(ch, name)
    assert body == b"stays"
    ch.queue_delete(name)


def test_per_message_expiration_is_delivered_unchanged_when_fresh(ch, name):
    ch.queue_declare(name)
    ch.basic_publish("", name, b"m", pika.BasicProperties(expiration="60000"))
    assert get(ch, name)[1].expiration == "60000"
    ch.queue_delete(name)


def test_lower_of_queue_ttl_and_message_expiration_wins(ch, name):
    ch.queue_declare(name, arguments={"x-message-ttl": 60000})
    ch.basic_publish("", name, b"m", pika.BasicProperties(expiration=str(TTL_MS)))
    wait_message_count(ch, name, 0, timeout=TTL_WAIT_S)
    ch.queue_delete(name)


def test_unused_queue_with_x_expires_is_deleted(conn, name):
    ch = conn.channel()
    ch.queue_declare(name, arguments={"x-expires": 300})

    def gone():
        try:
            conn.channel().queue_declare(name, passive=True)
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True
    # a passive declare counts as use and restarts the timer: poll slower than x-expires
    wait_for(gone, timeout=TTL_WAIT_S, interval=1.0, what="x-expires queue to be deleted")


def test_x_expires_does_not_delete_a_queue_with_consumers(conn, name):
    ch = conn.channel()
    ch.queue_declare(name, arguments={"x-expires": 300})
    ch.basic_consume(name, lambda *a: None)
    time.sleep(1.0)
    conn.channel().queue_declare(name, passive=True)
    ch.queue_delete(name)


# ---------------------------------------------------------------- length limits and overflow


def test_max_length_drops_oldest_messages(ch, name):
    ch.queue_declare(name, arguments={"x-max-length": 3})
    for i in range(5):
        ch.basic_publish("", name, str(i).encode())
    wait_message_count(ch, name, 3)
    assert [get(ch, name)[2] for _ in range(3)] == [b"2", b"3", b"4"]
    ch.queue_delete(name)


def test_max_length_zero_keeps_nothing(ch, name):
    ch.queue_declare(name, arguments={"x-max-length": 0})
    ch.basic_publish("", name, b"x")
    ch.basic_publish("", name, b"y")
    wait_message_count(ch, name, 0)
    ch.queue_delete(name)


def test_max_length_bytes_drops_oldest_by_body_size(ch, name):
    ch.queue_declare(name, arguments={"x-max-length-bytes": 25})
    for i in range(5):
        ch.basic_publish("", name, str(i).encode() * 10)  # 10 bytes each
    wait_message_count(ch, name, 2)
    assert [get(ch, name)[2] for _ in range(2)] == [b"3" * 10, b"4" * 10]
    ch.queue_delete(name)


def test_overflow_drop_head_is_the_default(ch, name):
    ch.queue_declare(name, arguments={"x-max-length": 1, "x-overflow": "drop-head"})
    ch.basic_publish("", name, b"old")
    ch.basic_publish("", name, b"new")
    wait_message_count(ch, name, 1)
    assert get(ch, name)[2] == b"new"
    ch.queue_delete(name)


def test_overflow_reject_publish_nacks_confirmed_publish(conn, name):
    ch = conn.channel()
    ch.queue_declare(name, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", name, b"1")
    ch.basic_publish("", name, b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", name, b"3")
    assert message_count(ch, name) == 2
    assert [get(ch, name)[2] for _ in range(2)] == [b"1", b"2"]
    ch.basic_publish("", name, b"4")  # room again: acked
    ch.queue_delete(name)


def test_overflow_reject_publish_without_confirms_drops_silently(ch, name):
    ch.queue_declare(name, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", name, b"kept")
    ch.basic_publish("", name, b"dropped")
    wait_message_count(ch, name, 1)
    assert get(ch, name)[2] == b"kept"
    ch.queue_delete(name)


def test_overflow_reject_publish_dlx_dead_letters_the_rejected(conn, name):
    ch = conn.channel()
    dlq = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_declare(name, arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                      "x-dead-letter-exchange": "",
                                      "x-dead-letter-routing-key": dlq})
    ch.confirm_delivery()
    ch.basic_publish("", name, b"kept")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", name, b"rejected")
    _, props, body = get(ch, dlq)
    assert body == b"rejected"
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("maxlen", name, 1)
    ch.queue_delete(name)


# ---------------------------------------------------------------- dead-lettering


def _dlx_setup(ch, name, **extra):
    ch.exchange_declare(name + ".dlx", "direct")
    dlq = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(dlq, name + ".dlx", routing_key=extra.pop("bind_key", name))
    args = {"x-dead-letter-exchange": name + ".dlx"}
    args.update(extra)
    ch.queue_declare(name, arguments=args)
    return dlq


def _cleanup(ch, name):
    ch.queue_delete(name)
    ch.exchange_delete(name + ".dlx")


def test_rejected_message_is_dead_lettered_with_x_death(ch, name):
    dlq = _dlx_setup(ch, name)
    ch.basic_publish("", name, b"bad", pika.BasicProperties(headers={"orig": "h"}, message_id="m1"))
    method, _, _ = get(ch, name, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    _, props, body = get(ch, dlq)
    assert body == b"bad"
    assert props.message_id == "m1" and props.headers["orig"] == "h"
    (death,) = props.headers["x-death"]
    assert death["count"] == 1
    assert death["reason"] == "rejected"
    assert death["queue"] == name
    assert death["exchange"] == ""
    assert death["routing-keys"] == [name]
    assert isinstance(death["time"], __import__("datetime").datetime)
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-queue"] == name
    assert props.headers["x-first-death-exchange"] == ""
    _cleanup(ch, name)


def test_nacked_message_is_dead_lettered(ch, name):
    dlq = _dlx_setup(ch, name)
    ch.basic_publish("", name, b"nacked")
    method, _, _ = get(ch, name, auto_ack=False)
    ch.basic_nack(method.delivery_tag, requeue=False)
    _, props, body = get(ch, dlq)
    assert body == b"nacked" and props.headers["x-death"][0]["reason"] == "rejected"
    _cleanup(ch, name)


def test_requeued_reject_is_not_dead_lettered(ch, name):
    dlq = _dlx_setup(ch, name)
    ch.basic_publish("", name, b"again")
    method, _, _ = get(ch, name, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = get(ch, name)
    assert method.redelivered and body == b"again"
    assert message_count(ch, dlq) == 0
    _cleanup(ch, name)


@pytest.mark.parametrize("settle", ["reject", "nack"])
def test_requeued_reject_in_a_zero_ttl_queue_expires_the_message(conn, ch, name, settle):
    # x-message-ttl=0: a message lives only the instant it is published, so a consumer that
    # hands it back with requeue=true sees it expire (dead-lettered as expired), never again.
    # (Measured on RabbitMQ 3.10: requeue_and_run drops it with Now >= Expiry.)
    dlq = _dlx_setup(ch, name, **{"x-message-ttl": 0})
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append((m, b)))
    ch.basic_publish("", name, b"once")
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or got, what="delivery")
    (m, _), = got
    assert not m.redelivered
    got.clear()
    if settle == "reject":
        ch.basic_reject(m.delivery_tag, requeue=True)
    else:
        ch.basic_nack(m.delivery_tag, requeue=True)
    _, props, body = get(ch, dlq)
    assert body == b"once"
    assert [(d["reason"], d["queue"]) for d in props.headers["x-death"]] == [("expired", name)]
    conn.process_data_events(time_limit=0.2)
    assert got == []
    _cleanup(ch, name)


def test_expired_message_is_dead_lettered_with_reason_expired(ch, name):
    dlq = _dlx_setup(ch, name, **{"x-message-ttl": TTL_MS})
    ch.basic_publish("", name, b"old")
    _, props, body = get(ch, dlq, timeout=TTL_WAIT_S)
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("expired", name, 1)
    assert "original-expiration" not in death  # only a per-message expiration is recorded
    _cleanup(ch, name)


def test_per_message_expiration_is_removed_on_dead_letter(ch, name):
    dlq = _dlx_setup(ch, name)
    ch.basic_publish("", name, b"m", pika.BasicProperties(expiration=str(TTL_MS)))
    _, props, body = get(ch, dlq, timeout=TTL_WAIT_S)
    assert props.expiration is None
    death = props.headers["x-death"][0]
    assert death["reason"] == "expired"
    assert death["original-expiration"] == str(TTL_MS)
    _cleanup(ch, name)


def test_max_length_overflow_is_dead_lettered_with_reason_maxlen(ch, name):
    dlq = _dlx_setup(ch, name, **{"x-max-length": 1})
    ch.basic_publish("", name, b"first")
    ch.basic_publish("", name, b"second")
    _, props, body = get(ch, dlq)
    assert body == b"first"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    _cleanup(ch, name)


def test_dead_letter_routing_key_replaces_the_original_key(ch, name):
    dlq = _dlx_setup(ch, name, bind_key="dead", **{"x-dead-letter-routing-key": "dead"})
    ch.basic_publish("", name, b"m")
    method, _, _ = get(ch, name, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get(ch, dlq)
    assert method.routing_key == "dead"
    assert props.headers["x-death"][0]["routing-keys"] == [name]
    _cleanup(ch, name)


def test_dead_lettering_twice_through_the_same_queue_increments_count(ch, name):
    # queue A dead-letters to B (ttl), B dead-letters back to A: x-death counts per (queue, reason)
    a, b = name + ".a", name + ".b"
    ch.queue_declare(a, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b})
    ch.queue_declare(b, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a,
                                   "x-message-ttl": 50})
    ch.basic_publish("", a, b"loop")
    for expected_count in (1, 2):
        method, props, _ = get(ch, a, auto_ack=False)
        if expected_count == 2:
            deaths = {(d["queue"], d["reason"]): d["count"] for d in props.headers["x-death"]}
            assert deaths == {(a, "rejected"): 1, (b, "expired"): 1}
            assert props.headers["x-death"][0]["queue"] == b  # most recent first
            ch.basic_ack(method.delivery_tag)
            break
        ch.basic_reject(method.delivery_tag, requeue=False)
    ch.basic_publish("", a, b"again")
    ch.queue_delete(a)
    ch.queue_delete(b)


def test_dead_letter_to_missing_exchange_drops_message(ch, name):
    ch.queue_declare(name, arguments={"x-dead-letter-exchange": name + ".missing"})
    ch.basic_publish("", name, b"m")
    method, _, _ = get(ch, name, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    wait_message_count(ch, name, 0)
    ch.queue_delete(name)


# ---------------------------------------------------------------- priorities


def test_priority_queue_delivers_highest_priority_first(ch, name):
    ch.queue_declare(name, arguments={"x-max-priority": 10})
    for body, prio in [(b"low", 1), (b"none", None), (b"high", 9), (b"mid", 5), (b"over", 200)]:
        ch.basic_publish("", name, body, pika.BasicProperties(priority=prio))
    wait_message_count(ch, name, 5)
    # priorities above the max count as the max (10 > 9); no priority counts as 0
    assert [get(ch, name)[2] for _ in range(5)] == [b"over", b"high", b"mid", b"low", b"none"]
    ch.queue_delete(name)


def test_priority_queue_keeps_fifo_within_a_priority(ch, name):
    ch.queue_declare(name, arguments={"x-max-priority": 2})
    for i in range(5):
        ch.basic_publish("", name, str(i).encode(), pika.BasicProperties(priority=1))
    wait_message_count(ch, name, 5)
    assert [get(ch, name)[2] for _ in range(5)] == [str(i).encode() for i in range(5)]
    ch.queue_delete(name)


def test_queue_without_max_priority_ignores_priority(ch, name):
    ch.queue_declare(name)
    ch.basic_publish("", name, b"a", pika.BasicProperties(priority=1))
    ch.basic_publish("", name, b"b", pika.BasicProperties(priority=9))
    wait_message_count(ch, name, 2)
    assert [get(ch, name)[2] for _ in range(2)] == [b"a", b"b"]
    ch.queue_delete(name)


def test_redeclare_with_different_max_priority_is_406(conn, name):
    conn.channel().queue_declare(name, arguments={"x-max-priority": 5})
    expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue "
                         f"'{name}' in vhost '/': received '6' but current is '5'",
                         conn.channel().queue_declare, name, arguments={"x-max-priority": 6})
    conn.channel().queue_delete(name)


# ---------------------------------------------------------------- single active consumer


def test_single_active_consumer_gets_everything_until_it_cancels(conn, name):
    ch = conn.channel()
    ch.queue_declare(name, arguments={"x-single-active-consumer": True})
    got = {"a": [], "b": []}
    ta = ch.basic_consume(name, lambda c, m, p, b: got["a"].append(b), auto_ack=True)
    ch.basic_consume(name, lambda c, m, p, b: got["b"].append(b), auto_ack=True)
    for i in range(4):
        ch.basic_publish("", name, str(i).encode())
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(got["a"]) == 4,
             what="active consumer to get all")
    assert got["b"] == []
    assert ch.queue_declare(name, passive=True).method.consumer_count == 2
    ch.basic_cancel(ta)
    ch.basic_publish("", name, b"after")
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or got["b"], what="failover")
    assert got["b"] == [b"after"]
    ch.queue_delete(name)


def test_single_active_consumer_redelivers_unacked_to_the_next_consumer(broker, name):
    c1, c2 = broker.connect(), broker.connect()
    ch1, ch2 = c1.channel(), c2.channel()
    ch1.queue_declare(name, arguments={"x-single-active-consumer": True})
    got1, got2 = [], []
    ch1.basic_consume(name, lambda c, m, p, b: got1.append(b), auto_ack=False)
    ch2.basic_consume(name, lambda c, m, p, b: got2.append((m.redelivered, b)), auto_ack=True)
    ch2.basic_publish("", name, b"m")
    wait_for(lambda: c1.process_data_events(time_limit=0.05) or got1, what="first delivery")
    c1.close()
    wait_for(lambda: c2.process_data_events(time_limit=0.05) or got2, what="redelivery")
    assert got2 == [(True, b"m")]
    ch2.queue_delete(name)
    c2.close()


def test_x_death_count_grows_when_dead_lettered_again_for_the_same_reason(ch, name):
    # the queue dead-letters rejections back into itself
    ch.queue_declare(name, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name})
    ch.basic_publish("", name, b"boomerang")
    for expected in (1, 2, 3):
        m, _, _ = get(ch, name, auto_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=False)
        m, props, _ = get(ch, name, auto_ack=False)
        deaths = props.headers["x-death"]
        assert len(deaths) == 1
        assert (deaths[0]["count"], deaths[0]["reason"], deaths[0]["queue"]) == (expected, "rejected", name)
        ch.basic_reject(m.delivery_tag, requeue=True)
    ch.queue_delete(name)


def test_x_death_entries_a_publisher_repeated_are_merged_by_queue_and_reason(ch, name):
    # RabbitMQ 3.10-3.12 keep the first entry of each (queue, reason), a count on it (the number
    # of entries it stood for when it had none), and count the new death on that entry, which
    # goes first. The order of the others is where the brokers differ on purpose (3.10 reverses
    # them on every death, warren keeps them newest first: docs/dead-lettering.md).
    dlq = _dlx_setup(ch, name)
    def death(queue, reason, count=None):
        d = {"queue": queue, "reason": reason, "exchange": "", "routing-keys": [queue]}
        if count is not None:
            d["count"] = count
        return d
    sent = [death(name, "rejected", 3), death("elsewhere", "expired", 1),
            death(name, "rejected", 5), death("c", "maxlen"), death("c", "maxlen")]
    ch.basic_publish("", name, b"m", pika.BasicProperties(headers={"x-death": sent}))
    m, _, _ = get(ch, name, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    _, props, _ = get(ch, dlq)
    got = [(d["queue"], d["reason"], d.get("count")) for d in props.headers["x-death"]]
    assert got[0] == (name, "rejected", 4)
    assert sorted(got[1:]) == [("c", "maxlen", 2), ("elsewhere", "expired", 1)]
    _cleanup(ch, name)


def test_an_old_rejection_does_not_excuse_an_expiry_cycle(broker, ch, name):
    # a dead-letters to b, b (TTL) to c, c (TTL) back to b, all through exchange X; an observer
    # queue bound like b sees each copy c sends towards b. Rejected once in a, the message then
    # only expires: its second arrival at b is a cycle without a rejection since it left b.
    # warren drops it there; RabbitMQ 3.10's x-death grouping puts the old rejection in front of
    # b's entry and the message goes round for ever (docs/dead-lettering.md, measured on 3.10.8).
    x, a, b, c, seen = name + ".x", name + ".a", name + ".b", name + ".c", name + ".seen"
    ch.exchange_declare(x, "direct")
    def dead_letters_to(key, ttl=None):
        args = {"x-dead-letter-exchange": x, "x-dead-letter-routing-key": key}
        if ttl:
            args["x-message-ttl"] = ttl
        return args
    ch.queue_declare(a, arguments=dead_letters_to("to-b"))
    ch.queue_declare(b, arguments=dead_letters_to("to-c", TTL_MS))
    ch.queue_declare(c, arguments=dead_letters_to("to-b", TTL_MS))
    ch.queue_declare(seen)
    ch.queue_bind(b, x, "to-b")
    ch.queue_bind(c, x, "to-c")
    ch.queue_bind(seen, x, "to-b")
    try:
        ch.basic_publish("", a, b"m")
        m, _, _ = get(ch, a, auto_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=False)
        _, first, _ = get(ch, seen, timeout=TTL_WAIT_S)  # a -> b
        assert [(d["queue"], d["reason"]) for d in first.headers["x-death"]] == [(a, "rejected")]
        _, props, _ = get(ch, seen, timeout=TTL_WAIT_S)  # b -> c -> b
        deaths = [(d["queue"], d["reason"]) for d in props.headers["x-death"]]
        if broker.is_rabbitmq:
            assert deaths == [(c, "expired"), (a, "rejected"), (b, "expired")]
            get(ch, seen, timeout=TTL_WAIT_S)  # and round again
        else:
            assert deaths == [(c, "expired"), (b, "expired"), (a, "rejected")]
            # Routed to b and seen at once: b refused it as a cycle before seen got its copy.
            assert (message_count(ch, b), message_count(ch, c)) == (0, 0)
    finally:
        for q in (a, b, c, seen):
            ch.queue_delete(q)
        ch.exchange_delete(x)


def test_expired_messages_in_a_dead_letter_cycle_are_dropped(ch, name):
    # an automatic (expiry) cycle without any rejection is broken by dropping the message
    ch.queue_declare(name, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name,
                                      "x-message-ttl": 50})
    ch.basic_publish("", name, b"cycle")
    wait_message_count(ch, name, 0, timeout=TTL_WAIT_S)
    # ... for good: a message going round the cycle would be back within a few TTLs.
    time.sleep(0.5)
    assert message_count(ch, name) == 0
    ch.queue_delete(name)


def test_dead_lettered_message_keeps_its_properties_and_body(ch, name):
    dlq = _dlx_setup(ch, name)
    sent = pika.BasicProperties(content_type="text/plain", correlation_id="c", priority=3,
                                delivery_mode=2, headers={"k": [1, "two"]}, app_id="a")
    ch.basic_publish("", name, b"payload", sent)
    m, _, _ = get(ch, name, auto_ack=False)
    ch.basic_nack(m.delivery_tag, requeue=False)
    method, props, body = get(ch, dlq)
    assert body == b"payload" and method.exchange == name + ".dlx" and method.routing_key == name
    for key in ["content_type", "correlation_id", "priority", "delivery_mode", "app_id"]:
        assert getattr(props, key) == getattr(sent, key), key
    assert props.headers["k"] == [1, "two"]
    _cleanup(ch, name)
