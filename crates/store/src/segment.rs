//! Segment files: the per-log home of entries that outlive their WAL file.
//!
//! Like Ra's segments, a file holds a header, a fixed-size index, then data:
//!
//! ```text
//! header, 64 bytes:
//!  0  8  magic "WRNSEG01"
//!  8  4  version (1)
//! 12  4  index capacity in entries (SEGMENT_ENTRIES_MAX)
//! 16  8  log id
//! 24  4  segment id
//! 28 32  zero
//! 60  4  crc32c of bytes 0..60
//! index, capacity x 32 bytes, entry n at 64 + 32 n:
//!  0  8  entry index
//!  8  8  term
//! 16  4  record offset in the file
//! 20  4  record length (header + payload)
//! 24  4  the record's crc32c
//! 28  4  crc32c of bytes 0..28 of this index entry
//! data from 64 + 32 x capacity: records exactly as in the WAL (see `record`).
//! ```
//!
//! Entries in a segment have increasing indexes (with gaps where entries were released before
//! the flush). Which index entries are valid is said by the checkpoint (`count`), so a crash in
//! the middle of appending to a segment leaves nothing recovery could misread.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::config::{PAYLOAD_BYTES_MAX, SEGMENT_ENTRIES_MAX};
use crate::record::RECORD_HEADER_BYTES;
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"WRNSEG01";
/// 2: 32-byte record headers (version 1 had 40).
const VERSION: u32 = 2;
/// Size of the segment header.
pub const SEGMENT_HEADER_BYTES: u64 = 64;
/// Size of one index entry.
pub const INDEX_ENTRY_BYTES: u64 = 32;
/// Where the data area starts.
pub const DATA_START: u64 = SEGMENT_HEADER_BYTES + INDEX_ENTRY_BYTES * SEGMENT_ENTRIES_MAX as u64;

/// One index entry of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Entry index.
    pub index: u64,
    /// Entry term.
    pub term: u64,
    /// Offset of the record in the file.
    pub offset: u32,
    /// Length of the whole record.
    pub length: u32,
    /// The record's checksum.
    pub crc: u32,
}

impl IndexEntry {
    pub(crate) fn encode(&self, buf: &mut Vec<u8>) {
        let start = buf.len();
        buf.extend_from_slice(&self.index.to_le_bytes());
        buf.extend_from_slice(&self.term.to_le_bytes());
        buf.extend_from_slice(&self.offset.to_le_bytes());
        buf.extend_from_slice(&self.length.to_le_bytes());
        buf.extend_from_slice(&self.crc.to_le_bytes());
        let crc = crc32c::crc32c(&buf[start..]);
        buf.extend_from_slice(&crc.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<IndexEntry> {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        if crc32c::crc32c(&b[..28]) != u32_at(28) {
            return None;
        }
        Some(IndexEntry {
            index: u64_at(0),
            term: u64_at(8),
            offset: u32_at(16),
            length: u32_at(20),
            crc: u32_at(24),
        })
    }
}

/// The file name of segment `id` of `log_id`.
pub fn segment_path(dir: &Path, log_id: u64, id: u32) -> PathBuf {
    dir.join(format!("{log_id:016x}-{id:08x}.seg"))
}

/// The (log id, segment id) a segment file name stands for.
pub fn parse_segment_name(name: &str) -> Option<(u64, u32)> {
    let stem = name.strip_suffix(".seg")?;
    let (log, id) = stem.split_once('-')?;
    if log.len() != 16 || id.len() != 8 {
        return None;
    }
    Some((
        u64::from_str_radix(log, 16).ok()?,
        u32::from_str_radix(id, 16).ok()?,
    ))
}

fn header(log_id: u64, id: u32) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&SEGMENT_ENTRIES_MAX.to_le_bytes());
    h[16..24].copy_from_slice(&log_id.to_le_bytes());
    h[24..28].copy_from_slice(&id.to_le_bytes());
    let crc = crc32c::crc32c(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Creates a new segment file with its header (not synced: the caller syncs after its data).
pub fn create(dir: &Path, log_id: u64, id: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(segment_path(dir, log_id, id))?;
    file.write_all_at(&header(log_id, id), 0)?;
    Ok(file)
}

/// Opens an existing segment for reads and appends.
pub fn open(dir: &Path, log_id: u64, id: u32) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment_path(dir, log_id, id))
}

/// Reads and verifies the header and the first `count` index entries.
pub fn read_index(file: &File, log_id: u64, id: u32, count: u32) -> Result<Vec<IndexEntry>> {
    if count > SEGMENT_ENTRIES_MAX {
        return Err(Error::Corrupt(format!(
            "segment {log_id}/{id}: count {count}"
        )));
    }
    let mut buf = vec![0u8; (SEGMENT_HEADER_BYTES + INDEX_ENTRY_BYTES * u64::from(count)) as usize];
    file.read_exact_at(&mut buf, 0)?;
    if buf[..SEGMENT_HEADER_BYTES as usize] != header(log_id, id) {
        return Err(Error::Corrupt(format!("segment {log_id}/{id}: bad header")));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut last_index = 0;
    for chunk in buf[SEGMENT_HEADER_BYTES as usize..].chunks_exact(INDEX_ENTRY_BYTES as usize) {
        let entry = IndexEntry::decode(chunk)
            .filter(|e| {
                e.index > last_index
                    && u64::from(e.offset) >= DATA_START
                    && (e.length as usize) >= RECORD_HEADER_BYTES
                    && (e.length as usize) - RECORD_HEADER_BYTES <= PAYLOAD_BYTES_MAX
            })
            .ok_or_else(|| Error::Corrupt(format!("segment {log_id}/{id}: bad index entry")))?;
        last_index = entry.index;
        entries.push(entry);
    }
    Ok(entries)
}

/// Where index entry `position` lives in the file.
pub fn index_entry_offset(position: u32) -> u64 {
    SEGMENT_HEADER_BYTES + INDEX_ENTRY_BYTES * u64::from(position)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let p = segment_path(Path::new("/x"), 0xabc, 7);
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_segment_name(name), Some((0xabc, 7)));
        assert_eq!(parse_segment_name("junk.seg"), None);
    }

    #[test]
    fn damaged_index_entry_is_refused() {
        let mut buf = Vec::new();
        let e = IndexEntry {
            index: 5,
            term: 2,
            offset: DATA_START as u32,
            length: 45,
            crc: 9,
        };
        e.encode(&mut buf);
        assert_eq!(IndexEntry::decode(&buf), Some(e));
        buf[3] ^= 1;
        assert_eq!(IndexEntry::decode(&buf), None);
    }
}
