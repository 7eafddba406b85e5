"""A quorum queue's members changed while it holds messages, as rabbitmq-queues does it
(`warren ctl add_member`, `delete_member`, `grow`, `shrink`), on a cluster of real processes:
a node added gets a replica that serves its own consumers every message, one removed stops
being a member, and the refusals say why.

Each test starts its own 3-node cluster (see test_cluster.py) and waits by polling with
deadlines, never by sleeping a fixed time.
"""

import os
import subprocess

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
# The fixture starts a 3-node cluster per test and stops it on every exit path.
from test_cluster import WARREN_BIN, Cluster, cluster, eventually  # noqa: F401
from test_cluster_messaging import consume

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(180),
]


def ctl(node, *args):
    return subprocess.run([WARREN_BIN, "ctl", "--uri", f"http://127.0.0.1:{node.http}", *args],
                          capture_output=True, text=True, timeout=60)


def members(node, queue):
    return sorted(node.api(f"/api/queues/%2F/{queue}")["members"])


def publish_confirmed(node, queue, bodies):
    conn = node.connection()
    ch = conn.channel()
    ch.confirm_delivery()
    for b in bodies:
        ch.basic_publish("", queue, b, pika.BasicProperties(delivery_mode=2))
    conn.close()


def test_a_member_added_serves_every_message_and_a_member_deleted_leaves(cluster):
    nodes = {n.name: n for n in cluster.nodes}
    n1 = nodes["n1"]
    n1.connection().channel().queue_declare(
        "grown", durable=True,
        arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
    two = eventually(lambda: members(n1, "grown"), "members")
    assert len(two) == 2
    [outsider] = [n for n in nodes if n not in two]
    # A node holding no replica shows the leader the members elected (a member tells it).
    leader = eventually(lambda: nodes[two[0]].api("/api/queues/%2F/grown").get("leader"), "a leader")
    assert nodes[outsider].api("/api/queues/%2F/grown").get("leader") == leader
    bodies = [str(i).encode() for i in range(500)]
    publish_confirmed(n1, "grown", bodies)

    r = ctl(n1, "add_member", "grown", outsider)
    assert r.returncode == 0, r.stderr
    assert members(n1, "grown") == sorted(two + [outsider])
    # The new member's own replica serves a consumer on its node: every message, in order,
    # read from the copy it was sent.
    conn = nodes[outsider].connection()
    got = consume(conn, conn.channel(), "grown", 500)
    assert [b for _, b, _ in got] == bodies
    conn.close()

    # Refusals, each with its reason.
    r = ctl(n1, "add_member", "grown", outsider)
    assert r.returncode != 0 and "already" in r.stderr, r.stderr
    r = ctl(n1, "add_member", "grown", "n9")
    assert r.returncode != 0 and "not a member of this cluster" in r.stderr, r.stderr
    r = ctl(n1, "add_member", "nope", outsider)
    assert r.returncode != 0 and "no quorum queue 'nope'" in r.stderr, r.stderr

    # An original member leaves; the queue carries on with the other two.
    leaving = two[0]
    r = ctl(n1, "delete_member", "grown", leaving)
    assert r.returncode == 0, r.stderr
    assert members(n1, "grown") == sorted([two[1], outsider])
    leader = eventually(
        lambda: (nodes[outsider].api("/api/queues/%2F/grown").get("leader") or "x") in (two[1], outsider)
        and nodes[outsider].api("/api/queues/%2F/grown")["leader"], "a leader among the members")
    eventually(lambda: nodes[leaving].api("/api/queues/%2F/grown").get("leader") == leader,
               "the node that left shows the members' leader")
    r = ctl(n1, "delete_member", "grown", leaving)
    assert r.returncode != 0 and "not a member" in r.stderr, r.stderr
    more = [b"after-%d" % i for i in range(50)]
    publish_confirmed(nodes[two[1]], "grown", more)
    conn = nodes[outsider].connection()
    got = consume(conn, conn.channel(), "grown", 50)
    assert [b for _, b, _ in got] == more
    conn.close()
    # Asked of a member: a node holding no replica knows the members, not who leads.
    r = ctl(nodes[outsider], "quorum_status", "grown")
    assert r.returncode == 0, r.stderr
    rows = dict(line.split("\t") for line in r.stdout.splitlines()[2:])
    assert sorted(rows) == sorted([two[1], outsider])
    assert sorted(rows.values()) == ["follower", "leader"]


def test_a_member_added_behind_a_large_backlog_fetches_it_in_chunks_and_serves_it(cluster):
    # 12,000 x 1 KB waiting behind settled messages: the new member is behind every entry the
    # leader keeps, and they are more than a snapshot carries (4 MiB), so it fetches them.
    nodes = {n.name: n for n in cluster.nodes}
    n1 = nodes["n1"]
    n1.connection().channel().queue_declare(
        "backlog", durable=True,
        arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
    two = eventually(lambda: members(n1, "backlog"), "members")
    [outsider] = [n for n in nodes if n not in two]
    publish_confirmed(n1, "backlog", [b"settled"] * 200)
    conn = n1.connection()
    consume(conn, conn.channel(), "backlog", 200)
    conn.close()
    bodies = [(b"%06d" % i).ljust(1024, b".") for i in range(12000)]
    conn = n1.connection()
    ch = conn.channel()
    for b in bodies:
        ch.basic_publish("", "backlog", b, pika.BasicProperties(delivery_mode=2))
    conn.close()
    eventually(lambda: n1.api("/api/queues/%2F/backlog").get("messages") == 12000,
               "12,000 messages in the queue")

    r = ctl(n1, "add_member", "backlog", outsider)
    assert r.returncode == 0, r.stderr

    def fetched_chunks():
        with open(os.path.join(cluster.dir, f"{outsider}.log"), errors="replace") as log:
            lines = [line for line in log if "a snapshot's entries were fetched" in line]
        return lines and int(lines[-1].split("chunks=")[1].split()[0])
    chunks = eventually(fetched_chunks, "the new member fetched the backlog")
    assert chunks >= 3, chunks
    # Its own replica serves a consumer on its node: every message, in order, from its copy.
    conn = nodes[outsider].connection()
    got = consume(conn, conn.channel(), "backlog", 12000, prefetch=500)
    assert [b for _, b, _ in got] == bodies
    conn.close()


def test_grow_and_shrink_move_a_node_into_and_out_of_every_quorum_queue(cluster):
    n1, n2, n3 = cluster.nodes
    ch = n1.connection().channel()
    for q in ("g1", "g2", "other"):
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum",
                                                    "x-quorum-initial-group-size": 1,
                                                    "x-queue-leader-locator": "client-local"})
    r = ctl(n1, "grow", "n2", "all", "--queue-pattern", "^g")
    assert r.returncode == 0, r.stderr
    for q in ("g1", "g2"):
        assert members(n1, q) == ["n1", "n2"]
    assert members(n1, "other") == ["n1"]
    # Shrinking n1 away leaves n2 in g1 and g2, and never empties "other".
    r = ctl(n1, "shrink", "n1")
    assert r.returncode == 0, r.stderr
    for q in ("g1", "g2"):
        assert members(n1, q) == ["n2"]
    assert members(n1, "other") == ["n1"]
    assert "the last member is never removed" in r.stdout
    # The queues still take and give messages through their one member left.
    publish_confirmed(n3, "g1", [b"x"])
    conn = n3.connection()
    assert [b for _, b, _ in consume(conn, conn.channel(), "g1", 1)] == [b"x"]
    conn.close()


