//! Applying a group's committed entries to its [`Machine`](super::Machine), without waiting
//! for this node's own disk.
//!
//! raft-rs hands out (in a ready) only entries this member has persisted itself: `applied <=
//! min(committed, persisted)`. But an entry is committed only once a majority has it durably,
//! so this node's own fsync adds nothing to its safety, only to its latency: a leader whose
//! disk stalls would hold its queues' confirms and deliveries for the stall, though both
//! followers have the entries. So a member applies an entry as soon as it knows it committed
//! (etcd raft's `applyUnstableEntries`, TiKV's "apply raft log before persistence"), reading
//! the entries raft-rs has not written yet from raft-rs's own log, where they wait in memory.
//! `Group::applied` is the machine's cursor; raft-rs later hands out the same entries, once
//! written here, and those already applied are skipped.
//!
//! Committed entries never change, whoever leads later, so nothing applied early is undone. A
//! member killed before its write lost only what a majority has: it applies it again from its
//! last snapshot at restart, as it would have anyway. Three things still wait for this disk:
//! - raft-rs's own applied index ([`advance_apply`]), which must not pass what it persisted
//!   and handed out;
//! - membership changes, which raft-rs applies itself (`apply_conf_change`): the early
//!   cursor stops before one;
//! - snapshots, which must cover only entries this node's log keeps through a crash: one is
//!   taken only at an index raft-rs counts applied, and a group whose snapshot is due applies
//!   no further ahead until raft-rs has caught up ([`snapshot_wanted`]).

use super::Group;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, Entry, EntryType};
use raft::GetEntriesContext;
use std::time::Instant;

/// Applies the committed entries raft-rs handed out in a ready, skipping those applied early.
pub(super) fn apply_handed_out(g: &mut Group, entries: Vec<Entry>) {
    if let Some(last) = entries.last() {
        g.handed_out = g.handed_out.max(last.index);
    }
    let fresh: Vec<Entry> = entries
        .into_iter()
        .skip_while(|e| e.index <= g.applied)
        .collect();
    apply(g, fresh);
}

/// Applies the entries known committed that raft-rs does not hand out yet because this node
/// has not persisted them. Only the tail raft-rs holds back: what it can hand out it will, so
/// a restarted member's backlog is never read here in one piece.
pub(super) fn apply_ahead(g: &mut Group, snapshot_every: u64) {
    let log = &g.raw.raft.raft_log;
    let committed = log.committed;
    if committed <= g.applied
        || g.applied < log.committed.min(log.persisted)
        || snapshot_wanted(g, snapshot_every)
    {
        return;
    }
    let Ok(mut entries) = log.slice(
        g.applied + 1,
        committed + 1,
        None,
        GetEntriesContext::empty(false),
    ) else {
        // Not in memory (a snapshot arriving): raft-rs's own path applies what there is.
        return;
    };
    let normal = entries
        .iter()
        .take_while(|e| e.get_entry_type() == EntryType::EntryNormal)
        .count();
    entries.truncate(normal);
    apply(g, entries);
}

/// Whether a snapshot is due, or will be as soon as raft-rs counts the machine's index
/// applied: until it is taken, the group's entries are applied at raft-rs's pace (a leader
/// applying ahead of its disk under load would otherwise never have its applied index
/// persisted at a ready, and its log would never be released).
pub(super) fn snapshot_wanted(g: &Group, every: u64) -> bool {
    g.snapshot_due || (!g.snapshot_writing && g.applied >= g.snapshot_index + every)
}

/// Whether a snapshot may be taken at the machine's applied index: raft-rs counts it applied,
/// so it is persisted here and handed out.
pub(super) fn snapshot_may_cover(g: &Group) -> bool {
    g.applied <= g.raw.raft.raft_log.applied
}

fn apply(g: &mut Group, entries: Vec<Entry>) {
    let Some(last) = entries.last().map(|e| e.index) else {
        return;
    };
    for mut entry in entries {
        g.applied = entry.index;
        if entry.data.is_empty() {
            continue;
        }
        match entry.get_entry_type() {
            EntryType::EntryNormal => g.machine.apply(entry.index, entry.take_data()),
            EntryType::EntryConfChange => {
                let applied = ConfChange::parse_from_bytes(&entry.data)
                    .map_err(|e| e.to_string())
                    .and_then(|cc| g.raw.apply_conf_change(&cc).map_err(|e| e.to_string()));
                match applied {
                    Ok(cs) => {
                        g.voters = cs.voters;
                        g.voters.sort_unstable();
                        // A member added is sent the latest snapshot: it must name it.
                        g.snapshot_due = true;
                    }
                    Err(e) => {
                        tracing::error!(index = entry.index, error = %e, "a queue group's membership change could not be applied")
                    }
                }
            }
            // Never proposed: changes go one node at a time.
            EntryType::EntryConfChangeV2 => {}
        }
    }
    g.commit_timer.applied(last, Instant::now());
}

/// Tells raft-rs what the machine applied, as far as it allows: no further than it handed out
/// (and so persisted), and an installed snapshot only once it is durable.
pub(super) fn advance_apply(g: &mut Group) {
    let log = &g.raw.raft.raft_log;
    let applied = g
        .applied
        .min(g.handed_out)
        .min(log.persisted)
        .min(log.committed);
    if applied > log.applied {
        g.raw.advance_apply_to(applied);
    }
}
