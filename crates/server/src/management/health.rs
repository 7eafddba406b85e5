//! RabbitMQ's health checks (`/api/health/checks/...`) and `/api/aliveness-test/{vhost}`:
//! 200 `{"status":"ok", ...}` when healthy, 503 `{"status":"failed","reason", ...}` when not,
//! so that load balancers and orchestrators written for RabbitMQ probe warren unchanged.
//! Besides 3.10's, 4.x's `is-in-service`, `below-node-connection-limit` and
//! `ready-to-serve-clients`, and warren's own `metadata-leader`.
//!
//! A cluster node with no metadata leader it can reach (the minority side of a partition, or
//! a cluster not formed yet) can change nothing: the checks that say whether the node serves
//! fail then, as every check of a paused-minority RabbitMQ node does ([`without_leader`]).

use super::session::{AckMode, Session};
use super::{auth, error, Api, Shared};
use amq_protocol_types::FieldTable;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Value};
use warren_cluster::address::HostPort;
use warren_protocol::amqp::{queue, AMQPClass};
use warren_protocol::content::Properties;

/// The queue `/api/aliveness-test` declares, publishes to and gets from, as RabbitMQ's does.
const ALIVENESS_QUEUE: &str = "aliveness-test";
const ALIVENESS_MESSAGE: &[u8] = b"test_message";

fn failed(reason: &str, extra: Value) -> Response {
    let mut body = json!({ "status": "failed", "reason": reason });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// RabbitMQ's health check body: 200 `{"status":"ok"}`, or 503 with every alarm in effect.
fn alarms_health(s: &Shared, failed_reason: &str) -> Response {
    let active = s.alarms.active();
    if active.is_empty() {
        return Json(json!({ "status": "ok" })).into_response();
    }
    let alarms: Vec<Value> = active
        .into_iter()
        .map(|(resource, reason)| json!({ "node": s.node_name(), "resource": resource, "reason": reason }))
        .collect();
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "status": "failed", "reason": failed_reason, "alarms": alarms })),
    )
        .into_response()
}

/// What a check that says whether the node serves answers while the node has no metadata
/// leader it can reach: 503 and why.
fn without_leader(s: &Shared) -> Option<Response> {
    let cluster = s.cluster.as_ref()?;
    if cluster.reachable_metadata_leader().is_some() {
        return None;
    }
    Some(failed(NO_LEADER_REASON, json!({})))
}

const NO_LEADER_REASON: &str = "this node has no metadata leader it can reach: it is cut off \
     from a majority of the cluster's nodes (or the cluster has not formed) and can change nothing";

/// Whether the node serves clients (RabbitMQ's `rabbit:is_serving()`): not in maintenance
/// mode, not stopping, and, in a cluster, with a metadata leader it can reach.
fn is_serving(s: &Shared) -> bool {
    !s.maintenance.is_draining()
        && !s.maintenance.is_stopping()
        && s.cluster
            .as_ref()
            .is_none_or(|c| c.reachable_metadata_leader().is_some())
}

const NOT_SERVING_REASON: &str = "this rabbit node is not currently available to serve";

/// `GET /api/health/checks/metadata-leader` (warren's; RabbitMQ has none): ok with the
/// leader's name while this node reaches one; a single node leads itself.
pub async fn metadata_leader(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    match &s.cluster {
        None => Json(json!({ "status": "ok", "leader": s.node_name() })).into_response(),
        Some(c) => match c.reachable_metadata_leader() {
            Some(leader) => Json(json!({ "status": "ok", "leader": leader })).into_response(),
            None => failed(NO_LEADER_REASON, json!({})),
        },
    }
}

/// RabbitMQ 4.x's `is-in-service`.
pub async fn is_in_service(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if is_serving(&s) {
        Json(json!({ "status": "ok" })).into_response()
    } else {
        failed(NOT_SERVING_REASON, json!({}))
    }
}

