//! A queue's own state: its ready backlog (by priority), its consumers and its counters.
//!
//! The queue decides what is ready and in which order; the vhost pairs ready messages with
//! consumers that have credit, because credit lives in channels.

use crate::args::{QueueConfig, QueueType};
use crate::message::MessageRef;
use crate::persistence::StoreOp;
use crate::routing::QueueId;
use amq_protocol_types::FieldTable;
use bytes::Bytes;
use std::collections::VecDeque;

/// A connection, by the number the server gives it.
pub type ConnId = u64;
/// A channel anywhere in the broker: a connection's channel, globally unique.
pub type ChannelKey = u64;

#[derive(Debug, Clone)]
pub struct QueuedMessage {
    pub msg: MessageRef,
    pub redelivered: bool,
    /// How many times this message was delivered and returned (x-delivery-count of quorum queues).
    pub delivery_count: u32,
    /// Milliseconds since the broker's epoch after which the message is dead.
    pub expires_at_ms: Option<u64>,
    /// Arrival order in its queue, set by [`Backlog::push_back`]: a requeue puts the message
    /// back at this position, as RabbitMQ's classic queues do.
    pub seq: u64,
    /// Its index in the queue's log when it is stored (a persistent message in a durable
    /// queue, or any message in a quorum queue).
    pub store_index: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Consumer {
    pub channel: ChannelKey,
    pub tag: Bytes,
    pub no_ack: bool,
    pub exclusive: bool,
    pub priority: i32,
    /// Per-consumer prefetch (basic.qos global=false at consume time); 0 means unlimited.
    pub prefetch: u32,
    pub unacked: u32,
    pub arguments: FieldTable,
}

impl Consumer {
    pub fn has_credit(&self) -> bool {
        self.no_ack || self.prefetch == 0 || self.unacked < self.prefetch
    }
}

/// Ready messages, one FIFO per priority level (one level without x-max-priority).
#[derive(Debug, Default)]
pub struct Backlog {
    /// Each level is sorted by `seq`.
    levels: Vec<VecDeque<QueuedMessage>>,
    len: usize,
    bytes: usize,
    next_seq: u64,
}

impl Backlog {
    pub fn new(max_priority: Option<u8>) -> Self {
        let n = max_priority.map(|p| p as usize + 1).unwrap_or(1);
        Backlog {
            levels: (0..n).map(|_| VecDeque::new()).collect(),
            len: 0,
            bytes: 0,
            next_seq: 0,
        }
    }

    fn level(&self, m: &QueuedMessage) -> usize {
        (m.msg.priority as usize).min(self.levels.len() - 1)
    }

    /// Appends a message; returns the sequence number it got.
    pub fn push_back(&mut self, mut m: QueuedMessage) -> u64 {
        let seq = self.next_seq;
        m.seq = seq;
        self.next_seq += 1;
        self.len += 1;
        self.bytes += m.msg.size_bytes();
        let l = self.level(&m);
        self.levels[l].push_back(m);
        seq
    }

    /// Takes back the message just appended with `seq`, if it is still the newest of its level.
    pub fn pop_back_if(&mut self, seq: u64) -> Option<QueuedMessage> {
        let level = self
            .levels
            .iter_mut()
            .find(|l| l.back().is_some_and(|m| m.seq == seq))?;
        let m = level.pop_back().expect("found at the back");
        self.len -= 1;
        self.bytes -= m.msg.size_bytes();
        Some(m)
    }

    /// Returns a delivered message to its original position, ahead of everything that arrived
    /// after it, whatever order the requeues come in (several channels, single nacks). The
    /// position is near the head in practice, so the insert moves few entries.
    pub fn requeue(&mut self, m: QueuedMessage) {
        self.len += 1;
        self.bytes += m.msg.size_bytes();
        let l = self.level(&m);
        let level = &mut self.levels[l];
        let i = level.partition_point(|x| x.seq < m.seq);
        level.insert(i, m);
    }

    /// Returns a delivered message as a quorum queue does (rabbit_fifo's `returns` queue):
    /// after the messages returned before it and not yet redelivered, ahead of all others.
    /// Returned messages stay at the front of their level.
    pub fn requeue_after_returns(&mut self, m: QueuedMessage) {
        debug_assert!(m.redelivered, "only returned messages go here");
        self.len += 1;
        self.bytes += m.msg.size_bytes();
        let l = self.level(&m);
        let level = &mut self.levels[l];
        // A linear scan, not a binary search: a rejected message requeued at the back is
        // redelivered too, so redelivered ones are not only at the front.
        let i = level
            .iter()
            .position(|x| !x.redelivered)
            .unwrap_or(level.len());
        level.insert(i, m);
    }

    pub fn peek(&self) -> Option<&QueuedMessage> {
        self.levels.iter().rev().find_map(|l| l.front())
    }

