"""Malformed and out-of-order input on a raw socket gets RabbitMQ's connection error, and the
broker keeps serving everyone else."""

import socket
import struct

import pytest

import amqp_raw as amqp
from helpers import get

PUBLISH = amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", "interop-nowhere"))
DECLARE = amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True))


def raw_channel(raw):
    c = raw()
    c.open()
    c.open_channel(1)
    return c


def assert_broker_still_serves(broker):
    c = broker.connect()
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"alive")
    assert ch.basic_get(q, auto_ack=True)[2] in (b"alive", None)
    c.close()


# (id, bytes sent after channel 1 is open, reply code, reply text prefix, class, method)
CONNECTION_ERRORS = [
    ("wrong-frame-end", DECLARE[:-1] + b"\x00",
     501, "FRAME_ERROR - type 1, all octets = <<0,50,0,10,", 0, 0),
    ("body-frame-beyond-frame-max", amqp.frame(amqp.FRAME_BODY, 1, b"x" * 200000),
     501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,200000,131064}", 0, 0),
    ("method-frame-beyond-frame-max",
     amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", arguments={"a": "x" * 140000})),
     501, "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,140019,131064}", 0, 0),
    ("unknown-frame-type", amqp.frame(9, 1, b"abc"),
     501, 'FRAME_ERROR - type 9, all octets = <<"abc">>: unknown_frame', 0, 0),
    ("heartbeat-with-payload", amqp.frame(amqp.FRAME_HEARTBEAT, 0, b"xx"),
     501, 'FRAME_ERROR - type 8, all octets = <<"xx">>: unknown_frame', 0, 0),
    ("heartbeat-on-a-channel", amqp.frame(amqp.FRAME_HEARTBEAT, 1, b""),
     505, "UNEXPECTED_FRAME - type 8, all octets = <<>>", 0, 0),
    ("queue-declare-on-channel-0",
     amqp.method_frame(0, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)),
     504, "CHANNEL_ERROR - unexpected method in connection state running", 50, 10),
    ("tune-ok-after-open", amqp.method_frame(0, amqp.CONNECTION_TUNE_OK, amqp.tune_ok_args(10, 4096, 0)),
     504, "CHANNEL_ERROR - unexpected method in connection state running", 10, 31),
    ("connection-open-on-a-channel", amqp.method_frame(1, amqp.CONNECTION_OPEN, amqp.open_args("/")),
     503, "COMMAND_INVALID - unimplemented method", 10, 40),
    ("unsolicited-channel-close-ok", amqp.method_frame(1, amqp.CHANNEL_CLOSE_OK),
     503, "COMMAND_INVALID - unimplemented method", 20, 41),
    ("method-on-unopened-channel",
     amqp.method_frame(2, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)),
     504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10),
    ("content-header-without-method", amqp.header_frame(1, 5),
     505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    ("content-header-on-channel-0", amqp.header_frame(0, 1),
     505, "UNEXPECTED_FRAME - type 2, all octets = <<0,60,0,0,0,0,0,0,0,0,0,1,0,0>>", 0, 0),
    ("body-without-header", amqp.body_frame(1, b"hello"),
     505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    ("body-right-after-publish", PUBLISH + amqp.body_frame(1, b"hello"),
     505, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame "
          "instead", 60, 40),
    ("content-header-of-wrong-class", PUBLISH + amqp.header_frame(1, 1, class_id=50) + amqp.body_frame(1, b"x"),
     505, "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead", 60, 40),
    ("method-in-the-middle-of-content", PUBLISH + amqp.header_frame(1, 5) + DECLARE,
     505, "UNEXPECTED_FRAME - expected content body, got non content body frame instead", 60, 40),
    ("body-longer-than-declared", PUBLISH + amqp.header_frame(1, 2) + amqp.body_frame(1, b"hello") + DECLARE,
     505, "UNEXPECTED_FRAME - expected content body, got non content body frame instead", 60, 40),
    ("truncated-field-table",
     amqp.method_frame(1, amqp.QUEUE_DECLARE, struct.pack(">H", 0) + amqp.shortstr("") + b"\x04"
                       + struct.pack(">I", 10) + b"\x01a"),
     501, "FRAME_ERROR - cannot decode <<0,0,0,4,0,0,0,10,1,97>>", 50, 10),
    ("truncated-method-arguments", amqp.method_frame(1, amqp.QUEUE_DECLARE, b"\x00"),
     501, "FRAME_ERROR - cannot decode <<0>>", 50, 10),
    ("shortstr-length-beyond-payload",
     amqp.method_frame(1, amqp.QUEUE_DECLARE, struct.pack(">H", 0) + b"\xff" + b"ab"),
     501, "FRAME_ERROR - cannot decode <<0,0,255,97,98>>", 50, 10),
    ("invalid-utf8-queue-name",
     amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args(b"\xff\xfe", exclusive=True)),
     501, "FRAME_ERROR - Malformed UTF-8 in shortstr", 0, 0),
]


