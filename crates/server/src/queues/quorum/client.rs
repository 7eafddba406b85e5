//! Quorum queues in a cluster, the client's side: what a channel asks of a queue's Raft group
//! and how the answer comes back.
//!
//! Everything a channel does to a quorum queue is a proposal to its group (see
//! `docs/design/quorum-queues.md`): a publish is `Enqueue`, basic.consume `Checkout`, an ack `Settle`.
//! This node's member hands the proposal to raft-rs, which forwards it to the leader. The
//! answer is an effect of the committed entry, carried out by this node's replica
//! ([`crate::queues::quorum::replica`]) when it applies it: a confirm advances the publishing channel's
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
use warren_store::IdHashMap;

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
            leader: None,
        }
    }
}

/// This node's quorum queue requests and replicas.
#[derive(Default)]
pub struct QuorumQueues {
    waiters: Mutex<HashMap<Wait, Waiter>>,
    purges: Mutex<IdHashMap<u64, VecDeque<oneshot::Sender<u32>>>>,
    replicas: Mutex<IdHashMap<u64, Arc<ReplicaInfo>>>,
    unconfirmed: Arc<Mutex<Unconfirmed>>,
    /// Acks, nacks and rejects of quorum deliveries not proposed yet: a connection's read
    /// batch of them becomes one entry per consumer (PerfTest acks every message; one entry
    /// each would double the log). Proposed at the end of the read ([`flush_settles`]) or
    /// before anything else this node proposes, so they keep their order with it.
    settles: Mutex<Vec<PendingSettle>>,
    has_settles: AtomicBool,
    /// What the replicas keep of waiting messages' bodies, in all.
    pub body_budget: Arc<crate::queues::quorum::bodies::BodyBudget>,
    /// Dead letters of at-least-once queues this node leads, waiting for confirms.
    pub dead_letters: Arc<crate::queues::quorum::dead_letters::DeadLetters>,
}

struct PendingSettle {
    group: u64,
    consumer: ConsumerId,
    op: SettleOp,
    msg_ids: Vec<u64>,
}

/// Publishes of this node's confirming channels that their group has not applied yet, per
/// (channel, group) in sequence order: proposed again when the group's leader changes (the old
/// one may have dropped them) or when they stall, as rabbit_fifo_client resends its pending
/// commands. The group applies each sequence number once (its enqueuers), so a publish
/// proposed twice is enqueued and confirmed once; the publisher sees a pause, not a nack.
type Unconfirmed = std::collections::BTreeMap<(ChannelKey, u64), VecDeque<Unapplied>>;

struct Unapplied {
    seq: u64,
    /// The entry as proposed: proposed again as it is.
    entry: Bytes,
    /// When it was first proposed, and last.
    first: std::time::Instant,
    last: std::time::Instant,
}

/// A publish not applied this long is proposed again.
const RESEND_AFTER: Duration = Duration::from_secs(3);

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

    /// The group applied (or refused) `channel`'s publishes up to `upto`.
    pub fn publishes_applied(&self, channel: ChannelKey, group: u64, upto: u64) {
        forget_unapplied(&self.unconfirmed, channel, group, upto);
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
    propose_entry(shared, group, command.encode().into(), done);
}

/// [`propose`] of an entry already encoded (a publish, kept to propose again).
fn propose_entry(shared: &Shared, group: u64, data: Bytes, done: Option<Proposed>) {
    let Some(cluster) = &shared.cluster else {
        return;
    };
    flush_settles(shared);
    if shared.quorum.replica(group).is_none() {
        if let Some(done) = done {
            done(Err("this node holds no replica of the queue".into()));
        }
        return;
    }
    cluster
        .queue_groups()
        .send(Input::Propose { group, data, done });
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
    let header = EnqueueHeader {
        size_bytes: message.body.len() as u32,
        ttl_ms: message.expiration_ms,
        high_priority: message.priority > 4,
    };
    let me = me(shared);
    let now_ms = unix_now_ms();
    let entry = |publisher: Option<&PublisherId>, seq: u64| -> Bytes {
        let len = warren_broker::message::stored_len(message);
        Command::encode_enqueue(now_ms, publisher, seq, header, len, |out| {
            warren_broker::message::encode_stored_into(out, message, 0, None)
        })
        .into()
    };
    for q in queues {
        let group = group_id(q.log);
        let Some(channel) = publisher else {
            propose_entry(shared, group, entry(None, 0), None);
            continue;
        };
        let (log, seq) = shared.durability.quorum_next(channel, group);
        waits.push((log, seq));
        let entry = entry(Some(&PublisherId::new(me.clone(), channel)), seq);
        let now = std::time::Instant::now();
        shared
            .quorum
            .unconfirmed
            .lock()
            .expect("unconfirmed lock")
            .entry((channel, group))
            .or_default()
            .push_back(Unapplied {
                seq,
                entry: entry.clone(),
                first: now,
                last: now,
            });
        propose_entry(
            shared,
            group,
            entry,
            Some(refuse_on_error(shared, channel, group, seq)),
        );
    }
    waits
}

