//! A group whose leader's node went down elects another at once rather than after an
//! election timeout.

use super::{Group, IsUp};
use raft::StateRole;
use std::collections::BTreeSet;

/// The group's leader's node went down (its link broke): rather than wait out an election
/// timeout (1 to 2 s), the group elects another at once, as Ra does on a nodedown. Every
/// member that saw it drop the leader's lease, so it grants a vote now; the lowest of the
/// other voters stands (one candidate, no split vote), the lowest not in maintenance mode
/// (`draining`) if there is one, since a drained node would hand the leadership on at once.
/// Pre-vote keeps this harmless when the leader is in fact alive: members still hearing from
/// it refuse, and nobody's term moves.
pub(super) fn elect_without(g: &mut Group, me: u64, down: u64, draining: &BTreeSet<u64>) {
    let raft = &mut g.raw.raft;
    if raft.state != StateRole::Follower || !g.voters.contains(&me) {
        return;
    }
    raft.election_elapsed = raft.election_elapsed.max(raft.election_timeout());
    let others = || g.voters.iter().copied().filter(|v| *v != down);
    let first = others()
        .find(|v| !draining.contains(v))
        .or_else(|| others().next());
    if first == Some(me) {
        g.standing_for = Some(down);
        let _ = g.raw.campaign();
    }
}

/// Stands again for a leader whose node is down ([`Group::standing_for`]) until some leader
/// is known or the node is back.
pub(super) fn stand_again(g: &mut Group, is_up: &IsUp) {
    let Some(down) = g.standing_for else {
        return;
    };
    let raft = &g.raw.raft;
    if raft.leader_id != raft::INVALID_ID && raft.leader_id != down || is_up(down) {
        g.standing_for = None;
    } else if raft.state != StateRole::Candidate {
        let _ = g.raw.campaign();
    }
}
