//! Prometheus metrics at `/metrics`: connections, message counters, alarms, queues, the
//! storage engine and the cluster.

use super::Api;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

/// Prometheus text exposition; unauthenticated, like RabbitMQ's prometheus plugin.
pub async fn metrics(State(s): Api) -> Response {
    let mut out = String::new();
    let c = &s.counters;
    let _ = writeln!(
        out,
        "# TYPE warren_connections gauge\nwarren_connections {}",
        s.connections_open.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_messages_published_total counter\nwarren_messages_published_total {}",
        c.published.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_messages_confirmed_total counter\nwarren_messages_confirmed_total {}",
        c.confirmed.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_messages_unroutable_total counter\nwarren_messages_unroutable_total {}",
        c.unroutable.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# TYPE warren_auth_attempts_failed_total counter\nwarren_auth_attempts_failed_total {}\n# TYPE warren_handshake_timeouts_total counter\nwarren_handshake_timeouts_total {}",
        c.auth_failures.load(Ordering::Relaxed),
        c.handshake_timeouts.load(Ordering::Relaxed)
    );
    if let Some(tls) = &s.tls {
        tls.write_metrics(&mut out);
    }
    // RabbitMQ's prometheus plugin names for its alarms, plus ours: 1 while in effect.
    let alarms = s.alarms.state();
    for (name, on) in [
        ("memory_used_watermark", alarms.memory),
        ("free_disk_space_watermark", alarms.disk),
        ("storage_failure", alarms.storage),
    ] {
        let _ = writeln!(
            out,
            "# TYPE warren_alarms_{name} gauge\nwarren_alarms_{name} {}",
            u8::from(on)
        );
    }
    let _ = writeln!(out, "# TYPE warren_process_resident_memory_bytes gauge\nwarren_process_resident_memory_bytes {}", crate::memory::rss_bytes());
    let _ = writeln!(out, "# TYPE warren_queue_messages_ready gauge");
    let mut unacked = String::from("# TYPE warren_queue_messages_unacked gauge\n");
    let mut consumers = String::from("# TYPE warren_queue_consumers gauge\n");
    let mut paged = String::from("# TYPE warren_queue_messages_paged_out gauge\n");
    for (vhost, v) in s.broker.vhosts() {
        for q in v.lock().expect("vhost lock").queue_infos() {
            let labels = format!("vhost=\"{}\",queue=\"{}\"", escape(&vhost), escape(&q.name));
            let _ = writeln!(
                out,
                "warren_queue_messages_ready{{{labels}}} {}",
                q.messages_ready
            );
            let _ = writeln!(
                unacked,
                "warren_queue_messages_unacked{{{labels}}} {}",
                q.messages_unacknowledged
            );
            let _ = writeln!(
                consumers,
                "warren_queue_consumers{{{labels}}} {}",
                q.consumers
            );
            let _ = writeln!(
                paged,
                "warren_queue_messages_paged_out{{{labels}}} {}",
                q.messages_paged_out
            );
        }
    }
    out.push_str(&unacked);
    out.push_str(&consumers);
    out.push_str(&paged);
    if let Some(budget) = s.broker.memory_budget() {
        let _ = writeln!(
            out,
            "# TYPE warren_message_memory_bytes gauge\nwarren_message_memory_bytes {}\n# TYPE warren_message_memory_limit_bytes gauge\nwarren_message_memory_limit_bytes {}",
            budget.used(),
            budget.limit()
        );
    }
    if let Some(store) = &s.store {
        write_store_metrics(&mut out, &store.stats());
    }
    if let Some(cluster) = &s.cluster {
        warren_cluster::metrics::write_prometheus(&cluster.status(), &mut out);
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

/// The storage engine's counters since the process started: how hard the WAL works (syncs per
/// append tell how well group commit batches), what reaches the disk (bytes written per payload
/// byte is the write amplification), and what happens to rolled WAL files.
fn write_store_metrics(out: &mut String, st: &warren_store::Stats) {
    let counters = [
        ("wal_appends_total", st.appends),
        ("wal_syncs_total", st.wal_syncs),
        ("wal_written_bytes_total", st.wal_bytes),
        ("segment_written_bytes_total", st.segment_bytes),
        ("sidecar_written_bytes_total", st.adopted_index_bytes),
        ("checkpoint_written_bytes_total", st.checkpoint_bytes),
        ("wal_files_copied_total", st.wal_files_flushed),
        ("wal_files_adopted_total", st.wal_files_adopted),
        ("adopted_files_deleted_total", st.adopted_files_deleted),
        ("adopted_files_compacted_total", st.adopted_files_compacted),
        ("segments_deleted_total", st.segments_deleted),
        ("segments_compacted_total", st.segments_compacted),
    ];
    for (name, v) in counters {
        let _ = writeln!(
            out,
            "# TYPE warren_store_{name} counter\nwarren_store_{name} {v}"
        );
    }
    for (name, v) in [
        ("cache_bytes", st.cache_bytes),
        ("pending_records", st.pending_records),
    ] {
        let _ = writeln!(
            out,
            "# TYPE warren_store_{name} gauge\nwarren_store_{name} {v}"
        );
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
