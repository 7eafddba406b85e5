//! At-least-once dead-lettering of quorum queues, the leader's side (RabbitMQ's
//! `rabbit_fifo_dlx_worker`). The queue's state machine keeps each dead letter among its
//! discards ([`warren_broker::quorum::dead_letters`]); the leader's node publishes it to the
//! dead-letter exchange as a confirming publisher would, waits until every queue it reached
//! has it (synced here, applied by a quorum queue's group, taken by another node), and only
//! then proposes `SettleDeadLetters`, which lets the queue forget it.
//!
//! How a dead letter flows: the replica applies the entry that killed the message and, as the
//! leader, hands the discard to [`DeadLetters::hold`]; the worker task reads the body from this
//! node's copy of the log, routes it through the vhost (the same x-death bookkeeping as
//! at-most-once), and keeps what the confirm waits on. Unroutable (no such exchange, no
//! binding) or refused (a full reject-publish target, a nack, a broken link), it is published
//! again after [`RETRY_AFTER`]; a confirm that never comes, after [`CONFIRM_TIMEOUT`]. At most
//! [`IN_FLIGHT_MAX`] per queue are out at once, in the order they died (RabbitMQ's worker has a
//! prefetch of 32 for the same reason: a dead-letter target that refuses everything must not
//! cost the node a publish per message per retry).
//!
//! A leader that loses its leadership forgets its queue's dead letters here; the next leader
//! takes them all from its own replica ([`DeadLetters::lead`]) and publishes them again. A
//! target may therefore get a dead letter twice; the source never lets one go unconfirmed.

use crate::queues::quorum::client;
use crate::Shared;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use warren_broker::queue::ChannelKey;
use warren_broker::quorum::{Command, DeadLetterId, Discard, Op};

/// How long an unroutable or refused dead letter waits before it is published again.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long a published dead letter waits for its confirm before it is published again.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// Dead letters of one queue published and not yet confirmed, at most.
const IN_FLIGHT_MAX: usize = 64;
/// Dead letters one `SettleDeadLetters` entry names, at most.
const SETTLE_BATCH_MAX: usize = 4096;

/// The dead letters this node leads, per group, and the task's wake-up.
#[derive(Default)]
pub struct DeadLetters {
    groups: Mutex<HashMap<u64, GroupLetters>>,
    wake: Notify,
}

struct GroupLetters {
    vhost: String,
    queue: String,
    letters: BTreeMap<DeadLetterId, Letter>,
}

struct Letter {
    discard: Discard,
    state: State,
}

enum State {
    /// Not published yet, or to publish again at the instant given.
    Waiting(Option<Instant>),
    /// Published at the instant; confirmed once every (log, index) is durable.
    Published(Instant, Vec<crate::durability::Wait>),
}

impl DeadLetters {
    /// The queue's leader here keeps `discard` (its replica just applied its death).
    pub fn hold(&self, group: u64, vhost: &str, queue: &str, id: DeadLetterId, discard: Discard) {
        self.groups
            .lock()
            .expect("dead letters lock")
            .entry(group)
            .or_insert_with(|| GroupLetters {
                vhost: vhost.to_string(),
                queue: queue.to_string(),
                letters: BTreeMap::new(),
            })
            .letters
            .entry(id)
            .or_insert(Letter {
                discard,
                state: State::Waiting(None),
            });
        self.wake.notify_one();
    }

    /// This node became (or stays) the group's leader: every dead letter its replica still
    /// holds is this node's to publish. Those it publishes already stay as they are.
    pub fn lead(
        &self,
        group: u64,
        vhost: &str,
        queue: &str,
        discards: impl Iterator<Item = (DeadLetterId, Discard)>,
    ) {
        let mut any = false;
        for (id, discard) in discards {
            self.hold(group, vhost, queue, id, discard);
            any = true;
        }
        if any {
            self.wake.notify_one();
        }
    }

    /// This node no longer leads the group (or the queue is gone): the next leader publishes.
    pub fn forget(&self, group: u64) {
        self.groups
            .lock()
            .expect("dead letters lock")
            .remove(&group);
    }

    /// Dead letters this node has for the group, published or not (for tests and the API).
    pub fn count(&self, group: u64) -> usize {
        self.groups
            .lock()
            .expect("dead letters lock")
            .get(&group)
            .map_or(0, |g| g.letters.len())
    }
}

/// The worker: publishes what waits, settles what was confirmed, again and again. Wakes on a
/// new dead letter, on any durability progress (a confirm), and once a second for retries.
pub async fn run(shared: Arc<Shared>) {
    let letters = shared.quorum.dead_letters.clone();
    // The node's dead-letter publisher, a channel no client has: its confirms from quorum
    // queues come back on streams of its own.
    let channel = shared.next_channel.fetch_add(1, Ordering::Relaxed);
    let mut durable = shared.durability.subscribe();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = letters.wake.notified() => {}
            _ = durable.changed() => {}
            _ = tick.tick() => {}
        }
        if *shared.shutdown.borrow() {
            return;
        }
        round(&shared, &letters, channel, Instant::now());
    }
}