/// A publish the group would not take (no leader in time, no replica here any more) is
/// nacked.
fn refuse_on_error(shared: &Shared, channel: ChannelKey, group: u64, seq: u64) -> Proposed {
    let durability = shared.durability.clone();
    let unconfirmed = shared.quorum.unconfirmed.clone();
    Box::new(move |r: Result<(), String>| {
        if r.is_err() {
            durability.quorum_abandon(group, Some(channel), seq);
            forget_unapplied(&unconfirmed, channel, group, seq);
        }
    })
}

fn forget_unapplied(unconfirmed: &Mutex<Unconfirmed>, channel: ChannelKey, group: u64, upto: u64) {
    let mut u = unconfirmed.lock().expect("unconfirmed lock");
    if let Some(q) = u.get_mut(&(channel, group)) {
        while q.front().is_some_and(|p| p.seq <= upto) {
            q.pop_front();
        }
        if q.is_empty() {
            u.remove(&(channel, group));
        }
    }
}

/// Proposes again what this node's channels published to `group` and did not see applied:
/// its leader changed, and the old one may have dropped it.
pub fn resend_unapplied(shared: &Shared, group: u64) {
    let now = std::time::Instant::now();
    let again: Vec<(ChannelKey, u64, Bytes)> = {
        let mut u = shared.quorum.unconfirmed.lock().expect("unconfirmed lock");
        u.iter_mut()
            .filter(|((_, g), _)| *g == group)
            .flat_map(|((channel, _), q)| {
                q.iter_mut().map(move |p| {
                    p.last = now;
                    (*channel, p.seq, p.entry.clone())
                })
            })
            .collect()
    };
    for (channel, seq, entry) in again {
        propose_entry(
            shared,
            group,
            entry,
            Some(refuse_on_error(shared, channel, group, seq)),
        );
    }
}

/// Publishes that stalled: proposed again after [`RESEND_AFTER`], nacked after
/// [`GIVE_UP_AFTER`] (confirms may pause, never lie).
fn resend_stalled(shared: &Shared) {
    let now = std::time::Instant::now();
    let mut again = Vec::new();
    let mut refused = Vec::new();
    {
        let mut u = shared.quorum.unconfirmed.lock().expect("unconfirmed lock");
        u.retain(|&(channel, group), q| {
            let mut upto = 0;
            while q.front().is_some_and(|p| now - p.first >= GIVE_UP_AFTER) {
                upto = q.pop_front().expect("checked").seq;
            }
            if upto > 0 {
                refused.push((channel, group, upto));
            }
            if q.front().is_some_and(|p| now - p.last >= RESEND_AFTER) {
                for p in q.iter_mut() {
                    p.last = now;
                    again.push((channel, group, p.seq, p.entry.clone()));
                }
            }
            !q.is_empty()
        });
    }
    for (channel, group, upto) in refused {
        shared.durability.quorum_abandon(group, Some(channel), upto);
    }
    for (channel, group, seq, entry) in again {
        propose_entry(
            shared,
            group,
            entry,
            Some(refuse_on_error(shared, channel, group, seq)),
        );
    }
}

/// A channel that published to quorum queues closed: nothing waits for its publishes any
/// more, and its groups forget its numbering (`ChannelDown`).
pub fn publisher_closed(shared: &Shared, channel: ChannelKey, groups: &[u64]) {
    if groups.is_empty() {
        return;
    }
    {
        let mut u = shared.quorum.unconfirmed.lock().expect("unconfirmed lock");
        for group in groups {
            u.remove(&(channel, *group));
        }
    }
    for group in groups {
        channel_down_at(shared, *group, channel);
    }
}

