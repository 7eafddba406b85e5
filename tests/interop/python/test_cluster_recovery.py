"""A cluster that lost its majority for good, recovered as rabbitmqctl's force_boot does, and
a member returned to its virgin state as rabbitmqctl's reset does, with real processes:
`warren ctl force_boot` on a stopped node's data makes it the only voter at its next start;
`warren ctl reset` makes a member leave, stop and delete its data, to come back as a new node.

Each test starts its own 3-node cluster (test_cluster.py's helpers: loopback, free ports, fresh
data dirs, every node stopped on every exit path) and polls conditions up to a deadline.
"""

import os
import shutil
import subprocess

import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from test_cluster import WARREN_BIN, Cluster, eventually, passive_queue
from test_cluster_membership import ctl, member_names, refusal, running_names, voters

pytestmark = [
    pytest.mark.skipif(IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.skipif(BROKER_KIND != "warren", reason="starts warren nodes itself"),
    pytest.mark.timeout(240),
]


def force_boot(*args):
    return subprocess.run([WARREN_BIN, "ctl", "force_boot", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_force_boot_makes_the_last_node_the_only_voter_and_keeps_its_data(cluster):
    n1, n2, n3 = cluster.nodes
    conn = n1.connection()
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    ch.queue_declare("orders.eu", durable=True)
    ch.queue_bind("orders.eu", "orders", "eu.#")
    conn.close()
    for node in cluster.nodes:
        eventually(lambda node=node: passive_queue(node, "orders.eu"), f"{node.name} has it")

    # Two nodes lost for good; the third cannot change anything alone.
    n2.kill()
    n3.kill()
    shutil.rmtree(n2.data)
    shutil.rmtree(n3.data)
    eventually(lambda: running_names(n1) == {"n1"}, "n1 sees n2 and n3 down")
    refused = refusal(n1, lambda ch: ch.queue_declare("alone"))
    assert refused.reply_code == 541

    # Restarted as it is, it still waits for its peers.
    n1.stop()
    n1.start()
    refused = refusal(n1, lambda ch: ch.queue_declare("alone"))
    assert refused.reply_code == 541
    n1.stop()

    wrong = force_boot("--data-dir", cluster.dir)
    assert wrong.returncode != 0 and "node.json" in wrong.stderr, wrong.stderr
    forced = force_boot("--data-dir", n1.data)
    assert forced.returncode == 0, forced.stderr
    assert "reset them" in forced.stdout
    marker = os.path.join(n1.data, "meta", "cluster", "force_boot")
    assert os.path.isfile(marker)

    n1.start()
    eventually(lambda: voters(n1) == [1], "n1 the only voter")
    eventually(lambda: member_names(n1) == {"n1"}, "n2 and n3 removed from the members")
    eventually(lambda: not os.path.exists(marker), "the marker deleted once done")
    with open(os.path.join(cluster.dir, "n1.log"), errors="replace") as f:
        assert "FORCE BOOT" in f.read()

    # The data is kept, and topology changes go through again.
    assert passive_queue(n1, "orders.eu")
    conn = n1.connection()
    ch = conn.channel()
    ch.queue_declare("after-force-boot", durable=True)
    ch.basic_publish("orders", "eu.paris", b"kept")
    conn.close()

    # A plain restart afterwards replays the same configuration: no force, no waiting.
    n1.stop()
    n1.start()
    assert voters(n1) == [1]
    assert passive_queue(n1, "after-force-boot")
    conn = n1.connection()
    conn.channel().queue_declare("after-restart", durable=True)
    conn.close()


def node_id(node):
    return node.api("/api/warren/cluster")["id"]


def test_reset_leaves_the_cluster_deletes_the_data_and_comes_back_as_a_new_node(cluster):
    n1, n2, n3 = cluster.nodes
    conn = n1.connection()
    conn.channel().queue_declare("before-reset", durable=True)
    conn.close()
    eventually(lambda: passive_queue(n3, "before-reset"), "n3 has the queue")
    identity = os.path.join(n3.data, "meta", "cluster", "node.json")
    assert node_id(n3) == 3

    # Without a majority the node cannot leave: refused, nothing deleted, still running.
    n1.stop()
    n2.stop()
    eventually(lambda: running_names(n3) == {"n3"}, "n3 sees n1 and n2 down")
    refused = ctl(n3, "reset")
    assert refused.returncode != 0
    assert "cannot leave the cluster without a majority" in refused.stderr, refused.stderr
    assert n3.proc.poll() is None
    assert os.path.isfile(identity)
    n1.start()
    n2.start()
    eventually(lambda: running_names(n1) == {"n1", "n2", "n3"}, "all three back")

    reset = ctl(n3, "reset")
    assert reset.returncode == 0, reset.stderr
    assert n3.proc.wait(timeout=30) == 0
    n3.proc = None
    assert not os.path.exists(identity)
    for node in (n1, n2):
        eventually(lambda node=node: member_names(node) == {"n1", "n2"},
                   f"n3 gone from {node.name}'s members")
        eventually(lambda node=node: len(voters(node)) == 2, f"{node.name} counts 2 voters")

    # Started again with the same command line (its address still among the seeds), it is a
    # new node: a joiner's id, the cluster's topology, a voter again.
    n3.start()
    eventually(lambda: member_names(n1) == {"n1", "n2", "n3"}, "n3 a member again")
    eventually(lambda: len(voters(n1)) == 3, "three voters again")
    assert node_id(n3) not in (1, 2, 3)
    eventually(lambda: passive_queue(n3, "before-reset"), "n3 has the cluster's topology")
    conn = n3.connection()
    conn.channel().queue_declare("after-reset", durable=True)
    conn.close()
    eventually(lambda: passive_queue(n1, "after-reset"), "declared on the new n3")
