//! Quorum queues in a cluster, the client's side: what a channel asks of a queue's Raft group
//! and how the answer comes back.
//!
//! Everything a channel does to a quorum queue is a proposal to its group (see
//! `docs/quorum-queues.md`): a publish is `Enqueue`, basic.consume `Checkout`, an ack `Settle`.
//! This node's member hands the proposal to raft-rs, which forwards it to the leader. The
//! answer is an effect of the committed entry, carried out by this node's replica
//! ([`crate::quorum_replica`]) when it applies it: a confirm advances the publishing channel's
//! stream (see [`crate::durability::Durability::quorum_next`]), a checkout writes consume-ok and
//! then the deliveries, a dequeue basic.get-ok. Requests that wait for their entry (consume,
//! cancel, get, purge) are [`Wait`]ers the replica resolves; an idempotent one is proposed
//! again if its entry does not come back (a leader change may drop a proposal).

use crate::Shared;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use warren_broker::error::AmqpError;
use warren_broker::message::MessageRef;
use warren_broker::queue::ChannelKey;
use warren_broker::quorum::{
    Command, ConsumerId, EnqueueHeader, Op, PublisherId, MSG_IDS_PER_COMMAND_MAX,
};
use warren_broker::relay::{Delivery, QuorumTarget, RemoteEffect, SettleOp};
use warren_broker::vhost::VHost;
use warren_cluster::groups::{Input, Proposed};
use warren_cluster::replicas::group_id;
use warren_protocol::method::Method;

/// How long a request waits for its entry before it is proposed again.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long a request waits in all before the channel gets an error.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// A request waiting for its entry to be applied on this node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Wait {
    Checkout {
        group: u64,
        channel: ChannelKey,
        tag: String,
    },
    Cancel {
        group: u64,
        channel: ChannelKey,
        tag: String,
    },
    Get {
        group: u64,
        channel: ChannelKey,
    },
    /// A transaction's settlement (`Settle`, `Return` or `Discard`), named by its consumer and
    /// the first message id it settles.
    Settle {
        group: u64,
        channel: ChannelKey,
        tag: String,
        first: u64,
    },
}

/// What the replica does for a resolved waiter: `on_applied` (the reply, written to the
/// channel or sent to the client's node in order with the deliveries that follow), then the
/// answer the channel task waits for.
pub struct Waiter {
    pub on_applied: Option<OnApplied>,
    pub answer: oneshot::Sender<Result<(), AmqpError>>,
}

/// Runs in the replica under the vhost lock when the request's entry is applied; a stand-in's
/// basic.get gets the message it took.
pub type OnApplied = Box<dyn FnOnce(&VHost, Option<Delivery>) + Send>;

/// A reply written to a channel of this node once the request is applied.
pub fn write_reply(channel: ChannelKey, reply: Method) -> OnApplied {
    Box::new(move |v: &VHost, _| {
        if let Some((number, outbox)) = v.channel_outbox(channel) {
            outbox.push(|b| reply.encode(number, b));
        }
    })
}

/// A replica's figures, kept by the replica as it applies, read by declare-ok, the management
/// API and the sweeps without touching the replica.
#[derive(Default)]
pub struct ReplicaInfo {
    pub vhost: String,
    pub queue: String,
    pub ready: AtomicU64,
    pub ready_bytes: AtomicU64,
    pub unacked: AtomicU64,
    pub consumers: AtomicU64,
    pub is_leader: AtomicBool,
    /// When the head's TTL runs out (unix ms), `u64::MAX` if never.
    pub next_expiry_ms: AtomicU64,
    /// The (node, channel) of every consumer and basic.get holder, for the sweeps that end
    /// those of closed channels and dead nodes.
    pub holders: Mutex<Vec<(String, u64)>>,
    /// `message_stats`: publish, deliver_get, redeliver, ack, as applied here.
    pub stats: [AtomicU64; 4],
}

impl ReplicaInfo {
    /// The queue's figures as the management API shows them. Every ready message counts as
    /// paged out: the replica keeps no body in memory, only its log index.
    pub fn counts(&self, vhost: &str, name: &str) -> warren_cluster::messaging::QueueCounts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        warren_cluster::messaging::QueueCounts {
            vhost: vhost.to_string(),
            name: name.to_string(),
            messages_ready: get(&self.ready),
            messages_unacknowledged: get(&self.unacked),
            message_bytes_ready: get(&self.ready_bytes),
            messages_paged_out: get(&self.ready),
            consumers: get(&self.consumers),
            message_stats: [
                get(&self.stats[0]),
                get(&self.stats[1]),
                get(&self.stats[2]),
                get(&self.stats[3]),
            ],
        }
    }
}

