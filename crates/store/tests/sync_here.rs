//! `Store::sync_here`: a caller that would only wait for the WAL writer writes a small batch on
//! its own thread. What it says is durable must be, exactly as the writer thread's batches are.

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use common::*;
use warren_store::{DurabilityListener, Store};

/// Which thread told each durability notification.
#[derive(Default)]
struct Tellers(Mutex<Vec<(u64, u64, ThreadId)>>);

impl DurabilityListener for Tellers {
    fn on_durable(&self, log_id: u64, durable_index: u64) {
        let me = std::thread::current().id();
        self.0.lock().unwrap().push((log_id, durable_index, me));
    }
}

/// `Store::sync`, failing rather than hanging when a lost record keeps it from ever returning.
fn sync_within(store: &Store, limit: Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    store.sync_then(Box::new(move |result| {
        let _ = tx.send(result.map_err(|e| e.to_string()));
    }));
    let result = rx.recv_timeout(limit).expect("the sync never completed");
    result.unwrap();
}

#[test]
fn a_small_batch_synced_on_the_callers_thread_is_durable_on_return_and_after_a_reopen() {
    let dir = TempDir::new("sync-here");
    let config = store_config(dir.path());
    let me = std::thread::current().id();
    let mut written_here = 0;
    {
        let tellers = Arc::new(Tellers::default());
        let (store, _) = Store::open(config.clone(), tellers.clone()).unwrap();
        for i in 1..=20u64 {
            // Queued without waking the writer thread, as the queue groups' loop does.
            store
                .append_blocking_for_sync(1, &[entry(1, i, 1, 300)])
                .unwrap();
            // The writer thread may hold the WAL at this moment (it starts after `open`
            // returns, and a wake-up from elsewhere lets it take a record first): then
            // `sync_here` declines and the caller waits for the writer, as the loop does.
            if !store.sync_here().unwrap() {
                sync_within(&store, Duration::from_secs(10));
            }
            // Durable on return: the listener heard of it before either call returned.
            let told = tellers.0.lock().unwrap().clone();
            let last = told.iter().rfind(|(log, _, _)| *log == 1).copied();
            assert_eq!(last.map(|(_, index, _)| index), Some(i));
            if last.is_some_and(|(_, _, by)| by == me) {
                written_here += 1;
            }
        }
        assert!(store.stats().wal_syncs >= 20);
    }
    // Nothing woke the writer thread, so it can have taken only a few of the records; the
    // rest were written on this thread.
    assert!(written_here >= 1, "none of 20 written here");
    let (store, _) = open(&config);
    for i in 1..=20 {
        assert_eq!(store.read(1, i).unwrap(), Some(entry(1, i, 1, 300)));
    }
}

#[test]
fn much_pending_is_left_to_the_writer_thread() {
    let dir = TempDir::new("sync-here-much");
    let config = store_config(dir.path());
    let (store, recorder) = open(&config);
    let entries: Vec<_> = (1..=64).map(|i| entry(1, i, 1, 100)).collect();
    for e in &entries {
        store
            .append_blocking_for_sync(1, std::slice::from_ref(e))
            .unwrap();
    }
    assert!(
        !store.sync_here().unwrap(),
        "64 records are a load to batch"
    );
    assert_eq!(recorder.highest(1), None);
    store.sync().unwrap();
    assert_eq!(recorder.highest(1), Some(64));
}

#[test]
fn a_full_disk_gives_the_batch_back_to_the_writer_thread_which_writes_it_once_space_returns() {
    let dir = TempDir::new("sync-here-full");
    let config = store_config(dir.path());
    {
        let (store, recorder) = open(&config);
        store
            .append_blocking_for_sync(1, &[entry(1, 1, 1, 100)])
            .unwrap();
        assert!(store.sync_here().unwrap());
        config.faults.disk_full.store(true, Ordering::Relaxed);
        store
            .append_blocking_for_sync(1, &[entry(1, 2, 1, 100)])
            .unwrap();
        // The caller is not kept waiting for space: the batch goes back to the queue.
        assert!(!store.sync_here().unwrap());
        assert!(store.is_disk_full());
        assert!(
            !store.sync_here().unwrap(),
            "a full disk is the writer's to wait out"
        );
        assert_eq!(recorder.highest(1), Some(1));
        config.faults.disk_full.store(false, Ordering::Relaxed);
        sync_within(&store, Duration::from_secs(10));
        assert_eq!(recorder.highest(1), Some(2));
        store
            .append_blocking_for_sync(1, &[entry(1, 3, 1, 100)])
            .unwrap();
        store.sync().unwrap();
    }
    let (store, _) = open(&config);
    let info = store.log_info(1).unwrap();
    assert_eq!((info.first_index, info.last_index), (1, 3));
    for i in 1..=3 {
        assert_eq!(store.read(1, i).unwrap(), Some(entry(1, i, 1, 100)));
    }
}
