//! Property test: the engine against a simple in-memory model, under random appends, releases
//! (single and prefix), truncations, log deletions, WAL rollovers (tiny WAL files), compaction
//! passes, restarts and crashes of the segment writer at each of its steps. Each case runs
//! with rolled WAL files always adopted in place, adopted when mostly live (the default), or
//! never adopted. Every entry the model holds must read back identically, every released or
//! truncated one must read as absent, and terms and ranges must agree.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use warren_store::{Config, CrashPoint, Error, Store};

const LOGS: u64 = 3;

#[derive(Clone, Debug)]
enum Op {
    Append {
        log: u64,
        count: u64,
        size: usize,
        new_term: bool,
    },
    Release {
        log: u64,
        pick: u64,
    },
    ReleaseMany {
        log: u64,
        pick: u64,
        count: u64,
    },
    ReleasePrefix {
        log: u64,
        pick: u64,
        beyond: bool,
    },
    Truncate {
        log: u64,
        pick: u64,
    },
    Delete {
        log: u64,
    },
    Roll,
    RollAndWait,
    Compact,
    Restart,
    /// Sync, then make the segment writer stop dead at a step (1 after an adopted file's
    /// sidecar, 2 after a checkpoint, 3 after copying an adopted file) and restart.
    Crash(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..LOGS, 1..40u64, 0..600usize, prop::bool::weighted(0.1))
            .prop_map(|(log, count, size, new_term)| Op::Append { log, count, size, new_term }),
        4 => (0..LOGS, any::<u64>()).prop_map(|(log, pick)| Op::Release { log, pick }),
        2 => (0..LOGS, any::<u64>(), 1..30u64).prop_map(|(log, pick, count)| Op::ReleaseMany { log, pick, count }),
        2 => (0..LOGS, any::<u64>(), prop::bool::weighted(0.1))
            .prop_map(|(log, pick, beyond)| Op::ReleasePrefix { log, pick, beyond }),
        2 => (0..LOGS, any::<u64>()).prop_map(|(log, pick)| Op::Truncate { log, pick }),
        1 => (0..LOGS).prop_map(|log| Op::Delete { log }),
        2 => Just(Op::Roll),
        2 => Just(Op::RollAndWait),
        1 => Just(Op::Compact),
        2 => Just(Op::Restart),
        2 => (1..=3u8).prop_map(Op::Crash),
    ]
}

#[derive(Clone, Debug)]
struct ModelLog {
    first: u64,
    /// index -> (term, size, released)
    entries: BTreeMap<u64, (u64, usize, bool)>,
    snapshot: (u64, u64),
    term: u64,
}

impl Default for ModelLog {
    fn default() -> ModelLog {
        ModelLog {
            first: 1,
            entries: BTreeMap::new(),
            snapshot: (0, 0),
            term: 1,
        }
    }
}

impl ModelLog {
    fn last(&self) -> u64 {
        self.entries
            .keys()
            .next_back()
            .copied()
            .unwrap_or(self.first - 1)
    }
    fn last_term(&self) -> u64 {
        self.entries
            .values()
            .next_back()
            .map_or(self.snapshot.1, |e| e.0)
    }
    fn len(&self) -> u64 {
        self.entries.len() as u64
    }
}

fn check(store: &Store, model: &HashMap<u64, ModelLog>) {
    for log_id in 0..LOGS {
        let Some(m) = model.get(&log_id) else {
            assert_eq!(
                store.log_info(log_id),
                None,
                "log {log_id} should not exist"
            );
            continue;
        };
        let info = store.log_info(log_id).expect("log exists");
        assert_eq!(
            (
                info.first_index,
                info.last_index,
                info.last_term,
                info.snapshot_index
            ),
            (m.first, m.last(), m.last_term(), m.snapshot.0),
            "log {log_id} info"
        );
        let live = m.entries.values().filter(|e| !e.2).count() as u64;
        assert_eq!(info.live_entries, live, "log {log_id} live entries");
        for (index, (term, size, released)) in &m.entries {
            let got = store.read(log_id, *index).unwrap();
            if *released {
                assert_eq!(got, None, "log {log_id} entry {index} is released");
            } else {
                assert_eq!(
                    got,
                    Some(entry(log_id, *index, *term, *size)),
                    "log {log_id} entry {index}"
                );
            }
            assert_eq!(store.term(log_id, *index), Some(*term));
        }
        let range = store.read_range(log_id, 0, u64::MAX, usize::MAX).unwrap();
        assert_eq!(range.len() as u64, live.min(4096));
    }
}

fn reopen(config: &Config, model: &HashMap<u64, ModelLog>) -> Store {
    let (s, infos) = Store::open(
        config.clone(),
        std::sync::Arc::new(warren_store::NoopListener),
    )
    .unwrap();
    let mut expected: Vec<u64> = model.keys().copied().collect();
    expected.sort();
    assert_eq!(infos.iter().map(|i| i.log_id).collect::<Vec<_>>(), expected);
    s
}

