//! How the groups loop learns that a round's writes are durable without waiting for the disk:
//! the WAL writer tells it from its own thread, right after the fsync, with an
//! [`Input::Synced`] on the loop's channel. A thread of our own parked in `Store::sync` would
//! cost two more wake-ups per round, and a follower's round is on every publish's path.
//!
//! The loop never syncs on its own thread, even a small round at a low rate, where that would
//! save the writer's two wake-ups: blocked in an fsync, it could not step what peers send
//! meanwhile, nor deliver what other groups committed, so one slow fsync held every queue the
//! node leads or follows. (Measured at 40 queues x 10 msg/s, 30 s runs: a slowest message of
//! 22-101 ms in 5 runs of 9 when the loop synced small rounds itself, of 4.7-5.9 ms in 6 of 6
//! since, at the same CPU.)

use super::{Input, Synced};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use warren_store::Store;

pub(super) struct Syncer {
    store: Arc<Store>,
    inputs: super::InputSender,
    /// Rounds asked for, all time (what [`super::QueueGroups::syncs`] reports).
    asked: Arc<AtomicU64>,
}

impl Syncer {
    pub(super) fn new(
        store: Arc<Store>,
        inputs: super::InputSender,
        asked: Arc<AtomicU64>,
    ) -> Self {
        Syncer {
            store,
            inputs,
            asked,
        }
    }

    /// Asks for everything written so far to be made durable; the loop hears of it as
    /// `Synced(round)`, in the order asked. `now`: the loop is lightly loaded, and the writer
    /// is not to wait out its commit window first (`Store::sync_now_then`).
    pub(super) fn ask(&mut self, round: u64, now: bool) {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let inputs = self.inputs.clone();
        let done: warren_store::SyncDone = Box::new(move |result| {
            let synced = result.map(|()| round).map_err(|e| e.to_string());
            inputs.send(Input::Synced(Synced(synced)));
        });
        if now {
            self.store.sync_now_then(done);
        } else {
            self.store.sync_then(done);
        }
    }
}
