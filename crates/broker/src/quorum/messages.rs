//! What the queue keeps of a message, and the ready messages in the order they are served.
//!
//! A message is its log index and a 32-byte header; the body stays in the log entry at that
//! index. Ready messages sit in three queues, served in this order:
//!
//! - `returns`: messages given back by basic.recover or a closed channel, oldest return first,
//!   ahead of everything else (rabbit_fifo's `returns`);
//! - `enqueued` and `rejected`, merged: `enqueued` holds messages never delivered, in log
//!   order; `rejected` holds messages a client nacked or rejected with requeue, each behind
//!   every message that was ready when it came back (RabbitMQ 3.10 puts those at the back).
//!   Each rejected message remembers the last index enqueued before it came back; it is
//!   served once every enqueued message up to that index is gone, which is the order a single
//!   queue would give without moving a never-delivered message out of log order.
//!
//! Keeping never-delivered messages in log order makes the release cursor cheap: the lowest
//! live index is the front of `enqueued` or the lowest of the (few) messages that have been
//! delivered, which [`super::QuorumQueue`] keeps in an ordered set.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A message as the queue holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Msg {
    /// Its log index: where its body is, and its identity within the queue.
    pub index: u64,
    pub size_bytes: u32,
    /// Returns so far (x-delivery-count).
    pub delivery_count: u32,
    pub redelivered: bool,
    /// Dead from this time on (`now_ms >= expires_at_ms`), as RabbitMQ's `Now >= Expiry`.
    pub expires_at_ms: Option<u64>,
}

impl Msg {
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_some_and(|t| now_ms >= t)
    }
}

/// Which ready queue serves next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Returns,
    Enqueued,
    Rejected,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    returns: VecDeque<Msg>,
    enqueued: VecDeque<Msg>,
    /// `(after, msg)`: served once no enqueued message with index <= `after` is left.
    /// `after` never decreases along the queue.
    rejected: VecDeque<(u64, Msg)>,
    bytes: u64,
}

impl Ready {
    pub fn len(&self) -> usize {
        self.returns.len() + self.enqueued.len() + self.rejected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Body bytes of the ready messages (x-max-length-bytes counts these).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The lowest index among never-delivered messages.
    pub fn first_enqueued_index(&self) -> Option<u64> {
        self.enqueued.front().map(|m| m.index)
    }

    fn source(&self) -> Option<Source> {
        if !self.returns.is_empty() {
            return Some(Source::Returns);
        }
        match (self.enqueued.front(), self.rejected.front()) {
            (Some(m), Some((after, _))) if *after < m.index => Some(Source::Rejected),
            (Some(_), _) => Some(Source::Enqueued),
            (None, Some(_)) => Some(Source::Rejected),
            (None, None) => None,
        }
    }

    /// The message served next.
    pub fn peek(&self) -> Option<&Msg> {
        match self.source()? {
            Source::Returns => self.returns.front(),
            Source::Enqueued => self.enqueued.front(),
            Source::Rejected => self.rejected.front().map(|(_, m)| m),
        }
    }

    /// Takes the message served next.
    pub fn pop(&mut self) -> Option<Msg> {
        let m = match self.source()? {
            Source::Returns => self.returns.pop_front(),
            Source::Enqueued => self.enqueued.pop_front(),
            Source::Rejected => self.rejected.pop_front().map(|(_, m)| m),
        }?;
        self.bytes -= m.size_bytes as u64;
        Some(m)
    }

    /// A new message, at the back. Enqueues come in log order.
    pub fn push_enqueued(&mut self, m: Msg) {
        assert!(
            self.enqueued.back().is_none_or(|b| b.index < m.index),
            "enqueues arrive in log order"
        );
        self.bytes += m.size_bytes as u64;
        self.enqueued.push_back(m);
    }

    /// A recovered or orphaned message: behind earlier returns, ahead of the rest.
    pub fn push_return(&mut self, m: Msg) {
        self.bytes += m.size_bytes as u64;
        self.returns.push_back(m);
    }

    /// A rejected message: behind everything ready now. `last_enqueued` is the highest index
    /// enqueued so far, so every message enqueued later is served after it.
    pub fn push_rejected(&mut self, last_enqueued: u64, m: Msg) {
        debug_assert!(self
            .rejected
            .back()
            .is_none_or(|(a, _)| *a <= last_enqueued));
        self.bytes += m.size_bytes as u64;
        self.rejected.push_back((last_enqueued, m));
    }

    /// Takes back the message just enqueued at `index` if it is still ready (a TTL of 0 that
    /// no consumer could take at once).
    pub fn pop_enqueued_if(&mut self, index: u64) -> Option<Msg> {
        if self.enqueued.back()?.index != index {
            return None;
        }
        let m = self.enqueued.pop_back()?;
        self.bytes -= m.size_bytes as u64;
        Some(m)
    }

    /// Every ready message, in the order they would be served.
    pub fn iter(&self) -> impl Iterator<Item = &Msg> + '_ {
        let mut e = self.enqueued.iter().peekable();
        let mut r = self.rejected.iter().peekable();
        self.returns
            .iter()
            .chain(std::iter::from_fn(move || match (e.peek(), r.peek()) {
                (Some(m), Some((after, _))) if *after < m.index => r.next().map(|(_, m)| m),
                (Some(_), _) => e.next(),
                (None, _) => r.next().map(|(_, m)| m),
            }))
    }

    /// The messages that have been delivered before (returned or rejected).
    pub fn iter_delivered(&self) -> impl Iterator<Item = &Msg> + '_ {
        self.returns
            .iter()
            .chain(self.rejected.iter().map(|(_, m)| m))
    }

    /// Empties the queue (purge), giving what was in it.
    pub fn take_all(&mut self) -> Vec<Msg> {
        let all: Vec<Msg> = self.iter().copied().collect();
        *self = Ready::default();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(index: u64) -> Msg {
        Msg {
            index,
            size_bytes: 1,
            delivery_count: 0,
            redelivered: false,
            expires_at_ms: None,
        }
    }

    fn order(r: &Ready) -> Vec<u64> {
        r.iter().map(|m| m.index).collect()
    }

    #[test]
    fn a_rejected_message_goes_behind_what_was_ready_and_ahead_of_later_enqueues() {
        let mut r = Ready::default();
        for i in [1, 2, 3] {
            r.push_enqueued(msg(i));
        }
        let first = r.pop().unwrap();
        r.push_rejected(3, first);
        r.push_enqueued(msg(4));
        assert_eq!(order(&r), [2, 3, 1, 4]);
        let served: Vec<u64> = std::iter::from_fn(|| r.pop().map(|m| m.index)).collect();
        assert_eq!(served, [2, 3, 1, 4], "pop serves in the order iter shows");
        assert_eq!(r.bytes(), 0);
    }

    #[test]
    fn returns_are_served_first_in_the_order_they_came_back() {
        let mut r = Ready::default();
        r.push_enqueued(msg(1));
        r.push_return(msg(7));
        r.push_return(msg(5));
        r.push_rejected(1, msg(6));
        assert_eq!(order(&r), [7, 5, 1, 6]);
        assert_eq!(r.peek().map(|m| m.index), Some(7));
        assert_eq!(r.len(), 4);
        assert_eq!(r.bytes(), 4);
    }
}
