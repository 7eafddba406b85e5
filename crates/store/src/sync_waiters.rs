//! Callers told from the WAL writer's own thread once what they submitted is durable
//! ([`crate::Store::sync_then`]), so a loop that must not block on the disk learns of a sync
//! without a thread of its own parked in [`crate::Store::sync`]: one wake-up fewer each way.

use crate::{Error, Result};

/// What a caller of [`crate::Store::sync_then`] is told: `Ok` once everything it submitted
/// before the call is durable, or why that will never be. Runs on the WAL writer thread, so it
/// must be quick and must not block (send to a channel); it must not call back into the store's
/// waiting helpers.
pub type SyncDone = Box<dyn FnOnce(Result<()>) + Send>;

/// The waiters, in the order they asked (so in the order of their targets).
#[derive(Default)]
pub(crate) struct SyncWaiters {
    waiting: Vec<(u64, SyncDone)>,
}

impl SyncWaiters {
    /// `done` runs once every record up to submission number `target` is durable.
    pub(crate) fn push(&mut self, target: u64, done: SyncDone) {
        debug_assert!(self.waiting.last().is_none_or(|(t, _)| *t <= target));
        self.waiting.push((target, done));
    }

    /// The waiters whose records are all durable now, to be told outside the lock.
    pub(crate) fn take_due(&mut self, synced_seq: u64) -> Vec<SyncDone> {
        let due = self.waiting.partition_point(|(t, _)| *t <= synced_seq);
        self.waiting.drain(..due).map(|(_, done)| done).collect()
    }

    /// Every waiter: the engine stopped, poisoned or closed, and none will be synced.
    pub(crate) fn take_all(&mut self) -> Vec<SyncDone> {
        self.waiting.drain(..).map(|(_, done)| done).collect()
    }
}

/// Tells each waiter `result`.
pub(crate) fn tell(waiters: Vec<SyncDone>, result: impl Fn() -> Result<()>) {
    for done in waiters {
        done(result());
    }
}

/// Why a waiter left behind by a stopped writer is never synced.
pub(crate) fn stopped(poisoned: Option<&String>) -> Error {
    match poisoned {
        Some(why) => Error::Poisoned(why.clone()),
        None => Error::Closed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Which waiter was told, and whether Ok.
    type Told = Arc<Mutex<Vec<(u64, bool)>>>;

    fn recorder() -> (Told, impl Fn(u64) -> SyncDone) {
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        let make = move |id: u64| -> SyncDone {
            let t = t.clone();
            Box::new(move |r: Result<()>| t.lock().unwrap().push((id, r.is_ok())))
        };
        (told, make)
    }

    #[test]
    fn only_waiters_whose_target_is_synced_are_due_in_the_order_they_asked() {
        let (told, done) = recorder();
        let mut w = SyncWaiters::default();
        w.push(3, done(1));
        w.push(5, done(2));
        w.push(5, done(3));
        w.push(9, done(4));
        tell(w.take_due(2), || Ok(()));
        assert!(told.lock().unwrap().is_empty());
        tell(w.take_due(5), || Ok(()));
        assert_eq!(*told.lock().unwrap(), vec![(1, true), (2, true), (3, true)]);
        tell(w.take_all(), || Err(stopped(None)));
        assert_eq!(told.lock().unwrap().last(), Some(&(4, false)));
        assert!(w.take_all().is_empty());
    }
}
