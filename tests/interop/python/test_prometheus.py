"""Prometheus metrics with the names, types and labels of RabbitMQ 3.10's rabbitmq_prometheus
plugin, so that RabbitMQ's own Grafana dashboards ("RabbitMQ-Overview",
"RabbitMQ-Quorum-Queues-Raft") render against warren unchanged. The text is read with the
Prometheus client's own parser, as a scrape would read it.

Runs against RabbitMQ too (`scripts/interop.sh --broker rabbitmq` starts it with the plugin;
WARREN_TEST_PROMETHEUS_URI says where it listens): the expectations here are RabbitMQ's. Both
brokers refresh queue figures every 5 s, so values are polled, not read once."""

import os
import time
import urllib.error
import urllib.parse
import urllib.request

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BROKER_KIND, IN_CLUSTER_RUN
from helpers import wait_for
from test_cluster import cluster, eventually  # noqa: F401 - the fixture
from test_management_api import Api

# Both brokers publish queue statistics every 5 s; this is a deadline, not a delay.
STATS_WAIT_S = 20.0

# Every series the two dashboards query, with its type and the labels they select or join on
# (`* on(instance) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info`).
# Names are the families the parser reports (a counter's without `_total`).
OVERVIEW = {
    "rabbitmq_identity_info": ("unknown", {"rabbitmq_node", "rabbitmq_cluster"}),
    "rabbitmq_build_info": ("unknown", {"rabbitmq_version", "erlang_version"}),
    "rabbitmq_queue_messages_ready": ("gauge", set()),
    "rabbitmq_queue_messages_unacked": ("gauge", set()),
    "rabbitmq_queue_messages": ("gauge", set()),
    "rabbitmq_queue_consumers": ("gauge", set()),
    "rabbitmq_queue_messages_published": ("counter", set()),
    "rabbitmq_connections": ("gauge", set()),
    "rabbitmq_channels": ("gauge", set()),
    "rabbitmq_consumers": ("gauge", set()),
    "rabbitmq_queues": ("gauge", set()),
    "rabbitmq_connections_opened": ("counter", set()),
    "rabbitmq_connections_closed": ("counter", set()),
    "rabbitmq_channels_opened": ("counter", set()),
    "rabbitmq_channels_closed": ("counter", set()),
    "rabbitmq_queues_declared": ("counter", set()),
    "rabbitmq_queues_created": ("counter", set()),
    "rabbitmq_queues_deleted": ("counter", set()),
    "rabbitmq_channel_consumers": ("gauge", set()),
    "rabbitmq_channel_messages_published": ("counter", set()),
    "rabbitmq_channel_messages_confirmed": ("counter", set()),
    "rabbitmq_channel_messages_unroutable_dropped": ("counter", set()),
    "rabbitmq_channel_messages_unroutable_returned": ("counter", set()),
    "rabbitmq_channel_messages_delivered": ("counter", set()),
    "rabbitmq_channel_messages_delivered_ack": ("counter", set()),
    "rabbitmq_channel_messages_redelivered": ("counter", set()),
    "rabbitmq_channel_messages_acked": ("counter", set()),
    "rabbitmq_channel_get": ("counter", set()),
    "rabbitmq_channel_get_ack": ("counter", set()),
    "rabbitmq_channel_get_empty": ("counter", set()),
    "rabbitmq_process_resident_memory_bytes": ("gauge", set()),
    "rabbitmq_resident_memory_limit_bytes": ("gauge", set()),
    "rabbitmq_disk_space_available_bytes": ("gauge", set()),
    "rabbitmq_disk_space_available_limit_bytes": ("gauge", set()),
    "rabbitmq_process_open_fds": ("gauge", set()),
    "rabbitmq_process_max_fds": ("gauge", set()),
    "rabbitmq_process_open_tcp_sockets": ("gauge", set()),
    "rabbitmq_process_max_tcp_sockets": ("gauge", set()),
    "rabbitmq_alarms_memory_used_watermark": ("unknown", set()),
    "rabbitmq_alarms_free_disk_space_watermark": ("unknown", set()),
    "rabbitmq_global_messages_received": ("counter", {"protocol"}),
    "rabbitmq_global_messages_confirmed": ("counter", {"protocol"}),
    "rabbitmq_global_messages_routed": ("counter", {"protocol"}),
    "rabbitmq_global_messages_unroutable_dropped": ("counter", {"protocol"}),
    "rabbitmq_global_messages_unroutable_returned": ("counter", {"protocol"}),
    "rabbitmq_global_messages_delivered": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_messages_delivered_consume_manual_ack": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_messages_delivered_consume_auto_ack": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_messages_delivered_get_manual_ack": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_messages_delivered_get_auto_ack": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_messages_get_empty": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_messages_redelivered": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_messages_acknowledged": ("counter", {"protocol", "queue_type"}),
    "rabbitmq_global_publishers": ("gauge", {"protocol"}),
    "rabbitmq_global_consumers": ("gauge", {"protocol"}),
}
# The Raft dashboard's series, per queue, that every member reports.
RAFT = {
    "rabbitmq_raft_term": ("counter", {"vhost", "queue"}),
    "rabbitmq_raft_log_snapshot_index": ("gauge", {"vhost", "queue"}),
    "rabbitmq_raft_log_last_applied_index": ("gauge", {"vhost", "queue"}),
    "rabbitmq_raft_log_commit_index": ("gauge", {"vhost", "queue"}),
    "rabbitmq_raft_log_last_written_index": ("gauge", {"vhost", "queue"}),
}
# Its latency heatmap: warren's leaders time their entries (followers have no clock on them).
COMMIT_LATENCY = "rabbitmq_raft_entry_commit_latency_seconds"
QUEUE_TYPES = {"rabbit_classic_queue", "rabbit_quorum_queue", "rabbit_stream_queue"}


