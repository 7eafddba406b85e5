//! What `/metrics` shows of queues, channels and consumers: a snapshot of the node taken every
//! [`EMIT_INTERVAL`] by a task of its own, as RabbitMQ's queues emit their statistics every
//! `collect_statistics_interval` (5 s) into tables its Prometheus plugin reads.
//!
//! A scrape reads the latest snapshot (an `Arc` clone under a lock nothing else holds for more
//! than a pointer swap) and the node's atomic counters; it never takes a vhost lock, so a
//! scraper polling every second costs the data path nothing. The task pays for the snapshot:
//! one pass over each vhost's queues under its lock, copying a few integers per queue (the same
//! pass `/api/queues` makes), every 5 s whether or not anyone scrapes.
//!
//! Counts that RabbitMQ keeps for the node's lifetime (`rabbitmq_global_messages_delivered_total`,
//! ...) are sums over queues here, and a queue's counts leave with it; so the task accumulates
//! each queue's increase since the previous snapshot, which never goes down.

use crate::Shared;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use warren_broker::queue::QueueStats;

/// RabbitMQ's default `collect_statistics_interval`.
pub const EMIT_INTERVAL: Duration = Duration::from_secs(5);

/// RabbitMQ's queue types, as its metrics label them.
pub const QUEUE_TYPES: [&str; 3] = [
    "rabbit_classic_queue",
    "rabbit_quorum_queue",
    "rabbit_stream_queue",
];

/// The `queue_type` label of one of warren's queue types.
fn queue_type_label(name: &str) -> &'static str {
    match name {
        "quorum" => QUEUE_TYPES[1],
        "stream" => QUEUE_TYPES[2],
        _ => QUEUE_TYPES[0],
    }
}

/// One queue hosted on this node.
#[derive(Debug, Clone, Default)]
pub struct QueueFigures {
    pub vhost: String,
    pub name: String,
    pub queue_type: &'static str,
    pub durable: bool,
    pub messages_ready: u64,
    pub messages_unacked: u64,
    pub message_bytes_ready: u64,
    pub messages_paged_out: u64,
    pub consumers: u64,
    pub stats: QueueStats,
}

/// A quorum queue's Raft group as this node, one of its members, sees it.
#[derive(Debug, Clone, Default)]
pub struct RaftFigures {
    pub vhost: String,
    pub name: String,
    pub term: u64,
    pub applied: u64,
    pub commit: u64,
    /// The highest index durably in this member's log.
    pub written: u64,
    pub snapshot_index: u64,
    /// While this member led: how long its latest timed entries took to commit.
    pub commit_latency: Option<std::time::Duration>,
}

/// Lifetime message counts of the node by queue type (index into [`QUEUE_TYPES`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub by_type: [QueueStats; 3],
}

impl Totals {
    pub fn all(&self) -> QueueStats {
        let mut sum = QueueStats::default();
        for t in &self.by_type {
            add(&mut sum, t, &QueueStats::default());
        }
        sum
    }
}

/// `into += new - old`, field by field (a counter that went down counts as 0).
fn add(into: &mut QueueStats, new: &QueueStats, old: &QueueStats) {
    let d = |a: u64, b: u64| a.saturating_sub(b);
    into.publish += d(new.publish, old.publish);
    into.deliver_get += d(new.deliver_get, old.deliver_get);
    into.redeliver += d(new.redeliver, old.redeliver);
    into.ack += d(new.ack, old.ack);
    into.deliver_no_ack += d(new.deliver_no_ack, old.deliver_no_ack);
    into.get += d(new.get, old.get);
    into.get_no_ack += d(new.get_no_ack, old.get_no_ack);
    into.get_empty += d(new.get_empty, old.get_empty);
}

/// The node at one moment.
#[derive(Debug, Default)]
pub struct NodeStats {
    /// The queues this node hosts: in a cluster a queue's figures come from its node alone,
    /// as in RabbitMQ, so summing over nodes counts each queue once.
    pub queues: Vec<QueueFigures>,
    pub raft: Vec<RaftFigures>,
    /// Every vhost of the broker (`rabbitmq_cluster_vhost_status`).
    pub vhosts: Vec<String>,
    /// Channels open on this node's vhosts (the management API's own included).
    pub channels: u64,
    pub totals: Totals,
}

