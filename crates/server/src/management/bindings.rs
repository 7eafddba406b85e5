//! `/api/bindings`: listing (with the default exchange's implicit binding of every queue, as
//! RabbitMQ lists it), binding (`POST .../e/{source}/q|e/{destination}`, 201 with the new
//! binding's properties key in `Location`) and unbinding (`DELETE .../{props}`). Binds and
//! unbinds are the AMQP methods run through a [`super::session::Session`].
//!
//! A binding is named by its properties key, RabbitMQ's: `~` for an empty key without
//! arguments, else the key quoted as a URL form value (`~` itself as `%7E`), followed by `~`
//! and a hash of the arguments when there are any. RabbitMQ's hash is Erlang's `phash2` of its
//! internal term, which means nothing outside Erlang; ours is FNV-1a of the arguments' JSON,
//! in the same six base64url characters. Clients take the key from a listing or `Location`,
//! never compute it.

use super::exchanges::from_path;
use super::queues::session_for_change;
use super::{
    amqp_error, auth, error, json_table, not_found, short_string, table_json, Api, Body, Shared,
};
use amq_protocol_types::FieldTable;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use warren_broker::vhost::BindingInfo;
use warren_protocol::amqp::{exchange, queue, AMQPClass};

/// Quotes as mochiweb's `quote_plus` (RabbitMQ's): letters, digits and `.-~_` kept, space as
/// `+`, every other byte `%XX`.
fn quote_plus(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'~' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Six base64url characters naming a binding's arguments (see the module doc).
fn args_hash(arguments: &FieldTable) -> String {
    let text = table_json(arguments).to_string();
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.to_be_bytes())
}

/// RabbitMQ's properties key of a binding.
pub fn properties_key(routing_key: &str, arguments: &FieldTable) -> String {
    let empty_args = arguments.inner().is_empty();
    if routing_key.is_empty() && empty_args {
        return "~".to_string();
    }
    let key = quote_plus(routing_key).replace('~', "%7E");
    if empty_args {
        key
    } else {
        format!("{key}~{}", args_hash(arguments))
    }
}

fn binding_json(vhost: &str, b: &BindingInfo) -> Value {
    json!({
        "source": b.source,
        "vhost": vhost,
        "destination": b.destination,
        "destination_type": if b.to_queue { "queue" } else { "exchange" },
        "routing_key": b.routing_key,
        "arguments": table_json(&b.arguments),
        "properties_key": properties_key(&b.routing_key, &b.arguments),
    })
}

/// The default exchange's binding of `queue`, which RabbitMQ lists though nobody made it.
fn default_binding(queue: &str) -> BindingInfo {
    BindingInfo {
        source: String::new(),
        destination: queue.to_string(),
        to_queue: true,
        routing_key: queue.to_string(),
        arguments: FieldTable::default(),
    }
}

/// Every binding of `vhost`, the default exchange's first.
fn bindings_of(s: &Shared, vhost: &str) -> Vec<BindingInfo> {
    let Some(v) = s.broker.vhost(vhost) else {
        return Vec::new();
    };
    let v = v.lock().expect("vhost lock");
    let mut queues = v.queue_names();
    queues.sort();
    let mut out: Vec<BindingInfo> = queues.iter().map(|q| default_binding(q)).collect();
    out.extend(v.binding_infos());
    out
}

