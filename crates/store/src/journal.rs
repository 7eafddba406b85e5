//! A small durable journal of opaque records, for metadata (vhosts, users, exchanges, queues,
//! bindings): appended with fdatasync before the change is acknowledged, replayed at start,
//! and compacted into a snapshot when it has grown past its live state.
//!
//! Layout, in its own directory (so metadata can sit on its own disk):
//! - `snapshot`: the records of the state at the last compaction,
//! - `journal`: the records appended since.
//!
//! Both files are sequences of `[length: u32 BE][crc32c(payload): u32 BE][payload]`. Replay
//! stops at the first torn or corrupt record and truncates the journal there: a record is
//! acknowledged only after its sync, so what follows a bad record was never acknowledged.
//! Compaction writes `snapshot.tmp`, syncs it, renames it over `snapshot` and syncs the
//! directory before emptying the journal, so a crash at any point leaves a readable state.
//!
//! Faults, as in the WAL: a failed fdatasync stops the journal for good (every later append
//! fails), since the kernel may have dropped the unwritten pages and a retry could report
//! them durable. A failed write (a full disk) cuts the file back to its last whole record, so
//! that a later append never lands behind a torn one (replay would stop there and drop it).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// The largest record accepted: metadata records are small; a larger length is corruption.
pub const RECORD_BYTES_MAX: usize = 16 * 1024 * 1024;
/// The journal is compacted once it is this many times larger than the last snapshot...
pub const COMPACT_RATIO: u64 = 2;
/// ...and at least this large, so that small journals are never rewritten.
pub const COMPACT_BYTES_MIN: u64 = 1024 * 1024;
const HEADER_BYTES: usize = 8;

/// The open journal: appends go to `journal`, compaction rewrites `snapshot`.
pub struct Journal {
    dir: PathBuf,
    file: File,
    journal_bytes: u64,
    snapshot_bytes: u64,
    /// Why the journal stopped (a failed sync); never cleared but by reopening.
    poisoned: Option<String>,
    /// Test-only fault injection: `fail_sync` fails the next sync of the journal.
    faults: Option<std::sync::Arc<crate::Faults>>,
}

