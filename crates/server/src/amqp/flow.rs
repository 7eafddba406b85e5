//! Publisher flow control: a connection that hands its queues more than they have taken stops
//! being read until they catch up, as RabbitMQ's credit flow blocks a reader whose channel ran
//! out of credit with a queue.
//!
//! In warren a queue takes a message into its state synchronously, under the vhost lock, while
//! the publish is handled; what it has not taken yet is the message's place in the storage
//! engine. A persistent message to a durable queue is handed to the WAL writer, which makes it
//! durable at its next group commit (a publish forwarded to another node's queue waits on the
//! link to that node instead: [`Connection::wait_for_peer`], shown as flow too). Until
//! then the engine holds the bytes in memory, and an unconfirmed publisher faster than the disk
//! could keep the engine at its node-wide pending bound (`PENDING_BYTES_MAX`), where every
//! publisher on the node waits on the WAL writer under its vhost's lock. So each connection is
//! held to [`FLOW_BYTES_MAX`] bytes and [`FLOW_MESSAGES_MAX`] messages handed to the engine and
//! not yet synced: past either, its reader stops before the next frame and waits for the engine's
//! durability notifications, the way RabbitMQ's reader stops reading its socket.
//!
//! Cost on the data path: a publish that appends adds two additions and a look through the
//! logs the connection has pending (usually one); a transient publish (nothing appended) adds
//! one emptiness check. The reader adds one comparison per frame. Nothing here takes a lock or an atomic
//! unless the bound was crossed.
//!
//! Publishes to a quorum queue whose consumers fall behind (more than [`QUORUM_BACKLOG_MIN`]
//! messages ready while it has consumers) are held to [`QUORUM_IN_FLIGHT_MAX`] proposed and not
//! yet answered by its group, per connection: past it, the reader stops until the groups have
//! answered all but [`QUORUM_IN_FLIGHT_RESUME`]. When the CPU is saturated, each confirming
//! publisher keeps its whole confirm window (PerfTest's `-c 1000`) inside the broker: the
//! group's Raft pipeline grows that deep, and every command waits behind it. A consumer's
//! prefetch is refilled only once its acks went through that pipeline (and, from a follower's
//! node, to the leader and back), so with a prefetch no larger than the publisher's window it
//! takes fewer messages per round trip than the publisher puts in, and the backlog grows for
//! good. Bounding the publisher shortens the pipeline until the consumer catches up.
//! RabbitMQ bounds every channel (`quorum_commands_soft_limit`); bounding only publishers of
//! queues that fall behind keeps a lone publisher's full pipeline, which is most of its rate
//! (measured in `docs/benchmarks/quorum-queues.md`).
//!
//! Every connection is also held to [`QUORUM_UNANSWERED_MAX`] publishes (and [`FLOW_BYTES_MAX`]
//! bytes) to quorum queues not yet answered by their groups, whatever their queues' state: a publisher without confirms has no
//! window of its own, and one faster than the groups filled the node's memory with proposals
//! (2.3 GB in 20 s, and most of them lost). A confirming publisher's window (PerfTest's
//! `-c 1000`) stays well inside this bound, so it never meets it.
//!
//! What it does not bound: transient messages held in a queue's memory (RabbitMQ neither: those
//! are bounded by the memory alarm).

use crate::amqp::connection::Connection;
use crate::durability::{Durability, Wait};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use warren_store::Store;

