//! The HTTP management API: RabbitMQ 3.10's management plugin as `rabbitmqadmin` (both the
//! Python one and the v2 Rust crate), Terraform's provider and monitoring scripts call it, and
//! Prometheus metrics at `/metrics`.
//!
//! The map, one file per what it serves:
//! - [`auth`]: basic auth and what a user's tags let it see and do (administrator, monitoring,
//!   policymaker, management), RabbitMQ's 401 bodies.
//! - [`session`]: the API's own AMQP connection: every declare, delete, bind, purge, publish
//!   and get is an AMQP method run through the same channel code as a client's, so in a
//!   cluster it is replicated and reaches queues on other nodes exactly as AMQP does.
//! - [`overview`] (`/api/overview`, `/api/warren/cluster`), [`nodes`] (`/api/nodes`, every
//!   node's figures asked of it), [`health`] (the
//!   health checks, `/api/aliveness-test`), [`vhosts`], [`users`] (users, permissions,
//!   `/api/whoami`), [`policies`] (policies and operator policies), [`access`] (vhost and user
//!   limits, topic permissions), [`queues`], [`queue_members`] (a quorum queue's members,
//!   warren's own paths), [`exchanges`], [`bindings`], [`connections`] (connections,
//!   channels, consumers; [`clients`] gathers them from every node), [`settings`] (alarm
//!   limits, certificate reloads), [`maintenance`] (`warren ctl drain` / `revive`),
//!   [`faults`] (test-only fault injection), [`metrics`] (RabbitMQ's Prometheus names, read from
//!   [`node_stats`]' snapshot, and warren's own `warren_*` in its `engine`); [`paging`]:
//!   `?page=..&name=..` of listings; [`ui`]: the web UI at `/`;
//!   [`stats`]: `message_stats` counts and rates.
//!
//! A request flows: axum route -> handler -> [`auth::caller`] (who, may they) -> read the
//! broker's state, or run the AMQP method through a [`session::Session`] -> JSON in RabbitMQ's
//! field names, or RabbitMQ's `{"error","reason"}` with its status.
//!
//! Alarms show as in RabbitMQ: `/api/nodes` (`mem_alarm`, `disk_free_alarm`, and our
//! `storage_failed` with its reason), the health checks `/api/health/checks/alarms` and
//! `/local-alarms` (503 with the alarms listed while any is in effect), and 0/1 gauges in
//! `/metrics`.

// Handlers return a ready HTTP response as their error; it is large, but this is the control
// plane and errors are rare, so boxing would only add noise.
#![allow(clippy::result_large_err)]

mod access;
mod auth;
pub(crate) mod bindings;
mod clients;
mod connections;
mod exchanges;
mod faults;
mod health;
mod maintenance;
mod metrics;
pub mod node_stats;
mod nodes;
mod overview;
mod paging;
pub(crate) mod policies;
mod queue_members;
mod queues;
pub(crate) mod session;
mod settings;
pub mod stats;
mod stream_clients;
mod ui;
mod users;
mod vhosts;

pub(crate) use auth::authorize;
pub(crate) use clients::answer_clients;
pub(crate) use nodes::node_json;

/// The calling administrator's name, or the answer refusing the caller.
pub(crate) fn auth_admin(s: &Shared, headers: &axum::http::HeaderMap) -> Result<String, Response> {
    auth::admin(s, headers).map(|c| c.user)
}

use crate::Shared;
use amq_protocol_types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use warren_broker::definitions::MetaRecord;
use warren_broker::error::AmqpError;

type Api = State<Arc<Shared>>;

