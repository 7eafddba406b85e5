//! Topology changes (exchanges, queues, bindings) by one path: a channel or the management API
//! decides everything a change needs (names, the declaring connection, the queue's node and
//! log), puts it in a [`Command`] and hands it to [`Topology::change`]. [`Broker::execute`]
//! applies it, on this node alone or on every node of the cluster, and the answer comes from
//! that application.
//!
//! The map:
//! - [`journal`]: a single node: the command is applied here and what it made durable is
//!   written to the metadata journal before it is answered.
//! - [`raft`]: a cluster: the command is proposed to the replicated metadata and answered once
//!   this node applied it (and the running nodes caught up), as RabbitMQ's metadata store does;
//!   [`placement`]: which node hosts a new queue, and a quorum queue's members, decided before
//!   a declare is proposed.
//! - [`proposal`]: a connection waiting on a change (or a queue's node) before its next frame,
//!   and the `-ok` it writes from the outcome.
//!
//! [`of`] is the one place that asks whether there is a cluster. [`deleted_here`]: the queues a
//! vhost deleted on its own (auto-delete, expiry, owner gone), deleted everywhere by the same
//! path.
//!
//! [`Broker::execute`]: warren_broker::broker::Broker::execute

pub mod journal;
pub mod placement;
pub mod proposal;
pub mod raft;

use crate::Shared;
use std::sync::Arc;
use warren_broker::command::Command;
use warren_broker::queue::ConnId;

/// A topology change's outcome, awaited by whoever asked: a connection reads no further frame
/// until it resolves (AMQP's synchronous methods keep their order).
pub type Answer = proposal::Answer;

/// Where topology changes are made durable and applied.
pub trait Topology: Send + Sync {
    /// Applies `command` and answers with its outcome: the refusal every node's broker found
    /// (406 inequivalent arguments, 404 no exchange) or what it did (declare-ok's counts).
    fn change(&self, command: Command) -> Answer;

    /// Whether a change is committed by a majority of the cluster's nodes: a failed one may
    /// then be a majority not reached, which may yet take it (the management API answers 503),
    /// rather than this node unable to write it (500).
    fn is_replicated(&self) -> bool;
}

/// The node's topology: Raft in a cluster, the journal on a single node.
pub fn of(shared: &Arc<Shared>) -> Box<dyn Topology> {
    match &shared.cluster {
        Some(cluster) => Box::new(raft::Raft {
            shared: shared.clone(),
            cluster: cluster.clone(),
        }),
        None => Box::new(journal::Journal {
            shared: shared.clone(),
        }),
    }
}

/// Queues a vhost of this node deleted on its own (auto-delete, x-expires, an exclusive owner
/// gone), made a topology change like any other: a [`Command::QueueDelete`] each, so that
/// every node of a cluster deletes them too; in the background, as no client waits on it.
/// A vhost reports them in a cluster only: on a single node its deletion is the change, and
/// the journal has it already.
pub fn deleted_here(shared: &Arc<Shared>, vhost: &str, deleted: Vec<(String, ConnId)>) {
    let topology = of(shared);
    for (name, conn) in deleted {
        let answer = topology.change(Command::QueueDelete {
            vhost: vhost.to_string(),
            conn,
            name,
        });
        tokio::spawn(async move {
            if let Err(e) = answer.await {
                tracing::warn!(error = %e.text, "queue not deleted cluster-wide");
            }
        });
    }
}
