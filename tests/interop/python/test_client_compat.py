"""The small behaviours of RabbitMQ 3.10 that client applications rely on without knowing it
(issue 12): each test here passes on RabbitMQ and on warren."""

import socket
import struct
import time
import urllib.parse

import amqp
import amqp_raw
import pika
import pytest
from helpers import expect_channel_error, get, get_all, message_count, wait_message_count


def test_cr_and_lf_are_stripped_from_exchange_and_queue_names(conn, ch, raw, name):
    # pika waits for a declare-ok naming the queue as it asked, so the raw client declares it.
    c = raw().open()
    c.open_channel()
    c.send(amqp_raw.method_frame(1, amqp_raw.QUEUE_DECLARE,
                                 amqp_raw.queue_declare_args(f"{name}\r\n.q")))
    declared = c.expect_method(amqp_raw.QUEUE_DECLARE_OK).args().shortstr()
    assert declared == f"{name}.q"
    ch.queue_declare(f"{name}.q", passive=True)
    ch.exchange_declare(f"{name}\n.x", "direct")
    ch.exchange_declare(f"{name}.x", passive=True)
    # Every later declare, bind, unbind and delete strips them too.
    ch.queue_bind(f"{name}.q\n", f"{name}.x\r", "k")
    ch.basic_publish(f"{name}.x", "k", b"through the stripped names")
    assert get(ch, f"{name}.q")[2] == b"through the stripped names"
    ch.queue_unbind(f"\r{name}.q", f"{name}.x\n", "k")
    ch.queue_delete(f"{name}\n.q")
    ch.exchange_delete(f"{name}\r.x")
    expect_channel_error(404, "NOT_FOUND", conn.channel().queue_declare, f"{name}.q", passive=True)
    expect_channel_error(404, "NOT_FOUND", conn.channel().exchange_declare, f"{name}.x",
                         passive=True)


