//! Recovery over corrupted files: a store with segments, an adopted or settled WAL file, a
//! checkpoint, releases, a snapshot and a hard state is made once; each input then flips,
//! zeroes or truncates bytes of a copy of its files, and the store is opened and every log read
//! back. Opening may fail (that is an answer, with the file named); it must not panic, hang, or
//! return entries that fail their checksum (reads verify them, so such a read is an `Err`).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use warren_store::{Config, Entry, HardState, NoopListener, Store};

/// Small WAL files, so the template has several and each input copies little.
const WAL_FILE_BYTES: u64 = 16 << 10;
const READ_BYTES_MAX: usize = 1 << 20;

fn config(root: &Path) -> Config {
    let mut c = Config::new(root);
    c.wal_file_bytes_max = WAL_FILE_BYTES;
    c.commit_window_us = 0;
    c
}

fn entries(from: u64, n: u64, term: u64) -> Vec<Entry> {
    (from..from + n)
        .map(|i| Entry {
            index: i,
            term,
            payload: Bytes::from(vec![i as u8; 40 + (i as usize * 7) % 200]),
        })
        .collect()
}

/// The store every input starts from: built once per process.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("warren-fuzz-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (store, _) = Store::open(config(&root), Arc::new(NoopListener)).expect("open");
        for log in [1u64, 3, 5] {
            store.append(log, &entries(1, 60, 1)).expect("append");
        }
        store.roll_wal();
        store.wait_idle().expect("settled into segments");
        for i in (1..40).step_by(3) {
            store.release(1, i).expect("release");
        }
        store
            .release_prefix(3, 20, 1, Bytes::from_static(b"snapshot"))
            .expect("release prefix");
        store
            .set_hard_state(
                2,
                HardState {
                    term: 3,
                    commit: 0,
                    vote: 7,
                },
            )
            .expect("hard state");
        store.append(5, &entries(61, 30, 2)).expect("append");
        store.roll_wal();
        store.wait_idle().expect("settled");
        store
            .append(1, &entries(61, 20, 1))
            .expect("append to the live WAL");
        store.sync().expect("sync");
        drop(store);
        root
    })
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    for p in names {
        if p.is_dir() {
            files(&p, out);
        } else if !p.ends_with("LOCK") {
            out.push(p);
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir").flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            // Not fs::copy: copy_file_range is not retried when libFuzzer's timer signal
            // interrupts it (EINTR); read and write are.
            let bytes = std::fs::read(e.path()).expect("read");
            std::fs::write(target, bytes).expect("write");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let template = template();
    let work = std::env::temp_dir().join(format!("warren-fuzz-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    copy_dir(template, &work);
    let mut targets = Vec::new();
    files(&work, &mut targets);
    // Each 7 bytes: which file, where (a fraction of its length, so most land inside), and what:
    // xor a byte, zero 8 bytes, or cut the file there.
    for m in data.chunks_exact(7) {
        let path = &targets[m[0] as usize % targets.len()];
        let Ok(mut bytes) = std::fs::read(path) else {
            continue;
        };
        if bytes.is_empty() {
            continue;
        }
        let at = (u32::from_le_bytes([m[1], m[2], m[3], m[4]]) as usize) % bytes.len();
        match m[5] % 4 {
            0 | 1 => bytes[at] ^= m[6].max(1),
            2 => {
                let end = (at + 8).min(bytes.len());
                bytes[at..end].fill(0)
            }
            _ => bytes.truncate(at),
        }
        std::fs::write(path, &bytes).expect("write corrupted file");
    }
    if let Ok((store, infos)) = Store::open(config(&work), Arc::new(NoopListener)) {
        for info in infos {
            let mut from = info.first_index;
            while from <= info.last_index {
                match store.read_range(info.log_id, from, info.last_index + 1, READ_BYTES_MAX) {
                    Ok(page) if !page.is_empty() => {
                        for e in &page {
                            assert!(e.index >= from && e.index <= info.last_index);
                        }
                        from = page.last().expect("non-empty").index + 1;
                    }
                    _ => break,
                }
            }
        }
        drop(store);
    }
    let _ = std::fs::remove_dir_all(&work);
});
