//! What a stream's write and sync cost: chunks of 1 and of 100 entries of 1 KB appended (in the
//! file, not synced), appended and synced one by one (fsync before each confirm), and appended
//! 100 at a time then synced once (a batch of fsyncs); and a reader reading and checking
//! chunks back. Retention keeps the files below 256 MB while it runs.
//!
//! Run: `cargo bench -p warren-store --bench stream`. Criterion reports chunks/s as elements/s
//! (and bytes/s of payload); the figures depend on the disk under `TMPDIR`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use warren_store::stream::{
    AppendMeta, ChunkType, Entry, OffsetSpec, Retention, StreamConfig, StreamLog,
};

const ENTRY_BYTES: usize = 1024;
const RETAIN_BYTES: u64 = 256 << 20;
const RETAIN_EVERY_CHUNKS: u64 = 1024;
/// Chunks of 100 entries in the stream the read case reads (about 100 MB).
const READ_CHUNKS: u64 = 1000;
/// Bytes of the last segment the recovery case opens.
const RECOVER_SEGMENT_BYTES: u64 = 60 << 20;

struct Case {
    dir: PathBuf,
    log: StreamLog,
    body: Vec<u8>,
    appended: u64,
}

impl Case {
    fn new(name: &str) -> Case {
        let dir =
            std::env::temp_dir().join(format!("warren-bench-stream-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = StreamConfig {
            segment_bytes_max: 64 << 20,
            ..StreamConfig::default()
        };
        let (log, _) = StreamLog::open(&dir, config).expect("open");
        Case {
            dir,
            log,
            body: vec![0x5a; ENTRY_BYTES],
            appended: 0,
        }
    }

    fn append(&mut self, entries: usize) {
        let refs = vec![Entry::Simple(&self.body); entries];
        let meta = AppendMeta {
            chunk_type: ChunkType::User,
            timestamp_ms: 1_700_000_000_000,
            epoch: 1,
            filter: b"",
            trailer: b"",
        };
        self.log.append(&meta, &refs).expect("append");
        self.appended += 1;
        if self.appended.is_multiple_of(RETAIN_EVERY_CHUNKS) {
            let keep = Retention {
                max_bytes: Some(RETAIN_BYTES),
                max_age_ms: None,
            };
            self.log.apply_retention(&keep, 0).expect("retention");
        }
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("stream");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for entries in [1usize, 100] {
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("append", entries), &entries, |b, &n| {
            let mut case = Case::new("append");
            b.iter(|| case.append(n));
        });
        g.bench_with_input(
            BenchmarkId::new("append_sync_each", entries),
            &entries,
            |b, &n| {
                let mut case = Case::new("sync-each");
                b.iter(|| {
                    case.append(n);
                    case.log.sync().expect("sync");
                });
            },
        );
    }
    // The disk's own figure beside them: 1 KB appended to a plain file, then fdatasync.
    g.throughput(Throughput::Elements(1));
    g.bench_function("baseline_append_fdatasync/1KB", |b| {
        use std::io::Write;
        let case = Case::new("baseline");
        let mut file = std::fs::File::create(case.dir.join("plain")).expect("create");
        let body = vec![0x5au8; ENTRY_BYTES];
        b.iter(|| {
            file.write_all(&body).expect("write");
            file.sync_data().expect("fdatasync");
        });
    });
    // 100 chunks of one entry, then one sync: the cost per chunk of a batched sync.
    g.throughput(Throughput::Elements(100));
    g.bench_function("append_100_then_sync", |b| {
        let mut case = Case::new("sync-batch");
        b.iter(|| {
            for _ in 0..100 {
                case.append(1);
            }
            case.log.sync().expect("sync");
        });
    });
    // Reading back chunks of 100 entries (from the page cache), each checked (CRC, entries):
    // a stream of READ_CHUNKS chunks is read round and round.
    g.throughput(Throughput::Elements(1));
    g.bench_function("read_checked/100", |b| {
        let mut case = Case::new("read");
        for _ in 0..READ_CHUNKS {
            case.append(100);
        }
        case.log.set_commit_end(case.log.next_offset());
        let mut reader = case.log.reader(OffsetSpec::First).expect("reader");
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let chunk = match reader.next_read().expect("read") {
                    Some(chunk) => chunk,
                    None => {
                        reader = case.log.reader(OffsetSpec::First).expect("reader");
                        reader.next_read().expect("read").expect("a chunk")
                    }
                };
                std::hint::black_box(chunk.entries().count());
            }
            t.elapsed()
        });
    });
    // Opening a stream whose last segment holds 60 MB (from the page cache): recovery reads
    // and checks every chunk of it, the cost of a restart per stream.
    g.throughput(Throughput::Bytes(RECOVER_SEGMENT_BYTES));
    g.sample_size(10);
    g.bench_function("recover_last_segment/60MB", |b| {
        let dir = {
            let mut case = Case::new("recover");
            while case.log.handle().overview().bytes < RECOVER_SEGMENT_BYTES {
                case.append(100);
            }
            case.log.sync().expect("sync");
            // Kept past the case's end (which deletes its directory) by a copy.
            let copy = case.dir.with_extension("copy");
            let _ = std::fs::remove_dir_all(&copy);
            std::fs::create_dir_all(&copy).expect("mkdir");
            for e in std::fs::read_dir(&case.dir).expect("list").flatten() {
                std::fs::copy(e.path(), copy.join(e.file_name())).expect("copy");
            }
            copy
        };
        b.iter(|| {
            let (log, report) = StreamLog::open(&dir, StreamConfig::default()).expect("open");
            assert_eq!(report, Default::default());
            std::hint::black_box(log.next_offset());
        });
        let _ = std::fs::remove_dir_all(&dir);
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
