//! Prometheus metrics: `/metrics` (the node's totals), `/metrics/per-object` (queues and
//! Raft groups one by one) and `/metrics/detailed` (the families asked for, in
//! [`detailed`]), in the names, labels and types of RabbitMQ 3.10's
//! `rabbitmq_prometheus` plugin, so its Grafana dashboards ("RabbitMQ-Overview",
//! "RabbitMQ-Quorum-Queues-Raft") work unchanged; warren's own engine metrics keep `warren_`
//! names (in `engine`). Unauthenticated, as RabbitMQ's plugin is.
//!
//! A scrape reads atomic counters and the snapshot [`super::node_stats`] takes every 5 s; it
//! takes no lock the data path waits on. The text is encoded by `prometheus-client` in the
//! Prometheus text format 0.0.4, RabbitMQ's, from a [`Collector`] that streams each family
//! straight from the snapshot (no per-scrape registry of 10,000 queues' gauges).

use super::node_stats::{NodeStats, QueueFigures, RaftFigures, QUEUE_TYPES};
use super::Api;
use crate::Shared;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod detailed;
mod engine;
pub use detailed::metrics_detailed;

/// The RabbitMQ release whose plugin's metrics these are (as clients are told, see README).
const RABBITMQ_VERSION: &str = "3.10.8";
const PROTOCOL: [(&str, &str); 1] = [("protocol", "amqp091")];

/// `GET /metrics`: every `rabbitmq_queue_*` and `rabbitmq_raft_*` summed over the node, as
/// RabbitMQ's plugin answers by default.
pub async fn metrics(State(s): Api) -> Response {
    render(&s, false)
}

/// `GET /metrics/per-object`: queue and Raft metrics labelled by `vhost` and `queue`.
pub async fn metrics_per_object(State(s): Api) -> Response {
    render(&s, true)
}

fn render(s: &Arc<Shared>, per_object: bool) -> Response {
    let node = Node {
        stats: s.node_stats.latest(),
        readings: Readings::take(s),
        per_object,
    };
    let Some(mut out) = encode(node) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    if let Some(cluster) = &s.cluster {
        warren_cluster::metrics::write_prometheus(&cluster.status(), &mut out);
        if let Some(tls) = cluster.link_tls() {
            tls.write_prometheus(&mut out);
        }
    }
    text(out)
}

/// The Prometheus text of one collector's families.
fn encode(collector: impl Collector + 'static) -> Option<String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).ok()?;
    Some(out)
}

