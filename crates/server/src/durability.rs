//! Publisher confirms for stored messages: a confirm goes out only once the WAL writer has
//! synced the message (the engine tells us per log, after each group commit).

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;
use warren_store::{DurabilityListener, Error};

/// What the WAL writer has made durable, per log, and a generation counter connections watch.
pub struct Durability {
    durable: Mutex<HashMap<u64, u64>>,
    generation: watch::Sender<u64>,
    failed: std::sync::atomic::AtomicBool,
    /// Why the engine stopped, for the node to raise its storage alarm (the engine calls
    /// [`DurabilityListener::on_failure`] on its own thread, outside any runtime).
    failure: watch::Sender<Option<String>>,
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            durable: Mutex::new(HashMap::new()),
            generation: watch::channel(0).0,
            failed: Default::default(),
            failure: watch::channel(None).0,
        }
    }
}

impl Durability {
    pub fn is_durable(&self, log: u64, index: u64) -> bool {
        self.durable
            .lock()
            .expect("durability lock")
            .get(&log)
            .is_some_and(|d| *d >= index)
    }

    /// Whether every (log, index) in `waits` is durable.
    pub fn all_durable(&self, waits: &[(u64, u64)]) -> bool {
        let map = self.durable.lock().expect("durability lock");
        waits
            .iter()
            .all(|(log, index)| map.get(log).is_some_and(|d| d >= index))
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The engine stopped writing (a failed fsync): nothing more will become durable.
    pub fn has_failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns `Some(why)` once the engine stops.
    pub fn subscribe_failure(&self) -> watch::Receiver<Option<String>> {
        self.failure.subscribe()
    }
}

impl DurabilityListener for Durability {
    fn on_durable(&self, log_id: u64, durable_index: u64) {
        {
            let mut map = self.durable.lock().expect("durability lock");
            let d = map.entry(log_id).or_insert(0);
            *d = (*d).max(durable_index);
        }
        self.generation.send_modify(|g| *g += 1);
    }

    fn on_failure(&self, error: &Error) {
        tracing::error!(%error, "the storage engine stopped: no more writes are durable");
        self.failed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.generation.send_modify(|g| *g += 1);
        let why = match error {
            Error::Poisoned(why) => why.clone(),
            other => other.to_string(),
        };
        self.failure.send_if_modified(|f| {
            let first = f.is_none();
            f.get_or_insert(why);
            first
        });
    }
}
