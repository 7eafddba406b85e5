//! The checkpoint: the one small file in the meta directory that makes WAL files deletable.
//!
//! A WAL file holds appends and also the releases, truncations and snapshots of every log.
//! Once its live entries are in segments (or the file is adopted as a data file), what it said
//! about releases must live on somewhere before the file is deleted or stops being replayed:
//! the segment writer writes a checkpoint (atomically: temporary file, fdatasync, rename, fsync
//! of the directory) and only then deletes WAL files and dead segments. Layout, little endian:
//!
//! ```text
//!  0  8  magic "WRNCKP01"
//!  8  4  version (3; version 2, without hard states, is still read)
//! 12  4  zero
//! 16  8  wal_flushed_seq: every WAL file with a sequence <= this is reflected here
//! 24  8  number of adopted WAL files, then per file: 8 sequence, 8 entries in its sidecar
//!  .  8  number of logs
//! per log:
//!     8 log id, 8 first index, 8 last index, 8 snapshot index, 8 snapshot term,
//!     8 hard state term, 8 hard state vote, 8 hard state commit (version 3),
//!     4 next segment id, 4 snapshot length, snapshot bytes,
//!     4 number of term runs, then per run: 8 first index, 8 term,
//!     4 number of segments, then per segment: 4 id, 4 valid index entries,
//!       8 end of valid data, 8 highest entry index,
//!     4 number of adopted WAL files holding live entries of the log, then per file: 8 sequence,
//!     8 live_lo, 4 bitmap length, bitmap: bit n set = entry live_lo + n is live in a segment
//!       or in an adopted WAL file
//! last 4: crc32c of everything before
//! ```
//!
//! The segment writer waits until every record submitted before it read the state is durable
//! before writing the checkpoint, so the checkpoint is never ahead of the WAL (a truncation or
//! deletion it shows is also in the WAL); `last index` is clipped to the durable index as well.
//! It may be behind the WAL: replaying the WAL over it converges, because every WAL record sets
//! state rather than changing it relatively.
//!
//! The per-log list of adopted files says which sidecars may point that log's slots into a
//! file: a log deleted and created again under the same id never takes entries of its earlier
//! life from a sidecar written before.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use bytes::Bytes;

use crate::log::{Loc, LogState, SegmentMeta};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"WRNCKP01";
const VERSION: u32 = 3;
/// The version before Raft hard states were kept; read as logs without one.
const VERSION_NO_HARD_STATE: u32 = 2;
const FILE_NAME: &str = "checkpoint";
const TMP_NAME: &str = "checkpoint.tmp";

/// What the checkpoint says about one log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogCheckpoint {
    pub log_id: u64,
    pub first_index: u64,
    pub last_index: u64,
    pub snapshot_index: u64,
    pub snapshot_term: u64,
    pub snapshot_blob: Bytes,
    pub hard_state: crate::store::HardState,
    pub next_segment_id: u32,
    pub terms: Vec<(u64, u64)>,
    pub segments: Vec<(u32, SegmentMeta)>,
    /// Adopted WAL files holding live entries of this log, ascending.
    pub adopted: Vec<u64>,
    pub live_lo: u64,
    pub live_bits: Vec<u8>,
}

impl LogCheckpoint {
    /// Describes a log's durable state; releases beyond the durable index are harmless.
    /// `settled_seq` is the highest WAL file flushed or adopted: slots pointing into files up to
    /// it are in segments or adopted files, and only those go in the bitmap (the rest is in WAL
    /// files that recovery replays).
    pub(crate) fn from_state(log_id: u64, log: &LogState, settled_seq: u64) -> LogCheckpoint {
        let last_index = log
            .last_index()
            .min(log.durable_index.max(log.first_index - 1));
        let terms: Vec<(u64, u64)> = log
            .terms
            .iter()
            .copied()
            .take_while(|t| t.0 <= last_index)
            .collect();
        let mut live_lo = 0;
        let mut live_bits = Vec::new();
        let mut adopted: Vec<u64> = Vec::new();
        let end = log
            .settled_end(settled_seq)
            .min((last_index + 1 - log.first_index) as usize);
        for (at, slot) in log.slots.range(..end).enumerate() {
            if slot.released() {
                continue;
            }
            if let Loc::Wal { seq, .. } = slot.loc() {
                if adopted.last() != Some(&seq) && !adopted.contains(&seq) {
                    adopted.push(seq);
                }
            }
            let index = log.first_index + at as u64;
            if live_bits.is_empty() {
                live_lo = index;
            }
            let bit = (index - live_lo) as usize;
            if live_bits.len() <= bit / 8 {
                live_bits.resize(bit / 8 + 1, 0);
            }
            live_bits[bit / 8] |= 1 << (bit % 8);
        }
        adopted.sort_unstable();
        LogCheckpoint {
            log_id,
            first_index: log.first_index,
            last_index,
            snapshot_index: log.snapshot.index,
            snapshot_term: log.snapshot.term,
            snapshot_blob: log.snapshot.blob.clone(),
            hard_state: log.hard_state,
            next_segment_id: log.next_segment_id,
            terms,
            segments: log.segments.iter().map(|(id, m)| (*id, *m)).collect(),
            adopted,
            live_lo,
            live_bits,
        }
    }

