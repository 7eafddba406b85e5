//! `/api/stream/connections`, `/api/stream/publishers` and `/api/stream/consumers` (each also
//! per vhost), as RabbitMQ's `rabbitmq_stream_management` plugin serves them: the stream
//! protocol's clients of this node, read from the stream connection registry. A caller sees
//! its own connections and their publishers and consumers, a monitor or administrator every
//! one, as with AMQP connections.
//!
//! Streams are single-node for now (a cluster refuses them), so a node lists its own clients
//! only.

use super::{auth, Api, Shared};
use crate::stream_protocol::registry::{ConnectionInfo, ConsumerInfo};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering::Relaxed;

/// RabbitMQ's name of a connection: `peer -> local`.
fn connection_name(c: &ConnectionInfo) -> String {
    format!("{} -> {}", c.peer, c.local)
}

fn properties(list: &[(String, String)]) -> Value {
    Value::Object(
        list.iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect::<Map<String, Value>>(),
    )
}

fn connection_json(s: &Shared, c: &ConnectionInfo) -> Value {
    json!({
        "name": connection_name(c),
        "node": s.node_name(),
        "type": "network",
        "state": "running",
        "protocol": "stream",
        "user": c.user,
        "vhost": c.vhost,
        "host": c.local.ip().to_string(),
        "port": c.local.port(),
        "peer_host": c.peer.ip().to_string(),
        "peer_port": c.peer.port(),
        "ssl": c.tls,
        "frame_max": c.frame_max,
        "heartbeat": c.heartbeat_s,
        "timeout": c.heartbeat_s,
        "connected_at": c.connected_at_ms,
        "client_properties": properties(&c.client_properties),
        "publishers": c.publishers.len(),
        "consumers": c.consumers.len(),
    })
}

/// rabbit_stream_mgmt_db's `connection_details` of a publisher or consumer.
fn connection_details(s: &Shared, c: &ConnectionInfo) -> Value {
    json!({
        "name": connection_name(c),
        "user": c.user,
        "node": s.node_name(),
        "peer_host": c.peer.ip().to_string(),
        "peer_port": c.peer.port(),
    })
}

fn publishers_json(s: &Shared, c: &ConnectionInfo) -> Vec<Value> {
    let details = connection_details(s, c);
    c.publishers
        .values()
        .map(|p| {
            json!({
                "queue": { "name": p.stream, "vhost": c.vhost },
                "connection_details": details,
                "publisher_id": p.publisher_id,
                "reference": p.reference,
                "published": p.counters.published.load(Relaxed),
                "confirmed": p.counters.confirmed.load(Relaxed),
                "errored": p.counters.errored.load(Relaxed),
            })
        })
        .collect()
}

fn consumers_json(s: &Shared, c: &ConnectionInfo) -> Vec<Value> {
    let details = connection_details(s, c);
    c.consumers
        .values()
        .map(|k| {
            // The lag behind the stream's committed end, as rabbit_stream_reader computes it.
            let offset = k.counters.offset.load(Relaxed);
            let committed = s
                .broker
                .vhost(&c.vhost)
                .and_then(|v| v.lock().expect("vhost lock").stream_of(&k.stream))
                .and_then(|(log, _)| crate::queues::stream::figures_of(s, log))
                .map_or(0, |f| f.committed_offset);
            json!({
                "queue": { "name": k.stream, "vhost": c.vhost },
                "connection_details": details,
                "subscription_id": k.subscription_id,
                "credits": k.counters.credit.load(Relaxed),
                "consumed": k.counters.consumed.load(Relaxed),
                "offset": offset,
                "offset_lag": committed.saturating_sub(offset),
                "active": k.active,
                "activity_status": activity_status(k),
                "properties": properties(&k.properties),
            })
        })
        .collect()
}

/// rabbit_stream_reader's consumer activity: `up` outside a single active consumer group,
/// else whether it is the group's active one.
fn activity_status(k: &ConsumerInfo) -> &'static str {
    let in_group = k
        .properties
        .iter()
        .any(|(key, v)| key == "single-active-consumer" && v == "true");
    match (in_group, k.active) {
        (false, _) => "up",
        (true, true) => "single_active",
        (true, false) => "waiting",
    }
}

/// The connections the caller may see, in `vhost` (or all), in RabbitMQ's order (vhost,
/// then name).
fn visible(
    s: &Shared,
    headers: &HeaderMap,
    vhost: Option<&str>,
) -> Result<Vec<ConnectionInfo>, Response> {
    let caller = auth::caller(s, headers)?;
    if let Some(v) = vhost {
        auth::vhost(s, &caller, v)?;
    }
    let mut all: Vec<ConnectionInfo> = s
        .stream_connections
        .snapshot()
        .into_iter()
        .filter(|c| vhost.is_none_or(|v| c.vhost == v) && caller.sees_user(&c.user))
        .collect();
    all.sort_by_cached_key(|c| (c.vhost.clone(), connection_name(c)));
    Ok(all)
}

async fn connections(s: &Shared, headers: &HeaderMap, vhost: Option<&str>) -> Response {
    match visible(s, headers, vhost) {
        Ok(all) => Json(
            all.iter()
                .map(|c| connection_json(s, c))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(r) => r,
    }
}

async fn publishers(s: &Shared, headers: &HeaderMap, vhost: Option<&str>) -> Response {
    match visible(s, headers, vhost) {
        Ok(all) => Json(
            all.iter()
                .flat_map(|c| publishers_json(s, c))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(r) => r,
    }
}

async fn consumers(s: &Shared, headers: &HeaderMap, vhost: Option<&str>) -> Response {
    match visible(s, headers, vhost) {
        Ok(all) => Json(
            all.iter()
                .flat_map(|c| consumers_json(s, c))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(r) => r,
    }
}

pub async fn list_connections(State(s): Api, headers: HeaderMap) -> Response {
    connections(&s, &headers, None).await
}

pub async fn list_vhost_connections(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    connections(&s, &headers, Some(&vhost)).await
}

pub async fn list_publishers(State(s): Api, headers: HeaderMap) -> Response {
    publishers(&s, &headers, None).await
}

pub async fn list_vhost_publishers(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    publishers(&s, &headers, Some(&vhost)).await
}

pub async fn list_consumers(State(s): Api, headers: HeaderMap) -> Response {
    consumers(&s, &headers, None).await
}

pub async fn list_vhost_consumers(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    consumers(&s, &headers, Some(&vhost)).await
}
