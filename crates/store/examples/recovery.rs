//! Recovery speed and memory: fills `LOGS` logs with `ENTRIES_PER_LOG` entries each, closes the
//! store, then measures how long reopening takes and what it costs in RSS.
//!
//! Two reopenings are timed: with every entry settled (the steady state after a clean run: a
//! backlog filled this way is adopted in place, so its entries are found through the adopted
//! WAL files' sidecars; with `Config::adopt_live_percent_min` above 100 they would be in
//! segments), and with the same data plus a WAL file of about 230 MB not yet settled, which
//! recovery must replay record by record.
//!
//! Run: `cargo run --release -p warren-store --example recovery -- <logs> <entries per log>
//! <payload bytes> <dir>`; defaults 10000 1000 16 under the temp dir.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use warren_store::{Config, Entry, NoopListener, Store};

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Drops this store's files (only them: other processes' cache is untouched) from the page
/// cache with posix_fadvise(DONTNEED), so the reopen reads from the disk. Returns the bytes.
fn evict_from_page_cache(config: &Config) -> u64 {
    use std::os::fd::AsRawFd;
    let mut total = 0;
    for dir in [&config.wal_dir, &config.segment_dir, &config.meta_dir] {
        for entry in std::fs::read_dir(dir).expect("dir") {
            let path = entry.expect("entry").path();
            let file = std::fs::File::open(&path).expect("open");
            total += file.metadata().expect("metadata").len();
            // SAFETY: fadvise on a valid descriptor only drops clean cached pages.
            unsafe {
                libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
    total
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |n: usize, default: u64| args.get(n).and_then(|a| a.parse().ok()).unwrap_or(default);
    let logs = arg(1, 10_000);
    let per_log = arg(2, 1_000);
    let size = arg(3, 16) as usize;
    let dir = args
        .get(4)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("warren-recovery-example"));
    let _ = std::fs::remove_dir_all(&dir);
    let config = Config::new(&dir);
    let total = logs * per_log;
    println!("filling {logs} logs x {per_log} entries x {size} B = {total} entries");

    let start = Instant::now();
    {
        let (store, _) = Store::open(config.clone(), Arc::new(NoopListener)).expect("open");
        let payload = Bytes::from(vec![7u8; size]);
        const CHUNK: u64 = 100;
        let mut next = 1;
        while next <= per_log {
            let end = (next + CHUNK).min(per_log + 1);
            for log in 0..logs {
                let entries: Vec<Entry> = (next..end)
                    .map(|index| Entry {
                        index,
                        term: 1,
                        // A fresh allocation per entry, as from a socket, so RSS counts real copies.
                        payload: Bytes::copy_from_slice(&payload),
                    })
                    .collect();
                store.append_blocking(log, &entries).expect("append");
            }
            next = end;
        }
        store.roll_wal();
        store.wait_idle().expect("flush");
        let s = store.stats();
        println!(
            "filled in {:.1} s: {} WAL syncs, {:.0} MB WAL ({} files adopted, {:.0} MB of sidecars), {:.0} MB segments, RSS {:.0} MiB",
            start.elapsed().as_secs_f64(),
            s.wal_syncs,
            s.wal_bytes as f64 / 1e6,
            s.wal_files_adopted,
            s.adopted_index_bytes as f64 / 1e6,
            s.segment_bytes as f64 / 1e6,
            rss_mib()
        );
    }

    let evicted = evict_from_page_cache(&config);
    println!(
        "evicted {:.0} MB of the store's files from the page cache (cold reopen)",
        evicted as f64 / 1e6
    );
    let rss_before = rss_mib();
    let start = Instant::now();
    let (store, infos) = Store::open(config.clone(), Arc::new(NoopListener)).expect("reopen");
    let elapsed = start.elapsed();
    let live: u64 = infos.iter().map(|i| i.live_entries).sum();
    assert_eq!(live, total);
    println!(
        "reopen of settled entries (segments and adopted WAL files): {:.2} s for {} logs, {} entries ({:.0} ns/entry, {:.1} s per 10M extrapolated); RSS {:.0} MiB (+{:.0} MiB)",
        elapsed.as_secs_f64(),
        infos.len(),
        live,
        elapsed.as_nanos() as f64 / total as f64,
        elapsed.as_secs_f64() * 1e7 / total as f64,
        rss_mib(),
        rss_mib() - rss_before
    );
    // A spot check that recovered entries read back.
    let e = store
        .read(logs / 2, per_log / 2)
        .expect("read")
        .expect("present");
    assert_eq!(e.payload.len(), size);

    // Second case: a full WAL file (as after a crash just before its rollover) to replay.
    let wal_bytes_target = config.wal_file_bytes_max * 9 / 10;
    let payload = Bytes::from(vec![9u8; 1024]);
    let mut appended = 0u64;
    let mut next: Vec<u64> = infos.iter().map(|i| i.last_index + 1).collect();
    let wal_before = store.stats().wal_bytes;
    while store.stats().wal_bytes - wal_before < wal_bytes_target {
        for (log, index) in next.iter_mut().enumerate().take(100) {
            let entries: Vec<Entry> = (*index..*index + 10)
                .map(|i| Entry {
                    index: i,
                    term: 1,
                    // A fresh allocation per entry, as from a socket, so RSS counts real copies.
                    payload: Bytes::copy_from_slice(&payload),
                })
                .collect();
            store.append_blocking(log as u64, &entries).expect("append");
            *index += 10;
            appended += 10;
        }
        store.sync().expect("sync");
    }
    drop(store);
    let start = Instant::now();
    let (store, infos) = Store::open(config, Arc::new(NoopListener)).expect("reopen");
    let elapsed = start.elapsed();
    let live: u64 = infos.iter().map(|i| i.live_entries).sum();
    assert_eq!(live, total + appended);
    println!(
        "reopen with {:.0} MB of WAL to replay ({} entries of 1 KB) on top: {:.2} s",
        wal_bytes_target as f64 / 1e6,
        appended,
        elapsed.as_secs_f64()
    );
    drop(store);
}
