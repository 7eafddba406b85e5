"""Message properties and header tables reach the consumer unchanged, byte for byte."""

import datetime
import decimal
import struct

import pika

import amqp_raw as amqp
from helpers import get

ALL_PROPERTIES = dict(
    content_type="application/json",
    content_encoding="gzip",
    headers={"h": "v"},
    delivery_mode=2,
    priority=7,
    correlation_id="corr-1",
    reply_to="reply.queue",
    expiration="3600000",
    message_id="msg-1",
    timestamp=1_700_000_000,
    type="order.created",
    user_id="guest",
    app_id="interop-tests",
    cluster_id="cluster-a",
)

HEADERS_EVERY_PIKA_TYPE = {
    "str": "text ünïcode",
    "empty-str": "",
    "bytes": b"\x00\x01\xfe\xff",
    "true": True,
    "false": False,
    "int-small": 7,
    "int-negative": -2**31,
    "int-32-max": 2**31 - 1,
    "int-64": 2**40,
    "int-64-min": -2**63,
    "decimal": decimal.Decimal("3.14159"),
    "datetime": datetime.datetime(2024, 2, 29, 12, 30, 45, tzinfo=datetime.timezone.utc),
    "void": None,
    "table": {"nested": {"deeper": [1, "two", {"three": 3}]}, "empty": {}},
    "array": [1, "a", True, None, [2, 3], {"k": "v"}, b"\x01"],
    "empty-array": [],
}


def test_all_fourteen_basic_properties_round_trip(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"props", pika.BasicProperties(**ALL_PROPERTIES))
    _, props, body = get(ch, q)
    assert body == b"props"
    for key, value in ALL_PROPERTIES.items():
        assert getattr(props, key) == value, key


def test_absent_properties_stay_absent(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"bare")
    _, props, _ = get(ch, q)
    for key in ALL_PROPERTIES:
        assert getattr(props, key) is None, key


def test_header_table_with_every_pika_field_type_round_trips(conn, ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"h", pika.BasicProperties(headers=HEADERS_EVERY_PIKA_TYPE))
    _, props, _ = get(ch, q)
    assert props.headers == HEADERS_EVERY_PIKA_TYPE
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(p), auto_ack=True)
    ch.basic_publish("", q, b"h", pika.BasicProperties(headers=HEADERS_EVERY_PIKA_TYPE))
    deadline = 50
    while not got and deadline:
        conn.process_data_events(time_limit=0.1)
        deadline -= 1
    assert got[0].headers == HEADERS_EVERY_PIKA_TYPE


def _raw_field_table():
    """Every AMQP 0-9-1 field type RabbitMQ understands, encoded by hand."""
    f = b""
    f += amqp.shortstr("bool") + b"t\x01"
    f += amqp.shortstr("int8") + b"b" + struct.pack(">b", -5)
    f += amqp.shortstr("uint8") + b"B" + struct.pack(">B", 250)
    f += amqp.shortstr("int16") + b"s" + struct.pack(">h", -300)
    f += amqp.shortstr("uint16") + b"u" + struct.pack(">H", 65000)
    f += amqp.shortstr("int32") + b"I" + struct.pack(">i", -70000)
    f += amqp.shortstr("uint32") + b"i" + struct.pack(">I", 4_000_000_000)
    f += amqp.shortstr("int64") + b"l" + struct.pack(">q", -2**50)
    f += amqp.shortstr("float") + b"f" + struct.pack(">f", 1.5)
    f += amqp.shortstr("double") + b"d" + struct.pack(">d", -2.25)
    f += amqp.shortstr("decimal") + b"D" + struct.pack(">Bi", 2, 31415)
    f += amqp.shortstr("longstr") + b"S" + amqp.longstr(b"long \x00 string")
    f += amqp.shortstr("bytes") + b"x" + amqp.longstr(b"\xff\x00\xfe")
    f += amqp.shortstr("timestamp") + b"T" + struct.pack(">Q", 1_700_000_000)
    f += amqp.shortstr("void") + b"V"
    inner = amqp.shortstr("k") + b"S" + amqp.longstr(b"v")
    f += amqp.shortstr("table") + b"F" + struct.pack(">I", len(inner)) + inner
    arr = b"I" + struct.pack(">i", 1) + b"S" + amqp.longstr(b"x") + b"V"
    f += amqp.shortstr("array") + b"A" + struct.pack(">I", len(arr)) + arr
    return struct.pack(">I", len(f)) + f


