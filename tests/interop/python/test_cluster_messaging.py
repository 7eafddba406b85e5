"""Messages across the nodes of a warren cluster of real processes: a classic queue lives on the
node that declared it, and clients connected to any node publish to it, consume from it, get,
purge and inspect it. When its node goes down, the other nodes answer as RabbitMQ does (404
"home node ... is down", basic.cancel to consumers, nacks to publishers), and nothing confirmed
is lost.

Each test starts its own 3-node cluster (see test_cluster.py) and waits by polling with
deadlines, never by sleeping a fixed time.
"""

import socket
import time

import pika
import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
# The fixture starts a 3-node cluster per test and stops it on every exit path.
from test_cluster import Cluster, cluster, eventually  # noqa: F401

pytestmark = [
    pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.timeout(180),
]

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def consume(conn, ch, queue, count, ack=True, prefetch=50):
    """Consumes `count` messages (acking each if `ack`); returns (delivery tag, body,
    redelivered) triples."""
    got = []

    def on_message(channel, method, _props, body):
        got.append((method.delivery_tag, body, method.redelivered))
        if ack:
            channel.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=prefetch)
    tag = ch.basic_consume(queue, on_message)
    eventually(lambda: conn.process_data_events(0.05) or len(got) >= count,
               f"{count} messages consumed from {queue}")
    ch.basic_cancel(tag)
    return got


def test_a_queue_on_one_node_takes_publishes_and_serves_consumers_on_the_others(cluster):
    n1, n2, n3 = cluster.nodes
    c1 = n1.connection()
    c1.channel().queue_declare("work", durable=True)
    eventually(lambda: any(q["name"] == "work" for q in n3.api("/api/queues")),
               "n3 knows the queue")

    publisher = n2.connection()
    pch = publisher.channel()
    pch.confirm_delivery()
    for i in range(500):
        pch.basic_publish("", "work", f"m{i}".encode(), PERSISTENT)

    # The messages live on n1: its passive declare counts them; the other nodes ask it.
    for node in (n1, n2, n3):
        conn = node.connection()
        assert conn.channel().queue_declare("work", passive=True).method.message_count == 500
        conn.close()
    # Every node's management API shows n1's figures for it.
    for node in (n2, n3):
        [work] = [q for q in node.api("/api/queues") if q["name"] == "work"]
        assert (work["node"], work["state"], work["messages_ready"]) == ("n1", "running", 500)

    consumer = n3.connection()
    got = consume(consumer, consumer.channel(), "work", 500)
    assert [b for _, b, _ in got] == [f"m{i}".encode() for i in range(500)], "in order"
    assert [t for t, _, _ in got] == list(range(1, 501)), "the consumer channel's own tags"
    consumer.close()
    eventually(lambda: c1.channel().queue_declare("work", passive=True).method.message_count == 0,
               "acks from n3 settled the messages on n1")
    for c in (c1, publisher):
        c.close()


def test_a_global_prefetch_raised_after_consuming_reaches_the_queues_node(cluster):
    n1, n2, _ = cluster.nodes
    c1 = n1.connection()
    ch1 = c1.channel()
    ch1.queue_declare("limited", durable=True)
    for i in range(20):
        ch1.basic_publish("", "limited", f"m{i}".encode())
    c2 = n2.connection()
    ch2 = c2.channel()
    eventually(lambda: ch2.queue_declare("limited", passive=True), "n2 knows the queue")
    ch2.basic_qos(prefetch_count=2, global_qos=True)
    got = []
    ch2.basic_consume("limited", lambda ch, m, p, b: got.append(m.delivery_tag))
    eventually(lambda: c2.process_data_events(0.05) or len(got) >= 2, "2 deliveries")
    c2.process_data_events(0.3)
    assert len(got) == 2, "the channel-wide limit holds on n1"
    ch2.basic_qos(prefetch_count=5, global_qos=True)
    eventually(lambda: c2.process_data_events(0.05) or len(got) >= 5, "3 more deliveries")
    c2.process_data_events(0.3)
    assert len(got) == 5, "the raised limit reached n1, and no further"
    for c in (c1, c2):
        c.close()


