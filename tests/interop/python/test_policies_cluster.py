"""Policies and definitions in a warren cluster (issue 13): a policy set through any node's API
is replicated to every node, applied to the queue on the node hosting it (a lowered max-length
trims its head there, in order), and survives a node's restart; a definitions import on one
node shows in every node's export. Starts its own 3-node cluster (test_cluster.py's harness)."""

import json
import os

import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from test_cluster import cluster, eventually  # noqa: F401 - the fixture
from test_management_api_cluster import call

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(180),
]

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "rabbitmq-3.10.8-definitions.json")


def test_policies_are_replicated_and_trim_the_queue_where_it_lives(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes
    conn = n1.connection()
    ch = conn.channel()
    ch.queue_declare("capped", durable=True)
    for i in range(6):
        ch.basic_publish("", "capped", b"m%d" % i)
    conn.close()
    policy = {"pattern": "^capped$", "definition": {"max-length": 2}, "apply-to": "queues"}
    assert call(n2, "PUT", "/api/policies/%2F/cap", policy)[0] == 201
    assert call(n3, "PUT", "/api/operator-policies/%2F/ttl",
                {"pattern": ".*", "definition": {"message-ttl": 600000}})[0] == 201
    for node in cluster.nodes:
        eventually(lambda node=node: (call(node, "GET", "/api/queues/%2F/capped")[1] or {})
                   .get("effective_policy_definition") == {"max-length": 2,
                                                           "message-ttl": 600000},
                   f"the policies on {node.name}")
    eventually(lambda: call(n2, "GET", "/api/queues/%2F/capped")[1]["messages"] == 2,
               "the queue trimmed on n1")
    got = call(n3, "POST", "/api/queues/%2F/capped/get",
               {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})[1]
    assert [m["payload"] for m in got] == ["m4", "m5"]

    n2.stop()
    n2.start()
    eventually(lambda: call(n2, "GET", "/api/policies/%2F/cap")[0] == 200,
               "the policy on n2 after its restart")
    assert call(n2, "GET", "/api/policies/%2F/cap")[1]["definition"] == {"max-length": 2}


def test_a_definitions_import_on_one_node_shows_on_every_node(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes
    with open(FIXTURE) as f:
        doc = json.load(f)
    assert call(n3, "POST", "/api/definitions", doc)[0] == 204
    exports = []
    for node in cluster.nodes:
        eventually(lambda node=node: call(node, "GET", "/api/definitions/imported")[0] == 200
                   and len(call(node, "GET", "/api/definitions/imported")[1]["bindings"]) == 6,
                   f"the import on {node.name}")
        exports.append(call(node, "GET", "/api/definitions/imported")[1])
    assert exports[0] == exports[1] == exports[2]
    assert len(exports[0]["policies"]) == 3 and len(exports[0]["parameters"]) == 1
    # The imported user logs in on a node that did not take the import.
    n1.connection(user="importer", password="s3cret", vhost="imported").close()