fn encode(out: &mut Vec<u8>, payload: &[u8]) {
    assert!(
        payload.len() <= RECORD_BYTES_MAX,
        "metadata record of {} bytes",
        payload.len()
    );
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Reads the valid prefix of a record file: its records and how many bytes they span.
fn read_records(path: &Path) -> io::Result<(Vec<Vec<u8>>, u64)> {
    let mut data = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut data)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    }
    let mut records = Vec::new();
    let mut at = 0usize;
    while data.len() - at >= HEADER_BYTES {
        let len = u32::from_be_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_be_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
        if len > RECORD_BYTES_MAX || data.len() - at - HEADER_BYTES < len {
            break;
        }
        let payload = &data[at + HEADER_BYTES..at + HEADER_BYTES + len];
        if crc32c::crc32c(payload) != crc {
            break;
        }
        records.push(payload.to_vec());
        at += HEADER_BYTES + len;
    }
    Ok((records, at as u64))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Journal {
    /// Opens (creating) the journal in `dir` and returns every record of the recovered state,
    /// snapshot first, in order.
    pub fn open(dir: &Path) -> io::Result<(Journal, Vec<Vec<u8>>)> {
        fs::create_dir_all(dir)?;
        let (mut records, snapshot_bytes) = read_records(&dir.join("snapshot"))?;
        let journal_path = dir.join("journal");
        let (tail, valid) = read_records(&journal_path)?;
        records.extend(tail);
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&journal_path)?;
        if file.metadata()?.len() != valid {
            tracing::warn!(path = %journal_path.display(), valid, "truncating a torn metadata journal tail");
            file.set_len(valid)?;
            file.sync_all()?;
        }
        Ok((
            Journal {
                dir: dir.to_path_buf(),
                file,
                journal_bytes: valid,
                snapshot_bytes,
                poisoned: None,
                faults: None,
            },
            records,
        ))
    }

    /// Appends records and syncs them: when this returns Ok they survive a crash.
    pub fn append(&mut self, payloads: &[Vec<u8>]) -> io::Result<()> {
        self.check_poisoned()?;
        if payloads.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(payloads.iter().map(|p| p.len() + HEADER_BYTES).sum());
        for p in payloads {
            encode(&mut buf, p);
        }
        if let Err(e) = self.file.write_all(&buf) {
            if let Err(cut) = self.file.set_len(self.journal_bytes) {
                self.poison(format!(
                    "cutting a failed metadata journal write ({e}): {cut}"
                ));
            }
            return Err(e);
        }
        if let Err(e) = self.sync_data() {
            self.poison(format!("fdatasync of the metadata journal: {e}"));
            return Err(e);
        }
        self.journal_bytes += buf.len() as u64;
        Ok(())
    }

    /// Why the journal stopped taking appends, if it did: a failed sync, which only a
    /// restart (reopening, which replays what is really on disk) gets past.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Test-only: lets `faults.fail_sync` fail the journal's next sync.
    #[doc(hidden)]
    pub fn set_faults(&mut self, faults: std::sync::Arc<crate::Faults>) {
        self.faults = Some(faults);
    }

    fn sync_data(&self) -> io::Result<()> {
        if let Some(f) = &self.faults {
            f.before_sync()?;
        }
        self.file.sync_data()
    }

    fn poison(&mut self, why: String) {
        tracing::error!(%why, "the metadata journal stopped: no more metadata is durable");
        self.poisoned.get_or_insert(why);
    }

    fn check_poisoned(&self) -> io::Result<()> {
        match &self.poisoned {
            None => Ok(()),
            Some(why) => Err(io::Error::other(format!(
                "metadata journal stopped by an earlier failure: {why}"
            ))),
        }
    }

    /// Whether the journal has grown enough past the snapshot to be worth compacting.
    pub fn wants_compaction(&self) -> bool {
        self.journal_bytes >= COMPACT_BYTES_MIN
            && self.journal_bytes >= COMPACT_RATIO * self.snapshot_bytes.max(1)
    }

    /// Replaces snapshot and journal by `state`: the records of the whole current state.
    pub fn compact(&mut self, state: &[Vec<u8>]) -> io::Result<()> {
        self.check_poisoned()?;
        let mut buf = Vec::new();
        for p in state {
            encode(&mut buf, p);
        }
        let tmp = self.dir.join("snapshot.tmp");
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&buf)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, self.dir.join("snapshot"))?;
        // Past the rename, a failure leaves what is on disk uncertain: stop, as for an append.
        let emptied = sync_dir(&self.dir)
            .and_then(|()| self.file.set_len(0))
            .and_then(|()| self.file.sync_all());
        if let Err(e) = emptied {
            self.poison(format!("compacting the metadata journal: {e}"));
            return Err(e);
        }
        self.snapshot_bytes = buf.len() as u64;
        self.journal_bytes = 0;
        Ok(())
    }

    /// Every record of the current state, snapshot first (for compaction by folding).
    pub fn read_all(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let (mut records, _) = read_records(&self.dir.join("snapshot"))?;
        let (tail, _) = read_records(&self.dir.join("journal"))?;
        records.extend(tail);
        Ok(records)
    }

    /// Bytes appended since the last compaction.
    pub fn journal_bytes(&self) -> u64 {
        self.journal_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("warren-journal-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn records_survive_reopen_in_order() {
        let d = dir("reopen");
        let (mut j, got) = Journal::open(&d).unwrap();
        assert!(got.is_empty());
        j.append(&[b"a".to_vec(), b"bb".to_vec()]).unwrap();
        j.append(&[b"ccc".to_vec()]).unwrap();
        drop(j);
        let (_, got) = Journal::open(&d).unwrap();
        assert_eq!(got, vec![b"a".to_vec(), b"bb".to_vec(), b"ccc".to_vec()]);
    }

    #[test]
    fn a_torn_or_corrupt_tail_is_cut_and_the_rest_kept() {
        let d = dir("torn");
        let (mut j, _) = Journal::open(&d).unwrap();
        j.append(&[b"keep".to_vec(), b"lose".to_vec()]).unwrap();
        drop(j);
        let path = d.join("journal");
        let mut bytes = fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let (mut j, got) = Journal::open(&d).unwrap();
        assert_eq!(got, vec![b"keep".to_vec()]);
        j.append(&[b"after".to_vec()]).unwrap();
        drop(j);
        let (_, got) = Journal::open(&d).unwrap();
        assert_eq!(got, vec![b"keep".to_vec(), b"after".to_vec()]);
    }

    #[test]
    fn a_failed_sync_stops_every_later_append_and_reopening_keeps_what_was_synced() {
        let d = dir("poison");
        let faults = std::sync::Arc::new(crate::Faults::default());
        let (mut j, _) = Journal::open(&d).unwrap();
        j.set_faults(faults.clone());
        j.append(&[b"synced".to_vec()]).unwrap();
        faults
            .fail_sync
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(j.append(&[b"failed".to_vec()]).is_err());
        assert!(j.poisoned().unwrap().contains("fdatasync"));
        // Never retried, though the disk would now sync: the failed write is not durable.
        let later = j.append(&[b"later".to_vec()]).unwrap_err();
        assert!(later.to_string().contains("earlier failure"), "{later}");
        assert!(j.compact(&[b"state".to_vec()]).is_err());
        drop(j);
        let (_, got) = Journal::open(&d).unwrap();
        assert_eq!(got[0], b"synced".to_vec());
        assert!(!got.contains(&b"later".to_vec()));
    }

    #[test]
    fn compaction_replaces_history_with_state() {
        let d = dir("compact");
        let (mut j, _) = Journal::open(&d).unwrap();
        j.append(&[b"x1".to_vec(), b"x2".to_vec()]).unwrap();
        j.compact(&[b"state".to_vec()]).unwrap();
        j.append(&[b"later".to_vec()]).unwrap();
        drop(j);
        let (_, got) = Journal::open(&d).unwrap();
        assert_eq!(got, vec![b"state".to_vec(), b"later".to_vec()]);
    }
}
