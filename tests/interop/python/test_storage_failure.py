"""A failed fsync stops the node's writes and reports it; it never retries and carries on.

Each test starts a warren node of its own with the test-only --fault-injection flag (the failure
lasts until a restart, so the session's broker cannot be used), makes the next fsync fail through
POST /api/warren/faults/fail-next-fsync, and checks what clients and operators see:

* stored publishes in flight are nacked; publishers get connection.blocked ("storage failure:
  ...") and their publishes are no longer read;
* a durable change (declaring a durable queue) and tx.commit close the connection with 541
  INTERNAL_ERROR, while re-declaring what exists and transient topology go on, and consumers
  keep receiving;
* the health checks answer 503 naming the storage alarm, /api/nodes and /metrics show it, and
  `warren ctl check_local_alarms` fails; none of it clears with time;
* after SIGKILL and a restart on the same data dir (without fault injection) every message
  confirmed before the failure is there, nothing appears that was never published, and the
  node writes again.

A full disk is different: it is waited out, never a failure. With WAL writes failing with ENOSPC
(POST /api/warren/faults/disk-full), the publish in flight is neither confirmed nor nacked,
publishers get connection.blocked, and when space returns the write goes through, the publish is
confirmed, publishers are unblocked, and everything is there after a SIGKILL.

warren only: RabbitMQ has no way to make its fsync fail on demand (skipped there).
"""

import base64
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest

from conftest import BROKER_START_TIMEOUT_S, Broker, free_port, wait_port
from helpers import expect_connection_error, get, wait_for

CONFIRMED_BEFORE = 50
EVENT_WAIT_S = 10.0


@pytest.fixture
def node(broker, tmp_path):
    if broker.is_rabbitmq or not broker.can_restart:
        pytest.skip("fault injection needs a warren process the suite starts")
    b = Broker("warren", f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F",
               bin_path=broker.bin_path, data_dir=str(tmp_path / "data"),
               log_path=str(tmp_path / "warren.log"),
               management_uri=f"http://guest:guest@127.0.0.1:{free_port()}")
    b.extra_args = ["--fault-injection"]
    b._spawn()
    wait_management(b)
    yield b
    b.stop(signal.SIGKILL)


def wait_management(node):
    """The AMQP port opens before the management API's: wait for the latter too."""
    uri = urllib.parse.urlparse(node.management_uri)
    wait_port(uri.hostname, uri.port, BROKER_START_TIMEOUT_S, node.proc)


def restart_without_faults(node):
    node.restart(signal.SIGKILL, extra_args=[])
    wait_management(node)


def http(node, method, path):
    """(status, body) of a management API request as the administrator guest."""
    uri = urllib.parse.urlparse(node.management_uri)
    req = urllib.request.Request(f"http://{uri.hostname}:{uri.port}{path}", method=method)
    token = base64.b64encode(f"{uri.username}:{uri.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(node, name):
    _, text = http(node, "GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name} in /metrics")


def ctl(node, *args):
    return subprocess.run([node.bin_path, "ctl", "--uri", node.management_uri, *args],
                          capture_output=True, text=True, timeout=30)


def pump(conn, until, what):
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or until(), EVENT_WAIT_S,
             what=what)


def log_text(node):
    with open(node.log_path, "rb") as f:
        return f.read().decode(errors="replace")


def bodies_in(node, queue):
    """Every body in `queue`, read without acking."""
    c = node.connect()
    ch = c.channel()
    n = ch.queue_declare(queue, durable=True, passive=True).method.message_count
    got = [get(ch, queue, auto_ack=False)[2] for _ in range(n)]
    c.close()
    return got