pub fn router(shared: Arc<Shared>) -> Router {
    let mut router = Router::new()
        .route("/api/overview", get(overview::overview))
        .route("/api/nodes", get(nodes::list))
        .route("/api/nodes/{name}", get(nodes::get_one))
        .route("/api/warren/cluster", get(overview::cluster_status))
        .route(
            "/api/warren/queues/{vhost}/{queue}/members",
            post(queue_members::add),
        )
        .route("/api/warren/rebalance", post(queue_members::rebalance))
        .route(
            "/api/warren/queues/{vhost}/{queue}/members/{node}",
            axum::routing::delete(queue_members::delete),
        )
        .route("/api/whoami", get(users::whoami))
        .route("/api/health/checks/alarms", get(health::alarms))
        .route("/api/health/checks/local-alarms", get(health::local_alarms))
        .route(
            "/api/health/checks/virtual-hosts",
            get(health::virtual_hosts),
        )
        .route(
            "/api/health/checks/port-listener/{port}",
            get(health::port_listener),
        )
        .route(
            "/api/health/checks/protocol-listener/{protocol}",
            get(health::protocol_listener),
        )
        .route(
            "/api/health/checks/node-is-quorum-critical",
            get(health::node_is_quorum_critical),
        )
        .route(
            "/api/health/checks/is-in-service",
            get(health::is_in_service),
        )
        .route(
            "/api/health/checks/below-node-connection-limit",
            get(health::below_node_connection_limit),
        )
        .route(
            "/api/health/checks/ready-to-serve-clients",
            get(health::ready_to_serve_clients),
        )
        .route(
            "/api/health/checks/certificate-expiration/{within}/{unit}",
            get(health::certificate_expiration),
        )
        .route(
            "/api/health/checks/metadata-leader",
            get(health::metadata_leader),
        )
        .route("/api/aliveness-test/{vhost}", get(health::aliveness_test))
        .route("/api/vhosts", get(vhosts::list))
        .route(
            "/api/vhosts/{vhost}",
            get(vhosts::get_one).put(vhosts::put).delete(vhosts::delete),
        )
        .route(
            "/api/vhosts/{vhost}/connections",
            get(connections::list_vhost_connections),
        )
        .route("/api/users", get(users::list))
        .route(
            "/api/users/{user}",
            get(users::get_one).put(users::put).delete(users::delete),
        )
        .route("/api/permissions", get(users::list_permissions))
        .route(
            "/api/permissions/{vhost}/{user}",
            get(users::get_permissions)
                .put(users::put_permissions)
                .delete(users::delete_permissions),
        )
        .merge(access_routes())
        .route("/api/queues", get(queues::list_all))
        .route("/api/queues/{vhost}", get(queues::list_vhost))
        .route(
            "/api/queues/{vhost}/{queue}",
            get(queues::get_one).put(queues::put).delete(queues::delete),
        )
        .route(
            "/api/queues/{vhost}/{queue}/contents",
            axum::routing::delete(queues::purge),
        )
        .route(
            "/api/queues/{vhost}/{queue}/get",
            post(queues::get_messages),
        )
        .route(
            "/api/queues/{vhost}/{queue}/bindings",
            get(bindings::of_queue),
        )
        .route("/api/exchanges", get(exchanges::list_all))
        .route("/api/exchanges/{vhost}", get(exchanges::list_vhost))
        .route(
            "/api/exchanges/{vhost}/{exchange}",
            get(exchanges::get_one)
                .put(exchanges::put)
                .delete(exchanges::delete),
        )
        .route(
            "/api/exchanges/{vhost}/{exchange}/publish",
            post(exchanges::publish),
        )
        .route(
            "/api/exchanges/{vhost}/{exchange}/bindings/source",
            get(bindings::of_source),
        )
        .route(
            "/api/exchanges/{vhost}/{exchange}/bindings/destination",
            get(bindings::of_destination),
        )
        .route("/api/bindings", get(bindings::list_all))
        .route("/api/bindings/{vhost}", get(bindings::list_vhost))
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}",
            get(bindings::list_between).post(bindings::create),
        )
        .route(
            "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}",
            get(bindings::get_one).delete(bindings::delete),
        )
        .route("/api/connections", get(connections::list))
        .route(
            "/api/connections/{name}",
            get(connections::get_one).delete(connections::close),
        )
        .route(
            "/api/connections/{name}/channels",
            get(connections::list_connection_channels),
        )
        .route(
            "/api/stream/connections",
            get(stream_clients::list_connections),
        )
        .route(
            "/api/stream/connections/{vhost}",
            get(stream_clients::list_vhost_connections),
        )
        .route(
            "/api/stream/publishers",
            get(stream_clients::list_publishers),
        )
        .route(
            "/api/stream/publishers/{vhost}",
            get(stream_clients::list_vhost_publishers),
        )
        .route("/api/stream/consumers", get(stream_clients::list_consumers))
        .route(
            "/api/stream/consumers/{vhost}",
            get(stream_clients::list_vhost_consumers),
        )
        .route("/api/channels", get(connections::list_channels))
        .route("/api/channels/{name}", get(connections::get_channel))
        .route("/api/consumers", get(connections::list_consumers))
        .route(
            "/api/consumers/{vhost}",
            get(connections::list_vhost_consumers),
        )
        // A definitions document may exceed axum's 2 MB default: 10,000 queues with their
        // bindings take a few MB.
        .route(
            "/api/definitions",
            get(crate::definitions::get_all)
                .post(crate::definitions::post_all)
                .layer(axum::extract::DefaultBodyLimit::max(
                    crate::definitions_import::DOCUMENT_BYTES_MAX,
                )),
        )
        .route(
            "/api/definitions/{vhost}",
            get(crate::definitions::get_vhost)
                .post(crate::definitions::post_vhost)
                .layer(axum::extract::DefaultBodyLimit::max(
                    crate::definitions_import::DOCUMENT_BYTES_MAX,
                )),
        )
        .route("/api/policies", get(policies::list_all))
        .route("/api/policies/{vhost}", get(policies::list_vhost))
        .route(
            "/api/policies/{vhost}/{name}",
            get(policies::get_policy)
                .put(policies::put_policy)
                .delete(policies::delete_policy),
        )
        .route("/api/operator-policies", get(policies::list_all_operator))
        .route(
            "/api/operator-policies/{vhost}",
            get(policies::list_vhost_operator),
        )
        .route(
            "/api/operator-policies/{vhost}/{name}",
            get(policies::get_operator)
                .put(policies::put_operator)
                .delete(policies::delete_operator),
        )
        .route(
            "/api/warren/vm-memory-high-watermark",
            put(settings::put_watermark),
        )
        .route(
            "/api/warren/disk-free-limit",
            put(settings::put_disk_free_limit),
        )
        .route(
            "/api/warren/reload-certificates",
            post(settings::reload_certificates),
        )
        .route("/metrics", get(metrics::metrics))
        .route("/metrics/per-object", get(metrics::metrics_per_object))
        .route("/metrics/detailed", get(metrics::metrics_detailed));
    router = router
        .merge(crate::cluster_admin::routes())
        .merge(maintenance::routes())
        .merge(ui::routes());
    if shared.config.fault_injection.is_some() {
        router = router.merge(faults::routes());
    }
    router.with_state(shared)
}

