//! A node in maintenance mode (`warren ctl drain`) leads no quorum queue: each group it leads,
//! or comes to lead (it may still win an election, as the only member up or the first to
//! stand), hands the leadership to another member, as RabbitMQ's drain transfers quorum
//! queue leaderships away and keeps the node out of new ones.

use super::{Group, IsUp};
use raft::StateRole;
use std::collections::BTreeSet;

/// When this member leads `g` and no transfer is under way, asks raft-rs to hand the
/// leadership to a voter that is up, outside `draining` if one is, with the most of the log
/// (it catches up first, then stands at once: clients see a handover, not an election
/// timeout). Nothing when no other voter is up: a leader on a drained node beats no leader.
pub(super) fn hand_off(g: &mut Group, me: u64, is_up: &IsUp, draining: &BTreeSet<u64>) -> bool {
    let raft = &g.raw.raft;
    if raft.state != StateRole::Leader || raft.lead_transferee.is_some() {
        return false;
    }
    let to = g
        .voters
        .iter()
        .copied()
        .filter(|v| *v != me && is_up(*v))
        .max_by_key(|v| {
            let serving = !draining.contains(v);
            (serving, raft.prs().get(*v).map_or(0, |p| p.matched))
        });
    let Some(to) = to else {
        return false;
    };
    g.raw.transfer_leader(to);
    true
}