/// This node's quorum queue requests and replicas.
#[derive(Default)]
pub struct QuorumQueues {
    waiters: Mutex<HashMap<Wait, Waiter>>,
    purges: Mutex<HashMap<u64, VecDeque<oneshot::Sender<u32>>>>,
    replicas: Mutex<HashMap<u64, Arc<ReplicaInfo>>>,
}

/// The clock commands carry: unix milliseconds, alike on every node (TTLs are compared
/// against it on every member).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl QuorumQueues {
    pub fn add_replica(&self, group: u64, info: Arc<ReplicaInfo>) {
        self.replicas
            .lock()
            .expect("replicas lock")
            .insert(group, info);
    }

    pub fn remove_replica(&self, group: u64) {
        self.replicas.lock().expect("replicas lock").remove(&group);
    }

    pub fn replica(&self, group: u64) -> Option<Arc<ReplicaInfo>> {
        self.replicas
            .lock()
            .expect("replicas lock")
            .get(&group)
            .cloned()
    }

    pub fn replicas(&self) -> Vec<(u64, Arc<ReplicaInfo>)> {
        self.replicas
            .lock()
            .expect("replicas lock")
            .iter()
            .map(|(g, r)| (*g, r.clone()))
            .collect()
    }

    /// The waiter for `wait`, once (a repeated entry finds none).
    pub fn take_waiter(&self, wait: &Wait) -> Option<Waiter> {
        self.waiters.lock().expect("waiters lock").remove(wait)
    }

    pub fn take_purge_waiter(&self, group: u64) -> Option<oneshot::Sender<u32>> {
        self.purges
            .lock()
            .expect("purges lock")
            .get_mut(&group)?
            .pop_front()
    }
}

/// This node's name in the cluster (consumer and publisher ids name it).
pub fn me(shared: &Shared) -> String {
    shared
        .cluster
        .as_ref()
        .map(|c| c.node_name().to_string())
        .unwrap_or_default()
}

/// Hands an entry to the queue's group through this node's member.
pub fn propose(shared: &Shared, group: u64, command: &Command, done: Option<Proposed>) {
    let Some(cluster) = &shared.cluster else {
        return;
    };
    if shared.quorum.replica(group).is_none() {
        if let Some(done) = done {
            done(Err("this node holds no replica of the queue".into()));
        }
        return;
    }
    cluster.queue_groups().send(Input::Propose {
        group,
        data: command.encode(),
        done,
    });
}

fn op(op: Op) -> Command {
    Command::new(unix_now_ms(), op)
}

/// Proposes a publish to each of `queues`; returns the (pseudo log, seq) a confirm of
/// `publisher`'s waits on, one per queue.
pub fn publish(
    shared: &Shared,
    queues: Vec<QuorumTarget>,
    message: &MessageRef,
    publisher: Option<ChannelKey>,
) -> Vec<(u64, u64)> {
    let mut waits = Vec::new();
    let payload = warren_broker::message::encode_stored(message, 0);
    let header = EnqueueHeader {
        size_bytes: message.body.len() as u32,
        ttl_ms: message.expiration_ms,
    };
    let me = me(shared);
    for q in queues {
        let group = group_id(q.log);
        let (id, seq, done) = match publisher {
            Some(channel) => {
                let (log, seq) = shared.durability.quorum_next(channel, group);
                waits.push((log, seq));
                let durability = shared.durability.clone();
                let done: Proposed = Box::new(move |r: Result<(), String>| {
                    if r.is_err() {
                        durability.quorum_abandon(group, Some(channel), seq);
                    }
                });
                (Some(PublisherId::new(me.clone(), channel)), seq, Some(done))
            }
            None => (None, 0, None),
        };
        let command = op(Op::Enqueue {
            publisher: id,
            seq,
            header,
            payload: payload.clone(),
        });
        propose(shared, group, &command, done);
    }
    waits
}

