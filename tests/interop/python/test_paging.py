"""Backlogs kept on disk: lazy queues, quorum queues with x-max-in-memory-length, and any
durable queue once the node's message memory budget is spent. Whatever stays on disk, clients
see the same messages in the same order, across SIGKILL restarts. The order checks run on both
brokers; how many bodies are paged out is read from warren's management API."""

import json
import signal
import urllib.parse

import pika
import pytest

from helpers import get, management, metric, wait_for

BODY_BYTES = 1024


def body(i):
    head = f"{i:08}".encode()
    return head + b"." * (BODY_BYTES - len(head))


def publish_confirmed(ch, queue, n, start=0):
    ch.confirm_delivery()
    for i in range(start, start + n):
        ch.basic_publish("", queue, body(i), pika.BasicProperties(delivery_mode=2))


def publish_committed(conn, queue, n, batch=500):
    """Publishes n persistent messages on a channel of their own, in transactions of `batch`:
    a commit-ok promises its messages durable as a confirm does, but costs one fsync per batch
    rather than one per message, so that how long a big backlog takes to publish does not hang
    on the disk's sync latency (20,000 confirms one at a time took 8 s on an idle machine and
    outlasted the 30 s test timeout on the same machine busy)."""
    ch = conn.channel()
    ch.tx_select()
    for start in range(0, n, batch):
        for i in range(start, min(start + batch, n)):
            ch.basic_publish("", queue, body(i), pika.BasicProperties(delivery_mode=2))
        ch.tx_commit()
    ch.close()


def consume_in_order(conn, ch, queue, n, ack=True):
    """Consumes n messages with a prefetch window, acking each; returns their numbers."""
    ch.basic_qos(prefetch_count=200)
    got = []
    for method, _props, payload in ch.consume(queue, inactivity_timeout=10):
        assert method is not None, f"timed out after {len(got)} of {n} messages"
        assert len(payload) == BODY_BYTES and payload == body(int(payload[:8]))
        got.append(int(payload[:8]))
        if ack:
            ch.basic_ack(method.delivery_tag)
        if len(got) == n:
            break
    ch.cancel()
    return got


def queue_info(broker, queue):
    return json.loads(management(broker, f"/api/queues/%2F/{urllib.parse.quote(queue, safe='')}"))


def test_a_lazy_queue_keeps_its_backlog_on_disk_and_delivers_it_in_order(broker, conn, ch, name):
    ch.queue_declare(name, durable=True, arguments={"x-queue-mode": "lazy"})
    publish_confirmed(ch, name, 2000)
    if not broker.is_rabbitmq:
        info = queue_info(broker, name)
        assert info["messages_ready"] == 2000
        assert info["messages_paged_out"] >= 1990, info
        assert info["message_bytes_ready"] == 2000 * BODY_BYTES
    assert consume_in_order(conn, ch, name, 2000) == list(range(2000))
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    ch.queue_delete(name)


def test_requeued_messages_find_their_place_in_a_paged_backlog(broker, conn, ch, name):
    ch.queue_declare(name, durable=True, arguments={"x-queue-mode": "lazy"})
    publish_confirmed(ch, name, 300)
    held = [get(ch, name, auto_ack=False)[0] for _ in range(5)]
    ch.basic_nack(held[3].delivery_tag, requeue=True)
    ch.basic_nack(held[1].delivery_tag, requeue=True)
    got = [int(get(ch, name)[2][:8]) for _ in range(3)]
    assert got == [1, 3, 5]
    for m in (held[0], held[2], held[4]):
        ch.basic_ack(m.delivery_tag)
    assert consume_in_order(conn, ch, name, 294) == list(range(6, 300))
    ch.queue_delete(name)


def test_a_quorum_queue_over_its_in_memory_length_delivers_everything_in_order(
        broker, conn, ch, name):
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum",
                                                     "x-max-in-memory-length": 10})
    publish_confirmed(ch, name, 1000)
    if not broker.is_rabbitmq:
        assert queue_info(broker, name)["messages_paged_out"] >= 990
    assert consume_in_order(conn, ch, name, 1000) == list(range(1000))
    ch.queue_delete(name)


@pytest.mark.restart
def test_a_backlog_beyond_the_memory_budget_stays_on_disk_across_sigkill(broker, name):
    if broker.is_rabbitmq:
        pytest.skip("--message-memory-bytes is warren's")
    budget = 2_000_000
    broker.restart(signal.SIGTERM, extra_args=["--message-memory-bytes", str(budget)])
    try:
        c = broker.connect()
        ch = c.channel()
        ch.queue_declare(name, durable=True)
        publish_committed(c, name, 20_000)
        info = queue_info(broker, name)
        assert info["messages_ready"] == 20_000
        assert info["messages_paged_out"] >= 18_000, info
        assert metric(broker, "warren_message_memory_bytes") <= budget
        # Half of it consumed and acked, then a crash: the other half comes back, on disk.
        assert consume_in_order(c, ch, name, 10_000) == list(range(10_000))
        ch.queue_declare(name, durable=True, passive=True)  # a round trip: acks processed
        c.close()
        broker.restart(signal.SIGKILL)
        c = broker.connect()
        ch = c.channel()
        info = queue_info(broker, name)
        assert info["messages_ready"] == 10_000
        # Recovery reads no body; the clock's look at the head reads one batch back.
        assert info["messages_paged_out"] >= 10_000 - 256, info
        m, _, payload = get(ch, name, auto_ack=False)
        assert m.redelivered and int(payload[:8]) == 10_000
        ch.basic_nack(m.delivery_tag, requeue=True)
        assert consume_in_order(c, ch, name, 10_000) == list(range(10_000, 20_000))
        wait_for(lambda: queue_info(broker, name)["messages"] == 0, what="queue emptied")
        ch.queue_delete(name)
        c.close()
    finally:
        broker.restart(signal.SIGTERM, extra_args=[])