/// One pass over every group this node leads.
fn round(shared: &Shared, letters: &DeadLetters, channel: ChannelKey, now: Instant) {
    let groups: Vec<u64> = letters
        .groups
        .lock()
        .expect("dead letters lock")
        .keys()
        .copied()
        .collect();
    for group in groups {
        let leads = shared
            .quorum
            .replica(group)
            .is_some_and(|info| info.is_leader.load(Ordering::Relaxed));
        if !leads {
            letters.forget(group);
            continue;
        }
        let settled = settle_confirmed(shared, letters, group, now);
        for ids in settled.chunks(SETTLE_BATCH_MAX) {
            let command = Command::new(
                client::unix_now_ms(),
                Op::SettleDeadLetters { ids: ids.to_vec() },
            );
            client::propose(shared, group, &command, None);
        }
        publish_due(shared, letters, group, channel, now);
    }
}

/// Takes the group's confirmed dead letters out (their settle is proposed next) and moves the
/// refused and timed-out ones back to waiting.
fn settle_confirmed(
    shared: &Shared,
    letters: &DeadLetters,
    group: u64,
    now: Instant,
) -> Vec<DeadLetterId> {
    let durability = &shared.durability;
    let mut groups = letters.groups.lock().expect("dead letters lock");
    let Some(g) = groups.get_mut(&group) else {
        return Vec::new();
    };
    let mut settled = Vec::new();
    for (id, letter) in g.letters.iter_mut() {
        let State::Published(at, waits) = &letter.state else {
            continue;
        };
        if durability.any_refused(waits) {
            durability.forget_refusal(waits);
            letter.state = State::Waiting(Some(now + RETRY_AFTER));
        } else if durability.all_durable(waits) {
            settled.push(*id);
        } else if now.duration_since(*at) >= CONFIRM_TIMEOUT {
            letter.state = State::Waiting(Some(now));
        }
    }
    for id in &settled {
        g.letters.remove(id);
    }
    settled
}

/// Publishes the group's dead letters that are due, oldest first, within [`IN_FLIGHT_MAX`].
fn publish_due(
    shared: &Shared,
    letters: &DeadLetters,
    group: u64,
    channel: ChannelKey,
    now: Instant,
) {
    let (vhost_name, queue, due) = {
        let groups = letters.groups.lock().expect("dead letters lock");
        let Some(g) = groups.get(&group) else {
            return;
        };
        let in_flight = g
            .letters
            .values()
            .filter(|l| matches!(l.state, State::Published(..)))
            .count();
        let due: Vec<(DeadLetterId, Discard)> = g
            .letters
            .iter()
            .filter(|(_, l)| matches!(l.state, State::Waiting(at) if at.is_none_or(|t| t <= now)))
            .take(IN_FLIGHT_MAX.saturating_sub(in_flight))
            .map(|(id, l)| (*id, l.discard))
            .collect();
        (g.vhost.clone(), g.queue.clone(), due)
    };
    if due.is_empty() {
        return;
    }
    let Some(vhost) = shared.broker.vhost(&vhost_name) else {
        letters.forget(group);
        return;
    };
    let mut outcomes = Vec::with_capacity(due.len());
    {
        let mut v = vhost.lock().expect("vhost lock");
        for (id, discard) in due {
            let outcome = publish_one(shared, &mut v, channel, &queue, group, discard);
            outcomes.push((id, outcome));
        }
    }
    let mut groups = letters.groups.lock().expect("dead letters lock");
    let Some(g) = groups.get_mut(&group) else {
        return;
    };
    for (id, outcome) in outcomes {
        let Some(letter) = g.letters.get_mut(&id) else {
            continue;
        };
        letter.state = match outcome {
            Some(waits) => State::Published(now, waits),
            None => State::Waiting(Some(now + RETRY_AFTER)),
        };
    }
}

/// Routes one dead letter as a confirming publisher; what its confirm waits on, or `None` if
/// it reached no queue that will confirm it (unroutable, refused, unreadable: try again).
/// A dead letter whose every target is a cycle is done: RabbitMQ drops it rather than loop.
fn publish_one(
    shared: &Shared,
    v: &mut warren_broker::vhost::VHost,
    channel: ChannelKey,
    queue: &str,
    group: u64,
    discard: Discard,
) -> Option<Vec<crate::durability::Wait>> {
    let message = read_message(shared, group, discard.index)?;
    let outcome = v.dead_letter_quorum(
        queue,
        message,
        discard.reason.as_str(),
        discard.delivery_count,
        shared.broker.now_ms(),
    );
    // What it went to is taken even when it is tried again: a target that took it keeps it.
    let carried = crate::queues::effects::carry_out(shared, v, Some(channel));
    if outcome.targets == 0 && outcome.cycles > 0 {
        return Some(Vec::new());
    }
    if outcome.targets == 0 || outcome.refused > 0 {
        return None;
    }
    carried.waits().ok()
}

/// The dead message as it was published, from this node's copy of the queue's log.
fn read_message(
    shared: &Shared,
    group: u64,
    index: u64,
) -> Option<warren_broker::message::MessageRef> {
    let store = shared.store.as_ref()?;
    let data = warren_cluster::raft_log::read_entry_data(store, group, index)?;
    let Op::Enqueue { payload, .. } = Command::decode(data).ok()?.op else {
        return None;
    };
    let (message, _) = warren_broker::message::decode_stored(&payload)?;
    Some(Arc::new(message))
}