/// Limits and topic permissions: kept apart from the main table, which other work edits.
fn access_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/vhost-limits", get(access::list_vhost_limits))
        .route("/api/vhost-limits/{vhost}", get(access::get_vhost_limits))
        .route(
            "/api/vhost-limits/{vhost}/{name}",
            put(access::put_vhost_limit).delete(access::delete_vhost_limit),
        )
        .route("/api/user-limits", get(access::list_user_limits))
        .route("/api/user-limits/{user}", get(access::get_user_limits))
        .route(
            "/api/user-limits/{user}/{name}",
            put(access::put_user_limit).delete(access::delete_user_limit),
        )
        .route(
            "/api/topic-permissions",
            get(access::list_topic_permissions),
        )
        .route(
            "/api/topic-permissions/{vhost}/{user}",
            get(access::get_topic_permissions)
                .put(access::put_topic_permissions)
                .delete(access::delete_topic_permissions),
        )
        .route(
            "/api/users/{user}/topic-permissions",
            get(access::user_topic_permissions),
        )
        .route(
            "/api/vhosts/{vhost}/topic-permissions",
            get(access::vhost_topic_permissions),
        )
}

/// A single node's name, as RabbitMQ's default `rabbit@<host>` shape.
const NODE_NAME: &str = "warren@localhost";