def metrics_base(broker):
    """Where the broker serves /metrics: RabbitMQ's plugin has a port of its own."""
    if broker.is_rabbitmq:
        return os.environ.get("WARREN_TEST_PROMETHEUS_URI", "http://127.0.0.1:15790")
    uri = urllib.parse.urlparse(broker.management_uri)
    return f"http://{uri.hostname}:{uri.port}"


def read_metrics(base, path="/metrics"):
    """{family name: (type, [(sample name, labels, value)])}"""
    with urllib.request.urlopen(base + path, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/plain"), r.headers["content-type"]
        text = r.read().decode()
    return {
        f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def host_base(broker, queue):
    """The metrics of the node hosting `queue`: a queue's figures are its node's alone, as in
    RabbitMQ, and in a warren cluster the queue may live on another node than the client's."""
    if broker.is_rabbitmq or not os.environ.get("WARREN_TEST_CLUSTER"):
        return metrics_base(broker)
    api = Api(broker)
    q = api.get(f"/api/queues/%2F/{urllib.parse.quote(queue, safe='')}").json
    node = q.get("leader") or q["node"]
    members = api.get("/api/warren/cluster").json["members"]
    return "http://" + next(m["management"] for m in members if m["name"] == node)


@pytest.fixture
def scrape(broker):
    """The broker's metrics. warren's HTTP listener may come up just after its AMQP one:
    waited for, and a failure, not a skip. RabbitMQ without its plugin is skipped."""
    base = metrics_base(broker)
    deadline = time.monotonic() + 15
    while True:
        try:
            read_metrics(base)
            break
        except (urllib.error.URLError, OSError) as e:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            if broker.is_rabbitmq:
                pytest.skip(f"no Prometheus metrics at {base}: {e}")
            raise
    return lambda path="/metrics", base=base: read_metrics(base, path)


def value(families, name, **labels):
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    _, samples = families.get(name, (None, []))
    return sum(v for _, l, v in samples if all(l.get(k) == w for k, w in labels.items()))


def check(families, expected):
    for name, (kind, labels) in expected.items():
        assert name in families, f"{name} missing"
        got_kind, samples = families[name]
        assert got_kind == kind, f"{name} is a {got_kind}, RabbitMQ's is a {kind}"
        assert samples, f"{name} has no samples"
        for sample_name, sample_labels, _ in samples:
            suffix = "_total" if kind == "counter" else ""
            assert sample_name == name + suffix, sample_name
            assert labels <= set(sample_labels), f"{name} has labels {sample_labels}"


def test_the_overview_dashboards_series_have_rabbitmqs_names_types_and_labels(scrape):
    families = scrape()
    check(families, OVERVIEW)
    for name in ("rabbitmq_global_messages_delivered", "rabbitmq_global_messages_acknowledged"):
        assert {s[1]["queue_type"] for s in families[name][1]} == QUEUE_TYPES
    identity = families["rabbitmq_identity_info"][1]
    assert len(identity) == 1 and identity[0][2] == 1
    assert identity[0][1]["rabbitmq_node"] and identity[0][1]["rabbitmq_cluster"]
    assert value(families, "rabbitmq_process_resident_memory_bytes") > 0
    assert value(families, "rabbitmq_process_max_fds") >= value(families, "rabbitmq_process_open_fds") > 0


def test_per_object_queue_series_measure_each_queue(broker, scrape, name):
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare(name)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, f"m{i}".encode())
    # One message taken and held unacknowledged by a consumer of prefetch 1.
    ch.basic_qos(prefetch_count=1)
    held = []
    ch.basic_consume(name, lambda c, m, p, b: held.append(m), auto_ack=False)
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or held, what="a delivery")
    host = host_base(broker, name)
    try:
        def settled():
            f = scrape("/metrics/per-object", host)
            got = {k: value(f, k, vhost="/", queue=name) for k in (
                "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
                "rabbitmq_queue_messages", "rabbitmq_queue_consumers")}
            return got if got == {"rabbitmq_queue_messages_ready": 2,
                                  "rabbitmq_queue_messages_unacked": 1,
                                  "rabbitmq_queue_messages": 3,
                                  "rabbitmq_queue_consumers": 1} else None

        wait_for(settled, timeout=STATS_WAIT_S, interval=0.5, what=f"{name}'s figures in /metrics/per-object")
        families = scrape("/metrics/per-object", host)
        for metric in ("rabbitmq_queue_messages_ready", "rabbitmq_queue_consumers"):
            assert families[metric][0] == "gauge"
            assert any(l == {"vhost": "/", "queue": name} for _, l, _ in families[metric][1])
    finally:
        conn.close()
    # The channel's consumer is gone once its connection is.
    wait_for(lambda: value(scrape("/metrics/per-object", host), "rabbitmq_queue_consumers",
                           queue=name) == 0,
             timeout=STATS_WAIT_S, interval=0.5, what="the consumer to leave the metrics")
    ch2 = broker.connect().channel()
    ch2.queue_delete(name)
    ch2.connection.close()


