//! This node's replica of a quorum queue: the broker's queue state machine
//! ([`warren_broker::quorum::QuorumQueue`]) under the queue's Raft group
//! ([`warren_cluster::groups`]). The group applies each committed entry here, in log order, on
//! every member alike; the effects addressed to this node (deliveries to its consumers,
//! confirms to its publishers) are carried out here.
//!
//! Built so far: every member opens its replica when it applies the queue's declare, the
//! group elects a leader (shown in `/api/queues`), replicates and snapshots what is proposed,
//! and sleeps when idle. Publishes, consumers and acks still go to the queue's home node as for
//! a classic queue (docs/quorum-queues.md says what comes next).

use crate::Shared;
use std::sync::{Arc, Weak};
use warren_broker::args::QueueConfig;
use warren_broker::quorum::{Command, Effect, QuorumConfig, QuorumQueue};
use warren_cluster::groups::Machine;
use warren_cluster::replicas::QueueReplica;

pub struct Replica {
    queue: QuorumQueue,
    resource: String,
    /// Held weakly: the groups' thread must not keep the node's state alive at shutdown.
    _shared: Weak<Shared>,
}

impl Replica {
    fn carry_out(&mut self, effects: Vec<Effect>) {
        for e in effects {
            tracing::debug!(queue = %self.resource, effect = ?e, "quorum queue effect");
        }
    }
}

impl Machine for Replica {
    fn apply(&mut self, index: u64, data: bytes::Bytes) {
        match Command::decode(data) {
            Ok(command) => {
                let effects = self.queue.apply(index, command);
                self.carry_out(effects);
            }
            Err(e) => {
                tracing::error!(queue = %self.resource, index, error = %e, "unreadable quorum queue entry skipped")
            }
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        self.queue.snapshot()
    }

    fn restore(&mut self, data: &[u8]) {
        match QuorumQueue::restore(data) {
            Ok(q) => self.queue = q,
            Err(e) => {
                tracing::error!(queue = %self.resource, error = ?e, "unreadable quorum queue snapshot")
            }
        }
    }

    fn live_from(&self) -> u64 {
        self.queue.release_cursor()
    }
}

/// Makes this node open replicas of the quorum queues it is a member of.
pub fn install(shared: &Arc<Shared>) {
    let Some(cluster) = &shared.cluster else {
        return;
    };
    let weak = Arc::downgrade(shared);
    cluster.set_replica_factory(Box::new(move |r: &QueueReplica| {
        let config = weak
            .upgrade()
            .and_then(|s| queue_config(&s, &r.vhost, &r.queue))
            .unwrap_or_default();
        Box::new(Replica {
            queue: QuorumQueue::new(QuorumConfig::new(&r.vhost, &r.queue, &config), 0),
            resource: format!("queue '{}' in vhost '{}'", r.queue, r.vhost),
            _shared: weak.clone(),
        })
    }));
}

/// The queue's arguments as its declare validated them.
fn queue_config(shared: &Shared, vhost: &str, queue: &str) -> Option<QueueConfig> {
    let v = shared.broker.vhost(vhost)?;
    let config = v.lock().expect("vhost lock").queue_config(queue);
    config
}
