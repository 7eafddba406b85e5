//! The cluster's Prometheus series for `/metrics`: each link's counters labelled by the peer's
//! node name (what an operator knows the nodes by, unlike Raft ids), the members, and the
//! metadata group's progress. Written here, beside the status they come from, so the server
//! only asks for them.

use crate::ClusterStatus;
use std::fmt::Write as _;

/// Appends the cluster's series to a Prometheus text exposition.
pub fn write_prometheus(status: &ClusterStatus, out: &mut String) {
    let name_of = |id: u64| {
        status
            .members
            .iter()
            .find(|m| m.id == id)
            .map_or_else(|| format!("node-{id}"), |m| m.name.clone())
    };
    type Field = fn(&crate::transport::LinkStats) -> f64;
    let series: [(&str, &str, Field); 7] = [
        ("link_up", "gauge", |l| f64::from(u8::from(l.up))),
        ("link_rtt_seconds", "gauge", |l| l.rtt_us as f64 / 1e6),
        ("link_sent_bytes_total", "counter", |l| l.bytes_out as f64),
        ("link_sent_batches_total", "counter", |l| {
            l.batches_out as f64
        }),
        ("link_received_bytes_total", "counter", |l| {
            l.bytes_in as f64
        }),
        ("link_received_frames_total", "counter", |l| {
            l.frames_in as f64
        }),
        ("link_dropped_messages_total", "counter", |l| {
            l.dropped as f64
        }),
    ];
    for (name, kind, field) in series {
        let _ = writeln!(out, "# TYPE warren_cluster_{name} {kind}");
        for l in &status.links {
            let _ = writeln!(
                out,
                "warren_cluster_{name}{{peer=\"{}\"}} {}",
                escape(&name_of(l.peer)),
                field(l)
            );
        }
    }
    let running = status.members.iter().filter(|m| m.running).count();
    let meta = &status.metadata;
    let gauges = [
        ("members", status.members.len() as u64),
        ("members_running", running as u64),
        ("metadata_is_leader", u64::from(meta.role == "leader")),
        ("metadata_term", meta.term),
        ("metadata_commit_index", meta.commit),
        ("metadata_applied_index", meta.applied),
    ];
    for (name, v) in gauges {
        let _ = writeln!(
            out,
            "# TYPE warren_cluster_{name} gauge\nwarren_cluster_{name} {v}"
        );
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::GroupStatus;
    use crate::transport::LinkStats;
    use crate::MemberStatus;

    fn member(id: u64, name: &str, running: bool) -> MemberStatus {
        MemberStatus {
            id,
            name: name.into(),
            cluster: String::new(),
            amqp: None,
            management: None,
            running,
            voter: true,
            draining: false,
        }
    }

    #[test]
    fn each_link_is_a_series_named_by_its_peer() {
        let link = |peer, rtt_us| LinkStats {
            peer,
            connected: true,
            up: peer == 2,
            rtt_us,
            bytes_out: 1000,
            batches_out: 10,
            bytes_in: 2000,
            frames_in: 20,
            dropped: 3,
            dials_failed: 0,
            raft_link: true,
        };
        let status = ClusterStatus {
            node: "n1".into(),
            id: 1,
            metadata: GroupStatus {
                role: "leader".into(),
                term: 4,
                commit: 17,
                applied: 16,
                ..Default::default()
            },
            members: vec![
                member(1, "n1", true),
                member(2, "n2", true),
                member(3, "n\"3", false),
            ],
            links: vec![link(2, 250), link(3, 0)],
        };
        let mut out = String::new();
        write_prometheus(&status, &mut out);
        for line in [
            "warren_cluster_link_rtt_seconds{peer=\"n2\"} 0.00025",
            "warren_cluster_link_up{peer=\"n2\"} 1",
            "warren_cluster_link_up{peer=\"n\\\"3\"} 0",
            "warren_cluster_link_sent_bytes_total{peer=\"n2\"} 1000",
            "warren_cluster_link_received_frames_total{peer=\"n2\"} 20",
            "warren_cluster_link_dropped_messages_total{peer=\"n\\\"3\"} 3",
            "warren_cluster_members_running 2",
            "warren_cluster_metadata_is_leader 1",
            "warren_cluster_metadata_commit_index 17",
            "warren_cluster_metadata_applied_index 16",
        ] {
            assert!(
                out.lines().any(|l| l == line),
                "{line} missing from:\n{out}"
            );
        }
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("# TYPE warren_cluster_link_rtt_seconds"))
                .count(),
            1
        );
    }
}