fn run(ops: Vec<Op>, adopt_live_percent_min: u64) {
    let dir = TempDir::new("model");
    let mut config = store_config(dir.path());
    config.wal_file_bytes_max = 4 << 10;
    config.cache_bytes_max = 8 << 10;
    config.adopt_live_percent_min = adopt_live_percent_min;
    let mut store = Some(open(&config).0);
    let mut model: HashMap<u64, ModelLog> = HashMap::new();
    for op in ops {
        let s = store.as_ref().unwrap();
        match op {
            Op::Append {
                log,
                count,
                size,
                new_term,
            } => {
                let m = model.entry(log).or_default();
                if new_term {
                    m.term += 1;
                }
                let start = m.last() + 1;
                let entries: Vec<_> = (start..start + count)
                    .map(|i| entry(log, i, m.term, size))
                    .collect();
                s.append_blocking(log, &entries).unwrap();
                for i in start..start + count {
                    m.entries.insert(i, (m.term, size, false));
                }
            }
            Op::Release { log, pick } => {
                let Some(m) = model.get_mut(&log) else {
                    continue;
                };
                if m.len() == 0 {
                    continue;
                }
                let index = m.first + pick % m.len();
                s.release(log, index).unwrap();
                m.entries.get_mut(&index).unwrap().2 = true;
            }
            Op::ReleaseMany { log, pick, count } => {
                let Some(m) = model.get_mut(&log) else {
                    continue;
                };
                if m.len() == 0 {
                    continue;
                }
                let from = m.first + pick % m.len();
                for index in from..(from + count).min(m.last() + 1) {
                    s.release(log, index).unwrap();
                    m.entries.get_mut(&index).unwrap().2 = true;
                }
            }
            Op::ReleasePrefix { log, pick, beyond } => {
                let Some(m) = model.get_mut(&log) else {
                    continue;
                };
                let (index, term) = if beyond || m.len() == 0 {
                    let index = m.last() + 1 + pick % 5;
                    (index, m.term)
                } else {
                    let index = m.first + pick % m.len();
                    (index, m.entries[&index].0)
                };
                let blob = Bytes::from(format!("snap {log} {index}"));
                s.release_prefix(log, index, term, blob.clone()).unwrap();
                m.entries = m.entries.split_off(&(index + 1));
                m.first = index + 1;
                m.snapshot = (index, term);
                m.term = m.term.max(term);
                assert_eq!(s.snapshot(log).unwrap().blob, blob);
            }
            Op::Truncate { log, pick } => {
                let Some(m) = model.get_mut(&log) else {
                    continue;
                };
                if m.len() == 0 {
                    continue;
                }
                let from = m.first + pick % m.len();
                s.truncate(log, from).unwrap();
                m.entries.split_off(&from);
                m.term += 1;
            }
            Op::Delete { log } => {
                s.delete_log(log).unwrap();
                model.remove(&log);
            }
            Op::Roll => s.roll_wal(),
            Op::RollAndWait => {
                s.roll_wal();
                s.wait_idle().unwrap();
            }
            Op::Compact => {
                s.compact();
                s.wait_idle().unwrap();
            }
            Op::Restart => {
                drop(store.take());
                store = Some(reopen(&config, &model));
            }
            Op::Crash(point) => {
                // Everything the model holds is durable before the crash.
                s.sync().unwrap();
                config.faults.crash_at.store(point, Ordering::Relaxed);
                if point == CrashPoint::AfterSidecar as u8 {
                    s.roll_wal();
                } else {
                    s.compact();
                }
                match s.wait_idle() {
                    Ok(()) => config.faults.crash_at.store(0, Ordering::Relaxed),
                    Err(Error::Poisoned(why)) => assert!(why.contains("simulated crash"), "{why}"),
                    Err(e) => panic!("{e}"),
                }
                drop(store.take());
                store = Some(reopen(&config, &model));
            }
        }
        check(store.as_ref().unwrap(), &model);
    }
    let s = store.take().unwrap();
    s.roll_wal();
    s.wait_idle().unwrap();
    s.compact();
    s.wait_idle().unwrap();
    check(&s, &model);
    drop(s);
    let (s, _) = open(&config);
    check(&s, &model);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_model(
        ops in prop::collection::vec(op(), 1..60),
        adopt in prop_oneof![Just(0u64), Just(50), Just(101)],
    ) {
        run(ops, adopt);
    }
}

#[test]
fn regression_release_many() {
    run(
        vec![
            Op::Append {
                log: 0,
                count: 6,
                size: 0,
                new_term: false,
            },
            Op::Append {
                log: 0,
                count: 26,
                size: 0,
                new_term: false,
            },
            Op::Append {
                log: 0,
                count: 7,
                size: 0,
                new_term: false,
            },
            Op::ReleaseMany {
                log: 0,
                pick: 449313636292326936,
                count: 20,
            },
        ],
        50,
    );
}
