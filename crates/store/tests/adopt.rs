//! Adopted WAL files: a backlog rolled over while live is kept in place (written once), and the
//! engine's guarantees hold through releases, compaction, truncation, log deletion, a damaged
//! sidecar and a crash at every step of the segment writer.

mod common;

use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::*;
use warren_store::{Config, CrashPoint, Error, Store};

const SIZE: usize = 200;
/// Entries of a log `fill` writes with one append and one sync: one WAL batch, so its padding
/// (under two pages) stays small beside its records and a file of such batches is mostly live,
/// adopted when rolled, however many appends a sync would carry on this machine.
const CHUNK: u64 = 50;
/// Entries of a log `fill` puts in one WAL file before rolling it. The files roll where the
/// tests say, never at the size limit (see `config`), so how many there are follows from the
/// tests' own calls.
const FILE_ENTRIES: u64 = 250;
// `fill` rolls at chunk boundaries.
const _: () = assert!(FILE_ENTRIES.is_multiple_of(CHUNK));

fn config(dir: &TempDir) -> Config {
    let mut config = store_config(dir.path());
    // Far above what `fill` writes between two rolls (250 entries of each log, a few pages of
    // padding): files roll only when the tests roll them.
    config.wal_file_bytes_max = 4 << 20;
    config
}

/// How many WAL files `fill` spreads `n` entries over: `FILE_ENTRIES` to a file.
fn files_for(n: u64) -> u64 {
    n.div_ceil(FILE_ENTRIES)
}

/// Appends `from..=to` to each of `logs`, interleaved by `CHUNK`, one synced append per log
/// and chunk; rolls the WAL file after every `FILE_ENTRIES` indexes (waiting until it is
/// settled), and leaves the last one, full or not, active.
fn fill(store: &Store, logs: &[u64], from: u64, to: u64, term: u64, size: usize) {
    let mut k = from;
    while k <= to {
        let end = (k + CHUNK - 1).min(to);
        for &log in logs {
            let entries: Vec<_> = (k..=end).map(|i| entry(log, i, term, size)).collect();
            store.append_blocking(log, &entries).unwrap();
            store.sync().unwrap();
        }
        k = end + 1;
        if k <= to && (k - from).is_multiple_of(FILE_ENTRIES) {
            roll(store);
        }
    }
}

/// Rolls the active WAL file and waits until the segment writer has settled it.
fn roll(store: &Store) {
    store.roll_wal();
    store.wait_idle().unwrap();
}

/// Checks that `log` holds `from..=to` of `term` and `size`, except the `released` ones.
fn check(
    store: &Store,
    log: u64,
    from: u64,
    to: u64,
    term: u64,
    size: usize,
    released: impl Fn(u64) -> bool,
) {
    for k in from..=to {
        let expected = (!released(k)).then(|| entry(log, k, term, size));
        assert_eq!(store.read(log, k).unwrap(), expected, "log {log} entry {k}");
    }
}

/// Makes the segment writer stop dead at `point` during what `trigger` starts, then drops the
/// engine (everything before was synced, so nothing is lost but the segment writer's work).
fn crash_at(store: Store, config: &Config, point: CrashPoint, trigger: impl Fn(&Store)) {
    store.sync().unwrap();
    config.faults.crash_at.store(point as u8, Ordering::Relaxed);
    trigger(&store);
    assert!(
        matches!(store.wait_idle(), Err(Error::Poisoned(why)) if why.contains("simulated crash")),
        "the segment writer never reached {point:?}"
    );
    drop(store);
}

#[test]
fn backlog_is_written_once_and_survives_restart() {
    let dir = TempDir::new("adopt-once");
    let config = config(&dir);
    {
        let (store, _) = open(&config);
        fill(&store, &[1], 1, 2_000, 1, SIZE);
        roll(&store);
        let stats = store.stats();
        assert_eq!(stats.wal_files_adopted, files_for(2_000), "{stats:?}");
        assert_eq!(stats.wal_files_flushed, 0, "{stats:?}");
        assert_eq!(stats.segment_bytes, 0, "{stats:?}");
        assert_eq!(file_count(&config.segment_dir), 0);
        assert_eq!(
            files_with(&config.wal_dir, "idx") as u64,
            stats.wal_files_adopted
        );
        // Sidecars cost a few bytes per entry, not a copy of the data.
        assert!(stats.adopted_index_bytes < 2_000 * 16, "{stats:?}");
        check(&store, 1, 1, 2_000, 1, SIZE, |_| false);
    }
    let (store, _) = open(&config);
    check(&store, 1, 1, 2_000, 1, SIZE, |_| false);
    assert_eq!(store.log_info(1).unwrap().live_entries, 2_000);
    store.compact();
    store.wait_idle().unwrap();
    assert_eq!(
        store.stats().segment_bytes,
        0,
        "nothing copied after the restart"
    );
}

