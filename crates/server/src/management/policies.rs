//! `/api/policies` and `/api/operator-policies`: listing, setting and clearing policies as
//! RabbitMQ 3.10's management plugin serves them (`rabbit_mgmt_wm_policy`,
//! `rabbit_mgmt_wm_operator_policy`), with its status codes and refusal texts.
//!
//! Policies are for policymakers and administrators, operator policies for administrators.
//! A change is a metadata record made by the node's topology path (journalled on a single
//! node, replicated and applied on every node in a cluster), then the vhost trims the queues
//! whose lowered length limits they now exceed, before the answer goes out.

use super::{auth, error, not_found, refuse_if_failed, Api, Body};
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use warren_broker::definitions::MetaRecord;
use warren_broker::policy::{Policy, PolicyKind};

/// One policy in RabbitMQ's shape.
pub fn policy_json(vhost: &str, p: &Policy) -> Value {
    json!({
        "vhost": vhost,
        "name": p.name,
        "pattern": p.pattern,
        "apply-to": p.apply_to.name(),
        "definition": p.definition,
        "priority": p.priority,
    })
}

/// Who may read and change policies of `kind`: policymakers (and administrators) for
/// policies, administrators alone for operator policies.
fn policy_caller(
    s: &Shared,
    headers: &HeaderMap,
    kind: PolicyKind,
) -> Result<auth::Caller, Response> {
    match kind {
        PolicyKind::Operator => auth::admin(s, headers),
        PolicyKind::Policy => {
            let c = auth::caller(s, headers)?;
            if !(c.is_admin() || c.tags.iter().any(|t| t == "policymaker")) {
                return Err(error(StatusCode::UNAUTHORIZED, "Not policymaker user"));
            }
            Ok(c)
        }
    }
}

/// The policies of `kind` in the vhosts the caller sees (`only`: one of them), in vhost order
/// then lowest priority first, as RabbitMQ lists them.
fn list_json(
    s: &Shared,
    caller: &auth::Caller,
    kind: PolicyKind,
    only: Option<&str>,
) -> Vec<Value> {
    let mut vhosts = s.broker.vhosts();
    vhosts.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (name, v) in vhosts {
        if only.is_some_and(|o| o != name) || !caller.sees_vhost(s, &name) {
            continue;
        }
        let v = v.lock().expect("vhost lock");
        out.extend(
            v.policies()
                .listed(kind)
                .into_iter()
                .map(|p| policy_json(&name, p)),
        );
    }
    out
}

async fn list(s: &Shared, headers: &HeaderMap, kind: PolicyKind, vhost: Option<&str>) -> Response {
    let caller = match policy_caller(s, headers, kind) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Some(v) = vhost {
        if let Err(r) = auth::vhost(s, &caller, v) {
            return r;
        }
    }
    Json(list_json(s, &caller, kind, vhost)).into_response()
}

async fn get_one(
    s: &Shared,
    headers: &HeaderMap,
    kind: PolicyKind,
    vhost: &str,
    name: &str,
) -> Response {
    let caller = match policy_caller(s, headers, kind) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let v = match auth::vhost(s, &caller, vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let v = v.lock().expect("vhost lock");
    match v.policies().get(kind, name) {
        Some(p) => Json(policy_json(vhost, p)).into_response(),
        None => not_found(),
    }
}

/// RabbitMQ's 400 for a policy that fails validation. The policy endpoint HTML-escapes the
/// reason (the Erlang binaries print as `&lt;&lt;"x"&gt;&gt;`); the operator-policy one does
/// not. Both are RabbitMQ 3.10.8's answers, byte for byte.
fn invalid(kind: PolicyKind, why: &str) -> Response {
    let reason = format!("Validation failed\n\n{why}\n");
    let reason = match kind {
        PolicyKind::Policy => reason
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;"),
        PolicyKind::Operator => reason,
    };
    error(StatusCode::BAD_REQUEST, &reason)
}

/// Validates a policy given as RabbitMQ's JSON body (`pattern` and `definition` required,
/// `priority` 0 and `apply-to` "all" by default) into its metadata record.
pub fn policy_record(
    kind: PolicyKind,
    vhost: &str,
    name: &str,
    body: &Value,
) -> Result<MetaRecord, PolicyRefusal> {
    for key in ["pattern", "definition"] {
        if body.get(key).is_none() {
            return Err(PolicyRefusal::Missing(key));
        }
    }
    let apply_to = match body.get("apply-to") {
        None | Some(Value::Null) => "all".to_string(),
        Some(Value::String(a)) => a.clone(),
        Some(other) => other.to_string(),
    };
    let priority = body.get("priority").cloned().unwrap_or(json!(0));
    let p = Policy::new(
        kind,
        name,
        &body["pattern"],
        &apply_to,
        &priority,
        &body["definition"],
    )
    .map_err(PolicyRefusal::Invalid)?;
    Ok(MetaRecord::SetPolicy {
        vhost: vhost.to_string(),
        name: name.to_string(),
        kind,
        pattern: p.pattern,
        apply_to: p.apply_to.name().to_string(),
        priority: p.priority,
        definition: p.definition,
    })
}

/// Why a policy body was refused.
#[derive(Debug)]
pub enum PolicyRefusal {
    /// A required field is absent.
    Missing(&'static str),
    /// RabbitMQ's validation text.
    Invalid(String),
}

impl PolicyRefusal {
    pub fn text(&self) -> String {
        match self {
            PolicyRefusal::Missing(key) => format!("[{{key_missing,{key}}}]"),
            PolicyRefusal::Invalid(why) => why.clone(),
        }
    }
}

/// Sets or clears a policy (`record`) by the node's topology path (on every node in a
/// cluster); then trims the queues its vhost's lowered limits leave over them. `Err` is the
/// reason to answer with.
pub async fn change(s: &Arc<Shared>, record: MetaRecord) -> Result<(), (StatusCode, String)> {
    let vhost = match &record {
        MetaRecord::SetPolicy { vhost, .. } | MetaRecord::ClearPolicy { vhost, .. } => {
            vhost.clone()
        }
        _ => unreachable!("policy records only"),
    };
    refuse_if_failed(s).map_err(|_| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "storage failure: durable changes are refused until the node is restarted".to_string(),
        )
    })?;
    let Some(v) = s.broker.vhost(&vhost) else {
        return Err((StatusCode::NOT_FOUND, "vhost_not_found".into()));
    };
    super::change_meta(s, record).await?;
    let mut v = v.lock().expect("vhost lock");
    v.enforce_limits(s.broker.now_ms());
    // The messages trimmed: released from the store, dead-lettered.
    crate::queues::effects::carry_out(s, &mut v, None);
    Ok(())
}

