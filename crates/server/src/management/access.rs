//! `/api/vhost-limits`, `/api/user-limits` and `/api/topic-permissions` (administrators; the
//! lists monitors too), with RabbitMQ's shapes and error texts: what `rabbitmqadmin` and
//! `warren ctl set_vhost_limits`, `set_user_limits`, `set_topic_permissions` and their `clear_`
//! and `list_` siblings use.
//!
//! A change is a [`MetaRecord`] made by the node's topology path like a permission (see
//! [`super::change_meta`]). A
//! limit's PUT and DELETE rewrite the whole set of that vhost or user, as RabbitMQ does (its
//! limits are one runtime parameter).

use super::{auth, error, not_found, refuse_if_failed, Api, Shared};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use warren_broker::definitions::MetaRecord;
use warren_broker::limits::{self, LimitMap, Scope};

/// Applies `record` by the node's topology path and answers `status`.
async fn change(s: &Arc<Shared>, record: MetaRecord, status: StatusCode) -> Response {
    if let Err(r) = refuse_if_failed(s) {
        return r;
    }
    super::change(s, record, status).await
}

/// RabbitMQ's 400 for a body without `key`.
fn key_missing(key: &str) -> Response {
    error(StatusCode::BAD_REQUEST, &format!("[{{key_missing,{key}}}]"))
}

/// A JSON body as an object; RabbitMQ's `not_json` otherwise.
fn object(body: &axum::body::Bytes) -> Result<serde_json::Map<String, Value>, Response> {
    let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    match serde_json::from_slice(text) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(error(StatusCode::BAD_REQUEST, "not_json")),
    }
}

// ---- vhost limits -------------------------------------------------------------------------

fn vhost_limits(s: &Shared, vhost: &str) -> Option<LimitMap> {
    Some(
        s.broker
            .vhost(vhost)?
            .lock()
            .expect("vhost lock")
            .limits()
            .clone(),
    )
}

pub async fn list_vhost_limits(State(s): Api, headers: HeaderMap) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut names: Vec<String> = s.broker.vhosts().into_iter().map(|(n, _)| n).collect();
    names.sort();
    let out: Vec<Value> = names
        .iter()
        .filter(|n| caller.lists_vhost(&s, n))
        .filter_map(|n| Some((n, vhost_limits(&s, n)?)))
        .filter(|(_, l)| !l.is_empty())
        .map(|(n, l)| json!({ "vhost": n, "value": l }))
        .collect();
    Json(out).into_response()
}

pub async fn get_vhost_limits(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let Some(l) = vhost_limits(&s, &vhost) else {
        return not_found();
    };
    if !caller.lists_vhost(&s, &vhost) {
        return auth::not_authorised_vhost();
    }
    let out: Vec<Value> = if l.is_empty() {
        Vec::new()
    } else {
        vec![json!({ "vhost": vhost, "value": l })]
    };
    Json(out).into_response()
}

/// A limit's value from a `{"value": N}` body, validated as RabbitMQ validates it.
fn limit_value(scope: Scope, name: &str, body: &axum::body::Bytes) -> Result<i64, Response> {
    let m = object(body)?;
    let Some(v) = m.get("value") else {
        return Err(key_missing("value"));
    };
    let checked = limits::check_name(scope, name, v).and_then(|()| limits::parse_value(name, v));
    checked.map_err(|e| match scope {
        Scope::Vhost => error(
            StatusCode::BAD_REQUEST,
            &format!("Validation failed\n\n{e}\n"),
        ),
        Scope::User => error(StatusCode::BAD_REQUEST, &e),
    })
}

pub async fn put_vhost_limit(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let value = match limit_value(Scope::Vhost, &name, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(mut l) = vhost_limits(&s, &vhost) else {
        return error(StatusCode::NOT_FOUND, "vhost_not_found");
    };
    l.insert(name, value);
    let record = MetaRecord::SetVhostLimits { vhost, limits: l };
    change(&s, record, StatusCode::NO_CONTENT).await
}

pub async fn delete_vhost_limit(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let Some(mut l) = vhost_limits(&s, &vhost) else {
        return error(StatusCode::NOT_FOUND, "vhost_not_found");
    };
    if l.remove(&name).is_none() {
        // Nothing to clear: RabbitMQ answers 204 all the same.
        return StatusCode::NO_CONTENT.into_response();
    }
    let record = MetaRecord::SetVhostLimits { vhost, limits: l };
    change(&s, record, StatusCode::NO_CONTENT).await
}

// ---- user limits --------------------------------------------------------------------------

pub async fn list_user_limits(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::monitor(&s, &headers) {
        return r;
    }
    let all = s.broker.users.read().expect("users lock").all_limits();
    let out: Vec<Value> = all
        .into_iter()
        .map(|(u, l)| json!({ "user": u, "value": l }))
        .collect();
    Json(out).into_response()
}

pub async fn get_user_limits(
    State(s): Api,
    headers: HeaderMap,
    Path(user): Path<String>,
) -> Response {
    if let Err(r) = auth::monitor(&s, &headers) {
        return r;
    }
    let users = s.broker.users.read().expect("users lock");
    if !users.exists(&user) {
        return not_found();
    }
    let l = users.limits(&user);
    let out: Vec<Value> = if l.is_empty() {
        Vec::new()
    } else {
        vec![json!({ "user": user, "value": l })]
    };
    Json(out).into_response()
}

/// RabbitMQ's 400 for limits of a user that does not exist.
fn no_such_user(user: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "error": "bad_request", "reason": ["no_such_user", user] })),
    )
        .into_response()
}

