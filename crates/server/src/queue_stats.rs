//! Queue figures for the management API, cluster-wide: only a queue's node counts its
//! messages and consumers (every node has every queue's definition), so a listing on one node
//! asks each other node for the queues it hosts, as RabbitMQ's management plugin asks each node
//! of its cluster. A node that does not answer in time leaves its queues with zero figures and
//! the state `down`.

use crate::Shared;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use warren_broker::vhost::QueueInfo;
use warren_cluster::messaging::{QueueCounts, Request, Response};

/// How long a listing waits for another node's figures: a management page should not hang on
/// a node that is slow to answer.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

type CountsByQueue = BTreeMap<(String, String), QueueCounts>;

/// A queue as the management API shows it: its definition, its node's figures, and whether
/// its node answered.
pub struct QueueView {
    pub vhost: String,
    pub info: QueueInfo,
    pub running: bool,
    /// A quorum queue's leader as a member reported it (None: ask this node's own group).
    pub leader: Option<String>,
    /// A stream's log, when it is open on this node.
    pub stream: Option<crate::queues::stream::Figures>,
}

/// The figures of the queues this node hosts and of the quorum queues it holds a replica of
/// (in `vhost`, or all).
pub fn hosted_here(shared: &Shared, vhost: Option<&str>) -> Vec<QueueCounts> {
    let me = shared.node_name();
    let mut out = Vec::new();
    for (name, v) in shared.broker.vhosts() {
        if vhost.is_some_and(|o| o != name) {
            continue;
        }
        for q in v.lock().expect("vhost lock").queue_infos() {
            // A quorum queue's figures from any replica: the asking node may hold none.
            if let Some(c) = replica_counts(shared, &name, &q) {
                out.push(c);
                continue;
            }
            if q.node.as_deref().is_some_and(|n| n != me) {
                continue;
            }
            let mut q = q;
            stream_figures(shared, &mut q);
            out.push(QueueCounts {
                vhost: name.clone(),
                name: q.name,
                messages_ready: q.messages_ready,
                messages_unacknowledged: q.messages_unacknowledged,
                message_bytes_ready: q.message_bytes_ready,
                messages_paged_out: q.messages_paged_out,
                consumers: q.consumers,
                message_stats: [
                    q.stats.publish,
                    q.stats.deliver_get,
                    q.stats.redeliver,
                    q.stats.ack,
                ],
                leader: None,
            });
        }
    }
    out
}