DETAILED_QUEUE = {
    "rabbitmq_detailed_queue_messages_ready": ("gauge", {"vhost", "queue"}),
    "rabbitmq_detailed_queue_messages_unacked": ("gauge", {"vhost", "queue"}),
    "rabbitmq_detailed_queue_messages": ("gauge", {"vhost", "queue"}),
    "rabbitmq_detailed_queue_consumers": ("gauge", {"vhost", "queue"}),
}


def detailed_names(families):
    return {n for n in families if n.startswith("rabbitmq_detailed_")}


def test_detailed_serves_the_families_asked_for_and_no_others(broker, scrape, name):
    """`/metrics/detailed` as RabbitMQ 3.10's: per-object series of the families in the query
    only, named rabbitmq_detailed_*, the queue families limited to the vhosts asked for."""
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare(name)
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish("", name, b"x")
    host = host_base(broker, name)
    coarse = "/metrics/detailed?family=queue_coarse_metrics&family=queue_consumer_count"
    try:
        families = wait_for(
            lambda: (value(f := scrape(coarse, host), "rabbitmq_detailed_queue_messages",
                           vhost="/", queue=name) == 3) and f,
            timeout=STATS_WAIT_S, interval=0.5, what=f"{name} in /metrics/detailed")
        check(families, DETAILED_QUEUE)
        # RabbitMQ adds its queue processes' reductions, an Erlang figure.
        assert detailed_names(families) - set(DETAILED_QUEUE) <= {
            "rabbitmq_detailed_queue_process_reductions"}, detailed_names(families)
        assert value(families, "rabbitmq_detailed_queue_messages_ready", queue=name) == 3
        assert value(families, "rabbitmq_detailed_queue_messages_unacked", queue=name) == 0
        assert "rabbitmq_queue_messages_ready" not in families
        assert "rabbitmq_identity_info" in families

        # Nothing asked, nothing served but who the node is.
        families = scrape("/metrics/detailed", host)
        assert detailed_names(families) == set()
        assert "rabbitmq_identity_info" in families and "rabbitmq_connections" not in families

        # Another vhost: the families, without this queue.
        families = scrape(coarse + "&vhost=no-such-vhost", host)
        assert value(families, "rabbitmq_detailed_queue_messages", queue=name) == 0
        families = scrape(coarse + "&vhost=%2F", host)
        assert value(families, "rabbitmq_detailed_queue_messages", queue=name) == 3

        # queue_consumer_count is a subset of queue_metrics: asked with it, served once.
        with urllib.request.urlopen(
                host + "/metrics/detailed?family=queue_metrics&family=queue_consumer_count",
                timeout=10) as r:
            raw = r.read().decode()
        assert raw.count("# TYPE rabbitmq_detailed_queue_consumers gauge") == 1

        # The node's families, of the client's node (the queue's may be another); a family
        # nobody knows is ignored.
        families = scrape("/metrics/detailed?family=node_metrics&family=node_coarse_metrics"
                          "&family=connection_churn_metrics&family=vhost_status"
                          "&family=no_such_family")
        check(families, {
            "rabbitmq_detailed_process_max_fds": ("gauge", set()),
            "rabbitmq_detailed_resident_memory_limit_bytes": ("gauge", set()),
            "rabbitmq_detailed_process_resident_memory_bytes": ("gauge", set()),
            "rabbitmq_detailed_process_open_fds": ("gauge", set()),
            "rabbitmq_detailed_connections_opened": ("counter", set()),
            "rabbitmq_detailed_channels_closed": ("counter", set()),
            "rabbitmq_cluster_vhost_status": ("gauge", {"vhost"}),
        })
        assert value(families, "rabbitmq_detailed_connections_opened") >= 1
        assert value(families, "rabbitmq_detailed_process_resident_memory_bytes") > 0
        assert value(families, "rabbitmq_cluster_vhost_status", vhost="/") == 1
        assert not any(n.startswith("rabbitmq_detailed_queue_") for n in families)
    finally:
        ch.queue_delete(name)
        conn.close()


