"""At-least-once dead-lettering of a quorum queue on a single node
(`x-dead-letter-strategy=at-least-once` with `x-overflow=reject-publish`): the queue keeps a
dead letter until every queue it is routed to has it, through a restart and a kill -9, and the
letters it keeps count against its length limit. test_quorum.py has the simplest case (a route
that appears later); test_quorum_dead_letters.py the replicated one (a cluster's leader killed).

Runs against RabbitMQ 3.10 too (the SIGKILL variant is warren only: the suite does not own
RabbitMQ's process). RabbitMQ's dead-letter worker tries a dead letter again only after its
confirm timeout, so the waits there are long.
"""

import signal

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from helpers import get, message_count, wait_for

pytestmark = [
    pytest.mark.skipif(IN_CLUSTER_RUN, reason="single node: test_quorum_dead_letters.py has the "
                                              "cluster's"),
    pytest.mark.timeout(600 if BROKER_KIND == "rabbitmq" else 60),
]

RETRY_S = 400 if BROKER_KIND == "rabbitmq" else 20
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def declare_source(ch, name, dlx, max_length):
    ch.queue_declare(name, durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": dlx,
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        "x-max-length": max_length})


def fits(ch, queue, body):
    """Publishes with confirms: whether the queue took it (a nack: it is full)."""
    try:
        ch.basic_publish("", queue, body, PERSISTENT)
        return True
    except pika.exceptions.NackError:
        return False


def reject_all(ch, queue, count):
    bodies = []
    for _ in range(count):
        m, _, body = get(ch, queue, auto_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=False)
        bodies.append(body)
    return bodies


def drain_bodies(ch, queue, count, timeout):
    """`count` messages of `queue` as (body, properties), each waited for up to `timeout`."""
    got = []
    for _ in range(count):
        _, props, body = get(ch, queue, timeout=timeout)
        got.append((body, props))
    return got


@pytest.mark.restart
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_held_dead_letters_survive_a_restart_and_still_count_against_the_limit(broker, name, sig):
    dlx, target, barrier = name + ".dlx", name + ".target", name + ".barrier"
    count = 30
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare(dlx, "fanout", durable=True)
    declare_source(ch, name, dlx, count - 1)
    ch.queue_declare(barrier, durable=True)
    ch.confirm_delivery()
    bodies = [f"m{i}".encode() for i in range(count)]
    for b in bodies:
        assert fits(ch, name, b)
    # Nothing is bound to the dead-letter exchange: every rejected message waits in the source.
    assert sorted(reject_all(ch, name, count)) == sorted(bodies)
    wait_for(lambda: message_count(ch, name) == 0, what="the rejections applied")
    assert not fits(ch, name, b"over"), "the held dead letters fill the queue"
    # A confirmed publish to another queue is written after the rejections' records: once it is
    # confirmed they are on disk too, whatever the broker's sync timing.
    assert fits(ch, barrier, b"sync")
    conn.close()

    broker.restart(sig)
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    # Back as dead letters, not as ready messages, and still filling the queue.
    assert message_count(ch, name) == 0
    assert not fits(ch, name, b"still over")
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, dlx)
    got = drain_bodies(ch, target, count, RETRY_S)
    # At least once: each of them (one could come twice, never zero times).
    assert set(b for b, _ in got) == set(bodies)
    for _, props in got:
        death = props.headers["x-death"][0]
        assert (death["reason"], death["queue"]) == ("rejected", name)
    wait_for(lambda: fits(ch, name, b"fits"), timeout=RETRY_S, interval=0.2,
             what="the delivered dead letters to leave the source")
    for q in (name, target, barrier):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)
    conn.close()


def test_a_full_target_gets_the_dead_letter_once_it_has_room_and_the_others_only_once(ch, name):
    dlx, full, other = name + ".dlx", name + ".full", name + ".other"
    ch.exchange_declare(dlx, "fanout")
    declare_source(ch, name, dlx, 10)
    ch.queue_declare(full, durable=True, arguments={"x-max-length": 1,
                                                    "x-overflow": "reject-publish"})
    ch.queue_declare(other, durable=True)
    ch.queue_bind(full, dlx)
    ch.queue_bind(other, dlx)
    ch.confirm_delivery()
    assert fits(ch, full, b"filler")
    assert fits(ch, name, b"dead")
    assert reject_all(ch, name, 1) == [b"dead"]
    # `other` takes it at once; `full` refuses it, so the source keeps it.
    _, _, body = get(ch, other, timeout=RETRY_S)
    assert body == b"dead"
    assert message_count(ch, full) == 1
    # Room in the full target: the dead letter arrives there, and not a second time in `other`.
    _, _, body = get(ch, full)
    assert body == b"filler"
    _, props, body = get(ch, full, timeout=RETRY_S)
    assert body == b"dead"
    assert props.headers["x-death"][0]["reason"] == "rejected"
    # Let go: the source takes 11 (a quorum queue may go one past its limit), not 12.
    for _ in range(11):
        assert fits(ch, name, b"room")
    assert not fits(ch, name, b"over")
    assert message_count(ch, other) == 0
    for q in (name, full, other):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)


def test_an_expired_message_waits_for_its_route_too(ch, name):
    dlx, target = name + ".dlx", name + ".target"
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(name, durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-exchange": dlx,
        "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        "x-message-ttl": 50})
    ch.confirm_delivery()
    assert fits(ch, name, b"old")
    wait_for(lambda: message_count(ch, name) == 0, what="the message to expire")
    ch.queue_declare(target, durable=True)
    ch.queue_bind(target, dlx)
    _, props, body = get(ch, target, timeout=RETRY_S)
    assert body == b"old"
    assert props.headers["x-death"][0]["reason"] == "expired"
    for q in (name, target):
        ch.queue_delete(q)
    ch.exchange_delete(dlx)
