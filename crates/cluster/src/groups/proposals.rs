//! Proposals to a group: what a client asks for goes in at once when the group knows a leader
//! (raft-rs forwards it there from a follower); while it knows none (an election, a restart),
//! it waits here rather than being dropped, so confirms pause through a failover, not fail.
//! Forwarded, a round's proposals to one leader travel as one message.

use super::{Group, Proposed};
use bytes::Bytes;
use raft::eraftpb::{Entry, EntryType, Message, MessageType};
use std::time::{Duration, Instant};

/// How long a proposal to a group without a known leader waits for one (an election, a
/// restart) before it is dropped: confirms pause through a failover rather than fail.
const LEADERLESS_PROPOSAL_WAIT: Duration = Duration::from_secs(3);

/// Proposes `data`, or keeps it until the group knows a leader (raft-rs drops a proposal
/// made without one). Behind proposals that wait already, so that a publisher's messages
/// reach the log in the order it sent them even when the leader becomes known between two.
pub(super) fn propose(g: &mut Group, data: Bytes, done: Option<Proposed>) {
    if g.raw.raft.leader_id == raft::INVALID_ID {
        g.waiting.push((Instant::now(), data, done));
        return;
    }
    if !g.waiting.is_empty() {
        g.waiting.push((Instant::now(), data, done));
        propose_waiting(g);
        return;
    }
    let result = propose_entry(g, data);
    if let Some(done) = done {
        done(result);
    }
}

/// What `RawNode::propose` does, with the data as it came: raft-rs's takes a `Vec` and
/// turns it into the entry's `Bytes`, and a proposer keeping the entry to propose again would
/// have to copy it for that.
fn propose_entry(g: &mut Group, data: Bytes) -> Result<(), String> {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgPropose);
    m.from = g.raw.raft.id;
    let e = Entry {
        data,
        ..Entry::default()
    };
    m.set_entries(vec![e].into());
    g.raw.raft.step(m).map_err(|e| e.to_string())
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
            let result = propose_entry(g, data);
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

/// Splits a follower's ready messages into the proposals it forwards to the leader and the
/// rest. raft-rs holds all of a follower's messages until its ready is durable, since most of
/// them (append and vote answers) claim what this member has on disk; a forwarded proposal
/// claims nothing, and held it would wait for the round's sync on this node before its own
/// on the leader's: a publish through a follower's node paid two syncs in a row where one is
/// due. Proposals keep their order among themselves: each ready's go out as it is handled,
/// one message per run of plain entries to the same leader (raft-rs forwards every proposal
/// alone, and the leader answers each with appends of its own).
pub(super) fn proposals_apart(messages: Vec<Message>) -> (Vec<Message>, Vec<Message>) {
    let (proposals, rest): (Vec<Message>, Vec<Message>) = messages
        .into_iter()
        .partition(|m| m.get_msg_type() == MessageType::MsgPropose);
    (coalesce_proposals(proposals), rest)
}

/// Joins consecutive proposals to the same leader into one. Only plain entries: the leader
/// vets each configuration change as it steps the message that carries it.
fn coalesce_proposals(proposals: Vec<Message>) -> Vec<Message> {
    let plain = |m: &Message| {
        m.get_entries()
            .iter()
            .all(|e| e.get_entry_type() == EntryType::EntryNormal)
    };
    let mut out: Vec<Message> = Vec::with_capacity(1);
    let mut last_plain = false;
    for mut m in proposals {
        let this_plain = plain(&m);
        match out.last_mut() {
            Some(last) if last_plain && this_plain && last.to == m.to => {
                last.mut_entries().extend(m.take_entries());
            }
            _ => {
                out.push(m);
                last_plain = this_plain;
            }
        }
    }
    out
}
