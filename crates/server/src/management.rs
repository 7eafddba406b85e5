//! The HTTP management API: a RabbitMQ-compatible subset (`/api/...`, basic auth by an
//! administrator) so that scripts written for RabbitMQ's management plugin keep working, and
//! Prometheus metrics at `/metrics`.
//!
//! Alarms show as in RabbitMQ: `/api/nodes` (`mem_alarm`, `disk_free_alarm`, and our
//! `storage_failed` with its reason), the health checks `/api/health/checks/alarms` and
//! `/local-alarms` (503 with the alarms listed while any is in effect), and 0/1 gauges in
//! `/metrics`.

// Handlers return a ready HTTP response as their error; it is large, but this is the control
// plane and errors are rare, so boxing would only add noise.
#![allow(clippy::result_large_err)]

use crate::Shared;
use amq_protocol_types::{AMQPValue, FieldTable};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use warren_broker::definitions::MetaRecord;
use warren_broker::users::{Pattern, Permissions};

type Api = State<Arc<Shared>>;

pub fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new()
        .route("/api/overview", get(overview))
        .route("/api/nodes", get(list_nodes))
        .route("/api/warren/cluster", get(cluster_status))
        .route("/api/health/checks/alarms", get(health_check_alarms))
        .route(
            "/api/health/checks/local-alarms",
            get(health_check_local_alarms),
        )
        .route("/api/vhosts", get(list_vhosts))
        .route("/api/vhosts/{vhost}", put(put_vhost).delete(delete_vhost))
        .route("/api/users", get(list_users))
        .route("/api/users/{user}", put(put_user).delete(delete_user))
        .route(
            "/api/permissions/{vhost}/{user}",
            put(put_permissions).delete(delete_permissions),
        )
        .route("/api/queues", get(list_all_queues))
        .route("/api/queues/{vhost}", get(list_vhost_queues))
        .route("/api/queues/{vhost}/{queue}", get(get_queue))
        .route("/api/exchanges/{vhost}", get(list_exchanges))
        .route("/api/definitions", get(crate::definitions::get_all))
        .route(
            "/api/definitions/{vhost}",
            get(crate::definitions::get_vhost),
        )
        .route("/api/warren/vm-memory-high-watermark", put(put_watermark))
        .route("/api/warren/disk-free-limit", put(put_disk_free_limit))
        .route("/api/warren/reload-certificates", post(reload_certificates))
        .route("/metrics", get(metrics));
    router = router.merge(crate::cluster_admin::routes());
    if shared.config.fault_injection.is_some() {
        router = router.merge(crate::fault_injection::routes());
    }
    router.with_state(shared)
}

/// The node's name as RabbitMQ would show it (one node per process, so a fixed one).
/// A single node's name, as RabbitMQ's default `rabbit@<host>` shape.
const NODE_NAME: &str = "warren@localhost";

impl Shared {
    /// This node's name: its cluster name, or the single node's.
    pub fn node_name(&self) -> &str {
        self.cluster.as_ref().map_or(NODE_NAME, |c| c.node_name())
    }
}

pub(crate) fn error(status: StatusCode, reason: &str) -> Response {
    (status, Json(json!({ "error": status.canonical_reason().unwrap_or("error").to_lowercase(), "reason": reason }))).into_response()
}

/// Basic auth as the management plugin does it: a valid user with the administrator tag.
pub(crate) fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), Response> {
    let unauthorized = || error(StatusCode::UNAUTHORIZED, "Not management user");
    let value = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(unauthorized)?;
    let encoded = value.strip_prefix("Basic ").ok_or_else(unauthorized)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| unauthorized())?;
    let text = String::from_utf8(decoded).map_err(|_| unauthorized())?;
    let (user, pass) = text.split_once(':').ok_or_else(unauthorized)?;
    let users = shared.broker.users.read().expect("users lock");
    if users.authenticate(user, pass) && users.is_administrator(user) {
        Ok(())
    } else {
        Err(unauthorized())
    }
}

