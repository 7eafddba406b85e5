"""Flow control for publishers without confirms to quorum queues: a publisher faster than the
queue's group can replicate is held back (its connection shows `flow`), the node's memory stays
far below what was published, and every message it sent reaches the queue, as RabbitMQ's credit
flow keeps such a publisher.

Before, nothing bounded it: such a publish is answered by nobody, so a publisher on another node
than the queue's leader poured proposals into the groups faster than they committed. Published
640 MiB of 64 KiB messages in 10 s: the nodes' RSS grew by 1.3-1.7 GiB and two thirds of the
messages never reached the queue.

The nodes run with a half-second WAL commit window, so a group commits at most a few batches a
second: any client outruns that, whatever the machine's speed. Starts its own 3-node cluster
(test_cluster.py's harness)."""

import threading
import time

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from test_cluster import Cluster, eventually
from test_hostile_clients import rss_bytes

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(300),
]

BODY_BYTES = 64 * 1024
MESSAGES = 8000  # 500 MiB published
# Each node's RSS may grow by at most this while the publisher runs: the engine's cache of recent
# appends, the Raft messages on their way between the nodes (up to 256 appends of 1 MiB per
# follower), the bytes flow control lets the publisher have unanswered (8 MiB) and what glibc
# keeps of freed memory. Measured: 266-293 MiB for 250 MiB published, 305-313 for 500: a plateau.
RSS_GROWTH_MIB_MAX = 400
COMMIT_WINDOW_US = 500_000
PUBLISHER_NAME = "quorum-flow-publisher"


@pytest.fixture
def slow_cluster():
    c = Cluster(extra_args=["--wal-commit-window-us", str(COMMIT_WINDOW_US)])
    try:
        c.start()
        yield c
    finally:
        c.close()


def publisher_state(node):
    for c in node.api("/api/connections"):
        if c.get("client_properties", {}).get("connection_name") == PUBLISHER_NAME:
            return c.get("state")
    return None


def test_a_publisher_without_confirms_to_a_quorum_queue_is_held_in_flow_and_loses_nothing(
        slow_cluster):
    n1, n2, _ = slow_cluster.nodes
    setup = n1.connection()
    setup.channel().queue_declare("flooded", durable=True, arguments={"x-queue-type": "quorum"})
    setup.close()
    assert n1.api("/api/queues/%2F/flooded")["leader"] == n1.name
    pids = {n.name: n.proc.pid for n in (n1, n2)}
    rss_before = {name: rss_bytes(pid) for name, pid in pids.items()}
    done, errors = threading.Event(), []

    def publish():
        try:
            c = pika.BlockingConnection(pika.ConnectionParameters(
                host="127.0.0.1", port=n2.amqp,
                client_properties={"connection_name": PUBLISHER_NAME}))
            ch = c.channel()
            persistent = pika.BasicProperties(delivery_mode=2)
            for i in range(MESSAGES):
                ch.basic_publish("", "flooded", b"%08d" % i + bytes(BODY_BYTES - 8), persistent)
            c.close()
        except Exception as e:  # reported by the test's thread
            errors.append(e)
        finally:
            done.set()

    publisher = threading.Thread(target=publish)
    publisher.start()
    states, rss_peak = set(), dict(rss_before)
    while not done.is_set():
        state = publisher_state(n2)
        if state:
            states.add(state)
        for name, pid in pids.items():
            rss_peak[name] = max(rss_peak[name], rss_bytes(pid))
        time.sleep(0.05)
    publisher.join()
    assert not errors, errors
    growth = {name: (rss_peak[name] - rss_before[name]) >> 20 for name in pids}
    print(f"\nstates {states}; RSS growth {growth} MiB for {MESSAGES * BODY_BYTES >> 20} MiB "
          f"published")
    assert "flow" in states
    eventually(lambda: n1.api("/api/queues/%2F/flooded")["messages"] == MESSAGES,
               "every message published in the queue", deadline_s=120)
    for name, grown in growth.items():
        assert grown <= RSS_GROWTH_MIB_MAX, f"{name} grew {grown} MiB"
    # In order, none lost or repeated.
    c = n1.connection()
    ch = c.channel()
    got = []
    for _ in range(MESSAGES):
        m, _, body = ch.basic_get("flooded", auto_ack=True)
        assert m is not None
        got.append(int(body[:8]))
    c.close()
    assert got == list(range(MESSAGES))