/// Whether the node's client sockets reached `--connection-max` (RabbitMQ's
/// `connection_max`): the failure, with the count.
fn at_connection_limit(s: &Shared) -> Option<Response> {
    let connections = s.client_sockets.load(std::sync::atomic::Ordering::Relaxed);
    let max = s.config.connection_max?;
    (connections as u64 >= max).then(|| {
        failed(
            "node connection limit is reached",
            json!({ "connections": connections }),
        )
    })
}

/// RabbitMQ 4.x's `below-node-connection-limit`: fails while the node holds
/// `--connection-max` client connections; passes without a limit (RabbitMQ's infinity).
pub async fn below_node_connection_limit(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if let Some(r) = without_leader(&s) {
        return r;
    }
    if let Some(r) = at_connection_limit(&s) {
        return r;
    }
    let connections = s.client_sockets.load(std::sync::atomic::Ordering::Relaxed);
    let limit = s
        .config
        .connection_max
        .map_or_else(|| json!("infinity"), |m| json!(m));
    Json(json!({ "status": "ok", "limit": limit, "connections": connections })).into_response()
}

/// RabbitMQ 4.x's `ready-to-serve-clients`: `is-in-service`, an AMQP or AMQPS listener,
/// and the connection limit, in one probe.
pub async fn ready_to_serve_clients(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if !is_serving(&s) {
        return failed(
            "the rabbit node is not currently available to serve",
            json!({}),
        );
    }
    if !listening(&s)
        .iter()
        .any(|(p, _)| *p == "amqp" || *p == "amqp/ssl")
    {
        return failed("no active listeners for AMQP/AMQPS", json!({}));
    }
    if let Some(r) = at_connection_limit(&s) {
        return r;
    }
    Json(json!({ "status": "ok" })).into_response()
}

/// `certificate-expiration/{within}/{unit}` (RabbitMQ 3.10): fails naming each TLS
/// listener whose certificate file or CA file holds a certificate that expires within that
/// time (days, weeks, months of 365/12 days, years), in RabbitMQ's fields. RabbitMQ 3.10 reads
/// the files from the listener's options, where an `ssl_options` listener has none, so it
/// passes there whatever the certificates; warren reads the files it serves.
pub async fn certificate_expiration(
    State(s): Api,
    headers: HeaderMap,
    Path((within, unit)): Path<(String, String)>,
) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    let Ok(within) = within.parse::<i64>() else {
        return error(StatusCode::BAD_REQUEST, "Invalid expiration value.");
    };
    let day_s = 86_400i64;
    let within_s = match unit.to_ascii_lowercase().as_str() {
        "days" => within.saturating_mul(day_s),
        "weeks" => within.saturating_mul(7 * day_s),
        "months" => within.saturating_mul(365 * day_s) / 12,
        "years" => within.saturating_mul(365 * day_s),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "Time unit not recognised. Supported units: days, weeks, months, years.",
            )
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let deadline = now.saturating_add(within_s);
    let t = &s.config.tls;
    let cluster_files = s.config.cluster_tls().ok().flatten();
    let listeners = [
        (
            "amqp/ssl",
            t.listen.map(HostPort::from),
            t.cert.clone(),
            t.ca.clone(),
        ),
        (
            "https",
            t.management_listen.map(HostPort::from),
            t.management_cert.clone().or(t.cert.clone()),
            t.ca.clone(),
        ),
        (
            "clustering",
            s.config.cluster_listen.clone(),
            cluster_files.as_ref().map(|f| f.cert.clone()),
            cluster_files.as_ref().map(|f| f.ca.clone()),
        ),
    ];
    let mut expiring = Vec::new();
    for (protocol, addr, cert, ca) in listeners {
        let (Some(addr), Some(cert)) = (addr, cert) else {
            continue;
        };
        let cert_expires = expiring_in(&cert, deadline);
        let ca_expires = ca
            .as_deref()
            .map(|ca| expiring_in(ca, deadline))
            .unwrap_or_default();
        if cert_expires.is_empty() && ca_expires.is_empty() {
            continue;
        }
        expiring.push(json!({
            "node": s.node_name(),
            "protocol": protocol,
            "interface": addr.host(),
            "port": addr.port(),
            "certfile": cert.display().to_string(),
            "cacertfile": ca.map(|c| c.display().to_string()),
            "certfile_expires_on": cert_expires,
            "cacertfile_expires_on": ca_expires,
        }));
    }
    if expiring.is_empty() {
        Json(json!({ "status": "ok" })).into_response()
    } else {
        failed("Certificates expiring", json!({ "expired": expiring }))
    }
}