def test_balanced_placement_spreads_queues_and_quorum_queues_name_their_members(cluster):
    n1, n2, _ = cluster.nodes
    ch = n1.connection().channel()
    for i in range(6):
        ch.queue_declare(f"spread-{i}", durable=True,
                         arguments={"x-queue-master-locator": "min-masters"})
    # n1 answered once it applied each declare; n2 applies them a moment later.
    homes = eventually(lambda: (lambda h: h if len(h) == 6 else None)(
        [q["node"] for q in n2.api("/api/queues") if q["name"].startswith("spread-")]),
        "n2 knows the six queues")
    assert sorted(homes) == ["n1", "n1", "n2", "n2", "n3", "n3"], "the fewest-queues node each time"
    ch.queue_declare("qq3", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare("qq2", durable=True, arguments={"x-queue-type": "quorum",
                                                    "x-quorum-initial-group-size": 2})
    queues = eventually(lambda: (lambda qs: qs if {"qq3", "qq2"} <= set(qs) else None)(
        {q["name"]: q for q in n2.api("/api/queues")}), "n2 knows the quorum queues")
    assert sorted(queues["qq3"]["members"]) == ["n1", "n2", "n3"]
    assert len(queues["qq2"]["members"]) == 2
    for q in (queues["qq3"], queues["qq2"]):
        assert q["node"] == q["members"][0], "placed on its first member"
    # Each member opened its replica: the queue's Raft group elects a leader among them.
    eventually(lambda: all(q["leader"] in q["members"] for q in n2.api("/api/queues")
                           if q["name"] in ("qq3", "qq2")), "the groups elected leaders")
    assert "members" not in queues["spread-0"], "classic queues have no members"


def test_a_quorum_queues_group_elects_a_new_leader_when_its_leaders_node_dies(cluster):
    nodes = {n.name: n for n in cluster.nodes}
    ch = nodes["n1"].connection().channel()
    ch.queue_declare("replicated", durable=True, arguments={"x-queue-type": "quorum"})

    def leader(via):
        [q] = [q for q in via.api("/api/queues") if q["name"] == "replicated"]
        return q["leader"]

    first = eventually(lambda: leader(nodes["n2"]), "a leader")
    assert first in ("n1", "n2", "n3")
    nodes[first].kill()
    survivor = nodes["n3" if first != "n3" else "n2"]
    new = eventually(lambda: (lambda l: l if l != first else None)(leader(survivor)),
                     "a new leader among the survivors")
    assert new in ("n1", "n2", "n3") and new != first
    nodes[first].start()
    eventually(lambda: leader(nodes[first]) == new, "the restarted member follows the new leader")


def test_a_node_holding_half_of_a_quorum_queues_members_is_quorum_critical(cluster):
    import json
    import urllib.error
    n1, _, n3 = cluster.nodes
    ch = n1.connection().channel()
    ch.queue_declare("pair", durable=True, arguments={"x-queue-type": "quorum",
                                                     "x-quorum-initial-group-size": 2})
    ch.queue_declare("trio", durable=True, arguments={"x-queue-type": "quorum"})
    path = "/api/health/checks/node-is-quorum-critical"
    # n3 is a member of trio only: two others keep its majority.
    assert n3.api(path) == {"status": "ok"}
    # n1 is one of pair's two members: without it, pair has no majority.
    with pytest.raises(urllib.error.HTTPError) as e:
        n1.api(path)
    assert e.value.code == 503
    body = json.loads(e.value.read())
    assert [q["name"] for q in body["queues"]] == ["pair"]
    assert body["queues"][0]["virtual_host"] == "/"


def test_ctl_quorum_status_and_quorum_critical_name_members_and_roles(cluster):
    import subprocess
    from test_cluster import WARREN_BIN

    def ctl(node, *args):
        return subprocess.run([WARREN_BIN, "ctl", "--uri", f"http://127.0.0.1:{node.http}", *args],
                              capture_output=True, text=True, timeout=30)

    n1, n2, n3 = cluster.nodes
    ch = n1.connection().channel()
    ch.queue_declare("pair2", durable=True, arguments={"x-queue-type": "quorum",
                                                      "x-quorum-initial-group-size": 2})
    members = eventually(lambda: n1.api("/api/queues/%2F/pair2").get("members"), "members")
    leader = eventually(lambda: n1.api("/api/queues/%2F/pair2").get("leader"), "a leader")
    r = ctl(n1, "quorum_status", "pair2")
    assert r.returncode == 0, r.stderr
    rows = dict(line.split("\t") for line in r.stdout.splitlines()[2:])
    assert set(rows) == set(members)
    assert rows[leader] == "leader"
    assert sorted(rows.values()) == ["follower", "leader"]
    # A member of a two-member queue is critical; a node that holds none of it is not.
    member = next(n for n in cluster.nodes if n.name in members)
    other = next(n for n in cluster.nodes if n.name not in members)
    r = ctl(member, "check_if_node_is_quorum_critical")
    assert r.returncode != 0 and "queue 'pair2' in vhost '/'" in r.stderr, (r.stdout, r.stderr)
    r = ctl(other, "check_if_node_is_quorum_critical")
    assert r.returncode == 0, r.stderr
    r = ctl(n1, "quorum_status", "no-such-queue")
    assert r.returncode != 0 and "does not exist" in r.stderr
    ch.queue_declare("plain", durable=True)
    r = ctl(n1, "quorum_status", "plain")
    assert r.returncode != 0 and "not a quorum queue" in r.stderr


def test_get_nack_purge_and_a_conditional_delete_of_a_remote_queue(cluster):
    n1, n2, n3 = cluster.nodes
    c1 = n1.connection()
    ch1 = c1.channel()
    ch1.queue_declare("jobs", durable=True)
    ch1.confirm_delivery()
    for i in range(10):
        ch1.basic_publish("", "jobs", f"j{i}".encode(), PERSISTENT)

    c2 = eventually(lambda: n2.connection(), "n2 accepts a connection")
    ch2 = c2.channel()
    eventually(lambda: ch2.queue_declare("jobs", passive=True), "n2 knows the queue")
    method, _, body = ch2.basic_get("jobs", auto_ack=False)
    assert (body, method.message_count, method.redelivered) == (b"j0", 9, False)
    ch2.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = ch2.basic_get("jobs", auto_ack=False)
    assert (body, method.redelivered) == (b"j0", True), "requeued at the head on n1"
    ch2.basic_ack(method.delivery_tag)

    # if-empty is decided where the messages are.
    ch3 = n3.connection().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch3.queue_delete("jobs", if_empty=True)
    assert refused.value.reply_code == 406
    ch3 = n3.connection().channel()
    assert ch3.queue_purge("jobs").method.message_count == 9
    ch3.queue_delete("jobs", if_empty=True)
    eventually(lambda: all(not any(q["name"] == "jobs" for q in n.api("/api/queues"))
                           for n in cluster.nodes), "the queue is gone everywhere")
    c1.close()
    c2.close()


def test_unacked_deliveries_of_a_closed_remote_consumer_are_redelivered(cluster):
    n1, n2, n3 = cluster.nodes
    c1 = n1.connection()
    ch1 = c1.channel()
    ch1.queue_declare("tasks", durable=True)
    ch1.confirm_delivery()
    for i in range(20):
        ch1.basic_publish("", "tasks", f"t{i}".encode(), PERSISTENT)

    c2 = n2.connection()
    eventually(lambda: c2.channel().queue_declare("tasks", passive=True), "n2 knows the queue")
    taken = consume(c2, c2.channel(), "tasks", 5, ack=False, prefetch=5)
    assert [b for _, b, _ in taken] == [f"t{i}".encode() for i in range(5)]
    c2.close()  # never acked: back in the queue on n1

    c3 = n3.connection()
    got = consume(c3, c3.channel(), "tasks", 20)
    assert sorted(b for _, b, _ in got) == sorted(f"t{i}".encode() for i in range(20))
    assert {b for _, b, r in got if r} == {f"t{i}".encode() for i in range(5)}
    c3.close()
    c1.close()


def test_dead_letters_and_routing_cross_nodes(cluster):
    n1, n2, n3 = cluster.nodes
    c2 = n2.connection()
    ch2 = c2.channel()
    ch2.exchange_declare("dlx", "fanout", durable=True)
    ch2.queue_declare("graveyard", durable=True)  # lives on n2
    ch2.queue_bind("graveyard", "dlx")
    c1 = n1.connection()
    ch1 = c1.channel()
    eventually(lambda: ch1.exchange_declare("dlx", "fanout", passive=True), "n1 knows dlx")
    ch1.queue_declare("inbox", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    ch1.exchange_declare("fan", "fanout", durable=True)
    ch1.queue_bind("inbox", "fan")
    eventually(lambda: c2.channel().queue_declare("inbox", passive=True), "n2 knows inbox")
    ch2.queue_bind("graveyard", "fan")

    # Published on n3 to a fanout whose queues live on n1 and n2: both get it.
    c3 = eventually(lambda: n3.connection(), "n3 accepts a connection")
    ch3 = c3.channel()
    ch3.confirm_delivery()
    eventually(lambda: ch3.exchange_declare("fan", "fanout", passive=True), "n3 knows fan")
    ch3.basic_publish("fan", "", b"hello", PERSISTENT)
    assert ch3.queue_declare("inbox", passive=True).method.message_count == 1
    assert ch3.queue_declare("graveyard", passive=True).method.message_count == 1

    # Rejected on n3 from n1's queue: dead-lettered by n1 into n2's queue.
    method, _, body = ch3.basic_get("inbox", auto_ack=False)
    ch3.basic_reject(method.delivery_tag, requeue=False)
    eventually(lambda: ch3.queue_declare("graveyard", passive=True).method.message_count == 2,
               "the dead letter reached n2's queue")
    method, props, body = ch3.basic_get("graveyard", auto_ack=True)
    method, props, body = ch3.basic_get("graveyard", auto_ack=True)
    assert body == b"hello" and props.headers["x-death"][0]["queue"] == "inbox"
    for c in (c1, c2, c3):
        c.close()


def test_when_a_queues_node_dies_others_answer_as_rabbitmq_and_nothing_confirmed_is_lost(cluster):
    n1, n2, n3 = cluster.nodes
    c1 = n1.connection()
    c1.channel().queue_declare("ledger", durable=True)
    c1.close()
    c2 = eventually(lambda: n2.connection(), "n2 accepts a connection")
    pch = c2.channel()
    pch.confirm_delivery()
    eventually(lambda: pch.queue_declare("ledger", passive=True), "n2 knows the queue")
    for i in range(100):
        pch.basic_publish("", "ledger", f"e{i}".encode(), PERSISTENT)

    c3 = n3.connection()
    ch3 = c3.channel()
    ch3.basic_qos(prefetch_count=10)
    cancelled = []
    got = []
    ch3.add_on_cancel_callback(cancelled.append)
    ch3.basic_consume("ledger", lambda ch, m, p, b: got.append(m.delivery_tag))
    eventually(lambda: c3.process_data_events(0.05) or len(got) == 10, "10 unacked on n3")

    n1.kill()
    eventually(lambda: c3.process_data_events(0.05) or cancelled, "n3's consumer is cancelled")
    def refused():
        try:
            n2.connection().channel().queue_declare("ledger", passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            return e
        return None

    down = eventually(refused, "n2 sees n1 down")
    assert down.reply_code == 404
    assert down.reply_text == ("NOT_FOUND - home node 'n1' of durable queue 'ledger' in vhost '/'"
                               " is down or inaccessible")
    with pytest.raises(pika.exceptions.NackError):
        pch.basic_publish("", "ledger", b"lost?", PERSISTENT)
    [ledger] = [q for q in n2.api("/api/queues/%2F") if q["name"] == "ledger"]
    assert (ledger["node"], ledger["state"]) == ("n1", "down")

    n1.start()
    # Every confirmed message is back, including the ten n3 had not acknowledged.
    eventually(lambda: n3.connection().channel().queue_declare("ledger", passive=True)
               .method.message_count == 100, "all 100 confirmed messages are on n1 again")
    c2.close()
    c3.close()


def test_a_consumers_node_dying_requeues_its_deliveries_for_others(cluster):
    n1, n2, n3 = cluster.nodes
    c1 = n1.connection()
    ch1 = c1.channel()
    ch1.queue_declare("shared", durable=True)
    ch1.confirm_delivery()
    for i in range(30):
        ch1.basic_publish("", "shared", f"s{i}".encode(), PERSISTENT)
    c3 = eventually(lambda: n3.connection(), "n3 accepts a connection")
    eventually(lambda: c3.channel().queue_declare("shared", passive=True), "n3 knows the queue")
    consume(c3, c3.channel(), "shared", 10, ack=False, prefetch=10)
    n3.kill()
    c2 = n2.connection()
    got = consume(c2, c2.channel(), "shared", 30)
    assert sorted(b for _, b, _ in got) == sorted(f"s{i}".encode() for i in range(30))
    assert sum(1 for _, _, r in got if r) == 10, "the ten n3 had were redelivered"
    c2.close()
    c1.close()


def queue_names(node):
    return {q["name"] for q in node.api("/api/queues")}


def declare_kept_transient_and_exclusive(node, others):
    """Declares a durable, a transient and an exclusive queue through `node` (its connection is
    returned, open: the exclusive queue's owner) and waits until `others` know all three."""
    conn = node.connection()
    ch = conn.channel()
    ch.queue_declare("kept", durable=True)
    ch.queue_declare("transient", durable=False)
    ch.queue_declare("mine", durable=True, exclusive=True)
    for other in others:
        eventually(lambda other=other: {"kept", "transient", "mine"} <= queue_names(other),
                   f"{other.name} knows {node.name}'s queues")
    return conn


def test_a_restarted_node_deletes_everywhere_the_queues_it_held_in_memory_only(cluster):
    n1, n2, n3 = cluster.nodes
    names = queue_names
    c2 = declare_kept_transient_and_exclusive(n2, [n1])  # noqa: F841 - owns "mine"
    n2.kill()
    n2.start()
    for node in cluster.nodes:
        eventually(lambda node=node: "kept" in names(node)
                   and not {"transient", "mine"} & names(node),
                   f"{node.name} has only the durable queue left")
    # The exclusive queue's name is free again for anyone.
    c1 = n1.connection()
    c1.channel().queue_declare("mine", exclusive=True)
    c1.close()


def test_a_node_that_stays_down_loses_its_transient_and_exclusive_queues_everywhere():
    # RabbitMQ deletes them on nodedown; warren once the node has been unreachable for
    # --node-down-after-s (60 s by default, 3 here).
    c = Cluster(extra_args=["--node-down-after-s", "3"])
    try:
        c.start()
        n1, n2, n3 = c.nodes
        names = queue_names
        c2 = declare_kept_transient_and_exclusive(n2, [n1, n3])  # noqa: F841 - owns "mine"
        n2.kill()
        for node in (n1, n3):
            eventually(lambda node=node: "kept" in names(node)
                       and not {"transient", "mine"} & names(node),
                       f"{node.name} has only n2's durable queue left")
        # Both names are free again, for a client of another node.
        c1 = n1.connection()
        ch1 = c1.channel()
        ch1.queue_declare("mine", exclusive=True)
        ch1.queue_declare("transient", durable=True)
        c1.close()
        # n2 back: it applies the deletes too, and keeps its durable queue.
        n2.start()
        eventually(lambda: "kept" in names(n2) and "transient" in names(n2)
                   and "mine" not in names(n2), "n2 has the cluster's queues")
    finally:
        c.close()


def test_a_slow_no_ack_consumer_on_another_node_holds_its_queues_deliveries_back(cluster):
    # A no-ack consumer takes whatever it is sent: a local one is held back by its own
    # outbox, and a remote one by its node's client outbox too, not only by the link between
    # the nodes (whose bound the client's node drains into that outbox as fast as it reads).
    import amqp_raw as amqp
    n1, n2, n3 = cluster.nodes
    c1 = n1.connection()
    ch1 = c1.channel()
    ch1.queue_declare("slow-reader")  # on n1, the declaring client's node
    ch1.confirm_delivery()
    count, body = 1000, b"x" * 100_000  # 100 MB, far beyond every bound on the way
    for _ in range(count):
        ch1.basic_publish("", "slow-reader", body)
    raw = amqp.RawConnection("127.0.0.1", n3.amqp, timeout=30)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    raw.open()
    raw.open_channel(1)
    raw.send(amqp.method_frame(1, amqp.BASIC_CONSUME,
                               amqp.basic_consume_args("slow-reader", "slow", no_ack=True)))
    raw.expect_method(amqp.BASIC_CONSUME_OK)

    # The client reads nothing more: what left n1 is what the bounds let through.
    def ready():
        return n1.api("/api/queues/%2F/slow-reader")["messages_ready"]

    last, still_since = ready(), time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and time.monotonic() - still_since < 2:
        time.sleep(0.2)
        now = ready()
        if now != last:
            last, still_since = now, time.monotonic()
    assert last >= count * 0.6, f"{count - last} of {count} messages left n1 for a client reading none"

    # Read, and every message comes.
    delivered = 0
    while delivered < count:
        f = raw.read_frame()
        if f.method == amqp.BASIC_DELIVER:
            delivered += 1
    raw.close()
    eventually(lambda: ready() == 0, "the queue drained")
    c1.close()
