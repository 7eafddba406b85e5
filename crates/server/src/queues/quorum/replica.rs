//! This node's replica of a quorum queue: the broker's queue state machine
//! ([`warren_broker::quorum::QuorumQueue`]) under the queue's Raft group
//! ([`warren_cluster::groups`]). The group applies each committed entry here, in log order, on
//! every member alike; the effects addressed to this node are carried out here:
//! - deliveries to this node's consumers, the body read from this node's copy of the log (the
//!   entry being applied, or an older one from the store), written to the client's channel;
//! - basic.get answers, consume-ok and cancel-ok to this node's waiting channels
//!   ([`crate::queues::quorum::client::Wait`]);
//! - confirms and rejects of this node's publishing channels;
//! - as the leader: dead letters (published once, by the leader, at most once; an
//!   at-least-once queue's go to [`crate::queues::quorum::dead_letters`], which publishes them with
//!   confirms).
//!
//! Effects are gathered while a round's entries are applied and carried out together at the
//! round's end ([`Machine::flush`]): one vhost lock and one confirm wake-up for many entries.
//! A delivery for a consumer that is gone (its channel closed, it was cancelled, this node
//! restarted) goes back to the queue (`Return`).

use crate::queues::quorum::bodies::Bodies;
use crate::queues::quorum::client::{self, ReplicaInfo, Wait};
use crate::Shared;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use warren_broker::args::QueueConfig;
use warren_broker::quorum::{Command, ConsumerId, Effect, Op, QuorumConfig, QuorumQueue};
use warren_broker::vhost::Accepted;
use warren_cluster::groups::Machine;
use warren_cluster::replicas::QueueReplica;
use warren_protocol::amqp::{basic, AMQPClass};
use warren_protocol::method::Method;
use warren_store::IdHashMap;

/// Effects a member catching up holds back at most (see [`Machine::flush`]).
const PENDING_WHILE_BEHIND: usize = 16_384;
/// An entry proposed longer ago than this when applied: the member is catching up.
const LATE_ENTRY_MS: u64 = 1_000;

pub struct Replica {
    queue: QuorumQueue,
    group: u64,
    vhost: String,
    name: String,
    me: String,
    me_id: u64,
    info: Arc<ReplicaInfo>,
    /// The leader last known (0: none yet).
    leader: u64,
    /// Effects of this round's entries, carried out at its end.
    pending: Vec<Pending>,
    /// Bodies of messages waiting in the queue (see `bodies`).
    bodies: Bodies,
    /// When the last applied entry was proposed (unix ms, the proposer's clock).
    last_entry_ms: u64,
    /// Deliveries whose body this member could not read.
    unreadable: u64,
    /// Held weakly: the groups' thread must not keep the node's state alive at shutdown.
    shared: Weak<Shared>,
}

enum Pending {
    Effect {
        effect: Effect,
        /// The payload of the entry being applied, for a delivery of the message it enqueued.
        entry: Option<(u64, Bytes)>,
    },
    /// This node's checkout was applied (and not refused): consume-ok before its deliveries.
    CheckoutOk(ConsumerId),
    /// This node's cancel was applied.
    CancelOk(ConsumerId),
    /// A settlement by one of this node's consumers was applied (a transaction may wait).
    Settled(Wait),
}

impl Replica {
    fn is_mine(&self, node: &str) -> bool {
        node == self.me
    }

    fn wait_of(&self, consumer: &ConsumerId) -> Wait {
        if consumer.is_get() {
            Wait::Get {
                group: self.group,
                channel: consumer.channel,
            }
        } else {
            Wait::Checkout {
                group: self.group,
                channel: consumer.channel,
                tag: consumer.tag.clone(),
            }
        }
    }

    /// The message at `index` of this node's copy of the log.
    fn read(&mut self, shared: &Shared, index: u64, entry: &Option<(u64, Bytes)>) -> Option<Bytes> {
        if let Some((i, payload)) = entry {
            if *i == index {
                return Some(payload.clone());
            }
        }
        if let Some(body) = self.bodies.take(index) {
            return Some(body);
        }
        let store = shared.store.as_ref()?;
        let data = warren_cluster::raft_log::read_entry_data(store, self.group, index)?;
        match Command::decode(data).ok()?.op {
            Op::Enqueue { payload, .. } => Some(payload),
            _ => None,
        }
    }

