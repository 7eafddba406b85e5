//! `/api/exchanges`: listing (the vhosts the caller sees), declaring (`PUT`), deleting
//! (`DELETE`, with `if-unused`) and publishing (`POST .../publish`). The default exchange is
//! named `amq.default` in paths and `""` in bodies, as in RabbitMQ. Every change is the AMQP
//! method run through a [`super::session::Session`].

use super::queues::session_for_change;
use super::{
    amqp_error, auth, check_short, error, json_table, not_found, short_string, table_json, Api,
    Body, Shared,
};
use amq_protocol_types::FieldTable;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use warren_broker::vhost::ExchangeInfo;
use warren_protocol::amqp::{exchange, AMQPClass};
use warren_protocol::content::Properties;

/// The default exchange's name in the API's paths.
const DEFAULT_EXCHANGE: &str = "amq.default";

/// The exchange a path names: `amq.default` is the default exchange, `""`.
pub fn from_path(name: &str) -> &str {
    if name == DEFAULT_EXCHANGE {
        ""
    } else {
        name
    }
}

pub fn exchange_json(vhost: &str, x: &ExchangeInfo) -> Value {
    let mut out = json!({
        "name": x.name,
        "vhost": vhost,
        "type": x.kind,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": table_json(&x.arguments),
    });
    // RabbitMQ shows `policy` only on exchanges that have one.
    if let Some(p) = &x.policy {
        out["policy"] = json!(p);
    }
    out
}

fn exchanges_json(s: &Shared, only: impl Fn(&str) -> bool) -> Vec<Value> {
    let mut vhosts = s.broker.vhosts();
    vhosts.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (name, v) in vhosts {
        if !only(&name) {
            continue;
        }
        let infos = v.lock().expect("vhost lock").exchange_infos();
        out.extend(infos.iter().map(|x| exchange_json(&name, x)));
    }
    out
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
    super::paging::paged(exchanges_json(&s, |v| caller.sees_vhost(&s, v)), &params)
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
    super::paging::paged(exchanges_json(&s, |v| v == vhost), &params)
}

/// The exchange a request names, once the caller may see its vhost: 404 when it does not exist.
pub fn find(s: &Shared, headers: &HeaderMap, vhost: &str, name: &str) -> Result<Value, Response> {
    let caller = auth::caller(s, headers)?;
    let v = auth::vhost(s, &caller, vhost)?;
    let name = from_path(name);
    let infos = v.lock().expect("vhost lock").exchange_infos();
    infos
        .iter()
        .find(|x| x.name == name)
        .map(|x| exchange_json(vhost, x))
        .ok_or_else(not_found)
}

pub async fn get_one(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    match find(&s, &headers, &vhost, &name) {
        Ok(mut x) => {
            x["incoming"] = json!([]);
            x["outgoing"] = json!([]);
            Json(x).into_response()
        }
        Err(r) => r,
    }
}

#[derive(Deserialize)]
pub struct ExchangeBody {
    #[serde(rename = "type", default = "direct")]
    kind: String,
    #[serde(default, deserialize_with = "super::lenient_bool")]
    durable: bool,
    #[serde(default, deserialize_with = "super::lenient_bool")]
    auto_delete: bool,
    #[serde(default, deserialize_with = "super::lenient_bool")]
    internal: bool,
    #[serde(default)]
    arguments: Value,
}

fn direct() -> String {
    "direct".to_string()
}

fn exchange_exists(s: &Shared, vhost: &str, name: &str) -> bool {
    s.broker.vhost(vhost).is_some_and(|v| {
        v.lock()
            .expect("vhost lock")
            .exchange_names()
            .iter()
            .any(|n| n == name)
    })
}