#[test]
fn fully_released_adopted_files_are_deleted_with_their_sidecars() {
    let dir = TempDir::new("adopt-empty");
    let config = config(&dir);
    {
        let (store, _) = open(&config);
        fill(&store, &[1], 1, 2_000, 1, SIZE);
        roll(&store);
        let adopted = store.stats().wal_files_adopted;
        assert_eq!(adopted, files_for(2_000));
        store
            .release_prefix(1, 2_000, 1, Bytes::from_static(b"drained"))
            .unwrap();
        store.compact();
        store.wait_idle().unwrap();
        let stats = store.stats();
        assert_eq!(stats.adopted_files_deleted, adopted, "{stats:?}");
        assert_eq!(
            stats.adopted_files_compacted, 0,
            "nothing was worth copying"
        );
        assert_eq!(files_with(&config.wal_dir, "idx"), 0);
        assert_eq!(
            files_with(&config.wal_dir, "wal"),
            1,
            "only the active WAL file remains"
        );
        assert_eq!(
            file_count(&config.wal_dir),
            1 + warren_store::config::WAL_SPARE_FILES_MAX,
            "beside the spares kept to recycle"
        );
    }
    let (store, infos) = open_infos(&config);
    assert_eq!(
        (
            infos[0].first_index,
            infos[0].last_index,
            infos[0].live_entries
        ),
        (2_001, 2_000, 0)
    );
    assert_eq!(
        store.snapshot(1).unwrap().blob,
        Bytes::from_static(b"drained")
    );
}

fn open_infos(config: &Config) -> (Store, Vec<warren_store::LogInfo>) {
    Store::open(
        config.clone(),
        std::sync::Arc::new(warren_store::NoopListener),
    )
    .unwrap()
}

#[test]
fn adopted_file_gone_mostly_dead_is_compacted_into_segments_once_quiet() {
    let dir = TempDir::new("adopt-compact");
    let config = config(&dir);
    let released = |k: u64| !k.is_multiple_of(10);
    {
        let (store, _) = open(&config);
        fill(&store, &[1], 1, 2_000, 1, SIZE);
        roll(&store);
        let adopted = store.stats().wal_files_adopted;
        for k in (1..=2_000).filter(|k| released(*k)) {
            store.release(1, k).unwrap();
        }
        // A pass right after the releases (as after a rollover) leaves the files alone: a
        // consumer still reading through them would empty them for free.
        store.append_blocking(2, &[entry(2, 1, 1, 10)]).unwrap();
        roll(&store);
        assert_eq!(store.stats().adopted_files_compacted, 0);
        assert_eq!(files_with(&config.wal_dir, "idx") as u64, adopted);
        // Asked for (or after ADOPTED_QUIET_MS without change), they are copied and deleted.
        store.compact();
        store.wait_idle().unwrap();
        let stats = store.stats();
        assert_eq!(stats.adopted_files_compacted, adopted, "{stats:?}");
        assert!(
            stats.segment_bytes > 0 && stats.segment_bytes < 2_000 * 250,
            "{stats:?}"
        );
        assert!(file_count(&config.segment_dir) > 0);
        check(&store, 1, 1, 2_000, 1, SIZE, released);
    }
    let (store, _) = open(&config);
    check(&store, 1, 1, 2_000, 1, SIZE, released);
    assert_eq!(store.log_info(1).unwrap().live_entries, 200);
}