/// Bytes (bodies and properties) a connection may have handed to the storage engine and not
/// seen synced: one WAL batch (`warren_store::config::BATCH_BYTES_MAX`), so one connection can
/// always fill a whole group commit and is never slowed by flow control while the disk keeps up,
/// and eight connections in flow still fit the engine's pending bound.
pub const FLOW_BYTES_MAX: u64 = 8 << 20;
/// Messages a connection may have handed to the engine and not seen synced: one WAL batch's
/// entries (`warren_store::config::BATCH_ENTRIES_MAX`), for the same reason.
pub const FLOW_MESSAGES_MAX: u64 = 8192;
/// Publishes to quorum queues whose consumers fall behind that a connection may have proposed
/// and not seen answered: a quarter of the prefetch PerfTest and many clients use (1000), so
/// that a consumer takes more per round trip than the publisher puts in.
pub const QUORUM_IN_FLIGHT_MAX: u64 = 256;
/// Publishes to any quorum queues a connection may have proposed and not seen answered, counted
/// since the reader's last look: as many as the engine's bound ([`FLOW_MESSAGES_MAX`]), so a
/// publisher without confirms keeps a pipeline as deep as one to a classic queue. A look (every
/// [`QUORUM_IN_FLIGHT_MAX`] publishes) that finds more than [`QUORUM_UNANSWERED_RESUME`] holds the
/// reader back until no more are.
pub const QUORUM_UNANSWERED_MAX: u64 = FLOW_MESSAGES_MAX;
/// Unanswered publishes to quorum queues past which a connection is held back, and at or below
/// which it reads again.
pub const QUORUM_UNANSWERED_RESUME: u64 = QUORUM_UNANSWERED_MAX / 2;
/// Ready messages past which a quorum queue with consumers counts as falling behind.
pub const QUORUM_BACKLOG_MIN: u64 = 4 * QUORUM_IN_FLIGHT_MAX;
/// Unanswered publishes to quorum queues below which a connection held back reads again.
pub const QUORUM_IN_FLIGHT_RESUME: u64 = QUORUM_IN_FLIGHT_MAX / 2;
/// How long a connection keeps showing `flow` after its last throttle: RabbitMQ's
/// `credit_flow` reports flow for a second after it was last blocked
/// (`?STATE_CHANGE_INTERVAL`), so a poller sees a connection that is throttled again and again
/// as in flow rather than flickering.
pub const FLOW_STATE_HOLD: Duration = Duration::from_secs(1);
/// Most logs tracked one by one; a publish fanned out to more queues than this is tracked by
/// the logs seen first, and the rest are caught by the engine's own pending bound.
const FLOW_LOGS_MAX: usize = 64;

/// What one connection handed to the storage engine since the engine last caught up with it.
#[derive(Debug, Default)]
pub struct Flow {
    /// The newest index appended per log: the connection caught up once all are durable.
    pending: Vec<(u64, u64)>,
    bytes: u64,
    messages: u64,
    /// The newest sequence per quorum stream (channel and group) published to: (stream, seq).
    quorum: Vec<(u64, u64)>,
    /// Publishes to quorum queues counted in flight: since the last look, plus those to queues
    /// falling behind that were unanswered then.
    quorum_messages: u64,
    /// Publishes to quorum queues since the last look, plus all those unanswered then.
    quorum_unanswered: u64,
    /// Their bytes: those since the last look, plus the unanswered ones' then (their count
    /// times the connection's mean size of a publish to quorum queues).
    quorum_bytes: u64,
    /// Every publish to quorum queues so far, for that mean.
    quorum_handed: (u64, u64),
}

impl Flow {
    /// A publish of `bytes` was handed on with `waits`.
    #[inline]
    pub fn handed(&mut self, waits: &[Wait], bytes: u64) {
        let (mut engine, mut quorum) = (false, false);
        for wait in waits {
            let (tracked, source, newest) = match *wait {
                Wait::Stored { log, index } => {
                    engine = true;
                    (&mut self.pending, log, index)
                }
                // Counted with the engine's bytes and messages, not tracked: the engine does
                // not know them and [`Connection::wait_for_peer`] holds them back.
                Wait::Forwarded { .. } | Wait::Stream { .. } => {
                    engine = true;
                    continue;
                }
                Wait::Quorum { stream, seq } => {
                    quorum = true;
                    (&mut self.quorum, stream, seq)
                }
            };
            if let Some(p) = tracked.iter_mut().find(|(s, _)| *s == source) {
                p.1 = p.1.max(newest);
            } else if tracked.len() < FLOW_LOGS_MAX {
                tracked.push((source, newest));
            }
        }
        if engine {
            self.bytes += bytes;
            self.messages += 1;
        }
        if quorum {
            self.quorum_messages += 1;
            self.quorum_unanswered += 1;
            self.quorum_bytes += bytes;
            self.quorum_handed.0 += bytes;
            self.quorum_handed.1 += 1;
        }
    }

    /// Whether the connection has handed more than its bound: read no further frames.
    #[inline]
    pub fn over(&self) -> bool {
        self.bytes > FLOW_BYTES_MAX
            || self.messages > FLOW_MESSAGES_MAX
            || self.quorum_messages > QUORUM_IN_FLIGHT_MAX
            || self.quorum_unanswered > QUORUM_UNANSWERED_MAX
            || self.quorum_bytes > FLOW_BYTES_MAX
    }