/// `PUT /api/exchanges/{vhost}/{name}`: exchange.declare; 201 when created, 204 when an
/// equivalent one was there, 400 with RabbitMQ's text when it is not equivalent.
pub async fn put(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    body: Result<Body<ExchangeBody>, Response>,
) -> Response {
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let Body(body) = match body {
        Ok(b) => b,
        Err(r) => return r,
    };
    let checked = (
        short_string("exchange name", from_path(&name)),
        short_string("exchange type", &body.kind),
        json_table(&body.arguments),
    );
    let (exchange, kind, arguments) = match checked {
        (Ok(exchange), Ok(kind), Ok(arguments)) => (exchange, kind, arguments),
        (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => {
            return error(StatusCode::BAD_REQUEST, &why)
        }
    };
    let existed = exchange_exists(&s, &vhost, &name);
    let declare = exchange::Declare {
        exchange,
        kind,
        passive: false,
        durable: body.durable,
        auto_delete: body.auto_delete,
        internal: body.internal,
        nowait: false,
        arguments,
    };
    match session
        .control(AMQPClass::Exchange(exchange::AMQPMethod::Declare(declare)))
        .await
    {
        Ok(_) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(_) => StatusCode::CREATED.into_response(),
        // 400 with the channel error's words, as RabbitMQ 3.10.8 answers (measured).
        Err(e) if super::detail(&e).starts_with("unknown exchange type") => error(
            StatusCode::BAD_REQUEST,
            &format!("unknown exchange type '{}'", body.kind),
        ),
        Err(e) => amqp_error(&e),
    }
}

/// `DELETE /api/exchanges/{vhost}/{name}[?if-unused=true]`: exchange.delete.
pub async fn delete(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = find(&s, &headers, &vhost, &name) {
        return r;
    }
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let delete = exchange::Delete {
        exchange: from_path(&name).into(),
        if_unused: params.get("if-unused").is_some_and(|v| v == "true"),
        nowait: false,
    };
    match session
        .control(AMQPClass::Exchange(exchange::AMQPMethod::Delete(delete)))
        .await
    {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => amqp_error(&e),
    }
}

#[derive(Deserialize)]
pub struct PublishBody {
    properties: Value,
    routing_key: String,
    payload: String,
    payload_encoding: String,
}

/// `POST /api/exchanges/{vhost}/{name}/publish`: basic.publish with mandatory set, confirmed
/// before the answer `{"routed": bool}`.
pub async fn publish(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    body: Result<Body<PublishBody>, Response>,
) -> Response {
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let Body(body) = match body {
        Ok(b) => b,
        Err(r) => return r,
    };
    let payload = match body.payload_encoding.as_str() {
        "string" => Bytes::from(body.payload.into_bytes()),
        "base64" => match base64::engine::general_purpose::STANDARD.decode(&body.payload) {
            Ok(b) => Bytes::from(b),
            Err(_) => return error(StatusCode::BAD_REQUEST, "invalid base64 payload"),
        },
        other => {
            let body = json!({ "error": "bad_request", "reason": ["unsupported_encoding", other] });
            return (StatusCode::BAD_REQUEST, Json(body)).into_response();
        }
    };
    let properties = match properties_from_json(&body.properties) {
        Ok(p) => p,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    if let Err(why) = check_short("routing key", &body.routing_key) {
        return error(StatusCode::BAD_REQUEST, &why);
    }
    match session
        .publish(from_path(&name), &body.routing_key, &properties, payload)
        .await
    {
        Ok(routed) => Json(json!({ "routed": routed })).into_response(),
        Err(e) if e.code == warren_protocol::constants::INTERNAL_ERROR => amqp_error(&e),
        // RabbitMQ's words: the reply code and text of the channel error.
        Err(e) => error(StatusCode::BAD_REQUEST, &format!("{} {}", e.code, e.text)),
    }
}

/// Message properties from RabbitMQ's JSON (`delivery_mode`, `headers`, `content_type`, ...).
pub fn properties_from_json(v: &Value) -> Result<Properties, String> {
    let mut p = Properties::default();
    let map = match v {
        Value::Object(m) => m,
        // An empty Erlang proplist, as RabbitMQ itself writes "no properties".
        Value::Array(a) if a.is_empty() => return Ok(p),
        Value::Null => return Ok(p),
        _ => return Err("properties must be an object".into()),
    };
    // Every text property is an AMQP short string.
    let text = |k: &str| -> Result<Option<Bytes>, String> {
        let s = match map.get(k) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        check_short(k, &s)?;
        Ok(Some(Bytes::from(s)))
    };
    let int = |k: &str| -> Result<Option<u64>, String> {
        match map.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("invalid {k}: {n}")),
            Some(Value::String(s)) => s.parse().map(Some).map_err(|_| format!("invalid {k}: {s}")),
            Some(other) => Err(format!("invalid {k}: {other}")),
        }
    };
    p.content_type = text("content_type")?;
    p.content_encoding = text("content_encoding")?;
    p.delivery_mode = int("delivery_mode")?.map(|d| d.min(255) as u8);
    p.priority = int("priority")?.map(|d| d.min(255) as u8);
    p.correlation_id = text("correlation_id")?;
    p.reply_to = text("reply_to")?;
    p.expiration = text("expiration")?;
    p.message_id = text("message_id")?;
    p.timestamp = int("timestamp")?;
    p.kind = text("type")?;
    p.user_id = text("user_id")?;
    p.app_id = text("app_id")?;
    p.cluster_id = text("cluster_id")?;
    if let Some(h) = map.get("headers") {
        let table: FieldTable = json_table(h)?;
        p.set_headers_table(Some(&table));
    }
    Ok(p)
}