    /// Whether entry `index` lives in a segment or an adopted WAL file.
    pub(crate) fn is_settled_live(&self, index: u64) -> bool {
        if index < self.live_lo {
            return false;
        }
        let bit = (index - self.live_lo) as usize;
        self.live_bits
            .get(bit / 8)
            .is_some_and(|b| b & (1 << (bit % 8)) != 0)
    }

    /// Number of entries said to be live in segments or adopted WAL files.
    pub(crate) fn live_count(&self) -> u64 {
        self.live_bits
            .iter()
            .map(|b| u64::from(b.count_ones()))
            .sum()
    }

    fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.log_id,
            self.first_index,
            self.last_index,
            self.snapshot_index,
            self.snapshot_term,
            self.hard_state.term,
            self.hard_state.vote,
            self.hard_state.commit,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.next_segment_id.to_le_bytes());
        out.extend_from_slice(&(self.snapshot_blob.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.snapshot_blob);
        out.extend_from_slice(&(self.terms.len() as u32).to_le_bytes());
        for (start, term) in &self.terms {
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&term.to_le_bytes());
        }
        out.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for (id, meta) in &self.segments {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&meta.count.to_le_bytes());
            out.extend_from_slice(&meta.data_end.to_le_bytes());
            out.extend_from_slice(&meta.last_index.to_le_bytes());
        }
        out.extend_from_slice(&(self.adopted.len() as u32).to_le_bytes());
        for seq in &self.adopted {
            out.extend_from_slice(&seq.to_le_bytes());
        }
        out.extend_from_slice(&self.live_lo.to_le_bytes());
        out.extend_from_slice(&(self.live_bits.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.live_bits);
    }
}

/// The whole checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub wal_flushed_seq: u64,
    /// Adopted WAL files: (sequence, entries listed in its sidecar).
    pub adopted: Vec<(u64, u64)>,
    pub logs: Vec<LogCheckpoint>,
}

/// Starts an encoded checkpoint; logs are appended with [`LogCheckpoint`] and it is closed by
/// [`finish`].
pub(crate) fn begin(wal_flushed_seq: u64, adopted: &[(u64, u64)], log_count: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 << 10);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&wal_flushed_seq.to_le_bytes());
    out.extend_from_slice(&(adopted.len() as u64).to_le_bytes());
    for (seq, entries) in adopted {
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&entries.to_le_bytes());
    }
    out.extend_from_slice(&log_count.to_le_bytes());
    out
}

pub(crate) fn push_log(out: &mut Vec<u8>, log: &LogCheckpoint) {
    log.encode(out);
}

