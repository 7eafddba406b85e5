//! Test-only fault injection over HTTP (the switches are [`crate::node::fault_injection`]'s), so that tests can prove what a real broker process
//! does when its disk fails (`tests/interop/python/test_storage_failure.py`).
//!
//! Off unless the node was started with the hidden `--fault-injection` flag, which has no
//! environment variable and no config-file key, so it cannot be turned on by accident; the
//! node then logs a warning at start. Even then the routes below need an administrator.
//!
//! `POST /api/warren/faults/fail-next-fsync` makes the next fdatasync of the WAL fail with
//! EIO (the next one that has records to sync: a persistent publish triggers it);
//! `?target=metadata` makes the metadata journal's next sync fail instead (a durable declare
//! triggers it). Either stops the node's writes for good, as a real failure would.
//!
//! `POST /api/warren/faults/disk-full?on=true` makes every WAL write fail with ENOSPC until
//! `?on=false`: a disk that filled up, then got space back.
//!
//! `POST /api/warren/faults/disk-stalls?every_ms=5000&stall_ms=20` stalls the WAL's syncs the
//! way this project's test machine's disk does (`warren_store::Faults::stall_every_ms`);
//! `&sync_ms=8` makes each sync in the window 8 ms slower instead; `every_ms=0` ends it.
//! `scripts/compare-quorum.py --warren-disk-stalls` sets it on every node at once, to see how
//! the latency tail rides out the same stalls from one build to the next.
//!
//! `POST /api/warren/faults/confirm-without-storing?on=true` plants a bug for the message-safety
//! checker (`tests/interop/python/queue_jepsen.py`) to catch: until `?on=false`, this node drops
//! the publishes other nodes forward to its queues yet answers them `Published`, so publishers
//! on other nodes get confirms for messages stored nowhere.

use crate::node::fault_injection::FaultInjection;
use crate::Shared;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/warren/faults/fail-next-fsync", post(fail_next_fsync))
        .route("/api/warren/faults/disk-full", post(disk_full))
        .route("/api/warren/faults/disk-stalls", post(disk_stalls))
        .route(
            "/api/warren/faults/confirm-without-storing",
            post(confirm_without_storing),
        )
}

/// The node's switches, for an administrator of a node started with fault injection; as if the
/// route did not exist otherwise.
#[allow(clippy::result_large_err)] // the error is the handler's reply, built once per request
fn switches<'a>(s: &'a Shared, headers: &HeaderMap) -> Result<&'a FaultInjection, Response> {
    crate::management::authorize(s, headers)?;
    s.config
        .fault_injection
        .as_ref()
        .ok_or_else(|| crate::management::error(StatusCode::NOT_FOUND, "Object Not Found"))
}

#[derive(Deserialize)]
struct Target {
    target: Option<String>,
}

async fn fail_next_fsync(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<Target>,
) -> Response {
    let faults = match switches(&s, &headers) {
        Ok(faults) => faults,
        Err(r) => return r,
    };
    let (which, file) = match q.target.as_deref() {
        None | Some("wal") => ("wal", &faults.wal),
        Some("metadata") => ("metadata", &faults.metadata),
        Some(other) => {
            return crate::management::error(
                StatusCode::BAD_REQUEST,
                &format!("unknown target '{other}': wal or metadata"),
            )
        }
    };
    file.fail_sync.store(true, Ordering::Relaxed);
    tracing::warn!(file = which, "fault injection: the next fsync will fail");
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct On {
    on: bool,
}

async fn disk_full(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<On>,
) -> Response {
    let faults = match switches(&s, &headers) {
        Ok(faults) => faults,
        Err(r) => return r,
    };
    faults.wal.disk_full.store(q.on, Ordering::Relaxed);
    tracing::warn!(on = q.on, "fault injection: WAL writes fail with ENOSPC");
    StatusCode::NO_CONTENT.into_response()
}

/// The longest stall the switch takes: a benchmark's stall, not a node that never syncs again.
const STALL_MS_MAX: u64 = 60_000;

#[derive(Deserialize)]
struct Stalls {
    every_ms: u64,
    stall_ms: u64,
    #[serde(default)]
    sync_ms: u64,
}

async fn disk_stalls(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<Stalls>,
) -> Response {
    let faults = match switches(&s, &headers) {
        Ok(faults) => faults,
        Err(r) => return r,
    };
    if q.stall_ms.max(q.sync_ms) > STALL_MS_MAX {
        return crate::management::error(
            StatusCode::BAD_REQUEST,
            &format!("stall_ms and sync_ms are at most {STALL_MS_MAX}"),
        );
    }
    faults.wal.stall_ms.store(q.stall_ms, Ordering::Relaxed);
    faults.wal.stall_sync_ms.store(q.sync_ms, Ordering::Relaxed);
    faults
        .wal
        .stall_every_ms
        .store(q.every_ms, Ordering::Relaxed);
    tracing::warn!(
        every_ms = q.every_ms,
        stall_ms = q.stall_ms,
        sync_ms = q.sync_ms,
        "fault injection: WAL syncs stall"
    );
    StatusCode::NO_CONTENT.into_response()
}

async fn confirm_without_storing(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<On>,
) -> Response {
    let faults = match switches(&s, &headers) {
        Ok(faults) => faults,
        Err(r) => return r,
    };
    faults
        .confirm_without_storing
        .store(q.on, Ordering::Relaxed);
    tracing::warn!(
        on = q.on,
        "fault injection: forwarded publishes are confirmed without being stored"
    );
    StatusCode::NO_CONTENT.into_response()
}
