//! Quorum queues in a cluster: a queue replicated by its own Raft group, whose state machine
//! is the broker's [`warren_broker::quorum::QuorumQueue`], run by every member alike.
//!
//! The map:
//! - `member`: the [`crate::queues::QueueBackend`] of a queue this node is a member of: each
//!   method a request to the group.
//! - [`client`]: how a request reaches the group (proposed through this node's member, which
//!   raft-rs forwards to the leader) and how its answer comes back: the [`client::Wait`]ers a
//!   replica resolves, publish numbering for confirms, batched settles.
//! - [`replica`]: this node's replica under the group: applies each committed entry to the
//!   state machine and carries out the effects addressed here (deliveries, replies, confirms,
//!   dead letters as the leader); `bodies`: the message bodies it keeps in memory so a consumer
//!   that fell behind is not served from disk.
//! - `dead_letters`: the leader's at-least-once dead-letter publisher.
//! - [`peers`]: the member's side for nodes that are no members: their forwarded publishes and
//!   stand-in consumers become requests to the group like a local channel's.
//!
//! A request flows: `amqp::channel` -> `member` -> `client::request` -> the
//! cluster's groups loop (raft-rs, the shared WAL) -> committed on a majority -> `replica`
//! applies it on every member -> the effect for this node resolves the `Wait` or writes to the
//! client's connection. A publish needs no waiter: its confirm is the group's answer, counted by
//! [`crate::durability`].

mod bodies;
pub mod client;
mod dead_letters;
mod member;
pub mod peers;
pub mod replica;

pub(crate) use member::QuorumMember;
