//! A quorum queue's members, changed as rabbitmq-queues' `add_member` and `delete_member` do
//! (`warren ctl` builds `grow` and `shrink` from them): `POST` and `DELETE` on
//! `/api/warren/queues/{vhost}/{queue}/members[/{node}]`. RabbitMQ has no HTTP API for these;
//! the paths are warren's own, beside `/api/warren/cluster`.
//!
//! The change is a metadata command ([`Command::QueueMembers`]): once it is applied, the
//! joining node's replica is open and the queue's leader is moving the Raft group's voters to
//! match, one node at a time (see `warren_cluster::groups`). The answer does not wait for the
//! new member to catch up: `quorum_status` shows when it has.

use super::{amqp_error, auth, error, Api};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use warren_broker::command::Command;

#[derive(Deserialize)]
pub struct MemberBody {
    node: String,
}

/// `POST .../members` with `{"node": NAME}`: adds a member (204; 400 if it is one already).
pub async fn add(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, queue)): Path<(String, String)>,
    Json(body): Json<MemberBody>,
) -> Response {
    change(&s, &headers, &vhost, &queue, &body.node, true).await
}

/// `DELETE .../members/{node}`: removes a member (204; 400 if it is not one, or is the last).
pub async fn delete(
    State(s): Api,
    headers: HeaderMap,
    Path((vhost, queue, node)): Path<(String, String, String)>,
) -> Response {
    change(&s, &headers, &vhost, &queue, &node, false).await
}

async fn change(
    s: &crate::Shared,
    headers: &HeaderMap,
    vhost: &str,
    queue: &str,
    node: &str,
    add: bool,
) -> Response {
    if let Err(r) = auth::admin(s, headers) {
        return r;
    }
    let Some(cluster) = &s.cluster else {
        return error(
            StatusCode::BAD_REQUEST,
            "this node is not clustered: a quorum queue's members are this node",
        );
    };
    let members = s.broker.vhost(vhost).and_then(|v| {
        v.lock()
            .expect("vhost lock")
            .replicated_queue(queue)
            .map(|(_, m)| m)
    });
    let Some(members) = members else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("no quorum queue '{queue}' in vhost '{vhost}'"),
        );
    };
    let mut members: Vec<String> = members.iter().map(|m| m.to_string()).collect();
    let is_member = members.iter().any(|m| m == node);
    if add {
        if cluster.member_id(node).is_none() {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("node '{node}' is not a member of this cluster"),
            );
        }
        if is_member {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("node '{node}' is a member of quorum queue '{queue}' already"),
            );
        }
        members.push(node.to_string());
    } else {
        if !is_member {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("node '{node}' is not a member of quorum queue '{queue}'"),
            );
        }
        if members.len() == 1 {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("node '{node}' is the last member of quorum queue '{queue}'"),
            );
        }
        members.retain(|m| m != node);
    }
    let command = Command::QueueMembers {
        vhost: vhost.to_string(),
        name: queue.to_string(),
        members: members.clone(),
    };
    match cluster.execute(command).await {
        Ok(_) => (StatusCode::OK, Json(json!({ "members": members }))).into_response(),
        Err(e) => amqp_error(&e),
    }
}