fn listing(vhost: &str, bindings: impl Iterator<Item = BindingInfo>) -> Response {
    Json(
        bindings
            .map(|b| binding_json(vhost, &b))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

/// A listing of whole vhosts' bindings, paged when asked (`?page=..`). RabbitMQ 3.10 answers
/// these two paths whole whatever the query; warren pages them as it pages queues because a
/// vhost of 10,000 queues has at least 10,000 bindings (each queue's default one), too many for
/// one answer to a browser. `name` filters on the destination, the name a binding is looked
/// up by (its queue's, or its destination exchange's).
fn paged_listing(
    bindings: Vec<(String, BindingInfo)>,
    params: &HashMap<String, String>,
) -> Response {
    super::paging::paged_by(
        bindings,
        |(_, b)| b.destination.as_str(),
        |(vhost, b)| binding_json(vhost, b),
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
    let mut names: Vec<String> = s.broker.vhosts().into_iter().map(|(n, _)| n).collect();
    names.sort();
    let mut all = Vec::new();
    for vhost in names.iter().filter(|v| caller.sees_vhost(&s, v)) {
        all.extend(
            bindings_of(&s, vhost)
                .into_iter()
                .map(|b| (vhost.clone(), b)),
        );
    }
    paged_listing(all, &params)
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
    let all = bindings_of(&s, &vhost)
        .into_iter()
        .map(|b| (vhost.clone(), b))
        .collect();
    paged_listing(all, &params)
}

/// The bindings of `vhost` that `keep` keeps, once the caller may see the vhost.
fn filtered(
    s: &Shared,
    headers: &HeaderMap,
    vhost: &str,
    keep: impl Fn(&BindingInfo) -> bool,
) -> Result<Vec<BindingInfo>, Response> {
    let caller = auth::caller(s, headers)?;
    auth::vhost(s, &caller, vhost)?;
    Ok(bindings_of(s, vhost).into_iter().filter(keep).collect())
}

/// `GET /api/queues/{vhost}/{queue}/bindings`.
pub async fn of_queue(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, queue)): Path<(String, String)>,
) -> Response {
    match filtered(&s, &headers, &vhost, |b| {
        b.to_queue && b.destination == queue
    }) {
        // RabbitMQ lists the default binding even of a queue that does not exist.
        Ok(list) if list.is_empty() => listing(&vhost, std::iter::once(default_binding(&queue))),
        Ok(list) => listing(&vhost, list.into_iter()),
        Err(r) => r,
    }
}

/// `GET /api/exchanges/{vhost}/{exchange}/bindings/source`.
pub async fn of_source(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    let name = from_path(&name);
    match filtered(&s, &headers, &vhost, |b| b.source == name) {
        Ok(list) => listing(&vhost, list.into_iter()),
        Err(r) => r,
    }
}

/// `GET /api/exchanges/{vhost}/{exchange}/bindings/destination`.
pub async fn of_destination(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, name)): Path<(String, String)>,
) -> Response {
    match filtered(&s, &headers, &vhost, |b| {
        !b.to_queue && b.destination == name
    }) {
        Ok(list) => listing(&vhost, list.into_iter()),
        Err(r) => r,
    }
}

/// Whether the path's `q` or `e` names a queue (`Some(true)`) or an exchange.
fn to_queue(kind: &str) -> Option<bool> {
    match kind {
        "q" => Some(true),
        "e" => Some(false),
        _ => None,
    }
}

/// The bindings from `source` to `destination` a path names.
fn between(
    s: &Shared,
    headers: &HeaderMap,
    (vhost, source, kind, destination): (&str, &str, &str, &str),
) -> Result<Vec<BindingInfo>, Response> {
    let queue = to_queue(kind).ok_or_else(not_found)?;
    let source = from_path(source);
    filtered(s, headers, vhost, |b| {
        b.source == source && b.to_queue == queue && b.destination == destination
    })
}

pub async fn list_between(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
) -> Response {
    match between(&s, &headers, (&vhost, &source, &kind, &destination)) {
        Ok(list) => listing(&vhost, list.into_iter()),
        Err(r) => r,
    }
}

pub async fn get_one(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, source, kind, destination, props)): Path<(String, String, String, String, String)>,
) -> Response {
    match between(&s, &headers, (&vhost, &source, &kind, &destination)) {
        Ok(list) => match list
            .iter()
            .find(|b| properties_key(&b.routing_key, &b.arguments) == props)
        {
            Some(b) => Json(binding_json(&vhost, b)).into_response(),
            None => not_found(),
        },
        Err(r) => r,
    }
}

#[derive(Deserialize)]
pub struct BindBody {
    #[serde(default)]
    routing_key: String,
    #[serde(default)]
    arguments: Value,
}

