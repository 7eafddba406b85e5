"""Maintenance mode and the probes around it, on real processes: `warren ctl drain` / `revive`
(rabbitmq-upgrade's), `await_online_quorum_plus_one`, `await_online_nodes`, `await_startup`,
`check_if_node_is_quorum_critical` (exit code 69, as RabbitMQ's CLI), the health checks a
node cut off from its cluster's majority fails, SIGTERM's handover, a management port that
cannot be bound, and `--connection-max` with `below-node-connection-limit`.

Each cluster test starts its own 3-node cluster (see test_cluster.py) and waits by polling
with deadlines, never by sleeping a fixed time.
"""

import base64
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from test_cluster import WARREN_BIN, Cluster, cluster, eventually, free_ports  # noqa: F401

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(240),
]

QUORUM = {"x-queue-type": "quorum"}
MAINTENANCE_REASON = "CONNECTION_FORCED - Node was put into maintenance mode"


def ctl(port, *args, timeout=60):
    return subprocess.run([WARREN_BIN, "ctl", "--uri", f"http://guest:guest@127.0.0.1:{port}", *args],
                          capture_output=True, text=True, timeout=timeout)


def status_of(node, path):
    """(HTTP status, JSON body) of a GET that may answer 503."""
    try:
        return 200, node.api(path)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def refuses_amqp(port):
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return False
    except ConnectionRefusedError:
        return True


def being_drained(node, name):
    return {n["name"]: n["being_drained"] for n in node.api("/api/nodes")}[name]


def leader_of(node, queue):
    return node.api(f"/api/queues/%2F/{queue}").get("leader")


def start_without_amqp(node):
    """Starts a node that is in maintenance mode: it serves its API but accepts no AMQP."""
    log = open(os.path.join(node.cluster.dir, f"{node.name}.log"), "ab")
    node.proc = subprocess.Popen(
        [WARREN_BIN, "server", "--node-name", node.name,
         "--listen", f"127.0.0.1:{node.amqp}",
         "--cluster-listen", f"127.0.0.1:{node.link}",
         "--cluster-seeds", ",".join(f"127.0.0.1:{p[1]}" for p in node.cluster.ports),
         "--data-dir", node.data,
         "--management-listen", f"127.0.0.1:{node.http}"],
        stdout=log, stderr=log)
    eventually(lambda: node.api("/api/overview"), f"{node.name} serves its API")