def test_failed_wal_fsync_stops_writes_reports_it_and_loses_nothing_confirmed(node, name):
    durable_q, held_q = name + ".durable", name + ".held"

    # Before the failure: a healthy node, and messages confirmed the usual way.
    assert http(node, "GET", "/api/health/checks/alarms") == (200, '{"status":"ok"}')
    assert metric(node, "warren_alarms_storage_failure") == 0
    publisher = node.connect(blocked_connection_timeout=None)
    pch = publisher.channel()
    pch.queue_declare(durable_q, durable=True)
    pch.queue_declare(held_q)
    pch.confirm_delivery()
    confirmed = [f"confirmed-{i}".encode() for i in range(CONFIRMED_BEFORE)]
    for body in confirmed:
        pch.basic_publish("", durable_q, body, pika.BasicProperties(delivery_mode=2))

    assert http(node, "POST", "/api/warren/faults/fail-next-fsync")[0] == 204

    # The next stored publish hits the failing fdatasync: nacked, never confirmed.
    nacked = [b"doomed"]
    with pytest.raises(pika.exceptions.NackError):
        pch.basic_publish("", durable_q, b"doomed", pika.BasicProperties(delivery_mode=2))

    # Publishers are blocked: a later publish (even transient) is held, not read.
    blocked = []
    other = node.connect(blocked_connection_timeout=None)
    other.add_on_connection_blocked_callback(lambda c, f: blocked.append(f.method.reason))
    other.channel().basic_publish("", held_q, b"held")
    pump(other, lambda: blocked, "connection.blocked")
    assert blocked[0].startswith("storage failure: fdatasync of WAL file"), blocked

    # Durable changes answer 541 INTERNAL_ERROR (a connection error); what writes nothing goes on.
    observer = node.connect()
    expect_connection_error(541, "INTERNAL_ERROR - storage failure: fdatasync of WAL file",
                            observer.channel().queue_declare, name + ".new", durable=True)
    committer = node.connect().channel()
    committer.tx_select()
    expect_connection_error(541, "INTERNAL_ERROR - cannot commit", committer.tx_commit)
    c = node.connect()
    ch = c.channel()
    assert ch.queue_declare(held_q, passive=True).method.message_count == 0, "held, not read"
    ch.queue_declare(durable_q, durable=True)  # re-declaring what exists changes nothing
    ch.queue_declare(name + ".transient", exclusive=True)
    # Consumers keep receiving what the node holds; an ack cannot be written any more, so the
    # acked message is back after the restart (at-least-once).
    method, _, body = get(ch, durable_q, auto_ack=False)
    assert body == confirmed[0]
    ch.basic_ack(method.delivery_tag)
    ch.queue_declare(durable_q, durable=True, passive=True)  # a round trip: the ack was read
    c.close()

    # Operators see it everywhere, and it does not clear with time (never retried).
    time.sleep(1.0)
    status, body = http(node, "GET", "/api/health/checks/alarms")
    assert status == 503, body
    health = json.loads(body)
    assert health["status"] == "failed"
    [alarm] = health["alarms"]
    assert alarm["resource"] == "storage"
    assert alarm["reason"].startswith("storage failure: fdatasync of WAL file")
    assert http(node, "GET", "/api/health/checks/local-alarms")[0] == 503
    [info] = json.loads(http(node, "GET", "/api/nodes")[1])
    assert info["storage_failed"] is True and "fdatasync" in info["storage_failure"]
    assert metric(node, "warren_alarms_storage_failure") == 1
    check = ctl(node, "check_local_alarms")
    assert check.returncode == 1 and "storage alarm" in check.stderr, check
    assert "Storage failure alarm" in ctl(node, "status").stdout
    refused = ctl(node, "add_vhost", name)
    assert refused.returncode == 1 and "HTTP 500" in refused.stderr, refused
    assert "storage failure alarm set" in log_text(node)

    # kill -9 and a restart on the same data dir, without fault injection.
    restart_without_faults(node)
    assert http(node, "GET", "/api/health/checks/alarms") == (200, '{"status":"ok"}')
    assert http(node, "POST", "/api/warren/faults/fail-next-fsync")[0] == 404, "off by default"
    after = bodies_in(node, durable_q)
    missing = set(confirmed) - set(after)
    assert not missing, f"confirmed before the failure, lost: {sorted(missing)[:5]}"
    phantoms = set(after) - set(confirmed) - set(nacked)
    assert not phantoms, f"never published: {phantoms}"
    assert len(after) == len(set(after)), "no message twice"

    # The restarted node writes again.
    c = node.connect()
    ch = c.channel()
    ch.confirm_delivery()
    ch.basic_publish("", durable_q, b"after restart", pika.BasicProperties(delivery_mode=2))
    ch.queue_declare(name + ".new", durable=True)
    c.close()


def test_failed_metadata_journal_fsync_refuses_the_declare_and_stops_writes(node, name):
    c = node.connect()
    ch = c.channel()
    ch.queue_declare(name + ".before", durable=True)
    assert http(node, "POST", "/api/warren/faults/fail-next-fsync?target=metadata")[0] == 204
    # The declare whose journal record could not be synced is not declare-ok'd.
    expect_connection_error(541, "INTERNAL_ERROR - cannot persist metadata",
                            ch.queue_declare, name + ".failed", durable=True)

    status, body = http(node, "GET", "/api/health/checks/local-alarms")
    assert status == 503, body
    [alarm] = json.loads(body)["alarms"]
    assert alarm["reason"].startswith("storage failure: fdatasync of the metadata journal")
    # Every later durable change is refused, and publishers are blocked.
    observer = node.connect()
    expect_connection_error(541, "INTERNAL_ERROR - storage failure: fdatasync of the metadata",
                            observer.channel().exchange_declare, name + ".x", "fanout",
                            durable=True)
    blocked = []
    publisher = node.connect(blocked_connection_timeout=None)
    publisher.add_on_connection_blocked_callback(lambda c, f: blocked.append(f.method.reason))
    publisher.channel().basic_publish("", name + ".before", b"held")
    pump(publisher, lambda: blocked, "connection.blocked")
    assert blocked[0].startswith("storage failure: fdatasync of the metadata journal")

    restart_without_faults(node)
    c = node.connect()
    ch = c.channel()
    ch.queue_declare(name + ".before", durable=True, passive=True)
    assert ch.queue_declare(name + ".before", passive=True).method.message_count == 0
    ch.queue_declare(name + ".after", durable=True)
    c.close()


