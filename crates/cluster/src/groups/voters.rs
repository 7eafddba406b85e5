//! A group's voters follow its queue's members ([`super::Input::SetVoters`]): the leader
//! changes them one node at a time, as RabbitMQ's add_member and delete_member do.

use super::Group;
use crate::raft_log::RaftLog;
use raft::eraftpb::{ConfChange, ConfChangeType};
use raft::{RawNode, StateRole};

pub(super) fn current_voters(raw: &RawNode<RaftLog>) -> Vec<u64> {
    let mut v: Vec<u64> = raw.raft.prs().conf().voters().ids().iter().collect();
    v.sort_unstable();
    v
}

/// On the leader: moves the group's voters one node towards those wanted (RabbitMQ's
/// add_member and delete_member are one node each too). A leader to be removed hands its
/// leadership to another voter first, rather than remove itself.
pub(super) fn change_voters(g: &mut Group) {
    let raft = &g.raw.raft;
    if raft.state != StateRole::Leader || raft.has_pending_conf() || g.wanted.is_empty() {
        return;
    }
    let current = current_voters(&g.raw);
    let (change_type, node) = if let Some(&add) = g.wanted.iter().find(|n| !current.contains(n)) {
        (ConfChangeType::AddNode, add)
    } else if let Some(&remove) = current.iter().find(|n| !g.wanted.contains(n)) {
        if remove == raft.id {
            if let Some(&to) = current.iter().find(|n| g.wanted.contains(n)) {
                g.raw.transfer_leader(to);
            }
            return;
        }
        (ConfChangeType::RemoveNode, remove)
    } else {
        return;
    };
    let cc = ConfChange {
        change_type,
        node_id: node,
        ..Default::default()
    };
    if let Err(e) = g.raw.propose_conf_change(vec![], cc) {
        tracing::warn!(node, error = %e, "a queue group's membership change was not proposed");
    }
}
