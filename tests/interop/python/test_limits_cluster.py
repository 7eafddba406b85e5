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


def test_connection_and_channel_limits_count_every_nodes_clients(cluster):  # noqa: F811
    # RabbitMQ counts a vhost's and a user's connections, and a user's channels, over the whole
    # cluster: a client spread over the nodes gets the limit once, not once per node.
    n1, n2, n3 = cluster.nodes
    vhost = "lim-conns"
    assert call(n1, "PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert call(n1, "PUT", "/api/users/lc", {"password": "lc", "tags": ""})[0] == 201
    assert call(n1, "PUT", f"/api/permissions/{vhost}/lc",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert call(n1, "PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 3})[0] == 204
    assert call(n1, "PUT", "/api/user-limits/lc/max-connections", {"value": 2})[0] == 204
    assert call(n1, "PUT", "/api/user-limits/lc/max-channels", {"value": 2})[0] == 204
    for node in (n1, n2, n3):
        eventually(lambda node=node: call(node, "GET", "/api/user-limits/lc")[1]
                   == [{"user": "lc", "value": {"max-channels": 2, "max-connections": 2}}],
                   f"user limits on {node.name}")
        eventually(lambda node=node: call(node, "GET", f"/api/vhost-limits/{vhost}")[1]
                   == [{"vhost": vhost, "value": {"max-connections": 3}}],
                   f"vhost limits on {node.name}")

    # The user's connections: one on n1 and one on n2 leave none for n3.
    a = n1.connection("lc", "lc", vhost)
    b = n2.connection("lc", "lc", vhost)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        n3.connection("lc", "lc", vhost)
    assert "connection refused for user 'lc': user connection limit (2) is reached" in str(e.value)
    # The vhost's: guest's one on n3 is the third, a fourth on n1 is over.
    g = n3.connection(vhost=vhost)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as e:
        n1.connection(vhost=vhost)
    assert f"access to vhost '{vhost}' refused for user 'guest': connection limit (3) is reached" \
        in str(e.value)
    g.close()

    # The user's channels: one through n1's connection and one through n2's; the third,
    # through either, closes its connection.
    a.channel()
    b.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        b.channel()
    assert (e.value.reply_code, e.value.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user 'lc' has reached the maximum "
        "allowed user limit of (2)")
    assert a.is_open, "only the connection that went over is closed"
    # b's connection and channel are gone everywhere: room on n3 for both again.
    c = eventually(lambda: n3.connection("lc", "lc", vhost), "n3 admits lc once b closed")
    c.channel()
    a.close()
    c.close()
