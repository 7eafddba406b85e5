"""A warren cluster whose links are TLS with mutual authentication (--cluster-tls-*), with real
processes: three nodes with certificates the cluster's CA signed form a cluster and replicate a
quorum queue over TLS; a node whose certificate another CA signed cannot join, and a process
that speaks plain TCP to the cluster port gets nothing through; each refusal is one log line on
the member and a count in its /metrics.

Certificates are made afresh per run (tls_pki.py); each test starts its own nodes on free
loopback ports and stops them on every exit path.
"""

import os
import socket
import struct
import subprocess
import json

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from test_cluster import WARREN_BIN, Cluster, Node, eventually, free_ports
from tls_pki import Pki, issue_node

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(240),
]


def tls_args(node_cert, ca_file):
    return ["--cluster-tls-cert", node_cert.cert, "--cluster-tls-key", node_cert.key,
            "--cluster-tls-ca", ca_file]


class TlsCluster(Cluster):
    """Three founding nodes, each with a certificate of its own from the cluster's CA."""

    def __init__(self, pki):
        super().__init__()
        self.pki = pki
        for n in self.nodes:
            n.cert = issue_node(pki.dir, f"node-{n.name}", pki.ca, n.name)

    def start(self):
        for n in self.nodes:
            n.proc = None
        for n in self.nodes:
            # Each node its own certificate: the extra arguments are per node here.
            self.extra_args = tls_args(n.cert, self.pki.ca.cert)
            n.start()
        eventually(lambda: all(self.formed(n) for n in self.nodes), "the TLS cluster formed")


class Outsider(Node):
    """A node that is not among the seeds, waiting for `warren ctl join_cluster`, with the
    cluster TLS arguments it is given."""

    def __init__(self, cluster, args):
        cluster.ports.append(tuple(free_ports(3)))
        super().__init__(cluster, len(cluster.ports) - 1)
        self.args = args
        cluster.nodes.append(self)

    def start(self):
        log = open(os.path.join(self.cluster.dir, f"{self.name}.log"), "ab")
        self.proc = subprocess.Popen(
            [WARREN_BIN, "server", "--node-name", self.name,
             "--listen", f"127.0.0.1:{self.amqp}",
             "--cluster-listen", f"127.0.0.1:{self.link}",
             "--data-dir", self.data,
             "--management-listen", f"127.0.0.1:{self.http}"] + self.args,
            stdout=log, stderr=log)
        eventually(lambda: self.api("/api/overview"), f"{self.name} serves its API")


def ctl(node, *args):
    return subprocess.run(
        [WARREN_BIN, "ctl", "--uri", f"http://guest:guest@127.0.0.1:{node.http}", *args],
        capture_output=True, text=True, timeout=60)


