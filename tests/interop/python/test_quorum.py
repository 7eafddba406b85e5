"""Quorum queues (x-queue-type=quorum) as a single RabbitMQ 3.10 node serves them."""

import time

import pika
import pytest

from conftest import BROKER_KIND
from helpers import drain, expect_channel_error, expect_connection_error, get, message_count, \
    wait_for, wait_message_count

QUORUM = {"x-queue-type": "quorum"}


def declare(ch, name, **args):
    arguments = dict(QUORUM)
    arguments.update(args)
    return ch.queue_declare(name, durable=True, arguments=arguments).method


@pytest.fixture
def qq(ch, name):
    declare(ch, name)
    yield name
    if ch.is_open:
        ch.queue_delete(name)


def test_quorum_queue_accepts_initial_group_size(ch, name):
    declare(ch, name, **{"x-quorum-initial-group-size": 3})  # capped at the cluster size
    ch.queue_delete(name)


@pytest.mark.parametrize("args,reason", [
    ({"x-quorum-initial-group-size": "x"}, "'x-quorum-initial-group-size' for queue '{q}' in vhost '/': \"expected integer, got longstr\""),
    ({"x-quorum-initial-group-size": 0}, "'x-quorum-initial-group-size' for queue '{q}' in vhost '/': {{value_zero,0}}"),
    ({"x-dead-letter-strategy": "bogus"}, "'x-dead-letter-strategy' for queue '{q}' in vhost '/': invalid_dlx_strategy"),
    ({"x-queue-mode": "lazy"}, "'x-queue-mode' for queue '{q}' in vhost '/' of queue type rabbit_quorum_queue"),
], ids=["group-size-string", "group-size-zero", "dlx-strategy", "queue-mode"])
def test_invalid_quorum_argument_is_406(ch, name, args, reason):
    text = expect_channel_error(406, "PRECONDITION_FAILED - invalid arg ", declare, ch, name, **args)
    assert text == "PRECONDITION_FAILED - invalid arg " + reason.format(q=name)


@pytest.mark.parametrize("args", [
    {"x-overflow": "drop-head"}, {"x-expires": 60000}, {"x-message-ttl": 60000},
    {"x-max-length-bytes": 1000}, {"x-single-active-consumer": True}, {"x-max-in-memory-length": 10},
    {"x-dead-letter-strategy": "at-least-once", "x-dead-letter-exchange": "dlx",
     "x-overflow": "reject-publish"},
], ids=lambda a: ",".join(a))
def test_quorum_queue_accepts_supported_arguments(ch, name, args):
    declare(ch, name, **args)
    ch.queue_delete(name)


def test_server_named_quorum_queue_is_406(ch):
    expect_channel_error(406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
                         "rabbit_quorum_queue", ch.queue_declare, "", durable=True, arguments=QUORUM)


def test_redeclare_quorum_as_classic_is_406(conn, ch, qq):
    expect_channel_error(406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{qq}' "
                         "in vhost '/': received none but current is the value 'quorum' of type "
                         "'longstr'", conn.channel().queue_declare, qq, durable=True)


def test_redeclare_with_other_delivery_limit_is_406(conn, name):
    declare(conn.channel(), name, **{"x-delivery-limit": 3})
    expect_channel_error(406, f"PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue "
                         f"'{name}' in vhost '/': received '4' but current is '3'",
                         declare, conn.channel(), name, **{"x-delivery-limit": 4})
    conn.channel().queue_delete(name)


def test_consuming_from_quorum_queue_with_global_qos_is_540(conn, qq):
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1, global_qos=True)
    expect_connection_error(540, f"NOT_IMPLEMENTED - queue '{qq}' in vhost '/' does not support "
                            "global qos", ch.basic_consume, qq, lambda *a: None)


