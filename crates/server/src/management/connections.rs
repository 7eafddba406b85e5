//! `/api/connections` (and closing one), `/api/channels`, `/api/consumers`: the cluster's AMQP
//! clients as RabbitMQ's management plugin shows them, every node's (gathered by
//! [`super::clients`]), each naming its `node`. A user sees their own connections and
//! channels, a monitor or administrator everyone's; consumers are shown per vhost, like queues.
//! `/api/connections` and `/api/channels` page as RabbitMQ pages them ([`super::paging`]).
//!
//! What a node lists comes from its [`crate::amqp::registry`] (what each connection negotiated) and
//! its vhosts' channel states; nothing here is counted on the data path, so RabbitMQ's byte
//! counters and rates show as 0.

use super::auth::{self, Caller};
use super::clients::{close_on, cluster_wide};
use super::paging::paged;
use super::{error, not_found, table_json, Api, Shared};
use crate::amqp::registry::Entry;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use warren_broker::queue::ConnId;
use warren_broker::vhost::{ChannelInfo, ConsumerInfo};
use warren_cluster::messaging::ClientListing;

/// What `DELETE /api/connections/{name}` tells the client without an `X-Reason` header.
const DEFAULT_CLOSE_REASON: &str = "Closed via management plugin";

fn zero_rate() -> Value {
    json!({ "rate": 0.0 })
}

/// Every client channel of this node, by connection.
fn channels_by_conn(s: &Shared) -> HashMap<ConnId, Vec<ChannelInfo>> {
    let mut out: HashMap<ConnId, Vec<ChannelInfo>> = HashMap::new();
    for (_, v) in s.broker.vhosts() {
        for c in v.lock().expect("vhost lock").channel_infos() {
            out.entry(c.conn).or_default().push(c);
        }
    }
    out
}

fn connection_json(s: &Shared, e: &Entry, channels: usize) -> Value {
    let (host, port) = e
        .local
        .map_or((String::new(), 0), |l| (l.ip().to_string(), l.port()));
    json!({
        "name": e.name,
        "node": s.node_name(),
        "type": "network",
        "state": e.flow.state(),
        "protocol": "AMQP 0-9-1",
        "user": e.user,
        "vhost": e.vhost,
        "auth_mechanism": e.auth_mechanism,
        "host": host,
        "port": port,
        "peer_host": e.peer.ip().to_string(),
        "peer_port": e.peer.port(),
        "ssl": e.tls,
        "channels": channels,
        "channel_max": e.channel_max,
        "frame_max": e.frame_max,
        "timeout": e.heartbeat_s,
        "connected_at": e.connected_at_ms,
        "client_properties": table_json(&e.client_properties),
        "user_provided_name": e.user_provided_name(),
        "recv_oct": 0, "recv_oct_details": zero_rate(), "recv_cnt": 0,
        "send_oct": 0, "send_oct_details": zero_rate(), "send_cnt": 0, "send_pend": 0,
    })
}

/// This node's connections in RabbitMQ's order (vhost, then name).
fn sorted_connections(s: &Shared) -> Vec<Arc<Entry>> {
    let mut all = s.connections.list();
    all.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
    all
}

/// The connections `keep` keeps, in RabbitMQ's shape and order.
fn connections_json(s: &Shared, keep: impl Fn(&Entry) -> bool) -> Vec<Value> {
    let channels = channels_by_conn(s);
    sorted_connections(s)
        .iter()
        .filter(|e| keep(e))
        .map(|e| connection_json(s, e, channels.get(&e.id).map_or(0, Vec::len)))
        .collect()
}

/// Every item of one of this node's listings, unfiltered: what another node asks for (the
/// asking node keeps what its caller may see), and this node's part of its own listings.
pub(crate) fn local_items(s: &Shared, listing: ClientListing) -> Vec<Value> {
    match listing {
        ClientListing::Connections => connections_json(s, |_| true),
        ClientListing::Channels => channels_json(s, |_| true),
        ClientListing::Consumers => consumers_json(s, |_| true),
    }
}

/// The text at `key` of a listed item ("" when absent).
fn text<'a>(item: &'a Value, key: &str) -> &'a str {
    item.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The cluster's connections the caller may see (their own, or all for a monitor).
pub(super) async fn visible_connections(s: &Shared, caller: &Caller) -> Vec<Value> {
    let mut all = cluster_wide(s, ClientListing::Connections).await;
    all.retain(|c| caller.sees_user(text(c, "user")));
    all
}

/// `GET /api/connections`, paged when asked as RabbitMQ pages it (`?page=..`).
pub async fn list(
    State(s): Api,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    paged(visible_connections(&s, &caller).await, &params)
}

pub async fn list_vhost_connections(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = auth::vhost(&s, &caller, &vhost) {
        return r;
    }
    let mut all = visible_connections(&s, &caller).await;
    all.retain(|c| text(c, "vhost") == vhost);
    Json(all).into_response()
}

/// The connection a path names, on whichever node it is, if the caller may see it.
async fn named(s: &Shared, caller: &Caller, name: &str) -> Result<Value, Response> {
    if let Some(e) = s.connections.by_name(name) {
        return if caller.sees_user(&e.user) {
            let channels = channels_by_conn(s).get(&e.id).map_or(0, Vec::len);
            Ok(connection_json(s, &e, channels))
        } else {
            Err(not_found())
        };
    }
    visible_connections(s, caller)
        .await
        .into_iter()
        .find(|c| text(c, "name") == name)
        .ok_or_else(not_found)
}

pub async fn get_one(State(s): Api, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match named(&s, &caller, &name).await {
        Ok(c) => Json(c).into_response(),
        Err(r) => r,
    }
}

