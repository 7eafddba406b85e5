"""Connection negotiation: protocol header, start/start-ok, tune, open, close."""

import struct

import pika
import pytest
from pika.exceptions import (AuthenticationError, ConnectionClosedByBroker,
                             ProbableAccessDeniedError, ProbableAuthenticationError)

import amqp_raw as amqp

HANDSHAKE_ERROR_CLOSE_S = 8.0  # RabbitMQ waits 3 s before dropping a failed handshake


@pytest.mark.parametrize("header", [
    b"AMQP\x01\x01\x00\x0a",  # AMQP 0-10
    b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
    b"AMQP\x00\x00\x09\x02",  # a 0-9-x revision that does not exist
    b"HTTP/1.1",
    b"GET / HTTP/1.1\r\n\r\n",
], ids=["amqp0-10", "amqp1-0", "amqp0-9-2", "http-8-bytes", "http-request"])
def test_unsupported_protocol_header_is_answered_with_0_9_1_header_and_close(broker, raw, header):
    c = raw()
    c.send(header)
    assert c.read_bytes(8) == amqp.PROTOCOL_HEADER
    assert c.wait_closed(5)


def test_connection_start_offers_0_9_capabilities_plain_and_amqplain(broker, raw):
    c = raw()
    c.send(amqp.PROTOCOL_HEADER)
    start = c.expect_method(amqp.CONNECTION_START)
    assert start.channel == 0
    r = start.args()
    assert (r.octet(), r.octet()) == (0, 9)
    props = r.table()
    mechanisms = r.longstr().decode().split()
    locales = r.longstr().decode().split()
    assert {"PLAIN", "AMQPLAIN"} <= set(mechanisms)
    assert "en_US" in locales
    caps = props["capabilities"]
    for cap in ["publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                "consumer_cancel_notify", "connection.blocked", "authentication_failure_close",
                "per_consumer_qos", "consumer_priorities", "direct_reply_to"]:
        assert caps.get(cap) is True, f"capability {cap} missing: {caps}"
    for key in ["product", "version", "platform", "copyright", "information"]:
        assert isinstance(props.get(key), str), key


def test_plain_login_opens_connection(broker):
    c = broker.connect()
    assert c.is_open
    ch = c.channel()
    assert ch.is_open
    c.close()
    assert c.is_closed


def test_amqplain_login_opens_connection(broker, raw):
    c = raw()
    reply = c.handshake(mechanism=b"AMQPLAIN", response=amqp.amqplain_response("guest", "guest"))
    assert reply.method == amqp.CONNECTION_OPEN_OK
    c.open_channel(1)


@pytest.mark.parametrize("mechanism,response", [
    (b"PLAIN", b"\x00guest\x00wrong"),
    (b"PLAIN", b"\x00no-such-user\x00guest"),
    (b"AMQPLAIN", amqp.amqplain_response("guest", "wrong")),
], ids=["plain-bad-password", "plain-unknown-user", "amqplain-bad-password"])
def test_bad_login_is_closed_with_403_access_refused(broker, raw, mechanism, response):
    c = raw()
    reply = c.handshake(mechanism=mechanism, response=response)
    assert reply.method == amqp.CONNECTION_CLOSE
    code, text, class_id, method_id = reply.close_reason()
    assert code == 403
    assert text == ("ACCESS_REFUSED - Login was refused using authentication mechanism "
                    f"{mechanism.decode()}. For details see the broker logfile.")
    assert (class_id, method_id) == (0, 0)


def test_bad_password_with_pika_raises_authentication_error(broker):
    params = broker.params(credentials=pika.PlainCredentials("guest", "wrong"))
    with pytest.raises((AuthenticationError, ProbableAuthenticationError)) as excinfo:
        pika.BlockingConnection(params)
    assert "ACCESS_REFUSED" in str(excinfo.value)


@pytest.mark.parametrize("mechanism,response", [
    (b"NOSUCHMECH", b"\x00guest\x00guest"),
    (b"PLAIN", b"not-a-plain-response"),
], ids=["unknown-mechanism", "malformed-plain-response"])
def test_failed_handshake_is_dropped_without_tune(broker, raw, mechanism, response):
    c = raw()
    c.send(amqp.PROTOCOL_HEADER)
    c.expect_method(amqp.CONNECTION_START)
    c.send(amqp.method_frame(0, amqp.CONNECTION_START_OK, amqp.start_ok_args(mechanism, response)))
    try:
        f = c.read_frame(timeout=HANDSHAKE_ERROR_CLOSE_S)
        assert f.method == amqp.CONNECTION_CLOSE, f"expected no tune, got {f}"
    except amqp.Closed:
        pass
    assert c.wait_closed(HANDSHAKE_ERROR_CLOSE_S)


def test_tune_proposes_rabbitmq_defaults(broker, raw):
    c = raw()
    c.open()
    assert c.tune == (2047, 131072, 60)


def test_smaller_frame_max_and_channel_max_from_client_are_accepted(broker, raw):
    c = raw()
    c.open(channel_max=10, frame_max=4096)
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    c.expect_method(amqp.QUEUE_DECLARE_OK)


