//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use warren_store::{Config, DurabilityListener, Entry, Store};

/// A directory removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "warren-store-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Records every durability notification.
#[derive(Default)]
pub struct Recorder {
    pub durable: Mutex<Vec<(u64, u64)>>,
    pub failures: AtomicU64,
}

impl DurabilityListener for Recorder {
    fn on_durable(&self, log_id: u64, durable_index: u64) {
        self.durable.lock().unwrap().push((log_id, durable_index));
    }
    fn on_failure(&self, _error: &warren_store::Error) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }
}

impl Recorder {
    pub fn highest(&self, log_id: u64) -> Option<u64> {
        self.durable
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| *l == log_id)
            .map(|(_, i)| *i)
            .max()
    }
}

/// A payload whose bytes depend on where it belongs, so a misplaced read is caught.
pub fn payload(log_id: u64, index: u64, term: u64, size: usize) -> Bytes {
    let seed = log_id.wrapping_mul(31) ^ index.wrapping_mul(7919) ^ term.wrapping_mul(104_729);
    Bytes::from(
        (0..size)
            .map(|i| (seed.wrapping_add(i as u64).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect::<Vec<u8>>(),
    )
}

pub fn entry(log_id: u64, index: u64, term: u64, size: usize) -> Entry {
    Entry {
        index,
        term,
        payload: payload(log_id, index, term, size),
    }
}

pub fn open(config: &Config) -> (Store, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let (store, _) = Store::open(config.clone(), recorder.clone()).unwrap();
    (store, recorder)
}

/// Sum of the sizes of the files in `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| it.map(|e| e.unwrap().metadata().unwrap().len()).sum())
        .unwrap_or(0)
}

pub fn file_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|it| it.count()).unwrap_or(0)
}