/// When each certificate of a PEM file that expires before `deadline` (Unix seconds) does;
/// an unreadable file or certificate is named as such, as RabbitMQ reports it.
fn expiring_in(path: &std::path::Path, deadline: i64) -> Vec<String> {
    use rustls_pki_types::pem::PemObject;
    let certs = match rustls_pki_types::CertificateDer::pem_file_iter(path) {
        Ok(certs) => certs,
        Err(e) => return vec![format!("error: {}: {e}", path.display())],
    };
    let mut out = Vec::new();
    for cert in certs {
        match cert.map_err(|e| e.to_string()).and_then(|c| {
            crate::tls::certificate::CertificateInfo::parse(&c).map_err(|e| e.0.to_string())
        }) {
            Ok(info) if info.not_after_s < deadline => {
                out.push(crate::tls::certificate::utc_text(info.not_after_s))
            }
            Ok(_) => {}
            Err(e) => out.push(format!("error: {e}")),
        }
    }
    out
}

pub async fn alarms(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if let Some(r) = without_leader(&s) {
        return r;
    }
    alarms_health(&s, "There are alarms in effect in the cluster")
}

pub async fn local_alarms(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if let Some(r) = without_leader(&s) {
        return r;
    }
    alarms_health(&s, "There are alarms in effect on the node")
}

/// Every vhost runs as long as the node does: warren has no per-vhost process to fail.
pub async fn virtual_hosts(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if let Some(r) = without_leader(&s) {
        return r;
    }
    Json(json!({ "status": "ok" })).into_response()
}

/// The node's listeners as (protocol, port), RabbitMQ's protocol names.
fn listening(s: &Shared) -> Vec<(&'static str, u16)> {
    super::overview::listeners(s)
        .iter()
        .filter_map(|l| {
            let protocol = match l["protocol"].as_str()? {
                "amqp" => "amqp",
                "amqp/ssl" => "amqp/ssl",
                "http" => "http",
                "https" => "https",
                "clustering" => "clustering",
                _ => return None,
            };
            Some((protocol, l["port"].as_u64()? as u16))
        })
        .collect()
}

pub async fn port_listener(
    State(s): Api,
    headers: HeaderMap,
    Path(port): Path<String>,
) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if let Some(r) = without_leader(&s) {
        return r;
    }
    let Ok(port) = port.parse::<u16>() else {
        return error(StatusCode::BAD_REQUEST, "Invalid port");
    };
    let ports: Vec<u16> = listening(&s).into_iter().map(|(_, p)| p).collect();
    if ports.contains(&port) {
        Json(json!({ "status": "ok", "port": port })).into_response()
    } else {
        failed(
            "No active listener",
            json!({ "missing": port, "ports": ports }),
        )
    }
}

pub async fn protocol_listener(
    State(s): Api,
    headers: HeaderMap,
    Path(protocol): Path<String>,
) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    if let Some(r) = without_leader(&s) {
        return r;
    }
    // RabbitMQ's aliases for the same listeners.
    let wanted = match protocol.to_ascii_lowercase().as_str() {
        "amqp" | "amqp091" | "amqp0-9-1" | "amqp0.9.1" => "amqp",
        "amqps" | "amqp/ssl" | "amqp091/ssl" => "amqp/ssl",
        "http" | "management" => "http",
        "https" | "management/ssl" => "https",
        "clustering" => "clustering",
        _ => "",
    };
    let protocols: Vec<&str> = listening(&s).into_iter().map(|(p, _)| p).collect();
    if !wanted.is_empty() && protocols.contains(&wanted) {
        Json(json!({ "status": "ok", "protocol": wanted })).into_response()
    } else {
        failed(
            "No active listener",
            json!({ "missing": protocol, "protocols": protocols }),
        )
    }
}

