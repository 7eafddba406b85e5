//! `Store::sync_now_then`: a caller whose records are one batch already has them synced without
//! the commit window, which `Store::sync_then` lets pass when records stream in.

mod common;

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use common::*;
use warren_store::{Config, Store};

/// A window longer than the test waits for a sync (so a sync held by it fails the test), and
/// short enough that the store, which waits it out as it closes, lets a failed test end.
const LONG_WINDOW_US: u64 = 90_000_000;

fn config_with_window(dir: &TempDir, window_us: u64) -> Config {
    let mut config = store_config(dir.path());
    config.commit_window_us = window_us;
    config
}

/// Appends a first record and syncs it, so that the writer's last sync has just begun, then
/// queues `n` more the way the queue groups' loop does (without waking the writer): to the
/// writer, enough records to look like a stream.
fn after_a_sync_queue(store: &Store, n: u64) {
    store.append_blocking(1, &[entry(1, 1, 1, 100)]).unwrap();
    store.sync().unwrap();
    for i in 2..=n + 1 {
        store
            .append_blocking_for_sync(1, &[entry(1, i, 1, 100)])
            .unwrap();
    }
}

fn asked(store: &Store, now: bool) -> Receiver<Result<(), String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let done = Box::new(move |result: warren_store::Result<()>| {
        let _ = tx.send(result.map_err(|e| e.to_string()));
    });
    if now {
        store.sync_now_then(done);
    } else {
        store.sync_then(done);
    }
    rx
}

#[test]
fn a_sync_asked_now_is_not_held_by_the_commit_window() {
    let dir = TempDir::new("sync-now");
    let config = config_with_window(&dir, LONG_WINDOW_US);
    {
        let (store, recorder) = open(&config);
        after_a_sync_queue(&store, 8);
        let told = asked(&store, true).recv_timeout(Duration::from_secs(30));
        told.expect("the sync waited for the commit window")
            .unwrap();
        assert_eq!(recorder.highest(1), Some(9));
    }
    let (store, _) = open(&config);
    assert_eq!(store.log_info(1).unwrap().last_index, 9);
}

#[test]
fn a_plain_sync_of_a_stream_waits_out_the_commit_window() {
    let dir = TempDir::new("sync-windowed");
    let config = config_with_window(&dir, 3_000_000);
    let (store, recorder) = open(&config);
    after_a_sync_queue(&store, 8);
    let told = asked(&store, false);
    // Not before the window has passed, however fast or slow the machine.
    assert_eq!(
        told.recv_timeout(Duration::from_millis(500)),
        Err(RecvTimeoutError::Timeout)
    );
    assert_eq!(recorder.highest(1), Some(1));
    told.recv_timeout(Duration::from_secs(60)).unwrap().unwrap();
    assert_eq!(recorder.highest(1), Some(9));
}