/// Every queue (in `vhost`, or all), with the figures of the node hosting it.
pub async fn queue_views(shared: &Shared, vhost: Option<&str>) -> Vec<QueueView> {
    let me = shared.node_name().to_string();
    let mut views = Vec::new();
    // Quorum queues whose figures this node's replica has: nothing to ask their first member.
    let mut known = std::collections::HashSet::new();
    for (name, v) in shared.broker.vhosts() {
        if vhost.is_some_and(|o| o != name) {
            continue;
        }
        for mut info in v.lock().expect("vhost lock").queue_infos() {
            if let Some(c) = replica_counts(shared, &name, &info) {
                set_counts(&mut info, &c);
                known.insert((name.clone(), info.name.clone()));
            }
            let stream = stream_figures(shared, &mut info);
            views.push(QueueView {
                vhost: name.clone(),
                info,
                running: true,
                leader: None,
                stream,
            });
        }
    }
    let Some(cluster) = &shared.cluster else {
        return views;
    };
    // The node each queue's figures are asked of: its home, or for a quorum queue a running
    // member (its home may have left its members).
    let running = |n: &str| cluster.is_node_running(n) == Some(true);
    let asked: Vec<Option<String>> = views
        .iter()
        .map(|q| {
            if known.contains(&(q.vhost.clone(), q.info.name.clone())) {
                return None;
            }
            let home = q.info.node.as_deref()?;
            let members = &q.info.members;
            if members.is_empty() || members.iter().any(|m| &**m == home) {
                return Some(home.to_string());
            }
            let member = members.iter().find(|m| running(m)).unwrap_or(&members[0]);
            Some(member.to_string())
        })
        .collect();
    let homes: Vec<String> = {
        let mut homes: Vec<String> = asked
            .iter()
            .flatten()
            .filter(|n| **n != me)
            .cloned()
            .collect();
        homes.sort_unstable();
        homes.dedup();
        homes
    };
    let asks = homes.into_iter().map(|node| {
        let messaging = cluster.messaging().clone();
        let peer = cluster
            .member_id(&node)
            .filter(|_| cluster.is_node_running(&node) == Some(true));
        let request = Request::QueueStats {
            vhost: vhost.map(str::to_string),
        };
        async move {
            let counts = match peer {
                Some(peer) => tokio::time::timeout(
                    STATS_TIMEOUT,
                    crate::peers::call(&messaging, peer, request),
                )
                .await
                .ok()
                .and_then(Result::ok),
                None => None,
            };
            (node, counts)
        }
    });
    // By node: its queues' figures by (vhost, name), or None if it did not answer.
    let mut answers: HashMap<String, Option<CountsByQueue>> = HashMap::new();
    for (node, counts) in futures_join(asks).await {
        let counts = match counts {
            Some(Response::QueueStats { queues }) => Some(
                queues
                    .into_iter()
                    .map(|c| ((c.vhost.clone(), c.name.clone()), c))
                    .collect(),
            ),
            _ => None,
        };
        answers.insert(node, counts);
    }
    for (view, node) in views.iter_mut().zip(asked) {
        let Some(node) = node else {
            continue;
        };
        let Some(answer) = answers.get(&node) else {
            continue;
        };
        match answer {
            None => view.running = false,
            Some(counts) => {
                if let Some(c) = counts.get(&(view.vhost.clone(), view.info.name.clone())) {
                    set_counts(&mut view.info, c);
                    view.leader = c.leader.clone();
                }
            }
        }
    }
    views
}

/// Runs the asks side by side, so a listing waits for the slowest node, not their sum.
/// A quorum queue's figures from this node's replica, when it holds one.
pub(crate) fn replica_counts(shared: &Shared, vhost: &str, q: &QueueInfo) -> Option<QueueCounts> {
    if q.members.is_empty() {
        return None;
    }
    let log = q.log_id?;
    let group = warren_cluster::replicas::group_id(log);
    let mut counts = shared.quorum.replica(group)?.counts(vhost, &q.name);
    counts.leader = shared.cluster.as_ref().and_then(|c| c.queue_leader(log));
    Some(counts)
}

/// A stream's figures from its log, which alone holds its messages: `messages_ready` (all
/// of them, as RabbitMQ counts a stream's) and their bytes set in `info`.
pub(crate) fn stream_figures(
    shared: &Shared,
    info: &mut QueueInfo,
) -> Option<crate::queues::stream::Figures> {
    if info.queue_type != "stream" {
        return None;
    }
    let f = crate::queues::stream::figures_of(shared, info.log_id?)?;
    info.messages_ready = f.messages;
    info.message_bytes_ready = f.bytes;
    Some(f)
}

pub(crate) fn set_counts(info: &mut QueueInfo, c: &QueueCounts) {
    info.messages_ready = c.messages_ready;
    info.messages_unacknowledged = c.messages_unacknowledged;
    info.message_bytes_ready = c.message_bytes_ready;
    info.messages_paged_out = c.messages_paged_out;
    info.consumers = c.consumers;
    let [publish, deliver_get, redeliver, ack] = c.message_stats;
    info.stats = warren_broker::queue::QueueStats {
        publish,
        deliver_get,
        redeliver,
        ack,
        ..Default::default()
    };
}

/// Runs the futures side by side; the outputs of those that did not panic.
pub(crate) async fn futures_join<F>(asks: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = asks.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(r) = h.await {
            out.push(r);
        }
    }
    out
}