def test_global_counters_count_what_clients_did(broker, scrape, name):
    """Publishes count where the client is connected, deliveries where the queue lives."""
    classic = {"queue_type": "rabbit_classic_queue"}
    before = scrape()
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare(name)
    host = host_base(broker, name)
    before_host = scrape("/metrics", host)

    def grown(after, metric, by, **labels):
        old = before_host if "queue_type" in labels else before
        return value(after, metric, **labels) - value(old, metric, **labels) >= by

    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", name, b"x")
    # Two gets with manual ack, acknowledged; one get with auto ack; one consumer delivery
    # acknowledged; one get on the empty queue.
    for _ in range(2):
        method, _, _ = ch.basic_get(name, auto_ack=False)
        ch.basic_ack(method.delivery_tag)
    assert ch.basic_get(name, auto_ack=True)[0] is not None
    got = []
    tag = ch.basic_consume(name, lambda c, m, p, b: (got.append(m), c.basic_ack(m.delivery_tag)))
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or got, what="a delivery")
    ch.basic_cancel(tag)
    assert ch.basic_get(name, auto_ack=True)[0] is None
    publishers = value(scrape(), "rabbitmq_global_publishers")
    conn.close()

    def counted():
        after, at_host = scrape(), scrape("/metrics", host)
        return all([
            grown(after, "rabbitmq_global_messages_received", 4),
            grown(after, "rabbitmq_global_messages_confirmed", 4),
            grown(after, "rabbitmq_global_messages_routed", 4),
            grown(after, "rabbitmq_channel_messages_published", 4),
            grown(at_host, "rabbitmq_global_messages_delivered", 4, **classic),
            grown(at_host, "rabbitmq_global_messages_delivered_get_manual_ack", 2, **classic),
            grown(at_host, "rabbitmq_global_messages_delivered_get_auto_ack", 1, **classic),
            grown(at_host, "rabbitmq_global_messages_delivered_consume_manual_ack", 1, **classic),
            grown(at_host, "rabbitmq_global_messages_get_empty", 1, **classic),
            grown(at_host, "rabbitmq_global_messages_acknowledged", 3, **classic),
            grown(after, "rabbitmq_connections_opened", 1),
            grown(after, "rabbitmq_channels_opened", 1),
        ]) and after

    after = wait_for(counted, timeout=STATS_WAIT_S, interval=0.5, what="the counters to grow")
    assert publishers >= 1
    for metric in ("rabbitmq_global_messages_received", "rabbitmq_global_messages_delivered"):
        assert after[metric][0] == "counter"
    ch2 = broker.connect().channel()
    ch2.queue_delete(name)
    ch2.connection.close()


