//! A process killed with SIGKILL loses nothing it was told was durable: a child process appends
//! (and releases) as fast as it can on a tiny WAL, so rollovers, segment flushes and
//! checkpoints are in flight when it dies; the parent then reopens the store and checks every
//! entry the listener reported durable.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use warren_store::{Config, DurabilityListener, Store};

const LOGS: u64 = 3;
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
    for round in 0..3 {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut durable: HashMap<u64, u64> = HashMap::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let parts: Vec<&str> = line.split_whitespace().collect();
                if parts.len() == 3 && parts[0] == "durable" {
                    let (log, index) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
                    let e = durable.entry(log).or_insert(0);
                    *e = (*e).max(index);
                }
            }
            durable
        });
        let deadline = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let durable = reader.join().unwrap();
        assert!(
            !durable.is_empty(),
            "round {round}: the child made nothing durable"
        );

        let (store, _) = open(&config(dir.path()));
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