#[test]
fn crash_between_sidecar_and_checkpoint_replays_the_file_and_adopts_it_again() {
    let dir = TempDir::new("adopt-crash-sidecar");
    let config = config(&dir);
    let (store, _) = open(&config);
    fill(&store, &[1], 1, 200, 1, SIZE);
    store.release(1, 7).unwrap();
    crash_at(store, &config, CrashPoint::AfterSidecar, |s| s.roll_wal());
    assert_eq!(
        files_with(&config.wal_dir, "idx"),
        1,
        "the sidecar was written"
    );
    let released = |k: u64| k == 7;
    {
        let (store, _) = open(&config);
        check(&store, 1, 1, 200, 1, SIZE, released);
        store.wait_idle().unwrap();
        assert_eq!(
            store.stats().wal_files_adopted,
            1,
            "settled again after replay"
        );
        check(&store, 1, 1, 200, 1, SIZE, released);
    }
    let (store, _) = open(&config);
    check(&store, 1, 1, 200, 1, SIZE, released);
    assert_eq!(files_with(&config.wal_dir, "idx"), 1);
}

#[test]
fn crash_after_checkpoint_before_deleting_an_emptied_file_deletes_it_at_the_next_open() {
    let dir = TempDir::new("adopt-crash-delete");
    let config = config(&dir);
    let (store, _) = open(&config);
    fill(&store, &[1], 1, 400, 1, SIZE);
    roll(&store);
    assert_eq!(store.stats().wal_files_adopted, files_for(400));
    for k in 1..=400 {
        store.release(1, k).unwrap();
    }
    crash_at(store, &config, CrashPoint::AfterCheckpoint, |s| s.compact());
    assert_eq!(
        files_with(&config.wal_dir, "idx") as u64,
        files_for(400),
        "not deleted yet"
    );
    let (store, infos) = open_infos(&config);
    assert_eq!((infos[0].last_index, infos[0].live_entries), (400, 0));
    assert_eq!(files_with(&config.wal_dir, "idx"), 0);
    store.wait_idle().unwrap(); // settles the replayed file of releases
    assert_eq!(
        files_with(&config.wal_dir, "wal"),
        1,
        "only the new active file"
    );
    check(&store, 1, 1, 400, 1, SIZE, |_| true);
}

#[test]
fn crash_after_copying_an_adopted_file_before_the_checkpoint_loses_nothing() {
    let dir = TempDir::new("adopt-crash-compact");
    let config = config(&dir);
    let released = |k: u64| !k.is_multiple_of(8);
    let (store, _) = open(&config);
    fill(&store, &[1], 1, 1_000, 1, SIZE);
    roll(&store);
    for k in (1..=1_000).filter(|k| released(*k)) {
        store.release(1, k).unwrap();
    }
    crash_at(store, &config, CrashPoint::AfterAdoptedCompaction, |s| {
        s.compact()
    });
    {
        let (store, _) = open(&config);
        check(&store, 1, 1, 1_000, 1, SIZE, released);
        store.compact();
        store.wait_idle().unwrap();
        assert_eq!(store.stats().adopted_files_compacted, files_for(1_000));
        check(&store, 1, 1, 1_000, 1, SIZE, released);
    }
    let (store, _) = open(&config);
    check(&store, 1, 1, 1_000, 1, SIZE, released);
}

/// Flips a byte in the middle of every sidecar.
fn damage_sidecars(config: &Config) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(&config.wal_dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "idx") {
            let mut bytes = std::fs::read(&path).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn damaged_sidecar_is_rebuilt_from_the_wal_file() {
    let dir = TempDir::new("adopt-bad-sidecar");
    let config = config(&dir);
    let released = |k: u64| k.is_multiple_of(3);
    {
        let (store, _) = open(&config);
        fill(&store, &[1], 1, 1_000, 1, SIZE);
        roll(&store);
        for k in (1..=1_000).filter(|k| released(*k)) {
            store.release(1, k).unwrap();
        }
        // Checkpointed with the releases, files still adopted (over 25 % live).
        store.compact();
        store.wait_idle().unwrap();
        assert_eq!(store.stats().adopted_files_compacted, 0);
    }
    assert_eq!(damage_sidecars(&config) as u64, files_for(1_000));
    {
        let (store, _) = open(&config);
        check(&store, 1, 1, 1_000, 1, SIZE, released);
    }
    // Rebuilt sidecars serve the next open.
    let (store, _) = open(&config);
    check(&store, 1, 1, 1_000, 1, SIZE, released);
}

#[test]
fn damaged_sidecar_over_a_damaged_wal_file_fails_the_open_as_corrupt() {
    let dir = TempDir::new("adopt-bad-both");
    let config = config(&dir);
    {
        let (store, _) = open(&config);
        fill(&store, &[1], 1, 1_000, 1, SIZE);
        roll(&store);
    }
    assert_eq!(damage_sidecars(&config) as u64, files_for(1_000));
    // Cut an adopted file in half: entries the checkpoint says are live are gone.
    let victim = std::fs::read_dir(&config.wal_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "idx"))
        .min()
        .unwrap()
        .with_extension("wal");
    let len = std::fs::metadata(&victim).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let opened = Store::open(
        config.clone(),
        std::sync::Arc::new(warren_store::NoopListener),
    );
    assert!(
        matches!(opened, Err(Error::Corrupt(_))),
        "{:?}",
        opened.err()
    );
}

