//! How the groups loop learns that a round's writes are durable without waiting for the disk:
//! the WAL writer tells it from its own thread, right after the fsync, with an
//! [`Input::Synced`] on the loop's channel. A thread of our own parked in `Store::sync` would
//! cost two more wake-ups per round, and a follower's round is on every publish's path.
//!
//! At a low rate the loop syncs a small round itself instead (`Store::sync_here`), when the
//! WAL writer is idle: handing it over and hearing back cost two wake-ups more than the write.
//! A sync that took long (a disk stalled by other writes) sends the next rounds to the writer
//! for a while, so that the loop goes on heartbeating and stepping other groups meanwhile.

use super::{Input, Synced};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_store::Store;

/// A sync on the loop's thread slower than this makes the loop leave syncs to the WAL writer
/// for [`SLOW_SYNC_BACKOFF`].
const SLOW_SYNC: Duration = Duration::from_millis(20);
const SLOW_SYNC_BACKOFF: Duration = Duration::from_secs(1);
/// Rounds in a row synced on the loop's thread that make it [`Syncer::lightly_loaded`].
const LIGHT_LOAD_STREAK: u32 = 8;

pub(super) struct Syncer {
    store: Arc<Store>,
    inputs: super::InputSender,
    /// Rounds asked for, all time (what [`super::QueueGroups::syncs`] reports).
    asked: Arc<AtomicU64>,
    /// No syncs on the loop's thread before this (one was slow).
    not_here_until: Option<Instant>,
    /// Rounds in a row synced on the loop's thread.
    here_streak: u32,
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
            not_here_until: None,
            here_streak: 0,
        }
    }

    /// Syncs everything written so far on the loop's own thread, if the WAL writer is idle
    /// and little is pending (`Store::sync_here`): true when it is durable now.
    pub(super) fn sync_here(&mut self) -> Result<bool, String> {
        let now = Instant::now();
        if self.not_here_until.is_some_and(|until| now < until) {
            return Ok(false);
        }
        let here = self.store.sync_here().map_err(|e| e.to_string())?;
        self.here_streak = if here {
            self.here_streak.saturating_add(1)
        } else {
            0
        };
        if here {
            self.asked.fetch_add(1, Ordering::Relaxed);
            if now.elapsed() > SLOW_SYNC {
                self.not_here_until = Some(Instant::now() + SLOW_SYNC_BACKOFF);
            }
        }
        Ok(here)
    }

    /// Whether the last rounds were all synced on the loop's thread: they are small and the
    /// WAL writer idle, so the loop has time to spare for work it would otherwise hand over.
    /// (Under load some rounds still find the writer idle; a streak tells the two apart.)
    pub(super) fn lightly_loaded(&self) -> bool {
        self.here_streak >= LIGHT_LOAD_STREAK
    }

    /// Asks for everything written so far to be made durable; the loop hears of it as
    /// `Synced(round)`, in the order asked.
    pub(super) fn ask(&mut self, round: u64) {
        self.here_streak = 0;
        self.asked.fetch_add(1, Ordering::Relaxed);
        let inputs = self.inputs.clone();
        self.store.sync_then(Box::new(move |result| {
            let synced = result.map(|()| round).map_err(|e| e.to_string());
            inputs.send(Input::Synced(Synced(synced)));
        }));
    }
}
