"""The management API in a warren cluster: what it changes goes the way an AMQP client's change
goes. A declare, bind or delete made over HTTP on one node is replicated to every node; publish,
get and purge of a queue hosted on another node reach that node; and a queue whose node is down
is refused with AMQP's 404 "home node ... is down or inaccessible".

Starts its own 3-node cluster (test_cluster.py's harness: loopback, free ports, fresh data dirs).
"""

import base64
import json
import urllib.error
import urllib.request

import pytest

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
