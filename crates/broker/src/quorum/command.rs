//! Commands: what a member of the queue's Raft group applies, one per committed log entry.
//!
//! A command is a log entry, so it is a value (serde) and carries everything the state machine
//! may depend on, the time included: `now_ms` is the proposing leader's clock, so a TTL
//! expires at the same entry on every member, whatever each member's own clock says.

use super::dead_letters::DeadLetterId;
use serde::{Deserialize, Serialize};

/// A message's id within its queue: assigned by the state machine when it hands the message
/// to a consumer (or to a basic.get), increasing across all consumers, so the order of ids is
/// the order of deliveries. The server maps it to its channel's delivery tag.
pub type MsgId = u64;

/// Most message ids one settle, return or discard may name: a `basic.ack multiple` covering
/// more is split by the proposer, so one log entry stays small.
pub const MSG_IDS_PER_COMMAND_MAX: usize = 8192;

/// A consumer: a channel's consumer tag on a node. `tag` is never empty for a consumer made
/// by `Checkout`; the empty tag names the channel's basic.get holder ([`ConsumerId::get`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ConsumerId {
    pub node: String,
    pub channel: u64,
    pub tag: String,
}

impl ConsumerId {
    pub fn new(node: impl Into<String>, channel: u64, tag: impl Into<String>) -> Self {
        ConsumerId {
            node: node.into(),
            channel,
            tag: tag.into(),
        }
    }

    /// The holder of a channel's unacknowledged basic.get messages: settles, returns and
    /// discards of those messages name it, like any consumer.
    pub fn get(node: impl Into<String>, channel: u64) -> Self {
        ConsumerId::new(node, channel, "")
    }

    pub fn is_get(&self) -> bool {
        self.tag.is_empty()
    }
}

/// A publishing channel, for its confirms.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PublisherId {
    pub node: String,
    pub channel: u64,
}

impl PublisherId {
    pub fn new(node: impl Into<String>, channel: u64) -> Self {
        PublisherId {
            node: node.into(),
            channel,
        }
    }
}

/// What the state machine needs to know of a published message; the message itself (exchange,
/// routing key, properties, body) is the entry's payload, opaque here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EnqueueHeader {
    /// The body's size, which x-max-length-bytes counts (as RabbitMQ counts payload bytes).
    pub size_bytes: u32,
    /// The message's own TTL (its `expiration` property, already validated by the proposer);
    /// the queue's x-message-ttl applies too, the shorter wins.
    pub ttl_ms: Option<u64>,
    /// A `priority` property above 4: RabbitMQ 4's quorum queues serve such messages ahead of
    /// the others, two to one.
    #[serde(default)]
    pub high_priority: bool,
}

/// A consumer's settings at basic.consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConsumerSpec {
    /// How many unsettled messages it may hold (its prefetch); 0 means no limit.
    pub credit: u32,
    /// `x-priority`: consumers of the highest priority with credit are served first.
    pub priority: i32,
    /// Messages are settled as they are delivered (basic.consume no-ack).
    pub no_ack: bool,
    pub exclusive: bool,
}

/// One log entry of the queue's group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// The leader's clock when it proposed the command, in the broker's milliseconds.
    pub now_ms: u64,
    pub op: Op,
}

impl Command {
    pub fn new(now_ms: u64, op: Op) -> Self {
        Command { now_ms, op }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// A publish routed to the queue. `publisher` is set when the channel is in confirm mode:
    /// it then gets `Confirm` or `Reject` for `seq` (its delivery tag for confirms).
    Enqueue {
        publisher: Option<PublisherId>,
        seq: u64,
        header: EnqueueHeader,
        /// The message as the server stores it, read back by whoever delivers it from the
        /// log entry at the message's index; the state machine never looks inside.
        #[serde(with = "payload_bytes")]
        payload: bytes::Bytes,
    },
    /// basic.consume; a consumer that exists already gets the new settings.
    Checkout {
        consumer: ConsumerId,
        spec: ConsumerSpec,
    },
    /// basic.cancel: no more deliveries. As in AMQP (and rabbit_fifo's `cancel`), what it
    /// holds stays unsettled until its channel acks, rejects or closes.
    Cancel { consumer: ConsumerId },
    /// The channel closed: every consumer of the channel (and its basic.get holder) goes,
    /// and everything they held is returned, as rabbit_fifo does when a channel process dies.
    ChannelDown { node: String, channel: u64 },
    /// basic.ack.
    Settle {
        consumer: ConsumerId,
        msg_ids: Vec<MsgId>,
    },
    /// Back to the queue, counted as a delivery: `rejected` for basic.nack/reject with
    /// requeue (to the back of the queue), otherwise basic.recover (behind earlier returns).
    Return {
        consumer: ConsumerId,
        msg_ids: Vec<MsgId>,
        rejected: bool,
    },
    /// basic.nack/reject without requeue: dead-lettered with reason `rejected`.
    Discard {
        consumer: ConsumerId,
        msg_ids: Vec<MsgId>,
    },
    /// The leader published these dead letters of an at-least-once queue and every queue they
    /// were routed to confirmed them: the queue lets them go.
    SettleDeadLetters { ids: Vec<DeadLetterId> },
    /// basic.qos changed the consumer's prefetch.
    Credit { consumer: ConsumerId, credit: u32 },
    /// basic.get on `channel` of `node`.
    Dequeue {
        node: String,
        channel: u64,
        no_ack: bool,
    },
    /// queue.purge: every ready message goes; delivered ones stay with their consumers.
    Purge,
    /// The node is gone: its consumers are dropped and what they held returns.
    NodeDown { node: String },
    /// Nothing but time: expires messages whose TTL ran out at the head of the queue. The
    /// leader proposes one when [`super::QuorumQueue::next_expiry_ms`] has passed.
    Tick,
}

/// A payload as bytes in whatever format carries the command (one length-prefixed run in a
/// binary format, not a list of numbers), without `bytes`' serde feature.
mod payload_bytes {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let v: Vec<u8> = Vec::deserialize(d)?;
        Ok(Bytes::from(v))
    }
}
