//! Many caller threads on their own logs at once, while WAL files roll and the segment writer
//! flushes, deletes and compacts underneath: every thread's reads must match what it wrote, during
//! the run and after a restart.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use rand::{Rng, SeedableRng};
use warren_store::Store;

const THREADS: u64 = 4;
const LOGS_PER_THREAD: u64 = 3;
const ROUNDS: usize = 1_500;

/// What one log should hold: index -> (term, size, released).
type Expected = BTreeMap<u64, (u64, usize, bool)>;

fn verify(store: &Store, log: u64, expected: &Expected, first: u64) {
    let info = store.log_info(log).unwrap();
    assert_eq!(info.first_index, first, "log {log}");
    assert_eq!(
        info.last_index,
        expected.keys().next_back().copied().unwrap_or(first - 1)
    );
    for (index, (term, size, released)) in expected {
        let got = store.read(log, *index).unwrap();
        if *released {
            assert_eq!(got, None, "log {log} entry {index}");
        } else {
            assert_eq!(
                got,
                Some(entry(log, *index, *term, *size)),
                "log {log} entry {index}"
            );
        }
    }
}

fn worker(store: Arc<Store>, thread: u64) -> Vec<(u64, Expected, u64)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(thread);
    let logs: Vec<u64> = (0..LOGS_PER_THREAD).map(|k| thread * 100 + k).collect();
    let mut state: Vec<(Expected, u64, u64)> =
        logs.iter().map(|_| (Expected::new(), 1, 1)).collect();
    for _ in 0..ROUNDS {
        let k = rng.gen_range(0..logs.len());
        let log = logs[k];
        let (expected, first, term) = &mut state[k];
        let last = expected.keys().next_back().copied().unwrap_or(*first - 1);
        if rng.gen_range(0..25) == 0 {
            // Like a publisher waiting for its confirms: lets WAL files fill and roll meanwhile.
            store.sync().unwrap();
        }
        match rng.gen_range(0..10) {
            0..=4 => {
                let n = rng.gen_range(1..20);
                let size = rng.gen_range(0..400);
                let entries: Vec<_> = (last + 1..=last + n)
                    .map(|i| entry(log, i, *term, size))
                    .collect();
                store.append_blocking(log, &entries).unwrap();
                for i in last + 1..=last + n {
                    expected.insert(i, (*term, size, false));
                }
            }
            5 | 6 if last >= *first => {
                let i = rng.gen_range(*first..=last);
                store.release(log, i).unwrap();
                expected.get_mut(&i).unwrap().2 = true;
            }
            7 if last >= *first => {
                let i = rng.gen_range(*first..=last);
                let t = expected[&i].0;
                store.release_prefix(log, i, t, Bytes::new()).unwrap();
                *expected = expected.split_off(&(i + 1));
                *first = i + 1;
            }
            8 if last >= *first => {
                let i = rng.gen_range(*first..=last);
                store.truncate(log, i).unwrap();
                expected.split_off(&i);
                *term += 1;
            }
            _ if last >= *first => {
                let i = rng.gen_range(*first..=last);
                let (t, size, released) = expected[&i];
                let got = store.read(log, i).unwrap();
                if released {
                    assert_eq!(got, None);
                } else {
                    assert_eq!(got, Some(entry(log, i, t, size)), "log {log} entry {i}");
                }
            }
            _ => {}
        }
    }
    logs.into_iter()
        .zip(state)
        .map(|(log, (expected, first, _))| (log, expected, first))
        .collect()
}

#[test]
fn concurrent_callers_read_what_they_wrote_while_segments_churn() {
    let dir = TempDir::new("concurrent");
    let mut config = store_config(dir.path());
    config.wal_file_bytes_max = 16 << 10;
    config.cache_bytes_max = 32 << 10;
    let store = Arc::new(open(&config).0);
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                store.roll_wal();
                store.compact();
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || worker(store, t))
        })
        .collect();
    let results: Vec<_> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    store.wait_idle().unwrap();
    assert!(store.stats().wal_files_flushed > 5, "{:?}", store.stats());
    for (log, expected, first) in &results {
        verify(&store, *log, expected, *first);
    }
    drop(Arc::try_unwrap(store).ok().expect("only owner"));
    let (store, _) = open(&config);
    for (log, expected, first) in &results {
        verify(&store, *log, expected, *first);
    }
}
