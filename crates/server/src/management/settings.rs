//! Node settings changed at run time, as rabbitmqctl's commands do over HTTP: the memory high
//! watermark, the disk free limit, and reloading the TLS certificates.

use super::{authorize, error, Api, Body};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::atomic::Ordering;

#[derive(Deserialize)]
pub struct WatermarkBody {
    fraction: Option<f64>,
    bytes: Option<u64>,
}

/// rabbitmqctl set_vm_memory_high_watermark, over HTTP: a fraction of RAM or absolute bytes.
pub async fn put_watermark(
    State(s): Api,
    headers: HeaderMap,
    Body(body): Body<WatermarkBody>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let bytes = match (body.fraction, body.bytes) {
        (_, Some(b)) => b,
        (Some(f), None) if (0.0..=1.0).contains(&f) => {
            (crate::node::memory::total_memory_bytes() as f64 * f) as u64
        }
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give \"fraction\" (0..1) or \"bytes\"",
            )
        }
    };
    s.alarms
        .memory_watermark_bytes
        .store(bytes, Ordering::Relaxed);
    s.alarms.evaluate();
    tracing::info!(bytes, "memory high watermark set");
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
pub struct DiskFreeLimitBody {
    bytes: u64,
}

/// rabbitmqctl set_disk_free_limit, over HTTP.
pub async fn put_disk_free_limit(
    State(s): Api,
    headers: HeaderMap,
    Body(body): Body<DiskFreeLimitBody>,
) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    s.alarms
        .disk_free_limit_bytes
        .store(body.bytes, Ordering::Relaxed);
    s.alarms.evaluate();
    tracing::info!(bytes = body.bytes, "disk free limit set");
    StatusCode::NO_CONTENT.into_response()
}

/// Reads the TLS certificate, key and CA files again, the listeners' and the cluster links'
/// (`warren ctl reload_certificates`, as SIGHUP does): 204 once new connections get them, 400
/// naming the bad file (the old ones stay), 404 when the node has no TLS at all.
pub async fn reload_certificates(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = authorize(&s, &headers) {
        return r;
    }
    let cluster_tls = s.cluster.as_ref().and_then(|c| c.link_tls());
    if s.tls.is_none() && cluster_tls.is_none() {
        return error(StatusCode::NOT_FOUND, "TLS is not configured on this node");
    }
    let mut faults = Vec::new();
    if let Some(tls) = &s.tls {
        if let Err(e) = tls.reload() {
            faults.push(e.to_string());
        }
    }
    if let Some(tls) = cluster_tls {
        if let Err(e) = tls.reload() {
            faults.push(format!("cluster links: {e}"));
        }
    }
    match faults.is_empty() {
        true => StatusCode::NO_CONTENT.into_response(),
        false => error(StatusCode::BAD_REQUEST, &faults.join("; ")),
    }
}
