//! Asking other nodes: where a queue's node is and whether it is up, a request to one node or
//! to every running one, and waiting for the running nodes to have applied a metadata change
//! made through this one.

use crate::Shared;
use std::sync::Arc;
use warren_broker::error::AmqpError;
use warren_cluster::messaging::{Messaging, Request, Response};
use warren_cluster::Cluster;
use warren_protocol::constants::NOT_FOUND;

/// How long a queue's node may take to apply a declare made through another node before the
/// declare-ok goes out anyway (a node that far behind is likely being cut off).
pub const CATCH_UP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How many times a declare waits [`CATCH_UP_TIMEOUT`] for the queue's node to apply it.
const CATCH_UP_ATTEMPTS: usize = 4;

/// The error RabbitMQ gives for a queue whose node is down.
pub fn home_node_down(node: &str, queue: &str, vhost: &str) -> AmqpError {
    AmqpError::new(
        NOT_FOUND,
        format!(
            "home node '{node}' of durable queue '{queue}' in vhost '{vhost}' is down or inaccessible"
        ),
    )
}

/// The cluster peer hosting a queue, if it is up; the 404 RabbitMQ sends if it is not.
pub fn reachable_home(
    shared: &Shared,
    node: &str,
    queue: &str,
    vhost: &str,
) -> Result<u64, AmqpError> {
    let cluster = shared
        .cluster
        .as_ref()
        .expect("remote queues exist in clusters");
    match cluster.member_id(node) {
        Some(peer) if cluster.is_node_running(node) == Some(true) => Ok(peer),
        _ => Err(home_node_down(node, queue, vhost)),
    }
}

/// Sends `request` to every other running node at once; the answers that came within
/// `timeout`, in the members' order. A node that does not answer in time is left out: a
/// listing or a count should not hang on a node being cut off.
pub async fn ask_running_peers(
    cluster: &Cluster,
    request: Request,
    timeout: std::time::Duration,
) -> Vec<Response> {
    let me = cluster.node_id();
    let asks: Vec<_> = cluster
        .status()
        .members
        .into_iter()
        .filter(|m| m.id != me && m.running)
        .map(|m| {
            let messaging = cluster.messaging().clone();
            let request = request.clone();
            tokio::spawn(async move {
                tokio::time::timeout(timeout, call(&messaging, m.id, request)).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(asks.len());
    for ask in asks {
        if let Ok(Ok(Ok(answer))) = ask.await {
            answers.push(answer);
        }
    }
    answers
}

/// Sends `request` to `peer` and waits for the answer (for requests no delivery follows).
pub async fn call(
    messaging: &Arc<Messaging>,
    peer: u64,
    request: Request,
) -> Result<Response, AmqpError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    messaging.call(
        peer,
        request,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.await.unwrap_or_else(|_| {
        Err(AmqpError::new(
            warren_protocol::constants::INTERNAL_ERROR,
            "the request to another node was dropped",
        ))
    })
}

/// After a declare of a queue placed on `peer`: waits until `peer` has applied it (so the
/// client's next consume or publish finds the queue there, as in RabbitMQ, where the queue's
/// node creates it before declare-ok), then asks it the queue's counts (`declare`, a passive
/// declare request) for the declare-ok. Zero counts if it does not answer.
pub async fn declared_there(cluster: &Arc<Cluster>, peer: u64, declare: Request) -> (u32, u32) {
    caught_up(cluster, peer, cluster.applied_index()).await;
    match call(cluster.messaging(), peer, declare).await {
        Ok(Response::Declared {
            messages,
            consumers,
        }) => (messages, consumers),
        _ => (0, 0),
    }
}

/// Waits until `peer` has applied the metadata log up to `index` (false: it did not say so in
/// time). A peer slow to apply (a loaded machine) answers that it has not caught up yet: asked
/// again, rather than an answer going out before the change is there (a declare-ok before the
/// queue exists: the client's next passive declare got 404 from it).
async fn caught_up(cluster: &Arc<Cluster>, peer: u64, index: u64) -> bool {
    for _ in 0..CATCH_UP_ATTEMPTS {
        if let Ok(Response::Done) =
            call(cluster.messaging(), peer, Request::Applied { index }).await
        {
            return true;
        }
    }
    false
}

/// Replicates a topology change (a declare, bind or delete) and answers it once every running
/// node has applied it, as RabbitMQ's metadata store commits on every running node: a client
/// told declare-ok through one node finds the exchange or queue through any other at once.
/// Answered after a majority alone, a passive declare through another node right after got 404
/// in about 3 % of tries on a 3-node cluster on loopback. A node that lags more than
/// [`CATCH_UP_TIMEOUT`] is not waited for longer: it is likely being cut off.
pub async fn execute_everywhere(
    cluster: &Arc<Cluster>,
    command: warren_broker::command::Command,
) -> Result<warren_broker::command::Outcome, AmqpError> {
    let outcome = cluster.execute(command).await?;
    let _ = tokio::time::timeout(CATCH_UP_TIMEOUT, applied_everywhere(cluster)).await;
    Ok(outcome)
}

/// After a metadata change made through this node: waits until every other running node has
/// applied it too, so that what it does to the queues those nodes host (a policy's limits,
/// its dead-lettering) is in place when the change is answered, as with RabbitMQ, whose
/// metadata store commits on every running node. Without it, a client that cleared a policy
/// through one node and then published found the old limit still applied on the queue's node.
/// A node down or cut off is not waited for: it applies the change when it is back.
pub async fn applied_everywhere(cluster: &Arc<Cluster>) {
    let index = cluster.applied_index();
    let me = cluster.node_id();
    let peers: Vec<u64> = cluster
        .status()
        .members
        .iter()
        .filter(|m| m.running && m.id != me)
        .map(|m| m.id)
        .collect();
    let asks = peers.into_iter().map(|peer| {
        let cluster = cluster.clone();
        async move { caught_up(&cluster, peer, index).await }
    });
    crate::queue_stats::futures_join(asks).await;
}
