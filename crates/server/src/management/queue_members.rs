//! A quorum queue's members, changed as rabbitmq-queues' `add_member` and `delete_member` do
//! (`warren ctl` builds `grow` and `shrink` from them): `POST` and `DELETE` on
//! `/api/warren/queues/{vhost}/{queue}/members[/{node}]`; and `POST /api/warren/rebalance`,
//! rabbitmq-queues' `rebalance quorum`. RabbitMQ has no HTTP API for these; the paths are
//! warren's own, beside `/api/warren/cluster`.
//!
//! The change is a metadata command ([`Command::QueueMembers`]): once it is applied, the
//! joining node's replica is open and the queue's leader is moving the Raft group's voters to
//! match, one node at a time (see `warren_cluster::groups`). The answer does not wait for the
//! new member to catch up: `quorum_status` shows when it has.

use super::{amqp_error, auth, error, Api, Body};
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
    Body(body): Body<MemberBody>,
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

/// `POST /api/warren/rebalance`: moves quorum queue leaders from nodes that lead more than
/// their share to members that lead fewer, as rabbitmq-queues rebalance. It sees the queues
/// this node holds a replica of (every one, with the default group size of 3 on 3 nodes);
/// each move is a Raft leadership transfer, done when the answer goes out or soon after.
pub async fn rebalance(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::admin(&s, &headers) {
        return r;
    }
    let Some(cluster) = &s.cluster else {
        return error(StatusCode::BAD_REQUEST, "this node is not clustered");
    };
    let running = |name: &str| cluster.is_node_running(name).unwrap_or(false);
    // (group, running members' ids, leader id) of every queue with a replica here.
    let mut queues = Vec::new();
    for (_, v) in s.broker.vhosts() {
        let v = v.lock().expect("vhost lock");
        for (_, log_id, members) in v.replicated_queues() {
            let group = warren_cluster::replicas::group_id(log_id);
            let Some(view) = cluster.queue_groups().view(group) else {
                continue;
            };
            if view.leader == 0 {
                continue;
            }
            let ids: Vec<u64> = members
                .iter()
                .filter(|m| running(m))
                .filter_map(|m| cluster.member_id(m))
                .collect();
            queues.push((group, ids, view.leader));
        }
    }
    let mut leads: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    for (_, ids, leader) in &queues {
        for id in ids {
            leads.entry(*id).or_default();
        }
        *leads.entry(*leader).or_default() += 1;
    }
    let share = queues.len().div_ceil(leads.len().max(1));
    let mut moved = 0;
    for (group, ids, leader) in &queues {
        if leads[leader] <= share {
            continue;
        }
        let Some(&to) = ids
            .iter()
            .filter(|id| leads[id] < share)
            .min_by_key(|id| leads[id])
        else {
            continue;
        };
        cluster
            .queue_groups()
            .send(warren_cluster::groups::Input::TransferLeader { group: *group, to });
        *leads.get_mut(leader).expect("counted") -= 1;
        *leads.get_mut(&to).expect("counted") += 1;
        moved += 1;
    }
    Json(json!({ "queues": queues.len(), "moved": moved })).into_response()
}