/// Proposes the settlement of deliveries of a quorum queue (acks, requeues, discards).
pub fn settle(
    shared: &Shared,
    log: u64,
    channel: ChannelKey,
    consumer_tag: &Bytes,
    settle: SettleOp,
    msg_ids: Vec<u64>,
) {
    for (wait, command) in settle_commands(shared, log, channel, consumer_tag, settle, msg_ids) {
        if let Wait::Settle { group, .. } = wait {
            propose(shared, group, &command, None);
        }
    }
}

/// The commands settling `msg_ids` (at most [`MSG_IDS_PER_COMMAND_MAX`] each), with the
/// [`Wait`] that names each.
fn settle_commands(
    shared: &Shared,
    log: u64,
    channel: ChannelKey,
    consumer_tag: &Bytes,
    settle: SettleOp,
    msg_ids: Vec<u64>,
) -> Vec<(Wait, Command)> {
    let tag = String::from_utf8_lossy(consumer_tag).into_owned();
    let consumer = ConsumerId::new(me(shared), channel, tag.clone());
    let group = group_id(log);
    msg_ids
        .chunks(MSG_IDS_PER_COMMAND_MAX)
        .map(|ids| {
            let wait = Wait::Settle {
                group,
                channel,
                tag: tag.clone(),
                first: ids[0],
            };
            let (consumer, msg_ids) = (consumer.clone(), ids.to_vec());
            let command = op(match settle {
                SettleOp::Ack => Op::Settle { consumer, msg_ids },
                SettleOp::Requeue => Op::Return {
                    consumer,
                    msg_ids,
                    rejected: true,
                },
                SettleOp::Discard => Op::Discard { consumer, msg_ids },
            });
            (wait, command)
        })
        .collect()
}

/// A transaction's settlements of quorum queue deliveries (`RemoteEffect::QuorumSettle`s),
/// proposed and waited for until this node's replica applied each: tx.commit-ok promises the
/// acks are done, so a message acked in a committed transaction is never delivered again.
/// Settlements are idempotent (ids no longer held are ignored), so each is proposed again
/// while it does not come back, as [`request`] does.
pub async fn settle_applied(
    shared: Arc<Shared>,
    settles: Vec<RemoteEffect>,
) -> Result<(), AmqpError> {
    let mut requests = Vec::new();
    for effect in settles {
        let RemoteEffect::QuorumSettle {
            log,
            channel,
            consumer_tag,
            op,
            msg_ids,
        } = effect
        else {
            continue;
        };
        for (wait, command) in settle_commands(&shared, log, channel, &consumer_tag, op, msg_ids) {
            let Wait::Settle { group, .. } = wait else {
                continue;
            };
            requests.push(tokio::spawn(request(
                shared.clone(),
                group,
                wait,
                None,
                command,
            )));
        }
    }
    for r in requests {
        r.await.map_err(|_| unavailable())??;
    }
    Ok(())
}

/// A channel closed: its consumers of the queue go, what they held returns.
pub fn channel_down(shared: &Shared, log: u64, channel: ChannelKey) {
    let command = op(Op::ChannelDown {
        node: me(shared),
        channel,
    });
    propose(shared, group_id(log), &command, None);
}

/// Proposes `command` and waits until this node's replica applied it (the replica resolves
/// the waiter); proposed again while it does not come back (only for idempotent commands and
/// dequeues, whose repeats the replica returns).
pub async fn request(
    shared: Arc<Shared>,
    group: u64,
    wait: Wait,
    on_applied: Option<OnApplied>,
    command: Command,
) -> Result<(), AmqpError> {
    let (tx, mut rx) = oneshot::channel();
    shared.quorum.waiters.lock().expect("waiters lock").insert(
        wait.clone(),
        Waiter {
            on_applied,
            answer: tx,
        },
    );
    let started = std::time::Instant::now();
    loop {
        propose(&shared, group, &command, None);
        match tokio::time::timeout(RETRY_AFTER, &mut rx).await {
            Ok(Ok(answer)) => return answer,
            Ok(Err(_)) => return Err(unavailable()),
            Err(_) if started.elapsed() >= GIVE_UP_AFTER => {
                shared.quorum.take_waiter(&wait);
                return Err(unavailable());
            }
            Err(_) => {}
        }
    }
}

