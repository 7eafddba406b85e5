//! The queue state machine: [`QuorumQueue::apply`] takes one committed log entry and returns
//! its effects. Every member of the group runs it on the same log, so nothing here reads a
//! clock, a random number or a hash map's order: the same entries give the same state and
//! the same effects everywhere.
//!
//! Each entry is applied in three steps: messages whose TTL has run out at the head go (at
//! the entry's `now_ms`), the command itself, then ready messages go to consumers with
//! credit. Enqueue follows the order of warren's single-node queue: it delivers before it
//! applies a TTL of 0 and the drop-head limit, so a waiting consumer gets a message the limit
//! would otherwise drop.

use super::command::{Command, ConsumerId, ConsumerSpec, EnqueueHeader, MsgId, Op, PublisherId};
use super::config::{OverflowMode, QuorumConfig};
use super::consumer::{Consumer, Consumers, Status};
use super::dead_letters::{Discard, Discards};
use super::effects::{DeadLetterReason, Effect};
use super::messages::{Msg, Ready};
use crate::error::AmqpError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumQueue {
    pub(super) config: QuorumConfig,
    /// In snapshots in a compact form of its own, ahead of the rest.
    #[serde(skip)]
    pub(super) ready: Ready,
    pub(super) consumers: Consumers,
    /// Log indexes of the live messages that are not in `ready`'s never-delivered queue (held
    /// by consumers, returned, rejected): with that queue's front, they give the release
    /// cursor in O(log n). Rebuilt on restore, not stored.
    #[serde(skip)]
    pub(super) delivered: BTreeSet<u64>,
    pub(super) next_msg_id: MsgId,
    pub(super) last_applied: u64,
    /// The highest index enqueued so far: a rejected message goes behind it.
    pub(super) last_enqueued: u64,
    /// When a consumer last came or went or a basic.get ran (x-expires).
    pub(super) last_active_ms: u64,
    /// The last sequence number applied of each publishing channel, as rabbit_fifo's
    /// enqueuers: a publish proposed again (its member resends what a leader change may have
    /// dropped) is applied once. Gone with the channel (`ChannelDown`), not with its node: a
    /// node cut off and back keeps its publishers' numbering.
    #[serde(default, with = "super::snapshot::pairs")]
    pub(super) enqueuers: BTreeMap<PublisherId, u64>,
    /// Dead letters of an at-least-once queue waiting for their targets' confirms; their
    /// indexes are in `delivered`, so the release cursor keeps their bodies.
    #[serde(default)]
    pub(super) discards: Discards,
    /// x-overflow=reject-publish refuses publishes from when the queue went over its limit
    /// until it is back to 80 % of it ([`QuorumQueue::refuses`]), as rabbit_fifo's soft limit.
    #[serde(default)]
    pub(super) refusing: bool,
}

impl QuorumQueue {
    /// A new, empty queue. `created_ms` is the declare's time (the same on every member).
    pub fn new(config: QuorumConfig, created_ms: u64) -> Self {
        QuorumQueue {
            config,
            ready: Ready::default(),
            consumers: Consumers::default(),
            delivered: BTreeSet::new(),
            next_msg_id: 1,
            last_applied: 0,
            last_enqueued: 0,
            last_active_ms: created_ms,
            enqueuers: BTreeMap::new(),
            discards: Discards::default(),
            refusing: false,
        }
    }