pub async fn put_user_limit(
    State(s): Api,
    headers: HeaderMap,
    Path((user, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let value = match limit_value(Scope::User, &name, &body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut l = {
        let users = s.broker.users.read().expect("users lock");
        if !users.exists(&user) {
            return no_such_user(&user);
        }
        users.limits(&user)
    };
    l.insert(name, value);
    let record = MetaRecord::SetUserLimits { user, limits: l };
    change(&s, record, StatusCode::NO_CONTENT).await
}

pub async fn delete_user_limit(
    State(s): Api,
    headers: HeaderMap,
    Path((user, name)): Path<(String, String)>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let mut l = s.broker.users.read().expect("users lock").limits(&user);
    if l.remove(&name).is_none() {
        return StatusCode::NO_CONTENT.into_response();
    }
    let record = MetaRecord::SetUserLimits { user, limits: l };
    change(&s, record, StatusCode::NO_CONTENT).await
}

// ---- topic permissions --------------------------------------------------------------------

/// The topic permissions that `keep` selects, in RabbitMQ's shape.
fn topic_permissions(s: &Shared, keep: impl Fn(&str, &str) -> bool) -> Vec<Value> {
    let users = s.broker.users.read().expect("users lock");
    users
        .topic_permissions
        .all()
        .into_iter()
        .filter(|(u, v, _)| keep(u, v))
        .map(|(u, v, p)| {
            json!({
                "user": u, "vhost": v, "exchange": p.exchange,
                "write": p.write, "read": p.read,
            })
        })
        .collect()
}

pub async fn list_topic_permissions(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    Json(topic_permissions(&s, |_, _| true)).into_response()
}

pub async fn user_topic_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path(user): Path<String>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    if !s.broker.users.read().expect("users lock").exists(&user) {
        return not_found();
    }
    Json(topic_permissions(&s, |u, _| u == user)).into_response()
}

pub async fn vhost_topic_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    if s.broker.vhost(&vhost).is_none() {
        return not_found();
    }
    Json(topic_permissions(&s, |_, v| v == vhost)).into_response()
}

pub async fn get_topic_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let found = topic_permissions(&s, |u, v| u == user && v == vhost);
    if found.is_empty() {
        return not_found();
    }
    Json(found).into_response()
}

pub async fn put_topic_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let m = match object(&body) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let mut fields = Vec::new();
    for key in ["exchange", "write", "read"] {
        match m.get(key) {
            Some(Value::String(v)) => fields.push(v.clone()),
            Some(other) => fields.push(other.to_string()),
            None => return key_missing(key),
        }
    }
    let [exchange, write, read] = <[String; 3]>::try_from(fields).expect("three fields");
    let (user_exists, existed) = {
        let users = s.broker.users.read().expect("users lock");
        let existed = users
            .topic_permissions
            .get(&user, &vhost, &exchange)
            .is_some();
        (users.exists(&user), existed)
    };
    if !user_exists || s.broker.vhost(&vhost).is_none() {
        return error(StatusCode::BAD_REQUEST, "vhost_or_user_not_found");
    }
    // Refused here, before it is replicated, when a pattern is no regular expression.
    if let Err(e) =
        warren_broker::topic_permissions::TopicPermission::new(&user, &vhost, "", &write, &read)
    {
        return error(StatusCode::BAD_REQUEST, &e);
    }
    let record = MetaRecord::SetTopicPermissions {
        user,
        vhost,
        exchange,
        write,
        read,
    };
    // As RabbitMQ: 201 for a new one, 204 for a replaced one.
    let status = if existed {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::CREATED
    };
    change(&s, record, status).await
}

#[derive(serde::Deserialize)]
pub struct ExchangeQuery {
    exchange: Option<String>,
}

/// Clears the user's topic permissions in the vhost: all of them, or with `?exchange=X` (as
/// `clear_topic_permissions USER EXCHANGE`) the one on that exchange; 404 when there is none.
pub async fn delete_topic_permissions(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, user)): Path<(String, String)>,
    Query(q): Query<ExchangeQuery>,
) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let found = topic_permissions(&s, |u, v| u == user && v == vhost);
    let exists = match &q.exchange {
        None => !found.is_empty(),
        Some(x) => found.iter().any(|p| p["exchange"] == *x),
    };
    if !exists {
        return not_found();
    }
    let record = MetaRecord::ClearTopicPermissions {
        user,
        vhost,
        exchange: q.exchange,
    };
    change(&s, record, StatusCode::NO_CONTENT).await
}