/// queue.purge: the count of the first purge this node's replica applies.
pub async fn purge(shared: Arc<Shared>, group: u64) -> Result<u32, AmqpError> {
    let (tx, rx) = oneshot::channel();
    shared
        .quorum
        .purges
        .lock()
        .expect("purges lock")
        .entry(group)
        .or_default()
        .push_back(tx);
    propose(&shared, group, &op(Op::Purge), None);
    match tokio::time::timeout(GIVE_UP_AFTER, rx).await {
        Ok(Ok(count)) => Ok(count),
        _ => Err(unavailable()),
    }
}

fn unavailable() -> AmqpError {
    AmqpError::new(
        warren_protocol::constants::INTERNAL_ERROR,
        "the quorum queue's group did not answer (no leader: a minority of its members is up?)",
    )
}

/// Commands for a consume, a cancel and a get.
pub fn checkout(
    shared: &Shared,
    channel: ChannelKey,
    tag: &str,
    spec: warren_broker::quorum::ConsumerSpec,
) -> Command {
    op(Op::Checkout {
        consumer: ConsumerId::new(me(shared), channel, tag),
        spec,
    })
}

pub fn cancel(shared: &Shared, channel: ChannelKey, tag: &str) -> Command {
    op(Op::Cancel {
        consumer: ConsumerId::new(me(shared), channel, tag),
    })
}

pub fn dequeue(shared: &Shared, channel: ChannelKey, no_ack: bool) -> Command {
    op(Op::Dequeue {
        node: me(shared),
        channel,
        no_ack,
    })
}

/// Tick, node-down and dead-channel sweeps, run every `SWEEP_INTERVAL`:
/// - a leader proposes `Tick` when its queue's head expired;
/// - a leader proposes `NodeDown` for consumers on a node the failure detector finds down
///   (what they held returns to the queue);
/// - every member proposes `ChannelDown` for consumers of its node whose channel is gone
///   (after a restart, or when a channel's own `ChannelDown` was lost with a leader).
pub async fn sweep(shared: Arc<Shared>) {
    let Some(cluster) = shared.cluster.clone() else {
        return;
    };
    let me = me(&shared);
    let mut t = tokio::time::interval(SWEEP_INTERVAL);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A channel seen gone in one sweep and still gone in the next: not one being opened.
    let mut suspects: Vec<(u64, u64)> = Vec::new();
    loop {
        t.tick().await;
        if *shared.shutdown.borrow() {
            return;
        }
        let now = unix_now_ms();
        let mut next_suspects = Vec::new();
        for (group, info) in shared.quorum.replicas() {
            let exists = shared.broker.vhost(&info.vhost).is_some_and(|v| {
                v.lock().expect("vhost lock").quorum_log(&info.queue) == Some(group - 1)
            });
            if !exists {
                shared.quorum.remove_replica(group);
                continue;
            }
            let leader = info.is_leader.load(Ordering::Relaxed);
            if leader && info.next_expiry_ms.load(Ordering::Relaxed) <= now {
                propose(&shared, group, &op(Op::Tick), None);
            }
            let holders = info.holders.lock().expect("holders lock").clone();
            if holders.is_empty() {
                continue;
            }
            let mut down_nodes: Vec<&str> = Vec::new();
            for (node, channel) in &holders {
                if *node == me {
                    let live = shared
                        .broker
                        .vhost(&info.vhost)
                        .is_some_and(|v| v.lock().expect("vhost lock").has_channel(*channel));
                    if !live {
                        if suspects.contains(&(group, *channel)) {
                            channel_down_at(&shared, group, *channel);
                        } else {
                            next_suspects.push((group, *channel));
                        }
                    }
                } else if leader
                    && cluster.is_node_running(node) != Some(true)
                    && !down_nodes.contains(&node.as_str())
                {
                    down_nodes.push(node);
                }
            }
            for node in down_nodes {
                let command = op(Op::NodeDown {
                    node: node.to_string(),
                });
                propose(&shared, group, &command, None);
            }
        }
        suspects = next_suspects;
    }
}

fn channel_down_at(shared: &Shared, group: u64, channel: ChannelKey) {
    let command = op(Op::ChannelDown {
        node: me(shared),
        channel,
    });
    propose(shared, group, &command, None);
}

const SWEEP_INTERVAL: Duration = Duration::from_millis(500);
