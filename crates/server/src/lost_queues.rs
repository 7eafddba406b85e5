//! Queues that lived in one node's memory only: its non-durable queues and its exclusive
//! queues (their owning connections were on it). When that node is gone, so are they, and
//! RabbitMQ deletes them on every other node when it sees the node go down; a client that
//! reconnects elsewhere can then declare the same names again.
//!
//! Two ways a warren node goes:
//! - It restarts: at start, before any client connects, it lists what it held in its previous
//!   life and deletes it everywhere ([`forget_previous_life`]).
//! - It stays down: the metadata group's leader deletes what it held once it has been
//!   unreachable for [`crate::node::config::ServerConfig::node_down_after_s`] ([`sweep`]). The wait
//!   is RabbitMQ's `net_ticktime` (60 s): a node paused or cut off for less keeps its queues,
//!   and its clients' exclusive queues with them. One cut off for longer finds them deleted
//!   when it rejoins, as a RabbitMQ node does after a partition.

use crate::Shared;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_broker::command::Command;

/// How often the leader looks at which nodes are down.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Deletes, on every node, the queues this node held in memory only before it restarted (see
/// `VHost::queues_of_a_previous_life`): listed now, before any client connects, and deleted in
/// the background once the cluster takes changes (retried each second until it does).
pub fn forget_previous_life(
    cluster: &Arc<warren_cluster::Cluster>,
    broker: &warren_broker::broker::Broker,
) {
    let gone = queues_held_by(broker, cluster.node_name());
    if gone.is_empty() {
        return;
    }
    tracing::info!(
        queues = gone.len(),
        "deleting the transient and exclusive queues of this node's previous run"
    );
    let cluster = cluster.clone();
    tokio::spawn(async move {
        for command in gone {
            loop {
                match delete(&cluster, command.clone()).await {
                    Deleted::Done => break,
                    Deleted::NotNow => tokio::time::sleep(SWEEP_INTERVAL).await,
                }
            }
        }
    });
}

/// While this node leads the metadata group: deletes everywhere the transient and exclusive
/// queues of nodes that have been down for `node_down_after_s`.
pub async fn sweep(shared: Arc<Shared>) {
    let Some(cluster) = shared.cluster.clone() else {
        return;
    };
    let grace = Duration::from_secs(shared.config.node_down_after_s);
    let mut down = DownNodes::default();
    let mut t = tokio::time::interval(SWEEP_INTERVAL);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        t.tick().await;
        if *shared.shutdown.borrow() {
            return;
        }
        let status = cluster.status();
        let leading = status.metadata.leader == status.id;
        let members = status
            .members
            .iter()
            .filter(|m| m.id != status.id)
            .map(|m| (m.name.as_str(), m.running));
        let gone = down.gone_for(members, Instant::now(), grace);
        // Every node tracks, so a new leader knows how long a node has been down; only the
        // leader deletes, so the deletes are not proposed once per node.
        if !leading {
            continue;
        }
        for node in gone {
            let commands = queues_held_by(&shared.broker, &node);
            if commands.is_empty() {
                continue;
            }
            tracing::warn!(
                %node,
                queues = commands.len(),
                "deleting the transient and exclusive queues of a node down for {} s",
                grace.as_secs()
            );
            for command in commands {
                if let Deleted::NotNow = delete(&cluster, command).await {
                    // No majority: the next sweep tries again.
                    break;
                }
            }
        }
    }
}

/// The deletes of the queues `node` hosts that live in its memory only.
fn queues_held_by(broker: &warren_broker::broker::Broker, node: &str) -> Vec<Command> {
    let mut gone = Vec::new();
    for (vhost, v) in broker.vhosts() {
        let v = v.lock().expect("vhost lock");
        for (name, conn) in v.queues_of_a_previous_life(node) {
            gone.push(Command::QueueDelete {
                vhost: vhost.clone(),
                conn,
                name,
            });
        }
    }
    gone
}

enum Deleted {
    /// Deleted, or nothing to delete: taken by a new connection since (405), or gone already.
    Done,
    /// The cluster takes no changes now (no majority, or no leader yet).
    NotNow,
}

async fn delete(cluster: &warren_cluster::Cluster, command: Command) -> Deleted {
    match cluster.execute(command).await {
        Err(e) if e.code == warren_protocol::constants::INTERNAL_ERROR => Deleted::NotNow,
        _ => Deleted::Done,
    }
}

/// Since when each node has been seen down, as this node sees it.
#[derive(Debug, Default)]
struct DownNodes {
    since: HashMap<String, Instant>,
}

impl DownNodes {
    /// Records which nodes are up now; the nodes down for at least `grace`, continuously.
    fn gone_for<'a>(
        &mut self,
        members: impl Iterator<Item = (&'a str, bool)>,
        now: Instant,
        grace: Duration,
    ) -> Vec<String> {
        let mut seen = HashMap::with_capacity(self.since.len());
        let mut gone = Vec::new();
        for (name, running) in members {
            if running {
                continue;
            }
            let since = self.since.get(name).copied().unwrap_or(now);
            if now.duration_since(since) >= grace {
                gone.push(name.to_string());
            }
            seen.insert(name.to_string(), since);
        }
        // A node up again, or no longer a member, starts afresh.
        self.since = seen;
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn a_node_is_gone_once_down_for_the_whole_grace_period() {
        let mut down = DownNodes::default();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        assert!(down
            .gone_for([("n2", false), ("n3", true)].into_iter(), at(0), GRACE)
            .is_empty());
        assert!(down
            .gone_for([("n2", false), ("n3", true)].into_iter(), at(59), GRACE)
            .is_empty());
        assert_eq!(
            down.gone_for([("n2", false), ("n3", true)].into_iter(), at(60), GRACE),
            ["n2"]
        );
        // Still gone at the next look (its deletes may have found no majority).
        assert_eq!(
            down.gone_for([("n2", false), ("n3", false)].into_iter(), at(61), GRACE),
            ["n2"]
        );
    }

    #[test]
    fn a_node_seen_up_in_between_starts_its_wait_again() {
        let mut down = DownNodes::default();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        down.gone_for([("n2", false)].into_iter(), at(0), GRACE);
        down.gone_for([("n2", true)].into_iter(), at(30), GRACE);
        assert!(down
            .gone_for([("n2", false)].into_iter(), at(70), GRACE)
            .is_empty());
        assert_eq!(
            down.gone_for([("n2", false)].into_iter(), at(130), GRACE),
            ["n2"]
        );
        // Forgotten (no longer a member), then back: afresh too.
        down.gone_for(std::iter::empty(), at(131), GRACE);
        assert!(down
            .gone_for([("n2", false)].into_iter(), at(132), GRACE)
            .is_empty());
    }
}
