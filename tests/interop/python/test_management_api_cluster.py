"""The management API in a warren cluster: what it changes goes the way an AMQP client's change
goes. A declare, bind or delete made over HTTP on one node is replicated to every node; publish,
get and purge of a queue hosted on another node reach that node; and a queue whose node is down
is refused with AMQP's 404 "home node ... is down or inaccessible". Connections, channels and
consumers are listed cluster-wide, as RabbitMQ lists them: any node shows every node's, each
naming its node, and closes a connection whichever node it is on.

Starts its own 3-node cluster (test_cluster.py's harness: loopback, free ports, fresh data dirs).
"""

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from test_cluster import cluster, eventually, passive_queue  # noqa: F401 - the fixture
from conftest import BROKER_KIND, IN_CLUSTER_RUN

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(180),
]


def call(node, method, path, body=None):
    """(status, parsed body) of a request to `node`'s management API as guest."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{node.http}{path}", data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return r.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, (json.loads(text) if text else None)


def test_api_changes_are_replicated_and_reach_queues_on_other_nodes(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes
    # Declared over HTTP on n2: every node has them.
    assert call(n2, "PUT", "/api/exchanges/%2F/mx", {"type": "topic", "durable": True})[0] == 201
    assert call(n2, "PUT", "/api/queues/%2F/mq", {"durable": True})[0] == 201
    for node in (n1, n3):
        eventually(lambda node=node: passive_queue(node, "mq"), f"mq on {node.name}")
        eventually(lambda node=node: any(x["name"] == "mx" for x in
                                         call(node, "GET", "/api/exchanges/%2F")[1]),
                   f"mx on {node.name}")
    # The same conflict as over AMQP, found by the cluster's application of the declare.
    status, body = call(n3, "PUT", "/api/queues/%2F/mq", {"durable": False})
    assert (status, body["reason"]) == (
        400, "inequivalent arg 'durable' for queue 'mq' in vhost '/': "
             "received 'false' but current is 'true'")

    # A queue n1 hosts, reached through n2's API.
    conn = n1.connection()
    conn.channel().queue_declare("ledger", durable=True)
    conn.close()
    eventually(lambda: call(n2, "GET", "/api/queues/%2F/ledger")[0] == 200, "ledger on n2")
    assert call(n2, "GET", "/api/queues/%2F/ledger")[1]["node"] == "n1"
    status, _ = call(n2, "POST", "/api/bindings/%2F/e/mx/q/ledger", {"routing_key": "eu.*"})
    assert status == 201
    eventually(lambda: any(b["source"] == "mx" for b in
                           call(n1, "GET", "/api/queues/%2F/ledger/bindings")[1]),
               "the binding on n1")
    publish = {"properties": {"delivery_mode": 2}, "routing_key": "eu.fr",
               "payload": "entry-1", "payload_encoding": "string"}
    assert call(n2, "POST", "/api/exchanges/%2F/mx/publish", publish) == (200, {"routed": True})
    publish["payload"] = "entry-2"
    assert call(n2, "POST", "/api/exchanges/%2F/mx/publish", publish) == (200, {"routed": True})

    def on_n1():
        c = n1.connection()
        try:
            return c.channel().queue_declare("ledger", passive=True).method.message_count
        finally:
            c.close()
    eventually(lambda: on_n1() == 2, "both entries on n1")
    get = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
    status, got = call(n2, "POST", "/api/queues/%2F/ledger/get", get)
    assert status == 200
    assert [(m["payload"], m["routing_key"], m["exchange"]) for m in got] == [
        ("entry-1", "eu.fr", "mx")]
    eventually(lambda: on_n1() == 1, "the entry taken by n2's get gone from n1")
    assert call(n2, "DELETE", "/api/queues/%2F/ledger/contents")[0] == 204
    assert on_n1() == 0

    # n1 down: its queue is refused as AMQP refuses it.
    n1.kill()
    down = "home node 'n1' of durable queue 'ledger' in vhost '/' is down or inaccessible"
    eventually(lambda: call(n2, "POST", "/api/queues/%2F/ledger/get", get) == (
        404, {"error": "not_found", "reason": f"NOT_FOUND - {down}"}), "get refused on n2")
    assert call(n2, "DELETE", "/api/queues/%2F/ledger/contents") == (
        404, {"error": "not_found", "reason": down})

    # Deleted over HTTP on n3: gone from n2 too (a majority, n2 and n3, still runs).
    assert call(n3, "DELETE", "/api/queues/%2F/mq")[0] == 204
    eventually(lambda: call(n2, "GET", "/api/queues/%2F/mq")[0] == 404, "mq gone from n2")


def client(node, name):
    """A connection to `node` named `name`, with a consumer on an exclusive queue `name`."""
    c = pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=node.amqp, client_properties={"connection_name": name},
        credentials=pika.PlainCredentials("guest", "guest"), blocked_connection_timeout=30))
    ch = c.channel()
    ch.queue_declare(name, exclusive=True)
    ch.basic_consume(name, lambda *a: None, consumer_tag=f"{name}.ctag")
    return c


def test_connections_channels_and_consumers_are_listed_and_closed_cluster_wide(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes
    clients = {f"cw-{node.name}": client(node, f"cw-{node.name}") for node in cluster.nodes}
    try:
        def mine(node, path, key):
            status, items = call(node, "GET", path)
            assert status == 200, items
            return {key(x): x for x in items if key(x).startswith("cw-")}

        # Every node lists the three clients, each with the node it is connected to.
        for asked in (n1, n2, n3):
            conns = eventually(lambda asked=asked: (lambda m: len(m) == 3 and m)(mine(
                asked, "/api/connections", lambda x: x.get("user_provided_name") or "")),
                f"the three connections listed by {asked.name}")
            assert {k: v["node"] for k, v in conns.items()} == \
                {"cw-n1": "n1", "cw-n2": "n2", "cw-n3": "n3"}
        names = {k: v["name"] for k, v in conns.items()}
        by_conn = {v: k for k, v in names.items()}
        chans = eventually(lambda: (lambda m: len(m) == 3 and m)(mine(
            n2, "/api/channels", lambda x: by_conn.get(x["connection_details"]["name"], ""))),
            "the three channels listed by n2")
        assert {k: (v["node"], v["consumer_count"]) for k, v in chans.items()} == \
            {"cw-n1": ("n1", 1), "cw-n2": ("n2", 1), "cw-n3": ("n3", 1)}
        consumers = eventually(lambda: (lambda m: len(m) == 3 and m)(mine(
            n3, "/api/consumers/%2F", lambda x: x["consumer_tag"])),
            "the three consumers listed by n3")
        assert {k: (v["channel_details"]["node"], v["queue"]["name"]) for k, v in
                consumers.items()} == {"cw-n1.ctag": ("n1", "cw-n1"),
                                       "cw-n2.ctag": ("n2", "cw-n2"),
                                       "cw-n3.ctag": ("n3", "cw-n3")}

        # One of another node's connections, its channels and one of its channels, by name.
        quoted = urllib.parse.quote(names["cw-n1"], safe="")
        status, one = call(n2, "GET", f"/api/connections/{quoted}")
        assert (status, one["node"], one["user_provided_name"]) == (200, "n1", "cw-n1")
        status, its = call(n2, "GET", f"/api/connections/{quoted}/channels")
        assert (status, [c["name"] for c in its]) == (200, [names["cw-n1"] + " (1)"])
        status, chan = call(n3, "GET", "/api/channels/" + urllib.parse.quote(
            names["cw-n1"] + " (1)", safe=""))
        assert (status, chan["node"]) == (200, "n1")
        assert [c["consumer_tag"] for c in chan["consumer_details"]] == ["cw-n1.ctag"]

        # The overview counts them all too, on any node.
        totals = call(n1, "GET", "/api/overview")[1]["object_totals"]
        assert (totals["connections"], totals["channels"]) == (3, 3), totals

        # Paged over the whole cluster.
        params = urllib.parse.urlencode({"page": 1, "page_size": 2, "name": "^127\\.",
                                         "use_regex": "true", "sort": "name"})
        status, page = call(n2, "GET", f"/api/connections?{params}")
        assert status == 200, page
        assert page["filtered_count"] == page["total_count"] >= 3
        assert page["item_count"] == 2 and page["page_count"] >= 2

        # Closing n1's connection through n3: n1's client gets connection.close 320.
        req = urllib.request.Request(f"http://127.0.0.1:{n3.http}/api/connections/{quoted}",
                                     method="DELETE")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        req.add_header("X-Reason", "moved to n2")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 204
        with pytest.raises(ConnectionClosedByBroker) as e:
            clients["cw-n1"].process_data_events(time_limit=5)
            clients["cw-n1"].process_data_events(time_limit=5)
        assert (e.value.reply_code, e.value.reply_text) == (320, "CONNECTION_FORCED - moved to n2")
        eventually(lambda: set(mine(n2, "/api/connections",
                                    lambda x: x.get("user_provided_name") or "")) ==
                   {"cw-n2", "cw-n3"}, "n1's connection gone from n2's listing")
        assert call(n2, "DELETE", f"/api/connections/{quoted}")[0] == 404

        # A node that is down is left out, and the listing still answers.
        n3.kill()
        eventually(lambda: set(mine(n2, "/api/connections",
                                    lambda x: x.get("user_provided_name") or "")) == {"cw-n2"},
                   "n3's connection gone from n2's listing once n3 is down")
    finally:
        for c in clients.values():
            try:
                if c.is_open:
                    c.close()
            except Exception:  # noqa: BLE001 - its node was killed
                pass


def test_every_node_lists_every_nodes_figures_and_alarms(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes
    # A memory alarm on n3 alone (a watermark of one byte), seen from n1.
    assert call(n3, "PUT", "/api/warren/vm-memory-high-watermark", {"bytes": 1})[0] == 204

    def n3_seen_from_n1():
        status, nodes = call(n1, "GET", "/api/nodes")
        assert status == 200, nodes
        return {n["name"]: n for n in nodes}
    nodes = eventually(lambda: (lambda m: m["n3"].get("mem_alarm") and m)(n3_seen_from_n1()),
                       "n3's memory alarm in n1's /api/nodes")
    assert sorted(nodes) == ["n1", "n2", "n3"]
    assert [nodes[n]["mem_alarm"] for n in ("n1", "n2", "n3")] == [False, False, True]
    for name, node in nodes.items():
        # Each node's own figures, in RabbitMQ's field names.
        assert node["running"] is True, name
        assert node["mem_used"] > 0 and node["mem_limit"] > 0, (name, node)
        assert node["disk_free"] > 0 and node["disk_free_limit"] > 0, (name, node)
        assert node["disk_free_alarm"] is False, name
        assert node["uptime"] > 0 and node["fd_used"] > 0 and node["sockets_used"] > 0, node
        assert node["fd_total"] >= node["fd_used"] and node["proc_used"] > 0, node
        assert isinstance(node["run_queue"], int) and node["partitions"] == [], node
        assert {(x["node"], x["protocol"]) for x in node["listeners"]} >= {
            (name, "amqp"), (name, "http"), (name, "clustering")}, node
    assert nodes["n3"]["mem_limit"] == 1
    assert nodes["n2"]["os_pid"] == str(n2.proc.pid)
    # One node by name, from another; a name that is no member is 404.
    status, one = call(n2, "GET", "/api/nodes/n3")
    assert (status, one["name"], one["mem_alarm"], one["os_pid"]) == (
        200, "n3", True, str(n3.proc.pid))
    assert call(n2, "GET", "/api/nodes/n9")[0] == 404
    # The overview lists every node's listeners.
    listeners = call(n1, "GET", "/api/overview")[1]["listeners"]
    assert {(x["node"], x["port"]) for x in listeners if x["protocol"] == "amqp"} == {
        (n.name, n.amqp) for n in cluster.nodes}
    assert call(n3, "PUT", "/api/warren/vm-memory-high-watermark", {"fraction": 0.4})[0] == 204

    # A node that is down is listed as not running, with what is known of it.
    n3.kill()
    nodes = eventually(lambda: (lambda m: m["n3"]["running"] is False and m)(n3_seen_from_n1()),
                       "n3 not running in n1's /api/nodes")
    assert nodes["n3"]["cluster_address"] == f"127.0.0.1:{n3.link}"
    assert "mem_used" not in nodes["n3"]
    assert nodes["n2"]["running"] is True and nodes["n2"]["mem_used"] > 0


def rate(q, key):
    return q.get("message_stats", {}).get(f"{key}_details", {}).get("rate", 0.0)


def test_message_rates_of_a_quorum_queue_and_a_remote_classic_queue_show_on_every_node(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes
    conn = n1.connection()
    ch = conn.channel()
    # A quorum queue on two members (n1 and one other), so one node holds no replica of it;
    # a classic queue n1 hosts.
    ch.queue_declare("rated-qq", durable=True, arguments={
        "x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
    ch.queue_declare("rated-cq", durable=True)
    members = eventually(lambda: call(n1, "GET", "/api/queues/%2F/rated-qq")[1].get("members"),
                         "the quorum queue's members")
    assert len(members) == 2
    by_name = {n.name: n for n in cluster.nodes}
    follower = [by_name[m] for m in members if m != "n1"] or [n2]
    outsider = [n for n in cluster.nodes if n.name not in members]
    asked = follower + outsider + [n2, n3]
    # A publisher runs while the nodes are asked, until each saw both rates above zero.
    seen = {}
    deadline_publishes = 4000
    for i in range(deadline_publishes):
        ch.basic_publish("", "rated-qq", b"m")
        ch.basic_publish("", "rated-cq", b"m")
        if i % 50 == 0:
            conn.process_data_events(time_limit=0.1)
            for node in asked:
                for queue in ("rated-qq", "rated-cq"):
                    status, q = call(node, "GET", f"/api/queues/%2F/{queue}")
                    if status == 200 and rate(q, "publish") > 0 and \
                            q["messages_details"]["rate"] > 0:
                        seen[(node.name, queue)] = rate(q, "publish")
            if len(seen) == 2 * len({n.name for n in asked}):
                break
    assert len(seen) == 2 * len({n.name for n in asked}), (members, seen)
    # The listing shows them as the queue's own page does.
    listed = {q["name"]: q for q in call(outsider[0] if outsider else n3, "GET", "/api/queues")[1]}
    assert listed["rated-qq"]["message_stats"]["publish"] > 0
    assert listed["rated-qq"]["leader"] in members
    assert sorted(listed["rated-qq"]["online"]) == sorted(members)
    conn.close()


def test_queue_churn_is_counted_once_on_the_node_a_client_used(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes

    def churn(node):
        text = urllib.request.urlopen(f"http://127.0.0.1:{node.http}/metrics", timeout=10).read()
        values = {}
        for line in text.decode().splitlines():
            for key in ("declared", "created", "deleted"):
                if line.startswith(f"rabbitmq_queues_{key}_total "):
                    values[key] = float(line.split()[1])
        return values
    before = {n.name: churn(n) for n in cluster.nodes}
    conn = n2.connection()
    ch = conn.channel()
    ch.queue_declare("churn-a", durable=True)
    ch.queue_declare("churn-a", durable=True)           # declared again, not created
    ch.queue_declare("churn-a", passive=True)           # not counted
    ch.queue_declare("churn-q", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_delete("churn-a")
    ch.queue_delete("churn-q")
    ch.queue_declare("churn-x", exclusive=True)
    conn.close()                                        # its exclusive queue goes with it

    def moved():
        now = {n.name: churn(n) for n in cluster.nodes}
        return {name: {k: now[name][k] - before[name][k] for k in now[name]} for name in now}
    eventually(lambda: moved()["n2"]["deleted"] == 3, "the exclusive queue's delete counted")
    assert moved() == {"n1": {"declared": 0, "created": 0, "deleted": 0},
                       "n2": {"declared": 4, "created": 3, "deleted": 3},
                       "n3": {"declared": 0, "created": 0, "deleted": 0}}
    # /api/nodes shows the same counts under RabbitMQ's names.
    node = call(n1, "GET", "/api/nodes/n2")[1]
    assert node["queue_declared"] - before["n2"]["declared"] == 4
    assert node["queue_created"] - before["n2"]["created"] == 3