impl Shared {
    /// This node's name: its cluster name, or the single node's.
    pub fn node_name(&self) -> &str {
        self.cluster.as_ref().map_or(NODE_NAME, |c| c.node_name())
    }
}

/// RabbitMQ's `{"error": ..., "reason": ...}` body with `status`; the error word is the one
/// RabbitMQ uses for that status.
pub(crate) fn error(status: StatusCode, reason: &str) -> Response {
    let word = match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "not_authorised",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::INTERNAL_SERVER_ERROR => "internal_server_error",
        StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
        other => other.canonical_reason().unwrap_or("error"),
    };
    (status, Json(json!({ "error": word, "reason": reason }))).into_response()
}

/// RabbitMQ's answer for an object (vhost, queue, exchange, user, binding) that does not exist.
pub(crate) fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": "Object Not Found", "reason": "Not Found" })),
    )
        .into_response()
}

/// What the reply text of an AMQP error says after its `NAME - ` prefix.
pub(crate) fn detail(e: &AmqpError) -> &str {
    e.text.split_once(" - ").map_or(e.text.as_str(), |(_, d)| d)
}

/// An AMQP error of a method the API ran, as RabbitMQ's management plugin answers it: 403 is
/// 401 "Access refused.", 404 stays 404, a refused write (541) is 500, anything else (406
/// inequivalent arguments, 503 bad exchange type) is 400 with the error's text.
pub(crate) fn amqp_error(e: &AmqpError) -> Response {
    use warren_protocol::constants::*;
    match e.code {
        ACCESS_REFUSED | NOT_ALLOWED => error(StatusCode::UNAUTHORIZED, "Access refused."),
        NOT_FOUND => error(StatusCode::NOT_FOUND, detail(e)),
        INTERNAL_ERROR => error(StatusCode::INTERNAL_SERVER_ERROR, detail(e)),
        _ => error(StatusCode::BAD_REQUEST, detail(e)),
    }
}

/// A JSON request body; anything that does not parse is RabbitMQ's 400 `not_json` (or the
/// missing or mistyped field named), never axum's plain-text 415/422.
pub(crate) struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| error(StatusCode::BAD_REQUEST, &e.body_text()))?;
        // RabbitMQ takes an empty body as an empty object.
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        let value: Value =
            serde_json::from_slice(text).map_err(|_| error(StatusCode::BAD_REQUEST, "not_json"))?;
        serde_json::from_value(value)
            .map(Body)
            .map_err(|e| error(StatusCode::BAD_REQUEST, &e.to_string()))
    }
}

/// A boolean field as RabbitMQ reads it: `true`, or the strings `"true"`/`"false"` the classic
/// Python rabbitmqadmin sends.
pub(crate) fn lenient_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Value::deserialize(d)? {
        Value::Bool(b) => Ok(b),
        Value::String(s) if s == "true" => Ok(true),
        Value::String(s) if s == "false" || s.is_empty() => Ok(false),
        Value::Null => Ok(false),
        other => Err(serde::de::Error::custom(format!(
            "invalid type: {other}, expected a boolean"
        ))),
    }
}

/// A count as RabbitMQ reads it: a number, or a string of digits (the classic rabbitmqadmin's).
pub(crate) fn lenient_u64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or_default()),
        Value::String(s) if s.parse::<u64>().is_ok() => Ok(s.parse().unwrap_or_default()),
        other => Err(serde::de::Error::custom(format!(
            "invalid type: {other}, expected a non-negative integer"
        ))),
    }
}

