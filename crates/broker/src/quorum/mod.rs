//! A quorum queue as a deterministic state machine, after RabbitMQ's `rabbit_fifo`: every
//! member of the queue's Raft group applies the same committed entries to its own
//! [`QuorumQueue`] and gets the same state and the same effects. No I/O, no clock, no AMQP
//! encoding here: the server proposes [`Command`]s, applies what commits, and carries out
//! the [`Effect`]s addressed to its node.
//!
//! The map:
//! - [`codec`]: commands as log entry bytes: a compact binary enqueue whose payload is the
//!   entry's tail, JSON for the rest.
//! - [`command`]: the log entries: enqueue (with the message as an opaque payload),
//!   checkout, cancel, settle, return, discard, credit, dequeue, purge, channel and node
//!   down, tick; consumer and publisher ids.
//! - [`state`]: [`QuorumQueue`] and `apply`: expire dead heads, run the command, deliver.
//! - [`messages`]: a message as the queue keeps it (log index and a small header, never the
//!   body) and the ready messages in serving order (returns, then enqueued and rejected).
//! - [`consumer`]: consumers, their credit and unsettled messages, round robin, priorities,
//!   single active consumer.
//! - [`effects`]: deliveries, confirms and rejects, dead letters, get results, refusals.
//! - [`dead_letters`]: dead letters an at-least-once queue keeps until their targets confirm.
//! - [`config`]: the queue arguments the machine obeys.
//! - [`query`]: counts, consumers, the release cursor, the next expiry.
//! - [`snapshot`]: the state as bytes and back.
//!
//! How a publish flows: the publisher's node routes it to the queue and proposes
//! `Op::Enqueue` (header + payload) to the group's leader; once the entry commits, every
//! member applies it at its log index: the message (index and header) joins the ready queue,
//! `Effect::Confirm` goes to the publisher's node, and if a consumer has credit,
//! `Effect::Deliver` names the consumer, a message id and the index, and the member on the
//! consumer's node reads the body from its own copy of the log and sends it. The consumer's
//! ack becomes `Op::Settle` naming the message id; once no live message needs the entry
//! ([`QuorumQueue::release_cursor`]) and a snapshot covers it, the log releases it.
//!
//! Semantics are RabbitMQ 3.10's quorum queues as warren's single-node quorum queue has them
//! (and the interop suite measured against RabbitMQ): a rejected message goes to the back,
//! a recovered one behind earlier returns; every return counts towards x-delivery-count
//! and past x-delivery-limit the message is dead-lettered; x-max-length is checked against
//! the length before the publish; TTLs expire at the head, at the time in the entry.

pub mod codec;
pub mod command;
pub mod config;
pub mod consumer;
pub mod dead_letters;
pub mod effects;
pub mod messages;
pub mod query;
pub mod snapshot;
pub mod state;

pub use command::{
    Command, ConsumerId, ConsumerSpec, EnqueueHeader, MsgId, Op, PublisherId,
    MSG_IDS_PER_COMMAND_MAX,
};
pub use config::{OverflowMode, QuorumConfig};
pub use consumer::{Consumer, Status};
pub use dead_letters::{DeadLetterId, Discard};
pub use effects::{DeadLetterReason, Effect};
pub use messages::Msg;
pub use snapshot::{SnapshotError, SNAPSHOT_VERSION};
pub use state::QuorumQueue;
