//! A cluster's topology: a change is proposed to the replicated metadata (the cluster's Raft
//! group), applied by [`Broker::execute`] on every node by the metadata group's thread, and
//! answered from this node's application once the running nodes applied it too
//! ([`crate::peers::execute_everywhere`]): a client told declare-ok through one node finds the
//! exchange through any other at once. What the change writes is in the Raft log already; the
//! group's thread journals nothing.
//!
//! [`Broker::execute`]: warren_broker::broker::Broker::execute

use super::{Answer, Topology};
use std::sync::Arc;
use warren_broker::command::Command;
use warren_cluster::Cluster;

pub struct Raft {
    pub cluster: Arc<Cluster>,
}

impl Topology for Raft {
    fn change(&self, command: Command) -> Answer {
        let cluster = self.cluster.clone();
        Box::pin(async move { crate::peers::execute_everywhere(&cluster, command).await })
    }
}
