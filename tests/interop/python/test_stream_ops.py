"""Operating streams (issue 36): streams in the management API, in /metrics, under policies, in
definitions, and rabbitmq-streams' super stream commands in `warren ctl`.

Every expectation shared with RabbitMQ was read off RabbitMQ 3.10.8 first, and the tests run
against it too (`scripts/interop.sh --broker rabbitmq -k test_stream_ops` with the
rabbitmq_stream plugin; its super stream commands through rabbitmq-streams). Where 3.10
differs (a passive declare that answers 0 consumers, retention only when a stream is written, no
offsets in its API), the test says so and checks warren alone. RabbitMQ refreshes its figures every 5 s and applies a
policy asynchronously, so figures are polled."""

import os
import signal
import socket
import struct
import subprocess
import time
import urllib.parse

import pika
import pytest

from conftest import IN_CLUSTER_RUN, Broker, free_port, wait_port
from helpers import expect_connection_error, wait_for
from test_management_api import Api
from test_prometheus import host_base, read_metrics, value

pytestmark = pytest.mark.skipif(
    IN_CLUSTER_RUN, reason="pins a single node's behaviour; streams in a cluster are "
    "test_streams_cluster.py's")

STATS_WAIT_S = 20.0
# Small segments, so that a few hundred bytes of messages span several and retention, which
# removes whole segments, has something to remove.
SMALL_SEGMENTS = {"x-stream-max-segment-size-bytes": 1000}
BODY = b"x" * 100


def q(name):
    return urllib.parse.quote(name, safe="")


@pytest.fixture
def api(broker):
    a = Api(broker)
    try:
        a.get("/api/whoami")
    except OSError as e:
        if broker.is_rabbitmq:
            pytest.skip(f"RabbitMQ's management API does not answer at {a.base}: {e}")
        raise
    return a


@pytest.fixture
def streams(broker):
    """Declares streams for one test (name, arguments) and deletes them after it (on a
    connection of its own: the test may have restarted the broker)."""
    made = []

    def declare(name, **arguments):
        conn = broker.connect()
        conn.channel().queue_declare(name, durable=True,
                                     arguments={"x-queue-type": "stream", **arguments})
        conn.close()
        made.append(name)
        return name

    yield declare
    conn = broker.connect()
    ch = conn.channel()
    for name in made:
        ch.queue_delete(name)
    conn.close()


@pytest.fixture
def policies(api):
    made = []

    def put(name, pattern, definition):
        r = api.put(f"/api/policies/%2F/{q(name)}",
                    {"pattern": pattern, "definition": definition, "apply-to": "queues"})
        assert r.status in (201, 204), r
        made.append(name)

    yield put
    for name in made:
        api.delete(f"/api/policies/%2F/{q(name)}")


def publish(broker, queue, n, exchange="", first=0):
    """n messages numbered from `first` (the number leads the body), each confirmed before the
    next, so each is a chunk of its own."""
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(first, first + n):
        ch.basic_publish(exchange, queue, b"%d " % i + BODY)
    conn.close()


