//! A queue's own state: its ready backlog (by priority), its consumers and its counters.
//!
//! The queue decides what is ready and in which order; the vhost pairs ready messages with
//! consumers that have credit, because credit lives in channels.

use crate::args::QueueConfig;
pub use crate::backlog::{Backlog, QueuedMessage};
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

/// What a queue has done since it was declared on this node, for the management API's
/// `message_stats`. Plain counters bumped under the vhost lock the data path already holds:
/// one add per message event, no atomic and no lock of their own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages enqueued (routed to it, forwarded to it from another node).
    pub publish: u64,
    /// Messages handed to consumers or to basic.get.
    pub deliver_get: u64,
    /// Of those, ones delivered again (after a requeue).
    pub redeliver: u64,
    /// Deliveries acknowledged.
    pub ack: u64,
    /// Of `deliver_get`: deliveries to no-ack consumers, basic.get answers, and those of
    /// them with no-ack; and basic.get finding the queue empty. RabbitMQ's Prometheus
    /// metrics count these apart (`rabbitmq_channel_get_ack_total`, ...).
    pub deliver_no_ack: u64,
    pub get: u64,
    pub get_no_ack: u64,
    pub get_empty: u64,
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
    /// In a cluster, the node that hosts the queue's messages (`None` on a single node).
    pub home_node: Option<std::sync::Arc<str>>,
    /// A quorum queue's members in a cluster, its first leader first (empty otherwise).
    pub members: Vec<std::sync::Arc<str>>,
    /// Which stored entries are settled, so that settled prefixes are released in one step.
    pub released: ReleaseTracker,
    /// The index the next stored message gets in that log.
    pub next_index: u64,
    /// Waiting in the vhost's list for [`crate::backlog::Backlog::page_out`].
    pub page_out_due: bool,
    pub stats: QueueStats,
    /// A single node's at-least-once quorum queue: messages that died and wait for their
    /// dead-letter targets ([`crate::held_dead_letters`]).
    pub dead_letters: crate::held_dead_letters::HeldDeadLetters,
    /// A quorum queue with x-overflow=reject-publish went over a limit and refuses publishes
    /// until back to 80 % of it ([`Queue::refuses_publish`]).
    pub refusing: bool,
    /// The policy and operator policy that apply to it (their names); `config` is its
    /// arguments merged with them.
    pub policy: Option<String>,
    pub operator_policy: Option<String>,
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
    /// A quorum queue of a cluster: its messages live in its Raft group's log on each of its
    /// members, and no node hosts it as it hosts a classic queue.
    pub fn is_replicated(&self) -> bool {
        !self.members.is_empty()
    }

    /// A stored message left the queue for good: release it, and the settled prefix when due.
    pub fn release_stored(&mut self, index: u64, ops: &mut Vec<StoreOp>) {
        let Some(log) = self.log_id else { return };
        ops.push(StoreOp::Release { log, index });
        if let Some(upto) = self.released.settle(index) {
            ops.push(StoreOp::ReleasePrefix { log, index: upto });
        }
    }

    /// Whether the queue keeps its dead letters until its targets have them
    /// (`x-dead-letter-strategy=at-least-once`) on this node: a quorum queue that is not
    /// replicated, with a dead-letter exchange and x-overflow=reject-publish, which RabbitMQ
    /// requires (drop-head would drop what it promised to keep; otherwise it falls back to
    /// at most once). A replicated queue's group keeps them instead.
    pub fn holds_dead_letters(&self) -> bool {
        let c = &self.config;
        c.queue_type == crate::queue_type::QueueType::Quorum
            && c.dead_letter_at_least_once
            && c.dead_letter_exchange.is_some()
            && c.overflow == crate::args::Overflow::RejectPublish
            && self.log_id.is_some()
            && !self.is_replicated()
    }

    /// Whether a message is written to this queue's log: persistent messages in durable
    /// queues, and every message of a quorum queue, as RabbitMQ does.
    pub fn stores(&self, persistent: bool) -> bool {
        self.log_id.is_some() && (persistent || self.config.queue_type.stores_transient_messages())
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
            backlog: if config.queue_type == crate::queue_type::QueueType::Quorum {
                Backlog::two_priorities()
            } else {
                Backlog::new(config.max_priority)
            },
            arguments,
            config,
            consumers: Vec::new(),
            next_consumer: 0,
            unacked: 0,
            had_consumer: false,
            last_used_ms: now_ms,
            log_id: None,
            home_node: None,
            members: Vec::new(),
            next_index: 1,
            released: ReleaseTracker::default(),
            page_out_due: false,
            stats: QueueStats::default(),
            dead_letters: Default::default(),
            refusing: false,
            policy: None,
            operator_policy: None,
        }
    }

    /// Lets the backlog keep bodies on disk only, within the queue's in-memory limits
    /// (x-max-in-memory-length / -bytes; a lazy queue keeps none) and the node's budget.
    pub fn enable_paging(&mut self, paging: crate::backlog::Paging) {
        let Some(log) = self.log_id else { return };
        let max_len = if self.config.lazy {
            Some(0)
        } else {
            self.config.max_in_memory_length
        };
        self.backlog
            .enable_paging(log, paging, max_len, self.config.max_in_memory_bytes);
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

    /// Whether the queue is over a length limit, so the overflow rule applies to a new message
    /// (the type decides how the length compares).
    pub fn over_limit(&self, extra_bytes: usize) -> bool {
        let len_over = self.config.max_length.is_some_and(|m| {
            self.config
                .queue_type
                .length_over((self.backlog.len() + self.dead_letters.len()) as u64, m)
        });
        let bytes_over = self.config.max_length_bytes.is_some_and(|m| {
            (self.backlog.bytes() + self.dead_letters.bytes() + extra_bytes) as u64 > m
        });
        len_over || bytes_over
    }

    /// Whether a new message of `extra_bytes` meets the overflow rule: [`Queue::over_limit`],
    /// and for a reject-publish quorum queue, as RabbitMQ's (rabbit_fifo's soft limit), every
    /// message from when it is over a limit until it is back to 80 % of it.
    pub fn refuses_publish(&mut self, extra_bytes: usize) -> bool {
        let over = self.over_limit(extra_bytes);
        if self.config.queue_type != crate::queue_type::QueueType::Quorum
            || self.config.overflow != crate::args::Overflow::RejectPublish
        {
            return over;
        }
        let len = (self.backlog.len() + self.dead_letters.len()) as u64;
        let bytes = (self.backlog.bytes() + self.dead_letters.bytes()) as u64;
        let (max_len, max_bytes) = (self.config.max_length, self.config.max_length_bytes);
        if self.refusing
            && max_len.is_none_or(|m| len <= m * 4 / 5)
            && max_bytes.is_none_or(|m| bytes <= m * 4 / 5)
        {
            self.refusing = false;
        }
        if max_len.is_some_and(|m| len > m) || max_bytes.is_some_and(|m| bytes > m) {
            self.refusing = true;
        }
        self.refusing || over
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
}
