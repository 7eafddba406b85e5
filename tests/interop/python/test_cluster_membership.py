"""Adding nodes to a running warren cluster and forgetting stopped ones, with real processes:
rabbitmqctl's join_cluster / forget_cluster_node through `warren ctl` and the management API,
and the cluster's links in /metrics and `warren ctl status`.

Each test starts its own 3-node cluster (test_cluster.py's helpers: loopback, free ports, fresh
data dirs, every node stopped on every exit path) and polls conditions up to a deadline.
"""

import os
import subprocess
import urllib.request

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from test_cluster import WARREN_BIN, Cluster, Node, eventually, free_ports, passive_queue

pytestmark = [
    pytest.mark.skipif(IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.skipif(BROKER_KIND != "warren", reason="starts warren nodes itself"),
    pytest.mark.timeout(240),
]


class Joiner(Node):
    """A node that is not among the founding seeds: with `seeds` it asks them to be added at
    its first start; without, it waits for `warren ctl join_cluster`."""

    def __init__(self, cluster, seeds=None):
        cluster.ports.append(tuple(free_ports(3)))
        super().__init__(cluster, len(cluster.ports) - 1)
        self.seeds = seeds or []
        cluster.nodes.append(self)

    def start(self):
        log = open(os.path.join(self.cluster.dir, f"{self.name}.log"), "ab")
        args = [WARREN_BIN, "server", "--node-name", self.name,
                "--listen", f"127.0.0.1:{self.amqp}",
                "--cluster-listen", f"127.0.0.1:{self.link}",
                "--data-dir", self.data,
                "--management-listen", f"127.0.0.1:{self.http}"]
        if self.seeds:
            args += ["--cluster-seeds", ",".join(f"127.0.0.1:{n.link}" for n in self.seeds)]
        self.proc = subprocess.Popen(args + self.cluster.extra_args, stdout=log, stderr=log)
        eventually(lambda: self.api("/api/overview"), f"{self.name} serves its API")


def ctl(node, *args):
    return subprocess.run(
        [WARREN_BIN, "ctl", "--uri", f"http://guest:guest@127.0.0.1:{node.http}", *args],
        capture_output=True, text=True, timeout=60)


def member_names(node):
    return {n["name"] for n in node.api("/api/nodes")}


def running_names(node):
    return {n["name"] for n in node.api("/api/nodes") if n["running"]}


def voters(node):
    return node.api("/api/warren/cluster")["metadata"]["voters"]


def refusal(node, fn):
    """The error `fn` gets on a fresh connection: a channel error (403, 406), or for 541 the
    connection's, as AMQP has INTERNAL_ERROR close the connection."""
    conn = node.connection()
    try:
        with pytest.raises((pika.exceptions.ChannelClosedByBroker,
                            pika.exceptions.ConnectionClosedByBroker)) as e:
            fn(conn.channel())
        return e.value
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_a_node_started_with_the_seeds_joins_and_enforces_the_topology_declared_before(cluster):
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

    n4 = Joiner(cluster, seeds=[n1, n2, n3])
    n4.start()
    for node in (n1, n2, n3, n4):
        eventually(lambda node=node: running_names(node) == {"n1", "n2", "n3", "n4"},
                   f"{node.name} lists n4 as a running member")
        eventually(lambda node=node: len(voters(node)) == 4, f"{node.name} counts 4 voters")

    # What was declared before n4 existed is there, and enforced the same way.
    assert passive_queue(n4, "orders.eu")
    exchanges = {x["name"]: x["type"] for x in n4.api("/api/exchanges/%2F")}
    assert exchanges["orders"] == "topic"
    alice = n4.connection("alice", "s3cret", "shop")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        alice.channel().queue_declare("not-allowed")
    assert refused.value.reply_code == 403
    alice.close()
    inequivalent = refusal(n4, lambda ch: ch.queue_declare("orders.eu", durable=False))
    assert inequivalent.reply_code == 406

    # A change made through the new member reaches the others.
    n4.api("/api/vhosts/joined", method="PUT")
    for node in (n1, n2, n3):
        eventually(lambda node=node: "joined" in {v["name"] for v in node.api("/api/vhosts")},
                   f"vhost made on n4 visible on {node.name}")

    # kill -9 and restart: n4 is still a member with its topology, without asking again.
    n4.kill()
    n4.start()
    eventually(lambda: passive_queue(n4, "orders.eu"), "n4 has its topology after a restart")
    eventually(lambda: n4.api("/api/warren/cluster")["id"] in voters(n4), "n4 still a voter")
    conn = n4.connection()
    conn.channel().queue_declare("after-restart", durable=True)
    conn.close()
    eventually(lambda: passive_queue(n1, "after-restart"), "declared on the restarted n4")


def test_join_cluster_makes_a_waiting_node_a_member_and_refuses_what_cannot_be(cluster):
    n1, n2, n3 = cluster.nodes
    n4 = Joiner(cluster)
    n4.start()
    # Not a member yet: it serves its API, but no topology change.
    assert n4.api("/api/warren/cluster")["metadata"]["voters"] == []
    refused = refusal(n4, lambda ch: ch.queue_declare("too-early"))
    assert refused.reply_code == 541 and "not a member" in refused.reply_text

    own = ctl(n4, "join_cluster", f"127.0.0.1:{n4.link}")
    assert own.returncode != 0 and "own cluster address" in own.stderr

    joined = ctl(n4, "join_cluster", f"127.0.0.1:{n2.link}")
    assert joined.returncode == 0, joined.stderr
    assert n4.api("/api/warren/cluster")["id"] in voters(n4)
    for node in (n1, n2, n3):
        eventually(lambda node=node: "n4" in running_names(node), f"n4 a member on {node.name}")
    conn = n4.connection()
    conn.channel().queue_declare("from-n4", durable=True)
    conn.close()
    eventually(lambda: passive_queue(n1, "from-n4"), "n4's declare visible on n1")

    again = ctl(n4, "join_cluster", f"127.0.0.1:{n1.link}")
    assert again.returncode != 0 and "already a member" in again.stderr

    # A name already in the cluster is refused for good, at once.
    twin = Joiner(cluster)
    twin.name = "n2"
    twin.start()
    clash = ctl(twin, "join_cluster", f"127.0.0.1:{n1.link}")
    assert clash.returncode != 0 and "named n2 is already a member" in clash.stderr
    twin.kill()

    # 4 voters, 2 of them down: no majority, so no join.
    n5 = Joiner(cluster)
    n5.start()
    n2.kill()
    n3.kill()
    eventually(lambda: running_names(n1) == {"n1", "n4"}, "n1 sees n2 and n3 down")
    stuck = ctl(n5, "join_cluster", f"127.0.0.1:{n1.link}")
    assert stuck.returncode != 0 and "majority" in stuck.stderr, stuck.stderr
    assert "n5" not in member_names(n1)


def test_forget_cluster_node_removes_a_stopped_member_and_the_majority_shrinks(cluster):
    n1, n2, n3 = cluster.nodes
    own = ctl(n1, "forget_cluster_node", "n1")
    assert own.returncode != 0 and "runs on" in own.stderr
    unknown = ctl(n1, "forget_cluster_node", "nope")
    assert unknown.returncode != 0 and "not a member" in unknown.stderr
    running = ctl(n1, "forget_cluster_node", "n3")
    assert running.returncode != 0 and "is running" in running.stderr
    assert len(voters(n1)) == 3

    n3.stop()
    eventually(lambda: "n3" not in running_names(n1), "n1 sees n3 down")
    forgot = ctl(n1, "forget_cluster_node", "n3")
    assert forgot.returncode == 0, forgot.stderr
    for node in (n1, n2):
        eventually(lambda node=node: member_names(node) == {"n1", "n2"},
                   f"n3 gone from {node.name}'s /api/nodes")
        eventually(lambda node=node: len(voters(node)) == 2, f"{node.name} counts 2 voters")
    status = ctl(n2, "cluster_status")
    assert status.returncode == 0 and "n3" not in status.stdout, status.stdout

    # Both remaining nodes up: changes go through either.
    conn = n2.connection()
    conn.channel().queue_declare("after-forget", durable=True)
    conn.close()
    eventually(lambda: passive_queue(n1, "after-forget"), "declared on n2 after the forget")

    # Of 2 voters, 1 is no majority: with n2 down, n1 refuses (with n3 still counted it would
    # have been 2 of 3... had n3 been up; forgetting it changed what a majority is).
    n2.stop()
    eventually(lambda: "n2" not in running_names(n1), "n1 sees n2 down")
    refused = refusal(n1, lambda ch: ch.queue_declare("no-majority"))
    assert refused.reply_code == 541
    assert "1 of the cluster's 2 nodes" in refused.reply_text

    # The forgotten node restarted with its data is not taken back.
    n2.start()
    n3.start()
    eventually(lambda: running_names(n1) == {"n1", "n2"}, "n2 back, n3 not a member")
    assert len(voters(n1)) == 2
    ok = n1.connection()
    ok.channel().queue_declare("after-n3-returned", durable=True)
    ok.close()


def test_metrics_and_ctl_status_show_each_link_by_peer_name(cluster):
    n1, _, _ = cluster.nodes

    def metrics():
        with urllib.request.urlopen(f"http://127.0.0.1:{n1.http}/metrics", timeout=10) as r:
            return r.read().decode()

    def series(text, name):
        out = {}
        for line in text.splitlines():
            if line.startswith(name + "{"):
                labels, value = line[len(name):].rsplit(" ", 1)
                out[labels] = float(value)
        return out

    def with_every_link():
        text = metrics()
        rtt = series(text, "warren_cluster_link_rtt_seconds")
        return text if set(rtt) == {'{peer="n2"}', '{peer="n3"}'} and all(rtt.values()) else None

    text = eventually(with_every_link, "an rtt series for each peer")
    for name in ("warren_cluster_link_sent_bytes_total", "warren_cluster_link_received_bytes_total",
                 "warren_cluster_link_up"):
        values = series(text, name)
        assert set(values) == {'{peer="n2"}', '{peer="n3"}'}, (name, values)
        assert all(v > 0 for v in values.values()), (name, values)
    assert 0 < max(series(text, "warren_cluster_link_rtt_seconds").values()) < 1
    assert "warren_cluster_metadata_term " in text
    assert "warren_cluster_members_running 3" in text

    status = ctl(n1, "status")
    assert status.returncode == 0, status.stderr
    assert "Metadata store:" in status.stdout
    links = status.stdout.split("Links (")[1].splitlines()[1:]
    assert {line.split("\t")[0] for line in links if line} == {"n2", "n3"}