def offsets_from_first(broker, queue, read_s=1.5, numbers=False):
    """The offsets (or the numbers `publish` gave the messages) a consumer from `first` reads
    in read_s. RabbitMQ's offsets have gaps where its log holds other chunks than messages;
    warren's count messages."""
    conn = broker.connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    got = []
    ch.basic_consume(queue, lambda c, m, p, b: got.append(
        int(b.split()[0]) if numbers else p.headers["x-stream-offset"]),
        arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + read_s
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    conn.close()
    return got


def consumer_from_first(broker, queue):
    """A connection holding one consumer of `queue` from `first` that acks nothing; close it
    with close_consumer."""
    conn = broker.connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_consume(queue, lambda *a: None, arguments={"x-stream-offset": "first"})
    return conn


def close_consumer(conn):
    # pika rejects deliveries it has not dispatched when it closes, which a stream answers
    # with 540: dispatch them first.
    conn.process_data_events(time_limit=0.3)
    conn.close()


def test_a_stream_in_the_api_shows_its_messages_consumers_and_members(broker, api, streams,
                                                                        name):
    streams(name, **{"x-max-age": "7D"})
    publish(broker, name, 5)
    conn = consumer_from_first(broker, name)
    try:
        def shown():
            conn.process_data_events(time_limit=0)
            s = api.get(f"/api/queues/%2F/{q(name)}").json
            return s if s.get("messages") == 5 and s.get("consumers") == 1 else None

        s = wait_for(shown, timeout=STATS_WAIT_S, interval=0.5, what="the stream's figures")
        assert s["type"] == "stream"
        assert s["arguments"] == {"x-queue-type": "stream", "x-max-age": "7D"}
        assert s["messages_ready"] == 5 and s["messages_unacknowledged"] == 0
        assert s["durable"] is True and s["state"] == "running"
        assert s["members"] == [s["node"]] and s["online"] == [s["node"]]
        listed = [x for x in api.get("/api/queues/%2F").json if x["name"] == name]
        assert listed and listed[0]["type"] == "stream" and listed[0]["messages"] == 5
        if broker.is_rabbitmq:
            return  # 3.10's API has no offsets or segments
        assert (s["first_offset"], s["committed_offset"]) == (0, 5)
        assert s["segments"] == 1
        assert s["leader"] == s["node"] and s["readers"] == {s["node"]: 1}
    finally:
        close_consumer(conn)


def test_retention_moves_the_first_offset_the_api_shows(broker, api, streams, name):
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ 3.10's API has no first offset or segment count")
    streams(name, **{"x-max-length-bytes": 2000}, **SMALL_SEGMENTS)
    publish(broker, name, 40)

    def retained():
        s = api.get(f"/api/queues/%2F/{q(name)}").json
        return s if s.get("first_offset", 0) > 0 else None

    s = wait_for(retained, timeout=STATS_WAIT_S, interval=0.5, what="retention")
    assert s["committed_offset"] == 40
    assert s["messages"] == 40 - s["first_offset"]
    assert 1 < s["segments"] < 40


def test_a_passive_declare_of_a_stream_answers_its_messages_and_consumers(broker, streams,
                                                                          name):
    streams(name)
    publish(broker, name, 3)
    conn = consumer_from_first(broker, name)
    ch = conn.channel()
    try:
        # RabbitMQ 3.10 counts from its 5-second statistics.
        ok = wait_for(lambda: (lambda m: m if m.message_count == 3 else None)(
            ch.queue_declare(name, passive=True).method), timeout=STATS_WAIT_S, interval=0.5,
            what="the message count")
        # RabbitMQ 3.10 answers 0 consumers for a stream whatever it has; warren counts them.
        assert ok.consumer_count == (0 if broker.is_rabbitmq else 1)
    finally:
        close_consumer(conn)


def test_a_consumer_under_global_qos_is_refused_with_540(broker, streams, name):
    streams(name)
    conn = broker.connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    ch.basic_qos(prefetch_count=10, global_qos=True)
    text = expect_connection_error(540, "NOT_IMPLEMENTED", ch.basic_consume, name,
                                   lambda *a: None)
    assert text == f"NOT_IMPLEMENTED - queue '{name}' in vhost '/' does not support global qos"


def test_per_object_metrics_count_a_streams_messages_and_consumers(broker, streams, name):
    streams(name)
    publish(broker, name, 4)
    conn = broker.connect()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(m.delivery_tag),
                     arguments={"x-stream-offset": "first"})
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(got) == 4,
             what="4 deliveries")
    ch.basic_ack(got[-1], multiple=True)
    base = host_base(broker, name)
    try:
        def settled():
            f = read_metrics(base, "/metrics/per-object")
            figures = {k: value(f, k, vhost="/", queue=name) for k in (
                "rabbitmq_queue_messages", "rabbitmq_queue_messages_ready",
                "rabbitmq_queue_consumers")}
            delivered = value(f, "rabbitmq_global_messages_delivered_consume_manual_ack",
                              protocol="amqp091", queue_type="rabbit_stream_queue")
            return (figures, delivered) if figures == {
                "rabbitmq_queue_messages": 4, "rabbitmq_queue_messages_ready": 4,
                "rabbitmq_queue_consumers": 1} and delivered >= 4 else None

        wait_for(settled, timeout=STATS_WAIT_S, interval=0.5,
                 what=f"{name}'s figures in /metrics/per-object")
    except OSError as e:
        if broker.is_rabbitmq:
            pytest.skip(f"no Prometheus metrics at {base}: {e}")
        raise
    finally:
        close_consumer(conn)


