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
