//! `/api/queues`: listing (the vhosts the caller sees), declaring (`PUT`), deleting (`DELETE`,
//! with `if-empty` / `if-unused`), purging (`DELETE .../contents`) and getting messages
//! (`POST .../get`). Every change is the AMQP method run through a [`Session`].

use super::session::{AckMode, Got, Session};
use super::{
    amqp_error, auth, error, json_table, not_found, short_string, table_json, Api, Body, Shared,
};
use crate::queue_stats::QueueView;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use warren_protocol::amqp::{queue, AMQPClass};
use warren_protocol::content::Properties;

fn rate(per_second: f64) -> Value {
    json!({ "rate": per_second })
}

/// A queue in the fields of RabbitMQ's `/api/queues`, with the figures of the node hosting it
/// (see [`crate::queue_stats`]), and rates from those figures (see [`super::stats`]).
pub fn queue_json(s: &Shared, view: &QueueView) -> Value {
    let (q, vhost) = (&view.info, view.vhost.as_str());
    let rates = s.rates.queue(vhost, &q.name);
    let messages = q.messages_ready + q.messages_unacknowledged;
    let node = q.node.as_deref().unwrap_or(s.node_name());
    let mut out = json!({
        "name": q.name,
        "vhost": vhost,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive,
        "type": q.queue_type,
        "arguments": table_json(&q.arguments),
        "state": if view.running { "running" } else { "down" },
        "messages": messages,
        "messages_details": rate(rates.messages),
        "messages_ready": q.messages_ready,
        "messages_ready_details": rate(rates.messages_ready),
        "messages_unacknowledged": q.messages_unacknowledged,
        "messages_unacknowledged_details": rate(rates.messages_unacknowledged),
        "message_bytes": q.message_bytes_ready,
        "message_bytes_ready": q.message_bytes_ready,
        "messages_paged_out": q.messages_paged_out,
        "messages_ram": q.messages_ready - q.messages_paged_out,
        "consumers": q.consumers,
        "node": node,
        "policy": q.policy,
        "operator_policy": q.operator_policy,
        "effective_policy_definition": q.effective_policy_definition,
        "exclusive_consumer_tag": null,
        "single_active_consumer_tag": null,
        "message_stats": super::stats::message_stats_json(&q.stats, &rates),
    });
    // A quorum queue's replicas, as RabbitMQ's API shows them: the leader its Raft group
    // elected, as this node (a member) sees it or a member told it, else where it was placed.
    if !q.members.is_empty() {
        let leader = q
            .log_id
            .zip(s.cluster.as_ref())
            .and_then(|(log, c)| c.queue_leader(log))
            .or_else(|| view.leader.clone())
            .unwrap_or_else(|| node.to_string());
        out["leader"] = json!(leader);
        out["members"] = json!(q.members.iter().map(|m| &**m).collect::<Vec<&str>>());
        // The members whose node is up, as RabbitMQ's `online` (its UI's "Online").
        let online: Vec<&str> = q
            .members
            .iter()
            .map(|m| &**m)
            .filter(|m| {
                s.cluster
                    .as_ref()
                    .map_or(*m == s.node_name(), |c| c.is_node_running(m) == Some(true))
            })
            .collect();
        out["online"] = json!(online);
    }
    if q.queue_type == "stream" && q.members.is_empty() {
        // A stream on one node: its sole member, leading, with this node's consumers as its
        // readers, as RabbitMQ 3.10 shows a single-member stream.
        out["leader"] = json!(node);
        out["members"] = json!([node]);
        out["online"] = json!(if view.running { vec![node] } else { vec![] });
        out["readers"] = json!({ node: q.consumers });
    }
    if let Some(f) = &view.stream {
        // The log's offsets and segments: not in RabbitMQ's API (its `rabbitmqctl
        // list_stream_*` and stream protocol carry them), shown so an operator sees where
        // retention has moved the head and how much is on disk.
        out["first_offset"] = json!(f.first_offset);
        out["committed_offset"] = json!(f.committed_offset);
        out["segments"] = json!(f.segments);
    }
    out
}

/// The queues of the vhosts `only` keeps (all of them when `vhost` is `None`, else that one),
/// in vhost then name order.
async fn queue_views(
    s: &Shared,
    vhost: Option<&str>,
    only: impl Fn(&str) -> bool,
) -> Vec<QueueView> {
    let mut views = crate::queue_stats::queue_views(s, vhost).await;
    s.rates.observe(&views);
    views.retain(|v| only(&v.vhost));
    views.sort_by(|a, b| (&a.vhost, &a.info.name).cmp(&(&b.vhost, &b.info.name)));
    views
}