#[test]
fn truncation_into_an_adopted_file_and_the_newer_entries_survive_restart() {
    let dir = TempDir::new("adopt-truncate");
    let config = config(&dir);
    let expect = |store: &Store, last: u64| {
        check(store, 1, 1, 299, 1, SIZE, |_| false);
        check(store, 1, 300, last, 2, 100, |_| false);
        let info = store.log_info(1).unwrap();
        assert_eq!((info.last_index, info.last_term), (last, 2));
        assert_eq!(store.term(1, 299), Some(1));
        assert_eq!(store.term(1, 300), Some(2));
    };
    {
        let (store, _) = open(&config);
        fill(&store, &[1], 1, 600, 1, SIZE);
        roll(&store);
        assert_eq!(store.stats().wal_files_adopted, files_for(600));
        // In the middle of the second file.
        store.truncate(1, 300).unwrap();
        fill(&store, &[1], 300, 400, 2, 100);
        store.sync().unwrap();
    }
    {
        // The newer entries come back from the replayed WAL.
        let (store, _) = open(&config);
        expect(&store, 400);
        fill(&store, &[1], 401, 420, 2, 100);
        // ... and once settled too (adopted or copied), with the older copies still on disk.
        roll(&store);
        store.compact();
        store.wait_idle().unwrap();
        expect(&store, 420);
    }
    let (store, _) = open(&config);
    expect(&store, 420);
}

#[test]
fn a_log_deleted_and_created_again_never_reads_its_earlier_life_from_an_adopted_file() {
    let dir = TempDir::new("adopt-delete");
    let config = config(&dir);
    let expect = |store: &Store| {
        check(store, 9, 1, 100, 1, 50, |_| false);
        assert_eq!(store.log_info(9).unwrap().last_index, 100);
        check(store, 8, 1, 300, 1, SIZE, |_| false);
    };
    {
        let (store, _) = open(&config);
        // Log 8 keeps the files adopted after log 9's entries in them are gone.
        fill(&store, &[9, 8], 1, 300, 1, SIZE);
        roll(&store);
        assert_eq!(store.stats().wal_files_adopted, files_for(300));
        store.delete_log(9).unwrap();
        // Same ids, same term: only which life an entry belongs to tells them apart. One
        // synced append each, so each ends in a page of padding: the file is mostly padding,
        // and the new life is copied into segments, which recovery loads before the adopted
        // files (a newer adopted file would hide a stale pointer from an older one).
        for k in 1..=100 {
            store.append_blocking(9, &[entry(9, k, 1, 50)]).unwrap();
            store.sync().unwrap();
        }
        roll(&store);
        store.compact();
        store.wait_idle().unwrap();
        // The earlier life is still on disk, in adopted files, for the reads and the restart;
        // the new one is in segments.
        let stats = store.stats();
        assert_eq!(
            (
                stats.wal_files_adopted,
                stats.adopted_files_deleted,
                stats.adopted_files_compacted
            ),
            (files_for(300), 0, 0),
            "{stats:?}"
        );
        assert!(stats.segment_bytes >= 100 * 50, "{stats:?}");
        expect(&store);
    }
    let (store, _) = open(&config);
    expect(&store);
}
