"""Many connections, channels and consumers at once: every message arrives exactly once."""

import threading
import time

import pika

PUBLISHERS = 4
CONSUMERS = 3
MESSAGES_PER_PUBLISHER = 250
FANOUT_QUEUES = 20
FANOUT_MESSAGES = 100
DEADLINE_S = 30


def test_competing_consumers_receive_every_confirmed_message_exactly_once(broker, name):
    admin = broker.connect()
    admin.channel().queue_declare(name)
    received, lock, stop = [], threading.Lock(), threading.Event()

    def consume():
        c = broker.connect()
        ch = c.channel()
        ch.basic_qos(prefetch_count=10)

        def on_message(channel, method, props, body):
            with lock:
                received.append(body)
            channel.basic_ack(method.delivery_tag)
        ch.basic_consume(name, on_message)
        while not stop.is_set():
            c.process_data_events(time_limit=0.05)
        c.close()

    def publish(p):
        c = broker.connect()
        ch = c.channel()
        ch.confirm_delivery()
        for i in range(MESSAGES_PER_PUBLISHER):
            ch.basic_publish("", name, f"{p}:{i}".encode())
        c.close()

    consumers = [threading.Thread(target=consume, daemon=True) for _ in range(CONSUMERS)]
    publishers = [threading.Thread(target=publish, args=(p,), daemon=True) for p in range(PUBLISHERS)]
    for t in consumers + publishers:
        t.start()
    for t in publishers:
        t.join(DEADLINE_S)
    expected = {f"{p}:{i}".encode() for p in range(PUBLISHERS) for i in range(MESSAGES_PER_PUBLISHER)}
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        with lock:
            if len(received) >= len(expected):
                break
        time.sleep(0.05)
    time.sleep(0.2)  # a duplicate would show up now
    stop.set()
    for t in consumers:
        t.join(DEADLINE_S)
    assert len(received) == len(expected)
    assert set(received) == expected
    assert admin.channel().queue_declare(name, passive=True).method.message_count == 0
    admin.channel().queue_delete(name)
    admin.close()


def test_fanout_to_many_queues_keeps_per_queue_order(broker, conn, ch, name):
    ch.exchange_declare(name, "fanout")
    queues = []
    for i in range(FANOUT_QUEUES):
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, name)
        queues.append(q)
    ch.confirm_delivery()
    for i in range(FANOUT_MESSAGES):
        ch.basic_publish(name, "", str(i).encode())
    for q in queues:
        assert ch.queue_declare(q, passive=True).method.message_count == FANOUT_MESSAGES
        got = []
        while True:
            m, _, body = ch.basic_get(q, auto_ack=True)
            if m is None:
                break
            got.append(body)
        assert got == [str(i).encode() for i in range(FANOUT_MESSAGES)]
    ch.exchange_delete(name)


def test_many_channels_each_with_a_consumer(broker, conn, name):
    channels = [conn.channel() for _ in range(50)]
    channels[0].queue_declare(name)
    counts = [0] * len(channels)

    def make_cb(i):
        def cb(channel, method, props, body):
            counts[i] += 1
        return cb
    for i, c in enumerate(channels):
        c.basic_consume(name, make_cb(i), auto_ack=True)
    pub = conn.channel()
    for i in range(500):
        pub.basic_publish("", name, b"m")
    deadline = time.monotonic() + DEADLINE_S
    while sum(counts) < 500 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert sum(counts) == 500
    assert all(c == 10 for c in counts), counts  # strict round robin over 50 consumers
    channels[0].queue_delete(name)
