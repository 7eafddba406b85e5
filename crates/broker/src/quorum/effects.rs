//! Effects: what applying a command asks the world to do. Every member computes the same
//! effects from the same entry; each node executes those addressed to it (a delivery to a
//! consumer on that node, a confirm to a publisher on it), so a message body is read from the
//! local copy of the log and never crosses the network to reach its consumer.

use super::command::{ConsumerId, MsgId, PublisherId};
use super::dead_letters::DeadLetterId;
use crate::error::AmqpError;
use serde::{Deserialize, Serialize};

/// Why a message left the queue without being consumed; the `x-death` reason RabbitMQ gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeadLetterReason {
    /// Its TTL ran out at the head of the queue.
    Expired,
    /// Dropped from the head of a drop-head queue over x-max-length(-bytes).
    MaxLen,
    /// basic.nack/reject without requeue.
    Rejected,
    /// Returned more often than x-delivery-limit allows.
    DeliveryLimit,
}

impl DeadLetterReason {
    /// The reason's text in `x-death` and `x-first-death-reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::MaxLen => "maxlen",
            DeadLetterReason::Rejected => "rejected",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// Effects are not stored: a member that restarts applies the log again and gets them again
/// (so a delivery may repeat after a restart or a leader change, as in RabbitMQ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send the message at log `index` to `consumer` (run by the member on the consumer's
    /// node). `settled`: the consumer is no-ack, so the queue already forgot the message.
    Deliver {
        consumer: ConsumerId,
        msg_id: MsgId,
        index: u64,
        redelivered: bool,
        /// x-delivery-count: 0 the first time, +1 per return.
        delivery_count: u32,
        settled: bool,
    },
    /// basic.get-ok for the channel named by `consumer` ([`ConsumerId::get`]).
    Got {
        consumer: ConsumerId,
        msg_id: MsgId,
        index: u64,
        redelivered: bool,
        delivery_count: u32,
        settled: bool,
        /// Ready messages left, for get-ok's message-count.
        remaining: u64,
    },
    /// basic.get-empty.
    GetEmpty { consumer: ConsumerId },
    /// basic.get refused with a channel error (405 RESOURCE_LOCKED on a
    /// single-active-consumer queue, as RabbitMQ 3.10).
    GetRefused {
        consumer: ConsumerId,
        error: AmqpError,
    },
    /// The publish is in the queue (or was dropped by its drop-head limit, which RabbitMQ
    /// confirms too): basic.ack to the publisher.
    Confirm { publisher: PublisherId, seq: u64 },
    /// The queue is over its limit with x-overflow reject-publish: basic.nack.
    Reject { publisher: PublisherId, seq: u64 },
    /// Dead-letter the message at `index` (the queue has a dead-letter exchange; the leader
    /// publishes it). `held`: the queue is at-least-once and keeps the message under this id
    /// until `Op::SettleDeadLetters` names it, so the leader publishes it with confirms.
    DeadLetter {
        index: u64,
        reason: DeadLetterReason,
        delivery_count: u32,
        held: Option<DeadLetterId>,
    },
    /// The message at `index` left for `reason` and the queue has no dead-letter exchange:
    /// nothing to publish, only counters to keep.
    Dropped {
        index: u64,
        reason: DeadLetterReason,
    },
    /// queue.purge-ok's message-count.
    Purged { count: u64 },
    /// The queue dropped the consumer (its node went down): basic.cancel to the client if
    /// its channel is still there.
    ConsumerCancelled { consumer: ConsumerId },
    /// basic.consume refused with a channel error (403 ACCESS_REFUSED for exclusive use).
    CheckoutRefused {
        consumer: ConsumerId,
        error: AmqpError,
    },
}
