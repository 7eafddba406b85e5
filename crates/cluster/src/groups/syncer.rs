//! How the groups loop learns that a round's writes are durable without waiting for the disk:
//! the WAL writer tells it from its own thread, right after the fsync, with an
//! [`Input::Synced`] on the loop's channel. A thread of our own parked in `Store::sync` would
//! cost two more wake-ups per round, and a follower's round is on every publish's path.

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
    /// `Synced(round)`, in the order asked.
    pub(super) fn ask(&self, round: u64) {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let inputs = self.inputs.clone();
        self.store.sync_then(Box::new(move |result| {
            let synced = result.map(|()| round).map_err(|e| e.to_string());
            inputs.send(Input::Synced(Synced(synced)));
        }));
    }
}