pub fn value_json(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => json!(b),
        AMQPValue::ShortShortInt(x) => json!(x),
        AMQPValue::ShortShortUInt(x) => json!(x),
        AMQPValue::ShortInt(x) => json!(x),
        AMQPValue::ShortUInt(x) => json!(x),
        AMQPValue::LongInt(x) => json!(x),
        AMQPValue::LongUInt(x) => json!(x),
        AMQPValue::LongLongInt(x) => json!(x),
        AMQPValue::Float(x) => json!(x),
        AMQPValue::Double(x) => json!(x),
        AMQPValue::Timestamp(x) => json!(x),
        AMQPValue::ShortString(s) => json!(s.as_str()),
        AMQPValue::LongString(s) => json!(String::from_utf8_lossy(s.as_bytes())),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_json).collect()),
        AMQPValue::FieldTable(t) => table_json(t),
        AMQPValue::ByteArray(b) => json!(b.as_slice()),
        AMQPValue::DecimalValue(d) => json!(format!("{d:?}")),
        AMQPValue::Void => Value::Null,
    }
}

pub fn table_json(t: &FieldTable) -> Value {
    Value::Object(
        t.inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), value_json(v)))
            .collect(),
    )
}

async fn overview(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let (mut queues, mut exchanges, mut channels, mut ready, mut unacked) = (0, 0, 0, 0, 0);
    for (_, v) in s.broker.vhosts() {
        let v = v.lock().expect("vhost lock");
        let infos = v.queue_infos();
        queues += infos.len();
        ready += infos.iter().map(|q| q.messages_ready).sum::<u64>();
        unacked += infos.iter().map(|q| q.messages_unacknowledged).sum::<u64>();
        exchanges += v.exchange_infos().len();
        channels += v.channel_count();
    }
    Json(json!({
        "product_name": "warren",
        "product_version": env!("CARGO_PKG_VERSION"),
        "node": s.node_name(),
        "object_totals": {
            "connections": s.connections_open.load(Ordering::Relaxed),
            "channels": channels,
            "queues": queues,
            "exchanges": exchanges,
        },
        "queue_totals": { "messages_ready": ready, "messages_unacknowledged": unacked, "messages": ready + unacked },
    }))
    .into_response()
}

/// 500 for a change that cannot be written since the node's storage failed, before it is
/// made, so that memory never holds what a restart would lose.
fn refuse_if_failed(s: &Shared) -> Result<(), Response> {
    crate::metadata::refuse_if_failed(s)
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, &e.text))
}

/// The node with its resource limits and alarms, in the fields of RabbitMQ's /api/nodes.
async fn list_nodes(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let alarms = s.alarms.state();
    let mut nodes = vec![json!({
        "name": s.node_name(),
        "type": "disc",
        "running": true,
        "mem_used": crate::memory::rss_bytes(),
        "mem_limit": s.alarms.memory_watermark_bytes.load(Ordering::Relaxed),
        "mem_alarm": alarms.memory,
        "disk_free": s.alarms.disk_free_bytes(),
        "disk_free_limit": s.alarms.disk_free_limit_bytes.load(Ordering::Relaxed),
        "disk_free_alarm": alarms.disk,
        "storage_failed": alarms.storage,
        "storage_failure": s.alarms.storage_failure(),
    })];
    if let Some(cluster) = &s.cluster {
        // The other members as this node sees them; their own figures are on their own API.
        for m in cluster.status().members {
            if m.name == s.node_name() {
                continue;
            }
            nodes.push(json!({
                "name": m.name,
                "type": "disc",
                "running": m.running,
                "cluster_address": m.cluster,
                "amqp_address": m.amqp,
                "management_address": m.management,
            }));
        }
    }
    Json(Value::Array(nodes)).into_response()
}

/// The cluster as this node sees it: members, the metadata group's state, and each link's
/// counters (`warren ctl cluster_status`).
async fn cluster_status(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
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

/// RabbitMQ's health check body: 200 `{"status":"ok"}`, or 503 with every alarm in effect.
fn alarms_health(s: &Shared, failed_reason: &str) -> Response {
    let active = s.alarms.active();
    if active.is_empty() {
        return Json(json!({ "status": "ok" })).into_response();
    }
    let alarms: Vec<Value> = active
        .into_iter()
        .map(|(resource, reason)| json!({ "node": s.node_name(), "resource": resource, "reason": reason }))
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "status": "failed", "reason": failed_reason, "alarms": alarms })),
    )
        .into_response()
}

async fn health_check_alarms(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    alarms_health(&s, "There are alarms in effect in the cluster")
}

