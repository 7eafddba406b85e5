//! What the server and the management API read of a queue's state, without changing it.
//! Every member answers alike, so a node can answer from its own copy.

use super::command::{ConsumerId, MsgId};
use super::config::QuorumConfig;
use super::consumer::{Consumer, Status};
use super::dead_letters::{DeadLetterId, Discard};
use super::messages::Msg;
use super::state::QuorumQueue;

impl QuorumQueue {
    pub fn config(&self) -> &QuorumConfig {
        &self.config
    }

    /// The index of the last entry applied (a snapshot taken now covers the log up to it).
    pub fn last_applied(&self) -> u64 {
        self.last_applied
    }

    /// The lowest log index a live message still needs: every entry below it holds no live
    /// message, so once a snapshot at any applied index at or past `cursor - 1` is durable,
    /// the log below the cursor may be released. With no live message it is the entry after
    /// the last applied one.
    pub fn release_cursor(&self) -> u64 {
        let lowest = [
            self.ready.first_enqueued_index(),
            self.delivered.first().copied(),
        ]
        .into_iter()
        .flatten()
        .min();
        lowest.unwrap_or(self.last_applied + 1)
    }

    /// Messages ready for delivery (queue.declare-ok's message-count).
    pub fn ready_count(&self) -> u64 {
        self.ready.len() as u64
    }

    pub fn ready_bytes(&self) -> u64 {
        self.ready.bytes()
    }

    /// Ready messages in the order they will be served.
    pub fn ready(&self) -> impl Iterator<Item = &Msg> + '_ {
        self.ready.iter()
    }

    /// Dead letters of an at-least-once queue waiting for their targets' confirms, in the
    /// order they died: a new leader publishes them again.
    pub fn discards(&self) -> impl Iterator<Item = (DeadLetterId, &Discard)> + '_ {
        self.discards.iter()
    }

    pub fn dead_letter(&self, id: DeadLetterId) -> Option<&Discard> {
        self.discards.get(id)
    }

    /// How many dead letters wait, and their bytes (RabbitMQ's `messages_dlx`).
    pub fn discards_count(&self) -> (u64, u64) {
        (self.discards.len() as u64, self.discards.bytes())
    }

    /// Messages delivered and not yet settled, basic.get ones included.
    pub fn checked_out_count(&self) -> u64 {
        self.consumers
            .all
            .values()
            .map(|c| c.checked_out.len() as u64)
            .sum()
    }

    /// Subscribed consumers (queue.declare-ok's consumer-count): not the cancelled ones
    /// still holding messages, nor basic.get holders.
    pub fn consumer_count(&self) -> u64 {
        self.consumers.service().len() as u64
    }

    /// Every consumer, subscribed or cancelled but holding messages, and basic.get holders
    /// (an empty tag), in id order.
    pub fn consumers(&self) -> impl Iterator<Item = (&ConsumerId, &Consumer)> + '_ {
        self.consumers.all.iter()
    }

    pub fn consumer(&self, id: &ConsumerId) -> Option<&Consumer> {
        self.consumers.get(id)
    }

    /// Whether the message enqueued at `index` waits in the queue, never delivered yet (a
    /// member may keep its body in memory until it is).
    pub fn waits_undelivered(&self, index: u64) -> bool {
        self.ready.has_enqueued(index)
    }

    /// Whether `consumer` still holds `msg_id` unsettled. A member that applies a delivery
    /// late (it was stopped, or behind) and a later entry in the same round that took the
    /// message back (the node was declared down, the channel closed) must not hand it to the
    /// client: another consumer has it by now, and the client could not settle it.
    pub fn holds(&self, consumer: &ConsumerId, msg_id: MsgId) -> bool {
        self.consumers
            .get(consumer)
            .is_some_and(|c| c.checked_out.contains_key(&msg_id))
    }

    /// The consumer receiving messages on a single-active-consumer queue.
    pub fn active_consumer(&self) -> Option<&ConsumerId> {
        if !self.config.single_active_consumer {
            return None;
        }
        self.consumers.active()
    }

    /// When the message at the head of the queue expires: the leader proposes a `Tick` then
    /// (only the head is looked at, as in RabbitMQ: a message behind one with a longer TTL
    /// waits for it).
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.ready.peek()?.expires_at_ms()
    }

    /// Since when the queue has had no consumer and no basic.get (for x-expires), or None
    /// while a consumer is subscribed.
    pub fn unused_since_ms(&self) -> Option<u64> {
        let used = self.consumers.all.values().any(|c| c.status == Status::Up);
        (!used).then_some(self.last_active_ms)
    }
}