fn text(body: String) -> Response {
    (
        [(
            "content-type",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        body,
    )
        .into_response()
}

/// What a scrape reads besides the snapshot: atomics and a few readings of the process.
#[derive(Debug, Default)]
struct Readings {
    node: String,
    cluster: String,
    connections: u64,
    connections_flow: u64,
    published: u64,
    confirmed: u64,
    unroutable: u64,
    returned: u64,
    auth_failures: u64,
    handshake_timeouts: u64,
    connections_opened: u64,
    connections_closed: u64,
    channels_opened: u64,
    channels_closed: u64,
    queues_declared: u64,
    queues_created: u64,
    queues_deleted: u64,
    publishers: u64,
    alarms: [(&'static str, bool); 3],
    rss_bytes: u64,
    memory_limit_bytes: u64,
    disk_free_bytes: Option<u64>,
    disk_limit_bytes: u64,
    open_fds: u64,
    max_fds: u64,
    tls: Option<crate::tls::TlsCounts>,
    message_memory: Option<(u64, u64)>,
    store: Option<warren_store::Stats>,
}

impl Readings {
    fn take(s: &Shared) -> Readings {
        let c = &s.counters;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let alarms = s.alarms.state();
        // Every node names the cluster after its first member, as RabbitMQ names a cluster
        // after the node that formed it, so that all nodes carry the same `rabbitmq_cluster`.
        let cluster = s
            .cluster
            .as_ref()
            .and_then(|c| c.status().members.first().map(|m| m.name.clone()))
            .unwrap_or_else(|| s.node_name().to_string());
        Readings {
            node: s.node_name().to_string(),
            cluster,
            connections: s.connections_open.load(Ordering::Relaxed) as u64,
            connections_flow: s
                .connections
                .list()
                .iter()
                .filter(|e| e.flow.in_flow())
                .count() as u64,
            published: load(&c.published),
            confirmed: load(&c.confirmed),
            unroutable: load(&c.unroutable),
            returned: load(&c.returned),
            auth_failures: load(&c.auth_failures),
            handshake_timeouts: load(&c.handshake_timeouts),
            connections_opened: load(&c.connections_opened),
            connections_closed: load(&c.connections_closed),
            channels_opened: load(&c.channels_opened),
            channels_closed: load(&c.channels_closed),
            queues_declared: load(&s.broker.queue_churn.declared),
            queues_created: load(&s.broker.queue_churn.created),
            queues_deleted: load(&s.broker.queue_churn.deleted),
            publishers: load(&c.publishers),
            alarms: [
                ("memory_used_watermark", alarms.memory),
                ("free_disk_space_watermark", alarms.disk),
                ("storage_failure", alarms.storage),
            ],
            rss_bytes: crate::node::memory::rss_bytes(),
            memory_limit_bytes: s.alarms.memory_watermark_bytes.load(Ordering::Relaxed),
            disk_free_bytes: s.alarms.disk_free_bytes(),
            disk_limit_bytes: s.alarms.disk_free_limit_bytes.load(Ordering::Relaxed),
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
            max_fds: max_fds(),
            tls: s.tls.as_ref().map(|t| t.counts()),
            message_memory: s
                .broker
                .memory_budget()
                .map(|b| (b.used() as u64, b.limit() as u64)),
            store: s.store.as_ref().map(|st| st.stats()),
        }
    }
}

/// The soft limit on open files: what bounds connections and segment files alike.
pub(crate) fn max_fds() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own and reads nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        0
    }
}

#[derive(Debug)]
struct Node {
    stats: Arc<NodeStats>,
    readings: Readings,
    per_object: bool,
}

/// One family; `name` without `_total` for counters (the encoder adds it).
fn family<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let counts = matches!(kind, MetricType::Counter);
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in samples {
        let sample = metric.encode_family(&labels)?;
        if counts {
            ConstCounter::new(v).encode(sample)?;
        } else {
            ConstGauge::new(v).encode(sample)?;
        }
    }
    Ok(())
}

type NoLabels = [(&'static str, &'static str); 0];

fn one(v: u64) -> [(NoLabels, u64); 1] {
    [([], v)]
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    family(enc, name, help, MetricType::Gauge, one(v))
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> fmt::Result {
    family(enc, name, help, MetricType::Counter, one(v))
}

const DISK_FREE_HELP: &str = "Disk space available in bytes";

type QueueField = fn(&QueueFigures) -> u64;

/// RabbitMQ's per-queue series, named after their prefix (`rabbitmq_`, or `rabbitmq_detailed_`
/// on `/metrics/detailed`), with the family `/metrics/detailed` serves them in ("": none, as
/// in 3.10, whose published count there is per channel).
const QUEUE_SERIES: [(&str, &str, MetricType, QueueField, &str); 7] = [
    (
        "queue_messages_ready",
        "Messages ready to be delivered to consumers",
        MetricType::Gauge,
        |q| q.messages_ready,
        "queue_coarse_metrics",
    ),
    (
        "queue_messages_unacked",
        "Messages delivered to consumers but not yet acknowledged",
        MetricType::Gauge,
        |q| q.messages_unacked,
        "queue_coarse_metrics",
    ),
    (
        "queue_messages",
        "Sum of ready and unacknowledged messages - total queue depth",
        MetricType::Gauge,
        |q| q.messages_ready + q.messages_unacked,
        "queue_coarse_metrics",
    ),
    (
        "queue_consumers",
        "Consumers on a queue",
        MetricType::Gauge,
        |q| q.consumers,
        "queue_metrics",
    ),
    (
        "queue_messages_ready_bytes",
        "Size in bytes of ready messages",
        MetricType::Gauge,
        |q| q.message_bytes_ready,
        "queue_metrics",
    ),
    (
        "queue_messages_paged_out",
        "Messages paged out to disk",
        MetricType::Gauge,
        |q| q.messages_paged_out,
        "queue_metrics",
    ),
    (
        "queue_messages_published",
        "Total number of messages published to queues",
        MetricType::Counter,
        |q| q.stats.publish,
        "",
    ),
];

type RaftField = fn(&RaftFigures) -> u64;

/// A quorum queue's Raft group as one member sees it (`ra_metrics` on `/metrics/detailed`).
const RAFT_SERIES: [(&str, &str, MetricType, RaftField); 5] = [
    (
        "raft_term",
        "Current Raft term number",
        MetricType::Counter,
        |g| g.term,
    ),
    (
        "raft_log_snapshot_index",
        "Raft log snapshot index",
        MetricType::Gauge,
        |g| g.snapshot_index,
    ),
    (
        "raft_log_last_applied_index",
        "Raft log last applied index",
        MetricType::Gauge,
        |g| g.applied,
    ),
    (
        "raft_log_commit_index",
        "Raft log commit index",
        MetricType::Gauge,
        |g| g.commit,
    ),
    (
        "raft_log_last_written_index",
        "Raft log last written index",
        MetricType::Gauge,
        |g| g.written,
    ),
];

/// The node's churn counters and process figures, with their `/metrics/detailed` family.
/// Free disk space is not among them: it is absent when unknown.
fn node_series(r: &Readings) -> [(&'static str, &'static str, MetricType, u64, &'static str); 14] {
    use MetricType::{Counter, Gauge};
    let churn = "connection_churn_metrics";
    [
        (
            "connections_opened",
            "Total number of connections opened",
            Counter,
            r.connections_opened,
            churn,
        ),
        (
            "connections_closed",
            "Total number of connections closed or terminated",
            Counter,
            r.connections_closed,
            churn,
        ),
        (
            "channels_opened",
            "Total number of channels opened",
            Counter,
            r.channels_opened,
            churn,
        ),
        (
            "channels_closed",
            "Total number of channels closed",
            Counter,
            r.channels_closed,
            churn,
        ),
        (
            "queues_declared",
            "Total number of queues declared",
            Counter,
            r.queues_declared,
            churn,
        ),
        (
            "queues_created",
            "Total number of queues created",
            Counter,
            r.queues_created,
            churn,
        ),
        (
            "queues_deleted",
            "Total number of queues deleted",
            Counter,
            r.queues_deleted,
            churn,
        ),
        (
            "process_resident_memory_bytes",
            "Memory used in bytes",
            Gauge,
            r.rss_bytes,
            "node_coarse_metrics",
        ),
        (
            "resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            Gauge,
            r.memory_limit_bytes,
            "node_metrics",
        ),
        (
            "disk_space_available_limit_bytes",
            "Free disk space low watermark in bytes",
            Gauge,
            r.disk_limit_bytes,
            "node_metrics",
        ),
        (
            "process_open_fds",
            "Open file descriptors",
            Gauge,
            r.open_fds,
            "node_coarse_metrics",
        ),
        (
            "process_max_fds",
            "Open file descriptors limit",
            Gauge,
            r.max_fds,
            "node_metrics",
        ),
        (
            "process_open_tcp_sockets",
            "Open TCP sockets (AMQP connections)",
            Gauge,
            r.connections,
            "node_coarse_metrics",
        ),
        (
            "process_max_tcp_sockets",
            "Open TCP sockets limit (the file descriptor limit)",
            Gauge,
            r.max_fds,
            "node_metrics",
        ),
    ]
}

impl Collector for Node {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        self.encode_node(&mut enc)?;
        self.encode_queues(&mut enc)?;
        self.encode_messages(&mut enc)?;
        self.encode_raft(&mut enc)?;
        self.encode_warren(&mut enc)
    }
}

impl Node {
    /// Identity, connections, channels, alarms and the process: the Overview dashboard's
    /// top row and "nodes" table.
    fn encode_node(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let r = &self.readings;
        let s = &self.stats;
        let consumers: u64 = s.queues.iter().map(|q| q.consumers).sum();
        self.encode_identity(enc)?;
        gauge(
            enc,
            "rabbitmq_connections",
            "Connections currently open",
            r.connections,
        )?;
        gauge(
            enc,
            "rabbitmq_channels",
            "Channels currently open",
            s.channels,
        )?;
        gauge(
            enc,
            "rabbitmq_consumers",
            "Consumers currently connected",
            consumers,
        )?;
        gauge(
            enc,
            "rabbitmq_queues",
            "Queues available",
            s.queues.len() as u64,
        )?;
        for (name, help, kind, v, _) in node_series(r) {
            family(enc, &format!("rabbitmq_{name}"), help, kind, one(v))?;
        }
        if let Some(free) = r.disk_free_bytes {
            gauge(
                enc,
                "rabbitmq_disk_space_available_bytes",
                DISK_FREE_HELP,
                free,
            )?;
        }
        for (name, on) in r.alarms.iter().take(2) {
            let help = format!("is 1 if the {name} alarm is in effect");
            let metric = format!("rabbitmq_alarms_{name}");
            family(
                enc,
                &metric,
                &help,
                MetricType::Unknown,
                one(u64::from(*on)),
            )?;
        }
        family(
            enc,
            "rabbitmq_alarms_file_descriptor_limit",
            "is 1 if file descriptor limit alarm is in effect (warren raises none)",
            MetricType::Unknown,
            one(0),
        )
    }

    /// Which node of which cluster, and which release: every endpoint has them, so that a
    /// dashboard joins any series to its node.
    fn encode_identity(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let r = &self.readings;
        family(
            enc,
            "rabbitmq_identity_info",
            "RabbitMQ node & cluster identity info",
            MetricType::Unknown,
            [(
                [
                    ("rabbitmq_node", r.node.as_str()),
                    ("rabbitmq_cluster", r.cluster.as_str()),
                ],
                1,
            )],
        )?;
        family(
            enc,
            "rabbitmq_build_info",
            "RabbitMQ & Erlang/OTP version info",
            MetricType::Unknown,
            [(
                [
                    ("rabbitmq_version", RABBITMQ_VERSION),
                    ("prometheus_plugin_version", RABBITMQ_VERSION),
                    ("erlang_version", "none"),
                    ("warren_version", env!("CARGO_PKG_VERSION")),
                ],
                1,
            )],
        )
    }

    /// Queue depths: summed over the node, or one sample per queue.
    fn encode_queues(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let queues = &self.stats.queues;
        for (suffix, help, kind, field, _) in QUEUE_SERIES {
            let name = format!("rabbitmq_{suffix}");
            if self.per_object {
                let samples = queues.iter().map(|q| {
                    (
                        [("vhost", q.vhost.as_str()), ("queue", q.name.as_str())],
                        field(q),
                    )
                });
                family(enc, &name, help, kind, samples)?;
            } else if matches!(kind, MetricType::Counter) {
                // Summed over the queues there are now would go down when one is deleted.
                let all = self.stats.totals.all().publish;
                family(enc, &name, help, kind, one(all))?;
            } else {
                let sum: u64 = queues.iter().map(field).sum();
                family(enc, &name, help, kind, one(sum))?;
            }
        }
        Ok(())
    }

    /// What publishers and consumers did: RabbitMQ's `rabbitmq_global_*` by protocol and
    /// queue type, and its `rabbitmq_channel_*` (per channel in RabbitMQ, of the node here:
    /// the dashboards sum them).
    fn encode_messages(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let r = &self.readings;
        let t = &self.stats.totals;
        let all = t.all();
        let dropped = r.unroutable.saturating_sub(r.returned);
        let consumers: u64 = self.stats.queues.iter().map(|q| q.consumers).sum();
        let unacked: u64 = self.stats.queues.iter().map(|q| q.messages_unacked).sum();
        let by_protocol = [
            ("rabbitmq_global_messages_received", "Total number of messages received from publishers", r.published),
            ("rabbitmq_global_messages_confirmed", "Total number of messages confirmed to publishers", r.confirmed),
            ("rabbitmq_global_messages_routed", "Total number of messages routed to queues or streams", r.published - r.unroutable.min(r.published)),
            ("rabbitmq_global_messages_unroutable_dropped", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", dropped),
            ("rabbitmq_global_messages_unroutable_returned", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", r.returned),
        ];
        for (name, help, v) in by_protocol {
            family(enc, name, help, MetricType::Counter, [(PROTOCOL, v)])?;
        }
        type Field = fn(&warren_broker::queue::QueueStats) -> u64;
        let by_type: [(&str, &str, Field); 8] = [
            ("rabbitmq_global_messages_delivered", "Total number of messages delivered to consumers", |s| s.deliver_get),
            ("rabbitmq_global_messages_delivered_consume_manual_ack", "Total number of messages delivered to consumers using basic.consume with manual acknowledgment", consume_manual),
            ("rabbitmq_global_messages_delivered_consume_auto_ack", "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment", |s| s.deliver_no_ack),
            ("rabbitmq_global_messages_delivered_get_manual_ack", "Total number of messages delivered to consumers using basic.get with manual acknowledgment", |s| s.get - s.get_no_ack),
            ("rabbitmq_global_messages_delivered_get_auto_ack", "Total number of messages delivered to consumers using basic.get with automatic acknowledgment", |s| s.get_no_ack),
            ("rabbitmq_global_messages_get_empty", "Total number of times basic.get operations fetched no message", |s| s.get_empty),
            ("rabbitmq_global_messages_redelivered", "Total number of messages redelivered to consumers", |s| s.redeliver),
            ("rabbitmq_global_messages_acknowledged", "Total number of messages acknowledged by consumers", |s| s.ack),
        ];
        for (name, help, field) in by_type {
            let samples = QUEUE_TYPES
                .iter()
                .zip(&t.by_type)
                .map(|(qt, s)| ([("protocol", "amqp091"), ("queue_type", *qt)], field(s)));
            family(enc, name, help, MetricType::Counter, samples)?;
        }
        family(
            enc,
            "rabbitmq_auth_attempts_failed",
            "Total number of failed authentication attempts",
            MetricType::Counter,
            [(PROTOCOL, r.auth_failures)],
        )?;
        family(
            enc,
            "rabbitmq_global_publishers",
            "Current number of publishers",
            MetricType::Gauge,
            [(PROTOCOL, r.publishers)],
        )?;
        family(
            enc,
            "rabbitmq_global_consumers",
            "Current number of consumers",
            MetricType::Gauge,
            [(PROTOCOL, consumers)],
        )?;
        gauge(
            enc,
            "rabbitmq_channel_consumers",
            "Consumers on a channel",
            consumers,
        )?;
        gauge(
            enc,
            "rabbitmq_channel_messages_unacked",
            "Delivered but not yet acknowledged messages",
            unacked,
        )?;
        let channel = [
            ("rabbitmq_channel_messages_published", "Total number of messages published into an exchange on a channel", r.published),
            ("rabbitmq_channel_messages_confirmed", "Total number of messages published into an exchange and confirmed on the channel", r.confirmed),
            ("rabbitmq_channel_messages_unroutable_returned", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", r.returned),
            ("rabbitmq_channel_messages_unroutable_dropped", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", dropped),
            ("rabbitmq_channel_get_ack", "Total number of messages fetched with basic.get in manual acknowledgement mode", all.get - all.get_no_ack),
            ("rabbitmq_channel_get", "Total number of messages fetched with basic.get in automatic acknowledgement mode", all.get_no_ack),
            ("rabbitmq_channel_messages_delivered_ack", "Total number of messages delivered to consumers in manual acknowledgement mode", consume_manual(&all)),
            ("rabbitmq_channel_messages_delivered", "Total number of messages delivered to consumers in automatic acknowledgement mode", all.deliver_no_ack),
            ("rabbitmq_channel_messages_redelivered", "Total number of messages redelivered to consumers", all.redeliver),
            ("rabbitmq_channel_messages_acked", "Total number of messages acknowledged by consumers", all.ack),
            ("rabbitmq_channel_get_empty", "Total number of times basic.get operations fetched no message", all.get_empty),
        ];
        for (name, help, v) in channel {
            counter(enc, name, help, v)?;
        }
        Ok(())
    }

    /// Quorum queues' Raft groups of which this node is a member, as the groups report them:
    /// the term, and the commit, last written (durable), applied and snapshot indexes, so the
    /// Raft dashboard's committed-entries rate, uncommitted entries (written - commit) and log
    /// size (written - snapshot) panels are drawn, and the entry commit latency of the groups
    /// this node has led ([`encode_commit_latency`](Self::encode_commit_latency)).
    fn encode_raft(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let raft = &self.stats.raft;
        for (suffix, help, kind, field) in RAFT_SERIES {
            let name = &format!("rabbitmq_{suffix}");
            if self.per_object {
                let samples = raft.iter().map(|g| {
                    (
                        [("vhost", g.vhost.as_str()), ("queue", g.name.as_str())],
                        field(g),
                    )
                });
                family(enc, name, help, kind, samples)?;
            } else if !raft.is_empty() {
                let sum: u64 = raft.iter().map(field).sum();
                family(enc, name, help, kind, one(sum))?;
            }
        }
        self.encode_commit_latency(enc, "rabbitmq_")
    }

    /// `rabbitmq_raft_entry_commit_latency_seconds`, measured by a group's leader only (see
    /// `warren_cluster`'s groups/commit_latency.rs), so a member that never led has no sample.
    /// Summed over the node it would grow with the number of queues: as rabbitmq_prometheus
    /// does, `/metrics` gives the average of the node's groups.
    fn encode_commit_latency(&self, enc: &mut DescriptorEncoder, prefix: &str) -> fmt::Result {
        let timed: Vec<_> = self
            .stats
            .raft
            .iter()
            .filter_map(|g| Some((g, g.commit_latency?.as_secs_f64())))
            .collect();
        if timed.is_empty() {
            return Ok(());
        }
        let name = format!("{prefix}raft_entry_commit_latency_seconds");
        let mut metric = enc.encode_descriptor(
            &name,
            "Time taken for a log entry to be committed",
            None,
            MetricType::Gauge,
        )?;
        if self.per_object {
            for (g, seconds) in &timed {
                let labels = [("vhost", g.vhost.as_str()), ("queue", g.name.as_str())];
                ConstGauge::new(*seconds).encode(metric.encode_family(&labels)?)?;
            }
        } else {
            let mean = timed.iter().map(|(_, s)| s).sum::<f64>() / timed.len() as f64;
            ConstGauge::new(mean).encode(metric.encode_family(&[] as &NoLabels)?)?;
        }
        Ok(())
    }
}

/// Consumer deliveries with manual ack: every delivery that was neither a get nor to a no-ack
/// consumer (a quorum queue's replica reports no split: its deliveries all count here).
fn consume_manual(s: &warren_broker::queue::QueueStats) -> u64 {
    s.deliver_get.saturating_sub(s.get + s.deliver_no_ack)
}
