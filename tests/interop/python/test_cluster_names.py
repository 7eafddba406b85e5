"""A cluster on real machines: nodes in network namespaces of their own (netns_cluster.py), found by
host name (each namespace's /etc/hosts), listening on every interface with --cluster-advertise,
then restarted under new addresses, one node and then all three, keeping every acknowledged change;
and the addresses an operator can get wrong, each refused at start with a message.
"""

import shutil

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
import netns_cluster
from netns_cluster import CLUSTER_PORT, NetnsCluster, eventually

NETNS_OK, NETNS_WHY = (netns_cluster.available() if BROKER_KIND == "warren"
                       else (False, "starts warren nodes itself"))

pytestmark = [
    pytest.mark.skipif(IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.skipif(not NETNS_OK, reason=NETNS_WHY),
    pytest.mark.timeout(300),
]

MESSAGES = 200


def confirmed_publish(node, queue, count, prefix):
    """Publishes `count` persistent messages with confirms through `node`; all confirmed."""
    conn = node.connection()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", queue, f"{prefix}-{i}".encode(),
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        conn.close()


def bodies(node, queue):
    """Every message body in `queue`, read with basic.get through `node` and requeued."""
    conn = node.connection()
    try:
        ch = conn.channel()
        out = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                return sorted(out)
            out.append(body.decode())
    finally:
        conn.close()


def setup_topology(node):
    conn = node.connection()
    try:
        ch = conn.channel()
        ch.queue_declare("names-qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_declare("names-classic", durable=True)
        ch.exchange_declare("names-x", "topic", durable=True)
        ch.queue_bind("names-classic", "names-x", "k.#")
    finally:
        conn.close()
    confirmed_publish(node, "names-qq", MESSAGES, "q")
    confirmed_publish(node, "names-classic", MESSAGES, "c")


def expected(prefix):
    return sorted(f"{prefix}-{i}" for i in range(MESSAGES))


def members(node):
    return {m["name"]: m for m in node.status()["members"]}


def formed_with_addresses(cluster):
    """Every node sees 3 running voters under their names, at their advertised names, and
    no other member (a phantom would be a fourth)."""
    for n in cluster.nodes:
        status = n.status()
        ms = {m["name"]: m for m in status["members"]}
        assert set(ms) == {"n1", "n2", "n3"}, status["members"]
        assert all(m["running"] and m["voter"] for m in ms.values()), status["members"]
        assert len(status["metadata"]["voters"]) == 3, status["metadata"]
        if cluster.named:
            for other in cluster.nodes:
                assert ms[other.name]["cluster"] == f"{other.host}:{CLUSTER_PORT}", ms
    return True


def check_data(cluster, via):
    assert bodies(via, "names-qq") == expected("q")
    assert bodies(via, "names-classic") == expected("c")
    for n in cluster.nodes:
        d = n.definitions()
        assert {"names-qq", "names-classic"} <= {q["name"] for q in d["queues"]}
        assert any(b["source"] == "names-x" for b in d["bindings"])


def restart_under_new_addresses(cluster, nodes, first_octet):
    for n in nodes:
        n.stop()
    for i, n in enumerate(nodes):
        n.readdress(first_octet + i)
    for n in nodes:
        n.start(wait=False)
    for n in nodes:
        eventually(lambda n=n: n.api("/api/overview"), f"{n.name} serves its API")
    cluster.wait_formed(deadline_s=60)


def test_nodes_found_by_name_re_form_after_one_and_then_every_address_changed():
    with NetnsCluster(3, named=True) as c:
        c.start()
        eventually(lambda: formed_with_addresses(c), "formed by name", 30)
        setup_topology(c.nodes[0])

        # One node back under its name on another address.
        restart_under_new_addresses(c, [c.nodes[1]], 12)
        eventually(lambda: formed_with_addresses(c), "formed after n2 moved", 60)
        check_data(c, c.nodes[1])

        # Every node at once, as a StatefulSet rescheduled: same names, same data.
        restart_under_new_addresses(c, c.nodes, 21)
        eventually(lambda: formed_with_addresses(c), "formed after all moved", 60)
        check_data(c, c.nodes[2])
        # And the cluster still changes: a majority answers.
        conn = c.nodes[0].connection()
        conn.channel().queue_declare("names-after", durable=True)
        conn.close()
        eventually(lambda: all("names-after" in {q["name"] for q in n.definitions()["queues"]}
                               for n in c.nodes), "a new declare everywhere")


def test_a_cluster_configured_by_ip_re_forms_when_every_address_changes_with_new_seeds():
    """The stored addresses all stale and the new ones only in --cluster-seeds: each node asks
    the seeds who they are."""
    with NetnsCluster(3) as c:
        c.start()
        setup_topology(c.nodes[0])
        restart_under_new_addresses(c, c.nodes, 31)
        eventually(lambda: formed_with_addresses(c), "formed after all moved", 60)
        # Each node re-registers its new address; every member table follows.
        now = {f"{x.cluster_ip}:{CLUSTER_PORT}" for x in c.nodes}
        eventually(lambda: all({m["cluster"] for m in members(n).values()} == now
                               for n in c.nodes), "every member table has the new addresses")
        check_data(c, c.nodes[1])


def test_addresses_an_operator_gets_wrong_are_refused_at_start_with_why():
    with NetnsCluster(3, named=True) as c:
        c.create_network()
        n1, n2, n3 = c.nodes
        good = f"{n1.host}:{CLUSTER_PORT},{n2.host}:{CLUSTER_PORT},{n3.host}:{CLUSTER_PORT}"

        # A seed whose name resolves nowhere: a first start cannot tell whether it is itself.
        code, out = n1.run_until_exit(
            "--cluster-seed-resolve-timeout-s", "1",
            seeds=f"{n1.host}:{CLUSTER_PORT},nosuch.warren.test:{CLUSTER_PORT}")
        assert code != 0, out
        assert "nosuch.warren.test" in out and "resolve" in out, out

        # This node listed twice (by name and by address): it would count twice.
        code, out = n1.run_until_exit(
            seeds=f"{n1.host}:{CLUSTER_PORT},{n1.cluster_ip}:{CLUSTER_PORT},{n2.host}:{CLUSTER_PORT}")
        assert code != 0, out
        assert "once in --cluster-seeds" in out, out

        # Advertising another node's name.
        code, out = n1.run_until_exit(advertise=f"{n2.host}:{CLUSTER_PORT}", seeds=good)
        assert code != 0, out
        assert "--cluster-advertise" in out and "not an address of this machine" in out, out

        # Nothing above left an identity behind: the same node starts right after.
        c.start_nodes()
        eventually(lambda: formed_with_addresses(c), "formed by name", 30)

        # A node restarted under a name another member holds (renamed by mistake): it stops
        # with why, and the others carry on.
        n3.stop()
        code, out = n3.run_until_exit(name="n2", seeds=good, timeout_s=60)
        assert code == 78, out
        assert "named n2" in out and "--node-name" in out, out
        conn = n1.connection()
        conn.channel().queue_declare("names-still-works", durable=True)
        conn.close()

        # A node whose data directory was lost comes back with the id the seeds give it: it
        # stops with what to do rather than panic on a log shorter than it acknowledged.
        shutil.rmtree(n3.data)
        code, out = n3.run_until_exit(seeds=good, timeout_s=60)
        assert code == 76, out
        assert "data directory was lost" in out and "forget_cluster_node n3" in out, out
        assert "panicked" not in out, out