    pub fn pop_front(&mut self) -> Option<QueuedMessage> {
        let m = self.levels.iter_mut().rev().find_map(|l| l.pop_front())?;
        self.len -= 1;
        self.bytes -= m.msg.size_bytes();
        Some(m)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn clear(&mut self) -> Vec<QueuedMessage> {
        self.len = 0;
        self.bytes = 0;
        self.levels.iter_mut().flat_map(|l| l.drain(..)).collect()
    }
}

#[derive(Debug)]
pub struct Queue {
    pub id: QueueId,
    pub name: String,
    pub durable: bool,
    pub exclusive_owner: Option<ConnId>,
    pub auto_delete: bool,
    pub arguments: FieldTable,
    pub config: QueueConfig,
    pub backlog: Backlog,
    pub consumers: Vec<Consumer>,
    /// Round-robin position among consumers.
    pub next_consumer: usize,
    pub unacked: usize,
    /// Auto-delete queues go away when their last consumer leaves, but only once they had one.
    pub had_consumer: bool,
    /// Last time (broker ms) the queue was used, for x-expires.
    pub last_used_ms: u64,
    /// The store log holding its persistent messages (durable queues only).
    pub log_id: Option<u64>,
    /// Which stored entries are settled, so that settled prefixes are released in one step.
    pub released: ReleaseTracker,
    /// The index the next stored message gets in that log.
    pub next_index: u64,
}

/// A prefix release goes out once this many entries have been settled in a row (or the log
/// has caught up): often enough to keep the engine's per-entry state small, rarely enough to
/// cost nothing per message.
pub const PREFIX_RELEASE_STEP: u64 = 4096;

/// The settled flags of a queue's stored entries from the oldest unsettled one on: one byte
/// per outstanding entry, so that acks in any order still yield contiguous settled prefixes.
#[derive(Debug, Default)]
pub struct ReleaseTracker {
    /// Index of `settled[0]`.
    base: u64,
    settled: VecDeque<bool>,
    /// Entries dropped from the front since the last prefix release.
    advanced: u64,
}

impl ReleaseTracker {
    /// A tracker for a recovered log: `live` (ascending) are the unsettled indexes, `next` the
    /// index the next append gets.
    pub fn recovered(live: &[u64], next: u64) -> Self {
        let base = live.first().copied().unwrap_or(next);
        let mut settled = VecDeque::with_capacity((next - base) as usize);
        let mut l = live.iter().peekable();
        for i in base..next {
            let is_live = l.peek() == Some(&&i);
            if is_live {
                l.next();
            }
            settled.push_back(!is_live);
        }
        ReleaseTracker {
            base,
            settled,
            advanced: 0,
        }
    }

    pub fn appended(&mut self, index: u64) {
        if self.settled.is_empty() {
            self.base = index;
        }
        debug_assert_eq!(
            index,
            self.base + self.settled.len() as u64,
            "appends are contiguous"
        );
        self.settled.push_back(false);
    }

    /// Marks `index` settled; returns the end of a settled prefix when one is due for release.
    pub fn settle(&mut self, index: u64) -> Option<u64> {
        let i = index.checked_sub(self.base)? as usize;
        *self.settled.get_mut(i)? = true;
        while self.settled.front() == Some(&true) {
            self.settled.pop_front();
            self.base += 1;
            self.advanced += 1;
        }
        let caught_up = self.settled.is_empty();
        if self.advanced > 0 && (self.advanced >= PREFIX_RELEASE_STEP || caught_up) {
            self.advanced = 0;
            return Some(self.base - 1);
        }
        None
    }
}

impl Queue {
    /// A stored message left the queue for good: release it, and the settled prefix when due.
    pub fn release_stored(&mut self, index: u64, ops: &mut Vec<StoreOp>) {
        let Some(log) = self.log_id else { return };
        ops.push(StoreOp::Release { log, index });
        if let Some(upto) = self.released.settle(index) {
            ops.push(StoreOp::ReleasePrefix { log, index: upto });
        }
    }

    /// Whether a message is written to this queue's log: persistent messages in durable
    /// queues, and every message of a quorum queue, as RabbitMQ does.
    pub fn stores(&self, persistent: bool) -> bool {
        self.log_id.is_some() && (persistent || self.is_quorum())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: QueueId,
        name: String,
        durable: bool,
        exclusive_owner: Option<ConnId>,
        auto_delete: bool,
        arguments: FieldTable,
        config: QueueConfig,
        now_ms: u64,
    ) -> Self {
        Queue {
            id,
            name,
            durable,
            exclusive_owner,
            auto_delete,
            backlog: Backlog::new(config.max_priority),
            arguments,
            config,
            consumers: Vec::new(),
            next_consumer: 0,
            unacked: 0,
            had_consumer: false,
            last_used_ms: now_ms,
            log_id: None,
            next_index: 1,
            released: ReleaseTracker::default(),
        }
    }

