//! Broker logic as plain state machines: vhosts, exchanges, bindings, queues, consumers.
//!
//! The map:
//! - [`broker`]: the node's vhosts and users.
//! - [`vhost`]: one vhost's entities and the commands on them: declare, bind, publish,
//!   consume, ack; publish routes, enqueues and dispatches to consumers in one call.
//! - [`routing`]: bindings and matching for every exchange type (O(1) bind/unbind).
//! - [`queue`]: a queue's consumers, limits and stored-message bookkeeping.
//! - [`backlog`]: a queue's ready messages by priority, with long backlogs paged to disk.
//! - [`channel`]: the consumer side of a channel: delivery tags, unacked ledger, prefetch.
//! - [`queue_type`]: what a queue's type decides (classic, quorum): its arguments, what it
//!   stores, where returns go; the vhost asks it rather than testing for a type.
//! - [`quorum`]: a replicated quorum queue as a deterministic state machine (after RabbitMQ's
//!   rabbit_fifo): log entries in, deliveries, confirms and dead letters out, alike on
//!   every member of the queue's Raft group.
//! - [`args`]: queue arguments validated as RabbitMQ validates them; [`stream_args`]: a
//!   stream's retention and segment arguments and where its consumers start (`x-stream-offset`).
//! - [`policy`]: policies and operator policies: validation, matching, and the effective
//!   queue configuration they give with the declare's arguments.
//! - [`command`]: topology changes as values, executed alike on every node of a cluster.
//! - [`definitions`]: durable-topology changes as records for the metadata journal, and replay.
//! - [`exchange`], [`message`], [`users`], [`error`].
//! - [`limits`]: vhost and user limits (connections, queues, channels) and their refusals;
//!   [`topic_permissions`]: per-exchange regular expressions over routing and binding keys.
//! - [`persistence`]: the storage work a command asks for (appends, releases), as effects.
//! - [`relay`]: messages that cross nodes in a cluster as values: forwarded publishes,
//!   deliveries to consumers connected elsewhere, their acks.
//! - [`outbox`]: where delivered frames wait for a connection's writer (or, at a low rate,
//!   are written through to the socket by the thread that made them, with a write function
//!   the server hands it); the only way this crate talks to sockets, so everything here is
//!   testable without them.

pub mod args;
pub mod backlog;
pub mod broker;
pub mod channel;
pub mod command;
pub mod definitions;
pub mod error;
pub mod exchange;
pub mod held_dead_letters;
pub mod limits;
pub mod message;
pub mod outbox;
pub mod persistence;
pub mod policy;
pub mod queue;
pub mod queue_type;
pub mod quorum;
pub mod relay;
pub mod routing;
pub mod stream_args;
pub mod topic_permissions;
pub mod users;
pub mod vhost;
