"""Publisher confirms and transactions."""

import struct

import pika
import pytest

import amqp_raw as amqp
from helpers import expect_channel_error, get, message_count, wait_message_count

CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
TX_SELECT = (90, 10)
TX_SELECT_OK = (90, 11)
TX_COMMIT = (90, 20)
TX_COMMIT_OK = (90, 21)
TX_ROLLBACK = (90, 30)
TX_ROLLBACK_OK = (90, 31)


def raw_channel(raw):
    c = raw()
    c.open()
    c.open_channel(1)
    return c


def raw_publish(c, exchange, key, body=b"x", mandatory=False):
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args(exchange, key, mandatory))
           + amqp.header_frame(1, len(body)) + amqp.body_frame(1, body))


def raw_queue(c):
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    return c.expect_method(amqp.QUEUE_DECLARE_OK).args().shortstr()


def read_acks(c, last_tag):
    """Reads basic.ack / basic.nack frames until last_tag is covered; returns every tag seen."""
    acked, nacked = set(), set()
    while max(acked | nacked | {0}) < last_tag:
        f = c.read_frame()
        r = f.args()
        tag, multiple = struct.unpack(">QB", r.take(9))
        low = (max(acked | nacked | {0}) + 1) if multiple & 1 else tag
        target = acked if f.method == BASIC_ACK else nacked
        assert f.method in (BASIC_ACK, BASIC_NACK), f
        target.update(range(low, tag + 1))
    return acked, nacked


def test_confirm_select_acks_every_publish_in_sequence(broker, raw):
    c = raw_channel(raw)
    q = raw_queue(c)
    c.send(amqp.method_frame(1, CONFIRM_SELECT, b"\x00"))
    c.expect_method(CONFIRM_SELECT_OK)
    for i in range(50):
        raw_publish(c, "", q, str(i).encode())
    acked, nacked = read_acks(c, 50)
    assert acked == set(range(1, 51)) and not nacked


def test_confirms_for_unroutable_messages_are_acks(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, CONFIRM_SELECT, b"\x00"))
    c.expect_method(CONFIRM_SELECT_OK)
    raw_publish(c, "amq.direct", "nowhere")
    acked, nacked = read_acks(c, 1)
    assert acked == {1}


def test_mandatory_unroutable_is_returned_before_its_ack(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, CONFIRM_SELECT, b"\x00"))
    c.expect_method(CONFIRM_SELECT_OK)
    raw_publish(c, "amq.direct", "nowhere", mandatory=True)
    ret = c.read_frame()
    assert ret.method == (60, 50)
    r = ret.args()
    assert (r.short(), r.shortstr()) == (312, "NO_ROUTE")
    assert c.read_frame().type == amqp.FRAME_HEADER
    assert c.read_frame().type == amqp.FRAME_BODY
    assert c.read_frame().method == BASIC_ACK


def test_confirm_select_nowait_sends_no_reply(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, CONFIRM_SELECT, b"\x01"))
    raw_publish(c, "amq.direct", "nowhere")
    f = c.read_frame()
    assert f.method == BASIC_ACK


def test_pika_confirm_delivery_publishes_are_acked(ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", q, str(i).encode())
    assert message_count(ch, q) == 10


def test_confirm_nack_for_reject_publish_overflow(conn, name):
    ch = conn.channel()
    ch.queue_declare(name, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", name, b"x")
    ch.queue_delete(name)


def test_tx_select_on_confirm_channel_is_406(ch):
    ch.confirm_delivery()
    expect_channel_error(406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
                         ch.tx_select)


def test_confirm_select_on_tx_channel_is_406(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, TX_SELECT))
    c.expect_method(TX_SELECT_OK)
    c.send(amqp.method_frame(1, CONFIRM_SELECT, b"\x00"))
    assert c.expect_channel_close() == (
        406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode", 85, 10)


def test_tx_commit_publishes_only_on_commit(conn, name):
    ch = conn.channel()
    ch.queue_declare(name)
    ch.tx_select()
    ch.basic_publish("", name, b"1")
    ch.basic_publish("", name, b"2")
    assert message_count(conn.channel(), name) == 0
    ch.tx_commit()
    wait_message_count(ch, name, 2)
    ch.basic_publish("", name, b"3")
    ch.tx_rollback()
    assert message_count(ch, name) == 2
    ch.queue_delete(name)


def test_tx_rollback_discards_publishes(ch, name):
    ch.queue_declare(name)
    ch.tx_select()
    ch.basic_publish("", name, b"gone")
    ch.tx_rollback()
    ch.tx_commit()
    assert message_count(ch, name) == 0
    ch.queue_delete(name)


def test_tx_acks_take_effect_on_commit(conn, name):
    ch = conn.channel()
    ch.queue_declare(name)
    for i in range(2):
        ch.basic_publish("", name, str(i).encode())
    wait_message_count(ch, name, 2)
    ch.tx_select()
    m, _, _ = get(ch, name, auto_ack=False)
    ch.basic_ack(m.delivery_tag)
    ch.tx_rollback()  # the ack is discarded, the message stays unacked
    ch.tx_commit()
    other = conn.channel()
    assert message_count(other, name) == 1
    ch.basic_ack(m.delivery_tag)
    ch.tx_commit()
    ch.close()
    assert message_count(other, name) == 1
    other.queue_delete(name)


def test_tx_commit_without_select_is_406(ch):
    expect_channel_error(406, "PRECONDITION_FAILED - channel is not transactional", ch.tx_commit)


def test_tx_rollback_without_select_is_406(ch):
    expect_channel_error(406, "PRECONDITION_FAILED - channel is not transactional", ch.tx_rollback)


def test_tx_select_twice_is_ok(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, TX_SELECT))
    c.expect_method(TX_SELECT_OK)
    c.send(amqp.method_frame(1, TX_SELECT))
    c.expect_method(TX_SELECT_OK)


def test_confirm_select_twice_is_ok(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, CONFIRM_SELECT, b"\x00"))
    c.expect_method(CONFIRM_SELECT_OK)
    c.send(amqp.method_frame(1, CONFIRM_SELECT, b"\x00"))
    c.expect_method(CONFIRM_SELECT_OK)


def test_tx_mandatory_unroutable_is_returned_at_commit(conn, ch, name):
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(m.reply_code))
    ch.tx_select()
    ch.basic_publish("amq.direct", name, b"x", mandatory=True)
    conn.process_data_events(time_limit=0.2)
    assert returned == []
    ch.tx_commit()
    conn.process_data_events(time_limit=0.2)
    assert returned == [312]