/// Settles deliveries of a quorum queue (acks, requeues, discards): proposed with the rest
/// of the connection's read ([`flush_settles`]).
pub fn settle(
    shared: &Shared,
    log: u64,
    channel: ChannelKey,
    consumer_tag: &Bytes,
    settle: SettleOp,
    msg_ids: Vec<u64>,
) {
    let group = group_id(log);
    let consumer = ConsumerId::new(
        me(shared),
        channel,
        String::from_utf8_lossy(consumer_tag).into_owned(),
    );
    let mut pending = shared.quorum.settles.lock().expect("settles lock");
    match pending
        .iter_mut()
        .rev()
        .find(|p| p.group == group && p.consumer == consumer)
    {
        Some(p) if p.op == settle => p.msg_ids.extend(msg_ids),
        // A different settlement of the same consumer goes after it, in order.
        _ => pending.push(PendingSettle {
            group,
            consumer,
            op: settle,
            msg_ids,
        }),
    }
    shared.quorum.has_settles.store(true, Ordering::Release);
}

/// Proposes the settlements gathered since the last call, one entry per consumer and kind
/// (at most [`MSG_IDS_PER_COMMAND_MAX`] ids each).
pub fn flush_settles(shared: &Shared) {
    if !shared.quorum.has_settles.swap(false, Ordering::AcqRel) {
        return;
    }
    let Some(cluster) = &shared.cluster else {
        return;
    };
    let pending = std::mem::take(&mut *shared.quorum.settles.lock().expect("settles lock"));
    for p in pending {
        for ids in p.msg_ids.chunks(MSG_IDS_PER_COMMAND_MAX) {
            let command = settle_command(p.consumer.clone(), p.op, ids.to_vec());
            if shared.quorum.replica(p.group).is_some() {
                cluster.queue_groups().send(Input::Propose {
                    group: p.group,
                    data: command.encode().into(),
                    done: None,
                });
            }
        }
    }
}

/// Runs [`flush_settles`] when dropped.
pub struct FlushSettlesOnDrop<'a>(pub &'a Shared);

impl Drop for FlushSettlesOnDrop<'_> {
    fn drop(&mut self) {
        flush_settles(self.0);
    }
}

fn settle_command(consumer: ConsumerId, settle: SettleOp, msg_ids: Vec<u64>) -> Command {
    op(match settle {
        SettleOp::Ack => Op::Settle { consumer, msg_ids },
        SettleOp::Requeue => Op::Return {
            consumer,
            msg_ids,
            rejected: true,
        },
        SettleOp::Discard => Op::Discard { consumer, msg_ids },
    })
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
            (wait, settle_command(consumer.clone(), settle, ids.to_vec()))
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

/// Tick, node-down, dead-channel and stalled-publish sweeps, run every `SWEEP_INTERVAL`:
/// - a leader proposes `Tick` when its queue's head expired;
/// - a leader proposes `NodeDown` for consumers on a node the failure detector has found down
///   for [`NODE_DOWN_GRACE`] (what they held returns to the queue);
/// - every member proposes `ChannelDown` for consumers of its node whose channel is gone
///   (after a restart, or when a channel's own `ChannelDown` was lost with a leader);
/// - publishes not applied for a while are proposed again, or in the end nacked.
pub async fn sweep(shared: Arc<Shared>) {
    let Some(cluster) = shared.cluster.clone() else {
        return;
    };
    let me = me(&shared);
    let mut t = tokio::time::interval(SWEEP_INTERVAL);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A channel seen gone in one sweep and still gone in the next: not one being opened.
    let mut suspects: Vec<(u64, u64)> = Vec::new();
    // Since when each node has been seen down, for NODE_DOWN_GRACE.
    let mut down_since: HashMap<String, std::time::Instant> = HashMap::new();
    loop {
        t.tick().await;
        if *shared.shutdown.borrow() {
            return;
        }
        // A backstop: settlements are proposed where they are made.
        flush_settles(&shared);
        resend_stalled(&shared);
        let seen = std::time::Instant::now();
        down_since.retain(|node, _| cluster.is_node_running(node) != Some(true));
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
                    && seen - *down_since.entry(node.clone()).or_insert(seen) >= NODE_DOWN_GRACE
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

/// How long a node is seen down before its consumers' messages go back to the queue. A node
/// paused or cut off for less keeps them, as RabbitMQ's keep theirs through net_ticktime:
/// deliveries it made just before (still in its buffers) or applies late when it catches up
/// are then not also made to another consumer. A group's leader fails over sooner (Raft's
/// election timeout): only consumers wait this long.
const NODE_DOWN_GRACE: Duration = Duration::from_secs(5);