    pub fn is_quorum(&self) -> bool {
        self.config.queue_type == QueueType::Quorum
    }

    pub fn message_count(&self) -> usize {
        self.backlog.len()
    }

    /// The consumer index that should get the next message, honouring consumer priorities,
    /// single-active-consumer and round-robin; `can_take` checks channel-level credit.
    pub fn pick_consumer(&mut self, can_take: impl Fn(&Consumer) -> bool) -> Option<usize> {
        let n = self.consumers.len();
        if n == 0 {
            return None;
        }
        if self.config.single_active_consumer {
            let c = &self.consumers[0];
            return (c.has_credit() && can_take(c)).then_some(0);
        }
        let top = self
            .consumers
            .iter()
            .filter(|c| c.has_credit() && can_take(c))
            .map(|c| c.priority)
            .max()?;
        for step in 0..n {
            let i = (self.next_consumer + step) % n;
            let c = &self.consumers[i];
            if c.priority == top && c.has_credit() && can_take(c) {
                self.next_consumer = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }

    /// Whether the queue is over a length limit, so the overflow rule applies to a new message.
    /// A quorum queue checks before enqueueing whether it is already over (so it may hold one
    /// more than the limit), a classic queue whether the new message would put it over: both
    /// as RabbitMQ 3.10 does.
    pub fn over_limit(&self, extra_bytes: usize) -> bool {
        let quorum = self.is_quorum();
        let len_over = self.config.max_length.is_some_and(|m| {
            let len = self.backlog.len() as u64;
            if quorum {
                len > m
            } else {
                len >= m
            }
        });
        let bytes_over = self
            .config
            .max_length_bytes
            .is_some_and(|m| (self.backlog.bytes() + extra_bytes) as u64 > m);
        len_over || bytes_over
    }

    /// Whether the length limits are exceeded right now (after an enqueue, for drop-head).
    pub fn exceeds_limit(&self) -> bool {
        self.config
            .max_length
            .is_some_and(|m| self.backlog.len() as u64 > m)
            || self
                .config
                .max_length_bytes
                .is_some_and(|m| self.backlog.bytes() as u64 > m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use std::sync::Arc;

    fn msg(priority: u8) -> QueuedMessage {
        QueuedMessage {
            msg: Arc::new(Message {
                exchange: Bytes::new(),
                routing_key: Bytes::new(),
                properties: Bytes::new(),
                body: Bytes::from(vec![priority; 3]),
                persistent: false,
                priority,
                expiration_ms: None,
                bcc: Vec::new(),
            }),
            redelivered: false,
            delivery_count: 0,
            expires_at_ms: None,
            seq: 0,
            store_index: None,
        }
    }

    #[test]
    fn higher_priority_is_served_first_and_fifo_within_a_level() {
        let mut b = Backlog::new(Some(5));
        b.push_back(msg(1));
        b.push_back(msg(9));
        b.push_back(msg(1));
        b.push_back(msg(3));
        let order: Vec<u8> = std::iter::from_fn(|| b.pop_front())
            .map(|m| m.msg.priority)
            .collect();
        assert_eq!(order, vec![9, 3, 1, 1]);
        assert_eq!(b.bytes(), 0);
    }

    #[test]
    fn settled_prefixes_are_released_in_steps_whatever_the_ack_order() {
        let mut t = ReleaseTracker::default();
        for i in 10..20 {
            t.appended(i);
        }
        assert_eq!(t.settle(11), None, "10 is still unsettled");
        assert_eq!(t.settle(12), None);
        assert_eq!(
            t.settle(10),
            None,
            "prefix 10..=12 is not a step yet, 13.. still live"
        );
        for i in 13..19 {
            assert_eq!(t.settle(i), None);
        }
        assert_eq!(t.settle(19), Some(19), "caught up: the whole prefix goes");
        assert_eq!(t.settle(19), None, "settling twice does nothing");
        let r = ReleaseTracker::recovered(&[5, 7], 9);
        let mut r = r;
        assert_eq!(r.settle(5), None, "7 is live");
        assert_eq!(
            r.settle(7),
            Some(8),
            "6 and 8 were settled before the restart"
        );
    }

    #[test]
    fn requeue_restores_the_original_order_whatever_order_messages_return_in() {
        let mut b = Backlog::new(None);
        for p in 0..5 {
            b.push_back(msg(p));
        }
        let out: Vec<QueuedMessage> = (0..4).map(|_| b.pop_front().unwrap()).collect();
        for i in [2, 0, 3, 1] {
            b.requeue(out[i].clone());
        }
        let order: Vec<u8> = std::iter::from_fn(|| b.pop_front())
            .map(|m| m.msg.priority)
            .collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn without_max_priority_everything_is_fifo() {
        let mut b = Backlog::new(None);
        b.push_back(msg(1));
        b.push_back(msg(9));
        assert_eq!(b.pop_front().unwrap().msg.priority, 1);
    }
}
