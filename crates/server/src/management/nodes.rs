//! `/api/nodes` and `/api/nodes/{name}`: every node of the cluster with its own figures
//! (memory, disk, alarms, uptime, descriptors, listeners, churn), in RabbitMQ's field names,
//! whichever node is asked, as RabbitMQ's management plugin asks each node of its cluster.
//!
//! This node's figures are read here; each other running node is asked for its own over the
//! cluster links ([`Request::Node`]), all at once and for at most [`NODE_ASK_TIMEOUT`], so a
//! listing waits for the slowest node, never for one being cut off. A node that is down or
//! does not answer in time is listed with `running: false` and what the cluster knows of it
//! (its addresses), as RabbitMQ lists a stopped node with its name and `running: false`.

use super::overview::{exchange_types, listeners, RABBITMQ_VERSION};
use super::{auth, not_found, Api, Shared};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;
use warren_cluster::messaging::{Request, Response as PeerResponse};

/// How long a listing waits for another node's figures: the UI refreshes every few seconds.
pub const NODE_ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// This node in the fields of RabbitMQ's `/api/nodes`.
pub fn node_json(s: &Shared) -> Value {
    let alarms = s.alarms.state();
    let process = ProcessFigures::read();
    let churn = &s.broker.queue_churn;
    let counters = &s.counters;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let runtime = tokio::runtime::Handle::try_current()
        .ok()
        .map(|h| h.metrics());
    json!({
        "name": s.node_name(),
        "type": "disc",
        "running": true,
        "uptime": process.uptime_ms,
        "mem_used": crate::node::memory::rss_bytes(),
        "mem_limit": s.alarms.memory_watermark_bytes.load(Ordering::Relaxed),
        "mem_alarm": alarms.memory,
        "mem_calculation_strategy": "rss",
        "disk_free": s.alarms.disk_free_bytes(),
        "disk_free_limit": s.alarms.disk_free_limit_bytes.load(Ordering::Relaxed),
        "disk_free_alarm": alarms.disk,
        "storage_failed": alarms.storage,
        "storage_failure": s.alarms.storage_failure(),
        "being_drained": s.maintenance.is_draining(),
        "fd_used": process.fds,
        "fd_total": super::metrics::max_fds(),
        "sockets_used": process.sockets,
        // Any descriptor may be a socket: RabbitMQ keeps a share back for files, warren does not.
        "sockets_total": super::metrics::max_fds(),
        // The runtime's tasks stand for Erlang's processes, its injection queue for the
        // schedulers' run queue; warren sets no limit on tasks, so there is no `proc_total`.
        "proc_used": runtime.as_ref().map_or(0, |m| m.num_alive_tasks()),
        "run_queue": runtime.as_ref().map_or(0, |m| m.global_queue_depth()),
        "processors": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "os_pid": std::process::id().to_string(),
        // A node cut off from its cluster sees the others as not running (and refuses changes
        // in a minority); it keeps no separate record of partitions.
        "partitions": [],
        "rates_mode": "basic",
        "rabbitmq_version": RABBITMQ_VERSION,
        "exchange_types": exchange_types(),
        "listeners": listeners(s),
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_prometheus"],
        "applications": [],
        "queue_declared": load(&churn.declared),
        "queue_created": load(&churn.created),
        "queue_deleted": load(&churn.deleted),
        "connection_created": load(&counters.connections_opened),
        "connection_closed": load(&counters.connections_closed),
        "channel_created": load(&counters.channels_opened),
        "channel_closed": load(&counters.channels_closed),
    })
}

/// The process's figures from /proc (Linux); zero where they cannot be read.
#[derive(Debug, Default)]
struct ProcessFigures {
    uptime_ms: u64,
    fds: u64,
    sockets: u64,
}

impl ProcessFigures {
    fn read() -> ProcessFigures {
        let mut out = ProcessFigures {
            uptime_ms: process_uptime_ms().unwrap_or(0),
            ..Default::default()
        };
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            for entry in dir.flatten() {
                out.fds += 1;
                let is_socket = std::fs::read_link(entry.path())
                    .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
                out.sockets += is_socket as u64;
            }
        }
        out
    }
}

/// How long this process has run: the system's uptime less the process's start time (field
/// 22 of /proc/self/stat, in clock ticks since boot), as Erlang's uptime is the VM's.
fn process_uptime_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let start_ticks: u64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_s <= 0 {
        return None;
    }
    let system_uptime_s: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let started_s = start_ticks as f64 / ticks_per_s as f64;
    Some(((system_uptime_s - started_s).max(0.0) * 1000.0) as u64)
}

/// The cluster protocol that brought the `node` request.
const NODE_REQUEST_PROTOCOL: u32 = 2;

/// Every node of the cluster (this one alone outside a cluster), in the members' order.
pub async fn all_nodes(s: &Shared) -> Vec<Value> {
    let me = node_json(s);
    let Some(cluster) = &s.cluster else {
        return vec![me];
    };
    let members = cluster.status().members;
    let asks = members.iter().map(|m| {
        let messaging = cluster.messaging().clone();
        // A node of an older build (a rolling upgrade) would drop the link on a request it
        // does not know: it is listed with what the member table says.
        let ask = (m.name != s.node_name()
            && m.running
            && cluster.member_protocol(&m.name) >= NODE_REQUEST_PROTOCOL)
            .then_some(m.id);
        async move {
            let peer = ask?;
            match tokio::time::timeout(
                NODE_ASK_TIMEOUT,
                crate::peers::call(&messaging, peer, Request::Node),
            )
            .await
            {
                Ok(Ok(PeerResponse::Node { node })) => Some(node),
                _ => None,
            }
        }
    });
    let answers = crate::queue_stats::futures_join(asks).await;
    let mut out = Vec::with_capacity(members.len());
    for (m, answer) in members.iter().zip(answers) {
        let mut node = if m.name == s.node_name() {
            me.clone()
        } else {
            answer.unwrap_or_else(|| {
                // Down, or of an older build not asked: what the member table knows.
                json!({
                    "name": m.name,
                    "type": "disc",
                    "running": m.running,
                })
            })
        };
        // As the replicated member table has it: the node's own answer may be older.
        node["being_drained"] = json!(if m.name == s.node_name() {
            s.maintenance.is_draining()
        } else {
            m.draining
        });
        node["cluster_address"] = json!(m.cluster);
        node["amqp_address"] = json!(m.amqp);
        node["management_address"] = json!(m.management);
        out.push(node);
    }
    out
}

/// `GET /api/nodes`.
pub async fn list(State(s): Api, headers: HeaderMap) -> Response {
    if let Err(r) = auth::monitor(&s, &headers) {
        return r;
    }
    Json(Value::Array(all_nodes(&s).await)).into_response()
}

/// `GET /api/nodes/{name}`: 404 for a name that is no member.
pub async fn get_one(State(s): Api, headers: HeaderMap, Path(name): Path<String>) -> Response {
    if let Err(r) = auth::monitor(&s, &headers) {
        return r;
    }
    match all_nodes(&s).await.into_iter().find(|n| n["name"] == name) {
        Some(node) => Json(node).into_response(),
        None => not_found(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_has_run_for_less_than_the_system() {
        let uptime_ms = process_uptime_ms().expect("/proc is readable");
        let system_s: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(uptime_ms as f64 <= system_s * 1000.0 + 1.0);
    }

    #[test]
    fn an_open_socket_is_counted_among_the_descriptors() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let figures = ProcessFigures::read();
        assert!(figures.sockets >= 1, "{figures:?}");
        assert!(figures.fds >= figures.sockets + 3, "stdio too: {figures:?}");
        drop(listener);
    }
}