    /// Forgets what the engine has synced (all of it, or nothing: one look at the newest index
    /// per log). Asks the engine, not the durability notifications, because a log deleted
    /// before its appends were synced (its queue was deleted) is never reported durable; also
    /// true once the engine stopped, as nothing more will sync. Forwards to other nodes are not
    /// tracked here: [`Connection::wait_for_peer`] holds those back.
    fn caught_up(
        &mut self,
        store: Option<&Store>,
        durability: &Durability,
        behind: impl Fn(u64) -> bool,
    ) -> bool {
        let synced = |&(log, index): &(u64, u64)| {
            store
                .and_then(|s| s.log_info(log))
                .is_none_or(|info| info.durable_index >= index)
        };
        let engine = durability.has_failed() || self.pending.iter().all(synced);
        if engine {
            self.pending.clear();
            self.bytes = 0;
            self.messages = 0;
        }
        engine && self.quorum_caught_up(durability, behind)
    }

    /// Whether the groups of quorum queues falling behind (`behind(group)`) answered all but
    /// [`QUORUM_IN_FLIGHT_RESUME`] of the connection's publishes to them, and all groups all
    /// but [`QUORUM_UNANSWERED_RESUME`] and half of [`FLOW_BYTES_MAX`]; then counts only those
    /// still in flight.
    fn quorum_caught_up(&mut self, durability: &Durability, behind: impl Fn(u64) -> bool) -> bool {
        let (mut in_flight, mut all) = (0, 0);
        self.quorum.retain(|&(stream, newest)| {
            match durability.quorum_unanswered(stream, newest) {
                Some((group, unanswered)) if unanswered > 0 => {
                    if behind(group) {
                        in_flight += unanswered;
                    }
                    all += unanswered;
                    true
                }
                _ => false,
            }
        });
        let (bytes, count) = self.quorum_handed;
        let all_bytes = all * bytes.checked_div(count).unwrap_or(0);
        if in_flight > QUORUM_IN_FLIGHT_RESUME
            || all > QUORUM_UNANSWERED_RESUME
            || all_bytes > FLOW_BYTES_MAX / 2
        {
            return false;
        }
        self.quorum_messages = in_flight;
        self.quorum_unanswered = all;
        self.quorum_bytes = all_bytes;
        true
    }
}

/// A connection's flow state as the management API and metrics see it.
#[derive(Debug, Default)]
pub struct FlowState {
    throttled: AtomicBool,
    /// Unix time in ms when the last throttle ended.
    released_at_ms: AtomicU64,
}

impl FlowState {
    /// Whether the connection is throttled now or was within [`FLOW_STATE_HOLD`].
    pub fn in_flow(&self) -> bool {
        if self.throttled.load(Ordering::Relaxed) {
            return true;
        }
        let released = self.released_at_ms.load(Ordering::Relaxed);
        released != 0 && now_ms().saturating_sub(released) < FLOW_STATE_HOLD.as_millis() as u64
    }

