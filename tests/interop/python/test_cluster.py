"""A warren cluster of real processes: topology declared on any node is visible and enforced on
every node, survives kill -9 and restarts, and a node cut off in a minority refuses changes.

Each test starts its own 3-node cluster (loopback, free ports, fresh data dirs) and stops every
node it started on every exit path. Waits poll a condition up to a generous deadline: nothing
here depends on how fast the machine is.
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN, REPO_ROOT

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    # Three processes started, killed and restarted per test: more than the suite's default.
    pytest.mark.timeout(180),
]

WARREN_BIN = os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren"))
DEADLINE_S = 30.0


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def eventually(check, what, deadline_s=DEADLINE_S):
    """Polls `check` until it returns a truthy value (returned) or raises nothing past the
    deadline; the last failure is reported."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - the condition is not true yet
            last = e
        time.sleep(0.05)
    raise AssertionError(f"{what}: not true after {deadline_s} s (last error: {last!r})")


class Node:
    def __init__(self, cluster, index):
        self.cluster = cluster
        self.index = index
        self.name = f"n{index + 1}"
        self.amqp, self.link, self.http = cluster.ports[index]
        self.data = os.path.join(cluster.dir, self.name)
        self.proc = None

    def start(self):
        log = open(os.path.join(self.cluster.dir, f"{self.name}.log"), "ab")
        self.proc = subprocess.Popen(
            [WARREN_BIN, "server", "--node-name", self.name,
             "--listen", f"127.0.0.1:{self.amqp}",
             "--cluster-listen", f"127.0.0.1:{self.link}",
             "--cluster-seeds", ",".join(f"127.0.0.1:{p[1]}" for p in self.cluster.ports),
             "--data-dir", self.data,
             "--management-listen", f"127.0.0.1:{self.http}"] + self.cluster.extra_args,
            stdout=log, stderr=log)
        eventually(lambda: socket.create_connection(("127.0.0.1", self.amqp), 1).close() or True,
                   f"{self.name} accepts AMQP")
        eventually(lambda: self.api("/api/overview"), f"{self.name} serves its API")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=15)
        self.proc = None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None

    def api(self, path, method="GET", body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}", method=method)
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            req.add_header("content-type", "application/json")
        with urllib.request.urlopen(req, data=data, timeout=10) as r:
            text = r.read()
            return json.loads(text) if text else {}

    def connection(self, user="guest", password="guest", vhost="/"):
        return pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=self.amqp, virtual_host=vhost,
            credentials=pika.PlainCredentials(user, password), blocked_connection_timeout=30))


class Cluster:
    def __init__(self, size=3, extra_args=()):
        self.extra_args = list(extra_args)
        self.dir = tempfile.mkdtemp(prefix="warren-cluster-")
        # One call for every node: ports from separate calls can repeat (each call's sockets
        # are closed before the next binds), and two nodes then fought over one port.
        ports = free_ports(3 * size)
        self.ports = [tuple(ports[3 * i:3 * i + 3]) for i in range(size)]
        self.nodes = [Node(self, i) for i in range(size)]

    def start(self):
        for n in self.nodes:
            n.proc = None
        for n in self.nodes:
            n.start()
        eventually(lambda: all(self.formed(n) for n in self.nodes), "the cluster formed")

    @staticmethod
    def formed(node):
        status = node.api("/api/warren/cluster")
        # Formed: a leader, every member up, and each one's name known (each node registers itself
        # in the replicated member table once it sees a leader).
        return (status["metadata"]["leader"] != 0
                and all(m["running"] for m in status["members"])
                and len(status["metadata"]["members"]) == len(status["members"]))

    def close(self):
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is not None:
                # A node that died on its own: show why.
                with open(os.path.join(self.dir, f"{n.name}.log"), errors="replace") as log:
                    print(f"--- {n.name} exited with {n.proc.returncode}:\n" + log.read()[-4000:])
            n.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


def topology(node):
    """What a node says it has, in a form that compares across nodes."""
    queues = sorted((q["vhost"], q["name"], q["durable"], q["node"]) for q in node.api("/api/queues"))
    exchanges = sorted((x["name"], x["type"], x["durable"]) for x in node.api("/api/exchanges/%2F"))
    vhosts = sorted(v["name"] for v in node.api("/api/vhosts"))
    users = sorted(u["name"] for u in node.api("/api/users"))
    return {"queues": queues, "exchanges": exchanges, "vhosts": vhosts, "users": users}


def passive_queue(node, name, vhost="/"):
    conn = node.connection(vhost=vhost)
    try:
        conn.channel().queue_declare(name, passive=True)
        return True
    finally:
        if conn.is_open:
            conn.close()


