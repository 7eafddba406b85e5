//! A group's log as raft-rs reads it back: what the entry cache serves is what the store
//! holds, through appends, overwrites by a new leader, and entries applied and let go.

use raft::eraftpb::Entry;
use raft::{GetEntriesContext, Storage};
use std::sync::Arc;
use warren_cluster::raft_log::RaftLog;
use warren_store::{Config, NoopListener, Store};

fn entry(index: u64, term: u64, data: &str) -> Entry {
    Entry {
        index,
        term,
        data: data.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

fn read(log: &RaftLog, low: u64, high: u64, max: Option<u64>) -> Vec<(u64, u64, Vec<u8>)> {
    log.entries(low, high, max, GetEntriesContext::empty(false))
        .unwrap()
        .into_iter()
        .map(|e| (e.index, e.term, e.data.to_vec()))
        .collect()
}

#[test]
fn cached_entries_read_back_as_the_store_has_them() {
    let dir = std::env::temp_dir().join(format!("warren-raft-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (store, _) = Store::open(Config::new(dir.join("store")), Arc::new(NoopListener)).unwrap();
    let store = Arc::new(store);
    let log = RaftLog::open(store.clone(), 77, &dir.join("group"), &[1]).unwrap();
    log.append(
        &(1..=5)
            .map(|i| entry(i, 1, &format!("a{i}")))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    // A new leader overwrites 4 and 5.
    log.append(&[entry(4, 2, "b4"), entry(5, 2, "b5"), entry(6, 2, "b6")])
        .unwrap();
    let expected = vec![
        (2, 1, b"a2".to_vec()),
        (3, 1, b"a3".to_vec()),
        (4, 2, b"b4".to_vec()),
        (5, 2, b"b5".to_vec()),
        (6, 2, b"b6".to_vec()),
    ];
    assert_eq!(read(&log, 2, 7, None), expected);
    // A size limit still gives at least one entry.
    assert_eq!(read(&log, 2, 7, Some(0)), expected[..1].to_vec());
    // Applied and let go from the cache: read from the store alike.
    log.applied_to(6);
    assert_eq!(read(&log, 2, 7, None), expected);
    let reopened = RaftLog::open(store, 77, &dir.join("group"), &[1]).unwrap();
    assert_eq!(read(&reopened, 2, 7, None), expected);
    let _ = std::fs::remove_dir_all(&dir);
}

fn snapshot_at(index: u64, term: u64) -> raft::eraftpb::Snapshot {
    let mut s = raft::eraftpb::Snapshot {
        data: format!("state at {index}").into_bytes().into(),
        ..Default::default()
    };
    s.mut_metadata().index = index;
    s.mut_metadata().term = term;
    s.mut_metadata().mut_conf_state().voters = vec![1];
    s
}

#[test]
fn a_snapshot_written_off_the_loop_never_replaces_a_later_one_nor_outlives_its_group() {
    let dir = std::env::temp_dir().join(format!("warren-raft-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (store, _) = Store::open(Config::new(dir.join("store")), Arc::new(NoopListener)).unwrap();
    let store = Arc::new(store);
    let log = RaftLog::open(store.clone(), 79, &dir.join("group"), &[1]).unwrap();
    log.append(&(1..=10).map(|i| entry(i, 1, "x")).collect::<Vec<_>>())
        .unwrap();
    // The writer took a snapshot at 4; before it reports, one at 8 is saved (a leader's, or a
    // membership change's): the late report changes neither the file nor the latest.
    let early = snapshot_at(4, 1);
    let file = log.snapshot_file();
    log.save_snapshot_releasing(&snapshot_at(8, 1), 6).unwrap();
    assert!(
        !file.write(&early).unwrap(),
        "an older snapshot is not written"
    );
    log.snapshot_saved(&early, 4).unwrap();
    assert_eq!(log.snapshot_meta(), (8, 1));
    assert_eq!(log.first_index().unwrap(), 7, "released up to 6");
    let reopened = RaftLog::open(store.clone(), 79, &dir.join("group"), &[1]).unwrap();
    assert_eq!(
        reopened.snapshot_meta(),
        (8, 1),
        "the file holds the later one"
    );
    // A later snapshot from the writer is written and becomes the latest once it reports.
    let later = snapshot_at(10, 1);
    assert!(file.write(&later).unwrap());
    assert_eq!(log.snapshot_meta(), (8, 1), "not before the report");
    log.snapshot_saved(&later, 9).unwrap();
    assert_eq!(
        (log.snapshot_meta(), log.first_index().unwrap()),
        ((10, 1), 10)
    );
    // Once the group closed, nothing more is written (its directory is about to go).
    file.close();
    assert!(!file.write(&snapshot_at(12, 1)).unwrap());
    let reopened = RaftLog::open(store, 79, &dir.join("group"), &[1]).unwrap();
    assert_eq!(reopened.snapshot_meta(), (10, 1));
    let _ = std::fs::remove_dir_all(&dir);
}
