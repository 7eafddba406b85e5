//! Cluster membership over the management API, for `warren ctl join_cluster` and
//! `forget_cluster_node` and for scripts:
//!
//! - `POST /api/warren/cluster/join` with `{"node": "host:port"}` (a member's cluster address):
//!   this node joins that member's cluster; 204 once it is a member.
//! - `DELETE /api/nodes/{name}`: the cluster forgets the stopped member `name`; 204 once a
//!   majority has the change.
//!
//! Refusals carry a reason: 400 (joining itself, forgetting the node asked, a bad address),
//! 404 (no such member), 409 (already a member, the node still runs, a name in use), 503 (no
//! majority answered).

use crate::management::{authorize, error};
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::Arc;
use warren_cluster::address::HostPort;
use warren_cluster::membership::MembershipError;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/warren/cluster/join", post(join))
        .route("/api/nodes/{name}", delete(forget))
}

fn refusal(e: MembershipError) -> Response {
    let status = match e {
        MembershipError::Invalid(_) => StatusCode::BAD_REQUEST,
        MembershipError::UnknownNode(_) => StatusCode::NOT_FOUND,
        MembershipError::Conflict(_) => StatusCode::CONFLICT,
        MembershipError::NoMajority(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.reason())
}

fn not_clustered() -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "this node was started without --cluster-listen: restart it with one to cluster it",
    )
}

#[derive(Deserialize)]
struct JoinBody {
    /// A member's cluster address (`--cluster-listen`), as `host:port`.
    node: String,
}

async fn join(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Option<Json<JoinBody>>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let Some(cluster) = &s.cluster else {
        return not_clustered();
    };
    let Some(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected a JSON body {\"node\": \"host:port\"}: a member's cluster address",
        );
    };
    let target = match parse_target(&body.node) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    match cluster.join(target).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(e),
    }
}

/// `host:port` to one address; a RabbitMQ-style `name@host:port` is taken as `host:port`.
/// The member to ask, as `join_cluster` takes it: `host:port` (a name or an address), or
/// RabbitMQ's `name@host:port`. The name is resolved when it is dialled.
fn parse_target(node: &str) -> Result<HostPort, String> {
    let address = node.rsplit_once('@').map_or(node, |(_, a)| a).trim();
    address.parse().map_err(|e| {
        format!("'{node}' is not a cluster address (host:port, the member's --cluster-advertise or --cluster-listen): {e}")
    })
}

async fn forget(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let Some(cluster) = &s.cluster else {
        return not_clustered();
    };
    match cluster.forget(&name).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(e),
    }
}