async fn health_check_local_alarms(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    alarms_health(&s, "There are alarms in effect on the node")
}

async fn list_vhosts(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let mut names: Vec<String> = s.broker.vhosts().into_iter().map(|(n, _)| n).collect();
    names.sort();
    Json(
        names
            .into_iter()
            .map(|n| json!({ "name": n }))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

async fn put_vhost(State(s): Api, headers: HeaderMap, Path(vhost): Path<String>) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if s.cluster.is_some() {
        let status = if s.broker.vhost(&vhost).is_some() {
            StatusCode::NO_CONTENT
        } else {
            StatusCode::CREATED
        };
        return replicate(&s, MetaRecord::AddVhost { name: vhost }, status).await;
    }
    if s.broker.add_vhost(&vhost) {
        if let Err(e) = crate::metadata::append(&s, vec![MetaRecord::AddVhost { name: vhost }]) {
            return error(StatusCode::INTERNAL_SERVER_ERROR, &e.text);
        }
        StatusCode::CREATED.into_response()
    } else {
        StatusCode::NO_CONTENT.into_response()
    }
}

async fn delete_vhost(State(s): Api, headers: HeaderMap, Path(vhost): Path<String>) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if s.cluster.is_some() {
        if s.broker.vhost(&vhost).is_none() {
            return error(StatusCode::NOT_FOUND, "Object Not Found");
        }
        return replicate(
            &s,
            MetaRecord::DeleteVhost { name: vhost },
            StatusCode::NO_CONTENT,
        )
        .await;
    }
    if s.broker.delete_vhost(&vhost) {
        if let Err(e) = crate::metadata::append(&s, vec![MetaRecord::DeleteVhost { name: vhost }]) {
            return error(StatusCode::INTERNAL_SERVER_ERROR, &e.text);
        }
        StatusCode::NO_CONTENT.into_response()
    } else {
        error(StatusCode::NOT_FOUND, "Object Not Found")
    }
}

async fn list_users(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let users = s.broker.users.read().expect("users lock");
    let mut names = users.user_names();
    names.sort();
    Json(
        names
            .iter()
            .map(|n| json!({ "name": n, "tags": users.tags(n) }))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

#[derive(Deserialize)]
struct UserBody {
    password: Option<String>,
    #[serde(default)]
    tags: Value,
}

async fn put_user(
    State(s): Api,
    headers: HeaderMap,
    Path(user): Path<String>,
    Json(body): Json<UserBody>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let tags: Vec<String> = match &body.tags {
        Value::String(t) => t
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    };
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if s.cluster.is_some() {
        // The hash is made here, once, so that every node stores the same one.
        let (status, record) = {
            let users = s.broker.users.read().expect("users lock");
            let exists = users.exists(&user);
            let password_hash = match (&body.password, exists) {
                (None, true) => users.password_hash(&user).unwrap_or_default(),
                (password, _) => {
                    let mut scratch = warren_broker::users::Users::default();
                    scratch.add_user(&user, password.as_deref().unwrap_or_default(), vec![]);
                    scratch.password_hash(&user).unwrap_or_default()
                }
            };
            let status = if exists {
                StatusCode::NO_CONTENT
            } else {
                StatusCode::CREATED
            };
            (
                status,
                MetaRecord::PutUser {
                    name: user,
                    password_hash,
                    tags,
                },
            )
        };
        return replicate(&s, record, status).await;
    }
    let mut users = s.broker.users.write().expect("users lock");
    let status = if users.exists(&user) {
        if let Some(password) = &body.password {
            users.change_password(&user, password);
        }
        users.set_tags(&user, tags);
        StatusCode::NO_CONTENT
    } else {
        users.add_user(&user, body.password.as_deref().unwrap_or_default(), tags);
        StatusCode::CREATED
    };
    let record = MetaRecord::PutUser {
        password_hash: users.password_hash(&user).unwrap_or_default(),
        tags: users.tags(&user),
        name: user,
    };
    // Appended under the users lock, so the journal keeps the order of user changes.
    match crate::metadata::append(&s, vec![record]) {
        Ok(()) => status.into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.text),
    }
}

async fn delete_user(State(s): Api, headers: HeaderMap, Path(user): Path<String>) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if s.cluster.is_some() {
        if !s.broker.users.read().expect("users lock").exists(&user) {
            return error(StatusCode::NOT_FOUND, "Object Not Found");
        }
        return replicate(
            &s,
            MetaRecord::DeleteUser { name: user },
            StatusCode::NO_CONTENT,
        )
        .await;
    }
    let mut users = s.broker.users.write().expect("users lock");
    if users.delete_user(&user) {
        if let Err(e) = crate::metadata::append(&s, vec![MetaRecord::DeleteUser { name: user }]) {
            return error(StatusCode::INTERNAL_SERVER_ERROR, &e.text);
        }
        StatusCode::NO_CONTENT.into_response()
    } else {
        error(StatusCode::NOT_FOUND, "Object Not Found")
    }
}

