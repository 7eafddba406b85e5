"""Durability across broker restarts (SIGTERM and SIGKILL). On RabbitMQ the graceful restart is
rabbitmqctl stop_app/start_app and the SIGKILL variants are skipped (the suite does not own the
Erlang process); warren is really killed and started again (Broker.restart)."""

import signal

import pika
import pytest

from helpers import expect_channel_error, get, message_count, wait_message_count

SIGNALS = [signal.SIGTERM, signal.SIGKILL]


@pytest.mark.restart
@pytest.mark.parametrize("sig", SIGNALS, ids=["sigterm", "sigkill"])
def test_confirmed_persistent_messages_survive_restart(broker, name, sig):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for i in range(100):
        ch.basic_publish("", name, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    c.close()
    broker.restart(sig)
    c = broker.connect()
    ch = c.channel()
    assert ch.queue_declare(name, durable=True, passive=True).method.message_count == 100
    assert [get(ch, name)[2] for _ in range(100)] == [str(i).encode() for i in range(100)]
    ch.queue_delete(name)
    c.close()


@pytest.mark.restart
def test_persistent_messages_larger_than_16_mib_are_confirmed_and_survive_sigkill(broker, name):
    # RabbitMQ takes messages up to max_message_size (128 MiB by default) into durable queues;
    # warren once nacked persistent ones above 16 MiB, the engine's old entry limit.
    sizes = [17 << 20, 40 << 20]
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for n in sizes:
        ch.basic_publish("", name, bytes([n % 251]) * n, pika.BasicProperties(delivery_mode=2))
    c.close()
    broker.restart(signal.SIGKILL)
    c = broker.connect()
    ch = c.channel()
    assert ch.queue_declare(name, durable=True, passive=True).method.message_count == len(sizes)
    for n in sizes:
        body = get(ch, name, timeout=30)[2]
        assert body == bytes([n % 251]) * n
    ch.queue_delete(name)
    c.close()


@pytest.mark.restart
@pytest.mark.parametrize("sig", SIGNALS, ids=["sigterm", "sigkill"])
def test_acked_messages_do_not_come_back_after_restart(broker, name, sig):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", name, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    for _ in range(4):
        m, _, _ = get(ch, name, auto_ack=False)
        ch.basic_ack(m.delivery_tag)
    ch.queue_declare(name, passive=True)  # a round trip: the acks have been processed
    c.close()
    broker.restart(sig)
    c = broker.connect()
    ch = c.channel()
    assert [get(ch, name)[2] for _ in range(6)] == [str(i).encode() for i in range(4, 10)]
    ch.queue_delete(name)
    c.close()


@pytest.mark.restart
@pytest.mark.parametrize("sig", SIGNALS, ids=["sigterm", "sigkill"])
def test_durable_topology_survives_and_transient_topology_does_not(broker, name, sig):
    c = broker.connect()
    ch = c.channel()
    ch.exchange_declare(name + ".dx", "topic", durable=True)
    ch.exchange_declare(name + ".tx", "topic", durable=False)
    ch.queue_declare(name + ".dq", durable=True, arguments={"x-max-length": 5})
    ch.queue_declare(name + ".tq", durable=False)
    ch.queue_bind(name + ".dq", name + ".dx", routing_key="a.#")
    ch.exchange_declare(name + ".dsrc", "fanout", durable=True)
    ch.exchange_bind(name + ".dx", name + ".dsrc")
    c.close()
    broker.restart(sig)
    c = broker.connect()
    ch = c.channel()
    ch.exchange_declare(name + ".dx", "topic", durable=True, passive=True)
    ch.queue_declare(name + ".dq", durable=True, arguments={"x-max-length": 5})  # same args: ok
    expect_channel_error(404, "NOT_FOUND", c.channel().exchange_declare, name + ".tx", "topic",
                         passive=True)
    expect_channel_error(404, "NOT_FOUND", c.channel().queue_declare, name + ".tq", passive=True)
    ch.basic_publish(name + ".dx", "a.b", b"bound after restart")
    assert get(ch, name + ".dq")[2] == b"bound after restart"
    ch.basic_publish(name + ".dsrc", "a.c", b"through e2e")
    assert get(ch, name + ".dq")[2] == b"through e2e"
    for i in range(7):  # x-max-length 5 is still enforced
        ch.basic_publish("", name + ".dq", str(i).encode())
    wait_message_count(ch, name + ".dq", 5)
    ch.queue_delete(name + ".dq")
    ch.exchange_delete(name + ".dx")
    ch.exchange_delete(name + ".dsrc")
    c.close()


@pytest.mark.restart
def test_transient_messages_in_durable_queue_are_gone_after_restart(broker, name):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", name, b"transient", pika.BasicProperties(delivery_mode=1))
    ch.basic_publish("", name, b"persistent", pika.BasicProperties(delivery_mode=2))
    c.close()
    broker.restart(signal.SIGTERM)
    c = broker.connect()
    ch = c.channel()
    assert message_count(ch, name) == 1
    assert get(ch, name)[2] == b"persistent"
    ch.queue_delete(name)
    c.close()


@pytest.mark.restart
@pytest.mark.parametrize("sig", SIGNALS, ids=["sigterm", "sigkill"])
def test_unacked_messages_are_redelivered_after_restart(broker, name, sig):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", name, b"in flight", pika.BasicProperties(delivery_mode=2))
    m, _, _ = get(ch, name, auto_ack=False)
    broker.restart(sig)
    c2 = broker.connect()
    ch2 = c2.channel()
    m, _, body = get(ch2, name)
    assert body == b"in flight"
    ch2.queue_delete(name)
    c2.close()


@pytest.mark.restart
@pytest.mark.parametrize("sig", SIGNALS, ids=["sigterm", "sigkill"])
def test_confirmed_quorum_queue_messages_survive_restart(broker, name, sig):
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 5})
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", name, str(i).encode())  # quorum queues keep even transient messages
    m, _, _ = get(ch, name, auto_ack=False)
    ch.basic_ack(m.delivery_tag)
    ch.queue_declare(name, passive=True)
    c.close()
    broker.restart(sig)
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 5})
    wait_message_count(ch, name, 49, timeout=15)
    assert [get(ch, name)[2] for _ in range(49)] == [str(i).encode() for i in range(1, 50)]
    ch.queue_delete(name)
    c.close()


