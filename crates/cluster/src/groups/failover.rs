//! A group whose leader's node went down elects another at once rather than after an
//! election timeout.

use super::{Group, IsUp};
use raft::StateRole;

/// The group's leader's node went down (its link broke): rather than wait out an election
/// timeout (1 to 2 s), the group elects another at once, as Ra does on a nodedown. Every
/// member that saw it drop the leader's lease, so it grants a vote now; the lowest of the
/// other voters stands (one candidate, no split vote). Pre-vote keeps this harmless when the
/// leader is in fact alive: members still hearing from it refuse, and nobody's term moves.
pub(super) fn elect_without(g: &mut Group, me: u64, down: u64) {
    let raft = &mut g.raw.raft;
    if raft.state != StateRole::Follower || !g.voters.contains(&me) {
        return;
    }
    raft.election_elapsed = raft.election_elapsed.max(raft.election_timeout());
    let first = g.voters.iter().copied().find(|v| *v != down);
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
