//! Cluster membership over the management API, for `warren ctl join_cluster` and
//! `forget_cluster_node` and for scripts:
//!
//! - `POST /api/warren/cluster/join` with `{"node": "host:port"}` (a member's cluster address):
//!   this node joins that member's cluster; 204 once it is a member.
//! - `DELETE /api/nodes/{name}`: the cluster forgets the stopped member `name`; 204 once a
//!   majority has the change.
//! - `POST /api/warren/reset`: rabbitmqctl's `reset`. This node leaves its cluster, then stops
//!   and deletes its data ([`reset_data_if_asked`]); started again it is a new node. 204 once
//!   it has left; 503 where it cannot leave (no majority), and then nothing is deleted.
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
        .route("/api/warren/reset", post(reset))
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

/// The file in the meta dir that says the node's data is to be deleted: written once the node
/// left its cluster, so a node stopped (or killed) before deleting it does so at its next start.
pub const RESET_MARKER: &str = "reset";

async fn reset(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    if let Some(cluster) = &s.cluster {
        if let Err(e) = cluster.leave().await {
            return refusal(e);
        }
    }
    let meta = s.config.meta_dir();
    let marker = meta.join(RESET_MARKER);
    if let Err(e) = std::fs::create_dir_all(&meta).and_then(|()| std::fs::write(&marker, b"")) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "this node left its cluster but cannot write {}: {e}; stop it and delete its \
                 data directory by hand",
                marker.display()
            ),
        );
    }
    tracing::warn!("reset: the node stops and deletes its data");
    // The answer goes out first; then the node stops as on SIGTERM.
    tokio::spawn(async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // SAFETY: kill(2) on this process's own id, with a signal its handler takes.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGTERM);
        }
    });
    StatusCode::NO_CONTENT.into_response()
}

/// Deletes the node's data (its WAL, segments and meta dirs) if `reset` asked for it; the
/// marker, in the meta dir, goes last, so an interrupted deletion is done again.
pub fn reset_data_if_asked(config: &crate::node::config::ServerConfig) -> Result<bool, String> {
    let meta = config.meta_dir();
    if !meta.join(RESET_MARKER).is_file() {
        return Ok(false);
    }
    for dir in [config.wal_dir(), config.segment_dir(), meta.clone()] {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("reset: cannot delete {}: {e}", dir.display())),
        }
    }
    let cluster = meta.join("cluster");
    std::fs::create_dir_all(&cluster)
        .and_then(|()| std::fs::write(cluster.join(warren_cluster::RESET_NODE), b""))
        .map_err(|e| format!("reset: cannot write {}: {e}", cluster.display()))?;
    tracing::warn!(data_dir = %config.data_dir.display(), "reset: the node's data was deleted");
    Ok(true)
}