@pytest.mark.restart
def test_exclusive_durable_queue_is_gone_after_restart(broker, name):
    c = broker.connect()
    c.channel().queue_declare(name, durable=True, exclusive=True)
    broker.restart(signal.SIGTERM)
    c2 = broker.connect()
    expect_channel_error(404, f"NOT_FOUND - no queue '{name}' in vhost '/'", c2.channel().queue_declare,
                         name, passive=True)
    c2.close()


@pytest.mark.restart
def test_users_vhosts_and_permissions_survive_restart(broker):
    broker.provision("interop-restart-user", "pw", "interop-restart-vhost", ("^r-.*", ".*", ".*"))
    broker.restart(signal.SIGTERM)
    c = pika.BlockingConnection(broker.params(
        credentials=pika.PlainCredentials("interop-restart-user", "pw"),
        virtual_host="interop-restart-vhost"))
    ch = c.channel()
    ch.queue_declare("r-q", auto_delete=True)
    expect_channel_error(403, "ACCESS_REFUSED - access to queue 'x-q' in vhost 'interop-restart-vhost' "
                         "refused for user 'interop-restart-user'", c.channel().queue_declare, "x-q")
    c.close()


@pytest.mark.restart
def test_sigterm_closes_client_connections_with_320_connection_forced(broker):
    # RabbitMQ closes every connection with 320 when it is stopped; warren does on SIGTERM.
    if broker.is_rabbitmq:
        pytest.skip("the suite does not own RabbitMQ's process")
    c = broker.connect()
    c.channel()
    broker.proc.send_signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        for _ in range(100):  # at most 10 s
            c.process_data_events(time_limit=0.1)
    assert excinfo.value.reply_code == 320
    assert excinfo.value.reply_text == (
        "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")
    broker.proc.wait(10)
    assert broker.proc.returncode == 0, "a clean shutdown exits 0"
    broker.restart(signal.SIGTERM)


@pytest.mark.restart
@pytest.mark.parametrize("sig", SIGNALS, ids=["sigterm", "sigkill"])
def test_queue_ttl_keeps_counting_across_restart(broker, name, sig):
    # Stored expiries are wall-clock: a message published before the restart dies on time
    # after it, even with its body still on disk (the head is read back for the check).
    c = broker.connect()
    ch = c.channel()
    ch.queue_declare(name, durable=True, arguments={"x-message-ttl": 3000})
    ch.confirm_delivery()
    ch.basic_publish("", name, b"dies", pika.BasicProperties(delivery_mode=2))
    c.close()
    broker.restart(sig)
    c = broker.connect()
    ch = c.channel()
    assert message_count(ch, name) == 1
    wait_message_count(ch, name, 0, timeout=15)
    ch.queue_delete(name)
    c.close()
