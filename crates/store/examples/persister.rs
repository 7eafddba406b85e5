//! Write amplification of a backlog at the engine level (seed 004's persister test without the
//! broker): appends `ENTRIES` entries of `PAYLOAD` bytes to one log with no release, so every
//! WAL file rolls over while its entries are live, syncs, then drains the log in order (read in
//! pages, release each entry, release the prefix every 4096 as the broker does when the head of
//! a queue is acknowledged) and waits until the engine has deleted what is dead.
//!
//! Reports, per phase, the bytes this process wrote to the block layer (`write_bytes` of
//! `/proc/self/io`, which counts write-back of dirty pages whoever triggered it) and the bytes
//! the engine wrote to its files (its own counters), each per payload byte.
//!
//! Run: `cargo run --release -p warren-store --example persister -- <entries> <payload bytes>
//! <WAL file MiB> <dir>`; defaults 1000000 1024 64 under the temp dir.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use warren_store::{Config, Entry, NoopListener, Stats, Store};

/// Entries per append call, as a queue's batch of publishes.
const APPEND_BATCH: u64 = 256;
/// The drain releases the acknowledged prefix every this many entries.
const PREFIX_EVERY: u64 = 4096;

fn write_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Bytes the engine says it wrote to its files: WAL records, segment records and index
/// entries, adopted-file index sidecars and checkpoints.
fn file_bytes(s: &Stats) -> u64 {
    s.wal_bytes + s.segment_bytes + s.adopted_index_bytes + s.checkpoint_bytes
}

fn report(phase: &str, payload_bytes: u64, secs: f64, entries: u64, io: u64, files: u64) {
    println!(
        "{phase:>7}: {entries} entries in {secs:.2} s ({:.0}/s); block-layer writes {:.0} MB = {:.3} per payload byte; engine file writes {:.0} MB = {:.3} per payload byte",
        entries as f64 / secs,
        io as f64 / 1e6,
        io as f64 / payload_bytes as f64,
        files as f64 / 1e6,
        files as f64 / payload_bytes as f64,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |n: usize, default: u64| args.get(n).and_then(|a| a.parse().ok()).unwrap_or(default);
    let entries = arg(1, 1_000_000);
    let size = arg(2, 1024) as usize;
    let wal_mib = arg(3, 64);
    let dir = args
        .get(4)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("warren-persister-example"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = Config::new(&dir);
    config.wal_file_bytes_max = wal_mib << 20;
    let payload_bytes = entries * size as u64;
    println!(
        "persister: {entries} x {size} B into one log, {wal_mib} MiB WAL files, in {}",
        dir.display()
    );
    let (store, _) = Store::open(config, Arc::new(NoopListener)).expect("open");
    const LOG: u64 = 1;

    let io_start = write_bytes();
    let start = Instant::now();
    let payload = Bytes::from(vec![0x5a; size]);
    let mut next = 1;
    while next <= entries {
        let end = (next + APPEND_BATCH).min(entries + 1);
        let batch: Vec<Entry> = (next..end)
            .map(|index| Entry {
                index,
                term: 1,
                payload: Bytes::copy_from_slice(&payload),
            })
            .collect();
        store.append_blocking(LOG, &batch).expect("append");
        next = end;
    }
    store.sync().expect("sync");
    // The backlog's WAL files have rolled; let the segment writer deal with them as it would
    // while the broker waits for consumers.
    store.wait_idle().expect("idle");
    let publish_secs = start.elapsed().as_secs_f64();
    let io_publish = write_bytes() - io_start;
    let files_publish = file_bytes(&store.stats());
    report(
        "publish",
        payload_bytes,
        publish_secs,
        entries,
        io_publish,
        files_publish,
    );
    let s = store.stats();
    println!(
        "         WAL files flushed {}, adopted {}; segment bytes {}",
        s.wal_files_flushed, s.wal_files_adopted, s.segment_bytes
    );

    let start = Instant::now();
    let mut index = 1;
    let mut drained = 0u64;
    while index <= entries {
        let got = store
            .read_range(LOG, index, entries + 1, 4 << 20)
            .expect("read");
        assert!(!got.is_empty(), "entry {index} missing");
        for e in &got {
            assert_eq!(e.payload.len(), size);
            store.release(LOG, e.index).expect("release");
            if e.index % PREFIX_EVERY == 0 {
                store
                    .release_prefix(LOG, e.index, 1, Bytes::new())
                    .expect("release prefix");
            }
        }
        drained += got.len() as u64;
        index = got.last().expect("non-empty").index + 1;
    }
    store
        .release_prefix(LOG, entries, 1, Bytes::new())
        .expect("release prefix");
    store.roll_wal();
    store.compact();
    store.wait_idle().expect("idle");
    let drain_secs = start.elapsed().as_secs_f64();
    let io_drain = write_bytes() - io_start - io_publish;
    let files_drain = file_bytes(&store.stats()) - files_publish;
    report(
        "drain",
        payload_bytes,
        drain_secs,
        drained,
        io_drain,
        files_drain,
    );
    report(
        "total",
        payload_bytes,
        publish_secs + drain_secs,
        entries,
        io_publish + io_drain,
        files_publish + files_drain,
    );
    let s = store.stats();
    println!(
        "         adopted files deleted {}, compacted {}; segments deleted {}; WAL dir now {} files",
        s.adopted_files_deleted,
        s.adopted_files_compacted,
        s.segments_deleted,
        std::fs::read_dir(dir.join("wal")).map_or(0, |d| d.count())
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