def test_topology_declared_on_one_node_is_visible_and_enforced_on_every_node(cluster):
    n1, n2, n3 = cluster.nodes
    conn = n1.connection()
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.queue_declare("orders.eu", durable=True)
    ch.queue_bind("orders.eu", "orders", "eu.#")
    conn.close()
    n1.api("/api/vhosts/shop", method="PUT")
    n1.api("/api/users/alice", method="PUT", body={"password": "s3cret", "tags": ""})
    n1.api("/api/permissions/shop/alice", method="PUT",
           body={"configure": "^$", "write": ".*", "read": ".*"})

    for node in (n2, n3):
        eventually(lambda node=node: passive_queue(node, "orders.eu"), f"queue on {node.name}")
        # The user created on n1 logs in on every node, with n1's password and permissions.
        alice = eventually(lambda node=node: node.connection("alice", "s3cret", "shop"),
                           f"alice logs in on {node.name}")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            alice.channel().queue_declare("not-allowed")
        assert refused.value.reply_code == 403
        alice.close()
        # An inequivalent redeclare is refused on every node as on the one that declared it.
        c = node.connection()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            c.channel().exchange_declare("orders", "direct", durable=True)
        assert e.value.reply_code == 406
        c.close()

    eventually(lambda: topology(n1) == topology(n2) == topology(n3), "all nodes agree")
    queues = {q["name"]: q for q in n2.api("/api/queues")}
    assert queues["orders.eu"]["node"] == "n1"
    nodes = n3.api("/api/nodes")
    assert sorted(n["name"] for n in nodes) == ["n1", "n2", "n3"]
    assert all(n["running"] for n in nodes)


def test_a_node_killed_and_restarted_catches_up_and_a_full_restart_keeps_the_topology(cluster):
    n1, n2, n3 = cluster.nodes
    n3.kill()
    conn = n1.connection()
    ch = conn.channel()
    for i in range(20):
        ch.queue_declare(f"while-n3-down-{i}", durable=True)
    conn.close()
    n3.start()
    eventually(lambda: passive_queue(n3, "while-n3-down-19"), "n3 caught up")

    # kill -9 every node, then bring them back in another order: nothing acknowledged is lost.
    before = topology(n1)
    for n in cluster.nodes:
        n.kill()
    for n in (n3, n2, n1):
        n.start()
    eventually(lambda: all(Cluster.formed(n) for n in cluster.nodes), "the cluster formed again")
    eventually(lambda: topology(n1) == topology(n2) == topology(n3) == before,
               "every node has the topology acknowledged before the kill")


def test_a_node_cut_off_in_a_minority_refuses_changes_and_the_majority_carries_on(cluster):
    n1, n2, n3 = cluster.nodes
    n2.kill()
    n3.kill()
    eventually(lambda: [n["running"] for n in n1.api("/api/nodes")] == [True, False, False],
               "n1 sees that n2 and n3 are down")
    conn = n1.connection()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
        conn.channel().queue_declare("in-the-minority", durable=True)
    assert refused.value.reply_code == 541
    assert "majority" in refused.value.reply_text
    # Never two answers for one name: the refused declare exists nowhere once the rest is back.
    n2.start()

    def declare():
        c = n1.connection()
        try:
            c.channel().queue_declare("with-a-majority", durable=True)
            return True
        finally:
            if c.is_open:
                c.close()

    eventually(declare, "a declare succeeds with two of three nodes")
    eventually(lambda: passive_queue(n2, "with-a-majority"), "n2 has it")
    for node in (n1, n2):
        assert "in-the-minority" not in [q["name"] for q in node.api("/api/queues")]


def test_an_exclusive_queue_goes_from_every_node_when_its_connection_closes(cluster):
    n1, n2, _ = cluster.nodes
    conn = n1.connection()
    name = conn.channel().queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")
    eventually(lambda: name in [q["name"] for q in n2.api("/api/queues")], "n2 sees it")
    # Another connection may not use it, on any node.
    other = n2.connection()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
        other.channel().queue_declare(name, passive=True)
    assert locked.value.reply_code == 405
    other.close()
    conn.close()
    eventually(lambda: name not in [q["name"] for q in n2.api("/api/queues")],
               "the exclusive queue is gone from n2")


def test_queues_a_node_deletes_on_its_own_go_from_every_node(cluster):
    n1, n2, n3 = cluster.nodes
    conn = n1.connection()
    ch = conn.channel()
    ch.queue_declare("auto", auto_delete=True)
    ch.queue_declare("expiring", arguments={"x-expires": 500})
    ch.queue_declare("kept", durable=True)
    tag = ch.basic_consume("auto", lambda *a: None)
    eventually(lambda: {"auto", "expiring"} <= {q["name"] for q in n2.api("/api/queues")},
               "n2 sees both")
    ch.basic_cancel(tag)
    for node in (n2, n3):
        eventually(lambda node=node: not {"auto", "expiring"} & {q["name"] for q in node.api("/api/queues")},
                   f"the auto-delete and the expired queue are gone from {node.name}")
    assert "kept" in {q["name"] for q in n3.api("/api/queues")}
    conn.close()