def test_queue_churn_counts_declares_creations_and_deletions(broker, scrape, name):
    """The Overview dashboard's queue churn panels: a redeclare is declared but not created,
    a passive declare is neither, an exclusive queue's end is a deletion."""
    churn = ("rabbitmq_queues_declared", "rabbitmq_queues_created", "rabbitmq_queues_deleted")
    before = scrape()
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare(name)
    ch.queue_declare(name)
    ch.queue_declare(name, passive=True)
    ch.queue_declare(f"{name}.b", durable=True)
    ch.queue_delete(name)
    ch.queue_delete(f"{name}.b")
    ch.queue_declare(f"{name}.x", exclusive=True)
    conn.close()

    def moved():
        after = scrape()
        return tuple(value(after, m) - value(before, m) for m in churn)
    wait_for(lambda: moved() == (4, 3, 3), timeout=STATS_WAIT_S, interval=0.2,
             what=f"declared, created, deleted to grow by (4, 3, 3) (moved {moved()})")


def test_quorum_queues_raft_series_follow_the_group(broker, scrape, name):
    if not broker.is_rabbitmq and not os.environ.get("WARREN_TEST_CLUSTER"):
        pytest.skip("warren's quorum queues have Raft groups only in a cluster")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish("", name, b"x", pika.BasicProperties(delivery_mode=2))

    # The leader's node: it alone times entries (client-local placement puts it on the
    # client's node; the cluster run's balanced locator may not).
    host = host_base(broker, name)

    def reported():
        f = scrape("/metrics/per-object", host)
        return (value(f, "rabbitmq_raft_term", queue=name) >= 1
                and value(f, "rabbitmq_raft_log_last_applied_index", queue=name) >= 1
                and any(l.get("queue") == name for _, l, _ in f.get(COMMIT_LATENCY, (0, []))[1])
                ) and f

    families = wait_for(reported, timeout=STATS_WAIT_S, interval=0.5,
                        what=f"{name}'s Raft group in /metrics/per-object")
    check(families, RAFT)
    # Its commit latency is reported by the leader's node (RabbitMQ's in whole
    # milliseconds, so possibly 0).
    check(families, {COMMIT_LATENCY: ("gauge", {"vhost", "queue"})})
    assert 0 <= value(families, COMMIT_LATENCY, queue=name) < 60
    ch.queue_delete(name)
    conn.close()