/// `DELETE /api/connections/{name}`: the client gets connection.close 320 CONNECTION_FORCED
/// with the `X-Reason` header as its text, whichever node it is connected to. One's own
/// connection, or any for an administrator.
pub async fn close(State(s): Api, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let conn = match named(&s, &caller, &name).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    if !caller.is_admin() && text(&conn, "user") != caller.user {
        return error(StatusCode::UNAUTHORIZED, "Not administrator user");
    }
    let reason = headers
        .get("x-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(DEFAULT_CLOSE_REASON);
    match s.connections.by_name(&name) {
        Some(e) => {
            e.close(reason);
            StatusCode::NO_CONTENT.into_response()
        }
        None => close_on(&s, text(&conn, "node"), &name, reason).await,
    }
}

fn channel_name(conn: &Entry, number: u16) -> String {
    format!("{} ({number})", conn.name)
}

fn channel_json(s: &Shared, conn: &Entry, c: &ChannelInfo) -> Value {
    json!({
        "name": channel_name(conn, c.number),
        "number": c.number,
        "node": s.node_name(),
        "user": c.user,
        "vhost": conn.vhost,
        "state": "running",
        "connection_details": {
            "name": conn.name,
            "peer_host": conn.peer.ip().to_string(),
            "peer_port": conn.peer.port(),
        },
        "consumer_count": c.consumer_count,
        "prefetch_count": c.prefetch_count,
        "global_prefetch_count": c.global_prefetch_count,
        "messages_unacknowledged": c.messages_unacknowledged,
        // Confirm and transaction modes live in the connection's task, not in the vhost.
        "confirm": false,
        "transactional": false,
        "messages_unconfirmed": 0,
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
    })
}

/// The channels of the connections `keep` keeps, in connection then number order.
fn channels_json(s: &Shared, keep: impl Fn(&Entry) -> bool) -> Vec<Value> {
    let mut by_conn = channels_by_conn(s);
    let mut out = Vec::new();
    for conn in sorted_connections(s).iter().filter(|e| keep(e)) {
        for c in by_conn.remove(&conn.id).unwrap_or_default() {
            out.push(channel_json(s, conn, &c));
        }
    }
    out
}

/// The cluster's channels the caller may see (of their own connections, or all for a monitor).
pub(super) async fn visible_channels(s: &Shared, caller: &Caller) -> Vec<Value> {
    let mut all = cluster_wide(s, ClientListing::Channels).await;
    all.retain(|c| caller.sees_user(text(c, "user")));
    all
}

/// `GET /api/channels`, paged when asked as RabbitMQ pages it (`?page=..`).
pub async fn list_channels(
    State(s): Api,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    paged(visible_channels(&s, &caller).await, &params)
}

pub async fn list_connection_channels(
    State(s): Api,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = named(&s, &caller, &name).await {
        return r;
    }
    let mut all = cluster_wide(&s, ClientListing::Channels).await;
    all.retain(|c| c["connection_details"]["name"] == name.as_str());
    Json(all).into_response()
}

pub async fn get_channel(State(s): Api, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let found = visible_channels(&s, &caller)
        .await
        .into_iter()
        .find(|c| text(c, "name") == name);
    match found {
        Some(mut c) => {
            let mut consumers = cluster_wide(&s, ClientListing::Consumers).await;
            consumers.retain(|k| k["channel_details"]["name"] == name.as_str());
            c["consumer_details"] = Value::Array(consumers);
            c["deliveries"] = json!([]);
            c["publishes"] = json!([]);
            Json(c).into_response()
        }
        None => not_found(),
    }
}

fn consumer_json(s: &Shared, vhost: &str, conn: &Entry, c: &ConsumerInfo) -> Value {
    json!({
        "consumer_tag": c.tag,
        "queue": { "name": c.queue, "vhost": vhost },
        "channel_details": {
            "name": channel_name(conn, c.number),
            "number": c.number,
            "connection_name": conn.name,
            "node": s.node_name(),
            "peer_host": conn.peer.ip().to_string(),
            "peer_port": conn.peer.port(),
            "user": conn.user,
        },
        "ack_required": c.ack_required,
        "exclusive": c.exclusive,
        "prefetch_count": c.prefetch_count,
        "arguments": table_json(&c.arguments),
        "active": true,
        "activity_status": "up",
    })
}

/// The consumers of this node's clients in the vhosts `keep` keeps.
fn consumers_json(s: &Shared, keep: impl Fn(&str) -> bool) -> Vec<Value> {
    let mut vhosts = s.broker.vhosts();
    vhosts.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (name, v) in vhosts {
        if !keep(&name) {
            continue;
        }
        let infos = v.lock().expect("vhost lock").consumer_infos();
        for c in &infos {
            // The API's own sessions have no registry entry and no consumers to show.
            if let Some(conn) = s.connections.get(c.conn) {
                out.push(consumer_json(s, &name, &conn, c));
            }
        }
    }
    out
}

/// The cluster's consumers in the vhosts `keep` keeps.
async fn consumers_where(s: &Shared, keep: impl Fn(&str) -> bool) -> Vec<Value> {
    let mut all = cluster_wide(s, ClientListing::Consumers).await;
    all.retain(|c| keep(c["queue"]["vhost"].as_str().unwrap_or_default()));
    all
}

pub async fn list_consumers(State(s): Api, headers: HeaderMap) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    Json(consumers_where(&s, |v| caller.sees_vhost(&s, v)).await).into_response()
}

pub async fn list_vhost_consumers(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = auth::vhost(&s, &caller, &vhost) {
        return r;
    }
    Json(consumers_where(&s, |v| v == vhost).await).into_response()
}