/// The latest snapshot, and what the next one adds to the lifetime totals.
#[derive(Default)]
pub struct Board {
    latest: RwLock<Arc<NodeStats>>,
    previous: std::sync::Mutex<HashMap<(String, String), QueueStats>>,
}

impl Board {
    pub fn latest(&self) -> Arc<NodeStats> {
        self.latest.read().expect("stats board lock").clone()
    }

    /// Takes a snapshot of the node and publishes it.
    pub fn emit(&self, shared: &Shared) {
        let mut snapshot = collect(shared);
        let mut previous = self.previous.lock().expect("stats previous lock");
        let mut totals = self.latest().totals;
        let mut seen = HashMap::with_capacity(snapshot.queues.len());
        for q in &snapshot.queues {
            let key = (q.vhost.clone(), q.name.clone());
            let old = previous.get(&key).copied().unwrap_or_default();
            let i = QUEUE_TYPES
                .iter()
                .position(|t| *t == q.queue_type)
                .unwrap_or(0);
            add(&mut totals.by_type[i], &q.stats, &old);
            seen.insert(key, q.stats);
        }
        *previous = seen;
        snapshot.totals = totals;
        *self.latest.write().expect("stats board lock") = Arc::new(snapshot);
    }
}

/// The figures of the queues this node hosts, its quorum queues' Raft groups and its channels.
fn collect(shared: &Shared) -> NodeStats {
    let me = shared.node_name();
    let mut out = NodeStats::default();
    for (vhost, v) in shared.broker.vhosts() {
        out.vhosts.push(vhost.clone());
        let (infos, channels) = {
            let v = v.lock().expect("vhost lock");
            (v.queue_infos(), v.channel_count())
        };
        out.channels += channels as u64;
        for mut info in infos {
            if !info.members.is_empty() {
                if let (Some(log), Some(cluster)) = (info.log_id, &shared.cluster) {
                    let group = warren_cluster::replicas::group_id(log);
                    if let Some(view) = cluster.queue_groups().view(group) {
                        out.raft.push(RaftFigures {
                            vhost: vhost.clone(),
                            name: info.name.clone(),
                            term: view.term,
                            applied: view.applied,
                            commit: view.commit,
                            written: view.written,
                            snapshot_index: view.snapshot_index,
                            commit_latency: view.commit_latency,
                        });
                    }
                }
            }
            if info.node.as_deref().is_some_and(|n| n != me) {
                continue;
            }
            if let Some(c) = crate::queue_stats::replica_counts(shared, &vhost, &info) {
                crate::queue_stats::set_counts(&mut info, &c);
            }
            crate::queue_stats::stream_figures(shared, &mut info);
            out.queues.push(QueueFigures {
                vhost: vhost.clone(),
                queue_type: queue_type_label(info.queue_type),
                durable: info.durable,
                messages_ready: info.messages_ready,
                messages_unacked: info.messages_unacknowledged,
                message_bytes_ready: info.message_bytes_ready,
                messages_paged_out: info.messages_paged_out,
                consumers: info.consumers,
                stats: info.stats,
                name: info.name,
            });
        }
    }
    out
}

/// Emits a snapshot now and every [`EMIT_INTERVAL`] until the node stops.
pub fn start(shared: Arc<Shared>) {
    shared.node_stats.emit(&shared);
    tokio::spawn(async move {
        let mut t = tokio::time::interval(EMIT_INTERVAL);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t.tick().await;
        loop {
            t.tick().await;
            shared.node_stats.emit(&shared);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_grow_by_each_queues_increase_and_never_shrink() {
        let mut total = QueueStats::default();
        let old = QueueStats {
            publish: 5,
            ack: 3,
            ..Default::default()
        };
        let new = QueueStats {
            publish: 8,
            ack: 2, // a queue redeclared after a delete starts again from 0
            ..Default::default()
        };
        add(&mut total, &new, &old);
        assert_eq!(total.publish, 3);
        assert_eq!(total.ack, 0);
    }

    #[test]
    fn queue_types_are_labelled_as_rabbitmq_labels_them() {
        assert_eq!(queue_type_label("classic"), "rabbit_classic_queue");
        assert_eq!(queue_type_label("quorum"), "rabbit_quorum_queue");
        assert_eq!(queue_type_label("stream"), "rabbit_stream_queue");
    }
}
