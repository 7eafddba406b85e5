"""A warren cluster under network partitions, paused processes and kill -9, with real processes in
network namespaces (netns_cluster.py): the side without a majority refuses topology changes (541
over AMQP, 503 over HTTP) while the majority carries on, and once the faults end every node holds
the same definitions (`GET /api/definitions`, compared whole) with every acknowledged change in it.

Each test starts its own 3-node cluster and removes its processes and namespaces on every exit
path. Waits poll up to generous deadlines; nothing depends on the machine's speed. The longer,
randomised fault schedule is scripts/cluster-faults.py (not run in CI).
"""

import threading
import time

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
import netns_cluster
from netns_cluster import NetnsCluster, eventually

NETNS_OK, NETNS_WHY = (netns_cluster.available() if BROKER_KIND == "warren"
                       else (False, "starts warren nodes itself"))

pytestmark = [
    pytest.mark.skipif(IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.skipif(not NETNS_OK, reason=NETNS_WHY),
    # Three processes, namespaces, an election or two and a heal per test.
    pytest.mark.timeout(240),
]

# A refusal for want of a majority comes at once; one that waited for it would take this long
# (the cluster's PROPOSE_TIMEOUT), so an answer sooner than this was not a timeout.
PROPOSE_TIMEOUT_S = 5.0
AGREE_DEADLINE_S = 60.0


@pytest.fixture
def cluster():
    with NetnsCluster(3) as c:
        c.start()
        yield c
        # A node the test did not kill must still run: a fault must never crash one.
        died = [n for n in c.nodes if n.proc is not None and n.proc.poll() is not None]
        if died:
            pytest.fail("\n".join(f"{n.name} exited with {n.proc.returncode}:\n{n.log_tail()}"
                                   for n in died))


def normalised(definitions):
    """The parts of a definitions document that must be equal on every node."""
    return {k: definitions[k] for k in
            ("users", "vhosts", "permissions", "queues", "exchanges", "bindings")}


def wait_until_all_agree(cluster, deadline_s=AGREE_DEADLINE_S):
    """Polls every node's definitions until they are equal; returns them. On failure, says
    which sections differ between which nodes."""
    seen = {}

    def agree():
        seen.clear()
        for n in cluster.nodes:
            seen[n.name] = normalised(n.definitions())
        first = next(iter(seen.values()))
        return first if all(d == first for d in seen.values()) else None

    try:
        return eventually(agree, "every node has the same definitions", deadline_s, 0.25)
    except AssertionError:
        names = list(seen)
        diffs = []
        for name in names[1:]:
            for section, entries in seen[name].items():
                ours, theirs = entries, seen[names[0]][section]
                if ours != theirs:
                    only_here = [e for e in ours if e not in theirs]
                    only_there = [e for e in theirs if e not in ours]
                    diffs.append(f"{section}: only on {name}: {only_here[:5]}; "
                                 f"only on {names[0]}: {only_there[:5]}")
        raise AssertionError("nodes disagree after the deadline:\n" + "\n".join(diffs))


def names(definitions, section):
    return {e["name"] for e in definitions[section]}


def declare(node, queues=(), exchange=None, key="k"):
    """Declares durable queues (bound to `exchange` if given) on `node`; returns the names."""
    conn = node.connection()
    try:
        ch = conn.channel()
        if exchange:
            ch.exchange_declare(exchange, "topic", durable=True)
        for q in queues:
            ch.queue_declare(q, durable=True)
            if exchange:
                ch.queue_bind(q, exchange, key)
        return list(queues)
    finally:
        if conn.is_open:
            conn.close()


def sees_the_others_down(node):
    others = [m["running"] for m in node.status()["members"] if m["name"] != node.name]
    return others and not any(others)


def test_a_partitioned_node_refuses_changes_while_the_majority_carries_on_then_all_agree(cluster):
    before = declare(cluster.nodes[0], ["before-partition"], exchange="shared")
    cut = cluster.leader()
    majority = [n for n in cluster.nodes if n is not cut]
    cut.partition()
    eventually(lambda: sees_the_others_down(cut), f"{cut.name} sees it is cut off")

    # AMQP on the cut-off node: 541 at once, naming the reason.
    conn = cut.connection()
    ch = conn.channel()
    # Reads need no majority: the topology it had is still there. (A passive declare of a queue
    # hosted on a node it cannot reach is 404 "home node ... is down", as in RabbitMQ.)
    ch.exchange_declare("shared", passive=True)
    asked = time.monotonic()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
        ch.queue_declare("declared-in-the-minority", durable=True)
    assert time.monotonic() - asked < PROPOSE_TIMEOUT_S
    assert refused.value.reply_code == 541
    assert "majority" in refused.value.reply_text
    conn = cut.connection()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
        conn.channel().queue_bind(before[0], "shared", "bound-in-the-minority")
    assert refused.value.reply_code == 541

    # HTTP on the cut-off node: 503 for vhosts, users and permissions alike.
    status, body = cut.api_status("/api/vhosts/minority-vhost", "PUT")
    assert status == 503, body
    assert "majority" in body["reason"]
    status, _ = cut.api_status("/api/users/minority-user", "PUT",
                               {"password": "p", "tags": ""})
    assert status == 503
    status, _ = cut.api_status("/api/permissions/%2F/guest", "PUT",
                               {"configure": "^$", "write": ".*", "read": ".*"})
    assert status == 503

    # The majority elects a leader among itself and accepts changes through either node.
    cluster.leader(among=majority)
    eventually(lambda: declare(majority[0], ["declared-in-the-majority"], exchange="shared"),
               "the majority accepts a declare")
    majority[1].api("/api/vhosts/majority-vhost", "PUT")
    majority[1].api("/api/users/majority-user", "PUT", {"password": "p", "tags": "management"})

    cut.heal()
    agreed = wait_until_all_agree(cluster)
    queues = names(agreed, "queues")
    assert {"before-partition", "declared-in-the-majority"} <= queues
    assert "declared-in-the-minority" not in queues
    assert "majority-vhost" in names(agreed, "vhosts")
    assert "minority-vhost" not in names(agreed, "vhosts")
    assert "majority-user" in names(agreed, "users")
    assert "minority-user" not in names(agreed, "users")
    assert not [b for b in agreed["bindings"] if b["routing_key"] == "bound-in-the-minority"]
    guest = [p for p in agreed["permissions"] if p["user"] == "guest" and p["vhost"] == "/"]
    assert guest[0]["configure"] == ".*", "the refused permission change took effect"
    # ... and the healed node accepts changes again.
    eventually(lambda: declare(cut, ["declared-after-heal"]), f"{cut.name} accepts a declare")
    assert "declared-after-heal" in names(wait_until_all_agree(cluster), "queues")


def test_a_paused_leader_is_replaced_and_catches_up_once_it_resumes(cluster):
    declare(cluster.nodes[0], ["before-pause"])
    paused = cluster.leader()
    rest = [n for n in cluster.nodes if n is not paused]
    paused.pause()
    # Until their failure detector (1 s) and an election (1-2 s) run, they still name the old one.
    eventually(lambda: cluster.leader(among=rest, deadline_s=1) is not paused,
               f"{[n.name for n in rest]} elect a leader other than the paused {paused.name}")
    acked = []
    for i, n in enumerate(rest * 3):
        acked += eventually(lambda n=n, i=i: declare(n, [f"while-paused-{i}"], exchange="paused-x"),
                            f"{n.name} accepts a declare while {paused.name} is paused")
    rest[0].api("/api/users/while-paused", "PUT", {"password": "p", "tags": ""})

    paused.resume()
    agreed = wait_until_all_agree(cluster)
    assert set(acked) | {"before-pause"} <= names(agreed, "queues")
    assert "while-paused" in names(agreed, "users")
    # It follows the new leader rather than leading a term of its own, and accepts changes.
    assert cluster.leader() is not None
    eventually(lambda: declare(paused, ["after-resume"]), f"{paused.name} accepts a declare")
    assert "after-resume" in names(wait_until_all_agree(cluster), "queues")


def test_a_node_cut_from_the_leader_only_does_not_disrupt_it_and_catches_up_after(cluster):
    leader = cluster.leader()
    cut, bridge = [n for n in cluster.nodes if n is not leader]
    term = leader.status()["metadata"]["term"]
    leader.cut(cut)
    # The cut node reaches the bridge, a majority with itself, but the bridge still hears the
    # leader and so denies it a vote (pre-vote, check-quorum): no election, no disruption.
    acked = []
    for n in (leader, bridge, leader, bridge):
        acked += declare(n, [f"bridged-{len(acked)}"], exchange="bridged-x")
    time.sleep(3)  # longer than an election timeout: a disruptive election would happen by now
    assert cluster.leader(among=[leader, bridge]) is leader
    assert leader.status()["metadata"]["term"] == term
    # Its own changes cannot reach the leader: refused (541), never acknowledged.
    conn = cut.connection()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
        conn.channel().queue_declare("declared-cut-from-the-leader", durable=True)
    assert refused.value.reply_code == 541

    leader.heal()
    agreed = wait_until_all_agree(cluster)
    assert set(acked) <= names(agreed, "queues")
    eventually(lambda: declare(cut, ["declared-after-the-cut"]), f"{cut.name} accepts a declare")
    assert "declared-after-the-cut" in names(wait_until_all_agree(cluster), "queues")


# Each trial below resurrects the queue about half the time while the bug is there.
RESURRECTION_TRIALS = 6


@pytest.mark.xfail(strict=False, reason=(
    "a proposal re-proposed after 500 ms (metadata.rs retry_proposals) is in the log twice: the "
    "first copy to apply answers the client, a stale copy buffered at the paused old leader is "
    "forwarded to the new one and applied after the client's next change: the deleted queue "
    "comes back. Needs (origin, incarnation, request) dedupe at apply, kept in snapshots."))
def test_a_deleted_queue_stays_deleted_after_the_paused_old_leader_returns(cluster):
    for trial in range(RESURRECTION_TRIALS):
        old = cluster.leader()
        client_node = next(n for n in cluster.nodes if n is not old)
        name = f"deleted-{trial}"
        conn = client_node.connection(timeout_s=15)
        ch = conn.channel()
        # The declare goes to the leader, which answers nothing now; it is proposed again
        # every 500 ms until a new leader commits it.
        old.pause()
        try:
            ch.queue_declare(name, durable=True)
            ch.queue_delete(name)
        finally:
            old.resume()
        conn.close()
        wait_until_all_agree(cluster)
        time.sleep(2)  # what the old leader had buffered is forwarded and committed by now
        agreed = wait_until_all_agree(cluster)
        assert name not in names(agreed, "queues"), (
            f"trial {trial}: {name} was declared, then deleted (both acknowledged on "
            f"{client_node.name}), and came back once {old.name} resumed")


class Declarer(threading.Thread):
    """Declares queues on one node, one after another, until stopped; remembers each one the
    broker acknowledged. Failures (the node is down, no majority, outcome unknown) are retried on
    a new connection with the next name."""

    def __init__(self, node, prefix):
        super().__init__(daemon=True)
        self.node, self.prefix = node, prefix
        self.acked, self.failed = [], 0
        self.stopping = threading.Event()

    def run(self):
        i = 0
        while not self.stopping.is_set():
            conn = None
            try:
                conn = self.node.connection(timeout_s=5)
                ch = conn.channel()
                while not self.stopping.is_set():
                    name = f"{self.prefix}-{i}"
                    i += 1
                    ch.queue_declare(name, durable=True)
                    self.acked.append(name)
            except Exception:  # noqa: BLE001 - any failure: not acknowledged, try again
                self.failed += 1
                time.sleep(0.2)
            finally:
                if conn is not None and conn.is_open:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001
                        pass

    def stop(self):
        self.stopping.set()
        self.join(timeout=30)


def test_topology_declared_across_kills_and_restarts_is_the_same_on_every_node(cluster):
    n1, n2, n3 = cluster.nodes
    acked = declare(n1, [f"start-{i}" for i in range(5)], exchange="kept")
    # A client keeps declaring on n2 through everything below.
    declarer = Declarer(n2, "steady")
    declarer.start()
    try:
        n3.kill()
        acked += eventually(lambda: declare(n1, ["n3-down"]), "n1 declares with n3 down")
        n3.start()
        leader = cluster.leader()
        leader.kill()
        survivors = [n for n in cluster.nodes if n is not leader]
        acked += eventually(lambda: declare(survivors[0], ["leader-killed"]),
                            "the survivors declare with the leader killed")
        leader.start()
        # Every node killed at once and brought back in another order.
        for n in cluster.nodes:
            n.kill()
        for n in (n3, n1, n2):
            n.start(wait=False)
        for n in cluster.nodes:
            eventually(lambda n=n: n.api("/api/overview"), f"{n.name} is back")
        cluster.wait_formed()
        time.sleep(1)
    finally:
        declarer.stop()
    print(f"declarer: {len(declarer.acked)} acknowledged, {declarer.failed} failures")
    assert declarer.acked, "the declaring client never got an answer"
    agreed = wait_until_all_agree(cluster)
    missing = set(acked + declarer.acked) - names(agreed, "queues")
    assert not missing, f"acknowledged but lost: {sorted(missing)}"
    assert {"start-0", "start-4"} <= {b["destination"] for b in agreed["bindings"]}