    fn message(
        &mut self,
        shared: &Shared,
        index: u64,
        entry: &Option<(u64, Bytes)>,
    ) -> Option<warren_broker::message::MessageRef> {
        let payload = self.read(shared, index, entry);
        let decoded = payload
            .as_ref()
            .and_then(warren_broker::message::decode_stored);
        if decoded.is_none() {
            // Logged at powers of two: a body this member lacks goes back to the queue and may
            // come straight back to the same consumer.
            self.unreadable += 1;
            if self.unreadable.is_power_of_two() {
                tracing::error!(queue = %self.name, vhost = %self.vhost, index, times = self.unreadable, "a quorum queue message cannot be read from this node's log");
            }
        }
        decoded.map(|(m, _)| Arc::new(m))
    }

    fn update_info(&self) {
        let i = &self.info;
        i.ready.store(self.queue.ready_count(), Ordering::Relaxed);
        i.ready_bytes
            .store(self.queue.ready_bytes(), Ordering::Relaxed);
        i.unacked
            .store(self.queue.checked_out_count(), Ordering::Relaxed);
        i.consumers
            .store(self.queue.consumer_count(), Ordering::Relaxed);
        i.next_expiry_ms.store(
            self.queue.next_expiry_ms().unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let holders: Vec<(String, u64)> = self
            .queue
            .consumers()
            .map(|(id, _)| (id.node.clone(), id.channel))
            .collect();
        let mut h = self.info.holders.lock().expect("holders lock");
        if *h != holders {
            *h = holders;
        }
    }

    /// Carries out what this round's entries asked of this node.
    fn carry_out(&mut self, shared: &Shared) {
        let pending = std::mem::take(&mut self.pending);
        let Some(vhost) = shared.broker.vhost(&self.vhost) else {
            return;
        };
        let now = shared.broker.now_ms();
        let leader = self.info.is_leader.load(Ordering::Relaxed);
        let mut confirms: IdHashMap<u64, Vec<(u64, bool)>> = IdHashMap::default();
        let mut returns: Vec<(ConsumerId, u64)> = Vec::new();
        let mut v = vhost.lock().expect("vhost lock");
        for p in pending {
            match p {
                Pending::CheckoutOk(consumer) => {
                    if let Some(w) = shared.quorum.take_waiter(&self.wait_of(&consumer)) {
                        if let Some(f) = w.on_applied {
                            f(&v, None);
                        }
                        let _ = w.answer.send(Ok(()));
                    }
                }
                Pending::CancelOk(consumer) => {
                    let wait = Wait::Cancel {
                        group: self.group,
                        channel: consumer.channel,
                        tag: consumer.tag.clone(),
                    };
                    if let Some(w) = shared.quorum.take_waiter(&wait) {
                        v.forget_remote_consumer(consumer.channel, &consumer.tag);
                        if let Some(f) = w.on_applied {
                            f(&v, None);
                        }
                        let _ = w.answer.send(Ok(()));
                    }
                }
                Pending::Settled(wait) => {
                    if let Some(w) = shared.quorum.take_waiter(&wait) {
                        let _ = w.answer.send(Ok(()));
                    }
                }
                Pending::Effect { effect, entry } => match effect {
                    Effect::Deliver {
                        consumer,
                        msg_id,
                        index,
                        redelivered,
                        delivery_count,
                        settled,
                    } => {
                        // Taken back by a later entry of the round (see `QuorumQueue::holds`).
                        if !settled && !self.queue.holds(&consumer, msg_id) {
                            continue;
                        }
                        let accepted = v
                            .has_quorum_consumer(consumer.channel, consumer.tag.as_bytes())
                            && match self.message(shared, index, &entry) {
                                Some(m) => v
                                    .accept_quorum_delivery(
                                        consumer.channel,
                                        &self.name,
                                        consumer.tag.as_bytes(),
                                        msg_id,
                                        m,
                                        redelivered,
                                        delivery_count,
                                        settled,
                                        0,
                                    )
                                    .is_some(),
                                None => false,
                            };
                        if !accepted && !settled {
                            returns.push((consumer, msg_id));
                        }
                    }
                    Effect::Got {
                        consumer,
                        msg_id,
                        index,
                        redelivered,
                        delivery_count,
                        settled,
                        remaining,
                    } => {
                        let waiter = shared.quorum.take_waiter(&self.wait_of(&consumer));
                        let channel = consumer.channel;
                        let held = settled || self.queue.holds(&consumer, msg_id);
                        let accepted = match (&waiter, self.message(shared, index, &entry)) {
                            (Some(_), Some(m)) if held => v.accept_quorum_delivery(
                                consumer.channel,
                                &self.name,
                                b"",
                                msg_id,
                                m,
                                redelivered,
                                delivery_count,
                                settled,
                                remaining.min(u32::MAX as u64) as u32,
                            ),
                            _ => None,
                        };
                        if accepted.is_some() {
                            v.note_quorum_get(consumer.channel, self.group - 1);
                        } else if held && !settled {
                            returns.push((consumer, msg_id));
                        }
                        if let Some(w) = waiter {
                            match w.on_applied {
                                Some(f) => {
                                    let got = match accepted {
                                        Some(Accepted::StandInGet(d)) => Some(d),
                                        _ => None,
                                    };
                                    f(&v, got);
                                }
                                // The client's channel is here and waits for an answer.
                                None if accepted.is_none() => get_empty(&v, channel),
                                None => {}
                            }
                            let _ = w.answer.send(Ok(()));
                        }
                    }
                    Effect::GetEmpty { consumer } => {
                        if let Some(w) = shared.quorum.take_waiter(&self.wait_of(&consumer)) {
                            if w.on_applied.is_none() {
                                get_empty(&v, consumer.channel);
                            }
                            if let Some(f) = w.on_applied {
                                f(&v, None);
                            }
                            let _ = w.answer.send(Ok(()));
                        }
                    }
                    Effect::GetRefused { consumer, error }
                    | Effect::CheckoutRefused { consumer, error } => {
                        if let Some(w) = shared.quorum.take_waiter(&self.wait_of(&consumer)) {
                            if !consumer.is_get() {
                                v.forget_remote_consumer(consumer.channel, &consumer.tag);
                            }
                            let _ = w.answer.send(Err(error));
                        }
                    }
                    Effect::Confirm { publisher, seq } => {
                        if self.is_mine(&publisher.node) {
                            confirms
                                .entry(publisher.channel)
                                .or_default()
                                .push((seq, false));
                        }
                    }
                    Effect::Reject { publisher, seq } => {
                        if self.is_mine(&publisher.node) {
                            confirms
                                .entry(publisher.channel)
                                .or_default()
                                .push((seq, true));
                        }
                    }
                    Effect::DeadLetter {
                        index,
                        reason,
                        delivery_count,
                        held,
                    } => {
                        if let Some(id) = held {
                            self.bodies.take(index);
                            // Still held unless a later entry of the round settled it.
                            if let Some(d) = self.queue.dead_letter(id).filter(|_| leader) {
                                let letters = &shared.quorum.dead_letters;
                                letters.hold(self.group, &self.vhost, &self.name, id, *d);
                            }
                        } else if !leader {
                            self.bodies.take(index);
                        } else if let Some(m) = self.message(shared, index, &entry) {
                            v.dead_letter_quorum(
                                &self.name,
                                m,
                                reason.as_str(),
                                delivery_count,
                                now,
                            );
                        }
                    }
                    Effect::Purged { count } => {
                        self.bodies.clear();
                        if let Some(w) = shared.quorum.take_purge_waiter(self.group) {
                            let _ = w.send(count.min(u32::MAX as u64) as u32);
                        }
                    }
                    Effect::ConsumerCancelled { consumer } => {
                        if self.is_mine(&consumer.node) {
                            v.quorum_consumer_dropped(
                                consumer.channel,
                                &self.name,
                                consumer.tag.as_bytes(),
                            );
                        }
                    }
                    Effect::Dropped { .. } => {}
                },
            }
        }
        // Dead letters routed on to other queues: stored under the vhost's lock, proposed to
        // their groups after it.
        let later = crate::queues::effects::store_now(shared, &mut v);
        drop(v);
        later.send(shared, &self.vhost);
        for (channel, seqs) in confirms {
            shared.durability.quorum_applied(channel, self.group, &seqs);
            if let Some(upto) = seqs.iter().map(|(seq, _)| *seq).max() {
                shared.quorum.publishes_applied(channel, self.group, upto);
            }
        }
        if !returns.is_empty() {
            let mut by_consumer: HashMap<ConsumerId, Vec<u64>> = HashMap::new();
            for (c, id) in returns {
                by_consumer.entry(c).or_default().push(id);
            }
            for (consumer, msg_ids) in by_consumer {
                let command = Command::new(
                    client::unix_now_ms(),
                    Op::Return {
                        consumer,
                        msg_ids,
                        rejected: false,
                    },
                );
                client::propose(shared, self.group, &command, None);
            }
        }
    }
}

impl Machine for Replica {
    fn apply(&mut self, index: u64, data: Bytes) {
        let command = match Command::decode(data) {
            Ok(command) => command,
            Err(e) => {
                tracing::error!(queue = %self.name, index, error = %e, "unreadable quorum queue entry skipped");
                return;
            }
        };
        self.last_entry_ms = command.now_ms;
        let (entry, checkout, cancel) = match &command.op {
            Op::Enqueue { payload, .. } => (Some((index, payload.clone())), None, None),
            Op::Checkout { consumer, .. } if self.is_mine(&consumer.node) => {
                (None, Some(consumer.clone()), None)
            }
            Op::Cancel { consumer } if self.is_mine(&consumer.node) => {
                (None, None, Some(consumer.clone()))
            }
            _ => (None, None, None),
        };
        let settled = match &command.op {
            Op::Settle { consumer, msg_ids }
            | Op::Return {
                consumer, msg_ids, ..
            }
            | Op::Discard { consumer, msg_ids }
                if self.is_mine(&consumer.node) && !msg_ids.is_empty() =>
            {
                Some(Wait::Settle {
                    group: self.group,
                    channel: consumer.channel,
                    tag: consumer.tag.clone(),
                    first: msg_ids[0],
                })
            }
            _ => None,
        };
        let stats = &self.info.stats;
        match &command.op {
            Op::Enqueue { .. } => {
                stats[0].fetch_add(1, Ordering::Relaxed);
            }
            Op::Settle { msg_ids, .. } => {
                stats[3].fetch_add(msg_ids.len() as u64, Ordering::Relaxed);
            }
            _ => {}
        }
        let effects = self.queue.apply(index, command);
        for e in &effects {
            if let Effect::Deliver { redelivered, .. } | Effect::Got { redelivered, .. } = e {
                stats[1].fetch_add(1, Ordering::Relaxed);
                stats[2].fetch_add(*redelivered as u64, Ordering::Relaxed);
            }
        }
        if let Some(c) = checkout {
            let refused = effects
                .iter()
                .any(|e| matches!(e, Effect::CheckoutRefused { consumer, .. } if *consumer == c));
            if !refused {
                self.pending.push(Pending::CheckoutOk(c));
            }
        }
        let has_entry = entry.is_some();
        for effect in effects {
            if let Effect::Dropped { index: i, .. } = effect {
                self.bodies.take(i);
            }
            let entry = match &effect {
                Effect::Deliver { index: i, .. } | Effect::Got { index: i, .. }
                    if has_entry && *i == index =>
                {
                    entry.clone()
                }
                Effect::DeadLetter { index: i, .. } if has_entry && *i == index => entry.clone(),
                _ => None,
            };
            if self.addressed_here(&effect) {
                self.pending.push(Pending::Effect { effect, entry });
            }
        }
        if let Some(c) = cancel {
            self.pending.push(Pending::CancelOk(c));
        }
        if let Some(wait) = settled {
            self.pending.push(Pending::Settled(wait));
        }
        if let Some((i, payload)) = &entry {
            if self.queue.waits_undelivered(*i) {
                self.bodies.keep(*i, payload);
            }
        }
    }

