//! Helpers shared by the integration tests.
//!
//! The tests must give the same verdict on any machine: on tmpfs and on a slow disk, with one
//! core or many. To check that, `scripts/store-test-matrix.sh` runs them with these knobs:
//!
//! - `TMPDIR`: where [`TempDir`] puts the engine's directories (`/dev/shm` for tmpfs).
//! - `WARREN_TEST_WAL_COMMIT_WINDOW_US`: the WAL writer's commit window
//!   ([`Config::commit_window_us`]) in every config made by [`store_config`].
//! - `WARREN_TEST_WAL_SYNC_DELAY_US`: every WAL fdatasync takes this many µs longer, as on a slow
//!   disk (so batches grow, and fewer, fuller pages are written).
//!
//! A test that sees different numbers of syncs, batches or WAL files under these knobs is
//! counting on the machine: it should drive what it counts instead. One `append` call between
//! two `sync`s is one WAL batch (under two pages of padding); `roll_wal` + `wait_idle` ends a
//! WAL file where the test wants it (with `wal_file_bytes_max` out of reach, files end nowhere
//! else); `config.faults.hold_writer` queues records (releases, say) for one batch.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use warren_store::{Config, DurabilityListener, Entry, Store};

/// `Config::new(root)`, with the knobs of the module doc applied when set.
pub fn store_config(root: &Path) -> Config {
    let mut config = Config::new(root);
    if let Some(us) = env_u64("WARREN_TEST_WAL_COMMIT_WINDOW_US") {
        config.commit_window_us = us;
    }
    if let Some(us) = env_u64("WARREN_TEST_WAL_SYNC_DELAY_US") {
        config.faults.sync_delay_us.store(us, Ordering::Relaxed);
    }
    config
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

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

pub fn files_with(dir: &Path, ext: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == ext)
        })
        .count()
}

pub fn file_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|it| it.count()).unwrap_or(0)
}