#[derive(Deserialize)]
struct PermissionBody {
    configure: String,
    write: String,
    read: String,
}

async fn put_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
    Json(body): Json<PermissionBody>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if s.broker.vhost(&vhost).is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("vhost '{vhost}' does not exist"),
        );
    }
    let parse = |p: &str| {
        Pattern::new(p).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("invalid pattern '{p}': {e}"),
            )
        })
    };
    let perms = match (
        parse(&body.configure),
        parse(&body.write),
        parse(&body.read),
    ) {
        (Ok(configure), Ok(write), Ok(read)) => Permissions {
            configure,
            write,
            read,
        },
        (Err(r), _, _) | (_, Err(r), _) | (_, _, Err(r)) => return r,
    };
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if s.cluster.is_some() {
        if !s.broker.users.read().expect("users lock").exists(&user) {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("user '{user}' does not exist"),
            );
        }
        let record = MetaRecord::SetPermissions {
            user,
            vhost,
            configure: body.configure,
            write: body.write,
            read: body.read,
        };
        return replicate(&s, record, StatusCode::CREATED).await;
    }
    let mut users = s.broker.users.write().expect("users lock");
    if !users.exists(&user) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("user '{user}' does not exist"),
        );
    }
    users.set_permissions(&user, &vhost, perms);
    let record = MetaRecord::SetPermissions {
        user,
        vhost,
        configure: body.configure,
        write: body.write,
        read: body.read,
    };
    match crate::metadata::append(&s, vec![record]) {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.text),
    }
}

async fn delete_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if s.cluster.is_some() {
        let record = MetaRecord::ClearPermissions { user, vhost };
        return replicate(&s, record, StatusCode::NO_CONTENT).await;
    }
    let mut users = s.broker.users.write().expect("users lock");
    users.clear_permissions(&user, &vhost);
    match crate::metadata::append(&s, vec![MetaRecord::ClearPermissions { user, vhost }]) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.text),
    }
}

/// In a cluster, a user, vhost or permission change is replicated and applied on every node
/// (this one included) rather than made here alone; `status` answers it once a majority has it.
async fn replicate(s: &Shared, record: MetaRecord, status: StatusCode) -> Response {
    let cluster = s.cluster.as_ref().expect("replicated in a cluster only");
    match cluster
        .execute(warren_broker::command::Command::Meta { record })
        .await
    {
        Ok(_) => status.into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e.text),
    }
}

async fn queues_json(s: &Shared, only: Option<&str>) -> Vec<Value> {
    let views = crate::queue_stats::queue_views(s, only).await;
    views
        .into_iter()
        .map(|view| {
            let q = view.info;
            let node = q.node.as_deref().unwrap_or(s.node_name()).to_string();
            let members: Vec<&str> = q.members.iter().map(|m| &**m).collect();
            let mut out = json!({
                "name": q.name,
                "vhost": view.vhost,
                "durable": q.durable,
                "auto_delete": q.auto_delete,
                "exclusive": q.exclusive,
                "type": q.queue_type,
                "arguments": table_json(&q.arguments),
                "state": if view.running { "running" } else { "down" },
                "messages": q.messages_ready + q.messages_unacknowledged,
                "messages_ready": q.messages_ready,
                "messages_unacknowledged": q.messages_unacknowledged,
                "message_bytes_ready": q.message_bytes_ready,
                "messages_paged_out": q.messages_paged_out,
                "messages_ram": q.messages_ready - q.messages_paged_out,
                "consumers": q.consumers,
                "node": node,
            });
            // A quorum queue's replicas, as RabbitMQ's API shows them: the leader its Raft
            // group elected, as this node (a member) sees it, else where it was placed.
            if !members.is_empty() {
                let leader = q
                    .log_id
                    .zip(s.cluster.as_ref())
                    .and_then(|(log, c)| c.queue_leader(log))
                    .unwrap_or(node);
                out["leader"] = json!(leader);
                out["members"] = json!(members);
            }
            out
        })
        .collect()
}