def test_full_disk_blocks_publishers_and_resumes_when_space_returns_losing_nothing(node, name):
    first = node.connect()
    ch = first.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    bodies = [f"m{i}".encode() for i in range(20)]
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))

    assert http(node, "POST", "/api/warren/faults/disk-full?on=true")[0] == 204
    # A publish already under way when the disk fills: its confirm waits for space.
    outcome = {}

    def publish_while_full():
        try:
            ch.basic_publish("", name, b"while full", pika.BasicProperties(delivery_mode=2))
            outcome["confirmed"] = True
        except Exception as e:  # noqa: BLE001 - reported by the assertions below
            outcome["error"] = repr(e)

    in_flight = threading.Thread(target=publish_while_full)
    in_flight.start()
    wait_for(lambda: json.loads(http(node, "GET", "/api/nodes")[1])[0]["disk_free_alarm"],
             EVENT_WAIT_S, what="the disk alarm in /api/nodes")
    status, body = http(node, "GET", "/api/health/checks/alarms")
    assert status == 503 and json.loads(body)["alarms"][0]["resource"] == "disk", body

    # A publisher that publishes now is blocked, its publish held.
    events = []
    later = node.connect(blocked_connection_timeout=None)
    later.add_on_connection_blocked_callback(lambda c, f: events.append(f.method.reason))
    later.add_on_connection_unblocked_callback(lambda c, f: events.append("unblocked"))
    later.channel().basic_publish("", name, b"held", pika.BasicProperties(delivery_mode=2))
    pump(later, lambda: events, "connection.blocked")
    assert events == ["low on disk"], events
    time.sleep(0.5)
    assert in_flight.is_alive() and not outcome, f"settled while the disk was full: {outcome}"

    assert http(node, "POST", "/api/warren/faults/disk-full?on=false")[0] == 204
    in_flight.join(EVENT_WAIT_S)
    assert outcome == {"confirmed": True}, outcome
    pump(later, lambda: "unblocked" in events, "connection.unblocked")
    assert http(node, "GET", "/api/health/checks/alarms") == (200, '{"status":"ok"}')
    wait_for(lambda: ch.queue_declare(name, durable=True, passive=True).method.message_count == 22,
             EVENT_WAIT_S, what="the held publish in the queue")
    ch.basic_publish("", name, b"after", pika.BasicProperties(delivery_mode=2))
    first.close()
    later.close()

    restart_without_faults(node)
    assert bodies_in(node, name) == bodies + [b"while full", b"held", b"after"]


def test_disk_stalls_hold_every_wal_sync_and_lose_nothing(node, name):
    """The benchmark switch that stalls the WAL's syncs (scripts/compare-quorum.py
    --warren-disk-stalls): while on, every confirm waits out the stall; nothing is lost, on or
    off. Only a lower bound on time is asserted: a sleep lasts at least as long as asked,
    whatever the machine."""
    queue = name + ".stalled"
    c = node.connect()
    ch = c.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)

    assert http(node, "POST", "/api/warren/faults/disk-stalls?every_ms=abc&stall_ms=1")[0] == 400
    assert http(node, "POST",
                "/api/warren/faults/disk-stalls?every_ms=1000&stall_ms=3600000")[0] == 400
    # Every window is one stall: each sync ends 300 ms later than the disk made it.
    assert http(node, "POST",
                "/api/warren/faults/disk-stalls?every_ms=1000&stall_ms=1000&sync_ms=300")[0] == 204
    for i in range(3):
        began = time.monotonic()
        ch.basic_publish("", queue, f"stalled-{i}".encode(), props)
        assert time.monotonic() - began >= 0.3, "a confirm came before the stalled sync ended"

    assert http(node, "POST", "/api/warren/faults/disk-stalls?every_ms=0&stall_ms=0")[0] == 204
    for i in range(20):
        ch.basic_publish("", queue, f"after-{i}".encode(), props)
    c.close()
    assert bodies_in(node, queue) == [f"stalled-{i}".encode() for i in range(3)] + \
        [f"after-{i}".encode() for i in range(20)]
