"""A tiny AMQP 0-9-1 frame codec over a raw socket.

Why: pika refuses to send most malformed or out-of-order input, and cannot speak AMQPLAIN or
basic.recover-async. These tests need byte-level control of what goes on the wire, so this module
builds frames by hand and reads the broker's answer with a bounded wait (never a hang).
"""

import socket
import struct
import time

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

READ_TIMEOUT_S = 5.0
FRAME_PAYLOAD_BYTES_MAX = 16 * 1024 * 1024

# (class_id, method_id) of the methods the tests build or look for.
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_SECURE = (10, 20)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE = (40, 10)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_CANCEL = (60, 30)
BASIC_PUBLISH = (60, 40)
BASIC_DELIVER = (60, 60)
BASIC_RECOVER_ASYNC = (60, 100)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)


# ---------------------------------------------------------------- encoding


def shortstr(value):
    if isinstance(value, str):
        value = value.encode()
    assert len(value) <= 255
    return struct.pack(">B", len(value)) + value


def longstr(value):
    if isinstance(value, str):
        value = value.encode()
    return struct.pack(">I", len(value)) + value


def field_value(value):
    """Encodes a Python value with the type tags RabbitMQ itself uses."""
    if isinstance(value, bool):
        return b"t" + struct.pack(">B", int(value))
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return b"I" + struct.pack(">i", value)
        return b"l" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, (str, bytes)):
        return b"S" + longstr(value)
    if isinstance(value, dict):
        return b"F" + table(value)
    if isinstance(value, list):
        items = b"".join(field_value(v) for v in value)
        return b"A" + struct.pack(">I", len(items)) + items
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {value!r}")


def table_fields(values):
    return b"".join(shortstr(k) + field_value(v) for k, v in values.items())


def table(values):
    fields = table_fields(values)
    return struct.pack(">I", len(fields)) + fields


def frame(frame_type, channel, payload, end=FRAME_END):
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def method_frame(channel, method, args=b""):
    return frame(FRAME_METHOD, channel, struct.pack(">HH", *method) + args)


def header_frame(channel, body_size, class_id=60, flags=0, props=b""):
    return frame(FRAME_HEADER, channel, struct.pack(">HHQH", class_id, 0, body_size, flags) + props)


def body_frame(channel, body):
    return frame(FRAME_BODY, channel, body)


def heartbeat_frame():
    return frame(FRAME_HEARTBEAT, 0, b"")


def start_ok_args(mechanism=b"PLAIN", response=b"\x00guest\x00guest", client_properties=None):
    props = client_properties if client_properties is not None else DEFAULT_CLIENT_PROPERTIES
    return table(props) + shortstr(mechanism) + longstr(response) + shortstr(b"en_US")


# Like pika: without authentication_failure_close a broker may drop a failed login silently.
DEFAULT_CLIENT_PROPERTIES = {
    "product": "warren-interop",
    "capabilities": {"authentication_failure_close": True, "basic.nack": True,
                     "connection.blocked": True, "consumer_cancel_notify": True,
                     "publisher_confirms": True},
}


def amqplain_response(login, password):
    """AMQPLAIN's response is a field table without its length prefix."""
    return table_fields({"LOGIN": login, "PASSWORD": password})


def tune_ok_args(channel_max, frame_max, heartbeat):
    return struct.pack(">HIH", channel_max, frame_max, heartbeat)


def open_args(vhost="/"):
    return shortstr(vhost) + shortstr(b"") + b"\x00"


def channel_open_args():
    return shortstr(b"")


def queue_declare_args(name, passive=False, durable=False, exclusive=False, auto_delete=False,
                       arguments=None):
    bits = passive | durable << 1 | exclusive << 2 | auto_delete << 3
    return struct.pack(">H", 0) + shortstr(name) + bytes([bits]) + table(arguments or {})


def basic_publish_args(exchange, routing_key, mandatory=False, immediate=False):
    return (struct.pack(">H", 0) + shortstr(exchange) + shortstr(routing_key)
            + bytes([mandatory | immediate << 1]))


def basic_consume_args(queue, tag="", no_ack=False, exclusive=False, arguments=None):
    bits = no_ack << 1 | exclusive << 2
    return struct.pack(">H", 0) + shortstr(queue) + shortstr(tag) + bytes([bits]) + table(arguments or {})


def basic_qos_args(prefetch_count, global_=False):
    return struct.pack(">IHB", 0, prefetch_count, int(global_))


# ---------------------------------------------------------------- decoding


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        assert self.pos + n <= len(self.data), "truncated AMQP payload"
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def octet(self):
        return self.unpack(">B")[0]

    def short(self):
        return self.unpack(">H")[0]

    def long(self):
        return self.unpack(">I")[0]

    def shortstr(self):
        return self.take(self.octet()).decode()

    def longstr(self):
        return self.take(self.long())

    def table(self):
        end_reader = Reader(self.longstr())
        out = {}
        while end_reader.pos < len(end_reader.data):
            key = end_reader.shortstr()
            out[key] = end_reader.value()
        return out

    def value(self):
        tag = self.take(1)
        simple = {b"b": ">b", b"B": ">B", b"s": ">h", b"u": ">H", b"I": ">i", b"i": ">I",
                  b"l": ">q", b"L": ">Q", b"f": ">f", b"d": ">d", b"T": ">Q"}
        if tag in simple:
            return self.unpack(simple[tag])[0]
        if tag == b"t":
            return bool(self.octet())
        if tag == b"S":
            return self.longstr().decode(errors="replace")
        if tag == b"x":
            return self.longstr()
        if tag == b"F":
            return self.table()
        if tag == b"A":
            sub = Reader(self.longstr())
            items = []
            while sub.pos < len(sub.data):
                items.append(sub.value())
            return items
        if tag == b"D":
            scale, unscaled = self.unpack(">Bi")
            return (scale, unscaled)
        if tag == b"V":
            return None
        raise ValueError(f"unknown field type {tag!r}")