def test_a_policy_max_age_applies_to_an_existing_stream(broker, api, streams, policies, name):
    streams(name, **SMALL_SEGMENTS)
    publish(broker, name, 30)
    assert offsets_from_first(broker, name)[0] == 0
    policies(name, f"^{name}$", {"max-age": "1s"})
    wait_for(lambda: api.get(f"/api/queues/%2F/{q(name)}").json.get("policy") == name,
             timeout=STATS_WAIT_S, interval=0.5, what="the policy to apply")
    assert api.get(f"/api/queues/%2F/{q(name)}").json["effective_policy_definition"] == {
        "max-age": "1s"}
    time.sleep(1.5)
    # RabbitMQ applies retention when the stream is written: the 30 old messages are over a
    # second old by now and go; what comes now stays.
    publish(broker, name, 30, first=30)
    kept = wait_for(lambda: (lambda o: o if o and o[0] > 0 else None)(
        offsets_from_first(broker, name, numbers=True)), timeout=STATS_WAIT_S, interval=0.5,
        what="retention by the policy's max-age")
    # The newest messages, with no gap, down to where a whole segment went.
    assert kept == list(range(kept[0], 60))


def test_a_streams_policy_max_length_bytes_wins_over_its_argument(broker, streams, policies,
                                                                   name):
    """RabbitMQ 3.10 gives a stream's policy precedence over its arguments (policy_precedence),
    where a classic queue takes the lower of the two."""
    streams(name, **{"x-max-length-bytes": 10_000_000}, **SMALL_SEGMENTS)
    policies(name, f"^{name}$", {"max-length-bytes": 1500})
    higher = f"{name}.2"
    streams(higher, **{"x-max-length-bytes": 1500}, **SMALL_SEGMENTS)
    policies(higher, f"^{higher}$", {"max-length-bytes": 10_000_000})
    time.sleep(1)  # RabbitMQ applies a policy asynchronously
    publish(broker, name, 60)
    publish(broker, higher, 60)
    kept = wait_for(lambda: (lambda o: o if o and o[0] > 0 else None)(
        offsets_from_first(broker, name, numbers=True)), timeout=STATS_WAIT_S, interval=0.5,
        what="retention by the policy's max-length-bytes")
    assert kept == list(range(kept[0], 60))
    # The higher policy keeps everything: past the retention tick, and written again (which
    # runs RabbitMQ's retention), all 61 are there, where the argument would have cut them.
    time.sleep(1.5)
    publish(broker, higher, 1, first=60)
    assert offsets_from_first(broker, higher, numbers=True) == list(range(61))


def test_an_idle_stream_is_retained_by_max_age(broker, streams, name):
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ 3.10 applies retention only when a stream is written")
    streams(name, **{"x-max-age": "2s"}, **SMALL_SEGMENTS)
    publish(broker, name, 30)
    before = offsets_from_first(broker, name)
    assert before[0] == 0
    # Nothing more is written: the timer alone removes the segments older than 2 s, all but
    # the newest (a stream always keeps its active segment).
    offsets = wait_for(lambda: (lambda o: o if o and o[0] > 0 else None)(
        offsets_from_first(broker, name)), timeout=STATS_WAIT_S, interval=0.5,
        what="an idle stream's retention")
    assert offsets[-1] == 29 and len(offsets) < 30