@pytest.mark.parametrize("data,code,text,class_id,method_id",
                         [c[1:] for c in CONNECTION_ERRORS], ids=[c[0] for c in CONNECTION_ERRORS])
def test_bad_input_closes_connection_with_rabbitmq_error(broker, raw, data, code, text, class_id,
                                                         method_id):
    c = raw_channel(raw)
    c.send(data)
    got_code, got_text, got_class, got_method = c.expect_connection_close()
    assert (got_code, got_text[:len(text)], got_class, got_method) == (code, text, class_id, method_id), got_text
    assert c.wait_closed(5)
    assert_broker_still_serves(broker)


# RabbitMQ 3.10 sends no connection.close for these: its reader crashes and the socket is reset.
# A broker may do better by sending the close shown; it must not stay silent and open.
DROPPED = [
    ("unknown-class", amqp.method_frame(1, (99, 10)), (503, 540)),
    ("unknown-method-of-known-class", amqp.method_frame(1, (50, 99)), (503, 540)),
    ("unknown-field-type-in-table",
     amqp.method_frame(1, amqp.QUEUE_DECLARE, struct.pack(">H", 0) + amqp.shortstr("") + b"\x04"
                       + struct.pack(">I", 3) + b"\x01aZ"), (501, 502)),
]


@pytest.mark.parametrize("data,codes", [c[1:] for c in DROPPED], ids=[c[0] for c in DROPPED])
def test_undecodable_method_drops_the_connection(broker, raw, data, codes):
    c = raw_channel(raw)
    c.send(data)
    try:
        f = c.read_frame(timeout=5)
        assert f.method == amqp.CONNECTION_CLOSE, f
        assert f.close_reason()[0] in codes, f.close_reason()
        # As a client does: a broker waits for close-ok (RabbitMQ up to 30 s) before it closes.
        c.send(amqp.method_frame(0, amqp.CONNECTION_CLOSE_OK))
    except amqp.Closed:
        pass  # what RabbitMQ does
    assert c.wait_closed(5)
    assert_broker_still_serves(broker)


def test_long_exchange_name_is_a_channel_error_404(broker, raw):
    c = raw_channel(raw)
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH,
                             struct.pack(">H", 0) + amqp.shortstr("x" * 255) + amqp.shortstr("k") + b"\x00")
           + amqp.header_frame(1, 0))
    code, text, class_id, method_id = c.expect_channel_close()
    assert (code, class_id, method_id) == (404, 60, 40)
    assert text.startswith("NOT_FOUND - no exchange 'xxxx")


def test_garbage_before_protocol_header_gets_the_header_back(broker, raw):
    c = raw()
    c.send(b"\x01\x00\x00\x00\x00\x00\x04\xce" * 4)
    assert c.read_bytes(8) == amqp.PROTOCOL_HEADER
    assert c.wait_closed(5)


@pytest.mark.parametrize("cut", [1, 4, 7, 20])
def test_client_vanishing_mid_frame_does_not_disturb_others(broker, raw, conn, cut):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    c = raw_channel(raw)
    c.send((PUBLISH + amqp.header_frame(1, 100))[:cut] if cut < 20 else
           PUBLISH + amqp.header_frame(1, 100) + amqp.body_frame(1, b"x" * 50)[:20])
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()  # RST mid-frame
    ch.basic_publish("", q, b"still here")
    assert get(ch, q)[2] == b"still here"
    assert_broker_still_serves(broker)


def test_half_sent_protocol_header_then_close_is_harmless(broker, raw):
    c = raw()
    c.send(b"AMQ")
    c.close()
    assert_broker_still_serves(broker)


MESSAGE_BYTES_MAX = 134_217_728  # RabbitMQ 3.10's default max_message_size (128 MiB)


def test_message_larger_than_max_message_size_is_406(broker, raw):
    c = raw_channel(raw)
    size = MESSAGE_BYTES_MAX + 1
    c.send(PUBLISH + amqp.header_frame(1, size))
    chunk = b"x" * (131072 - 8)
    sent = 0
    while sent < size:
        n = min(len(chunk), size - sent)
        c.send(amqp.body_frame(1, chunk[:n]))
        sent += n
    # checked once the whole body is in, not from the header's body-size
    assert c.expect_channel_close(timeout=15) == (
        406, f"PRECONDITION_FAILED - message size {size} is larger than configured max size "
             f"{MESSAGE_BYTES_MAX}", 60, 40)