/// The AMQP method binding (or unbinding) `source` to `destination`; a name or key longer
/// than AMQP allows is refused.
pub(crate) fn bind_method(
    bind: bool,
    to_queue: bool,
    source: &str,
    destination: &str,
    key: &str,
    arguments: FieldTable,
) -> Result<AMQPClass, String> {
    let source = short_string("source", source)?;
    let destination = short_string("destination", destination)?;
    let key = short_string("routing key", key)?;
    Ok(match (to_queue, bind) {
        (true, true) => AMQPClass::Queue(queue::AMQPMethod::Bind(queue::Bind {
            queue: destination,
            exchange: source,
            routing_key: key,
            nowait: false,
            arguments,
        })),
        (true, false) => AMQPClass::Queue(queue::AMQPMethod::Unbind(queue::Unbind {
            queue: destination,
            exchange: source,
            routing_key: key,
            arguments,
        })),
        (false, true) => AMQPClass::Exchange(exchange::AMQPMethod::Bind(exchange::Bind {
            destination,
            source,
            routing_key: key,
            nowait: false,
            arguments,
        })),
        (false, false) => AMQPClass::Exchange(exchange::AMQPMethod::Unbind(exchange::Unbind {
            destination,
            source,
            routing_key: key,
            nowait: false,
            arguments,
        })),
    })
}

/// `POST /api/bindings/{vhost}/e/{source}/q|e/{destination}`: queue.bind or exchange.bind;
/// 201 with `Location: {destination}/{properties key}`, relative as RabbitMQ's.
pub async fn create(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, source, kind, destination)): Path<(String, String, String, String)>,
    body: Result<Body<BindBody>, Response>,
) -> Response {
    let Some(queue) = to_queue(&kind) else {
        return not_found();
    };
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let Body(body) = match body {
        Ok(b) => b,
        Err(r) => return r,
    };
    let arguments = match json_table(&body.arguments) {
        Ok(arguments) => arguments,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let key = properties_key(&body.routing_key, &arguments);
    let method = match bind_method(
        true,
        queue,
        from_path(&source),
        &destination,
        &body.routing_key,
        arguments,
    ) {
        Ok(method) => method,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match session.control(method).await {
        Ok(_) => {
            let location = format!("{}/{}", quote_plus(&destination), quote_plus(&key));
            (StatusCode::CREATED, [("location", location)]).into_response()
        }
        Err(e) => amqp_error(&e),
    }
}

/// `DELETE /api/bindings/{vhost}/e/{source}/q|e/{destination}/{props}`: the binding with that
/// properties key, unbound.
pub async fn delete(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, source, kind, destination, props)): Path<(String, String, String, String, String)>,
) -> Response {
    let found = match between(&s, &headers, (&vhost, &source, &kind, &destination)) {
        Ok(list) => list
            .into_iter()
            .find(|b| properties_key(&b.routing_key, &b.arguments) == props),
        Err(r) => return r,
    };
    let Some(b) = found else {
        return not_found();
    };
    let mut session = match session_for_change(&s, &headers, &vhost) {
        Ok(session) => session,
        Err(r) => return r,
    };
    let method = match bind_method(
        false,
        b.to_queue,
        &b.source,
        &b.destination,
        &b.routing_key,
        b.arguments,
    ) {
        Ok(method) => method,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match session.control(method).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => amqp_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol_types::AMQPValue;

    #[test]
    fn properties_keys_are_rabbitmqs_for_keys_without_arguments() {
        let none = FieldTable::default();
        assert_eq!(properties_key("", &none), "~");
        assert_eq!(properties_key("a.b", &none), "a.b");
        assert_eq!(properties_key("a b/c", &none), "a+b%2Fc");
        assert_eq!(properties_key("x~y*#", &none), "x%7Ey%2A%23");
    }

    #[test]
    fn properties_keys_with_arguments_end_in_a_stable_hash() {
        let mut args = FieldTable::default();
        args.insert("x".into(), AMQPValue::LongLongInt(1));
        let key = properties_key("a b/c", &args);
        let (quoted, hash) = key.split_once('~').expect("a hash follows the key");
        assert_eq!(quoted, "a+b%2Fc");
        assert_eq!(hash.len(), 6);
        assert_eq!(key, properties_key("a b/c", &args));
        assert!(properties_key("", &args).starts_with('~'));
    }
}
