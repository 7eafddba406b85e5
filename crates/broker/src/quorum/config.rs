//! The queue's settings the state machine obeys, fixed when the group is created and carried
//! in every snapshot, so a member restored from one behaves as the rest.

use crate::args::{Overflow, QueueConfig};
use serde::{Deserialize, Serialize};

/// What a queue does with a publish while it is over its length limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OverflowMode {
    /// Take it, then drop (dead-letter `maxlen`) from the head until under the limit.
    #[default]
    DropHead,
    /// Refuse it: the publisher gets a basic.nack.
    RejectPublish,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct QuorumConfig {
    pub vhost: String,
    pub name: String,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: OverflowMode,
    pub message_ttl_ms: Option<u64>,
    /// Returns allowed before a message is dead-lettered (`x-delivery-limit`).
    pub delivery_limit: Option<u64>,
    /// Whether dead messages go to a dead-letter exchange (`DeadLetter` effects) or are
    /// only dropped (`Dropped` effects).
    pub dead_letter_exchange: bool,
    /// `x-dead-letter-strategy=at-least-once` in force: dead letters are kept until their
    /// targets confirm them ([`super::dead_letters`]). RabbitMQ takes it only with a
    /// dead-letter exchange and x-overflow=reject-publish (drop-head would drop what it
    /// promised to keep), and falls back to at-most-once otherwise.
    #[serde(default)]
    pub dead_letter_at_least_once: bool,
    pub single_active_consumer: bool,
}

impl QuorumConfig {
    /// The settings of a declared queue. reject-publish-dlx, which quorum queues of RabbitMQ
    /// 3.10 do not take, refuses publishes like reject-publish.
    pub fn new(vhost: &str, name: &str, c: &QueueConfig) -> Self {
        let overflow = match c.overflow {
            Overflow::DropHead => OverflowMode::DropHead,
            Overflow::RejectPublish | Overflow::RejectPublishDlx => OverflowMode::RejectPublish,
        };
        QuorumConfig {
            vhost: vhost.to_string(),
            name: name.to_string(),
            max_length: c.max_length,
            max_length_bytes: c.max_length_bytes,
            overflow,
            message_ttl_ms: c.message_ttl_ms,
            delivery_limit: c.delivery_limit,
            dead_letter_exchange: c.dead_letter_exchange.is_some(),
            dead_letter_at_least_once: c.dead_letter_at_least_once
                && c.dead_letter_exchange.is_some()
                && overflow == OverflowMode::RejectPublish,
            single_active_consumer: c.single_active_consumer,
        }
    }

    /// "queue 'q' in vhost '/'", as RabbitMQ names a queue in its errors.
    pub fn resource(&self) -> String {
        format!("queue '{}' in vhost '{}'", self.name, self.vhost)
    }
}