async fn queues_json(s: &Shared, vhost: Option<&str>, only: impl Fn(&str) -> bool) -> Vec<Value> {
    let views = queue_views(s, vhost, only).await;
    views.iter().map(|v| queue_json(s, v)).collect()
}

/// A listing of `views`, paged when asked: only the page's queues are turned into JSON.
fn listing(s: &Shared, views: Vec<QueueView>, params: &HashMap<String, String>) -> Response {
    super::paging::paged_by(
        views,
        |v| v.info.name.as_str(),
        |v| queue_json(s, v),
        params,
    )
}

pub async fn list_all(
    State(s): Api,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let views = queue_views(&s, None, |v| caller.sees_vhost(&s, v)).await;
    listing(&s, views, &params)
}

pub async fn list_vhost(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = auth::vhost(&s, &caller, &vhost) {
        return r;
    }
    let views = queue_views(&s, Some(&vhost), |_| true).await;
    listing(&s, views, &params)
}

/// 404 unless the queue a request names exists, once the caller may see its vhost.
fn exists(s: &Shared, headers: &HeaderMap, vhost: &str, queue: &str) -> Result<(), Response> {
    let caller = auth::caller(s, headers)?;
    auth::vhost(s, &caller, vhost)?;
    if queue_exists(s, vhost, queue) {
        Ok(())
    } else {
        Err(not_found())
    }
}

pub async fn get_one(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, queue)): Path<(String, String)>,
) -> Response {
    if let Err(r) = exists(&s, &headers, &vhost, &queue) {
        return r;
    }
    let found = queues_json(&s, Some(&vhost), |_| true)
        .await
        .into_iter()
        .find(|q| q["name"] == queue.as_str());
    match found {
        Some(mut q) => {
            q["consumer_details"] = json!([]);
            q["incoming"] = json!([]);
            q["deliveries"] = json!([]);
            Json(q).into_response()
        }
        None => not_found(),
    }
}

#[derive(Deserialize)]
pub struct QueueBody {
    #[serde(default, deserialize_with = "super::lenient_bool")]
    durable: bool,
    #[serde(default, deserialize_with = "super::lenient_bool")]
    auto_delete: bool,
    #[serde(default)]
    arguments: Value,
}

/// The API's session on `vhost` for a change: 404 `vhost_not_found`, 401 when the caller may
/// not see the vhost or has no permissions in it.
pub fn session_for_change(
    s: &std::sync::Arc<Shared>,
    headers: &HeaderMap,
    vhost: &str,
) -> Result<Session, Response> {
    let caller = auth::caller(s, headers)?;
    auth::vhost_for_change(s, &caller, vhost)?;
    Session::open(s, &caller.user, vhost)
        .ok_or_else(|| error(StatusCode::UNAUTHORIZED, "Access refused."))
}

fn queue_exists(s: &Shared, vhost: &str, queue: &str) -> bool {
    s.broker
        .vhost(vhost)
        .is_some_and(|v| v.lock().expect("vhost lock").queue_stats(queue).is_some())
}