def test_drain_hands_leaderships_on_closes_clients_and_revive_undoes_it(cluster):
    n1, n2, n3 = cluster.nodes
    ch = n1.connection().channel()
    queues = [f"qq{i}" for i in range(4)]
    for q in queues:
        ch.queue_declare(q, durable=True, arguments=QUORUM)
    # Declared through n1 (client-local): n1 leads them all.
    for q in queues:
        eventually(lambda q=q: leader_of(n2, q) == "n1", f"n1 leads {q}")
    eventually(lambda: n2.api("/api/warren/cluster")["metadata"]["leader"] != 0, "a metadata leader")
    # Make n1 the metadata leader too, if it is not: drain must hand that on as well.
    client = n1.connection()
    client_ch = client.channel()

    r = ctl(n1.http, "drain")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "Closed 1 client connection(s)" in r.stdout or "Closed 2 client connection(s)" in r.stdout

    # Its clients were closed with RabbitMQ's reason.
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        client_ch.queue_declare("after-drain")
        client.process_data_events(2)
    assert (e.value.reply_code, e.value.reply_text) == (320, MAINTENANCE_REASON)
    # New ones are refused; the management API stays up.
    assert refuses_amqp(n1.amqp)
    assert n1.api("/api/overview")["node"] == "n1"
    # Every leadership went to another member: quorum_status from another node.
    for q in queues:
        eventually(lambda q=q: leader_of(n2, q) in ("n2", "n3"), f"{q}'s leadership left n1")
        r = ctl(n2.http, "quorum_status", q)
        assert r.returncode == 0, r.stderr
        rows = dict(line.split("\t") for line in r.stdout.splitlines()[2:])
        assert rows["n1"] == "follower", rows
    n1_id = next(m["id"] for m in n2.api("/api/warren/cluster")["members"] if m["name"] == "n1")
    eventually(lambda: n2.api("/api/warren/cluster")["metadata"]["leader"] not in (0, n1_id),
               "the metadata leadership left n1")
    # Every node sees it in maintenance; the checks say it does not serve.
    for node in (n1, n2, n3):
        eventually(lambda node=node: being_drained(node, "n1"), f"{node.name} sees n1 drained")
        assert not being_drained(node, "n2")
    assert "being drained" in ctl(n1.http, "status").stdout
    assert status_of(n1, "/api/health/checks/is-in-service") == (
        503, {"status": "failed", "reason": "this rabbit node is not currently available to serve"})
    assert status_of(n1, "/api/health/checks/ready-to-serve-clients")[0] == 503
    assert status_of(n2, "/api/health/checks/ready-to-serve-clients") == (200, {"status": "ok"})

    # New queues: none led or hosted by n1 while the others can serve.
    ch2 = n2.connection().channel()
    fresh = [f"fresh{i}" for i in range(4)]
    for q in fresh:
        ch2.queue_declare(q, durable=True,
                          arguments={**QUORUM, "x-queue-leader-locator": "balanced"})
    ch2.queue_declare("pair", durable=True,
                      arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    ch2.queue_declare("classic-balanced", durable=True,
                      arguments={"x-queue-master-locator": "min-masters"})
    for q in fresh:
        assert eventually(lambda q=q: leader_of(n2, q), f"{q} has a leader") in ("n2", "n3")
    assert "n1" not in n2.api("/api/queues/%2F/pair")["members"]
    assert n2.api("/api/queues/%2F/classic-balanced")["node"] != "n1"
    # Even a replica there that wins an election hands the leadership on.
    for q in fresh:
        assert leader_of(n3, q) != "n1"

    # A restart keeps it in maintenance until revive.
    n1.stop()
    start_without_amqp(n1)
    eventually(lambda: Cluster.formed(n1), "the cluster formed again")
    assert refuses_amqp(n1.amqp)
    assert being_drained(n1, "n1") and being_drained(n2, "n1")

    r = ctl(n1.http, "revive")
    assert r.returncode == 0, (r.stdout, r.stderr)
    conn = eventually(lambda: n1.connection(), "n1 accepts AMQP again")
    conn.close()
    for node in (n1, n2, n3):
        eventually(lambda node=node: not being_drained(node, "n1"), f"{node.name} sees n1 revived")
    assert status_of(n1, "/api/health/checks/is-in-service") == (200, {"status": "ok"})
    # It takes leaderships again: a queue declared through it is led by it.
    ch = n1.connection().channel()
    ch.queue_declare("after-revive", durable=True, arguments=QUORUM)
    eventually(lambda: leader_of(n2, "after-revive") == "n1", "n1 leads a new queue again")


def test_await_commands_and_the_quorum_critical_check_exit_69_until_it_is_safe(cluster):
    n1, n2, n3 = cluster.nodes
    ch = n1.connection().channel()
    ch.queue_declare("pair", durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    members = eventually(lambda: n1.api("/api/queues/%2F/pair").get("members"), "pair's members")
    member = next(n for n in cluster.nodes if n.name in members)
    other = next(n for n in cluster.nodes if n.name not in members)

    r = ctl(member.http, "check_if_node_is_quorum_critical")
    assert r.returncode == 69, (r.stdout, r.stderr)
    assert f"queue 'pair' in vhost '/' would lose quorum if node {member.name} is stopped" in r.stderr
    started = time.monotonic()
    r = ctl(member.http, "await_online_quorum_plus_one", "-t", "2")
    assert r.returncode == 69 and "queue 'pair' in vhost '/'" in r.stderr, (r.stdout, r.stderr)
    assert time.monotonic() - started >= 2
    assert ctl(other.http, "await_online_quorum_plus_one", "-t", "5").returncode == 0
    assert ctl(other.http, "check_if_node_is_quorum_critical").returncode == 0

    assert ctl(n1.http, "await_online_nodes", "3", "-t", "5").returncode == 0
    r = ctl(n1.http, "await_online_nodes", "4", "-t", "1")
    assert r.returncode == 69 and "3 of 4 nodes online" in r.stderr, r.stderr
    assert ctl(n1.http, "await_startup", "-t", "5").returncode == 0
    r = ctl(n1.http, "check_metadata_leader")
    assert r.returncode == 0 and "reaches metadata leader" in r.stdout, r.stderr

    # Drained, its leaderships are elsewhere: the check no longer applies, as in RabbitMQ.
    assert ctl(member.http, "drain").returncode == 0
    r = ctl(member.http, "check_if_node_is_quorum_critical")
    assert r.returncode == 0, (r.stdout, r.stderr)
    # A node that is down: await_online_nodes 3 waits, then gives up with 69.
    n3.kill()
    eventually(lambda: ctl(n1.http, "await_online_nodes", "3", "-t", "1").returncode == 69,
               "n3 seen down")


def test_a_node_cut_off_from_the_majority_fails_its_serving_checks(cluster):
    n1, n2, n3 = cluster.nodes
    for path in ("metadata-leader", "is-in-service", "alarms", "ready-to-serve-clients"):
        assert status_of(n1, f"/api/health/checks/{path}")[0] == 200, path
    assert ctl(n1.http, "check_running").returncode == 0
    n2.kill()
    n3.kill()
    eventually(lambda: status_of(n1, "/api/health/checks/metadata-leader")[0] == 503,
               "n1 knows it has no leader")
    code, body = status_of(n1, "/api/health/checks/metadata-leader")
    assert body["status"] == "failed" and "no metadata leader it can reach" in body["reason"]
    for path in ("is-in-service", "alarms", "local-alarms", "virtual-hosts",
                 "ready-to-serve-clients", f"port-listener/{n1.amqp}", "protocol-listener/amqp"):
        code, body = status_of(n1, f"/api/health/checks/{path}")
        assert (code, body["status"]) == (503, "failed"), path
    r = ctl(n1.http, "check_running")
    assert r.returncode != 0 and "no metadata leader" in r.stderr, (r.stdout, r.stderr)
    assert ctl(n1.http, "check_metadata_leader").returncode == 69
    assert ctl(n1.http, "await_startup", "-t", "1").returncode == 69
    # A majority again: it serves again.
    n2.start()
    eventually(lambda: status_of(n1, "/api/health/checks/metadata-leader")[0] == 200,
               "n1 reaches a leader again")
    assert ctl(n1.http, "check_running").returncode == 0


def measure_confirm_pause(cluster, stop):
    """Publishes with confirms through n2 to a quorum queue n1 leads, stops n1 with `stop`
    meanwhile; returns the longest wait for one confirm (s) and how many were confirmed."""
    n1, n2, _ = cluster.nodes
    ch = n1.connection().channel()
    ch.queue_declare("paused", durable=True, arguments=QUORUM)
    eventually(lambda: leader_of(n2, "paused") == "n1", "n1 leads the queue")
    publisher = n2.connection()
    pch = publisher.channel()
    pch.confirm_delivery()
    longest, confirmed = 0.0, 0
    stopper = None
    end = time.monotonic() + 60
    while time.monotonic() < end:
        started = time.monotonic()
        pch.basic_publish("", "paused", b"x", pika.BasicProperties(delivery_mode=2))
        longest = max(longest, time.monotonic() - started)
        confirmed += 1
        if confirmed == 200:
            stopper = threading.Thread(target=stop)
            stopper.start()
        if stopper is not None and not stopper.is_alive() and confirmed >= 600:
            break
    stopper.join()
    # Nothing confirmed was lost.
    n = eventually(lambda: pch.queue_declare("paused", passive=True).method.message_count >= confirmed
                   and pch.queue_declare("paused", passive=True).method.message_count,
                   "every confirmed message is in the queue")
    assert n >= confirmed
    publisher.close()
    return longest, confirmed


def test_sigterm_hands_the_leadership_over_before_the_node_stops(cluster):
    n1, n2, _ = cluster.nodes
    term_pause, _ = measure_confirm_pause(cluster, n1.stop)
    with open(os.path.join(cluster.dir, "n1.log"), errors="replace") as log:
        text = log.read()
    assert "stopping: leaderships handed over" in text
    assert "quorum_queue_leaders_left=0" in text, text[-3000:]
    assert leader_of(n2, "paused") != "n1"
    n1.start()
    eventually(lambda: Cluster.formed(n2), "n1 back")
    n2.connection().channel().queue_delete("paused")
    kill_pause, _ = measure_confirm_pause(cluster, n1.kill)
    # Reported, not judged: the figures depend on the machine.
    print(f"\nlongest confirm wait while the leader stopped: SIGTERM {term_pause * 1000:.0f} ms, "
          f"SIGKILL {kill_pause * 1000:.0f} ms")


class SingleNodeApi:
    """The management API of a node a test started itself, as Node.api for status_of."""

    def __init__(self, port):
        self.port = port

    def api(self, path):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())


def single_node(tmp, amqp, http, *extra):
    return subprocess.Popen(
        [WARREN_BIN, "server", "--listen", f"127.0.0.1:{amqp}",
         "--management-listen", f"127.0.0.1:{http}", "--data-dir", tmp, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_management_port_that_cannot_be_bound_stops_the_node_at_start():
    amqp, http = free_ports(2)
    taken = socket.socket()
    taken.bind(("127.0.0.1", http))
    taken.listen(1)
    with tempfile.TemporaryDirectory() as tmp:
        proc = single_node(tmp, amqp, http)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
        taken.close()
    assert proc.returncode != 0
    assert f"cannot listen on 127.0.0.1:{http}" in err and "management API" in err, err


def test_a_single_node_drains_its_clients_and_listeners_across_a_restart():
    amqp, http = free_ports(2)
    with tempfile.TemporaryDirectory() as tmp:
        proc = single_node(tmp, amqp, http)
        try:
            eventually(lambda: socket.create_connection(("127.0.0.1", amqp), 1).close() or True,
                       "the node accepts AMQP")
            client = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=amqp))
            assert ctl(http, "check_if_node_is_quorum_critical").returncode == 0
            r = ctl(http, "drain")
            assert r.returncode == 0 and "Closed 1 client connection(s)" in r.stdout, (r.stdout, r.stderr)
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
                client.process_data_events(2)
                client.channel()
            assert (e.value.reply_code, e.value.reply_text) == (320, MAINTENANCE_REASON)
            assert refuses_amqp(amqp)
            assert ctl(http, "check_port_listener", str(amqp)).returncode != 0
            proc.terminate()
            proc.wait(timeout=30)
            proc = single_node(tmp, amqp, http)
            eventually(lambda: ctl(http, "ping").returncode == 0, "the node is back")
            assert refuses_amqp(amqp)
            assert "being drained" in ctl(http, "status").stdout
            assert ctl(http, "revive").returncode == 0
            eventually(lambda: socket.create_connection(("127.0.0.1", amqp), 1).close() or True,
                       "the node accepts AMQP again")
            assert "not under maintenance" in ctl(http, "status").stdout
        finally:
            proc.kill()
            proc.wait()


def test_the_node_connection_limit_closes_extra_clients_and_fails_its_checks():
    amqp, http = free_ports(2)
    with tempfile.TemporaryDirectory() as tmp:
        proc = single_node(tmp, amqp, http, "--connection-max", "1")
        try:
            eventually(lambda: ctl(http, "ping").returncode == 0, "the node answers")
            node = SingleNodeApi(http)
            assert status_of(node, "/api/health/checks/below-node-connection-limit") == (
                200, {"status": "ok", "limit": 1, "connections": 0})
            first = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=amqp))
            eventually(lambda: status_of(node, "/api/health/checks/below-node-connection-limit")[0] == 503,
                       "the limit is reached")
            assert status_of(node, "/api/health/checks/below-node-connection-limit") == (
                503, {"status": "failed", "reason": "node connection limit is reached",
                      "connections": 1})
            assert status_of(node, "/api/health/checks/ready-to-serve-clients")[1]["reason"] == \
                "node connection limit is reached"
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                pika.BlockingConnection(pika.ConnectionParameters(
                    host="127.0.0.1", port=amqp, connection_attempts=1))
            first.close()
            eventually(lambda: status_of(node, "/api/health/checks/ready-to-serve-clients")
                       == (200, {"status": "ok"}), "below the limit again")
            pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=amqp)).close()
        finally:
            proc.kill()
            proc.wait()
