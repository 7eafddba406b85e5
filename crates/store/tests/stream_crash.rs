//! A stream's writer killed with SIGKILL loses nothing it synced, and what it left reads back
//! whole: a child process appends chunks of varied sizes to a stream of small segments as fast
//! as it can, syncing every few chunks and applying retention now and then, so rolls and
//! deletions are in flight when it dies; the parent reopens the stream and reads every record.
//!
//! The parent kills the child once it has reported a set amount of progress, not after a set
//! time: a slow machine gets as far as a fast one before the kill.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;
use warren_store::stream::{
    AppendMeta, ChunkType, Entry, OffsetSpec, Retention, StreamConfig, StreamLog,
};

/// Records the child must report synced in a round before it is killed: some 40 segments'
/// worth of 64 KiB.
const ROUND_RECORDS: u64 = 20_000;
/// How long a round may take to get there: generous for a loaded machine, but a child that
/// makes no progress must not hang the suite.
const ROUND_DEADLINE: Duration = Duration::from_secs(120);
const CHILD_ENV: &str = "WARREN_STREAM_CRASH_DIR";
const RETAIN_BYTES: u64 = 1 << 20;

fn config() -> StreamConfig {
    StreamConfig {
        segment_bytes_max: 64 << 10,
        ..StreamConfig::default()
    }
}

/// The body of the record at `offset`: its size and bytes follow from the offset alone.
fn body(offset: u64) -> Vec<u8> {
    let mut b = offset.to_be_bytes().to_vec();
    b.resize(8 + (offset * 37 % 300) as usize, (offset % 251) as u8);
    b
}

/// The child: appends until killed; prints `synced N` after each sync (records below N are
/// durable).
#[test]
fn stream_crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (mut log, _) = StreamLog::open(&dir, config()).unwrap();
    loop {
        let first = log.next_offset();
        let bodies: Vec<Vec<u8>> = (first..first + 1 + first % 17).map(body).collect();
        let entries: Vec<Entry<'_>> = bodies.iter().map(|b| Entry::Simple(b)).collect();
        let meta = AppendMeta {
            chunk_type: ChunkType::User,
            timestamp_ms: first as i64,
            epoch: 1,
            filter: b"",
            trailer: b"",
        };
        log.append(&meta, &entries).unwrap();
        if log.next_seq() % 4 == 0 {
            log.sync().unwrap();
            println!("synced {}", log.next_offset());
        }
        if log.next_seq() % 64 == 0 {
            let keep = Retention {
                max_bytes: Some(RETAIN_BYTES),
                max_age_ms: None,
            };
            log.apply_retention(&keep, 0).unwrap();
        }
    }
}

/// Every record the stream holds, checked against [`body`], from its first offset on, with no
/// gap; returns (first offset, next offset).
fn read_back(dir: &Path, round: u32) -> (u64, u64) {
    let (log, report) = StreamLog::open(dir, config()).unwrap();
    let overview = log.handle().overview();
    log.set_commit_end(overview.next_offset);
    let mut reader = log.reader(OffsetSpec::First).unwrap();
    let mut expected = overview.first_offset;
    while let Some(chunk) = reader.next_read().unwrap() {
        for (offset, e) in chunk.entries() {
            assert_eq!(offset, expected, "round {round}: a gap ({report:?})");
            assert_eq!(
                e,
                Entry::Simple(&body(offset)),
                "round {round}: record {offset}"
            );
            expected += 1;
        }
    }
    assert_eq!(expected, overview.next_offset, "round {round}");
    (overview.first_offset, overview.next_offset)
}

#[test]
fn nothing_synced_is_lost_to_sigkill_and_the_rest_reads_back_whole() {
    let dir = TempDir::new("stream-crash");
    let exe = std::env::current_exe().unwrap();
    let mut start = 0;
    for round in 0..3 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "stream_crash_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (progress, reports) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut synced = 0u64;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("synced ") {
                    synced = synced.max(n.trim().parse().unwrap());
                    let _ = progress.send(synced);
                }
            }
            synced
        });
        let deadline = Instant::now() + ROUND_DEADLINE;
        let mut reached = start;
        while reached < start + ROUND_RECORDS {
            match reports.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(n) => reached = reached.max(n),
                Err(e) => {
                    let _ = child.kill();
                    panic!("round {round}: {e}: the child got only to {reached} from {start}");
                }
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let synced = reader.join().unwrap();

        let (first, next) = read_back(dir.path(), round);
        assert!(next >= synced, "round {round}: {next} < synced {synced}");
        assert!(first > start, "round {round}: retention ran");
        start = next;
    }
}
