//! A cluster's topology: a change is proposed to the replicated metadata (the cluster's Raft
//! group), applied by [`Broker::execute`] on every node by the metadata group's thread, and
//! answered from this node's application once the running nodes applied it too
//! ([`crate::peers::execute_everywhere`]): a client told declare-ok through one node finds the
//! exchange through any other at once. What the change writes is in the Raft log already; the
//! group's thread journals nothing.
//!
//! A queue declare is placed first ([`super::placement`]): the node hosting the queue and a
//! quorum queue's members go into the command, so every node applies the same declare. Its
//! declare-ok counts what the queue holds where it lives (its quorum replica here, or its node).
//!
//! [`Broker::execute`]: warren_broker::broker::Broker::execute

use super::{placement, Answer, Topology};
use crate::Shared;
use std::sync::Arc;
use warren_broker::command::{Command, Outcome};
use warren_broker::error::AmqpError;
use warren_cluster::Cluster;

pub struct Raft {
    pub shared: Arc<Shared>,
    pub cluster: Arc<Cluster>,
}

impl Topology for Raft {
    fn change(&self, command: Command) -> Answer {
        let (shared, cluster) = (self.shared.clone(), self.cluster.clone());
        Box::pin(async move {
            match command {
                Command::QueueDeclare { .. } => declare(&shared, &cluster, command).await,
                command => crate::peers::execute_everywhere(&cluster, command).await,
            }
        })
    }

    fn is_replicated(&self) -> bool {
        true
    }
}

/// A queue declare: placed unless its node is named already, proposed, then counted where the
/// queue lives.
async fn declare(
    shared: &Shared,
    cluster: &Arc<Cluster>,
    mut command: Command,
) -> Result<Outcome, AmqpError> {
    let Command::QueueDeclare {
        vhost,
        conn,
        name,
        exclusive,
        arguments,
        node,
        members,
        ..
    } = &mut command
    else {
        return crate::peers::execute_everywhere(cluster, command).await;
    };
    if node.is_empty() {
        let (home, quorum_size) =
            placement::queue_placement(shared, cluster, arguments, *exclusive)?;
        if let Some(size) = quorum_size {
            let drained: Vec<String> = cluster
                .status()
                .members
                .into_iter()
                .filter(|m| m.draining)
                .map(|m| m.name)
                .collect();
            *members = placement::members(&home, cluster.voter_names().await, size, &drained)?;
        }
        *node = home;
    }
    let (vhost_name, queue, conn) = (vhost.clone(), name.clone(), *conn);
    let mut outcome = crate::peers::execute_everywhere(cluster, command).await?;
    let Outcome::QueueDeclared(ok) = &mut outcome else {
        return Ok(outcome);
    };
    let Some(vhost) = shared.broker.vhost(&vhost_name) else {
        return Ok(outcome);
    };
    let log = vhost.lock().expect("vhost lock").quorum_log(&queue);
    if let Some(info) =
        log.and_then(|l| shared.quorum.replica(warren_cluster::replicas::group_id(l)))
    {
        use std::sync::atomic::Ordering::Relaxed;
        ok.message_count = info.ready.load(Relaxed).min(u32::MAX as u64) as u32;
        ok.consumer_count = info.consumers.load(Relaxed) as u32;
        return Ok(outcome);
    }
    let home = vhost.lock().expect("vhost lock").remote_home(&queue);
    let peer =
        home.and_then(|home| crate::peers::reachable_home(shared, &home, &queue, &vhost_name).ok());
    if let Some(peer) = peer {
        let (messages, consumers) = crate::peers::declared_there(
            cluster,
            peer,
            warren_cluster::messaging::Request::Declare {
                vhost: vhost_name,
                conn,
                queue,
            },
        )
        .await;
        ok.message_count = messages;
        ok.consumer_count = consumers;
    }
    Ok(outcome)
}
