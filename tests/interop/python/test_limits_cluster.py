"""Limits and topic permissions in a warren cluster (issue 14): set on one node, replicated with
the rest of the metadata to every node, kept across a node's restart, and `max-queues` counted
over the whole cluster's queues, whichever node hosts them.

Starts its own 3-node cluster (test_cluster.py's harness: loopback, free ports, fresh data dirs).
"""

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from helpers import expect_channel_error
from test_cluster import cluster, eventually  # noqa: F401 - the fixture
from test_management_api_cluster import call

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(180),
]

VHOST = "lim-cluster"


def test_limits_replicate_and_max_queues_counts_the_whole_cluster(cluster):  # noqa: F811
    n1, n2, n3 = cluster.nodes
    assert call(n1, "PUT", f"/api/vhosts/{VHOST}")[0] == 201
    assert call(n1, "PUT", f"/api/vhost-limits/{VHOST}/max-queues", {"value": 2})[0] == 204
    assert call(n1, "PUT", "/api/users/tp", {"password": "tp", "tags": ""})[0] == 201
    assert call(n1, "PUT", f"/api/permissions/{VHOST}/tp",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert call(n2, "PUT", f"/api/topic-permissions/{VHOST}/tp",
                {"exchange": "amq.topic", "write": "^ok", "read": ".*"})[0] == 201
    assert call(n2, "PUT", "/api/user-limits/tp/max-connections", {"value": 1})[0] == 204
    for node in (n1, n2, n3):
        eventually(lambda node=node: call(node, "GET", f"/api/vhost-limits/{VHOST}")[1]
                   == [{"vhost": VHOST, "value": {"max-queues": 2}}], f"limits on {node.name}")
        eventually(lambda node=node: call(node, "GET", "/api/user-limits/tp")[1]
                   == [{"user": "tp", "value": {"max-connections": 1}}],
                   f"user limits on {node.name}")

    # One queue declared through each of n1 and n2: the third, through n3, is over the limit.
    for node, queue in ((n1, "cq1"), (n2, "cq2")):
        c = node.connection(vhost=VHOST)
        c.channel().queue_declare(queue, durable=True)
        c.close()
    c = n3.connection(vhost=VHOST)
    expect_channel_error(
        406, f"PRECONDITION_FAILED - cannot declare queue 'cq3': queue limit in vhost '{VHOST}' "
        "(2) is reached", c.channel().queue_declare, "cq3", durable=True)
    c.close()

    # The topic permission set through n2 holds on n3, and again after n3 restarts.
    n3.kill()
    n3.start()
    eventually(lambda: cluster.formed(n3), "n3 back in the cluster")
    c = n3.connection("tp", "tp", VHOST)
    ch = c.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "ok.1", b"allowed")
    expect_channel_error(
        403, f"ACCESS_REFUSED - access to topic 'no.1' in exchange 'amq.topic' in vhost "
        f"'{VHOST}' refused for user 'tp'", ch.basic_publish, "amq.topic", "no.1", b"refused")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        n3.connection("tp", "tp", VHOST)
    assert "user connection limit (1) is reached" in str(e.value)
    c.close()
    c = n3.connection(vhost=VHOST)
    expect_channel_error(406, "PRECONDITION_FAILED - cannot declare queue 'cq3'",
                         c.channel().queue_declare, "cq3", durable=True)
    c.close()