async fn put(
    s: &Arc<Shared>,
    headers: &HeaderMap,
    kind: PolicyKind,
    vhost: &str,
    name: &str,
    body: Value,
) -> Response {
    let caller = match policy_caller(s, headers, kind) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = auth::vhost_for_change(s, &caller, vhost) {
        return r;
    }
    let record = match policy_record(kind, vhost, name, &body) {
        Ok(r) => r,
        Err(PolicyRefusal::Invalid(why)) => return invalid(kind, &why),
        Err(missing) => return error(StatusCode::BAD_REQUEST, &missing.text()),
    };
    let existed = s.broker.vhost(vhost).is_some_and(|v| {
        v.lock()
            .expect("vhost lock")
            .policies()
            .get(kind, name)
            .is_some()
    });
    match change(s, record).await {
        Ok(()) if existed => StatusCode::NO_CONTENT.into_response(),
        Ok(()) => StatusCode::CREATED.into_response(),
        Err((status, why)) => error(status, &why),
    }
}

async fn delete(
    s: &Arc<Shared>,
    headers: &HeaderMap,
    kind: PolicyKind,
    vhost: &str,
    name: &str,
) -> Response {
    let caller = match policy_caller(s, headers, kind) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let v = match auth::vhost(s, &caller, vhost) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if v.lock()
        .expect("vhost lock")
        .policies()
        .get(kind, name)
        .is_none()
    {
        return not_found();
    }
    let record = MetaRecord::ClearPolicy {
        vhost: vhost.to_string(),
        name: name.to_string(),
        kind,
    };
    match change(s, record).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err((status, why)) => error(status, &why),
    }
}

pub async fn list_all(State(s): Api, headers: HeaderMap) -> Response {
    list(&s, &headers, PolicyKind::Policy, None).await
}

pub async fn list_vhost(State(s): Api, headers: HeaderMap, Path(vhost): Path<String>) -> Response {
    list(&s, &headers, PolicyKind::Policy, Some(&vhost)).await
}

pub async fn get_policy(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    get_one(&s, &headers, PolicyKind::Policy, &vhost, &name).await
}

pub async fn put_policy(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    Body(body): Body<Value>,
) -> Response {
    put(&s, &headers, PolicyKind::Policy, &vhost, &name, body).await
}

pub async fn delete_policy(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    delete(&s, &headers, PolicyKind::Policy, &vhost, &name).await
}

pub async fn list_all_operator(State(s): Api, headers: HeaderMap) -> Response {
    list(&s, &headers, PolicyKind::Operator, None).await
}

pub async fn list_vhost_operator(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    list(&s, &headers, PolicyKind::Operator, Some(&vhost)).await
}

pub async fn get_operator(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    get_one(&s, &headers, PolicyKind::Operator, &vhost, &name).await
}

pub async fn put_operator(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
    Body(body): Body<Value>,
) -> Response {
    put(&s, &headers, PolicyKind::Operator, &vhost, &name, body).await
}

pub async fn delete_operator(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    delete(&s, &headers, PolicyKind::Operator, &vhost, &name).await
}