# More entries than a queue group applies between two snapshots (4096), so every member has
# taken one.
RAFT_ENTRIES = 4500


@pytest.mark.skipif(BROKER_KIND != "warren" or IN_CLUSTER_RUN, reason="starts warren nodes itself")
@pytest.mark.timeout(180)
def test_every_member_reports_the_raft_dashboards_indexes(cluster, name):  # noqa: F811
    """On each of a quorum queue's three members, the series the Raft dashboard draws its
    panels from: committed entries per second (commit index), uncommitted entries (last
    written - commit), log size since the snapshot (last written - snapshot) and elections
    (term). Once the publishes are settled every member has written, committed and applied
    them all, and taken a snapshot."""
    n1 = cluster.nodes[0]
    conn = n1.connection()
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    for _ in range(RAFT_ENTRIES - 1):
        ch.basic_publish("", name, b"x")
    confirmed = conn.channel()
    confirmed.confirm_delivery()
    confirmed.basic_publish("", name, b"last", pika.BasicProperties(delivery_mode=2))
    assert confirmed.queue_declare(name, passive=True).method.message_count == RAFT_ENTRIES
    conn.close()

    led, terms = [], set()
    for node in cluster.nodes:
        base = f"http://127.0.0.1:{node.http}"

        def settled():
            f = read_metrics(base, "/metrics/per-object")
            v = {m: value(f, m, queue=name) for m in RAFT}
            written = v["rabbitmq_raft_log_last_written_index"]
            return (v["rabbitmq_raft_term"] >= 1 and written >= RAFT_ENTRIES
                    and written == v["rabbitmq_raft_log_commit_index"]
                    == v["rabbitmq_raft_log_last_applied_index"]
                    and 0 < v["rabbitmq_raft_log_snapshot_index"] <= written) and (f, v)
        families, got = eventually(settled, f"{name}'s Raft indexes settled on {node.name}")
        check(families, RAFT)
        # /metrics sums them over the node's groups: this queue's is the only one.
        summed = read_metrics(base)
        for metric in RAFT:
            assert value(summed, metric) == got[metric], (node.name, metric)
        # /metrics/detailed's ra_metrics: the same, whatever vhost is asked (as 3.10).
        det = read_metrics(base, "/metrics/detailed?family=ra_metrics&vhost=no-such-vhost")
        for metric in RAFT:
            detailed = metric.replace("rabbitmq_", "rabbitmq_detailed_", 1)
            assert value(det, detailed, queue=name) == got[metric], (node.name, detailed)
        # The commit latency only where the queue was led (declared on n1, led there:
        # client-local); /metrics has the average of the node's groups, here the one.
        terms.add(got["rabbitmq_raft_term"])
        if node is n1 or COMMIT_LATENCY in families:
            led.append(node.name)
            check(families, {COMMIT_LATENCY: ("gauge", {"vhost", "queue"})})
            assert 0 < value(families, COMMIT_LATENCY, queue=name) < 60, node.name
            assert value(summed, COMMIT_LATENCY) == value(families, COMMIT_LATENCY, queue=name)
        else:
            assert COMMIT_LATENCY not in summed, node.name
    # One term, one leader ever: only n1 has timed entries (an election under load may have
    # made another node lead for a while, and then it reports its own).
    if terms == {1}:
        assert led == ["n1"], led
