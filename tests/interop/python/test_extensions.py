"""RabbitMQ extensions beyond AMQP 0-9-1, and the parts of the spec RabbitMQ refuses."""

import struct
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

import amqp_raw as amqp
from helpers import expect_channel_error, get, message_count, wait_for, wait_message_count

CONNECTION_UPDATE_SECRET = (10, 70)
CONNECTION_UPDATE_SECRET_OK = (10, 71)


def pump(conn, until, timeout=5.0, what="deliveries"):
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or until(), timeout, what=what)


def raw_channel(raw):
    c = raw()
    c.open()
    c.open_channel(1)
    return c


# ---------------------------------------------------------------- update-secret


def test_update_secret_is_acknowledged_and_connection_stays_usable(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(0, CONNECTION_UPDATE_SECRET, amqp.longstr("guest") + amqp.shortstr("refresh")))
    assert c.expect_method(CONNECTION_UPDATE_SECRET_OK).channel == 0
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    c.expect_method(amqp.QUEUE_DECLARE_OK)


def test_update_secret_with_pika(conn):
    conn.update_secret("guest", "token refresh")
    assert conn.channel().queue_declare("", exclusive=True).method.queue


# ---------------------------------------------------------------- direct reply-to


def test_direct_reply_to_round_trip(broker, conn, name):
    ch = conn.channel()
    replies = []
    ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append((m, p, b)),
                     auto_ack=True)
    ch.queue_declare(name)
    ch.basic_publish("", name, b"request",
                     pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c1"))
    server = broker.connect()
    sch = server.channel()
    _, props, body = get(sch, name)
    assert body == b"request"
    assert props.reply_to.startswith("amq.rabbitmq.reply-to.") and len(props.reply_to) > 30
    sch.basic_publish("", props.reply_to, b"response",
                      pika.BasicProperties(correlation_id=props.correlation_id))
    pump(conn, lambda: replies)
    m, p, b = replies[0]
    assert (b, p.correlation_id, m.routing_key) == (b"response", "c1", props.reply_to)
    server.close()
    ch.queue_delete(name)


def test_direct_reply_to_consumer_must_be_no_ack_406(ch):
    expect_channel_error(406, "PRECONDITION_FAILED - reply consumer cannot acknowledge",
                         ch.basic_consume, "amq.rabbitmq.reply-to", lambda *a: None, auto_ack=False)


def test_publish_with_reply_to_pseudo_queue_without_consumer_is_406(ch, name):
    ch.queue_declare(name)
    ch.basic_publish("", name, b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        ch.queue_declare(name, passive=True)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, "PRECONDITION_FAILED - fast reply consumer does not exist")
    ch.connection.channel().queue_delete(name)


def test_reply_to_pseudo_queue_declares_passively(ch):
    ok = ch.queue_declare("amq.rabbitmq.reply-to", passive=True).method
    # RabbitMQ 3.10 reports the pseudo queue with one consumer even when nobody consumes it
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("amq.rabbitmq.reply-to", 0, 1)


def test_reply_to_a_gone_requester_is_dropped(broker, ch, name):
    requester = broker.connect()
    rch = requester.channel()
    rch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    ch.queue_declare(name)
    rch.basic_publish("", name, b"req", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    reply_to = get(ch, name)[1].reply_to
    requester.close()
    ch.basic_publish("", reply_to, b"lost")
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    ch.queue_delete(name)


# ---------------------------------------------------------------- sender-selected distribution


def test_cc_header_routes_to_extra_keys_and_is_kept(ch, name):
    ch.exchange_declare(name, "direct")
    qs = {}
    for key in ["main", "cc1", "cc2"]:
        qs[key] = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(qs[key], name, routing_key=key)
    ch.basic_publish(name, "main", b"m", pika.BasicProperties(headers={"CC": ["cc1", "cc2"]}))
    for key in ["main", "cc1", "cc2"]:
        m, p, b = get(ch, qs[key])
        assert b == b"m" and p.headers == {"CC": ["cc1", "cc2"]}
        assert m.routing_key == "main"
    ch.exchange_delete(name)


def test_bcc_header_routes_to_extra_keys_and_is_removed(ch, name):
    ch.exchange_declare(name, "direct")
    main = ch.queue_declare("", exclusive=True).method.queue
    hidden = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(main, name, routing_key="main")
    ch.queue_bind(hidden, name, routing_key="hidden")
    ch.basic_publish(name, "main", b"m", pika.BasicProperties(headers={"BCC": ["hidden"], "k": "v"}))
    for q in (main, hidden):
        _, p, b = get(ch, q)
        assert b == b"m" and p.headers == {"k": "v"}
    ch.exchange_delete(name)


@pytest.mark.restart
def test_bcc_keys_survive_a_restart_and_route_the_dead_lettered_message(broker, name):
    """A persistent message read back from disk and dead-lettered without a new routing key
    goes to its BCC keys too (RabbitMQ keeps them in the stored message's routing keys)."""
    c = broker.connect()
    ch = c.channel()
    ch.exchange_declare(name, "direct", durable=True)
    ch.exchange_declare(name + ".dlx", "direct", durable=True)
    ch.queue_declare(name, durable=True, arguments={"x-dead-letter-exchange": name + ".dlx"})
    ch.queue_bind(name, name, routing_key="main")
    ch.queue_declare(name + ".dead", durable=True)
    # Only the BCC key leads to the dead-letter queue.
    ch.queue_bind(name + ".dead", name + ".dlx", routing_key="hidden")
    ch.confirm_delivery()
    ch.basic_publish(name, "main", b"m",
                     pika.BasicProperties(delivery_mode=2, headers={"BCC": ["hidden"]}))
    c.close()
    broker.restart()
    c = broker.connect()
    ch = c.channel()
    try:
        m, _, body = get(ch, name, auto_ack=False)
        assert body == b"m"
        ch.basic_reject(m.delivery_tag, requeue=False)
        _, p, body = get(ch, name + ".dead")
        assert body == b"m" and "BCC" not in (p.headers or {})
    finally:
        for q in (name, name + ".dead"):
            ch.queue_delete(q)
        for x in (name, name + ".dlx"):
            ch.exchange_delete(x)
        c.close()


def test_cc_and_bcc_to_the_same_queue_deliver_once(ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.direct", routing_key=name + "a")
    ch.queue_bind(q, "amq.direct", routing_key=name + "b")
    ch.basic_publish("amq.direct", name + "a", b"once",
                     pika.BasicProperties(headers={"CC": [name + "b"], "BCC": [name + "a"]}))
    ch.basic_publish("", q, b"marker")
    assert get(ch, q)[2] == b"once"
    assert get(ch, q)[2] == b"marker"


def test_cc_header_that_is_not_an_array_is_406(ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"m", pika.BasicProperties(headers={"CC": "not-an-array"}))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, passive=True)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, 'PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"CC",longstr}')


# ---------------------------------------------------------------- validated user-id


def test_matching_user_id_is_accepted(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"m", pika.BasicProperties(user_id="guest"))
    assert get(ch, q)[1].user_id == "guest"


def test_mismatched_user_id_is_406(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"m", pika.BasicProperties(user_id="mallory"))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, passive=True)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'")