pub(crate) fn finish(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

impl Checkpoint {
    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = begin(self.wal_flushed_seq, &self.adopted, self.logs.len() as u64);
        for log in &self.logs {
            push_log(&mut out, log);
        }
        finish(out)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Checkpoint> {
        let corrupt = |why: &str| Error::Corrupt(format!("checkpoint: {why}"));
        if bytes.len() < 36 {
            return Err(corrupt("too short"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err(corrupt("checksum mismatch"));
        }
        let mut r = Reader { b: body, at: 0 };
        if r.take(8)? != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let version = r.u32()?;
        if version != VERSION && version != VERSION_NO_HARD_STATE {
            return Err(corrupt(&format!(
                "version {version} is not supported (this engine reads version {VERSION} only)"
            )));
        }
        r.u32()?;
        let wal_flushed_seq = r.u64()?;
        let adopted_count = r.u64()?;
        let mut adopted = Vec::new();
        for _ in 0..adopted_count {
            let seq = r.u64()?;
            if seq > wal_flushed_seq || adopted.last().is_some_and(|(s, _)| *s >= seq) {
                return Err(corrupt("adopted WAL files out of order"));
            }
            adopted.push((seq, r.u64()?));
        }
        let count = r.u64()?;
        let mut logs = Vec::new();
        for _ in 0..count {
            let log_id = r.u64()?;
            let first_index = r.u64()?;
            let last_index = r.u64()?;
            let snapshot_index = r.u64()?;
            let snapshot_term = r.u64()?;
            let hard_state = if version == VERSION_NO_HARD_STATE {
                crate::store::HardState::default()
            } else {
                crate::store::HardState {
                    term: r.u64()?,
                    vote: r.u64()?,
                    commit: r.u64()?,
                }
            };
            let next_segment_id = r.u32()?;
            let blob_len = r.u32()? as usize;
            let snapshot_blob = Bytes::copy_from_slice(r.take(blob_len)?);
            let runs = r.u32()? as usize;
            let mut terms = Vec::new();
            for _ in 0..runs {
                terms.push((r.u64()?, r.u64()?));
            }
            let segs = r.u32()? as usize;
            let mut segments = Vec::new();
            for _ in 0..segs {
                let id = r.u32()?;
                let meta = SegmentMeta {
                    count: r.u32()?,
                    data_end: r.u64()?,
                    last_index: r.u64()?,
                };
                segments.push((id, meta));
            }
            let log_adopted_count = r.u32()? as usize;
            let mut log_adopted = Vec::new();
            for _ in 0..log_adopted_count {
                let seq = r.u64()?;
                if adopted.binary_search_by_key(&seq, |a| a.0).is_err() {
                    return Err(corrupt("log names a WAL file that is not adopted"));
                }
                log_adopted.push(seq);
            }
            let live_lo = r.u64()?;
            let bits_len = r.u32()? as usize;
            let live_bits = r.take(bits_len)?.to_vec();
            if first_index == 0 || last_index + 1 < first_index {
                return Err(corrupt("bad log range"));
            }
            logs.push(LogCheckpoint {
                log_id,
                first_index,
                last_index,
                snapshot_index,
                snapshot_term,
                snapshot_blob,
                hard_state,
                next_segment_id,
                terms,
                segments,
                adopted: log_adopted,
                live_lo,
                live_bits,
            });
        }
        if r.at != body.len() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(Checkpoint {
            wal_flushed_seq,
            adopted,
            logs,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.b.len() - self.at < n {
            return Err(Error::Corrupt("checkpoint: truncated".into()));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

/// Fsyncs a directory so that a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces the checkpoint atomically.
pub(crate) fn write(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(TMP_NAME);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_data()?;
    drop(file);
    fs::rename(&tmp, dir.join(FILE_NAME))?;
    sync_dir(dir)
}

/// Reads the checkpoint, if one was ever written.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>> {
    match fs::read(dir.join(FILE_NAME)) {
        Ok(bytes) => Checkpoint::decode(&bytes).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trips_and_detects_damage() {
        let cp = Checkpoint {
            wal_flushed_seq: 9,
            adopted: vec![(7, 100), (8, 3)],
            logs: vec![LogCheckpoint {
                log_id: 3,
                first_index: 5,
                last_index: 20,
                snapshot_index: 4,
                snapshot_term: 2,
                snapshot_blob: Bytes::from_static(b"state"),
                hard_state: crate::store::HardState {
                    term: 3,
                    vote: 2,
                    commit: 19,
                },
                next_segment_id: 4,
                terms: vec![(5, 2), (9, 3)],
                segments: vec![(
                    3,
                    SegmentMeta {
                        count: 7,
                        data_end: 1000,
                        last_index: 12,
                    },
                )],
                adopted: vec![8],
                live_lo: 6,
                live_bits: vec![0b101],
            }],
        };
        let bytes = cp.encode();
        let back = Checkpoint::decode(&bytes).unwrap();
        assert_eq!(back, cp);
        assert!(back.logs[0].is_settled_live(6));
        assert!(!back.logs[0].is_settled_live(7));
        assert!(back.logs[0].is_settled_live(8));
        assert_eq!(back.logs[0].live_count(), 2);
        let mut bad = bytes.clone();
        bad[30] ^= 4;
        assert!(Checkpoint::decode(&bad).is_err());
    }

    #[test]
    fn unknown_version_is_refused_by_name() {
        let mut bytes = Checkpoint::default().encode();
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        let n = bytes.len() - 4;
        let crc = crc32c::crc32c(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
        match Checkpoint::decode(&bytes) {
            Err(Error::Corrupt(why)) => assert!(why.contains("version 1"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
