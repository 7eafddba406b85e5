"""Streams replicated in a warren cluster of real processes, over AMQP 0-9-1 with pika: a
stream declared on one node has a member on every node; what a publisher had confirmed is read,
in order, from `first` through every node; kill -9 of the stream's leader under confirming
publishers loses nothing confirmed, neither after the failover nor once the old leader is back;
a member that was down catches up; retention deletes whole segments on every member (counted
on disk).

Each test starts its own 3-node cluster (test_cluster.py's helpers: loopback, free ports, fresh
data dirs, every node stopped on every exit path) and polls conditions up to a deadline.
"""

import glob
import os
import threading
import time
import urllib.parse
import urllib.request

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from test_cluster import Cluster, eventually

pytestmark = [
    pytest.mark.skipif(IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.skipif(BROKER_KIND != "warren", reason="starts warren nodes itself"),
    pytest.mark.timeout(240),
]

STREAM = {"x-queue-type": "stream"}


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


def declare(node, name, **args):
    conn = node.connection()
    arguments = dict(STREAM)
    arguments.update(args)
    conn.channel().queue_declare(name, durable=True, arguments=arguments)
    conn.close()


def queue_info(node, name):
    return node.api(f"/api/queues/%2F/{urllib.parse.quote(name, safe='')}")


def leader_of(cluster, name):
    """The stream's leader as the node that leads it says, once one does."""
    def elected():
        for n in cluster.nodes:
            if n.proc is None:
                continue
            leader = queue_info(n, name).get("leader")
            if leader == n.name:
                return n
        return None
    return eventually(elected, f"stream {name} has a leader")


def publish_confirmed(node, name, bodies):
    """Publishes `bodies` with confirms, one at a time: returns those confirmed."""
    conn = node.connection()
    ch = conn.channel()
    ch.confirm_delivery()
    confirmed = []
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2), mandatory=False)
        confirmed.append(body)
    conn.close()
    return confirmed


def read_from_first(node, name, count, deadline_s=30.0):
    """Reads the stream from `first` through `node` until `count` messages or the deadline;
    returns the bodies in the order delivered, with their offsets."""
    conn = node.connection()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    got = []
    end = time.monotonic() + deadline_s

    def on_message(ch, method, props, body):
        got.append((props.headers["x-stream-offset"], body))
        ch.basic_ack(method.delivery_tag)

    ch.basic_consume(name, on_message, arguments={"x-stream-offset": "first"})
    while len(got) < count and time.monotonic() < end:
        conn.process_data_events(time_limit=0.2)
    conn.close()
    return got


def assert_in_order(got, expected, where):
    bodies = [b for _, b in got]
    assert bodies[:len(expected)] == expected, f"{where}: read {len(bodies)} of {len(expected)}"
    offsets = [o for o, _ in got]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), where


def snapshot_index(node, name):
    """The stream's group snapshot index on `node`, from /metrics/per-object (refreshed every
    few seconds): once it shows, the snapshot was written and the log released below it."""
    req = urllib.request.Request(f"http://127.0.0.1:{node.http}/metrics/per-object")
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("rabbitmq_raft_log_snapshot_index{") and f'queue="{name}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def segment_files(node, name):
    """The stream's segment files in `node`'s data dir (one directory per stream)."""
    return glob.glob(os.path.join(node.data, "streams", "*", "*.segment"))


def test_a_stream_published_on_one_node_is_read_in_order_from_first_on_every_node(cluster):
    n1, n2, n3 = cluster.nodes
    declare(n1, "s")
    info = queue_info(n1, "s")
    assert sorted(info["members"]) == ["n1", "n2", "n3"], info
    expected = [f"m{i}".encode() for i in range(300)]
    assert publish_confirmed(n2, "s", expected) == expected
    for node in cluster.nodes:
        got = read_from_first(node, "s", len(expected))
        assert_in_order(got, expected, node.name)
        assert [o for o, _ in got] == list(range(len(expected))), node.name


def test_kill_9_of_the_leader_under_confirming_publishers_loses_nothing_confirmed(cluster):
    declare(cluster.nodes[0], "s")
    leader = leader_of(cluster, "s")
    others = [n for n in cluster.nodes if n is not leader]
    confirmed = {o.name: [] for o in others}
    stop = threading.Event()

    def publisher(node):
        # Publishes until stopped; a connection lost (its node's group electing) is reopened.
        i = 0
        while not stop.is_set():
            try:
                conn = node.connection()
                ch = conn.channel()
                ch.confirm_delivery()
                while not stop.is_set():
                    body = f"{node.name}-{i}".encode()
                    i += 1
                    try:
                        ch.basic_publish("", "s", body, pika.BasicProperties(delivery_mode=2))
                        confirmed[node.name].append(body)
                    except pika.exceptions.NackError:
                        pass
                conn.close()
            except Exception:  # noqa: BLE001 - a broken connection: publish again
                time.sleep(0.1)

    threads = [threading.Thread(target=publisher, args=(o,)) for o in others]
    for t in threads:
        t.start()
    try:
        eventually(lambda: all(len(c) >= 50 for c in confirmed.values()), "publishes confirmed")
        leader.kill()
        before = {k: len(v) for k, v in confirmed.items()}
        eventually(lambda: all(len(confirmed[k]) >= before[k] + 50 for k in before),
                   "publishes confirmed after the failover")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    survivors = leader_of(cluster, "s")
    assert survivors is not leader
    total = sum(len(v) for v in confirmed.values())

    def check(node):
        got = read_from_first(node, "s", total + 1000, deadline_s=15)
        bodies = [b for _, b in got]
        offsets = [o for o, _ in got]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), node.name
        have = set(bodies)
        for name, sent in confirmed.items():
            lost = [b for b in sent if b not in have]
            assert not lost, f"{node.name} lacks {len(lost)} confirmed of {name}: {lost[:5]}"
            # Each publisher's messages in the order it sent them.
            mine = [b for b in bodies if b.startswith(name.encode() + b"-")]
            assert mine == sorted(set(mine), key=lambda b: int(b.split(b"-")[1])), node.name

    for node in others:
        check(node)
    leader.start()
    eventually(lambda: Cluster.formed(leader), "the old leader is back")
    check(leader)


