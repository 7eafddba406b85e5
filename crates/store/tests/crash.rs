//! A process killed with SIGKILL loses nothing it was told was durable: a child process appends
//! (and releases) as fast as it can on a tiny WAL, so rollovers, segment flushes and
//! checkpoints are in flight when it dies; the parent then reopens the store and checks every
//! entry the listener reported durable.
//!
//! The parent kills the child once it has reported a set amount of progress (many WAL files'
//! worth), not after a set time: a slow machine gets as far as a fast one before the kill.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use warren_store::{Config, DurabilityListener, Store};

const LOGS: u64 = 3;
/// Entries of each log the child must report durable in a round before it is killed: about
/// 5,000 x 3 x 320 bytes, some 70 rollovers of its 64 KiB WAL files.
const ROUND_ENTRIES: u64 = 5_000;
/// How long a round may take to get there before the test gives up: generous, since a loaded
/// machine may be slow, but a child that makes no progress must not hang the suite.
const ROUND_DEADLINE: Duration = Duration::from_secs(120);
const CHILD_ENV: &str = "WARREN_STORE_CRASH_DIR";

fn config(dir: &std::path::Path) -> Config {
    let mut config = store_config(dir);
    config.wal_file_bytes_max = 64 << 10;
    config
}

fn size_of(index: u64) -> usize {
    (index % 7 * 97) as usize
}

struct Printer;

impl DurabilityListener for Printer {
    fn on_durable(&self, log_id: u64, durable_index: u64) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "durable {log_id} {durable_index}");
        let _ = out.flush();
    }
}

/// The child: appends until killed. Even entries are released once durable.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (store, infos) =
        Store::open(config(std::path::Path::new(&dir)), Arc::new(Printer)).unwrap();
    let mut next: HashMap<u64, u64> = (0..LOGS).map(|l| (l, 1)).collect();
    for info in infos {
        next.insert(info.log_id, info.last_index + 1);
    }
    loop {
        for log in 0..LOGS {
            let i = next[&log];
            let entries: Vec<_> = (i..i + 10).map(|k| entry(log, k, 1, size_of(k))).collect();
            store.append_blocking(log, &entries).unwrap();
            next.insert(log, i + 10);
            if let Some(info) = store.log_info(log) {
                let mut k = info.durable_index.saturating_sub(30).max(info.first_index);
                while k <= info.durable_index {
                    if k % 2 == 0 {
                        store.release(log, k).unwrap();
                    }
                    k += 1;
                }
            }
        }
    }
}

#[test]
fn nothing_reported_durable_is_lost_to_sigkill() {
    let dir = TempDir::new("crash");
    let exe = std::env::current_exe().unwrap();
    // Where each log's entries reached at the start of the round.
    let mut start: HashMap<u64, u64> = (0..LOGS).map(|l| (l, 0)).collect();
    for round in 0..3 {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (progress, reports) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut durable: HashMap<u64, u64> = HashMap::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let parts: Vec<&str> = line.split_whitespace().collect();
                if parts.len() == 3 && parts[0] == "durable" {
                    let (log, index) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
                    let e = durable.entry(log).or_insert(0);
                    *e = (*e).max(index);
                    let _ = progress.send((log, index));
                }
            }
            durable
        });
        // Kill once every log went ROUND_ENTRIES further, wherever the child is then.
        let deadline = Instant::now() + ROUND_DEADLINE;
        let mut reached = start.clone();
        while reached
            .iter()
            .any(|(log, index)| *index < start[log] + ROUND_ENTRIES)
        {
            let left = deadline.saturating_duration_since(Instant::now());
            match reports.recv_timeout(left) {
                Ok((log, index)) => {
                    let e = reached.entry(log).or_insert(0);
                    *e = (*e).max(index);
                }
                Err(e) => {
                    let _ = child.kill();
                    panic!("round {round}: {e}: the child got only to {reached:?} from {start:?}");
                }
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let durable = reader.join().unwrap();

        let (store, _) = open(&config(dir.path()));
        for log in 0..LOGS {
            start.insert(log, store.log_info(log).unwrap().last_index);
        }
        for (log, reported) in durable {
            let info = store.log_info(log).unwrap();
            assert!(
                info.last_index >= reported,
                "round {round} log {log}: {info:?} < {reported}"
            );
            for k in info.first_index..=info.last_index {
                let got = store.read(log, k).unwrap();
                match got {
                    Some(e) => assert_eq!(
                        e,
                        entry(log, k, 1, size_of(k)),
                        "round {round} log {log} entry {k}"
                    ),
                    None => assert!(k % 2 == 0, "round {round} log {log}: entry {k} lost"),
                }
            }
        }
    }
}
