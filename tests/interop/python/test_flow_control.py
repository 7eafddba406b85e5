"""Memory alarm: publishers get connection.blocked and are not read from; consumers go on.

Both brokers raise the alarm at runtime: rabbitmqctl / warren ctl set_vm_memory_high_watermark
(see Broker.set_memory_alarm)."""

import pika
import pytest

from helpers import get, wait_for

BLOCKED_WAIT_S = 10.0


@pytest.fixture
def memory_alarm(broker):
    broker.set_memory_alarm(True)
    yield
    broker.set_memory_alarm(False)


def pump(conn, until, timeout=BLOCKED_WAIT_S, what="event"):
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or until(), timeout, what=what)


def test_publisher_gets_connection_blocked_and_its_message_is_held(broker, memory_alarm, name):
    # a blocked connection is not read from, not even its connection.close: let pika give up fast
    publisher = broker.connect(blocked_connection_timeout=2)
    blocked = []
    publisher.add_on_connection_blocked_callback(lambda c, frame: blocked.append(frame.method.reason))
    pch = publisher.channel()
    pch.queue_declare(name)  # declares are not blocked, publishes are
    pch.basic_publish("", name, b"held")
    pump(publisher, lambda: blocked, what="connection.blocked")
    assert blocked == ["low on memory"]
    observer = broker.connect()
    try:
        assert observer.channel().queue_declare(name, passive=True).method.message_count == 0
        observer.channel().queue_delete(name)
    finally:
        observer.close()
    if publisher.is_open:
        try:
            publisher.close()
        except pika.exceptions.ConnectionBlockedTimeout:
            pass  # RabbitMQ does not read the close of a blocked connection


def test_consumers_keep_receiving_during_memory_alarm(broker, name):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True)
    ch.basic_publish("", name, b"before alarm", pika.BasicProperties(delivery_mode=2))
    ch.queue_declare(name, durable=True, passive=True)
    c.close()
    broker.set_memory_alarm(True)
    try:
        consumer = broker.connect()
        cch = consumer.channel()
        _, _, body = get(cch, name, timeout=5)
        assert body == b"before alarm"
        cch.queue_delete(name)
        consumer.close()
    finally:
        broker.set_memory_alarm(False)


def test_clearing_the_alarm_unblocks_and_delivers_held_messages(broker, name):
    broker.set_memory_alarm(True)
    try:
        publisher = broker.connect()
        events = []
        publisher.add_on_connection_blocked_callback(lambda c, f: events.append("blocked"))
        publisher.add_on_connection_unblocked_callback(lambda c, f: events.append("unblocked"))
        pch = publisher.channel()
        pch.queue_declare(name)
        pch.basic_publish("", name, b"held")
        pump(publisher, lambda: events, what="connection.blocked")
    finally:
        broker.set_memory_alarm(False)
    pump(publisher, lambda: "unblocked" in events, what="connection.unblocked")
    assert events == ["blocked", "unblocked"]
    assert get(pch, name)[2] == b"held"
    pch.queue_delete(name)
    publisher.close()


def test_disk_alarm_blocks_publishers_until_the_limit_is_lowered(broker, name):
    # A disk free limit above any real free space raises the disk alarm at once, as a full
    # disk would; lowering it clears the alarm and the held publish goes through.
    broker.ctl("set_disk_free_limit", str(10**18))
    publisher = None
    try:
        publisher = broker.connect(blocked_connection_timeout=10)
        events = []
        publisher.add_on_connection_blocked_callback(
            lambda c, f: events.append(("blocked", f.method.reason)))
        publisher.add_on_connection_unblocked_callback(lambda c, f: events.append(("unblocked",)))
        pch = publisher.channel()
        pch.queue_declare(name)
        pch.basic_publish("", name, b"held")
        pump(publisher, lambda: events, what="connection.blocked")
        assert events == [("blocked", "low on disk")]
    finally:
        broker.ctl("set_disk_free_limit", "50000000")
    pump(publisher, lambda: len(events) == 2, what="connection.unblocked")
    assert events[1] == ("unblocked",)
    wait_for(lambda: publisher.process_data_events(time_limit=0.05)
             or pch.queue_declare(name, passive=True).method.message_count == 1,
             BLOCKED_WAIT_S, what="the held message to arrive")
    pch.queue_delete(name)
    publisher.close()