def test_quorum_queue_is_fifo_with_counts(conn, ch, qq):
    for i in range(20):
        ch.basic_publish("", qq, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    wait_message_count(ch, qq, 20)
    got = drain(conn, ch, qq, 20)
    assert [b for _, _, b in got] == [str(i).encode() for i in range(20)]


def test_quorum_queue_purge_and_delete_report_counts(ch, name):
    declare(ch, name)
    for i in range(3):
        ch.basic_publish("", name, b"x")
    wait_message_count(ch, name, 3)
    assert ch.queue_purge(name).method.message_count == 3
    ch.basic_publish("", name, b"y")
    wait_message_count(ch, name, 1)
    assert ch.queue_delete(name).method.message_count == 1


def test_quorum_queue_requeue_puts_the_message_at_the_back(ch, qq):
    # unlike a classic queue, where a requeued message goes back to its original position
    for i in range(3):
        ch.basic_publish("", qq, str(i).encode())
    wait_message_count(ch, qq, 3)
    m, _, _ = get(ch, qq, auto_ack=False)
    ch.basic_nack(m.delivery_tag, requeue=True)
    got = [get(ch, qq) for _ in range(3)]
    assert [b for _, _, b in got] == [b"1", b"2", b"0"]
    assert [m.redelivered for m, _, _ in got] == [False, False, True]


def test_quorum_queue_prefetch_limits_deliveries(conn, ch, qq):
    for i in range(5):
        ch.basic_publish("", qq, b"p")
    wait_message_count(ch, qq, 5)
    ch.basic_qos(prefetch_count=2)
    got = []
    ch.basic_consume(qq, lambda c, m, p, b: got.append(m), auto_ack=False)
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    conn.process_data_events(time_limit=0.3)
    assert len(got) == 2


def test_quorum_queue_reject_publish_nacks_once_the_queue_is_over_its_limit(conn, name):
    # RabbitMQ 3.10 checks the limit before enqueueing: with x-max-length 1 the second message
    # still gets in (the queue is not yet over its limit), the third is refused.
    ch = conn.channel()
    declare(ch, name, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    outcomes = []
    for i in range(4):
        try:
            ch.basic_publish("", name, str(i).encode())
            outcomes.append("ack")
        except pika.exceptions.NackError:
            outcomes.append("nack")
    assert outcomes == ["ack", "ack", "nack", "nack"]
    assert message_count(ch, name) == 2
    ch.queue_delete(name)


def test_quorum_queue_reject_publish_refuses_until_back_to_80_percent_of_its_limit(conn, name):
    # rabbit_fifo's soft limit: once over, a consumer making room for one message does not
    # let one more in; publishes are refused until the queue is back to 80 % of its limit.
    ch = conn.channel()
    declare(ch, name, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    ch.confirm_delivery()

    def publish():
        try:
            ch.basic_publish("", name, b"m")
            return "ack"
        except pika.exceptions.NackError:
            return "nack"

    assert [publish() for _ in range(7)] == ["ack"] * 6 + ["nack"]
    assert get(ch, name)[0] is not None  # 5 left: over 80 % of 5
    assert publish() == "nack"
    assert get(ch, name)[0] is not None  # 4 left: back to 80 %
    assert [publish() for _ in range(3)] == ["ack", "ack", "nack"]
    ch.queue_delete(name)


def test_quorum_queue_max_length_drop_head(ch, name):
    declare(ch, name, **{"x-max-length": 2})
    for i in range(4):
        ch.basic_publish("", name, str(i).encode())
    wait_message_count(ch, name, 2)
    assert [get(ch, name)[2] for _ in range(2)] == [b"2", b"3"]
    ch.queue_delete(name)


def test_quorum_queue_rejected_message_is_dead_lettered(ch, name):
    dlq = ch.queue_declare("", exclusive=True).method.queue
    declare(ch, name, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", name, b"dead")
    m, _, _ = get(ch, name, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    _, props, body = get(ch, dlq)
    assert body == b"dead"
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", name, 1)
    ch.queue_delete(name)


# RabbitMQ's dead-letter worker tries an unroutable dead letter again after its confirm timeout
# (minutes); warren's after a couple of seconds.
AT_LEAST_ONCE_RETRY_S = 200 if BROKER_KIND == "rabbitmq" else 15


@pytest.mark.timeout(2 * AT_LEAST_ONCE_RETRY_S + 30)
def test_at_least_once_dead_letter_waits_for_a_route_and_counts_against_the_limit(ch, name):
    dlx, dlq = name + ".dlx", name + ".dlq"
    ch.exchange_declare(dlx, "fanout")
    declare(ch, name, **{"x-dead-letter-exchange": dlx, "x-dead-letter-strategy": "at-least-once",
                         "x-overflow": "reject-publish", "x-max-length": 2})
    ch.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    ch.basic_publish("", name, b"dead", persistent)
    m, _, _ = get(ch, name, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    # Nothing is bound to the dead-letter exchange: the queue keeps the message, and it counts
    # against x-max-length (at most once, the fourth publish would fit).
    ch.basic_publish("", name, b"1", persistent)
    ch.basic_publish("", name, b"2", persistent)
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", name, b"3", persistent)
    # Once there is a route, it arrives, and the queue lets it go.
    ch.queue_declare(dlq, durable=True)
    ch.queue_bind(dlq, dlx)
    m, props, body = get(ch, dlq, timeout=AT_LEAST_ONCE_RETRY_S)
    assert body == b"dead"
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", name, 1)

    def fits(body):
        try:
            ch.basic_publish("", name, body, persistent)
            return True
        except pika.exceptions.NackError:
            return False
    assert [get(ch, name)[2] for _ in range(2)] == [b"1", b"2"]

    def room_for_three():
        """Publishes until a nack and takes them out again: with the dead letter let go the
        queue takes three before it is over its limit of two; still held, the letter leaves
        room for two. (RabbitMQ settles it a moment after the target has it, and refuses
        publishes once over the limit until the queue is below 80 % of it, rabbit_fifo's soft
        limit: emptying it each time lets it take publishes again.)"""
        taken = 0
        while taken < 4 and fits(b"%d" % taken):
            taken += 1
        for _ in range(taken):
            get(ch, name)
        return taken == 3
    wait_for(room_for_three, timeout=AT_LEAST_ONCE_RETRY_S, interval=0.2,
             what="the dead letter settled")
    for q in (name, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_quorum_queue_message_ttl_expires(ch, name):
    declare(ch, name, **{"x-message-ttl": 100})
    ch.basic_publish("", name, b"old")
    wait_message_count(ch, name, 0, timeout=3)
    ch.queue_delete(name)


def test_quorum_queue_single_active_consumer(conn, ch, name):
    declare(ch, name, **{"x-single-active-consumer": True})
    got = {"a": [], "b": []}
    ch.basic_consume(name, lambda c, m, p, b: got["a"].append(b), auto_ack=True)
    ch.basic_consume(name, lambda c, m, p, b: got["b"].append(b), auto_ack=True)
    for i in range(3):
        ch.basic_publish("", name, str(i).encode())
    deadline = time.monotonic() + 5
    while len(got["a"]) < 3 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert (len(got["a"]), got["b"]) == (3, [])
    ch.queue_delete(name)


def test_unacked_quorum_messages_return_when_the_channel_closes(conn, name):
    ch = conn.channel()
    declare(ch, name)
    ch.basic_publish("", name, b"held")
    c2 = conn.channel()
    m, _, _ = get(c2, name, auto_ack=False)
    c2.close()
    m, props, body = get(ch, name)
    assert body == b"held" and m.redelivered and props.headers["x-delivery-count"] == 1
    ch.queue_delete(name)


def test_acks_committed_in_a_transaction_are_settled_and_rolled_back_ones_are_not(conn, name):
    ch = conn.channel()
    declare(ch, name)
    for i in range(4):
        ch.basic_publish("", name, str(i).encode())
    wait_message_count(ch, name, 4)
    c2 = conn.channel()
    c2.tx_select()
    held = [get(c2, name, auto_ack=False) for _ in range(4)]
    c2.basic_ack(held[0][0].delivery_tag)
    c2.basic_nack(held[1][0].delivery_tag, requeue=False)
    c2.tx_commit()
    c2.basic_ack(held[2][0].delivery_tag)
    c2.tx_rollback()
    c2.basic_ack(held[3][0].delivery_tag)
    c2.tx_commit()
    c2.close()
    # 0 and 3 acked, 1 discarded, 2's ack rolled back: only 2 returns when the channel closes
    m, _, body = get(ch, name)
    assert body == b"2" and m.redelivered
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    ch.queue_delete(name)


def test_a_committed_publish_is_in_the_quorum_queue_when_commit_ok_arrives(conn, name):
    ch = conn.channel()
    declare(ch, name)
    tx = conn.channel()
    tx.tx_select()
    for i in range(3):
        tx.basic_publish("", name, str(i).encode())
    tx.tx_commit()
    # No waiting: commit-ok came after the group applied the publishes here.
    assert [ch.basic_get(name, auto_ack=True)[2] for _ in range(3)] == [b"0", b"1", b"2"]
    ch.queue_delete(name)


@pytest.mark.skipif(BROKER_KIND == "rabbitmq",
                    reason="RabbitMQ 4's two priorities: 3.10's quorum queues ignore priorities")
def test_high_priority_messages_are_served_first_two_to_one(ch, qq):
    # As RabbitMQ 4.0's quorum queues: a priority above 4 is high, the rest normal; while
    # both wait, two high ones go for every normal one, the third being the older head.
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", qq, f"normal-{i}".encode(),
                         pika.BasicProperties(priority=4 if i else None))
    for i in range(3):
        ch.basic_publish("", qq, f"high-{i}".encode(), pika.BasicProperties(priority=5 + i))
    got = [get(ch, qq)[2] for _ in range(6)]
    assert got == [b"high-0", b"high-1", b"normal-0", b"high-2", b"normal-1", b"normal-2"], got