    /// Applies the entry at `index`; indexes increase from one call to the next.
    pub fn apply(&mut self, index: u64, command: Command) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.apply_into(index, command, &mut effects);
        effects
    }

    /// [`Self::apply`] into a buffer the caller reuses.
    pub fn apply_into(&mut self, index: u64, command: Command, effects: &mut Vec<Effect>) {
        assert!(
            index > self.last_applied,
            "entries are applied once, in log order: {index} after {}",
            self.last_applied
        );
        self.last_applied = index;
        let now = command.now_ms;
        self.expire_heads(now, effects);
        match command.op {
            Op::Enqueue {
                publisher,
                seq,
                header,
                payload: _,
            } => self.enqueue(index, now, publisher, seq, header, effects),
            Op::Checkout { consumer, spec } => self.checkout(now, consumer, spec, effects),
            Op::Cancel { consumer } => self.cancel(now, &consumer),
            Op::ChannelDown { node, channel } => {
                self.enqueuers
                    .remove(&PublisherId::new(node.as_str(), channel));
                self.drop_consumers(
                    now,
                    |c| c.node == node && c.channel == channel,
                    false,
                    effects,
                )
            }
            Op::Settle { consumer, msg_ids } => self.settle(&consumer, msg_ids),
            Op::Return {
                consumer,
                msg_ids,
                rejected,
            } => self.give_back(&consumer, msg_ids, rejected, effects),
            Op::Discard { consumer, msg_ids } => self.discard(&consumer, msg_ids, effects),
            Op::SettleDeadLetters { ids } => {
                for id in ids {
                    if let Some(d) = self.discards.settle(id) {
                        self.delivered.remove(&d.index);
                    }
                }
            }
            Op::Credit { consumer, credit } => {
                if let Some(c) = self.consumers.get_mut(&consumer) {
                    c.spec.credit = credit;
                }
            }
            Op::Dequeue {
                node,
                channel,
                no_ack,
            } => self.dequeue(now, ConsumerId::get(node, channel), no_ack, effects),
            Op::Purge => {
                let purged = self.ready.take_all();
                for m in &purged {
                    self.delivered.remove(&m.index);
                }
                effects.push(Effect::Purged {
                    count: purged.len() as u64,
                });
            }
            Op::NodeDown { node } => self.drop_consumers(now, |c| c.node == node, true, effects),
            Op::Tick => {}
        }
        self.deliver(now, effects);
    }

    // ---- commands ----------------------------------------------------------------------

    fn enqueue(
        &mut self,
        index: u64,
        now: u64,
        publisher: Option<PublisherId>,
        seq: u64,
        header: EnqueueHeader,
        effects: &mut Vec<Effect>,
    ) {
        if let Some(p) = &publisher {
            // A repeat of a publish applied already: its confirm went out then. A number
            // skipped (its proposal lost) is not waited for: the publisher's member nacks it
            // when it sees a later one confirmed, so a publish is never applied twice.
            match self.enqueuers.get_mut(p) {
                Some(last) if seq <= *last => return,
                Some(last) => *last = seq,
                None => {
                    self.enqueuers.insert(p.clone(), seq);
                }
            }
        }
        if self.config.overflow == OverflowMode::RejectPublish && self.refuses(header.size_bytes) {
            if let Some(publisher) = publisher {
                effects.push(Effect::Reject { publisher, seq });
            }
            return;
        }
        let ttl_ms = match (self.config.message_ttl_ms, header.ttl_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_enqueued = index;
        // Dead from publish + TTL on, so a TTL of 0 is not dead at its own entry: a
        // consumer waiting now still gets it, and it goes below if none did.
        let expires_at_ms = ttl_ms.map(|t| now.saturating_add(t.max(1)));
        self.ready.push_enqueued(
            Msg::new(index, header.size_bytes, expires_at_ms),
            header.high_priority,
        );
        if let Some(publisher) = publisher {
            effects.push(Effect::Confirm { publisher, seq });
        }
        self.deliver(now, effects);
        if ttl_ms == Some(0) {
            if let Some(m) = self.ready.pop_enqueued_if(index) {
                self.dead(m, DeadLetterReason::Expired, effects);
            }
        }
        self.drop_head_over_limit(effects);
    }

    fn checkout(
        &mut self,
        now: u64,
        consumer: ConsumerId,
        spec: ConsumerSpec,
        effects: &mut Vec<Effect>,
    ) {
        if consumer.is_get() {
            effects.push(Effect::CheckoutRefused {
                consumer,
                error: AmqpError::precondition("an empty consumer tag names basic.get"),
            });
            return;
        }
        let mut others = self
            .consumers
            .service()
            .iter()
            .filter(|id| **id != consumer)
            .peekable();
        let exclusive_in_use = others.peek().is_some()
            && (spec.exclusive || others.any(|id| self.consumers.all[id].spec.exclusive));
        if exclusive_in_use {
            effects.push(Effect::CheckoutRefused {
                consumer,
                error: AmqpError::access_refused(format!(
                    "{} in exclusive use",
                    self.config.resource()
                )),
            });
            return;
        }
        self.last_active_ms = now;
        self.consumers.subscribe(consumer, spec);
    }

    /// basic.cancel: out of the round robin (the next consumer takes over on a
    /// single-active-consumer queue); it stays while it holds messages.
    fn cancel(&mut self, now: u64, consumer: &ConsumerId) {
        if consumer.is_get() || self.consumers.get(consumer).is_none() {
            return;
        }
        self.last_active_ms = now;
        self.consumers.unsubscribe(consumer);
        self.consumers.remove_if_done(consumer);
    }

    /// Removes the consumers `which` picks and returns what they held, in delivery order, as
    /// a closed channel's messages come back (behind earlier returns). `notify`: tell the
    /// consumers still subscribed that they were cancelled.
    fn drop_consumers(
        &mut self,
        now: u64,
        which: impl Fn(&ConsumerId) -> bool,
        notify: bool,
        effects: &mut Vec<Effect>,
    ) {
        let ids: Vec<ConsumerId> = self
            .consumers
            .all
            .keys()
            .filter(|id| which(id))
            .cloned()
            .collect();
        if ids.is_empty() {
            return;
        }
        self.last_active_ms = now;
        let mut held: Vec<(MsgId, Msg)> = Vec::new();
        for id in ids {
            let c = self.consumers.remove(&id).expect("listed above");
            if notify && c.status == Status::Up && !id.is_get() {
                effects.push(Effect::ConsumerCancelled { consumer: id });
            }
            held.extend(c.checked_out);
        }
        held.sort_unstable_by_key(|(id, _)| *id);
        for (_, m) in held {
            self.return_one(m, false, effects);
        }
    }

    fn settle(&mut self, consumer: &ConsumerId, msg_ids: Vec<MsgId>) {
        for m in self.take_checked_out(consumer, msg_ids) {
            self.delivered.remove(&m.index);
        }
    }

    fn give_back(
        &mut self,
        consumer: &ConsumerId,
        msg_ids: Vec<MsgId>,
        rejected: bool,
        effects: &mut Vec<Effect>,
    ) {
        for m in self.take_checked_out(consumer, msg_ids) {
            self.return_one(m, rejected, effects);
        }
    }

    fn discard(&mut self, consumer: &ConsumerId, msg_ids: Vec<MsgId>, effects: &mut Vec<Effect>) {
        for m in self.take_checked_out(consumer, msg_ids) {
            self.dead(m, DeadLetterReason::Rejected, effects);
        }
    }

    fn dequeue(&mut self, now: u64, holder: ConsumerId, no_ack: bool, effects: &mut Vec<Effect>) {
        if self.config.single_active_consumer {
            effects.push(Effect::GetRefused {
                error: AmqpError::resource_locked(format!(
                    "cannot obtain access to locked {}. basic.get operations are not \
                     supported by quorum queues with single active consumer",
                    self.config.resource()
                )),
                consumer: holder,
            });
            return;
        }
        self.last_active_ms = now;
        let Some(m) = self.ready.pop() else {
            effects.push(Effect::GetEmpty { consumer: holder });
            return;
        };
        let msg_id = self.next_msg_id;
        self.next_msg_id += 1;
        if no_ack {
            self.delivered.remove(&m.index);
        } else {
            self.delivered.insert(m.index);
            // A holder is a consumer nobody subscribed: it receives nothing by itself and
            // goes once it holds nothing.
            let c = self
                .consumers
                .all
                .entry(holder.clone())
                .or_insert(Consumer {
                    spec: ConsumerSpec::default(),
                    status: Status::Cancelled,
                    checked_out: Default::default(),
                });
            c.checked_out.insert(msg_id, m);
        }
        effects.push(Effect::Got {
            consumer: holder,
            msg_id,
            index: m.index,
            redelivered: m.redelivered(),
            delivery_count: m.delivery_count,
            settled: no_ack,
            remaining: self.ready.len() as u64,
        });
    }

    // ---- what the commands share -------------------------------------------------------

    /// The consumer's messages among `msg_ids` (unknown ids are ignored: the server checked
    /// the delivery tags, and a message may have gone back since, e.g. by a node down),
    /// in id order; a cancelled consumer left with nothing goes.
    fn take_checked_out(&mut self, consumer: &ConsumerId, mut msg_ids: Vec<MsgId>) -> Vec<Msg> {
        let Some(c) = self.consumers.get_mut(consumer) else {
            return Vec::new();
        };
        msg_ids.sort_unstable();
        msg_ids.dedup();
        let taken = msg_ids
            .iter()
            .filter_map(|id| c.checked_out.remove(id))
            .collect();
        self.consumers.remove_if_done(consumer);
        taken
    }

    /// A delivered message comes back, counted as a delivery (rabbit_fifo's return_one);
    /// past the delivery limit it is dead-lettered instead.
    fn return_one(&mut self, mut m: Msg, rejected: bool, effects: &mut Vec<Effect>) {
        m.delivery_count = m.delivery_count.saturating_add(1);
        if self
            .config
            .delivery_limit
            .is_some_and(|l| m.delivery_count as u64 > l)
        {
            self.dead(m, DeadLetterReason::DeliveryLimit, effects);
            return;
        }
        if rejected {
            self.ready.push_rejected(self.last_enqueued, m);
        } else {
            self.ready.push_return(m);
        }
        // As warren's single-node queue (and rabbit_amqqueue_process's requeue_and_run).
        self.drop_head_over_limit(effects);
    }

    /// Hands ready messages to consumers with credit, expiring dead heads on the way.
    fn deliver(&mut self, now: u64, effects: &mut Vec<Effect>) {
        loop {
            self.expire_heads(now, effects);
            if self.ready.is_empty() {
                return;
            }
            let Some(id) = self.consumers.pick(self.config.single_active_consumer) else {
                return;
            };
            let m = self.ready.pop().expect("not empty");
            let msg_id = self.next_msg_id;
            self.next_msg_id += 1;
            let c = self.consumers.get_mut(&id).expect("picked");
            let settled = c.spec.no_ack;
            if settled {
                self.delivered.remove(&m.index);
            } else {
                c.checked_out.insert(msg_id, m);
                self.delivered.insert(m.index);
            }
            effects.push(Effect::Deliver {
                consumer: id,
                msg_id,
                index: m.index,
                redelivered: m.redelivered(),
                delivery_count: m.delivery_count,
                settled,
            });
        }
    }

    fn expire_heads(&mut self, now: u64, effects: &mut Vec<Effect>) {
        while self.ready.peek().is_some_and(|m| m.expired(now)) {
            let m = self.ready.pop().expect("peeked");
            self.dead(m, DeadLetterReason::Expired, effects);
        }
    }

    /// Whether a publish of `size_bytes` finds the queue over its limit: already over
    /// x-max-length (so it may hold one more than the limit), or over x-max-length-bytes
    /// with it, as warren's single-node quorum queue and RabbitMQ 3.10. Dead letters still
    /// waiting for their targets count, as rabbit_fifo counts its dead-letter backlog.
    fn over_limit(&self, size_bytes: u32) -> bool {
        let len = self.ready.len() + self.discards.len();
        let bytes = self.ready.bytes() + self.discards.bytes();
        let len_over = self.config.max_length.is_some_and(|max| len as u64 > max);
        let bytes_over = self
            .config
            .max_length_bytes
            .is_some_and(|max| bytes + size_bytes as u64 > max);
        len_over || bytes_over
    }

    /// Whether a reject-publish queue refuses a publish of `size_bytes`: one that does not
    /// fit ([`QuorumQueue::over_limit`]), and, once the queue is over a limit, every one until
    /// it is back to 80 % of it, as RabbitMQ's quorum queues (a queue at its limit does not
    /// take one more each time a consumer makes room for one).
    fn refuses(&mut self, size_bytes: u32) -> bool {
        if self.refusing && self.within_soft_limit() {
            self.refusing = false;
        }
        let len = (self.ready.len() + self.discards.len()) as u64;
        let bytes = self.ready.bytes() + self.discards.bytes();
        if self.config.max_length.is_some_and(|max| len > max)
            || self.config.max_length_bytes.is_some_and(|max| bytes > max)
        {
            self.refusing = true;
        }
        self.refusing || self.over_limit(size_bytes)
    }

    /// At most 80 % of x-max-length and of x-max-length-bytes (rounded down, as rabbit_fifo).
    fn within_soft_limit(&self) -> bool {
        let len = (self.ready.len() + self.discards.len()) as u64;
        let bytes = self.ready.bytes() + self.discards.bytes();
        self.config.max_length.is_none_or(|max| len <= max * 4 / 5)
            && self
                .config
                .max_length_bytes
                .is_none_or(|max| bytes <= max * 4 / 5)
    }

    fn drop_head_over_limit(&mut self, effects: &mut Vec<Effect>) {
        if self.config.overflow != OverflowMode::DropHead {
            return;
        }
        loop {
            let over = self
                .config
                .max_length
                .is_some_and(|max| self.ready.len() as u64 > max)
                || self
                    .config
                    .max_length_bytes
                    .is_some_and(|max| self.ready.bytes() > max);
            if !over {
                return;
            }
            let Some(m) = self.ready.pop() else { return };
            self.dead(m, DeadLetterReason::MaxLen, effects);
        }
    }

    /// The message leaves the queue for `reason`; an at-least-once queue keeps it among its
    /// discards until its dead-letter targets confirm it.
    fn dead(&mut self, m: Msg, reason: DeadLetterReason, effects: &mut Vec<Effect>) {
        if self.config.dead_letter_exchange && self.config.dead_letter_at_least_once {
            self.delivered.insert(m.index);
            let id = self.discards.hold(Discard {
                index: m.index,
                size_bytes: m.size_bytes,
                reason,
                delivery_count: m.delivery_count,
            });
            effects.push(Effect::DeadLetter {
                index: m.index,
                reason,
                delivery_count: m.delivery_count,
                held: Some(id),
            });
            return;
        }
        self.delivered.remove(&m.index);
        effects.push(if self.config.dead_letter_exchange {
            Effect::DeadLetter {
                index: m.index,
                reason,
                delivery_count: m.delivery_count,
                held: None,
            }
        } else {
            Effect::Dropped {
                index: m.index,
                reason,
            }
        });
    }
}