def test_a_policy_segment_size_lower_than_the_argument_cuts_smaller_segments(broker, api,
                                                                               streams,
                                                                               policies, name):
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ 3.10's API has no segment count")
    streams(name, **{"x-stream-max-segment-size-bytes": 10_000_000})
    policies(name, f"^{name}$", {"stream-max-segment-size-bytes": 1000})
    publish(broker, name, 30)
    s = api.get(f"/api/queues/%2F/{q(name)}").json
    assert s["segments"] > 1, s


@pytest.mark.timeout(120)  # RabbitMQ's stop_app and start_app take half a minute
def test_a_policys_retention_holds_for_a_stream_after_a_restart(broker, api, streams,
                                                                policies, name):
    """The stream's writer opens after a restart with the retention its policy gives it, not
    only its arguments: the policy caps a stream whose argument keeps 10 MB."""
    streams(name, **{"x-max-length-bytes": 10_000_000}, **SMALL_SEGMENTS)
    policies(name, f"^{name}$", {"max-length-bytes": 1500})
    broker.restart()

    def policy_shown():
        try:  # RabbitMQ's listeners come back one by one after its start_app
            broker.connect().close()
            return api.get(f"/api/queues/%2F/{q(name)}").json.get("policy") == name
        except (OSError, pika.exceptions.AMQPConnectionError):
            return False

    wait_for(policy_shown, timeout=60, interval=0.5, what="the policy after the restart")
    time.sleep(1)  # RabbitMQ applies a policy asynchronously
    publish(broker, name, 60)
    kept = wait_for(lambda: (lambda o: o if o and o[0] > 0 else None)(
        offsets_from_first(broker, name, numbers=True)), timeout=STATS_WAIT_S, interval=0.5,
        what="retention by the policy after the restart")
    assert kept == list(range(kept[0], 60))


def test_a_policy_with_a_bad_stream_setting_is_refused_with_rabbitmqs_text(api):
    r = api.put("/api/policies/%2F/bad-segment",
                {"pattern": "^nothing$", "definition": {"stream-max-segment-size-bytes": "x"}})
    assert r.status == 400 and "is not a valid segment size" in r.json["reason"], r


def test_a_stream_goes_through_definitions_and_comes_back(broker, api, streams, name):
    args = {"x-queue-type": "stream", "x-max-age": "7D", "x-max-length-bytes": 5_000_000,
            "x-stream-max-segment-size-bytes": 100_000}
    streams(name, **{k: v for k, v in args.items() if k != "x-queue-type"})
    exported = [x for x in api.get("/api/definitions").json["queues"] if x["name"] == name]
    assert exported == [{"name": name, "vhost": "/", "durable": True, "auto_delete": False,
                         "arguments": args}]
    conn = broker.connect()
    conn.channel().queue_delete(name)
    conn.close()
    r = api.post("/api/definitions", {"queues": exported})
    assert r.status in (200, 201, 204), r
    s = wait_for(lambda: (lambda r: r.json if r.status == 200 else None)(
        api.get(f"/api/queues/%2F/{q(name)}")), timeout=STATS_WAIT_S, what="the import")
    assert s["type"] == "stream" and s["arguments"] == args
    publish(broker, name, 2)
    assert wait_for(lambda: offsets_from_first(broker, name, 1.0) == [0, 1] or None,
                    timeout=STATS_WAIT_S, what="the imported stream to read") is True


# ---------------------------------------------------------------- warren ctl: super streams


def ctl(broker, *args):
    """warren ctl, or on RabbitMQ its rabbitmq-streams (3.10's has the super stream
    commands, marked experimental)."""
    if broker.is_rabbitmq:
        script = os.environ.get("RABBITMQ_SH", os.path.join(
            os.path.dirname(__file__), "..", "..", "..", "..", "shared", "rabbitmq",
            "rabbitmq.sh"))
        cmd = [script, "tool", "1", "rabbitmq-streams", *args]
    else:
        cmd = [broker.bin_path, "ctl", "--uri", broker.management_uri, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=150)