def test_pika_negotiates_the_smaller_frame_max_and_channel_max(broker):
    c = broker.connect(frame_max=8192, channel_max=16, heartbeat=7)
    try:
        assert c._impl.params.frame_max == 8192
        assert c._impl.params.channel_max == 16
        assert c._impl.params.heartbeat == 7
    finally:
        c.close()


@pytest.mark.parametrize("channel_max,frame_max", [
    (2047, 1024),        # below the 4096 minimum
    (2047, 0),           # "no limit" exceeds the broker's limit
    (2047, 10_000_000),  # above the broker's frame_max
    (5000, 131072),      # above the broker's channel_max
    (0, 131072),         # "no limit" exceeds the broker's limit
], ids=["frame-max-below-min", "frame-max-zero", "frame-max-too-big", "channel-max-too-big",
        "channel-max-zero"])
def test_tune_ok_outside_limits_drops_the_connection(broker, raw, channel_max, frame_max):
    c = raw()
    assert c.handshake(channel_max=channel_max, frame_max=frame_max, send_open=False) is None
    try:
        f = c.read_frame(timeout=HANDSHAKE_ERROR_CLOSE_S)
        assert f.method == amqp.CONNECTION_CLOSE, f"expected the connection dropped, got {f}"
    except amqp.Closed:
        pass
    assert c.wait_closed(HANDSHAKE_ERROR_CLOSE_S)


def test_open_of_missing_vhost_is_closed_with_530_not_allowed(broker, raw):
    c = raw()
    reply = c.handshake(vhost="no-such-vhost")
    assert reply.method == amqp.CONNECTION_CLOSE
    assert reply.close_reason() == (530, "NOT_ALLOWED - vhost no-such-vhost not found", 10, 40)


def test_open_of_missing_vhost_with_pika_raises_access_denied(broker):
    params = broker.params(virtual_host="no-such-vhost")
    with pytest.raises((ProbableAccessDeniedError, ConnectionClosedByBroker)) as excinfo:
        pika.BlockingConnection(params)
    assert "NOT_ALLOWED" in str(excinfo.value)


def test_open_of_vhost_without_permission_is_closed_with_530_not_allowed(broker, raw):
    broker.provision("interop-noperm", "secret", "interop-noperm-vhost", perms=None)
    c = raw()
    reply = c.handshake(response=b"\x00interop-noperm\x00secret", vhost="interop-noperm-vhost")
    assert reply.method == amqp.CONNECTION_CLOSE
    assert reply.close_reason() == (
        530, "NOT_ALLOWED - access to vhost 'interop-noperm-vhost' refused for user 'interop-noperm'",
        10, 40)


def test_provisioned_user_can_use_its_vhost(broker):
    broker.provision("interop-user", "pw", "interop-vhost")
    c = pika.BlockingConnection(broker.params(
        credentials=pika.PlainCredentials("interop-user", "pw"), virtual_host="interop-vhost"))
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"in-vhost")
    assert ch.queue_declare(q, passive=True).method.message_count in (0, 1)
    c.close()


def test_opening_more_channels_than_channel_max_is_closed_with_530(broker, raw):
    c = raw()
    c.open(channel_max=2)
    c.open_channel(1)
    c.open_channel(2)
    c.send(amqp.method_frame(3, amqp.CHANNEL_OPEN, amqp.channel_open_args()))
    assert c.expect_connection_close() == (
        530, "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)",
        0, 0)
    assert c.wait_closed(5)


def test_channel_max_limits_the_count_of_open_channels_not_their_numbers(broker, raw):
    # RabbitMQ 3.10 enforces channel_max as a count: channel 65535 opens under channel_max 2047.
    c = raw()
    c.open()
    c.send(amqp.method_frame(65535, amqp.CHANNEL_OPEN, amqp.channel_open_args()))
    f = c.expect_method(amqp.CHANNEL_OPEN_OK)
    assert f.channel == 65535


def test_client_close_is_answered_with_close_ok(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(0, amqp.CONNECTION_CLOSE,
                             struct.pack(">H", 200) + amqp.shortstr("bye") + struct.pack(">HH", 0, 0)))
    f = c.read_frame()
    assert f.method == amqp.CONNECTION_CLOSE_OK and f.channel == 0


def test_connection_close_releases_exclusive_queues(broker, name):
    c1 = broker.connect()
    c1.channel().queue_declare(name, exclusive=True)
    c1.close()
    c2 = broker.connect()
    ch = c2.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(name, passive=True)
    assert excinfo.value.reply_code == 404
    c2.close()


def test_bad_login_without_authentication_failure_close_capability_is_dropped_silently(broker, raw):
    c = raw()
    c.send(amqp.PROTOCOL_HEADER)
    c.expect_method(amqp.CONNECTION_START)
    c.send(amqp.method_frame(0, amqp.CONNECTION_START_OK, amqp.start_ok_args(
        b"PLAIN", b"\x00guest\x00wrong", client_properties={"product": "old-client"})))
    try:
        f = c.read_frame(timeout=HANDSHAKE_ERROR_CLOSE_S)
        raise AssertionError(f"expected the socket dropped without a frame, got {f}")
    except amqp.Closed:
        pass