async fn list_all_queues(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    Json(queues_json(&s, None).await).into_response()
}

async fn list_vhost_queues(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if s.broker.vhost(&vhost).is_none() {
        return error(StatusCode::NOT_FOUND, "Object Not Found");
    }
    Json(queues_json(&s, Some(&vhost)).await).into_response()
}

async fn get_queue(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, queue)): Path<(String, String)>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    match queues_json(&s, Some(&vhost))
        .await
        .into_iter()
        .find(|q| q["name"] == queue.as_str())
    {
        Some(q) => Json(q).into_response(),
        None => error(StatusCode::NOT_FOUND, "Object Not Found"),
    }
}

async fn list_exchanges(State(s): Api, headers: HeaderMap, Path(vhost): Path<String>) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let Some(v) = s.broker.vhost(&vhost) else {
        return error(StatusCode::NOT_FOUND, "Object Not Found");
    };
    let infos = v.lock().expect("vhost lock").exchange_infos();
    Json(
        infos
            .iter()
            .map(|x| {
                json!({
                    "name": x.name, "vhost": vhost, "type": x.kind, "durable": x.durable,
                    "auto_delete": x.auto_delete, "internal": x.internal, "arguments": table_json(&x.arguments),
                })
            })
            .collect::<Vec<_>>(),
    )
    .into_response()
}

#[derive(Deserialize)]
struct WatermarkBody {
    fraction: Option<f64>,
    bytes: Option<u64>,
}

/// rabbitmqctl set_vm_memory_high_watermark, over HTTP: a fraction of RAM or absolute bytes.
async fn put_watermark(
    State(s): Api,
    headers: HeaderMap,
    Json(body): Json<WatermarkBody>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let bytes = match (body.fraction, body.bytes) {
        (_, Some(b)) => b,
        (Some(f), None) if (0.0..=1.0).contains(&f) => {
            (crate::memory::total_memory_bytes() as f64 * f) as u64
        }
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give \"fraction\" (0..1) or \"bytes\"",
            )
        }
    };
    s.alarms
        .memory_watermark_bytes
        .store(bytes, Ordering::Relaxed);
    s.alarms.evaluate();
    tracing::info!(bytes, "memory high watermark set");
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct DiskFreeLimitBody {
    bytes: u64,
}

/// rabbitmqctl set_disk_free_limit, over HTTP.
async fn put_disk_free_limit(
    State(s): Api,
    headers: HeaderMap,
    Json(body): Json<DiskFreeLimitBody>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    s.alarms
        .disk_free_limit_bytes
        .store(body.bytes, Ordering::Relaxed);
    s.alarms.evaluate();
    tracing::info!(bytes = body.bytes, "disk free limit set");
    StatusCode::NO_CONTENT.into_response()
}