def refused(node, reason):
    """warren_cluster_tls_refused_total{reason} in the node's /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'warren_cluster_tls_refused_total{{reason="{reason}"}}'):
                return float(line.split()[-1])
    raise AssertionError(f"no warren_cluster_tls_refused_total{{reason={reason}}} in /metrics")


def log_of(node):
    with open(os.path.join(node.cluster.dir, f"{node.name}.log"), errors="replace") as f:
        return f.read()


@pytest.fixture
def pki(tmp_path):
    return Pki(str(tmp_path / "pki"))


@pytest.fixture
def cluster(pki):
    c = TlsCluster(pki)
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_a_quorum_queue_replicates_over_tls_links_and_survives_its_leaders_death(cluster):
    nodes = {n.name: n for n in cluster.nodes}
    for n in cluster.nodes:
        assert "cluster links use TLS with mutual authentication" in log_of(n)
        assert "cluster link up (TLS)" in log_of(n)
    conn = nodes["n1"].connection()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("tls-replicated", durable=True, arguments={"x-queue-type": "quorum"})

    def queue(via):
        [q] = [q for q in via.api("/api/queues") if q["name"] == "tls-replicated"]
        return q

    eventually(lambda: queue(nodes["n2"])["leader"] in nodes, "the queue's group elected a leader")
    assert sorted(queue(nodes["n2"])["members"]) == ["n1", "n2", "n3"]
    for i in range(200):
        ch.basic_publish("", "tls-replicated", f"m{i}".encode(),
                         pika.BasicProperties(delivery_mode=2))
    conn.close()
    # Confirmed means a majority has it: kill the leader, and the others still hold every one.
    leader = queue(nodes["n2"])["leader"]
    nodes[leader].kill()
    survivor = nodes["n3" if leader != "n3" else "n2"]
    eventually(lambda: queue(survivor)["leader"] not in (leader, None, ""),
               "a new leader among the survivors")
    conn = survivor.connection()
    ch = conn.channel()
    got = []
    for _ in range(200):
        method, _, body = eventually(lambda: (lambda r: r if r[0] else None)(
            ch.basic_get("tls-replicated", auto_ack=True)), "the next message")
        got.append(body.decode())
    conn.close()
    assert got == [f"m{i}" for i in range(200)]
    for n in cluster.nodes:
        if n.proc is not None:
            assert refused(n, "untrusted_certificate") == 0
            assert refused(n, "not_tls") == 0


def test_a_node_with_a_foreign_certificate_cannot_join_and_plain_tcp_gets_nothing_through(
        cluster, pki):
    n1, n2, n3 = cluster.nodes
    # A node whose certificate another CA signed; it trusts the cluster's CA, so that the
    # member's refusal of its certificate, not its own of the member's, is what stops it.
    foreign = issue_node(pki.dir, "foreign-node", pki.other_ca, "n4")
    bundle = os.path.join(pki.dir, "both-cas.pem")
    with open(bundle, "w") as out:
        for path in (pki.other_ca.cert, pki.ca.cert):
            with open(path) as f:
                out.write(f.read())
    n4 = Outsider(cluster, tls_args(foreign, bundle))
    n4.start()
    joined = ctl(n4, "join_cluster", f"127.0.0.1:{n1.link}")
    assert joined.returncode != 0
    assert "refused this node" in joined.stderr and "does not trust" in joined.stderr, \
        joined.stderr
    assert refused(n1, "untrusted_certificate") >= 1
    assert "cluster link refused: the peer presented a certificate the cluster's CA did not " \
           "sign" in log_of(n1)
    for n in (n1, n2, n3):
        assert {m["name"] for m in n.api("/api/nodes")} == {"n1", "n2", "n3"}
    assert n4.api("/api/warren/cluster")["metadata"]["voters"] == []

    # A node without cluster TLS: its hello is not TLS, refused before any frame is read.
    n5 = Outsider(cluster, [])
    n5.start()
    plain = ctl(n5, "join_cluster", f"127.0.0.1:{n2.link}")
    assert plain.returncode != 0
    eventually(lambda: refused(n2, "not_tls") >= 1, "n2 counts the plain node's link")
    assert "did not start a TLS handshake" in log_of(n2)

    # A forged hello and Raft message over plain TCP: the node closes, and nothing changes.
    info = {"id": 99, "name": "forger", "cluster": "127.0.0.1:1", "amqp": "127.0.0.1:1",
            "management": None}
    hello = bytes([1]) + json.dumps({"info": info, "boot": 1}).encode()
    with socket.create_connection(("127.0.0.1", n3.link), timeout=10) as s:
        s.sendall(struct.pack("<I", len(hello)) + hello)
        try:
            answer = s.recv(64)
        except ConnectionResetError:
            # Closed with our bytes unread: the kernel answers with a reset.
            answer = b""
        assert answer == b"", "the member closes a link that is not TLS"
    eventually(lambda: refused(n3, "not_tls") >= 1, "n3 counts the forger")
    for n in (n1, n2, n3):
        assert {m["name"] for m in n.api("/api/nodes")} == {"n1", "n2", "n3"}
        assert all(m["running"] for m in n.api("/api/warren/cluster")["members"])