@pytest.fixture
def warren_only(broker):
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ 3.10's delete_super_stream deletes what it finds, asking nothing")


@pytest.mark.timeout(300)  # rabbitmq-streams takes seconds to start
def test_add_super_stream_makes_rabbitmqs_exchange_partitions_and_bindings(broker, api, name):
    out = ctl(broker, "add_super_stream", name, "--partitions", "3", "--max-age", "P1DT2H",
              "--max-length-bytes", "20gb", "--stream-max-segment-size-bytes", "50mb",
              "--leader-locator", "least-leaders", "--initial-cluster-size", "1")
    assert out.returncode == 0, out
    assert f"Super stream {name} has been created" in out.stdout.splitlines(), out
    try:
        x = api.get(f"/api/exchanges/%2F/{q(name)}").json
        assert (x["type"], x["durable"], x["arguments"]) == ("direct", True,
                                                             {"x-super-stream": True})
        for i in range(3):
            s = api.get(f"/api/queues/%2F/{q(f'{name}-{i}')}").json
            assert s["type"] == "stream"
            assert s["arguments"] == {
                "x-queue-type": "stream", "x-max-age": f"{26 * 3600}s",
                "x-max-length-bytes": 20_000_000_000,
                "x-stream-max-segment-size-bytes": 50_000_000,
                "x-queue-leader-locator": "least-leaders", "x-initial-cluster-size": 1}
        bindings = api.get(f"/api/exchanges/%2F/{q(name)}/bindings/source").json
        assert sorted((b["destination"], b["routing_key"], b["arguments"]) for b in bindings) == [
            (f"{name}-{i}", str(i), {"x-stream-partition-order": i}) for i in range(3)]
        # The exchange routes by partition key.
        publish(broker, "1", 2, exchange=name)
        assert offsets_from_first(broker, f"{name}-1", 1.0) == [0, 1]
        assert offsets_from_first(broker, f"{name}-0", 0.5) == []
        # A second add of the same name is refused and changes nothing.
        again = ctl(broker, "add_super_stream", name, "--partitions", "5")
        assert again.returncode != 0, again
        assert f"there is already an exchange named {name}" in again.stdout + again.stderr
        assert api.get(f"/api/queues/%2F/{q(f'{name}-4')}").status == 404
    finally:
        out = ctl(broker, "delete_super_stream", name)
    assert out.returncode == 0, out
    assert api.get(f"/api/exchanges/%2F/{q(name)}").status == 404
    for i in range(3):
        assert api.get(f"/api/queues/%2F/{q(f'{name}-{i}')}").status == 404


@pytest.mark.timeout(300)  # rabbitmq-streams takes seconds to start
def test_add_super_stream_with_binding_keys_names_partitions_by_key(broker, api, name):
    # 3.10 names the option --routing-keys, 3.11 --binding-keys: warren takes both.
    option = "--routing-keys" if broker.is_rabbitmq else "--binding-keys"
    out = ctl(broker, "add_super_stream", name, option, "amer, emea,apac")
    assert out.returncode == 0, out
    try:
        bindings = api.get(f"/api/exchanges/%2F/{q(name)}/bindings/source").json
        assert sorted((b["destination"], b["routing_key"], b["arguments"]) for b in bindings) == [
            (f"{name}-amer", "amer", {"x-stream-partition-order": 0}),
            (f"{name}-apac", "apac", {"x-stream-partition-order": 2}),
            (f"{name}-emea", "emea", {"x-stream-partition-order": 1})]
    finally:
        assert ctl(broker, "delete_super_stream", name).returncode == 0