def test_rebalance_spreads_the_leaders_of_queues_declared_through_one_node(cluster):
    n1 = cluster.nodes[0]
    ch = n1.connection().channel()
    names = [f"r{i}" for i in range(6)]
    for q in names:
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum",
                                                    "x-queue-leader-locator": "client-local"})

    def leaders():
        return {q["name"]: q.get("leader") for q in n1.api("/api/queues") if q["name"] in names}

    # Client-local: n1 is every queue's first member and stands at once.
    eventually(lambda: set(leaders().values()) == {"n1"}, "n1 leads all six")

    def spread():
        counts = {}
        for leader in leaders().values():
            counts[leader] = counts.get(leader, 0) + 1
        return counts == {"n1": 2, "n2": 2, "n3": 2}

    def rebalanced():
        # Asked again until done: a queue whose group has not reported its first leader to
        # n1 yet is left out of a round (rebalance moves only the leaders it knows).
        r = ctl(n1, "rebalance", "quorum")
        assert r.returncode == 0, r.stderr
        assert "quorum queues get a new leader" in r.stdout, r.stdout
        try:
            eventually(spread, "two leaders per node", deadline_s=5)
            return True
        except AssertionError:
            return False
    eventually(rebalanced, "a rebalance that leaves two leaders per node")
    # Still queues: a publish through the old leader's node is confirmed and consumed.
    publish_confirmed(n1, "r0", [b"after"])
    conn = cluster.nodes[2].connection()
    assert [b for _, b, _ in consume(conn, conn.channel(), "r0", 1)] == [b"after"]
    conn.close()


def test_a_node_away_while_it_was_removed_drops_those_replicas_when_it_returns():
    # Snapshots every 20 metadata entries: the entries that removed n3 are gone when it returns,
    # and it learns of the removals from a snapshot.
    c = Cluster(extra_args=["--cluster-snapshot-entries", "20"])
    try:
        c.start()
        n1, n2, n3 = c.nodes
        ch = n1.connection().channel()
        for q in ("kept", "shrunk", "deleted"):
            ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
            eventually(lambda: len(members(n1, q)) == 3, f"{q} on 3 members")
        for q in ("kept", "shrunk", "deleted"):
            publish_confirmed(n1, q, [b"m"] * 10)
        groups_dir = os.path.join(n3.data, "meta", "cluster", "groups")
        eventually(lambda: len(os.listdir(groups_dir)) == 3, "n3 holds three replicas")

        n3.kill()
        r = ctl(n1, "delete_member", "shrunk", "n3")
        assert r.returncode == 0, r.stderr
        ch = n1.connection().channel()
        ch.queue_delete("deleted")
        for i in range(30):
            ch.queue_declare(f"filler-{i}", durable=True)
        n3.start()
        eventually(lambda: len(os.listdir(groups_dir)) == 1, "n3 dropped the two replicas")
        with open(os.path.join(c.dir, "n3.log"), errors="replace") as log:
            assert "metadata snapshot installed" in log.read()
        # The replica it kept still serves.
        conn = n3.connection()
        got = consume(conn, conn.channel(), "kept", 10)
        assert len(got) == 10
        conn.close()
    finally:
        c.close()
