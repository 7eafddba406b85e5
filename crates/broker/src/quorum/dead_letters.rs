//! At-least-once dead-lettering (RabbitMQ's `x-dead-letter-strategy=at-least-once`, after
//! `rabbit_fifo_dlx`): a message that dies in such a queue is not gone when it dies. It waits
//! here, in the replicated state, until the leader has published it to the dead-letter
//! exchange and every queue it was routed to confirmed it; the leader then proposes
//! `Op::SettleDeadLetters` and only that entry lets it go. A leader that dies between the two
//! leaves the message here for the next one, which publishes it again: a dead letter may
//! arrive twice, never zero times.
//!
//! The message keeps its log entry (its index stays live for the release cursor), and counts
//! against x-max-length and x-max-length-bytes as RabbitMQ counts its dead-letter backlog, so
//! a target that never confirms fills the queue and publishers get nacks instead of the
//! source growing without bound.

use super::effects::DeadLetterReason;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A dead-letter id: assigned in the order messages die, so they are published in that order.
pub type DeadLetterId = u64;

/// A message waiting for its dead-letter targets to confirm it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discard {
    /// Its log index, where its body is.
    pub index: u64,
    pub size_bytes: u32,
    pub reason: DeadLetterReason,
    pub delivery_count: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discards {
    waiting: BTreeMap<DeadLetterId, Discard>,
    next_id: DeadLetterId,
    bytes: u64,
}

impl Discards {
    /// Keeps `discard` until it is settled; its id.
    pub fn hold(&mut self, discard: Discard) -> DeadLetterId {
        self.next_id += 1;
        self.bytes += discard.size_bytes as u64;
        self.waiting.insert(self.next_id, discard);
        self.next_id
    }

    /// The targets confirmed it: it goes. `None` for an id settled already (a leader and its
    /// successor may both settle the same message).
    pub fn settle(&mut self, id: DeadLetterId) -> Option<Discard> {
        let d = self.waiting.remove(&id)?;
        self.bytes -= d.size_bytes as u64;
        Some(d)
    }

    pub fn get(&self, id: DeadLetterId) -> Option<&Discard> {
        self.waiting.get(&id)
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// In the order they died.
    pub fn iter(&self) -> impl Iterator<Item = (DeadLetterId, &Discard)> + '_ {
        self.waiting.iter().map(|(id, d)| (*id, d))
    }
}
