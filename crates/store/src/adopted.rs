//! Adopted WAL files: rolled WAL files kept in place as immutable data files, so that a backlog
//! (entries still live when their WAL file rolls over) is written once instead of twice.
//!
//! Entries of an adopted file keep pointing at `Loc::Wal { seq, offset }`. So that recovery
//! need not read the file's data to find them, adoption writes an index **sidecar**
//! `wal/<seq:016x>.idx`, fsyncs it, and only then names the file in the checkpoint. Layout,
//! little endian:
//!
//! ```text
//! header, 64 bytes
//!  0  8  magic "WRNIDX01"
//!  8  4  version (1)
//! 12  4  zero
//! 16  8  WAL sequence number (same as the name)
//! 24  8  number of runs
//! 32  8  number of entries
//! 40  8  body length in bytes
//! 48  4  crc32c of the body
//! 52  8  zero
//! 60  4  crc32c of bytes 0..60
//! body: runs back to back; a run is consecutive indexes of one log with one term
//!  0  8  log id
//!  8  8  first index
//! 16  8  term
//! 24  4  number of entries n (>= 1)
//! 28  4  zero
//! 32  n x 8: per entry, 4 record offset in the WAL file, 4 payload length
//! ```
//!
//! About 8 bytes per entry (plus 32 per run), against 32 per entry for a segment's index: a
//! 256 MiB WAL file of 1 KB entries gets a 2 MB sidecar. Which entries of the file are still
//! live, and which logs may use it, is said by the checkpoint (bitmap and per-log list of
//! adopted files), never by the sidecar, which is written once and never changed.
//!
//! A sidecar that fails its checks is not fatal: it only saves reading the WAL file, so
//! recovery then scans the WAL file's append records instead (verifying each checksum) and
//! rewrites the sidecar. What is live is still decided by the checkpoint, and recovery's count
//! of live entries must match it, so a damaged WAL file still fails the open with `Corrupt`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::PAYLOAD_BYTES_MAX;
use crate::id_hash::IdMap;
use crate::record::{RecordKind, RECORD_HEADER_BYTES};
use crate::wal::WAL_HEADER_BYTES;
use crate::wal_reader::WalReader;
use crate::Result;

const MAGIC: &[u8; 8] = b"WRNIDX01";
const VERSION: u32 = 1;
/// Size of the sidecar header.
pub(crate) const SIDECAR_HEADER_BYTES: u64 = 64;
/// Size of a run's header in the sidecar body.
const RUN_HEADER_BYTES: usize = 32;
/// Size of one entry in the sidecar body.
const ENTRY_BYTES: usize = 8;
/// Bytes of sidecar body gathered before they are written out.
const SIDECAR_WRITE_BYTES_MAX: usize = 4 << 20;

/// What the engine tracks of one adopted WAL file.
#[derive(Debug)]
pub(crate) struct AdoptedFile {
    /// Length of the WAL file, the disk it holds.
    pub file_bytes: u64,
    /// Entries its sidecar lists (recorded in the checkpoint as a cross-check).
    pub sidecar_entries: u64,
    /// Records (header + payload) of live entries at the last count.
    pub live_bytes: u64,
    /// Live entries at the last count.
    pub live_entries: u64,
    /// Per log holding entries in it: (generation, lowest index, highest index). Only slots in
    /// that range, of that life of the log, can point into the file.
    pub logs: IdMap<(u64, u64, u64)>,
    /// When `live_bytes` last changed.
    pub changed_at: Instant,
}

/// A run of consecutive entries of one log with one term, as listed in a sidecar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub log_id: u64,
    pub first_index: u64,
    pub term: u64,
    /// Per entry: record offset in the WAL file, payload length.
    pub entries: Vec<(u32, u32)>,
}

/// The path of the sidecar of WAL file `seq`.
pub(crate) fn sidecar_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.idx"))
}

/// The WAL sequence number a sidecar name stands for.
pub(crate) fn parse_sidecar_name(name: &str) -> Option<u64> {
    crate::wal::parse_seq_name(name, ".idx")
}

