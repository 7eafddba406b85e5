//! WAL throughput alone: appends/s and fsyncs/s at 16 B, 1 KB and 64 KB payloads spread over 1,
//! 100 and 10,000 logs. One producer thread appends one entry per call, round robin over the
//! logs, the way many queue tasks would; each measurement ends with `sync`, so every counted
//! append is durable. The WAL file limit is raised so no rollover (segment writing) happens:
//! this measures the group commit path only.
//!
//! Run: `cargo bench -p warren-store --bench wal`. Criterion reports appends/s as elements/s;
//! each case also prints fsyncs/s and the mean batch (appends per fsync).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use warren_store::{Config, Entry, NoopListener, Store};

const PAYLOAD_SIZES: [usize; 3] = [16, 1024, 64 * 1024];
const LOG_COUNTS: [u64; 3] = [1, 100, 10_000];

struct Case {
    _dir: TempDir,
    store: Store,
    next_index: Vec<u64>,
    log_cursor: usize,
    payload: Bytes,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Case {
    fn new(logs: u64, size: usize) -> Case {
        let path = std::env::temp_dir().join(format!(
            "warren-bench-wal-{}-{logs}-{size}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        let mut config = Config::new(&path);
        config.wal_file_bytes_max = warren_store::config::WAL_FILE_BYTES_MAX;
        let (store, _) = Store::open(config, Arc::new(NoopListener)).expect("open");
        Case {
            _dir: TempDir(path),
            store,
            next_index: vec![1; logs as usize],
            log_cursor: 0,
            payload: Bytes::from(vec![0x5au8; size]),
        }
    }

    fn append(&mut self) {
        let log = self.log_cursor;
        self.log_cursor = (self.log_cursor + 1) % self.next_index.len();
        let index = self.next_index[log];
        self.next_index[log] += 1;
        let entry = Entry {
            index,
            term: 1,
            payload: self.payload.clone(),
        };
        self.store
            .append_blocking(log as u64, &[entry])
            .expect("append");
    }
}

fn wal(c: &mut Criterion) {
    let mut group = c.benchmark_group("wal_append");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for size in PAYLOAD_SIZES {
        for logs in LOG_COUNTS {
            let mut case = Case::new(logs, size);
            let mut total_appends = 0u64;
            let mut total_time = Duration::ZERO;
            let syncs_before = case.store.stats().wal_syncs;
            group.bench_with_input(
                BenchmarkId::new(format!("{size}B"), format!("{logs}logs")),
                &(),
                |b, ()| {
                    b.iter_custom(|iters| {
                        let start = Instant::now();
                        for _ in 0..iters {
                            case.append();
                        }
                        case.store.sync().expect("sync");
                        let elapsed = start.elapsed();
                        total_appends += iters;
                        total_time += elapsed;
                        elapsed
                    })
                },
            );
            if total_appends == 0 {
                continue; // filtered out on the command line
            }
            let syncs = case.store.stats().wal_syncs - syncs_before;
            let secs = total_time.as_secs_f64();
            eprintln!(
                "wal {size:>6} B x {logs:>6} logs: {:>9.0} appends/s, {:>7.0} fsyncs/s, {:>7.1} appends per fsync, {:>7.1} MB/s",
                total_appends as f64 / secs,
                syncs as f64 / secs,
                total_appends as f64 / syncs.max(1) as f64,
                total_appends as f64 * size as f64 / secs / 1e6,
            );
        }
    }
    group.finish();
}

/// One caller waiting for each append to be durable before the next: no batching possible, so
/// this is the latency of one write + fdatasync round through the writer thread.
fn wal_sync_each(c: &mut Criterion) {
    let mut group = c.benchmark_group("wal_append_sync_each");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    for size in [16, 1024] {
        let mut case = Case::new(1, size);
        group.bench_with_input(
            BenchmarkId::new(format!("{size}B"), "1log"),
            &(),
            |b, ()| {
                b.iter(|| {
                    case.append();
                    case.store.sync().expect("sync");
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, wal, wal_sync_each);
criterion_main!(benches);