/// Whether stopping this node would leave a Raft group without a majority of running members:
/// the cluster's metadata group, or a quorum queue this node is a member of (listed, as
/// `rabbitmq-queues check_if_node_is_quorum_critical` lists them).
pub async fn node_is_quorum_critical(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::caller(&s, &headers) {
        return r;
    }
    let Some(cluster) = &s.cluster else {
        return Json(json!({ "status": "ok", "reason": "single node cluster" })).into_response();
    };
    if s.maintenance.is_draining() {
        // Its leaderships are elsewhere already (rabbitmq-queues' "the check does not apply").
        return Json(json!({ "status": "ok", "reason": "node is in maintenance mode" }))
            .into_response();
    }
    let members = cluster.status().members;
    let voters = members.iter().filter(|m| m.voter).count();
    if voters <= 1 {
        return Json(json!({ "status": "ok", "reason": "single node cluster" })).into_response();
    }
    let me = s.node_name();
    let running = |name: &str| name != me && members.iter().any(|m| m.name == name && m.running);
    let mut critical = Vec::new();
    for (vhost, v) in s.broker.vhosts() {
        for (name, _, queue_members) in v.lock().expect("vhost lock").replicated_queues() {
            if !queue_members.iter().any(|m| **m == *me) {
                continue;
            }
            let others = queue_members.iter().filter(|m| running(m)).count();
            if others <= queue_members.len() / 2 {
                critical.push(json!({
                    "name": name,
                    "readable_name": format!("queue '{name}' in vhost '{vhost}'"),
                    "virtual_host": vhost,
                    "type": "quorum",
                }));
            }
        }
    }
    let others_running = members
        .iter()
        .filter(|m| m.voter && m.running && m.name != me)
        .count();
    if others_running <= voters / 2 {
        failed(
            "The cluster's metadata would lose its quorum if the target node is shut down",
            json!({ "queues": critical }),
        )
    } else if !critical.is_empty() {
        failed(
            "There are quorum queues that would lose their quorum if the target node is shut down",
            json!({ "queues": critical }),
        )
    } else {
        Json(json!({ "status": "ok" })).into_response()
    }
}

/// Declares `aliveness-test` in the vhost, publishes a message to it and gets it back, all
/// through the API's AMQP session, as RabbitMQ's check does.
pub async fn aliveness_test(
    State(s): Api,
    headers: HeaderMap,
    Path(vhost): Path<String>,
) -> Response {
    let caller = match auth::caller(&s, &headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = auth::vhost(&s, &caller, &vhost) {
        return r;
    }
    let Some(mut session) = Session::open(&s, &caller.user, &vhost) else {
        return error(StatusCode::UNAUTHORIZED, "Access refused.");
    };
    let declare = queue::Declare {
        queue: ALIVENESS_QUEUE.into(),
        passive: false,
        durable: false,
        exclusive: false,
        auto_delete: false,
        nowait: false,
        arguments: FieldTable::default(),
    };
    let checked = async {
        session
            .control(AMQPClass::Queue(queue::AMQPMethod::Declare(declare)))
            .await?;
        session
            .publish(
                "",
                ALIVENESS_QUEUE,
                &Properties::default(),
                Bytes::from_static(ALIVENESS_MESSAGE),
            )
            .await?;
        session.get(ALIVENESS_QUEUE, 1, AckMode::Ack).await
    }
    .await;
    match checked {
        Ok(got) if got.iter().any(|g| g.body.as_ref() == ALIVENESS_MESSAGE) => {
            Json(json!({ "status": "ok" })).into_response()
        }
        Ok(_) => failed("aliveness-test message was not received back", json!({})),
        Err(e) => failed(&e.text, json!({})),
    }
}