fn header(seq: u64, runs: u64, entries: u64, body_len: u64, body_crc: u32) -> [u8; 64] {
    let mut h = [0u8; SIDECAR_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&seq.to_le_bytes());
    h[24..32].copy_from_slice(&runs.to_le_bytes());
    h[32..40].copy_from_slice(&entries.to_le_bytes());
    h[40..48].copy_from_slice(&body_len.to_le_bytes());
    h[48..52].copy_from_slice(&body_crc.to_le_bytes());
    let crc = crc32c::crc32c(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Writes a sidecar entry by entry, in bounded buffers. Entries of one log come in ascending
/// index order; consecutive ones with the same term share a run.
pub(crate) struct SidecarWriter {
    seq: u64,
    file: File,
    buf: Vec<u8>,
    written: u64,
    crc: u32,
    runs: u64,
    entries: u64,
    /// (log id, next index, term, offset in `buf` of the open run's count).
    open: Option<(u64, u64, u64, usize)>,
}

impl SidecarWriter {
    pub(crate) fn create(dir: &Path, seq: u64) -> io::Result<SidecarWriter> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(sidecar_path(dir, seq))?;
        Ok(SidecarWriter {
            seq,
            file,
            buf: Vec::with_capacity(SIDECAR_WRITE_BYTES_MAX + 64),
            written: 0,
            crc: 0,
            runs: 0,
            entries: 0,
            open: None,
        })
    }

    pub(crate) fn push(
        &mut self,
        log_id: u64,
        index: u64,
        term: u64,
        offset: u32,
        len: u32,
    ) -> io::Result<()> {
        let continues =
            matches!(self.open, Some((l, next, t, _)) if l == log_id && next == index && t == term);
        if !continues {
            if self.buf.len() >= SIDECAR_WRITE_BYTES_MAX {
                self.spill()?;
            }
            let at = self.buf.len() + 24;
            self.buf.extend_from_slice(&log_id.to_le_bytes());
            self.buf.extend_from_slice(&index.to_le_bytes());
            self.buf.extend_from_slice(&term.to_le_bytes());
            self.buf.extend_from_slice(&[0u8; 8]);
            self.open = Some((log_id, index, term, at));
            self.runs += 1;
        }
        let (_, next, _, at) = self.open.as_mut().expect("a run is open");
        *next = index + 1;
        let count = u32::from_le_bytes(self.buf[*at..*at + 4].try_into().expect("4")) + 1;
        self.buf[*at..*at + 4].copy_from_slice(&count.to_le_bytes());
        self.buf.extend_from_slice(&offset.to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.entries += 1;
        Ok(())
    }

    /// Writes out the buffered runs; the open run ends here (the next entry starts a new one).
    fn spill(&mut self) -> io::Result<()> {
        self.file
            .write_all_at(&self.buf, SIDECAR_HEADER_BYTES + self.written)?;
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
        self.written += self.buf.len() as u64;
        self.buf.clear();
        self.open = None;
        Ok(())
    }

    /// Writes the rest and the header and fsyncs the file (the caller fsyncs the directory).
    /// Returns the number of entries and the bytes written.
    pub(crate) fn finish(mut self) -> io::Result<(u64, u64)> {
        self.spill()?;
        let h = header(self.seq, self.runs, self.entries, self.written, self.crc);
        self.file.write_all_at(&h, 0)?;
        self.file.sync_all()?;
        Ok((self.entries, SIDECAR_HEADER_BYTES + self.written))
    }
}

/// Reads and verifies the sidecar of WAL file `seq` (of `wal_len` bytes), which the checkpoint
/// says lists `entries` entries. `Ok(None)` when it is missing or fails a check.
pub(crate) fn read(dir: &Path, seq: u64, entries: u64, wal_len: u64) -> Result<Option<Vec<Run>>> {
    let bytes = match std::fs::read(sidecar_path(dir, seq)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(parse(&bytes, seq, entries, wal_len))
}

fn parse(bytes: &[u8], seq: u64, entries: u64, wal_len: u64) -> Option<Vec<Run>> {
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    if bytes.len() < SIDECAR_HEADER_BYTES as usize {
        return None;
    }
    let (h, body) = bytes.split_at(SIDECAR_HEADER_BYTES as usize);
    let (runs, count, body_len, body_crc) =
        (u64_at(h, 24), u64_at(h, 32), u64_at(h, 40), u32_at(h, 48));
    if h != header(seq, runs, count, body_len, body_crc)
        || count != entries
        || body_len != body.len() as u64
        || crc32c::crc32c(body) != body_crc
    {
        return None;
    }
    let mut out = Vec::with_capacity(runs as usize);
    let mut at = 0;
    let mut seen = 0u64;
    while at < body.len() {
        if body.len() - at < RUN_HEADER_BYTES {
            return None;
        }
        let (log_id, first_index, term) = (
            u64_at(body, at),
            u64_at(body, at + 8),
            u64_at(body, at + 16),
        );
        let n = u32_at(body, at + 24) as usize;
        at += RUN_HEADER_BYTES;
        if n == 0 || first_index == 0 || (body.len() - at) / ENTRY_BYTES < n {
            return None;
        }
        let mut list = Vec::with_capacity(n);
        for _ in 0..n {
            let (offset, len) = (u32_at(body, at), u32_at(body, at + 4));
            at += ENTRY_BYTES;
            let end = u64::from(offset) + (RECORD_HEADER_BYTES as u64) + u64::from(len);
            if u64::from(offset) < WAL_HEADER_BYTES
                || len as usize > PAYLOAD_BYTES_MAX
                || end > wal_len
            {
                return None;
            }
            list.push((offset, len));
        }
        seen += n as u64;
        out.push(Run {
            log_id,
            first_index,
            term,
            entries: list,
        });
    }
    (out.len() as u64 == runs && seen == count).then_some(out)
}

/// Rebuilds the runs of WAL file `seq` from its append records, checksum verified: what
/// recovery does when the sidecar is unusable. Stops at the first bad record (what follows is
/// not trusted; recovery's live count decides whether anything needed was there).
pub(crate) fn scan_wal(file: &File, seq: u64) -> Result<Vec<Run>> {
    let mut runs: Vec<Run> = Vec::new();
    let Some(mut reader) = WalReader::open(file, seq)? else {
        return Ok(runs);
    };
    while let Some(batch) = reader.next_batch()? {
        for r in batch.iter().filter(|r| r.header.kind == RecordKind::Append) {
            let h = &r.header;
            let entry = (r.offset as u32, h.len);
            match runs.last_mut() {
                Some(run)
                    if run.log_id == h.log_id
                        && run.term == h.term
                        && run.first_index + run.entries.len() as u64 == h.index =>
                {
                    run.entries.push(entry)
                }
                _ => runs.push(Run {
                    log_id: h.log_id,
                    first_index: h.index,
                    term: h.term,
                    entries: vec![entry],
                }),
            }
        }
    }
    Ok(runs)
}

/// Writes `runs` as the sidecar of WAL file `seq`, durably (file and directory).
pub(crate) fn write_runs(dir: &Path, seq: u64, runs: &[Run]) -> Result<(u64, u64)> {
    let mut w = SidecarWriter::create(dir, seq)?;
    for r in runs {
        for (k, (offset, len)) in r.entries.iter().enumerate() {
            w.push(r.log_id, r.first_index + k as u64, r.term, *offset, *len)?;
        }
    }
    let done = w.finish()?;
    crate::checkpoint::sync_dir(dir)?;
    Ok(done)
}

/// Removes the sidecar of WAL file `seq`, if any.
pub(crate) fn remove(dir: &Path, seq: u64) -> io::Result<()> {
    match std::fs::remove_file(sidecar_path(dir, seq)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_round_trips_and_any_damage_is_refused() {
        let dir = std::env::temp_dir().join(format!("warren-sidecar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = SidecarWriter::create(&dir, 7).unwrap();
        // Two logs, a term change and a gap: four runs.
        w.push(1, 10, 1, 32, 100).unwrap();
        w.push(1, 11, 1, 172, 100).unwrap();
        w.push(1, 12, 2, 312, 5).unwrap();
        w.push(2, 1, 1, 357, 0).unwrap();
        w.push(1, 14, 2, 397, 1).unwrap();
        let (entries, bytes) = w.finish().unwrap();
        assert_eq!(entries, 5);
        assert_eq!(bytes, 64 + 4 * 32 + 5 * 8);
        let runs = read(&dir, 7, 5, 1 << 20).unwrap().unwrap();
        assert_eq!(
            runs,
            vec![
                Run {
                    log_id: 1,
                    first_index: 10,
                    term: 1,
                    entries: vec![(32, 100), (172, 100)]
                },
                Run {
                    log_id: 1,
                    first_index: 12,
                    term: 2,
                    entries: vec![(312, 5)]
                },
                Run {
                    log_id: 2,
                    first_index: 1,
                    term: 1,
                    entries: vec![(357, 0)]
                },
                Run {
                    log_id: 1,
                    first_index: 14,
                    term: 2,
                    entries: vec![(397, 1)]
                },
            ]
        );
        assert_eq!(
            read(&dir, 7, 4, 1 << 20).unwrap(),
            None,
            "count not as checkpointed"
        );
        assert_eq!(
            read(&dir, 7, 5, 400).unwrap(),
            None,
            "entry beyond the WAL file"
        );
        assert_eq!(
            read(&dir, 8, 5, 1 << 20).unwrap(),
            None,
            "file of another sequence"
        );
        let bytes = std::fs::read(sidecar_path(&dir, 7)).unwrap();
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert_eq!(
                parse(&bad, 7, 5, 1 << 20),
                None,
                "flipped byte {at} went unnoticed"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
