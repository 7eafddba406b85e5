//! Messages that cross nodes, as values.
//!
//! In a cluster a classic queue lives on the node that declared it, while its publishers and
//! consumers may be connected to any node (as in RabbitMQ). The vhost of each node therefore
//! speaks to the others in values, never in AMQP bytes:
//! - A publish routed (on the publisher's node, whose topology is the same as everyone's) to a
//!   queue hosted elsewhere becomes a [`RemoteEffect::Forward`] for the cluster to carry.
//! - A consumer on another node is served through a stand-in channel on the queue's node whose
//!   [`Relay`] receives each [`Delivery`] as a value; the client's node gives it a delivery tag
//!   of its own channel and encodes it there.
//! - Acks, rejects and closes of such deliveries go back as [`RemoteEffect::Settle`] and
//!   [`RemoteEffect::Close`].
//!
//! - A quorum queue (in a cluster) lives in its Raft group on each member: a publish routed to
//!   it becomes a [`RemoteEffect::Propose`], its consumers' acks [`RemoteEffect::QuorumSettle`]
//!   and a closing channel [`RemoteEffect::QuorumChannelDown`], all proposed to the group.
//!
//! The broker only produces and consumes these values; `crates/cluster` carries them and
//! `crates/server` wires the two together.

use crate::message::MessageRef;
use crate::queue::ChannelKey;
use bytes::Bytes;
use std::sync::Arc;

/// A message handed to a consumer whose client is connected to another node.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The client's channel (channel keys are unique across the cluster).
    pub channel: ChannelKey,
    /// Empty for a basic.get.
    pub consumer_tag: Bytes,
    /// The delivery tag on the queue's node: what an ack must name there.
    pub tag: u64,
    pub redelivered: bool,
    /// Nothing to settle: the message left its queue when delivered.
    pub no_ack: bool,
    /// basic.get-ok's count of messages left in the queue.
    pub message_count: u32,
    pub message: MessageRef,
    /// The properties the consumer sees (a quorum queue adds x-delivery-count).
    pub properties: Bytes,
}

/// Where a stand-in channel's deliveries go: to the node its client is connected to.
pub trait Relay: Send + Sync {
    fn deliver(&self, delivery: Delivery);
    /// The consumer was cancelled by the queue's node (the queue was deleted).
    fn cancelled(&self, channel: ChannelKey, consumer_tag: &[u8]);
    /// Too much is waiting for the client's node: dispatch holds off, as it does for a
    /// local client's full outbox.
    fn is_congested(&self) -> bool;
}

/// What to do with remote deliveries being settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOp {
    Ack,
    /// nack/reject with requeue, or basic.recover.
    Requeue,
    /// nack/reject without requeue: dead-letter or drop.
    Discard,
}

/// Work a vhost leaves for the cluster, drained with `VHost::take_remote`.
#[derive(Debug, Clone)]
pub enum RemoteEffect {
    /// Enqueue `message` in these queues of `node`, without routing it again.
    Forward {
        node: Arc<str>,
        queues: Vec<String>,
        message: MessageRef,
    },
    /// Settle deliveries of `channel`'s stand-in on `node`, by their tags there.
    Settle {
        node: Arc<str>,
        channel: ChannelKey,
        op: SettleOp,
        tags: Vec<u64>,
    },
    /// `channel` closed: its stand-in on `node` closes too (requeueing what it had out).
    Close { node: Arc<str>, channel: ChannelKey },
    /// `channel`'s channel-wide prefetch (basic.qos global) changed: its stand-in on `node`
    /// takes it at once. A per-consumer prefetch applies to later consumers only, and each
    /// remote consume carries the one in force.
    Qos {
        node: Arc<str>,
        channel: ChannelKey,
        channel_prefetch: u32,
    },
    /// Enqueue `message` in these quorum queues: one proposal to each one's group.
    Propose {
        queues: Vec<QuorumTarget>,
        message: MessageRef,
    },
    /// Settle deliveries of a quorum queue (whose storage log id is `log`) by message id.
    /// `consumer_tag` is empty for basic.get deliveries.
    QuorumSettle {
        log: u64,
        channel: ChannelKey,
        consumer_tag: Bytes,
        op: SettleOp,
        msg_ids: Vec<u64>,
    },
    /// `channel` closed: what it held of the quorum queue goes back, its consumers go.
    QuorumChannelDown { log: u64, channel: ChannelKey },
    /// Append `message` to these streams (by their storage log ids): their writers put it in
    /// their next chunk and confirm it once that chunk is synced.
    StreamAppend { logs: Vec<u64>, message: MessageRef },
    /// `count` deliveries of a stream consumer were acknowledged: its credit grows by as much.
    StreamSettle {
        log: u64,
        channel: ChannelKey,
        consumer_tag: Bytes,
        count: u32,
    },
    /// A stream consumer's channel closed: its reader stops.
    StreamCancel {
        log: u64,
        channel: ChannelKey,
        consumer_tag: Bytes,
    },
}

/// A quorum queue a message was routed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumTarget {
    pub queue: String,
    /// The queue's storage log id (its group is found from it).
    pub log: u64,
    pub members: Vec<Arc<str>>,
}