/// Reads the TLS certificate, key and CA files again (`warren ctl reload_certificates`, as
/// SIGHUP does): 204 once new connections get them, 400 naming the bad file (the old ones
/// stay), 404 when the node has no TLS listener.
async fn reload_certificates(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let Some(tls) = &s.tls else {
        return error(StatusCode::NOT_FOUND, "TLS is not configured on this node");
    };
    match tls.reload() {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

/// Prometheus text exposition; unauthenticated, like RabbitMQ's prometheus plugin.
async fn metrics(State(s): Api) -> Response {
    let mut out = String::new();
    let c = &s.counters;
    let _ = writeln!(
        out,
        "# TYPE warren_connections gauge\nwarren_connections {}",
        s.connections_open.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_messages_published_total counter\nwarren_messages_published_total {}",
        c.published.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_messages_confirmed_total counter\nwarren_messages_confirmed_total {}",
        c.confirmed.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_messages_unroutable_total counter\nwarren_messages_unroutable_total {}",
        c.unroutable.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_auth_attempts_failed_total counter\nwarren_auth_attempts_failed_total {}\n# TYPE warren_handshake_timeouts_total counter\nwarren_handshake_timeouts_total {}",
        c.auth_failures.load(Ordering::Relaxed),
        c.handshake_timeouts.load(Ordering::Relaxed)
    );
    if let Some(tls) = &s.tls {
        tls.write_metrics(&mut out);
    }
    // RabbitMQ's prometheus plugin names for its alarms, plus ours: 1 while in effect.
    let alarms = s.alarms.state();
    for (name, on) in [
        ("memory_used_watermark", alarms.memory),
        ("free_disk_space_watermark", alarms.disk),
        ("storage_failure", alarms.storage),
    ] {
        let _ = writeln!(
            out,
            "# TYPE warren_alarms_{name} gauge\nwarren_alarms_{name} {}",
            u8::from(on)
        );
    }
    let _ = writeln!(out, "# TYPE warren_process_resident_memory_bytes gauge\nwarren_process_resident_memory_bytes {}", crate::memory::rss_bytes());
    let _ = writeln!(out, "# TYPE warren_queue_messages_ready gauge");
    let mut unacked = String::from("# TYPE warren_queue_messages_unacked gauge\n");
    let mut consumers = String::from("# TYPE warren_queue_consumers gauge\n");
    let mut paged = String::from("# TYPE warren_queue_messages_paged_out gauge\n");
    for (vhost, v) in s.broker.vhosts() {
        for q in v.lock().expect("vhost lock").queue_infos() {
            let labels = format!("vhost=\"{}\",queue=\"{}\"", escape(&vhost), escape(&q.name));
            let _ = writeln!(
                out,
                "warren_queue_messages_ready{{{labels}}} {}",
                q.messages_ready
            );
            let _ = writeln!(
                unacked,
                "warren_queue_messages_unacked{{{labels}}} {}",
                q.messages_unacknowledged
            );
            let _ = writeln!(
                consumers,
                "warren_queue_consumers{{{labels}}} {}",
                q.consumers
            );
            let _ = writeln!(
                paged,
                "warren_queue_messages_paged_out{{{labels}}} {}",
                q.messages_paged_out
            );
        }
    }
    out.push_str(&unacked);
    out.push_str(&consumers);
    out.push_str(&paged);
    if let Some(budget) = s.broker.memory_budget() {
        let _ = writeln!(
            out,
            "# TYPE warren_message_memory_bytes gauge\nwarren_message_memory_bytes {}\n# TYPE warren_message_memory_limit_bytes gauge\nwarren_message_memory_limit_bytes {}",
            budget.used(),
            budget.limit()
        );
    }
    if let Some(store) = &s.store {
        write_store_metrics(&mut out, &store.stats());
    }
    if let Some(cluster) = &s.cluster {
        warren_cluster::metrics::write_prometheus(&cluster.status(), &mut out);
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

/// The storage engine's counters since the process started: how hard the WAL works (syncs per
/// append tell how well group commit batches), what reaches the disk (bytes written per payload
/// byte is the write amplification), and what happens to rolled WAL files.
fn write_store_metrics(out: &mut String, st: &warren_store::Stats) {
    let counters = [
        ("wal_appends_total", st.appends),
        ("wal_syncs_total", st.wal_syncs),
        ("wal_written_bytes_total", st.wal_bytes),
        ("segment_written_bytes_total", st.segment_bytes),
        ("sidecar_written_bytes_total", st.adopted_index_bytes),
        ("checkpoint_written_bytes_total", st.checkpoint_bytes),
        ("wal_files_copied_total", st.wal_files_flushed),
        ("wal_files_adopted_total", st.wal_files_adopted),
        ("adopted_files_deleted_total", st.adopted_files_deleted),
        ("adopted_files_compacted_total", st.adopted_files_compacted),
        ("segments_deleted_total", st.segments_deleted),
        ("segments_compacted_total", st.segments_compacted),
    ];
    for (name, v) in counters {
        let _ = writeln!(
            out,
            "# TYPE warren_store_{name} counter\nwarren_store_{name} {v}"
        );
    }
    for (name, v) in [
        ("cache_bytes", st.cache_bytes),
        ("pending_records", st.pending_records),
    ] {
        let _ = writeln!(
            out,
            "# TYPE warren_store_{name} gauge\nwarren_store_{name} {v}"
        );
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