@pytest.mark.timeout(300)  # rabbitmq-streams takes seconds to start
@pytest.mark.parametrize("args,why", [
    (["--partitions", "0"], "The partition number must be greater than 0"),
    (["--max-length-bytes", "lots"], "Invalid value for --max-length-bytes"),
    (["--max-age", "7D"], "Invalid value for --max-age"),
    (["--leader-locator", "nearest"], "Invalid value for --leader-locator"),
    (["--initial-cluster-size", "0"], "Invalid value for --initial-cluster-size"),
])
def test_add_super_stream_refuses_bad_options_and_creates_nothing(broker, api, name, args, why):
    out = ctl(broker, "add_super_stream", name, *args)
    assert out.returncode != 0, out
    if not broker.is_rabbitmq:  # rabbitmq-streams prints its usage beside the reason
        assert why in out.stderr, out
    assert api.get(f"/api/exchanges/%2F/{q(name)}").status == 404


def test_delete_super_stream_refuses_an_exchange_that_is_not_one(broker, api, warren_only,
                                                                 name):
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare(name, "direct", durable=True)
    try:
        out = ctl(broker, "delete_super_stream", name)
        assert out.returncode != 0 and "is not a super stream" in out.stderr, out
        assert api.get(f"/api/exchanges/%2F/{q(name)}").status == 200
        missing = ctl(broker, "delete_super_stream", f"{name}.none")
        assert missing.returncode != 0 and "does not exist" in missing.stderr, missing
    finally:
        ch.exchange_delete(name)
        conn.close()


# ------------------------------------------- the stream protocol's clients in the API and ctl


class StreamClient:
    """Just enough of RabbitMQ's stream protocol (PROTOCOL.adoc) to hold a connection with a
    publisher and a subscription open: peer properties, SASL PLAIN, tune, open, declare
    publisher, publish, subscribe."""

    def __init__(self, host, port, vhost="/", user="guest", password="guest"):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.correlation = 0
        self.request(0x0011, struct.pack(">i", 1) + self.string("product") + self.string(
            "warren-interop"))
        self.request(0x0012, b"")
        self.request(0x0013, self.string("PLAIN") + self.bytes(
            f"\0{user}\0{password}".encode()))
        key, body = self.read()
        assert key == 0x0014, hex(key)  # tune
        self.send(0x0014, body, correlated=False)
        self.request(0x0015, self.string(vhost))

    @staticmethod
    def string(s):
        b = s.encode()
        return struct.pack(">h", len(b)) + b

    @staticmethod
    def bytes(b):
        return struct.pack(">i", len(b)) + b

    def send(self, key, body, correlated=True):
        head = struct.pack(">HH", key, 1)
        if correlated:
            self.correlation += 1
            head += struct.pack(">I", self.correlation)
        frame = head + body
        self.sock.sendall(struct.pack(">I", len(frame)) + frame)

    def read(self):
        def exactly(n):
            buf = b""
            while len(buf) < n:
                chunk = self.sock.recv(n - len(buf))
                assert chunk, "the server closed the connection"
                buf += chunk
            return buf
        (size,) = struct.unpack(">I", exactly(4))
        frame = exactly(size)
        key, _version = struct.unpack(">HH", frame[:4])
        return key, frame[4:]

    def request(self, key, body):
        """Sends a request and returns its response's code, skipping other frames."""
        self.send(key, body)
        while True:
            k, rest = self.read()
            if k == key | 0x8000:
                correlation, code = struct.unpack(">IH", rest[:6])
                if correlation == self.correlation:
                    assert code == 1, f"command {key:#x} answered {code}"
                    return

    def declare_publisher(self, publisher_id, stream, reference=""):
        self.request(0x0001, struct.pack(">B", publisher_id) + self.string(reference)
                     + self.string(stream))

    def publish(self, publisher_id, messages):
        body = struct.pack(">Bi", publisher_id, len(messages))
        for i, m in enumerate(messages):
            body += struct.pack(">Q", i + 1) + self.bytes(m)
        self.send(0x0002, body, correlated=False)
        # One confirm per publish here: wait for it.
        while True:
            k, rest = self.read()
            if k == 0x0003:
                return

    def subscribe(self, subscription_id, stream, credit=10, properties=()):
        body = (struct.pack(">B", subscription_id) + self.string(stream)
                + struct.pack(">H", 1)  # offset: first
                + struct.pack(">H", credit) + struct.pack(">i", len(properties)))
        for k, v in properties:
            body += self.string(k) + self.string(v)
        self.request(0x0007, body)

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def stream_port(broker, tmp_path_factory):
    """The stream protocol's port: RabbitMQ's plugin's (WARREN_TEST_STREAM_PORT), or a warren
    node of this module's own started with --stream-listen (its management API beside it)."""
    if broker.is_rabbitmq:
        port = os.environ.get("WARREN_TEST_STREAM_PORT")
        if not port:
            pytest.skip("no RabbitMQ stream listener named by WARREN_TEST_STREAM_PORT")
        yield broker, int(port)
        return
    work = tmp_path_factory.mktemp("warren-stream")
    port = free_port()
    node = Broker("warren", f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F",
                  bin_path=broker.bin_path, data_dir=str(work / "data"),
                  log_path=str(work / "warren.log"),
                  management_uri=f"http://guest:guest@127.0.0.1:{free_port()}")
    node.extra_args = ["--stream-listen", f"127.0.0.1:{port}"]
    node._spawn()
    wait_port("127.0.0.1", port, 30, node.proc)
    yield node, port
    node.stop(signal.SIGTERM)


