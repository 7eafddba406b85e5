//! The AMQP 0-9-1 front end: everything between a client's socket and the queues it reaches.
//!
//! The map:
//! - [`connection`]: one client: the frame loop, closing; `frames`: each frame checked against
//!   what is expected next, methods decoded and dispatched, content assembled into a publish;
//!   `handshake`: its opening, up to connection.open-ok (SASL, tuning, the vhost and its
//!   permissions).
//! - [`channel`]: what each method on an open channel does: decoding, permission checks and
//!   RabbitMQ's reply codes, then one call to the queue's [`crate::queues`] implementation or
//!   to the vhost.
//! - `publish`: a channel's publish path: a complete publish checked, held in a transaction or
//!   routed through the vhost, returned when unroutable and mandatory, confirmed or nacked.
//! - [`access`]: where the handshake and channels enforce limits (`max-connections`,
//!   `max-channels`) and topic permissions; [`registry`]: the node's open connections, which
//!   it counts and the management API lists and closes.
//! - [`transactions`]: basic.ack / nack / reject and the tx class that holds them back.
//! - `confirms`: publisher confirms, an ack(multiple) for the longest confirmed run of a channel.
//! - [`flow`]: publisher flow control: a connection whose publishes the queues have not taken yet
//!   stops being read past a bound.
//! - [`writer`]: drains a connection's outbox into its socket, sends heartbeats.
//!
//! A publish flows: socket -> `connection` (frames, content) -> `publish` (checks, route
//! through the vhost, its appends, forwards and proposals by [`crate::queues::effects`]) ->
//! `confirms` once [`crate::durability`] says it is stored -> the outbox -> `writer` -> socket.
//! A delivery is written by whoever produced it (the vhost's dispatch, a peer's relay, a quorum
//! queue's replica) into the consumer's connection outbox, drained by its `writer`.

pub mod access;
pub mod channel;
mod confirms;
pub mod connection;
pub mod flow;
mod frames;
pub(crate) mod handshake;
mod publish;
pub mod registry;
pub mod transactions;
pub mod writer;