def test_a_member_down_during_publishes_catches_up(cluster):
    n1, n2, n3 = cluster.nodes
    declare(n1, "s")
    first = [f"a{i}".encode() for i in range(100)]
    publish_confirmed(n1, "s", first)
    n3.kill()
    # More than a group snapshot's worth of entries while it is down.
    conn = n1.connection()
    ch = conn.channel()
    ch.confirm_delivery()
    second = [f"b{i}".encode() for i in range(6000)]
    for body in second:
        ch.basic_publish("", "s", body)
    conn.close()
    n3.start()
    eventually(lambda: Cluster.formed(n3), "n3 is back")
    got = read_from_first(n3, "s", len(first) + len(second), deadline_s=60)
    assert_in_order(got, first + second, "n3")


def test_retention_deletes_whole_segments_on_every_member(cluster):
    n1, n2, n3 = cluster.nodes
    declare(n1, "s", **{"x-max-length-bytes": 200_000,
                        "x-stream-max-segment-size-bytes": 50_000})
    body = b"x" * 1000
    conn = n1.connection()
    ch = conn.channel()
    ch.confirm_delivery()
    for _ in range(300):
        ch.basic_publish("", "s", body)
    conn.close()
    # Another round a second later, for retention (applied at most once a second) to run.
    time.sleep(1.2)
    publish_confirmed(n1, "s", [b"last"])

    def kept_on_every_member():
        counts = {n.name: len(segment_files(n, "s")) for n in cluster.nodes}
        # 300 KB written in 50 KB segments: about 7; kept: about 200 KB of them.
        return all(2 <= c <= 6 for c in counts.values()) and counts

    counts = eventually(kept_on_every_member, "retention ran on every member")
    for node in cluster.nodes:
        got = read_from_first(node, "s", 10_000, deadline_s=3)
        offsets = [o for o, _ in got]
        assert got and got[-1][1] == b"last", (node.name, counts)
        # The newest messages, with no gap.
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), node.name
        assert offsets[0] > 0, node.name


def test_a_member_down_while_retention_ran_ends_with_the_newest_messages_as_the_others(cluster):
    n1, n2, n3 = cluster.nodes
    declare(n1, "s", **{"x-max-length-bytes": 100_000,
                        "x-stream-max-segment-size-bytes": 20_000})
    publish_confirmed(n1, "s", [f"a{i}".encode() for i in range(20)])
    eventually(lambda: len(read_from_first(n3, "s", 20, deadline_s=2)) == 20, "n3 has them")
    n3.kill()
    # More rounds than a group snapshot's interval (4096 entries), retention deleting segments
    # all along: the group's log no longer holds what n3 lacks.
    conn = n1.connection()
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(4500):
        ch.basic_publish("", "s", f"b{i}-".encode() + b"x" * 200)
    conn.close()
    time.sleep(1.2)
    publish_confirmed(n1, "s", [b"last"])
    # The leader's snapshot is written, and with it the log below its first kept segment gone.
    eventually(lambda: snapshot_index(n1, "s") > 0, "n1 snapshotted the stream's group")
    n3.start()
    eventually(lambda: Cluster.formed(n3), "n3 is back")

    def tail_on_n3():
        got = read_from_first(n3, "s", 100_000, deadline_s=2)
        return got and got[-1][1] == b"last"

    eventually(tail_on_n3, "n3 has the newest messages", deadline_s=60)
    # Retention runs on n3 too, with its rounds (at most once a second, as on every member):
    # 100 KB of 20 KB segments are kept. Read once it is done: a reader in a segment that
    # retention deletes moves on to the first chunk kept, as RabbitMQ's do.
    time.sleep(1.2)
    publish_confirmed(n1, "s", [b"later"])
    eventually(lambda: len(segment_files(n3, "s")) <= 7, "retention ran on n3")
    got = read_from_first(n3, "s", 100_000, deadline_s=3)
    assert got[-2][1] == b"last" and got[-1][1] == b"later"
    offsets = [o for o, _ in got]
    assert offsets[0] > 0
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    on_n1 = dict(read_from_first(n1, "s", 100_000, deadline_s=2))
    # The same message at the same offset on both (retention may have cut each a little
    # differently at the head).
    common = [o for o in offsets if o in on_n1]
    assert len(common) >= 100
    assert all(on_n1[o] == body for o, body in got if o in on_n1)
