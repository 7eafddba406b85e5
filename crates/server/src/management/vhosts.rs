//! `/api/vhosts`: the vhosts the caller sees (monitors see all), with their message counts;
//! creating and deleting one (administrators).

use super::{auth, change, not_found, refuse_if_failed, Api, Shared};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use warren_broker::definitions::MetaRecord;

/// A vhost in RabbitMQ's shape, with its queues' message counts.
fn vhost_json(s: &Shared, name: &str) -> Option<Value> {
    let v = s.broker.vhost(name)?;
    let (mut ready, mut unacked) = (0u64, 0u64);
    for q in v.lock().expect("vhost lock").queue_infos() {
        ready += q.messages_ready;
        unacked += q.messages_unacknowledged;
    }
    let rate = json!({ "rate": 0.0 });
    let mut cluster_state = serde_json::Map::new();
    cluster_state.insert(s.node_name().to_string(), json!("running"));
    Some(json!({
        "name": name,
        "description": "",
        "tags": [],
        "metadata": { "description": "", "tags": [] },
        "default_queue_type": "undefined",
        "tracing": false,
        "cluster_state": cluster_state,
        "messages": ready + unacked, "messages_details": rate,
        "messages_ready": ready, "messages_ready_details": rate,
        "messages_unacknowledged": unacked, "messages_unacknowledged_details": rate,
    }))
}

pub async fn list(State(s): Api, headers: HeaderMap) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut names: Vec<String> = s.broker.vhosts().into_iter().map(|(n, _)| n).collect();
    names.sort();
    Json(
        names
            .iter()
            .filter(|n| caller.lists_vhost(&s, n))
            .filter_map(|n| vhost_json(&s, n))
            .collect::<Vec<_>>(),
    )
    .into_response()
}

pub async fn get_one(State(s): Api, headers: HeaderMap, Path(vhost): Path<String>) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if s.broker.vhost(&vhost).is_none() {
        return not_found();
    }
    if !caller.lists_vhost(&s, &vhost) {
        return auth::not_authorised_vhost();
    }
    match vhost_json(&s, &vhost) {
        Some(v) => Json(v).into_response(),
        None => not_found(),
    }
}

/// `PUT /api/vhosts/{vhost}`: creates it (201) and, as RabbitMQ's management plugin does,
/// gives the administrator who created it full permissions there; 204 if it existed.
pub async fn put(State(s): Api, headers: HeaderMap, Path(vhost): Path<String>) -> Response {
    let caller = match auth::admin(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    let grant = MetaRecord::SetPermissions {
        user: caller.user.clone(),
        vhost: vhost.clone(),
        configure: ".*".into(),
        write: ".*".into(),
        read: ".*".into(),
    };
    if s.broker.vhost(&vhost).is_some() {
        return StatusCode::NO_CONTENT.into_response();
    }
    let created = change(
        &s,
        MetaRecord::AddVhost { name: vhost },
        StatusCode::CREATED,
    )
    .await;
    if created.status() != StatusCode::CREATED {
        return created;
    }
    change(&s, grant, StatusCode::CREATED).await
}

pub async fn delete(State(s): Api, headers: HeaderMap, Path(vhost): Path<String>) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    if let Err(r) = refuse_if_failed(&s) {
        return r;
    }
    if s.broker.vhost(&vhost).is_none() {
        return not_found();
    }
    change(
        &s,
        MetaRecord::DeleteVhost { name: vhost },
        StatusCode::NO_CONTENT,
    )
    .await
}