    fn flush(&mut self, caught_up: bool) {
        self.update_info();
        // A body whose message left the queue some way not seen above goes too.
        if self.bodies.len() as u64 > self.queue.ready_count() {
            let queue = &self.queue;
            self.bodies.retain(|i| queue.waits_undelivered(i));
        }
        // Catching up (behind the leader's commit, applying entries proposed a while ago: it
        // was paused, cut off or down), deliveries of old entries wait for the entries that
        // may take them back (see `QuorumQueue::holds`), within a bound on what waits in
        // memory. A member merely a message behind under load carries out at once.
        let catching_up =
            !caught_up && client::unix_now_ms().saturating_sub(self.last_entry_ms) > LATE_ENTRY_MS;
        if self.pending.is_empty() || (catching_up && self.pending.len() < PENDING_WHILE_BEHIND) {
            return;
        }
        match self.shared.upgrade() {
            Some(shared) => self.carry_out(&shared),
            None => self.pending.clear(),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        self.queue.snapshot()
    }

    fn restore(&mut self, data: &[u8]) {
        self.bodies.clear();
        match QuorumQueue::restore(data) {
            Ok(q) => self.queue = q,
            Err(e) => {
                tracing::error!(queue = %self.name, error = ?e, "unreadable quorum queue snapshot")
            }
        }
        self.update_info();
    }

    fn leader_changed(&mut self, leader: u64, _term: u64) {
        self.info
            .is_leader
            .store(leader == self.me_id, Ordering::Relaxed);
        if let Some(shared) = self.shared.upgrade() {
            let letters = &shared.quorum.dead_letters;
            if leader == self.me_id {
                let discards = self.queue.discards().map(|(id, d)| (id, *d));
                letters.lead(self.group, &self.vhost, &self.name, discards);
            } else {
                letters.forget(self.group);
            }
        }
        let lost = self.leader != 0 && leader != self.leader;
        if leader != 0 || lost {
            self.leader = leader;
        }
        // What this node proposed to the old leader and did not see applied may be lost: it
        // is proposed again (applied once: the group knows its publishers' numbers). Proposals
        // made before the first leader wait for it in the group.
        if lost {
            if let Some(shared) = self.shared.upgrade() {
                client::resend_unapplied(&shared, self.group);
            }
        }
    }

    fn live_from(&self) -> u64 {
        self.queue.release_cursor()
    }
}

impl Replica {
    /// Whether this node carries out `effect`: what names one of its consumers, channels or
    /// publishers, and dead letters (the leader publishes them).
    fn addressed_here(&self, effect: &Effect) -> bool {
        match effect {
            Effect::Deliver { consumer, .. }
            | Effect::Got { consumer, .. }
            | Effect::GetEmpty { consumer }
            | Effect::GetRefused { consumer, .. }
            | Effect::CheckoutRefused { consumer, .. }
            | Effect::ConsumerCancelled { consumer } => self.is_mine(&consumer.node),
            Effect::Confirm { publisher, .. } | Effect::Reject { publisher, .. } => {
                self.is_mine(&publisher.node)
            }
            Effect::DeadLetter { .. } | Effect::Purged { .. } => true,
            Effect::Dropped { .. } => false,
        }
    }
}

/// basic.get-empty to a channel of this node.
fn get_empty(v: &warren_broker::vhost::VHost, channel: u64) {
    if let Some((number, outbox)) = v.channel_outbox(channel) {
        let m = Method::Other(AMQPClass::Basic(basic::AMQPMethod::GetEmpty(
            basic::GetEmpty {},
        )));
        outbox.push(|b| m.encode(number, b));
    }
}

/// Makes this node open replicas of the quorum queues (and streams) it is a member of.
pub fn install(shared: &Arc<Shared>) {
    let Some(cluster) = &shared.cluster else {
        return;
    };
    let weak = Arc::downgrade(shared);
    let me = cluster.node_name().to_string();
    let me_id = cluster.node_id();
    cluster.set_replica_factory(Box::new(move |r: &QueueReplica| {
        let shared = weak.upgrade();
        if let Some(member) = shared
            .as_ref()
            .and_then(|s| crate::queues::stream::replicated::member(s, r))
        {
            return member;
        }
        let config = shared
            .as_ref()
            .and_then(|s| queue_config(s, &r.vhost, &r.queue))
            .unwrap_or_default();
        // A replica opened again (the declare replayed) is dropped by the groups if it is
        // open already: the open one keeps its figures.
        let info = shared
            .as_ref()
            .and_then(|s| s.quorum.replica(r.group))
            .unwrap_or_else(|| {
                Arc::new(ReplicaInfo {
                    vhost: r.vhost.clone(),
                    queue: r.queue.clone(),
                    next_expiry_ms: u64::MAX.into(),
                    ..Default::default()
                })
            });
        if let Some(s) = &shared {
            s.quorum.add_replica(r.group, info.clone());
        }
        Box::new(Replica {
            queue: QuorumQueue::new(QuorumConfig::new(&r.vhost, &r.queue, &config), 0),
            group: r.group,
            vhost: r.vhost.clone(),
            name: r.queue.clone(),
            me: me.clone(),
            me_id,
            info,
            leader: 0,
            pending: Vec::new(),
            bodies: Bodies::new(
                shared
                    .as_ref()
                    .map(|s| s.quorum.body_budget.clone())
                    .unwrap_or_default(),
            ),
            last_entry_ms: 0,
            unreadable: 0,
            shared: weak.clone(),
        })
    }));
    tokio::spawn(client::sweep(shared.clone()));
    tokio::spawn(crate::queues::quorum::dead_letters::run(shared.clone()));
}

/// The queue's arguments as its declare validated them.
fn queue_config(shared: &Shared, vhost: &str, queue: &str) -> Option<QueueConfig> {
    let v = shared.broker.vhost(vhost)?;
    let config = v.lock().expect("vhost lock").queue_config(queue);
    config
}
