"""Heartbeats: the broker sends them, and drops a client that stops sending."""

import time

import amqp_raw as amqp
from helpers import get, wait_message_count

HEARTBEAT_S = 1
DEAD_CLIENT_CLOSE_S_MIN = 1.5   # never before ~2 missed intervals
DEAD_CLIENT_CLOSE_S_MAX = 6.0   # RabbitMQ 3.10 drops it after ~3 s


def test_broker_sends_heartbeats_on_an_idle_connection(broker, raw):
    c = raw()
    c.open(heartbeat=HEARTBEAT_S)
    f = c.read_frame(timeout=3 * HEARTBEAT_S, skip_heartbeats=False)
    assert (f.type, f.channel, f.payload) == (amqp.FRAME_HEARTBEAT, 0, b"")


def test_silent_client_is_disconnected_after_missed_heartbeats(broker, raw):
    c = raw()
    start = time.monotonic()
    c.open(heartbeat=HEARTBEAT_S)
    assert c.wait_closed(timeout=DEAD_CLIENT_CLOSE_S_MAX + 2)
    elapsed = time.monotonic() - start
    assert DEAD_CLIENT_CLOSE_S_MIN <= elapsed <= DEAD_CLIENT_CLOSE_S_MAX, elapsed


def test_client_sending_heartbeats_stays_connected(broker, raw):
    c = raw()
    c.open(heartbeat=HEARTBEAT_S)
    deadline = time.monotonic() + 4 * HEARTBEAT_S
    while time.monotonic() < deadline:
        c.send(amqp.heartbeat_frame())
        try:
            c.read_frame(timeout=0.4, skip_heartbeats=False)
        except TimeoutError:
            pass
    c.open_channel(1)  # still alive


def test_heartbeat_zero_disables_the_timeout(broker, raw):
    c = raw()
    c.open(heartbeat=0)
    try:
        f = c.read_frame(timeout=3.5, skip_heartbeats=False)
        raise AssertionError(f"unexpected frame with heartbeats off: {f}")
    except TimeoutError:
        pass
    c.open_channel(1)


def test_unacked_messages_of_a_dead_client_are_requeued(broker, raw, conn, name):
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_publish("", name, b"orphan")
    wait_message_count(ch, name, 1)
    c = raw()
    c.open(heartbeat=HEARTBEAT_S)
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(name, "dead")))
    c.expect_method(amqp.BASIC_CONSUME_OK)
    c.expect_method(amqp.BASIC_DELIVER)
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    assert c.wait_closed(timeout=DEAD_CLIENT_CLOSE_S_MAX + 2)
    m, _, body = get(ch, name, timeout=5)
    assert body == b"orphan" and m.redelivered
    ch.queue_delete(name)


def test_pika_with_heartbeats_survives_idle_periods(broker):
    c = broker.connect(heartbeat=HEARTBEAT_S)
    ch = c.channel()
    c.sleep(3.5)  # pika answers heartbeats while it sleeps
    assert ch.queue_declare("", exclusive=True).method.queue
    c.close()
