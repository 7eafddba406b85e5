//! Proposals to a group: what a client asks for goes in at once when the group knows a leader
//! (raft-rs forwards it there from a follower); while it knows none (an election, a restart),
//! it waits here rather than being dropped, so confirms pause through a failover, not fail.

use super::{Group, Proposed};
use std::time::{Duration, Instant};

/// How long a proposal to a group without a known leader waits for one (an election, a
/// restart) before it is dropped: confirms pause through a failover rather than fail.
const LEADERLESS_PROPOSAL_WAIT: Duration = Duration::from_secs(3);

/// Proposes `data`, or keeps it until the group knows a leader (raft-rs drops a proposal
/// made without one). Behind proposals that wait already, so that a publisher's messages
/// reach the log in the order it sent them even when the leader becomes known between two.
pub(super) fn propose(g: &mut Group, data: Vec<u8>, done: Option<Proposed>) {
    if g.raw.raft.leader_id == raft::INVALID_ID {
        g.waiting.push((Instant::now(), data, done));
        return;
    }
    if !g.waiting.is_empty() {
        g.waiting.push((Instant::now(), data, done));
        propose_waiting(g);
        return;
    }
    let result = g.raw.propose(vec![], data).map_err(|e| e.to_string());
    if let Some(done) = done {
        done(result);
    }
}

/// Proposes what waited for a leader once there is one; drops what waited too long.
pub(super) fn propose_waiting(g: &mut Group) {
    if g.waiting.is_empty() {
        return;
    }
    let known = g.raw.raft.leader_id != raft::INVALID_ID;
    let now = Instant::now();
    for (since, data, done) in std::mem::take(&mut g.waiting) {
        if known {
            let result = g.raw.propose(vec![], data).map_err(|e| e.to_string());
            if let Some(done) = done {
                done(result);
            }
        } else if now.duration_since(since) < LEADERLESS_PROPOSAL_WAIT {
            g.waiting.push((since, data, done));
        } else if let Some(done) = done {
            done(Err("the queue's group has no leader".into()));
        }
    }
}
