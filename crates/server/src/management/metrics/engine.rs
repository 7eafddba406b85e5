//! warren's own `warren_*` families of `/metrics`, beside RabbitMQ's: the engine's
//! publishes and confirms, logins, connections, alarms, memory, TLS and the storage engine's
//! counters, for what RabbitMQ's names have no series for.

use super::{counter, family, gauge, Node};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use std::fmt;

impl Node {
    /// warren's own: the engine, memory, TLS and logins.
    pub(super) fn encode_warren(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let r = &self.readings;
        counter(
            enc,
            "warren_messages_published",
            "Messages published",
            r.published,
        )?;
        counter(
            enc,
            "warren_messages_confirmed",
            "Publishes confirmed",
            r.confirmed,
        )?;
        counter(
            enc,
            "warren_messages_unroutable",
            "Publishes no queue took",
            r.unroutable,
        )?;
        counter(
            enc,
            "warren_auth_attempts_failed",
            "Logins refused",
            r.auth_failures,
        )?;
        counter(
            enc,
            "warren_handshake_timeouts",
            "Connections closed for outlasting handshake_timeout",
            r.handshake_timeouts,
        )?;
        gauge(
            enc,
            "warren_connections",
            "AMQP connections open",
            r.connections,
        )?;
        gauge(
            enc,
            "warren_connections_flow",
            "AMQP connections held back by publisher flow control (now or within the last second)",
            r.connections_flow,
        )?;
        for (name, on) in r.alarms {
            let metric = format!("warren_alarms_{name}");
            gauge(
                enc,
                &metric,
                "1 while the alarm is in effect",
                u64::from(on),
            )?;
        }
        gauge(
            enc,
            "warren_process_resident_memory_bytes",
            "Resident memory",
            r.rss_bytes,
        )?;
        if let Some((used, limit)) = r.message_memory {
            gauge(
                enc,
                "warren_message_memory_bytes",
                "Message bodies held in memory",
                used,
            )?;
            gauge(
                enc,
                "warren_message_memory_limit_bytes",
                "The budget for message bodies in memory",
                limit,
            )?;
        }
        if let Some(tls) = &r.tls {
            let failures = tls
                .failures
                .iter()
                .map(|(reason, n)| ([("reason", *reason)], *n));
            family(
                enc,
                "warren_tls_handshake_failures",
                "TLS handshakes refused, by reason",
                MetricType::Counter,
                failures,
            )?;
            counter(
                enc,
                "warren_tls_certificate_reloads",
                "Certificate reloads",
                tls.reloads,
            )?;
            counter(
                enc,
                "warren_tls_certificate_reload_failures",
                "Certificate reloads that failed",
                tls.reload_failures,
            )?;
        }
        if let Some(st) = &r.store {
            encode_store(enc, st)?;
        }
        Ok(())
    }
}

/// The storage engine's counters since the process started: how hard the WAL works (syncs per
/// append tell how well group commit batches), what reaches the disk (bytes written per payload
/// byte is the write amplification), and what happens to rolled WAL files.
fn encode_store(enc: &mut DescriptorEncoder, st: &warren_store::Stats) -> fmt::Result {
    let counters = [
        ("wal_appends", st.appends),
        ("wal_syncs", st.wal_syncs),
        ("wal_written_bytes", st.wal_bytes),
        ("segment_written_bytes", st.segment_bytes),
        ("sidecar_written_bytes", st.adopted_index_bytes),
        ("checkpoint_written_bytes", st.checkpoint_bytes),
        ("wal_files_copied", st.wal_files_flushed),
        ("wal_files_adopted", st.wal_files_adopted),
        ("wal_files_recycled", st.wal_files_recycled),
        ("adopted_files_deleted", st.adopted_files_deleted),
        ("adopted_files_compacted", st.adopted_files_compacted),
        ("segments_deleted", st.segments_deleted),
        ("segments_compacted", st.segments_compacted),
    ];
    for (name, v) in counters {
        counter(
            enc,
            &format!("warren_store_{name}"),
            "Storage engine counter",
            v,
        )?;
    }
    for (name, v) in [
        ("cache_bytes", st.cache_bytes),
        ("pending_records", st.pending_records),
    ] {
        gauge(
            enc,
            &format!("warren_store_{name}"),
            "Storage engine gauge",
            v,
        )?;
    }
    Ok(())
}