def test_a_node_that_fell_behind_a_snapshot_catches_up_from_it():
    # Snapshots every 20 entries: the log a node missed is gone by the time it comes back.
    c = Cluster(extra_args=["--cluster-snapshot-entries", "20"])
    try:
        c.start()
        n1, n2, n3 = c.nodes
        n3.kill()
        conn = n1.connection()
        ch = conn.channel()
        ch.exchange_declare("fanned", "fanout", durable=True)
        for i in range(100):
            ch.queue_declare(f"behind-{i}", durable=True)
            ch.queue_bind(f"behind-{i}", "fanned")
        ch.queue_delete("behind-0")
        conn.close()
        n3.start()
        eventually(lambda: topology(n3) == topology(n1), "n3 caught up from a snapshot")
        with open(os.path.join(c.dir, "n3.log"), errors="replace") as log:
            assert "metadata snapshot installed" in log.read()
        assert "behind-0" not in [q["name"] for q in n3.api("/api/queues")]
        # ... and keeps it across its own restart (its snapshot file and the log after it).
        n3.kill()
        n3.start()
        eventually(lambda: topology(n3) == topology(n1), "n3 has it after a restart")
    finally:
        c.close()


def test_a_quorum_queue_declared_as_the_cluster_forms_gets_every_member():
    """Declared on the last node the moment it accepts connections, before every node has
    registered its name in the replicated member table: the queue still gets its three
    members (each opens its replica), and every node takes and gives its messages."""
    c = Cluster()
    try:
        for n in c.nodes:
            n.start()  # waits for AMQP and the API, not for the cluster to have formed
        last = c.nodes[-1]

        def declare():
            conn = last.connection()
            try:
                conn.channel().queue_declare("early", durable=True,
                                             arguments={"x-queue-type": "quorum"})
                return True
            finally:
                if conn.is_open:
                    conn.close()

        eventually(declare, "the declare is accepted")
        q = eventually(lambda: (lambda q: q if q.get("leader") else None)(
            last.api("/api/queues/%2F/early")), "the queue has a leader")
        assert sorted(q["members"]) == ["n1", "n2", "n3"]
        for n in c.nodes:
            conn = n.connection()
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", "early", n.name.encode(), pika.BasicProperties(delivery_mode=2))
            conn.close()
        got = []
        for n in c.nodes:
            conn = n.connection()
            method, _, body = conn.channel().basic_get("early", auto_ack=True)
            assert method is not None, f"{n.name} gave nothing"
            got.append(body.decode())
            conn.close()
        assert got == ["n1", "n2", "n3"]
        for n in c.nodes:
            with open(os.path.join(c.dir, f"{n.name}.log"), errors="replace") as log:
                assert "its replica stays closed" not in log.read(), n.name
    finally:
        c.close()


def test_a_change_made_through_one_node_is_in_force_everywhere_when_it_is_answered(cluster):
    """As with RabbitMQ, whose metadata store commits on every running node: the management API
    answers a change once every running node has applied it, so a client on another node
    finds it in force at once. A policy set through n1 limits, at once, a queue that n3 hosts
    and a client of n2 publishes to; a user made through n1 logs in on n3 at once. (Before, n3
    could answer that it had applied the change a moment before it did.)"""
    n1, n2, n3 = cluster.nodes
    host = n3.connection()
    publisher = n2.connection()
    ch = publisher.channel()
    ch.confirm_delivery()
    try:
        for i in range(60):
            q = f"capped-{i}"
            host.channel().queue_declare(q)
            assert n3.api(f"/api/queues/%2F/{q}")["node"] == n3.name
            n1.api(f"/api/policies/%2F/{q}", method="PUT", body={
                "pattern": f"^{q}$", "apply-to": "queues",
                "definition": {"max-length": 1, "overflow": "reject-publish"}})
            ch.basic_publish("", q, b"first")
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", q, b"second")
        for i in range(10):
            n1.api(f"/api/users/u{i}", method="PUT", body={"password": "pw", "tags": ""})
            n1.api(f"/api/permissions/%2F/u{i}", method="PUT",
                   body={"configure": ".*", "write": ".*", "read": ".*"})
            n3.connection(f"u{i}", "pw").close()
    finally:
        publisher.close()
        host.close()


def test_a_declare_answered_through_one_node_is_found_through_every_other_at_once(cluster):
    """RabbitMQ 3.10's metadata store commits a declare on every running node before
    declare-ok, so a setup script that declares through one node and starts workers on the
    others never sees 404. Answered once a majority had it, about 3 % of these passive
    declares through another node got 404 (the node had not applied it yet)."""
    n1, n2, n3 = cluster.nodes
    declarer = n1.connection()
    others = [n2.connection(), n3.connection()]
    ch = declarer.channel()
    try:
        for i in range(200):
            ch.exchange_declare(f"setup-x{i}", "fanout")
            for conn in others:
                c = conn.channel()
                c.exchange_declare(f"setup-x{i}", passive=True)
                c.close()
            ch.queue_declare(f"setup-q{i}")
            for conn in others:
                c = conn.channel()
                c.queue_declare(f"setup-q{i}", passive=True)
                c.close()
            ch.queue_delete(f"setup-q{i}")
            for conn in others:
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
                    conn.channel().queue_declare(f"setup-q{i}", passive=True)
                assert gone.value.reply_code == 404
    finally:
        for conn in others + [declarer]:
            conn.close()