def test_stream_clients_are_listed_by_the_api_and_ctl(stream_port, name):
    node, port = stream_port
    api = Api(node)
    conn = node.connect()
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    client = StreamClient("127.0.0.1", port)
    try:
        client.declare_publisher(7, name, reference=f"{name}-ref")
        client.publish(7, [b"one", b"two", b"three"])
        client.subscribe(3, name, credit=5)

        def listed():
            cs = [c for c in api.get("/api/stream/connections/%2F").json
                  if c.get("client_properties", {}).get("product") == "warren-interop"]
            ps = [p for p in api.get("/api/stream/publishers/%2F").json
                  if p["queue"]["name"] == name]
            ks = [k for k in api.get("/api/stream/consumers/%2F").json
                  if k["queue"]["name"] == name]
            return (cs, ps, ks) if cs and ps and ks and ps[0].get("confirmed") == 3 else None

        cs, ps, ks = wait_for(listed, timeout=STATS_WAIT_S, interval=0.5,
                              what="the stream client in /api/stream/*")
        assert cs[0]["user"] == "guest" and cs[0]["vhost"] == "/"
        assert (ps[0]["publisher_id"], ps[0]["reference"], ps[0]["published"]) == (
            7, f"{name}-ref", 3)
        assert ps[0]["connection_details"]["name"] == cs[0]["name"]
        assert ks[0]["subscription_id"] == 3
        assert ks[0]["connection_details"]["name"] == cs[0]["name"]
        if node.is_rabbitmq:
            return
        # rabbitmq-streams' listings, with their column names.
        out = ctl(node, "list_stream_publishers", "stream", "publisher_id", "reference",
                  "messages_published", "messages_confirmed")
        assert out.returncode == 0, out
        assert f"{name}\t7\t{name}-ref\t3\t3" in out.stdout.splitlines(), out.stdout
        out = ctl(node, "list_stream_consumers", "stream", "subscription_id", "connection_pid")
        assert f"{name}\t3\t{cs[0]['name']}" in out.stdout.splitlines(), out.stdout
        out = ctl(node, "list_stream_connections", "conn_name", "user", "vhost",
                  "subscriptions")
        assert f"{cs[0]['name']}\tguest\t/\t1" in out.stdout.splitlines(), out.stdout
        bad = ctl(node, "list_stream_consumers", "no_such_item")
        assert bad.returncode != 0 and "no_such_item" in bad.stderr, bad
    finally:
        client.close()
    # Gone from the listings once the connection is.
    wait_for(lambda: not [p for p in api.get("/api/stream/publishers/%2F").json
                          if p["queue"]["name"] == name],
             timeout=STATS_WAIT_S, interval=0.2, what="the publisher to leave the listing")
    conn = node.connect()
    conn.channel().queue_delete(name)
    conn.close()