def _raw_properties():
    """All 14 properties, flags 0xFFFC, encoded by hand in the spec's order."""
    props = (amqp.shortstr("text/plain") + amqp.shortstr("utf-8") + _raw_field_table()
             + b"\x01" + b"\x05" + amqp.shortstr("corr") + amqp.shortstr("reply")
             + amqp.shortstr("60000") + amqp.shortstr("id") + struct.pack(">Q", 1234567890)
             + amqp.shortstr("type") + amqp.shortstr("guest") + amqp.shortstr("app")
             + amqp.shortstr("cluster"))
    return 0xFFFC, props


def test_content_header_is_delivered_byte_for_byte(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    q = c.expect_method(amqp.QUEUE_DECLARE_OK).args().shortstr()
    flags, props = _raw_properties()
    body = b"exact"
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", q))
           + amqp.header_frame(1, len(body), flags=flags, props=props)
           + amqp.body_frame(1, body))
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(q, "t", no_ack=True)))
    c.expect_method(amqp.BASIC_CONSUME_OK)
    c.expect_method(amqp.BASIC_DELIVER)
    header = c.read_frame()
    assert header.type == amqp.FRAME_HEADER
    assert header.payload == struct.pack(">HHQH", 60, 0, len(body), flags) + props
    delivered = c.read_frame()
    assert (delivered.type, delivered.payload) == (amqp.FRAME_BODY, body)


def test_body_split_into_many_small_frames_is_reassembled(broker, raw):
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    q = c.expect_method(amqp.QUEUE_DECLARE_OK).args().shortstr()
    body = bytes(range(256)) * 4
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", q))
           + amqp.header_frame(1, len(body))
           + b"".join(amqp.body_frame(1, body[i:i + 10]) for i in range(0, len(body), 10)))
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(q, "t", no_ack=True)))
    c.expect_method(amqp.BASIC_CONSUME_OK)
    c.expect_method(amqp.BASIC_DELIVER)
    assert c.read_frame().type == amqp.FRAME_HEADER
    got = b""
    while len(got) < len(body):
        f = c.read_frame()
        assert f.type == amqp.FRAME_BODY
        got += f.payload
    assert got == body


def test_deliveries_are_split_into_frames_within_the_negotiated_frame_max(broker, raw):
    frame_max = 4096
    c = raw()
    c.open(frame_max=frame_max)
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    q = c.expect_method(amqp.QUEUE_DECLARE_OK).args().shortstr()
    body = bytes(i % 253 for i in range(10_000))
    chunk = frame_max - 8
    c.send(amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", q))
           + amqp.header_frame(1, len(body))
           + b"".join(amqp.body_frame(1, body[i:i + chunk]) for i in range(0, len(body), chunk)))
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(q, "t", no_ack=True)))
    c.expect_method(amqp.BASIC_CONSUME_OK)
    c.expect_method(amqp.BASIC_DELIVER)
    header = c.read_frame()
    assert header.type == amqp.FRAME_HEADER
    assert struct.unpack(">Q", header.payload[4:12])[0] == len(body)
    got, sizes = b"", []
    while len(got) < len(body):
        f = c.read_frame()
        assert f.type == amqp.FRAME_BODY and f.channel == 1
        sizes.append(len(f.payload))
        got += f.payload
    assert got == body
    assert max(sizes) <= frame_max - 8, sizes
