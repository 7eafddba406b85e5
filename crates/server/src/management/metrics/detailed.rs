//! `GET /metrics/detailed?family=F&vhost=V`: RabbitMQ 3.10's endpoint for the per-object
//! series of the families a scraper asks for, and no others, so that watching a few figures of
//! 10,000 queues does not cost a `/metrics/per-object` scrape of everything. Its series are
//! named `rabbitmq_detailed_*`, so they never collide with those of `/metrics` in one
//! Prometheus. As in RabbitMQ: with no `family` it serves only the node's identity; unknown
//! families are ignored; `vhost` (repeatable) limits the queue families (`queue_coarse_metrics`,
//! `queue_consumer_count`, `queue_metrics`) to those vhosts; `queue_consumer_count` is the
//! subset of `queue_metrics` served alone, so asking for both gives `queue_consumers` once.
//!
//! The families served are those whose figures warren keeps: `connection_churn_metrics`
//! (without the queue churn counters), `node_coarse_metrics` and `node_metrics` (without
//! Erlang's), `ra_metrics`, `queue_coarse_metrics` (without Erlang's reductions),
//! `queue_consumer_count`, `queue_metrics` (consumers, ready bytes, paged out) and
//! `vhost_status`. Series of 3.10's other families (per channel and per connection, the
//! persister's file I/O, auth attempts, exchange names and bindings) are absent rather than
//! made up, as on the other endpoints. Everything is read from the same 5 s snapshot and
//! atomic counters as `/metrics`: a scrape takes no lock the data path waits on.

use super::{
    encode, family, gauge, node_series, one, text, Node, Readings, DISK_FREE_HELP, QUEUE_SERIES,
    RAFT_SERIES,
};
use crate::management::Api;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use std::collections::{BTreeSet, HashSet};
use std::fmt;

const PREFIX: &str = "rabbitmq_detailed_";

pub async fn metrics_detailed(
    State(s): Api,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let mut families = BTreeSet::new();
    let mut vhosts: Option<HashSet<String>> = None;
    for (key, value) in params {
        match key.as_str() {
            "family" => {
                families.insert(value);
            }
            "vhost" => {
                vhosts.get_or_insert_with(HashSet::new).insert(value);
            }
            _ => {}
        }
    }
    let detailed = Detailed {
        node: Node {
            stats: s.node_stats.latest(),
            readings: Readings::take(&s),
            per_object: true,
        },
        families,
        vhosts,
    };
    match encode(detailed) {
        Some(out) => text(out),
        None => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[derive(Debug)]
struct Detailed {
    node: Node,
    families: BTreeSet<String>,
    /// `None`: every vhost.
    vhosts: Option<HashSet<String>>,
}

impl Detailed {
    fn asks(&self, family: &str) -> bool {
        self.families.contains(family)
    }

    fn serves_vhost(&self, vhost: &str) -> bool {
        self.vhosts.as_ref().is_none_or(|v| v.contains(vhost))
    }

    fn encode_node(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let r = &self.node.readings;
        for (name, help, kind, v, family_name) in node_series(r) {
            if self.asks(family_name) {
                family(enc, &format!("{PREFIX}{name}"), help, kind, one(v))?;
            }
        }
        if let (true, Some(free)) = (self.asks("node_coarse_metrics"), r.disk_free_bytes) {
            gauge(
                enc,
                &format!("{PREFIX}disk_space_available_bytes"),
                DISK_FREE_HELP,
                free,
            )?;
        }
        Ok(())
    }

    fn encode_queues(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let consumers_alone = self.asks("queue_consumer_count") && !self.asks("queue_metrics");
        let queues: Vec<_> = self
            .node
            .stats
            .queues
            .iter()
            .filter(|q| self.serves_vhost(&q.vhost))
            .collect();
        for (suffix, help, kind, field, family_name) in QUEUE_SERIES {
            let wanted = (!family_name.is_empty() && self.asks(family_name))
                || (suffix == "queue_consumers" && consumers_alone);
            if !wanted {
                continue;
            }
            let samples = queues.iter().map(|q| {
                (
                    [("vhost", q.vhost.as_str()), ("queue", q.name.as_str())],
                    field(q),
                )
            });
            family(enc, &format!("{PREFIX}{suffix}"), help, kind, samples)?;
        }
        Ok(())
    }

    /// Every group of which this node is a member, whatever `vhost` says (as 3.10).
    fn encode_raft(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        if !self.asks("ra_metrics") {
            return Ok(());
        }
        for (suffix, help, kind, field) in RAFT_SERIES {
            let samples = self.node.stats.raft.iter().map(|g| {
                (
                    [("vhost", g.vhost.as_str()), ("queue", g.name.as_str())],
                    field(g),
                )
            });
            family(enc, &format!("{PREFIX}{suffix}"), help, kind, samples)?;
        }
        self.node.encode_commit_latency(enc, PREFIX)
    }
}

impl Collector for Detailed {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let enc = &mut enc;
        self.encode_node(enc)?;
        self.encode_raft(enc)?;
        self.encode_queues(enc)?;
        if self.asks("vhost_status") {
            // RabbitMQ's name has no `detailed` in it: it is cluster-wide.
            let running = self
                .node
                .stats
                .vhosts
                .iter()
                .map(|v| ([("vhost", v.as_str())], 1));
            family(
                enc,
                "rabbitmq_cluster_vhost_status",
                "Whether a given vhost is running",
                MetricType::Gauge,
                running,
            )?;
        }
        self.node.encode_identity(enc)
    }
}
