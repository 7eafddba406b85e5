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
//! What it does not bound: transient messages held in a queue's memory (RabbitMQ neither: those
//! are bounded by the memory alarm), and quorum queues' proposals (their Raft log has its own
//! bounds).

use crate::connection::Connection;
use crate::durability::Durability;
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
}

impl Flow {
    /// A publish of `bytes` was appended at `appended` (log, index) pairs.
    #[inline]
    pub fn handed(&mut self, appended: &[(u64, u64)], bytes: u64) {
        if appended.is_empty() {
            return;
        }
        self.bytes += bytes;
        self.messages += 1;
        for &(log, index) in appended {
            if let Some(p) = self.pending.iter_mut().find(|(l, _)| *l == log) {
                p.1 = p.1.max(index);
            } else if self.pending.len() < FLOW_LOGS_MAX {
                self.pending.push((log, index));
            }
        }
    }

    /// Whether the connection has handed more than its bound: read no further frames.
    #[inline]
    pub fn over(&self) -> bool {
        self.bytes > FLOW_BYTES_MAX || self.messages > FLOW_MESSAGES_MAX
    }

    /// Forgets what the engine has synced (all of it, or nothing: one look at the newest index
    /// per log). Asks the engine, not the durability notifications, because a log deleted
    /// before its appends were synced (its queue was deleted) is never reported durable; also
    /// true once the engine stopped, as nothing more will sync. Forwards to other nodes (pseudo
    /// logs the engine does not know) count as taken here: [`Connection::wait_for_peer`] holds
    /// those back.
    fn caught_up(&mut self, store: Option<&Store>, durability: &Durability) -> bool {
        let synced = |&(log, index): &(u64, u64)| {
            store
                .and_then(|s| s.log_info(log))
                .is_none_or(|info| info.durable_index >= index)
        };
        if durability.has_failed() || self.pending.iter().all(synced) {
            *self = Flow::default();
            return true;
        }
        false
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
    /// Stops reading until the storage engine has synced what this connection handed it.
    /// False if the connection is to end (the node shuts down).
    pub(crate) async fn wait_for_queues(
        &mut self,
        durable: &mut tokio::sync::watch::Receiver<u64>,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        if let Some(entry) = &self.registered {
            entry.flow.throttle();
        }
        let mut carry_on = true;
        while !self
            .flow
            .caught_up(self.shared.store.as_deref(), &self.shared.durability)
        {
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
        f.handed(&[(3, 1)], FLOW_BYTES_MAX);
        assert!(!f.over());
        f.handed(&[(3, 2), (5, 7)], 1);
        assert!(f.over());

        let mut f = Flow::default();
        for i in 0..=FLOW_MESSAGES_MAX {
            assert!(!f.over());
            f.handed(&[(3, 10 + i)], 1);
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
        f.handed(&[(3, 2), (5, 1)], FLOW_BYTES_MAX + 1);
        // Log 5 is unknown to the engine (deleted, or a forward's pseudo log): taken.
        store.sync().unwrap();
        assert!(f.caught_up(Some(&store), &d));
        assert!(!f.over());
        f.handed(&[(3, 3)], FLOW_BYTES_MAX + 1);
        assert!(!f.caught_up(Some(&store), &d), "index 3 was never appended");
        assert!(f.over());
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
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
