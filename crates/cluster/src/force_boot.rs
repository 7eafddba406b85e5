//! `warren ctl force_boot`: a node whose cluster lost its majority for good (the other members
//! will never come back) makes itself the metadata group's only voter at its next start, as
//! `rabbitmqctl force_boot` lets a node boot without the peers it waits for.
//!
//! The command, run against the stopped node's data, leaves a [`MARKER`] file in its cluster
//! directory. At start, once the node has replayed its own log and has waited two election
//! timeouts without finding a leader, it drops every other voter from its in-memory
//! configuration (no majority could commit that change), stands alone and wins. As leader it
//! then removes the old voters once more through the log, one `RemoveNode` at a time: a later
//! replay of the log reaches the same configuration without the marker, and the removed ids are
//! remembered as forgotten, so those nodes are refused if they ever come back with their data
//! (they must be reset). The marker is deleted once the node is the only voter, and a snapshot
//! is taken so the next start begins from that configuration.
//!
//! If a leader shows up meanwhile (a majority came back after all), forcing would split the
//! cluster in two: the marker is deleted and nothing is forced.

use crate::metadata::MetadataGroup;
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2};
use raft::StateRole;
use std::path::{Path, PathBuf};

/// The file `warren ctl force_boot` leaves in the node's cluster directory.
pub const MARKER: &str = "force_boot";

/// Writes the marker into `cluster_dir`, a stopped node's cluster directory (`META/cluster`).
pub fn request(cluster_dir: &Path) -> Result<(), String> {
    if !cluster_dir.join("node.json").is_file() {
        return Err(format!(
            "{} holds no cluster node's identity (node.json): give the stopped node's \
             --data-dir (or its --meta-dir if it has one)",
            cluster_dir.display()
        ));
    }
    let path = cluster_dir.join(MARKER);
    std::fs::write(
        &path,
        b"this node makes itself the only voter of the cluster at its next start\n",
    )
    .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Where a forced boot stands while the node runs.
pub(crate) struct ForceBoot {
    marker: PathBuf,
    /// Ticks since the log was replayed, waiting for a leader before forcing.
    waited: usize,
    forced: bool,
    /// The voters dropped from the configuration in memory, to remove through the log.
    dropped: Vec<u64>,
}

impl ForceBoot {
    /// The forced boot asked for in `cluster_dir`, if any.
    pub fn asked(cluster_dir: &Path) -> Option<ForceBoot> {
        let marker = cluster_dir.join(MARKER);
        marker.is_file().then_some(ForceBoot {
            marker,
            waited: 0,
            forced: false,
            dropped: Vec::new(),
        })
    }

    fn finish(&self) {
        if let Err(e) = std::fs::remove_file(&self.marker) {
            tracing::error!(
                marker = %self.marker.display(),
                error = %e,
                "cannot delete the force_boot marker: delete it by hand, or the next start \
                 forces again"
            );
        }
    }
}

impl MetadataGroup {
    /// Carries a forced boot on, each tick (see the module's doc).
    pub(crate) fn force_boot_step(&mut self, replayed: bool) {
        let Some(mut boot) = self.force_boot.take() else {
            return;
        };
        if !replayed {
            self.force_boot = Some(boot);
            return;
        }
        let me = self.me.id;
        let others: Vec<u64> = self.voter_ids().into_iter().filter(|v| *v != me).collect();
        if !boot.forced {
            if self.raw.raft.leader_id != raft::INVALID_ID {
                tracing::warn!(
                    leader = self.raw.raft.leader_id,
                    "force_boot not needed: the cluster has a leader (a majority is back); \
                     nothing was forced"
                );
                boot.finish();
                return;
            }
            boot.waited += 1;
            if boot.waited < 2 * self.timing.election_ticks {
                self.force_boot = Some(boot);
                return;
            }
            let names: Vec<String> = others.iter().map(|id| self.member_label(*id)).collect();
            tracing::warn!(
                removed = ?names,
                "FORCE BOOT: no leader and force_boot asked: this node makes itself the only \
                 voter of the cluster's metadata. The removed nodes must not come back with \
                 their data: reset them (delete their data directories) and join them again"
            );
            for id in &others {
                let change = ConfChangeV2 {
                    changes: vec![ConfChangeSingle {
                        change_type: ConfChangeType::RemoveNode,
                        node_id: *id,
                        ..Default::default()
                    }]
                    .into(),
                    ..Default::default()
                };
                if let Err(e) = self.raw.raft.apply_conf_change(&change) {
                    tracing::error!(id, error = %e, "force_boot could not drop a voter");
                }
            }
            let _ = self.raw.campaign();
            boot.forced = true;
            boot.dropped = others;
            self.force_boot = Some(boot);
            return;
        }
        if self.raw.raft.state != StateRole::Leader || self.raw.raft.has_pending_conf() {
            self.force_boot = Some(boot);
            return;
        }
        // Removed in memory only so far: now through the log, so replay agrees.
        let in_log = boot
            .dropped
            .iter()
            .find(|id| !self.membership.forgotten.contains(id));
        match in_log.copied() {
            Some(id) => {
                tracing::warn!(
                    id,
                    name = %self.member_label(id),
                    "force_boot: removing a lost member through the log"
                );
                self.propose_removal(id);
                self.force_boot = Some(boot);
            }
            None => {
                tracing::warn!(
                    "FORCE BOOT done: this node is the cluster's only voter; add nodes again \
                     with warren ctl join_cluster (removed ones after a reset)"
                );
                self.membership.snapshot_due = true;
                boot.finish();
            }
        }
    }

    fn member_label(&self, id: u64) -> String {
        self.members
            .get(&id)
            .map_or_else(|| format!("id {id}"), |m| m.name.clone())
    }
}
