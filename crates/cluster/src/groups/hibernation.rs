//! Hibernation (TiKV's hibernate regions, Ra's quiet clusters): when a quiet group may stop
//! ticking, and which messages do not count as activity. See the module doc of `groups`.

use super::{Group, IsUp};
use raft::eraftpb::Message;
use raft::StateRole;

/// Heartbeats and their answers are what an idle group exchanges: they tick the group again
/// but do not keep it from falling asleep.
pub(super) fn is_heartbeat(m: &Message) -> bool {
    matches!(
        m.get_msg_type(),
        raft::eraftpb::MessageType::MsgHeartbeat | raft::eraftpb::MessageType::MsgHeartbeatResponse
    )
}

/// Whether a quiet group may stop ticking: a leader whose followers have every entry and who
/// has applied them; a follower that knows a leader the failure detector sees up.
pub(super) fn may_sleep(g: &Group, is_up: &IsUp) -> bool {
    let raft = &g.raw.raft;
    let last = raft.raft_log.last_index();
    let settled = raft.raft_log.committed == last && raft.raft_log.applied == last;
    if !g.waiting.is_empty() || g.leaving.is_some() {
        return false;
    }
    match raft.state {
        StateRole::Leader => {
            settled
                && (g.wanted.is_empty()
                    || (g.wanted.iter().all(|n| g.voters.contains(n))
                        && g.voters.iter().all(|n| g.wanted.contains(n))))
                && !raft.has_pending_conf()
                && raft
                    .prs()
                    .iter()
                    .all(|(id, p)| *id == raft.id || p.matched == last)
        }
        StateRole::Follower => {
            raft.leader_id != raft::INVALID_ID && is_up(raft.leader_id) && settled
        }
        StateRole::Candidate | StateRole::PreCandidate => false,
    }
}
