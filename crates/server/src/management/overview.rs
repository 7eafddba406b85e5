//! `/api/overview` (what the cluster holds, in the vhosts the caller sees, and every node's
//! listeners) and `/api/warren/cluster` (the cluster as this node sees it).

use super::auth::{self, Caller};
use super::{Api, Shared};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

/// The RabbitMQ release whose management API this one follows, for tools that check it.
pub const RABBITMQ_VERSION: &str = "3.10.8";

/// The exchange types warren routes, in RabbitMQ's `exchange_types` shape.
pub fn exchange_types() -> Value {
    json!([
        { "name": "direct", "description": "AMQP direct exchange, as per the AMQP specification", "enabled": true },
        { "name": "fanout", "description": "AMQP fanout exchange, as per the AMQP specification", "enabled": true },
        { "name": "headers", "description": "AMQP headers exchange, as per the AMQP specification", "enabled": true },
        { "name": "topic", "description": "AMQP topic exchange, as per the AMQP specification", "enabled": true },
    ])
}

/// The node's listeners in RabbitMQ's shape (`listeners` of /api/overview, /api/nodes).
pub fn listeners(s: &Shared) -> Vec<Value> {
    let node = s.node_name();
    let mut out = Vec::new();
    let mut add = |protocol: &str, addr: Option<std::net::SocketAddr>| {
        if let Some(a) = addr {
            out.push(json!({
                "node": node, "protocol": protocol,
                "ip_address": a.ip().to_string(), "port": a.port(),
            }));
        }
    };
    // In maintenance mode the client listeners are closed.
    if !s.maintenance.is_draining() {
        for a in &s.config.listen {
            add("amqp", Some(*a));
        }
        add("amqp/ssl", s.config.tls.listen);
    }
    add("http", s.config.management_listen);
    add("https", s.config.tls.management_listen);
    if let Some(a) = &s.config.cluster_listen {
        out.push(json!({
            "node": node, "protocol": "clustering",
            "ip_address": a.host(), "port": a.port(),
        }));
    }
    out
}

/// The confirm and return rates are not sampled yet: 0.0 per second.
fn rate() -> Value {
    json!({ "rate": 0.0 })
}

pub async fn overview(State(s): Api, headers: HeaderMap) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (mut queues, mut exchanges, mut channels, mut consumers, mut ready, mut unacked) =
        (0, 0, 0, 0, 0u64, 0u64);
    let mut counts = warren_broker::queue::QueueStats::default();
    let mut rates = super::stats::PerSecond::default();
    // Queue figures from each queue's node, as RabbitMQ's overview covers the whole cluster.
    let views = crate::queue_stats::queue_views(&s, None).await;
    s.rates.observe(&views);
    for view in &views {
        if !caller.sees_vhost(&s, &view.vhost) {
            continue;
        }
        let q = &view.info;
        rates += s.rates.queue(&view.vhost, &q.name);
        queues += 1;
        ready += q.messages_ready;
        unacked += q.messages_unacknowledged;
        consumers += q.consumers;
        counts.deliver_get += q.stats.deliver_get;
        counts.redeliver += q.stats.redeliver;
        counts.ack += q.stats.ack;
    }
    for (name, v) in s.broker.vhosts() {
        if !caller.sees_vhost(&s, &name) {
            continue;
        }
        let v = v.lock().expect("vhost lock");
        exchanges += v.exchange_infos().len();
        channels += v
            .channel_infos()
            .iter()
            .filter(|c| visible_conn(&s, &caller, c.conn))
            .count();
    }
    // Every running node's listeners, as RabbitMQ's overview lists the cluster's.
    let mut all_listeners = Vec::new();
    for node in super::nodes::all_nodes(&s).await {
        if let Some(theirs) = node["listeners"].as_array() {
            all_listeners.extend(theirs.iter().cloned());
        }
    }
    let mut connections = s
        .connections
        .list()
        .iter()
        .filter(|e| caller.sees_user(&e.user))
        .count();
    if s.cluster.is_some() {
        // Every node's clients, as RabbitMQ's totals count the cluster's (and as the
        // connections and channels pages list them).
        let (all_connections, all_channels) = tokio::join!(
            super::connections::visible_connections(&s, &caller),
            super::connections::visible_channels(&s, &caller),
        );
        connections = all_connections.len();
        channels = all_channels.len();
    }
    // Publishes are counted by the channels that took them (unroutable ones too), the rest by
    // the queues the caller sees; rates are the queues' (see `stats`).
    counts.publish = s.counters.published.load(Ordering::Relaxed);
    let mut message_stats = super::stats::message_stats_json(&counts, &rates);
    message_stats["confirm"] = json!(s.counters.confirmed.load(Ordering::Relaxed));
    message_stats["confirm_details"] = rate();
    message_stats["return_unroutable"] = json!(s.counters.unroutable.load(Ordering::Relaxed));
    message_stats["return_unroutable_details"] = rate();
    Json(json!({
        "management_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "warren",
        "product_version": env!("CARGO_PKG_VERSION"),
        "cluster_name": s.node_name(),
        "erlang_version": "none (warren is written in Rust)",
        "erlang_full_version": "none (warren is written in Rust)",
        "rates_mode": "basic",
        "disable_stats": false,
        "enable_queue_totals": true,
        "exchange_types": exchange_types(),
        "node": s.node_name(),
        "statistics_db_event_queue": 0,
        "object_totals": {
            "connections": connections,
            "channels": channels,
            "consumers": consumers,
            "queues": queues,
            "exchanges": exchanges,
        },
        "queue_totals": {
            "messages_ready": ready,
            "messages_ready_details": { "rate": rates.messages_ready },
            "messages_unacknowledged": unacked,
            "messages_unacknowledged_details": { "rate": rates.messages_unacknowledged },
            "messages": ready + unacked, "messages_details": { "rate": rates.messages },
        },
        "message_stats": message_stats,
        "churn_rates": {},
        "listeners": all_listeners,
        "contexts": s.config.management_listen.map(|a| vec![json!({
            "node": s.node_name(), "description": "RabbitMQ Management", "path": "/",
            "ip": a.ip().to_string(), "port": a.port().to_string(),
        })]).unwrap_or_default(),
    }))
    .into_response()
}

/// Whether the caller sees the channels of connection `conn` (one of this node's clients).
pub fn visible_conn(s: &Shared, caller: &Caller, conn: u64) -> bool {
    s.connections
        .get(conn)
        .is_some_and(|e| caller.sees_user(&e.user))
}

/// The cluster as this node sees it: members, the metadata group's state, and each link's
/// counters (`warren ctl cluster_status`).
pub async fn cluster_status(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::monitor(&s, &headers) {
        return r;
    }
    match &s.cluster {
        Some(c) => Json(json!(c.status())).into_response(),
        None => Json(json!({
            "node": s.node_name(),
            "members": [{ "name": s.node_name(), "running": true, "voter": true }],
            "links": [],
        }))
        .into_response(),
    }
}
