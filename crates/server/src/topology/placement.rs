//! Where a new queue lives in a cluster: the node hosting it (RabbitMQ's queue leader
//! locators, client-local and balanced) and a quorum queue's members; and the storage log id
//! the proposer picks for it, so every node applies the same declare alike.

use crate::Shared;
use warren_broker::error::AmqpError;

/// Where a new queue lives: the node hosting it (a quorum queue's first leader) by its
/// `x-queue-leader-locator` (or classic `x-queue-master-locator`), else the node's
/// `queue_leader_locator`; and for a quorum queue, how many members it gets,
/// `x-quorum-initial-group-size` (default 3, or every node if fewer), chosen by
/// [`members`] once the member table names the voters; for a stream, `x-initial-cluster-size`
/// members (default: every node, as RabbitMQ). An exclusive queue lives with its
/// connection, as in RabbitMQ.
pub(crate) fn queue_placement(
    shared: &Shared,
    cluster: &warren_cluster::Cluster,
    arguments: &amq_protocol_types::FieldTable,
    exclusive: bool,
) -> Result<(String, Option<usize>), AmqpError> {
    let home = queue_home(shared, cluster, arguments, exclusive)?;
    let queue_type = arguments
        .inner()
        .get("x-queue-type")
        .and_then(warren_broker::args::string);
    if queue_type.as_deref() == Some("stream") {
        // RabbitMQ's default: a member on every node; more than there are means every node.
        let size = arguments
            .inner()
            .get("x-initial-cluster-size")
            .and_then(warren_broker::args::integer)
            .filter(|n| *n > 0)
            .map_or(usize::MAX, |n| n as usize);
        return Ok((home, Some(size)));
    }
    if queue_type.as_deref() != Some("quorum") {
        return Ok((home, None));
    }
    let size = arguments
        .inner()
        .get("x-quorum-initial-group-size")
        .and_then(warren_broker::args::integer)
        .filter(|n| *n > 0)
        .unwrap_or(3) as usize;
    Ok((home, Some(size)))
}

/// The node a new queue will live on (see [`queue_placement`]). `balanced`
/// picks the running node hosting the fewest queues while there are under 1,000, at
/// random above (counting is then not worth its cost), as RabbitMQ does.
fn queue_home(
    shared: &Shared,
    cluster: &warren_cluster::Cluster,
    arguments: &amq_protocol_types::FieldTable,
    exclusive: bool,
) -> Result<String, AmqpError> {
    let mut locator = shared.config.queue_leader_locator;
    for key in ["x-queue-leader-locator", "x-queue-master-locator"] {
        if let Some(v) = arguments.inner().get(key) {
            let name = warren_broker::args::string(v).unwrap_or_default();
            locator = crate::node::config::QueueLocator::parse(&name).ok_or_else(|| {
                AmqpError::precondition(format!(
                    "invalid arg '{key}' for queue: \"{name}\" is not a known locator"
                ))
            })?;
        }
    }
    // A node in maintenance mode hosts no new queue while another can (RabbitMQ's drain);
    // an exclusive queue lives with its connection wherever that is.
    let local_serves = !cluster.is_draining();
    if exclusive || locator == crate::node::config::QueueLocator::ClientLocal && local_serves {
        return Ok(cluster.node_name().to_string());
    }
    let running: Vec<String> = cluster
        .status()
        .members
        .into_iter()
        .filter(|m| m.running && m.voter && m.amqp.is_some() && !m.draining)
        .map(|m| m.name)
        .collect();
    if running.is_empty() {
        return Ok(cluster.node_name().to_string());
    }
    let mut counts = std::collections::HashMap::new();
    for (_, v) in shared.broker.vhosts() {
        v.lock()
            .expect("vhost lock")
            .count_queues_by_home(&mut counts);
        if counts.values().sum::<usize>() >= BALANCED_COUNT_MAX {
            return Ok(running[rand::random::<usize>() % running.len()].clone());
        }
    }
    let fewest = running
        .iter()
        .min_by_key(|n| (counts.get(*n).copied().unwrap_or(0), rand::random::<u8>()))
        .expect("not empty");
    Ok(fewest.clone())
}

/// Above this many queues, balanced placement picks a node at random (RabbitMQ's threshold).
const BALANCED_COUNT_MAX: usize = 1000;

/// A new queue's storage log id: random and odd (even ids are the cluster's own logs).
pub(crate) fn rand_log_id() -> u64 {
    rand::random::<u64>() | 1
}

/// A quorum queue's `size` members among `voters` (the names the replicated member table
/// holds): the home first, then the nodes after it in name order, wrapping, so members of
/// successive queues spread like their leaders; nodes in maintenance mode (`drained`) last,
/// so they are members only when there are too few others. Refused when the table does not
/// name the home: no node could open that replica.
pub(crate) fn members(
    home: &str,
    mut voters: Vec<String>,
    size: usize,
    drained: &[String],
) -> Result<Vec<String>, AmqpError> {
    voters.sort();
    let Some(start) = voters.iter().position(|n| n == home) else {
        return Err(AmqpError::new(
            warren_protocol::constants::INTERNAL_ERROR,
            format!(
                "cannot place the quorum queue: node '{home}' is not in the cluster's member \
                 table yet (a node just started registers once it sees a leader)"
            ),
        ));
    };
    voters.rotate_left(start);
    // Stable: the home stays first, the order after it stays the name order.
    voters[1..].sort_by_key(|n| drained.contains(n));
    voters.truncate(size.max(1));
    Ok(voters)
}

#[cfg(test)]
mod tests {
    use super::members;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn members_start_at_the_home_and_wrap_in_name_order() {
        let voters = names(&["n3", "n1", "n2"]);
        assert_eq!(
            members("n2", voters.clone(), 3, &[]).unwrap(),
            names(&["n2", "n3", "n1"])
        );
        assert_eq!(
            members("n3", voters.clone(), 2, &[]).unwrap(),
            names(&["n3", "n1"])
        );
        assert_eq!(
            members("n1", voters, 5, &[]).unwrap(),
            names(&["n1", "n2", "n3"])
        );
    }

    #[test]
    fn nodes_in_maintenance_are_members_only_when_too_few_others() {
        let voters = names(&["n1", "n2", "n3", "n4"]);
        let drained = names(&["n2"]);
        assert_eq!(
            members("n1", voters.clone(), 3, &drained).unwrap(),
            names(&["n1", "n3", "n4"])
        );
        assert_eq!(
            members("n1", voters, 4, &drained).unwrap(),
            names(&["n1", "n3", "n4", "n2"])
        );
    }

    #[test]
    fn a_home_the_member_table_does_not_name_is_refused() {
        // Just after the cluster formed: node-2's registration not applied yet.
        let refused = members("n2", names(&["n1", "n3"]), 3, &[]).unwrap_err();
        assert!(refused
            .text
            .contains("'n2' is not in the cluster's member table"));
    }
}
