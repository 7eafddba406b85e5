//! `GET /api/definitions` and `GET /api/definitions/{vhost}`: the whole topology, policies and
//! operator policies (as `parameters` of component `operator_policy`) included, in RabbitMQ's
//! definitions format, so backups and tools written for RabbitMQ's management plugin read it, and
//! so that the nodes of a cluster can be compared entity by entity (the partition tests do).
//!
//! The shapes follow RabbitMQ 3.10.8's export, checked side by side: users carry their salted
//! SHA-256 hash (`rabbit_password_hashing_sha256`, the same bytes RabbitMQ stores), queues and
//! exchanges come durable or not, the default exchange and the `amq.*` ones are left out but
//! bindings from `amq.*` exchanges stay, exclusive queues and their bindings are left out (they
//! mean nothing without the connection that owns them). The per-vhost form drops every
//! node-wide section and `vhost` from each queue, exchange and binding (policies and operator
//! policies keep theirs), as RabbitMQ's does.
//!
//! Unlike RabbitMQ, every list is sorted (users, vhosts, permissions by name; queues, exchanges
//! and bindings by vhost, then their names, keys and arguments), so two nodes with the same
//! topology give byte-equal documents. Built from [`Broker::export_commands`], the very commands
//! a replicated snapshot holds, so it shows what a node would hand a node catching up.
//!
//! [`Broker::export_commands`]: warren_broker::broker::Broker::export_commands

use crate::management::{authorize, table_json};
use crate::Shared;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::sync::Arc;
use warren_broker::command::Command;
use warren_broker::definitions::MetaRecord;
use warren_broker::policy::PolicyKind;

/// The RabbitMQ release whose definitions format this is (`rabbit_version` in the document).
const RABBIT_VERSION: &str = "3.10.8";

/// RabbitMQ's name for the password hash that [`warren_broker::users::Users::password_hash`]
/// gives: base64(salt ++ SHA-256(salt ++ password)).
const HASHING_ALGORITHM: &str = "rabbit_password_hashing_sha256";

/// Which vhost a document covers: all of them (with their `vhost` fields) or one.
#[derive(Clone, Copy)]
enum Scope<'a> {
    All,
    Vhost(&'a str),
}

pub async fn get_all(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    Json(document(&s, Scope::All)).into_response()
}

pub async fn get_vhost(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if s.broker.vhost(&vhost).is_none() {
        // RabbitMQ's answer here, word for word: 400, not the 404 of /api/queues/{vhost}.
        let body = json!({ "error": "bad_request", "reason": "vhost_not_found" });
        return (StatusCode::BAD_REQUEST, Json(body)).into_response();
    }
    Json(document(&s, Scope::Vhost(&vhost))).into_response()
}

/// `POST /api/definitions`: imports a whole document (see [`crate::definitions_import`]); 204,
/// or 400 with the reason as RabbitMQ answers.
pub async fn post_all(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    post(s, headers, None, body).await
}

/// `POST /api/definitions/{vhost}`: imports one vhost's queues, exchanges, bindings and
/// policies into `vhost`.
pub async fn post_vhost(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(vhost): Path<String>,
    body: Bytes,
) -> Response {
    post(s, headers, Some(vhost), body).await
}

async fn post(s: Arc<Shared>, headers: HeaderMap, vhost: Option<String>, body: Bytes) -> Response {
    let caller = match crate::management::auth_admin(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if body.len() > crate::definitions_import::DOCUMENT_BYTES_MAX {
        return bad_request("definitions document too large");
    }
    let Ok(doc) = serde_json::from_slice::<Value>(&body) else {
        return bad_request("failed_to_parse_json");
    };
    match crate::definitions_import::import(&s, &doc, vhost.as_deref(), &caller).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(why) => bad_request(&why),
    }
}

/// The definitions document of the whole node (`vhost` None) or of one vhost, as
/// `GET /api/definitions` answers it.
pub fn export(s: &Shared, vhost: Option<&str>) -> Value {
    document(
        s,
        match vhost {
            None => Scope::All,
            Some(v) => Scope::Vhost(v),
        },
    )
}