# ---------------------------------------------------------------- consumer priorities


def test_higher_priority_consumer_gets_messages_while_it_has_capacity(conn, ch, name):
    ch.queue_declare(name)
    ch.basic_qos(prefetch_count=2)
    got = {"low": [], "high": []}
    ch.basic_consume(name, lambda c, m, p, b: got["low"].append(m), auto_ack=False,
                     arguments={"x-priority": 1})
    ch.basic_consume(name, lambda c, m, p, b: got["high"].append(m), auto_ack=False,
                     arguments={"x-priority": 10})
    for i in range(3):
        ch.basic_publish("", name, str(i).encode())
    pump(conn, lambda: len(got["low"]) + len(got["high"]) == 3)
    assert (len(got["high"]), len(got["low"])) == (2, 1)
    ch.queue_delete(name)


def test_consumer_priority_of_wrong_type_is_406(ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    text = expect_channel_error(406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}' "
                                "in vhost '/': ", ch.basic_consume, q, lambda *a: None,
                                arguments={"x-priority": "high"})
    assert text.endswith('"expected integer, got longstr"'), text


def test_negative_consumer_priority_is_accepted_and_ranks_below_default(conn, ch, name):
    ch.queue_declare(name)
    ch.basic_qos(prefetch_count=1)
    got = {"neg": [], "default": []}
    ch.basic_consume(name, lambda c, m, p, b: got["neg"].append(m), auto_ack=False,
                     arguments={"x-priority": -5})
    ch.basic_consume(name, lambda c, m, p, b: got["default"].append(m), auto_ack=False)
    ch.basic_publish("", name, b"1")
    pump(conn, lambda: got["neg"] or got["default"])
    assert (len(got["default"]), len(got["neg"])) == (1, 0)
    ch.queue_delete(name)


