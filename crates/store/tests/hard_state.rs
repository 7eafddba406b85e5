//! Raft hard states: kept in the WAL beside a group's entries, so one sync makes a vote and the
//! entries it covers durable together; they survive a restart whether they come back from the
//! replayed WAL or from the checkpoint after their WAL file was deleted.

mod common;

use common::*;
use warren_store::{Config, HardState};

fn config(dir: &TempDir) -> Config {
    let mut config = Config::new(dir.path());
    config.wal_file_bytes_max = 64 << 10;
    config
}

const A: HardState = HardState {
    term: 3,
    vote: 2,
    commit: 10,
};

#[test]
fn hard_state_comes_back_from_the_replayed_wal() {
    let dir = TempDir::new("hs-replay");
    let config = config(&dir);
    {
        let (store, _) = open(&config);
        // A group that voted before it had any entry still has its vote after a crash.
        store.set_hard_state(7, A).unwrap();
        store.sync().unwrap();
    }
    let (store, _) = open(&config);
    assert_eq!(store.hard_state(7), Some(A));
    assert_eq!(store.hard_state(8), None);
}

#[test]
fn the_last_hard_state_set_wins_and_survives_its_wal_file_being_deleted() {
    let dir = TempDir::new("hs-checkpoint");
    let config = config(&dir);
    let later = HardState {
        term: 4,
        vote: 0,
        commit: 12,
    };
    {
        let (store, _) = open(&config);
        for k in 1..=12 {
            store.append_blocking(7, &[entry(7, k, 3, 100)]).unwrap();
        }
        store.set_hard_state(7, A).unwrap();
        store.set_hard_state(7, later).unwrap();
        // The file holding the records is settled and the checkpoint is what remembers them.
        store.roll_wal();
        store.release_prefix(7, 12, 3, bytes::Bytes::new()).unwrap();
        store.roll_wal();
        store.wait_idle().unwrap();
        store.compact();
        store.wait_idle().unwrap();
    }
    let (store, _) = open(&config);
    assert_eq!(store.hard_state(7), Some(later));
}

#[test]
fn deleting_a_log_forgets_its_hard_state() {
    let dir = TempDir::new("hs-delete");
    let config = config(&dir);
    {
        let (store, _) = open(&config);
        store.set_hard_state(7, A).unwrap();
        store.delete_log(7).unwrap();
        store.sync().unwrap();
    }
    let (store, _) = open(&config);
    assert_eq!(store.hard_state(7), None);
}

#[test]
fn a_commit_index_alone_waits_for_the_next_sync_instead_of_costing_one_and_is_durable_after_it() {
    let dir = TempDir::new("hs-lazy-commit");
    let config = config(&dir);
    let last = HardState {
        commit: A.commit + 20,
        ..A
    };
    {
        let (store, _) = open(&config);
        store.set_hard_state(7, A).unwrap();
        store.sync().unwrap();
        let before = store.stats().wal_syncs;
        let started = std::time::Instant::now();
        for k in 1..=20 {
            store
                .set_hard_state(
                    7,
                    HardState {
                        commit: A.commit + k,
                        ..A
                    },
                )
                .unwrap();
            // Apart, so that each would find the writer idle and get a sync of its own.
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        store.sync().unwrap();
        // One sync carries them all, plus one per lazy deadline (200 ms) the loop outlasted.
        let syncs = store.stats().wal_syncs - before;
        let deadlines = started.elapsed().as_millis() as u64 / 200;
        assert!(
            syncs <= 1 + deadlines,
            "{syncs} syncs for 20 commit indexes in {:?}",
            started.elapsed()
        );
    }
    let (store, _) = open(&config);
    assert_eq!(store.hard_state(7), Some(last));
}

#[test]
fn a_new_term_or_vote_is_written_without_waiting_for_a_sync_call() {
    let dir = TempDir::new("hs-urgent-vote");
    let config = config(&dir);
    let (store, _) = open(&config);
    store.set_hard_state(7, A).unwrap();
    store.sync().unwrap();
    let before = store.stats().wal_syncs;
    let voted = HardState {
        term: A.term + 1,
        vote: 2,
        ..A
    };
    store.set_hard_state(7, voted).unwrap();
    // Nobody calls sync: the writer syncs a vote by itself, as it does an append.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while store.stats().wal_syncs == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the vote was never synced"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_round_queued_for_one_sync_is_durable_after_it_and_a_full_queue_wakes_the_writer_itself() {
    let dir = TempDir::new("hs-for-sync");
    let config = Config::new(dir.path());
    {
        let (store, _) = open(&config);
        let store = std::sync::Arc::new(store);
        // More entries than the pending queue holds, none of them waking the writer: the
        // append that finds the queue full must wake it, or it waits forever.
        let total = warren_store::config::PENDING_ENTRIES_MAX as u64 + 5_000;
        let s = store.clone();
        let filler = std::thread::spawn(move || {
            let chunk = warren_store::config::APPEND_ENTRIES_MAX as u64;
            let mut next = 1;
            while next <= total {
                let last = (next + chunk - 1).min(total);
                let entries: Vec<_> = (next..=last).map(|k| entry(7, k, 3, 10)).collect();
                s.append_blocking_for_sync(7, &entries).unwrap();
                next = last + 1;
            }
        });
        let waited = std::time::Instant::now();
        while !filler.is_finished() {
            assert!(
                waited.elapsed() < std::time::Duration::from_secs(120),
                "appends for a sync stalled on a full queue"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        filler.join().unwrap();
        store
            .append_blocking_for_sync(8, &[entry(8, 1, 3, 10)])
            .unwrap();
        store.set_hard_state_for_sync(8, A).unwrap();
        store.sync().unwrap();
    }
    let (store, _) = open(&config);
    assert_eq!(store.hard_state(8), Some(A));
    assert_eq!(
        store.log_info(7).map(|i| i.last_index),
        Some(warren_store::config::PENDING_ENTRIES_MAX as u64 + 5_000)
    );
    assert_eq!(store.log_info(8).map(|i| i.last_index), Some(1));
}