/// `PUT /api/queues/{vhost}/{queue}`: queue.declare; 201 when it was created, 204 when an
/// equivalent queue was there, 400 with RabbitMQ's text when it is not equivalent.
pub async fn put(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    body: Result<Body<QueueBody>, Response>,
) -> Response {
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let Body(body) = match body {
        Ok(b) => b,
        Err(r) => return r,
    };
    if name.len() > u8::MAX as usize {
        // RabbitMQ's words, newline included.
        let why = format!(
            "queue should be less than 255 bytes, actually was {}\n",
            name.len()
        );
        return error(StatusCode::BAD_REQUEST, &why);
    }
    let (queue, arguments) = match (
        short_string("queue name", &name),
        json_table(&body.arguments),
    ) {
        (Ok(queue), Ok(arguments)) => (queue, arguments),
        (Err(why), _) | (_, Err(why)) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let existed = queue_exists(&s, &vhost, &name);
    let declare = queue::Declare {
        queue,
        passive: false,
        durable: body.durable,
        exclusive: false,
        auto_delete: body.auto_delete,
        nowait: false,
        arguments,
    };
    match session
        .control(AMQPClass::Queue(queue::AMQPMethod::Declare(declare)))
        .await
    {
        Ok(_) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(_) => StatusCode::CREATED.into_response(),
        Err(e) => amqp_error(&e),
    }
}

/// `DELETE /api/queues/{vhost}/{queue}[?if-empty=true&if-unused=true]`: queue.delete.
pub async fn delete(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = exists(&s, &headers, &vhost, &name) {
        return r;
    }
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let flag = |k: &str| params.get(k).is_some_and(|v| v == "true");
    let delete = queue::Delete {
        queue: name.as_str().into(),
        if_unused: flag("if-unused"),
        if_empty: flag("if-empty"),
        nowait: false,
    };
    match session
        .control(AMQPClass::Queue(queue::AMQPMethod::Delete(delete)))
        .await
    {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => amqp_error(&e),
    }
}

/// `DELETE /api/queues/{vhost}/{queue}/contents`: queue.purge.
pub async fn purge(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = exists(&s, &headers, &vhost, &name) {
        return r;
    }
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let purge = queue::Purge {
        queue: name.as_str().into(),
        nowait: false,
    };
    match session
        .control(AMQPClass::Queue(queue::AMQPMethod::Purge(purge)))
        .await
    {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => amqp_error(&e),
    }
}

#[derive(Deserialize)]
pub struct GetBody {
    #[serde(deserialize_with = "super::lenient_u64")]
    count: u64,
    ackmode: String,
    encoding: String,
    #[serde(default, deserialize_with = "super::lenient_u64_opt")]
    truncate: Option<u64>,
}

/// `POST /api/queues/{vhost}/{queue}/get`: up to `count` basic.get, then each settled as
/// `ackmode` says; the messages in RabbitMQ's shape.
pub async fn get_messages(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    body: Result<Body<GetBody>, Response>,
) -> Response {
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let Body(body) = match body {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(mode) = AckMode::parse(&body.ackmode) else {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("invalid ackmode '{}'", body.ackmode),
        );
    };
    let base64 = match body.encoding.as_str() {
        "auto" => false,
        "base64" => true,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("unsupported encoding '{other}'"),
            )
        }
    };
    let count = body.count.min(u32::MAX as u64) as u32;
    let truncate = body.truncate.map(|t| t.min(usize::MAX as u64) as usize);
    match session.get(&name, count, mode).await {
        Ok(got) => Json(
            got.iter()
                .map(|g| message_json(g, base64, truncate))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        // RabbitMQ's words here keep the AMQP prefix.
        Err(e) if e.code == warren_protocol::constants::NOT_FOUND => {
            error(StatusCode::NOT_FOUND, &e.text)
        }
        Err(e) => amqp_error(&e),
    }
}

/// A message taken by a get, as RabbitMQ shows it: the payload as a string when it is UTF-8
/// and `encoding` is auto, else base64; cut to `truncate` bytes first.
fn message_json(g: &Got, base64: bool, truncate: Option<usize>) -> Value {
    let payload = match truncate {
        Some(n) if n < g.body.len() => &g.body[..n],
        _ => &g.body[..],
    };
    let (payload, encoding) = match std::str::from_utf8(payload) {
        Ok(text) if !base64 => (text.to_string(), "string"),
        _ => (
            base64::engine::general_purpose::STANDARD.encode(payload),
            "base64",
        ),
    };
    json!({
        "payload_bytes": g.body.len(),
        "redelivered": g.get_ok.redelivered,
        "exchange": String::from_utf8_lossy(&g.get_ok.exchange),
        "routing_key": String::from_utf8_lossy(&g.get_ok.routing_key),
        "message_count": g.get_ok.message_count,
        "properties": properties_json(&g.properties),
        "payload": payload,
        "payload_encoding": encoding,
    })
}

/// Message properties in RabbitMQ's JSON; none at all is `[]`, as RabbitMQ (an empty Erlang
/// proplist) answers.
pub fn properties_json(p: &Properties) -> Value {
    let mut m = Map::new();
    let text = |b: &bytes::Bytes| json!(String::from_utf8_lossy(b));
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    };
    put("content_type", p.content_type.as_ref().map(text));
    put("content_encoding", p.content_encoding.as_ref().map(text));
    put(
        "headers",
        p.headers_table()
            .ok()
            .flatten()
            .map(|t| super::table_json(&t)),
    );
    put("delivery_mode", p.delivery_mode.map(|d| json!(d)));
    put("priority", p.priority.map(|d| json!(d)));
    put("correlation_id", p.correlation_id.as_ref().map(text));
    put("reply_to", p.reply_to.as_ref().map(text));
    put("expiration", p.expiration.as_ref().map(text));
    put("message_id", p.message_id.as_ref().map(text));
    put("timestamp", p.timestamp.map(|t| json!(t)));
    put("type", p.kind.as_ref().map(text));
    put("user_id", p.user_id.as_ref().map(text));
    put("app_id", p.app_id.as_ref().map(text));
    put("cluster_id", p.cluster_id.as_ref().map(text));
    if m.is_empty() {
        Value::Array(Vec::new())
    } else {
        Value::Object(m)
    }
}