# ---------------------------------------------------------------- refused spec features


def test_publish_with_immediate_is_540_not_implemented(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", "q", immediate=True))
           + amqp.header_frame(1, 1) + amqp.body_frame(1, b"x"))
    assert c.expect_connection_close() == (540, "NOT_IMPLEMENTED - immediate=true", 60, 40)
    assert c.wait_closed(5)


def test_recover_async_without_requeue_is_540_not_implemented(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, amqp.BASIC_RECOVER_ASYNC, b"\x00"))
    assert c.expect_connection_close() == (540, "NOT_IMPLEMENTED - requeue=false", 60, 100)


def test_recover_async_with_requeue_redelivers_without_reply(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    q = c.expect_method(amqp.QUEUE_DECLARE_OK).args().shortstr()
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", q))
           + amqp.header_frame(1, 1) + amqp.body_frame(1, b"r"))
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(q, "t")))
    c.expect_method(amqp.BASIC_CONSUME_OK)
    first = c.expect_method(amqp.BASIC_DELIVER).args()
    assert first.shortstr() == "t"
    c.read_frame(), c.read_frame()
    c.send(amqp.method_frame(1, amqp.BASIC_RECOVER_ASYNC, b"\x01"))
    again = c.expect_method(amqp.BASIC_DELIVER).args()
    again.shortstr()
    tag, redelivered = struct.unpack(">QB", again.take(9))
    assert (tag, redelivered) == (2, 1)


# ---------------------------------------------------------------- quorum queues


def test_quorum_queue_declare_is_accepted_when_durable(ch, name):
    ok = ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"}).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    ch.basic_publish("", name, b"q")
    assert get(ch, name)[2] == b"q"
    ch.queue_delete(name)


@pytest.mark.parametrize("kwargs,prop", [
    (dict(durable=False), "non-durable"),
    (dict(durable=True, exclusive=True), "exclusive-owner"),
    (dict(durable=True, auto_delete=True), "auto-delete"),
])
def test_quorum_queue_with_invalid_property_is_406(ch, name, kwargs, prop):
    expect_channel_error(406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' "
                         "in vhost '/'", ch.queue_declare, name,
                         arguments={"x-queue-type": "quorum"}, **kwargs)


def test_quorum_queue_rejects_max_priority_406(ch, name):
    expect_channel_error(406, f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{name}' "
                         "in vhost '/' of queue type rabbit_quorum_queue", ch.queue_declare, name,
                         durable=True, arguments={"x-queue-type": "quorum", "x-max-priority": 5})


def test_redeclare_classic_as_quorum_is_406(conn, name):
    conn.channel().queue_declare(name, durable=True)
    expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue "
                         f"'{name}' in vhost '/'", conn.channel().queue_declare, name,
                         durable=True, arguments={"x-queue-type": "quorum"})
    conn.channel().queue_delete(name)


def test_quorum_queue_redelivery_carries_x_delivery_count(ch, name):
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", name, b"count me")
    m, p, _ = get(ch, name, auto_ack=False)
    assert not m.redelivered
    assert p.headers == {"x-delivery-count": 0}  # RabbitMQ 3.10 adds it from the first delivery
    ch.basic_reject(m.delivery_tag, requeue=True)
    m, p, _ = get(ch, name, auto_ack=False)
    assert m.redelivered and p.headers["x-delivery-count"] == 1
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, p, _ = get(ch, name, auto_ack=False)
    assert p.headers["x-delivery-count"] == 2
    ch.basic_ack(m.delivery_tag)
    ch.queue_delete(name)


def test_quorum_queue_delivery_limit_drops_after_limit(ch, name):
    ch.queue_declare(name, durable=True,
                     arguments={"x-queue-type": "quorum", "x-delivery-limit": 2})
    ch.basic_publish("", name, b"poison")
    for _ in range(3):  # the first delivery plus two redeliveries
        m, _, _ = get(ch, name, auto_ack=False)
        ch.basic_reject(m.delivery_tag, requeue=True)
    time.sleep(0.2)
    assert ch.basic_get(name, auto_ack=True)[0] is None
    ch.queue_delete(name)


def test_quorum_queue_delivery_limit_dead_letters_with_reason(ch, name):
    dlq = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_declare(name, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 1,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", name, b"poison")
    for _ in range(2):
        m, _, _ = get(ch, name, auto_ack=False)
        ch.basic_nack(m.delivery_tag, requeue=True)
    _, props, body = get(ch, dlq)
    assert body == b"poison"
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", name, 1)
    ch.queue_delete(name)
