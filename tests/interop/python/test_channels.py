"""Channel life cycle: open, close, flow, misuse."""

import struct

import pytest
from pika.exceptions import ChannelWrongStateError

import amqp_raw as amqp
from helpers import expect_channel_error

CHANNEL_FLOW = (20, 20)
CHANNEL_FLOW_OK = (20, 21)


def test_channel_open_and_close(conn):
    ch = conn.channel()
    assert ch.is_open
    ch.close()
    assert ch.is_closed
    ch2 = conn.channel()
    assert ch2.is_open


def test_many_channels_on_one_connection_are_independent(conn, name):
    channels = [conn.channel() for _ in range(20)]
    channels[0].queue_declare(name, auto_delete=False)
    expect_channel_error(404, "NOT_FOUND - no queue", channels[1].queue_declare, "missing-" + name,
                         passive=True)
    assert channels[0].is_open and channels[2].is_open
    channels[2].queue_delete(name)


def test_opening_an_already_open_channel_is_closed_with_504(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.CHANNEL_OPEN, amqp.channel_open_args()))
    assert c.expect_connection_close() == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)
    assert c.wait_closed(5)


def test_method_on_a_channel_that_was_never_opened_closes_connection_with_504(broker, raw):
    c = raw()
    c.open()
    c.send(amqp.method_frame(3, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    code, text, class_id, method_id = c.expect_connection_close()
    assert (code, class_id, method_id) == (504, 50, 10)
    assert text.startswith("CHANNEL_ERROR - expected 'channel.open'"), text


def test_channel_can_be_reopened_after_close_ok(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.CHANNEL_CLOSE,
                             struct.pack(">H", 200) + amqp.shortstr("bye") + struct.pack(">HH", 0, 0)))
    assert c.expect_method(amqp.CHANNEL_CLOSE_OK).channel == 1
    c.open_channel(1)


def test_using_a_closed_pika_channel_raises_wrong_state(conn):
    ch = conn.channel()
    ch.close()
    with pytest.raises(ChannelWrongStateError):
        ch.queue_declare("", exclusive=True)


def test_channel_closed_by_broker_error_leaves_connection_usable(conn, name):
    ch = conn.channel()
    expect_channel_error(404, "NOT_FOUND - no queue '" + name + "' in vhost '/'",
                         ch.queue_declare, name, passive=True)
    assert conn.is_open
    ch2 = conn.channel()
    assert ch2.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_channel_flow_active_true_is_acknowledged(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, CHANNEL_FLOW, b"\x01"))
    f = c.expect_method(CHANNEL_FLOW_OK)
    assert f.args().octet() == 1


def test_channel_flow_active_false_is_not_implemented_540(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, CHANNEL_FLOW, b"\x00"))
    code, text, class_id, method_id = c.expect_connection_close()
    assert (code, class_id, method_id) == (540, 20, 20)
    assert text.startswith("NOT_IMPLEMENTED - active=false"), text


def _close_args(code=200, text=""):
    return struct.pack(">H", code) + amqp.shortstr(text) + struct.pack(">HH", 0, 0)


def test_frames_after_broker_channel_close_are_ignored_until_close_ok(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("interop-missing-q", passive=True)))
    assert c.expect_channel_close() == (404, "NOT_FOUND - no queue 'interop-missing-q' in vhost '/'", 50, 10)
    # until the client's close-ok, methods and content on the channel are discarded silently
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", "x"))
           + amqp.header_frame(1, 1) + amqp.body_frame(1, b"x"))
    with pytest.raises(TimeoutError):
        c.read_frame(timeout=0.5)
    c.send(amqp.method_frame(1, amqp.CHANNEL_CLOSE_OK))
    c.open_channel(1)


def test_method_on_a_channel_the_client_closed_is_504(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.CHANNEL_CLOSE, _close_args()))
    c.expect_method(amqp.CHANNEL_CLOSE_OK)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    assert c.expect_connection_close() == (504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)


def test_closing_a_never_opened_channel_is_504(broker, raw):
    c = raw()
    c.open()
    c.send(amqp.method_frame(5, amqp.CHANNEL_CLOSE, _close_args()))
    assert c.expect_connection_close() == (504, "CHANNEL_ERROR - expected 'channel.open'", 20, 40)