def test_bind_with_empty_queue_and_key_binds_the_last_declared_queue_by_its_name(ch, name):
    ch.exchange_declare(f"{name}.x", "direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind("", f"{name}.x", "")
    ch.basic_publish(f"{name}.x", "", b"by the empty key")
    ch.basic_publish(f"{name}.x", q, b"by the queue's name")
    assert get(ch, q)[2] == b"by the queue's name"
    assert ch.basic_get(q, auto_ack=True)[0] is None
    # unbind takes the same shortcut.
    ch.queue_unbind("", f"{name}.x", "")
    ch.basic_publish(f"{name}.x", q, b"unbound")
    ch.queue_declare(f"{name}.probe", exclusive=True)
    assert ch.basic_get(q, auto_ack=True)[0] is None
    ch.exchange_delete(f"{name}.x")


def test_server_properties_name_the_rabbitmq_version_implemented(broker, conn):
    props = conn._impl.server_properties
    # Clients gate features on this version, so warren answers as the release it follows.
    assert props["version"].startswith(b"3.10." if isinstance(props["version"], bytes) else "3.10.")
    if not broker.is_rabbitmq:
        assert props["product"] in ("warren", b"warren")
        assert props["warren_version"]


def test_confirm_of_a_single_message_is_not_multiple(raw, name):
    # Clients that count confirms per tag never see single ones if every ack is multiple.
    c = raw().open()
    c.open_channel()
    c.send(amqp_raw.method_frame(1, amqp_raw.QUEUE_DECLARE,
                                 amqp_raw.queue_declare_args(name, exclusive=True)))
    c.expect_method(amqp_raw.QUEUE_DECLARE_OK)
    c.send(amqp_raw.method_frame(1, (85, 10), b"\x00"))
    c.expect_method((85, 11))
    for seq in (1, 2):
        c.send(amqp_raw.method_frame(1, amqp_raw.BASIC_PUBLISH,
                                     amqp_raw.basic_publish_args("", name))
               + amqp_raw.header_frame(1, 1) + amqp_raw.body_frame(1, b"x"))
        r = c.expect_method((60, 80)).args()
        tag, multiple = r.unpack(">Q")[0], bool(r.octet() & 1)
        assert (tag, multiple) == (seq, False)


def test_passive_declare_of_a_live_direct_reply_to_address_is_ok(conn, ch, name):
    # Responders check that the requester is still there this way before doing the work.
    requester = conn.channel()
    requester.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    ch.queue_declare(name, exclusive=True)
    requester.basic_publish("", name, b"request",
                            pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    address = get(ch, name)[1].reply_to
    assert address.startswith("amq.rabbitmq.reply-to.")
    ok = conn.channel().queue_declare(address, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (address, 0, 1)


def test_tx_ack_of_an_unknown_tag_closes_the_channel_at_once(ch, name):
    ch.tx_select()
    ch.basic_ack(99)
    # Not held back until tx.commit: the next synchronous method finds the channel closed.
    expect_channel_error(406, "PRECONDITION_FAILED - unknown delivery tag 99",
                         ch.queue_declare, name, exclusive=True)


def _gets(ch, queue):
    return [(body, m.redelivered) for m, body in get_all(ch, queue)]


def test_recover_leaves_what_an_open_transaction_acked_until_commit_or_rollback(conn, ch, name):
    # RabbitMQ takes an acked delivery out of the channel's unacked ones at the ack, the
    # transaction holding it: basic.recover does not deliver it again and tx.commit settles it.
    # tx.rollback gives it back to the channel, and a recover then requeues it too.
    other = conn.channel()
    other.queue_declare(name)
    for body in (b"m1", b"m2", b"m3"):
        other.basic_publish("", name, body)
    wait_message_count(other, name, 3)
    ch.tx_select()
    tags = [get(ch, name, auto_ack=False)[0].delivery_tag for _ in range(3)]
    ch.basic_ack(tags[0])
    ch.basic_recover(requeue=True)
    wait_message_count(other, name, 2)
    assert _gets(other, name) == [(b"m2", True), (b"m3", True)]
    ch.tx_commit()
    assert message_count(other, name) == 0

    for body in (b"r1", b"r2"):
        other.basic_publish("", name, body)
    wait_message_count(other, name, 2)
    tags = [get(ch, name, auto_ack=False)[0].delivery_tag for _ in range(2)]
    ch.basic_ack(tags[0])
    ch.tx_rollback()
    ch.basic_recover(requeue=True)
    wait_message_count(other, name, 2)
    assert _gets(other, name) == [(b"r1", True), (b"r2", True)]
    other.queue_delete(name)


def _consume_acking(conn, ch, queues, until, no_ack_queues=()):
    """Consumes from each queue (no-ack from no_ack_queues), acking each delivery as it comes,
    until `until(got)` holds: [(queue, body)] in delivery order."""
    got = []
    def on(queue):
        def cb(c, m, _p, body):
            got.append((queue, body.decode()))
            if queue not in no_ack_queues:
                c.basic_ack(m.delivery_tag)
        return cb
    for q in queues:
        ch.basic_consume(q, on(q), auto_ack=q in no_ack_queues)
    deadline = time.monotonic() + 10
    while not until(got) and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    return got


def test_a_channel_limit_used_up_by_ack_consumers_holds_back_its_no_ack_consumers(conn, ch, name):
    # RabbitMQ's limiter refuses every send once the channel-wide prefetch is reached, no-ack
    # ones included (up to 4.2), while the no-ack deliveries themselves use no credit.
    acked, free = name + ".acked", name + ".free"
    for q in (acked, free):
        ch.queue_declare(q, exclusive=True)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got, unacked, acking = [], [], []
    def on_acked(c, m, _p, body):
        got.append(body)
        if acking:
            c.basic_ack(m.delivery_tag)
        else:
            unacked.append(m.delivery_tag)
    ch.basic_consume(acked, on_acked)
    ch.basic_consume(free, lambda c, m, p, body: got.append(body), auto_ack=True)
    other = conn.channel()
    other.basic_publish("", acked, b"a1")
    other.basic_publish("", acked, b"a2")
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    for body in (b"n1", b"n2"):
        other.basic_publish("", free, body)
    wait_message_count(other, free, 2)  # held back in the queue, not delivered
    conn.process_data_events(time_limit=0)
    assert got == [b"a1"]
    # Acked as they come, everything flows: the no-ack ones go whenever credit is free.
    acking.append(True)
    ch.basic_ack(unacked[0])
    while len(got) < 4 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert sorted(got) == [b"a1", b"a2", b"n1", b"n2"]


def test_a_channel_limit_serves_a_consumer_set_on_several_queues_in_turn(broker, conn, ch, name):
    # Each ack frees the credit for the next queue: warren serves the queues in turn; RabbitMQ's
    # limiter resumes its blocked queues from a random point (rabbit_limiter:notify_queues), so
    # on RabbitMQ each queue gets a fair share, not a strict turn.
    queues = [name + ".a", name + ".b"]
    other = conn.channel()
    for q in queues:
        other.queue_declare(q, exclusive=True)
        for i in range(20):
            other.basic_publish("", q, f"{q[-1]}{i}".encode())
    for q in queues:
        wait_message_count(other, q, 20)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got = _consume_acking(conn, ch, queues, lambda got: len(got) == 40)
    assert len(got) == 40, "every message of both queues is delivered"
    first = [q for q, _ in got[:20]]
    if broker.is_rabbitmq:
        assert 3 <= first.count(queues[0]) <= 17
    else:
        assert first == [queues[i % 2] for i in range(20)]


def raw_client_properties(**capabilities):
    props = dict(amqp_raw.DEFAULT_CLIENT_PROPERTIES)
    props["capabilities"] = {**props["capabilities"], **capabilities}
    return props


@pytest.mark.parametrize("notify", [True, False], ids=["notify", "no_notify"])
def test_queue_deletion_sends_basic_cancel_only_to_clients_with_consumer_cancel_notify(
        ch, raw, name, notify):
    c = raw().open(client_properties=raw_client_properties(consumer_cancel_notify=notify))
    c.open_channel()
    ch.queue_declare(name)
    consume = amqp_raw.method_frame(1, amqp_raw.BASIC_CONSUME,
                                    amqp_raw.basic_consume_args(name, tag="ctag", no_ack=True))
    c.send(consume)
    c.expect_method(amqp_raw.BASIC_CONSUME_OK)
    ch.queue_delete(name)
    if notify:
        assert c.expect_method(amqp_raw.BASIC_CANCEL).args().shortstr() == "ctag"
    else:
        # A client that did not ask is told nothing: its consumer just gets no more messages.
        try:
            f = c.read_frame(timeout=1.0)
        except TimeoutError:
            pass
        else:
            raise AssertionError(f"a client without consumer_cancel_notify was sent {f}")
    # Either way the consumer left the channel: its tag is free, and a new queue of the same
    # name delivers to the new consumer only.
    ch.queue_declare(name)
    c.send(consume)
    c.expect_method(amqp_raw.BASIC_CONSUME_OK)
    ch.basic_publish("", name, b"to the new consumer")
    assert c.expect_method(amqp_raw.BASIC_DELIVER).args().shortstr() == "ctag"
    ch.queue_delete(name)


def py_amqp_connection(broker):
    """A py-amqp (kombu's and Celery's client) connection to the broker under test."""
    uri = urllib.parse.urlparse(broker.uri)
    c = amqp.Connection(f"{broker.host}:{broker.port}", userid=uri.username or "guest",
                        password=uri.password or "guest",
                        virtual_host=urllib.parse.unquote(uri.path[1:]) or "/", connect_timeout=5)
    c.connect()
    return c


def drain_until(c, done, what, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        try:
            c.drain_events(timeout=0.2)
        except socket.timeout:
            pass


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_queue_delete_ok_comes_before_the_basic_cancel_of_the_deleting_channels_consumer(
        broker, name, queue_type):
    # py-amqp raises ConsumerCancelled for a basic.cancel to a consumer without an on_cancel
    # callback: a cancel ahead of delete-ok escaped from queue_delete itself. Three queues, so
    # that in a cluster some live on another node than the client's.
    c = py_amqp_connection(broker)
    try:
        deleting, other = c.channel(), c.channel()
        for i in range(3):
            q = f"{name}.{i}"
            deleting.queue_declare(q, durable=True, auto_delete=False,
                                   arguments={"x-queue-type": queue_type})
            other_cancelled = []
            other.basic_consume(q, callback=lambda m: None, consumer_tag="theirs",
                                on_cancel=other_cancelled.append)
            deleting.basic_consume(q, callback=lambda m: None, consumer_tag="mine")
            assert deleting.queue_delete(q) == 0
            # The cancel still comes, after the delete-ok, as RabbitMQ's does.
            with pytest.raises(amqp.exceptions.ConsumerCancelled) as cancelled:
                drain_until(c, lambda: False, "basic.cancel for the deleting channel")
            assert cancelled.value.reply_text == "mine"
            # And the consumer on another channel is told too.
            drain_until(c, lambda: other_cancelled, "basic.cancel on the other channel")
            assert other_cancelled == ["theirs"]
    finally:
        c.close()


# Enough bytes after the close that the broker cannot have read them all when it is done with
# the connection: a socket closed with unread bytes sends a reset instead of a FIN.
FLOOD_PUBLISHES = 40
FLOOD_BODY_BYTES = 64 * 1024


def publish_flood(queue):
    body = b"x" * FLOOD_BODY_BYTES
    one = (amqp_raw.method_frame(1, amqp_raw.BASIC_PUBLISH, amqp_raw.basic_publish_args("", queue))
           + amqp_raw.header_frame(1, len(body)) + amqp_raw.body_frame(1, body))
    return one * FLOOD_PUBLISHES


def expect_no_reset_until_client_closes(c, queue):
    """After close-ok the client, which has not caught up yet, goes on publishing for a while:
    the broker may half-close (FIN) or keep its side open, but it must go on taking the bytes
    (and dropping them) rather than reset the connection while the client is still there."""
    one = (amqp_raw.method_frame(1, amqp_raw.BASIC_PUBLISH, amqp_raw.basic_publish_args("", queue))
           + amqp_raw.header_frame(1, 1) + amqp_raw.body_frame(1, b"x"))
    c.sock.setblocking(False)
    for _ in range(10):
        time.sleep(0.05)
        try:
            c.sock.sendall(one)
            c.sock.recv(65536)
        except BlockingIOError:
            pass
        except OSError as e:
            raise AssertionError(f"the broker reset the connection after close-ok: {e!r}") from None


def test_frames_after_connection_close_are_discarded_without_a_reset(ch, raw, name):
    ch.queue_declare(name)
    c = raw().open()
    c.open_channel()
    try:
        c.send(amqp_raw.method_frame(0, amqp_raw.CONNECTION_CLOSE,
                                     struct.pack(">H", 200) + amqp_raw.shortstr(b"bye")
                                     + struct.pack(">HH", 0, 0))
               + publish_flood(name))
    except OSError as e:
        raise AssertionError(f"the broker dropped the socket while the client wrote: {e!r}")
    c.expect_method(amqp_raw.CONNECTION_CLOSE_OK)
    expect_no_reset_until_client_closes(c, name)
    c.close()
    # What came after connection.close was not acted on.
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    ch.queue_delete(name)


def test_frames_in_flight_when_the_broker_closes_are_discarded_until_close_ok(ch, raw, name):
    # The other direction, as RabbitMQ does it: after its connection.close the broker reads and
    # drops what the client still sends until close-ok, then closes the socket at once.
    ch.queue_declare(name)
    c = raw().open()
    # A method on a channel that was never opened is a connection error.
    c.send(amqp_raw.method_frame(1, amqp_raw.QUEUE_DECLARE,
                                 amqp_raw.queue_declare_args(name, passive=True)))
    f = c.read_frame()
    assert f.method == amqp_raw.CONNECTION_CLOSE and f.close_reason()[0] == 504, f
    try:
        c.send(publish_flood(name) + amqp_raw.method_frame(0, amqp_raw.CONNECTION_CLOSE_OK))
    except OSError as e:
        raise AssertionError(f"the broker dropped the socket before close-ok: {e!r}")
    assert c.wait_closed(timeout=5.0), "the broker kept the socket open after close-ok"
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    ch.queue_delete(name)


def client_close(c):
    c.send(amqp_raw.method_frame(0, amqp_raw.CONNECTION_CLOSE,
                                 struct.pack(">H", 200) + amqp_raw.shortstr(b"bye")
                                 + struct.pack(">HH", 0, 0)))
    c.expect_method(amqp_raw.CONNECTION_CLOSE_OK)


def test_the_socket_stays_open_after_close_ok_until_the_client_closes_it(raw):
    # A client that reads on after close-ok (lapin) must not find the socket half-closed:
    # RabbitMQ neither shuts its side (a FIN) nor resets until the client closes its own.
    c = raw().open()
    client_close(c)
    c.sock.settimeout(1.5)
    try:
        got = c.sock.recv(65536)
    except socket.timeout:
        pass
    except OSError as e:
        raise AssertionError(f"the broker reset the socket after close-ok: {e!r}") from None
    else:
        assert got, "the broker shut its side of the socket (FIN) right after close-ok"
        raise AssertionError(f"bytes after close-ok: {got!r}")
    c.sock.shutdown(socket.SHUT_WR)
    assert c.wait_closed(5), "the broker kept the socket after the client closed its side"


# The heartbeat the bound tests negotiate: RabbitMQ closes a closed connection's socket after its
# CLOSING_TIMEOUT (30 s) or the heartbeat interval when shorter, whichever side closed.
CLOSING_HEARTBEAT_S = 5


def test_a_client_that_never_closes_after_close_ok_is_closed_after_the_heartbeat_interval(raw):
    c = raw().open(heartbeat=CLOSING_HEARTBEAT_S)
    client_close(c)
    assert not c.wait_closed(CLOSING_HEARTBEAT_S - 1), "closed before the closing timeout"
    assert c.wait_closed(5), "the socket outlived the closing timeout"


def test_a_client_that_never_answers_the_brokers_close_is_closed_after_the_heartbeat_interval(
        raw):
    c = raw().open(heartbeat=CLOSING_HEARTBEAT_S)
    c.open_channel(1)
    c.send(amqp_raw.method_frame(1, amqp_raw.CHANNEL_OPEN, amqp_raw.channel_open_args()))
    f = c.read_frame()
    assert f.method == amqp_raw.CONNECTION_CLOSE and f.close_reason()[0] == 504, f
    # No close-ok: RabbitMQ waits for it as long as it keeps a client-closed socket.
    assert not c.wait_closed(CLOSING_HEARTBEAT_S - 1), "closed before the closing timeout"
    assert c.wait_closed(5), "the socket outlived the closing timeout"
