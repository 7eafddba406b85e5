//! At-least-once dead-lettering of a single node's quorum queues
//! (`x-dead-letter-strategy=at-least-once`, RabbitMQ's `rabbit_fifo_dlx`). In a cluster the
//! queue's Raft group keeps its dead letters ([`crate::quorum::dead_letters`]); a single node's
//! quorum queue is a local queue with quorum semantics, so it keeps them here, beside its
//! backlog, and its log keeps them on disk.
//!
//! A message dying in such a queue is routed to the dead-letter exchange at once. Every local
//! queue it reaches appends it to the same WAL before the source's release is appended, so
//! once the release is durable the copies are too: that order is the "confirm" a single node
//! needs, and a kill -9 between the two leaves the message in the source, never nowhere. What
//! cannot be delivered at once (no route yet, no such exchange, a full reject-publish target)
//! is held: the message is appended again to the source's log flagged as a dead letter with
//! its reason (`encode_stored_dead_letter`), its old entry released, and it waits here until
//! a retry finds every target willing. Recovery reads such entries back into this list, not
//! into the backlog. Held letters count against x-max-length(-bytes), as RabbitMQ counts its
//! dead-letter backlog, so a target that never takes them fills the source and its
//! publishers get nacks rather than the source growing without bound.

use crate::queue::QueuedMessage;
use crate::routing::QueueId;
use std::collections::BTreeMap;

/// How long a held dead letter waits before it is routed again (as the cluster's
/// `quorum_dead_letters::RETRY_AFTER`; RabbitMQ waits out a confirm timeout, minutes).
pub const RETRY_AFTER_MS: u64 = 2_000;
/// Held dead letters of one queue routed again per retry, at most: a target that refuses
/// everything must not cost a whole backlog of routing under the vhost lock every 2 s
/// (RabbitMQ's worker has a prefetch of 32 for the same reason).
pub const RETRY_BATCH_MAX: usize = 256;

/// One dead letter waiting for its targets.
#[derive(Debug, Clone)]
pub struct HeldDeadLetter {
    /// The message as it died; `store_index` is its flagged entry in the source's log.
    pub message: QueuedMessage,
    pub reason: &'static str,
    /// Local queues that took it already: a retry routes it to the others only, as RabbitMQ's
    /// worker resends to the targets that have not confirmed (forgotten at a restart, so a
    /// target may then get it twice, never zero times).
    pub taken_by: Vec<QueueId>,
}

/// A queue's held dead letters, oldest death first (keyed by their log index, which grows
/// with the order they were held in).
#[derive(Debug, Default)]
pub struct HeldDeadLetters {
    letters: BTreeMap<u64, HeldDeadLetter>,
    bytes: usize,
    /// When the next retry is due (broker ms).
    pub retry_at_ms: u64,
}

impl HeldDeadLetters {
    pub fn is_empty(&self) -> bool {
        self.letters.is_empty()
    }

    pub fn len(&self) -> usize {
        self.letters.len()
    }

    /// Their body bytes, counted against x-max-length-bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps `letter`, whose flagged entry is at `letter.message.store_index`.
    pub fn hold(&mut self, letter: HeldDeadLetter, now_ms: u64) {
        let index = letter
            .message
            .store_index
            .expect("a held dead letter is stored");
        self.bytes += letter.message.msg.size_bytes();
        if self.letters.is_empty() {
            self.retry_at_ms = now_ms + RETRY_AFTER_MS;
        }
        let old = self.letters.insert(index, letter);
        debug_assert!(old.is_none(), "one dead letter per log index");
    }

    /// Takes out up to `max` of the oldest, to be routed again (those still refused are held
    /// again).
    pub fn take_oldest(&mut self, max: usize) -> Vec<HeldDeadLetter> {
        let mut out = Vec::with_capacity(max.min(self.letters.len()));
        while out.len() < max {
            let Some((_, l)) = self.letters.pop_first() else {
                break;
            };
            self.bytes -= l.message.msg.size_bytes();
            out.push(l);
        }
        out
    }

    /// Puts back a letter taken by [`Self::take_oldest`] and still not delivered.
    pub fn put_back(&mut self, letter: HeldDeadLetter) {
        let index = letter
            .message
            .store_index
            .expect("a held dead letter is stored");
        self.bytes += letter.message.msg.size_bytes();
        self.letters.insert(index, letter);
    }

    /// Their log indexes, ascending (live entries of the queue's log).
    pub fn indexes(&self) -> impl Iterator<Item = u64> + '_ {
        self.letters.keys().copied()
    }

    /// Whether a retry is due.
    pub fn due(&self, now_ms: u64) -> bool {
        !self.letters.is_empty() && now_ms >= self.retry_at_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use bytes::Bytes;
    use std::sync::Arc;
    use warren_protocol::content::Properties;

    fn letter(index: u64, body: &'static [u8]) -> HeldDeadLetter {
        let props = Properties::default();
        let msg = Message::new(
            Bytes::new(),
            Bytes::new(),
            props.encode(),
            &props,
            Bytes::from_static(body),
        );
        HeldDeadLetter {
            message: QueuedMessage {
                msg: Arc::new(msg),
                redelivered: false,
                delivery_count: 0,
                expires_at_ms: None,
                seq: 0,
                store_index: Some(index),
            },
            reason: "rejected",
            taken_by: Vec::new(),
        }
    }

    #[test]
    fn letters_come_back_oldest_first_and_their_bytes_are_counted() {
        let mut h = HeldDeadLetters::default();
        h.hold(letter(7, b"seven"), 1000);
        h.hold(letter(3, b"three!"), 1500);
        assert_eq!((h.len(), h.retry_at_ms), (2, 1000 + RETRY_AFTER_MS));
        assert!(!h.due(1000 + RETRY_AFTER_MS - 1));
        assert!(h.due(1000 + RETRY_AFTER_MS));
        let first = h.take_oldest(1);
        assert_eq!(first[0].message.store_index, Some(3));
        assert_eq!(h.len(), 1);
        h.put_back(first.into_iter().next().unwrap());
        let all = h.take_oldest(10);
        assert_eq!(
            all.iter()
                .map(|l| l.message.store_index.unwrap())
                .collect::<Vec<_>>(),
            vec![3, 7]
        );
        assert!(h.is_empty() && h.bytes() == 0);
    }
}