/// [`lenient_u64`] for a field that may be absent or null.
pub(crate) fn lenient_u64_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        v => lenient_u64(v).map(Some).map_err(serde::de::Error::custom),
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

/// A name, key or property from JSON, a URL or a definitions file as the AMQP short string
/// it becomes. AMQP caps those at 255 bytes, and a longer one cannot be sent to any client:
/// it is refused with the reason (the conversion the protocol types offer panics instead).
pub(crate) fn short_string(what: &str, s: &str) -> Result<ShortString, String> {
    check_short(what, s)?;
    Ok(ShortString::from(s))
}

/// [`short_string`]'s check alone, for what is kept as bytes.
pub(crate) fn check_short(what: &str, s: &str) -> Result<(), String> {
    if s.len() > u8::MAX as usize {
        return Err(format!(
            "{what} is {} bytes long; AMQP allows at most 255",
            s.len()
        ));
    }
    Ok(())
}

/// A JSON value as an AMQP field value, with RabbitMQ's mapping: integers are signed 64-bit
/// (`l`), other numbers doubles, strings long strings, objects tables, null void.
pub fn json_value(v: &Value) -> Result<AMQPValue, String> {
    Ok(match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Value::Array(a) => {
            let mut out = FieldArray::default();
            for item in a {
                out.push(json_value(item)?);
            }
            AMQPValue::FieldArray(out)
        }
        Value::Object(_) => AMQPValue::FieldTable(json_table(v)?),
    })
}

/// A JSON object (`arguments`, `headers`) as an AMQP table; anything else is an empty one.
/// Its keys are short strings: a longer one is refused.
pub fn json_table(v: &Value) -> Result<FieldTable, String> {
    let mut t = FieldTable::default();
    if let Value::Object(m) = v {
        for (k, item) in m {
            t.insert(short_string("a table key", k)?, json_value(item)?);
        }
    }
    Ok(t)
}

/// 500 for a change that cannot be written since the node's storage failed, before it is
/// made, so that memory never holds what a restart would lose.
fn refuse_if_failed(s: &Shared) -> Result<(), Response> {
    crate::storage::refuse_if_failed(s)
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, &e.text))
}

/// A user, vhost, grant, policy or limit changed by the node's one topology path: journalled
/// here on a single node, replicated and applied on every node in a cluster. A refusal is 400
/// when applying the record refused it, 503 when a cluster could not commit it (a majority
/// may yet), 500 when this node could not write it.
pub(crate) async fn change_meta(
    s: &Arc<Shared>,
    record: MetaRecord,
) -> Result<(), (StatusCode, String)> {
    use warren_protocol::constants::{NOT_FOUND, PRECONDITION_FAILED};
    let topology = crate::topology::of(s);
    match topology
        .change(warren_broker::command::Command::Meta { record })
        .await
    {
        Ok(_) => Ok(()),
        // A refused record is answered with the broker's reason alone, as before it was a
        // command.
        Err(e) if e.code == PRECONDITION_FAILED => {
            let why = e.text.split_once(" - ").map_or(&*e.text, |(_, why)| why);
            Err((StatusCode::BAD_REQUEST, why.to_string()))
        }
        Err(e) if e.code == NOT_FOUND => Err((StatusCode::NOT_FOUND, e.text)),
        Err(e) if topology.is_replicated() => Err((StatusCode::SERVICE_UNAVAILABLE, e.text)),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.text)),
    }
}

/// [`change_meta`], answered `status` once it is made.
async fn change(s: &Arc<Shared>, record: MetaRecord, status: StatusCode) -> Response {
    match change_meta(s, record).await {
        Ok(()) => status.into_response(),
        Err((code, why)) => error(code, &why),
    }
}
