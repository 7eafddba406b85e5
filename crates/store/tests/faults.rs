//! What the engine does when the disk misbehaves: torn or garbled WAL tails, failed fsyncs,
//! a full disk.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use warren_store::{Config, Error};

/// Writes entries 1..=n of log 1 one record per call, so the WAL holds n records, and returns
/// the path of the WAL file holding them.
fn write_then_close(config: &Config, n: u64) -> PathBuf {
    let (store, _) = open(config);
    for i in 1..=n {
        store.append(1, &[entry(1, i, 1, 100)]).unwrap();
        store.sync().unwrap();
    }
    drop(store);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&config.wal_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // The newest file is the fresh, empty one; the data is in the one before... or alone.
    files
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap()
}

/// Opens the store and checks that log 1 holds exactly entries 1..=expect_last, all intact.
fn check_prefix(config: &Config, expect_last: u64) {
    let (store, _) = open(config);
    let info = store.log_info(1).unwrap();
    assert_eq!(info.last_index, expect_last);
    for i in 1..=expect_last {
        assert_eq!(
            store.read(1, i).unwrap(),
            Some(entry(1, i, 1, 100)),
            "entry {i}"
        );
    }
    assert_eq!(store.read(1, expect_last + 1).unwrap(), None);
    // The log continues where the intact prefix ends.
    store
        .append(1, &[entry(1, expect_last + 1, 1, 100)])
        .unwrap();
    store.sync().unwrap();
}

/// Where each append record of a WAL file starts and ends (batches end in padding, so records
/// are not back to back).
fn append_records(wal: &PathBuf) -> Vec<(u64, u64)> {
    use warren_store::record::{decode, Decoded, RecordKind};
    let bytes = std::fs::read(wal).unwrap();
    let mut at = warren_store::wal::WAL_HEADER_BYTES as usize;
    let mut out = Vec::new();
    while let Decoded::Record(h, _) = decode(&bytes[at..]) {
        if h.kind == RecordKind::Append {
            out.push((at as u64, (at + h.record_bytes()) as u64));
        }
        at += h.record_bytes();
    }
    out
}

/// The end of the last append record of a WAL file.
fn last_record_end(wal: &PathBuf) -> u64 {
    append_records(wal).last().unwrap().1
}

#[test]
fn torn_tail_is_truncated_and_everything_before_it_is_intact() {
    let dir = TempDir::new("torn");
    let config = store_config(dir.path());
    let wal = write_then_close(&config, 100);
    let end = last_record_end(&wal);
    OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(end - 10)
        .unwrap();
    check_prefix(&config, 99);
    // Reopening again (after the repaired file was flushed to segments) changes nothing.
    let (store, _) = open(&config);
    assert_eq!(store.log_info(1).unwrap().last_index, 100);
    assert_eq!(store.read(1, 99).unwrap(), Some(entry(1, 99, 1, 100)));
}

#[test]
fn garbled_last_record_is_dropped_never_returned() {
    let dir = TempDir::new("garbled");
    let config = store_config(dir.path());
    let wal = write_then_close(&config, 100);
    let end = last_record_end(&wal);
    let file = OpenOptions::new().write(true).open(&wal).unwrap();
    file.write_all_at(b"garbage!", end - 20).unwrap();
    check_prefix(&config, 99);
}

#[test]
fn garbled_record_in_the_middle_ends_the_log_there() {
    let dir = TempDir::new("garbled-middle");
    let config = store_config(dir.path());
    let wal = write_then_close(&config, 100);
    let record_50 = append_records(&wal)[49].0;
    let file = OpenOptions::new().write(true).open(&wal).unwrap();
    file.write_all_at(&[0xff; 4], record_50 + 60).unwrap();
    check_prefix(&config, 49);
}

#[test]
fn junk_after_the_last_record_is_ignored() {
    let dir = TempDir::new("junk");
    let config = store_config(dir.path());
    let wal = write_then_close(&config, 100);
    let len = std::fs::metadata(&wal).unwrap().len();
    let file = OpenOptions::new().write(true).open(&wal).unwrap();
    file.write_all_at(&[0x5a; 333], len).unwrap();
    check_prefix(&config, 100);
}

#[test]
fn failed_fsync_poisons_every_later_write() {
    let dir = TempDir::new("poison");
    let config = store_config(dir.path());
    {
        let (store, recorder) = open(&config);
        store.append(1, &[entry(1, 1, 1, 100)]).unwrap();
        store.sync().unwrap();
        config.faults.fail_sync.store(true, Ordering::Relaxed);
        store.append(1, &[entry(1, 2, 1, 100)]).unwrap();
        // Callers that asked not to block are told too, not left waiting: one that asked
        // before the failed fsync, one after.
        let (tx, rx) = std::sync::mpsc::channel();
        let before = tx.clone();
        store.sync_then(Box::new(move |r| before.send(r).unwrap()));
        assert!(matches!(store.sync(), Err(Error::Poisoned(_))));
        store.sync_then(Box::new(move |r| tx.send(r).unwrap()));
        for _ in 0..2 {
            assert!(matches!(rx.recv().unwrap(), Err(Error::Poisoned(_))));
        }
        assert!(matches!(
            store.append(1, &[entry(1, 3, 1, 100)]),
            Err(Error::Poisoned(_))
        ));
        assert!(matches!(store.release(1, 1), Err(Error::Poisoned(_))));
        assert_eq!(recorder.failures.load(Ordering::Relaxed), 1);
        assert_eq!(
            recorder.highest(1),
            Some(1),
            "entry 2 was never reported durable"
        );
    }
    check_prefix_at_least(&config, 1);
}

fn check_prefix_at_least(config: &Config, durable: u64) {
    let (store, _) = open(config);
    let info = store.log_info(1).unwrap();
    assert!(info.last_index >= durable);
    for i in 1..=info.last_index {
        assert_eq!(store.read(1, i).unwrap(), Some(entry(1, i, 1, 100)));
    }
}

#[test]
fn full_disk_refuses_appends_distinctly_then_recovers_without_damage() {
    let dir = TempDir::new("enospc");
    let config = store_config(dir.path());
    {
        let (store, recorder) = open(&config);
        store.append(1, &[entry(1, 1, 1, 100)]).unwrap();
        store.sync().unwrap();
        config.faults.disk_full.store(true, Ordering::Relaxed);
        store.append(1, &[entry(1, 2, 1, 100)]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut next = 3;
        loop {
            match store.append(1, &[entry(1, next, 1, 100)]) {
                Ok(()) => next += 1,
                Err(Error::DiskFull) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(Instant::now() < deadline, "never told the disk is full");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(recorder.highest(1), Some(1));
        config.faults.disk_full.store(false, Ordering::Relaxed);
        store.sync().unwrap();
        assert_eq!(recorder.highest(1), Some(next - 1));
        store.append(1, &[entry(1, next, 1, 100)]).unwrap();
        store.sync().unwrap();
    }
    check_prefix_at_least(&config, 3);
}
