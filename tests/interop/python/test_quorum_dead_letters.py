"""At-least-once dead-lettering of quorum queues (`x-dead-letter-strategy=at-least-once`) on a
cluster of real processes: the queue keeps its dead letters until the queues they were routed
to confirm them, and a leader killed with dead letters outstanding leaves them to the next one.

Each test starts its own 3-node cluster (see test_cluster.py) and waits by polling with
deadlines, never by sleeping a fixed time.
"""

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
# The fixture starts a 3-node cluster per test and stops it on every exit path.
from test_cluster import cluster, eventually  # noqa: F401
from test_cluster_messaging import consume

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(180),
]

QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def publish_fits(ch, queue, body):
    """Publishes with confirms: whether the queue took it (a nack: it is full)."""
    try:
        ch.basic_publish("", queue, body, PERSISTENT)
        return True
    except pika.exceptions.NackError:
        return False


def test_dead_letters_outstanding_when_the_leader_dies_reach_their_target(cluster):
    nodes = {n.name: n for n in cluster.nodes}
    any_node = cluster.nodes[0]
    conn = any_node.connection()
    ch = conn.channel()
    ch.exchange_declare("dlx", "fanout", durable=True)
    count = 40
    # Nothing bound to "dlx" yet: every dead letter waits in the source. A limit of count - 1
    # makes the waiting ones fill it.
    ch.queue_declare("source", durable=True, arguments={
        **QUORUM, "x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish", "x-max-length": count - 1})
    leader = eventually(lambda: any_node.api("/api/queues/%2F/source").get("leader"), "a leader")
    ch.confirm_delivery()
    bodies = [f"m{i}".encode() for i in range(count)]
    for b in bodies:
        assert publish_fits(ch, "source", b)

    # Rejected without requeue, all of them, by a consumer on a node that does not lead it.
    other = next(n for n in cluster.nodes if n.name != leader)
    c2 = other.connection()
    ch2 = c2.channel()
    rejected = []

    def reject(channel, method, _props, body):
        channel.basic_reject(method.delivery_tag, requeue=False)
        rejected.append(body)

    ch2.basic_qos(prefetch_count=10)
    ch2.basic_consume("source", reject)
    eventually(lambda: c2.process_data_events(0.05) or len(rejected) >= count, "all rejected")
    assert sorted(rejected) == sorted(bodies)
    # Applied once nothing is ready or unacked; the dead letters wait, and fill the queue.
    eventually(lambda: any_node.api("/api/queues/%2F/source").get("messages") == 0, "rejects applied")
    assert not publish_fits(ch, "source", b"over")
    conn.close()
    c2.close()

    # The leader dies with every dead letter outstanding; a target appears afterwards.
    nodes[leader].kill()
    survivor = other
    conn = survivor.connection()
    ch = conn.channel()
    ch.queue_declare("target", durable=True, arguments=QUORUM)
    ch.queue_bind("target", "dlx")
    eventually(lambda: survivor.api("/api/queues/%2F/source").get("leader") not in (None, leader),
               "a new leader")
    got = consume(conn, ch, "target", count)
    # At least once: each of them, a repeat allowed (a leader may publish one its predecessor
    # had published and not yet settled).
    assert set(b for _, b, _ in got) == set(bodies)
    # Settled, they no longer fill the source.
    ch.confirm_delivery()
    eventually(lambda: publish_fits(ch, "source", b"fits"), "the dead letters settled")
    conn.close()