class Frame:
    def __init__(self, frame_type, channel, payload):
        self.type = frame_type
        self.channel = channel
        self.payload = payload

    @property
    def method(self):
        if self.type != FRAME_METHOD:
            return None
        return struct.unpack(">HH", self.payload[:4])

    def args(self):
        return Reader(self.payload[4:])

    def close_reason(self):
        """(reply_code, reply_text, class_id, method_id) of a connection.close / channel.close."""
        assert self.method in (CONNECTION_CLOSE, CHANNEL_CLOSE), self
        r = self.args()
        return r.short(), r.shortstr(), r.short(), r.short()

    def __repr__(self):
        return f"Frame(type={self.type}, channel={self.channel}, method={self.method}, len={len(self.payload)})"


class Closed(Exception):
    """The broker closed the TCP connection."""


class RawConnection:
    """A socket that speaks AMQP frames, with every read bounded by a deadline."""

    def __init__(self, host, port, timeout=READ_TIMEOUT_S):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.timeout = timeout
        self.buf = b""
        self.server_properties = None
        self.mechanisms = None
        self.tune = None

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from the broker in time")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no frame from the broker in time") from None
        except ConnectionResetError:
            raise Closed("connection reset") from None
        if not chunk:
            raise Closed("connection closed by the broker")
        self.buf += chunk

    def read_bytes(self, n, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_frame(self, timeout=None, skip_heartbeats=True):
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            while len(self.buf) < 7:
                self._fill(deadline)
            frame_type, channel, size = struct.unpack(">BHI", self.buf[:7])
            assert size <= FRAME_PAYLOAD_BYTES_MAX, f"absurd frame size {size}"
            while len(self.buf) < 8 + size:
                self._fill(deadline)
            payload, end = self.buf[7:7 + size], self.buf[7 + size]
            self.buf = self.buf[8 + size:]
            assert end == FRAME_END, f"bad frame end {end:#x} from the broker"
            if frame_type == FRAME_HEARTBEAT and skip_heartbeats:
                continue
            return Frame(frame_type, channel, payload)

    def expect_method(self, method, timeout=None):
        f = self.read_frame(timeout)
        assert f.method == method, f"expected {method}, got {f} {f.payload[:80]!r}"
        return f

    def wait_closed(self, timeout=None):
        """True when the broker closes the socket within the timeout (any bytes are dropped)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        try:
            while True:
                self._fill(deadline)
                self.buf = b""
        except Closed:
            return True
        except TimeoutError:
            return False

    # ------------------------------------------------------------ handshake

    def handshake(self, mechanism=b"PLAIN", response=b"\x00guest\x00guest", vhost="/",
                  channel_max=None, frame_max=None, heartbeat=0, client_properties=None,
                  send_open=True):
        """Runs the handshake; returns the broker's answer to connection.open (or the frame that
        came instead of tune). With send_open=False it stops after tune-ok and returns None."""
        self.send(PROTOCOL_HEADER)
        start = self.expect_method(CONNECTION_START)
        r = start.args()
        r.octet(), r.octet()
        self.server_properties = r.table()
        self.mechanisms = r.longstr().decode().split()
        self.send(method_frame(0, CONNECTION_START_OK,
                               start_ok_args(mechanism, response, client_properties)))
        tune = self.read_frame()
        if tune.method != CONNECTION_TUNE:
            return tune
        r = tune.args()
        server_channel_max, server_frame_max, server_heartbeat = r.short(), r.long(), r.short()
        self.tune = (server_channel_max, server_frame_max, server_heartbeat)
        cm = server_channel_max if channel_max is None else channel_max
        fm = server_frame_max if frame_max is None else frame_max
        self.negotiated = (cm, fm, heartbeat)
        self.send(method_frame(0, CONNECTION_TUNE_OK, tune_ok_args(cm, fm, heartbeat)))
        if not send_open:
            return None
        self.send(method_frame(0, CONNECTION_OPEN, open_args(vhost)))
        return self.read_frame()

    def open(self, **kwargs):
        reply = self.handshake(**kwargs)
        assert reply.method == CONNECTION_OPEN_OK, f"handshake failed: {reply}"
        return self

    def open_channel(self, channel=1):
        self.send(method_frame(channel, CHANNEL_OPEN, channel_open_args()))
        return self.expect_method(CHANNEL_OPEN_OK)

    def expect_connection_close(self, timeout=None):
        """Reads until connection.close, answers close-ok, returns (code, text, class, method)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            f = self.read_frame(timeout=max(0.01, deadline - time.monotonic()))
            if f.method == CONNECTION_CLOSE:
                reason = f.close_reason()
                try:
                    self.send(method_frame(0, CONNECTION_CLOSE_OK))
                except OSError:
                    pass
                return reason

    def expect_channel_close(self, channel=1, timeout=None):
        f = self.read_frame(timeout)
        assert f.method == CHANNEL_CLOSE and f.channel == channel, f"expected channel.close, got {f}"
        return f.close_reason()