    /// RabbitMQ's `state` of a connection: "flow" or "running" (blocked is shown as running,
    /// as warren's memory alarm does not report per connection yet).
    pub fn state(&self) -> &'static str {
        if self.in_flow() {
            "flow"
        } else {
            "running"
        }
    }

    pub fn throttle(&self) {
        self.throttled.store(true, Ordering::Relaxed);
    }

    pub fn release(&self) {
        self.released_at_ms
            .store(now_ms().max(1), Ordering::Relaxed);
        self.throttled.store(false, Ordering::Relaxed);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Connection {
    /// Stops reading until the storage engine has synced what this connection handed it, and
    /// the groups of quorum queues falling behind answered most of its publishes to them.
    /// False if the connection is to end (the node shuts down).
    pub(crate) async fn wait_for_queues(
        &mut self,
        durable: &mut tokio::sync::watch::Receiver<u64>,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        // Publishes to quorum queues that keep up cost only this look, and no flow state.
        if self.flow_caught_up() {
            return true;
        }
        if let Some(entry) = &self.registered {
            entry.flow.throttle();
        }
        let mut carry_on = true;
        while !self.flow_caught_up() {
            tokio::select! {
                r = durable.changed() => if r.is_err() { carry_on = false; break },
                _ = shutdown.changed() => {
                    self.shutdown();
                    carry_on = false;
                    break;
                }
            }
        }
        if let Some(entry) = &self.registered {
            entry.flow.release();
        }
        carry_on
    }

    fn flow_caught_up(&mut self) -> bool {
        let shared = &self.shared;
        self.flow
            .caught_up(shared.store.as_deref(), &shared.durability, |group| {
                shared.quorum.replica(group).is_some_and(|r| {
                    r.ready.load(Ordering::Relaxed) > QUORUM_BACKLOG_MIN
                        && r.consumers.load(Ordering::Relaxed) > 0
                })
            })
    }
}

impl Connection {
    /// Credit flow between nodes: a publisher to a slow node's queues waits until the link to
    /// it drains, and shows as in flow meanwhile.
    pub(crate) async fn wait_for_peer(
        &mut self,
        peer: u64,
        shutdown: &tokio::sync::watch::Receiver<bool>,
    ) {
        let Some(cluster) = self.shared.cluster.clone() else {
            return;
        };
        if !cluster.messaging().is_congested(peer) {
            return;
        }
        if let Some(entry) = &self.registered {
            entry.flow.throttle();
        }
        while cluster.messaging().is_congested(peer) && !*shutdown.borrow() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if let Some(entry) = &self.registered {
            entry.flow.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(log: u64, index: u64) -> Wait {
        Wait::Stored { log, index }
    }

    /// The sequence number of a quorum stream's wait.
    fn seq(wait: Wait) -> u64 {
        match wait {
            Wait::Quorum { seq, .. } => seq,
            other => panic!("not a quorum publish: {other:?}"),
        }
    }

    #[test]
    fn transient_publishes_never_count() {
        let mut f = Flow::default();
        for _ in 0..FLOW_MESSAGES_MAX * 2 {
            f.handed(&[], 1 << 20);
        }
        assert!(!f.over());
    }

    #[test]
    fn over_past_either_bound() {
        let mut f = Flow::default();
        f.handed(&[stored(3, 1)], FLOW_BYTES_MAX);
        assert!(!f.over());
        f.handed(&[stored(3, 2), stored(5, 7)], 1);
        assert!(f.over());

        let mut f = Flow::default();
        for i in 0..=FLOW_MESSAGES_MAX {
            assert!(!f.over());
            f.handed(&[stored(3, 10 + i)], 1);
        }
        assert!(f.over());
    }

    #[test]
    fn caught_up_once_the_engine_synced_the_newest_index_of_each_live_log() {
        let dir = std::env::temp_dir().join(format!("warren-flow-test-{}", std::process::id()));
        let (store, _) = Store::open(
            warren_store::Config::new(&dir),
            std::sync::Arc::new(warren_store::NoopListener),
        )
        .unwrap();
        let d = Durability::default();
        let entry = |index| warren_store::Entry {
            index,
            term: 0,
            payload: bytes::Bytes::from_static(b"m"),
        };
        store.append(3, &[entry(1), entry(2)]).unwrap();
        let mut f = Flow::default();
        f.handed(&[stored(3, 2), stored(5, 1)], FLOW_BYTES_MAX + 1);
        // Log 5 is unknown to the engine (deleted, or a forward's pseudo log): taken.
        store.sync().unwrap();
        assert!(f.caught_up(Some(&store), &d, |_| true));
        assert!(!f.over());
        f.handed(&[stored(3, 3)], FLOW_BYTES_MAX + 1);
        assert!(
            !f.caught_up(Some(&store), &d, |_| true),
            "index 3 was never appended"
        );
        assert!(f.over());
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn publishes_to_a_quorum_queue_falling_behind_count_until_its_group_answers_them() {
        let d = Durability::default();
        let mut f = Flow::default();
        let mut waits = Vec::new();
        for _ in 0..=QUORUM_IN_FLIGHT_MAX {
            assert!(!f.over());
            let w = d.quorum_next(1, 7);
            f.handed(&[w], 1 << 10);
            waits.push(w);
        }
        assert!(f.over(), "one past the bound");
        assert!(
            f.caught_up(None, &d, |_| false),
            "its queue keeps up: the look is all it costs"
        );
        assert!(!f.over());
        for _ in 0..=QUORUM_IN_FLIGHT_MAX {
            let w = d.quorum_next(1, 7);
            f.handed(&[w], 1 << 10);
            waits.push(w);
        }
        let behind = |group| group == 7;
        assert!(!f.caught_up(None, &d, behind), "nothing answered");
        // Applied up to all but the resume mark: the reader goes on, counting those.
        let answered = waits.len() as u64 - QUORUM_IN_FLIGHT_RESUME;
        d.quorum_applied(1, 7, &[(answered - 1, false)]);
        assert!(
            !f.caught_up(None, &d, behind),
            "one more in flight than the resume mark"
        );
        d.quorum_applied(1, 7, &[(answered, false)]);
        assert!(f.caught_up(None, &d, behind));
        assert!(!f.over());
        for _ in 0..QUORUM_IN_FLIGHT_MAX - QUORUM_IN_FLIGHT_RESUME {
            f.handed(&[d.quorum_next(1, 7)], 1);
        }
        assert!(!f.over(), "the bound counts what is still in flight");
        let last = d.quorum_next(1, 7);
        f.handed(&[last], 1);
        assert!(f.over());
        // A leader change refuses what was in flight: answered too.
        d.quorum_abandon(7, None, 0);
        let Wait::Quorum { stream, seq } = last else {
            panic!("not a quorum publish: {last:?}");
        };
        assert_eq!(d.quorum_unanswered(stream, seq), Some((7, 0)));
        assert!(f.caught_up(None, &d, behind));
    }

    #[test]
    fn publishes_to_quorum_queues_that_keep_up_are_bounded_until_their_groups_answer_them() {
        let d = Durability::default();
        let mut f = Flow::default();
        let keeps_up = |_| false;
        let mut looks = 0;
        // The reader looks when the count since its last look passes a bound, and is held
        // when a look finds more unanswered than the resume mark.
        let newest = loop {
            let newest = d.quorum_next(1, 7);
            f.handed(&[newest], 1 << 10);
            if f.over() {
                if !f.caught_up(None, &d, keeps_up) {
                    break newest;
                }
                looks += 1;
            }
            assert!(seq(newest) <= QUORUM_UNANSWERED_MAX + 1, "never held back");
        };
        assert!(looks > 0);
        assert!(seq(newest) > QUORUM_UNANSWERED_RESUME);
        d.quorum_applied(1, 7, &[(seq(newest) - QUORUM_UNANSWERED_RESUME - 1, false)]);
        assert!(
            !f.caught_up(None, &d, keeps_up),
            "one more than the resume mark"
        );
        d.quorum_applied(1, 7, &[(seq(newest) - QUORUM_UNANSWERED_RESUME, false)]);
        assert!(f.caught_up(None, &d, keeps_up));
        assert!(!f.over());
    }

    #[test]
    fn quorum_publishes_bytes_count_until_their_groups_answer_them_not_as_engine_bytes() {
        let d = Durability::default();
        let mut f = Flow::default();
        let first = d.quorum_next(1, 7);
        f.handed(&[first], FLOW_BYTES_MAX / 2);
        assert!(!f.over());
        let second = d.quorum_next(1, 7);
        f.handed(&[second], FLOW_BYTES_MAX / 2 + 1);
        assert!(f.over());
        assert!(!f.caught_up(None, &d, |_| false), "nothing answered");
        d.quorum_applied(1, 7, &[(seq(first), false)]);
        assert!(
            f.caught_up(None, &d, |_| false),
            "half the bound unanswered: the engine has none of it"
        );
        assert!(!f.over());
        d.quorum_applied(1, 7, &[(seq(second), false)]);
        assert!(f.caught_up(None, &d, |_| false));
        assert_eq!(f.quorum_bytes, 0);
    }

    #[test]
    fn queue_logs_anywhere_in_their_random_range_count_as_engine_bytes() {
        // Queue logs are random odd numbers; quorum streams' pseudo logs sit high up.
        for log in [3, (1 << 62) + 1, u64::MAX] {
            let mut f = Flow::default();
            f.handed(&[stored(log, 1)], FLOW_BYTES_MAX + 1);
            assert!(f.over(), "log {log:#x}");
        }
    }

    #[test]
    fn state_shows_flow_while_throttled_and_for_a_while_after() {
        let s = FlowState::default();
        assert_eq!(s.state(), "running");
        s.throttle();
        assert_eq!(s.state(), "flow");
        s.release();
        assert_eq!(s.state(), "flow");
        s.released_at_ms.store(
            now_ms() - FLOW_STATE_HOLD.as_millis() as u64 - 1,
            Ordering::Relaxed,
        );
        assert_eq!(s.state(), "running");
    }
}