fn bad_request(reason: &str) -> Response {
    let body = json!({ "error": "bad_request", "reason": reason });
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

fn document(s: &Shared, scope: Scope<'_>) -> Value {
    let commands = s.broker.export_commands();
    let in_scope = |vhost: &str| match scope {
        Scope::All => true,
        Scope::Vhost(only) => only == vhost,
    };
    // An entry of a vhost: with its `vhost` field in the whole document only.
    let entry = |vhost: &str, mut fields: Map<String, Value>| {
        if matches!(scope, Scope::All) {
            fields.insert("vhost".into(), json!(vhost));
        }
        Value::Object(fields)
    };
    let exclusive: HashSet<(&str, &str)> = commands
        .iter()
        .filter_map(|c| match c {
            Command::QueueDeclare {
                vhost,
                name,
                exclusive: true,
                ..
            } => Some((vhost.as_str(), name.as_str())),
            _ => None,
        })
        .collect();

    let (mut users, mut vhosts, mut permissions) = (Vec::new(), Vec::new(), Vec::new());
    let (mut queues, mut exchanges, mut bindings) = (Vec::new(), Vec::new(), Vec::new());
    let (mut policies, mut parameters) = (Vec::new(), Vec::new());
    for command in &commands {
        match command {
            Command::Meta {
                record:
                    MetaRecord::PutUser {
                        name,
                        password_hash,
                        tags,
                    },
            } => users.push(json!({
                "name": name,
                "password_hash": password_hash,
                "hashing_algorithm": HASHING_ALGORITHM,
                "tags": tags,
                "limits": {},
            })),
            Command::Meta {
                record: MetaRecord::AddVhost { name },
            } => vhosts.push(json!({ "name": name })),
            Command::Meta {
                record:
                    MetaRecord::SetPermissions {
                        user,
                        vhost,
                        configure,
                        write,
                        read,
                    },
            } => permissions.push(json!({
                "user": user, "vhost": vhost,
                "configure": configure, "write": write, "read": read,
            })),
            Command::Meta {
                record:
                    MetaRecord::SetPolicy {
                        vhost,
                        name,
                        kind,
                        pattern,
                        apply_to,
                        priority,
                        definition,
                    },
            } if in_scope(vhost) => {
                let value = json!({
                    "pattern": pattern, "definition": definition,
                    "priority": priority, "apply-to": apply_to,
                });
                // Unlike queues, these keep their `vhost` in a per-vhost document too, as
                // RabbitMQ 3.10.8's do.
                match kind {
                    // As RabbitMQ: operator policies are runtime parameters of their own
                    // component, listed under `parameters`.
                    PolicyKind::Operator => parameters.push(json!({
                        "value": value, "vhost": vhost, "component": "operator_policy",
                        "name": name,
                    })),
                    PolicyKind::Policy => policies.push(json!({
                        "vhost": vhost, "name": name, "pattern": pattern, "apply-to": apply_to,
                        "definition": definition, "priority": priority,
                    })),
                }
            }
            Command::ExchangeDeclare {
                vhost,
                name,
                kind,
                durable,
                auto_delete,
                internal,
                arguments,
            } if in_scope(vhost) => exchanges.push(entry(
                vhost,
                object(json!({
                    "name": name, "type": kind, "durable": durable,
                    "auto_delete": auto_delete, "internal": internal,
                    "arguments": table_json(arguments),
                })),
            )),
            Command::QueueDeclare {
                vhost,
                name,
                durable,
                exclusive: false,
                auto_delete,
                arguments,
                ..
            } if in_scope(vhost) => queues.push(entry(
                vhost,
                object(json!({
                    "name": name, "durable": durable, "auto_delete": auto_delete,
                    "arguments": table_json(arguments),
                })),
            )),
            Command::QueueBind {
                vhost,
                queue,
                exchange,
                key,
                arguments,
                ..
            } if in_scope(vhost) && !exclusive.contains(&(vhost.as_str(), queue.as_str())) => {
                bindings.push(entry(
                    vhost,
                    binding(exchange, queue, "queue", key, table_json(arguments)),
                ))
            }
            Command::ExchangeBind {
                vhost,
                destination,
                source,
                key,
                arguments,
            } if in_scope(vhost) => bindings.push(entry(
                vhost,
                binding(source, destination, "exchange", key, table_json(arguments)),
            )),
            _ => {}
        }
    }
    sort_by_fields(&mut users, &["name"]);
    sort_by_fields(&mut policies, &["vhost", "name"]);
    sort_by_fields(&mut parameters, &["vhost", "component", "name"]);
    sort_by_fields(&mut vhosts, &["name"]);
    sort_by_fields(&mut permissions, &["user", "vhost"]);
    sort_by_fields(&mut queues, &["vhost", "name"]);
    sort_by_fields(&mut exchanges, &["vhost", "name"]);
    sort_by_fields(
        &mut bindings,
        &[
            "vhost",
            "source",
            "destination_type",
            "destination",
            "routing_key",
            "arguments",
        ],
    );

    let mut doc = Map::new();
    doc.insert("rabbit_version".into(), json!(RABBIT_VERSION));
    if matches!(scope, Scope::All) {
        doc.insert("rabbitmq_version".into(), json!(RABBIT_VERSION));
        doc.insert("product_name".into(), json!("warren"));
        doc.insert("product_version".into(), json!(env!("CARGO_PKG_VERSION")));
        doc.insert("users".into(), Value::Array(users));
        doc.insert("vhosts".into(), Value::Array(vhosts));
        doc.insert("permissions".into(), Value::Array(permissions));
        doc.insert("topic_permissions".into(), json!([]));
        doc.insert("global_parameters".into(), json!([]));
    }
    doc.insert("parameters".into(), Value::Array(parameters));
    doc.insert("policies".into(), Value::Array(policies));
    doc.insert("queues".into(), Value::Array(queues));
    doc.insert("exchanges".into(), Value::Array(exchanges));
    doc.insert("bindings".into(), Value::Array(bindings));
    Value::Object(doc)
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("json! of an object literal"),
    }
}

fn binding(
    source: &str,
    destination: &str,
    destination_type: &str,
    key: &str,
    arguments: Value,
) -> Map<String, Value> {
    object(json!({
        "source": source, "destination": destination, "destination_type": destination_type,
        "routing_key": key, "arguments": arguments,
    }))
}

/// Sorts entries by the given fields in turn; strings compare as strings, anything else (an
/// arguments table) by its JSON text, which is stable since object keys are kept sorted.
fn sort_by_fields(entries: &mut [Value], fields: &[&str]) {
    let key = |v: &Value| -> Vec<String> {
        fields
            .iter()
            .map(|f| match &v[*f] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            })
            .collect()
    };
    entries.sort_by_cached_key(key);
}
