//! Opening a stream's directory after any stop, kill -9 included.
//!
//! Only the last segment can hold a torn tail: a segment is synced before the next one is
//! started. So every earlier segment is taken from its index alone (its first and last
//! records, checked against the file sizes and the previous segment's end: O(1) per segment),
//! and the last one is read whole: each chunk is parsed and its CRC checked, each index record
//! compared with its chunk. The first chunk that is partial or damaged ends the segment; index
//! records without their chunk are dropped, and complete chunks whose record never made it to
//! the index get one. A head segment missing one of its two files is what a crash left of a
//! retention deletion, and is deleted; elsewhere a missing or damaged file is an error that
//! names it, never a guess.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::chunk::{Chunk, ChunkHeader, CHUNK_BYTES_MAX, CHUNK_HEADER_BYTES};
use super::index::{
    self, IndexRecord, INDEX_HEADER_BYTES, INDEX_RECORD_BYTES, SEGMENT_HEADER_BYTES,
};
use super::log::{create_segment, SegmentSummary};
use super::RECOVERY_READ_BYTES;
use crate::{Error, Result};

/// What recovery found and repaired, for the caller's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Bytes cut from the end of the last segment (a torn or damaged tail).
    pub segment_bytes_cut: u64,
    /// Index records dropped (their chunk was not whole) or rewritten (the chunk was whole
    /// but its record was missing or torn).
    pub index_records_repaired: u64,
    /// Files deleted that a crash left behind from a retention deletion.
    pub leftover_files_deleted: u32,
    /// Files of the last segment whose header was not whole (created just before a crash),
    /// started again empty.
    pub files_reset: u32,
}

pub(crate) struct Opened {
    /// The flock that keeps a second writer out of the directory, held while the log is open.
    pub(crate) lock: File,
    pub(crate) segments: Vec<SegmentSummary>,
    pub(crate) segment: File,
    pub(crate) index: File,
    pub(crate) last_epoch: u64,
    pub(crate) last_timestamp_ms: i64,
    pub(crate) report: Recovered,
}

fn corrupt(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{}: {why}", path.display()))
}

/// Takes an exclusive, non-blocking flock on the stream's `LOCK` file: two writers would
/// write over each other's chunks.
fn lock(dir: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    let path = dir.join("LOCK");
    let file = open_rw(&path)?;
    // SAFETY: flock on a valid, owned file descriptor has no memory-safety requirement.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(Error::AlreadyOpen(path));
        }
        return Err(e.into());
    }
    Ok(file)
}

pub(crate) fn open(dir: &Path) -> Result<Opened> {
    std::fs::create_dir_all(dir)?;
    let lock = lock(dir)?;
    // first offset -> (segment file present, index file present)
    let mut found: BTreeMap<u64, (bool, bool)> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if let Some((first, is_index)) = index::parse_name(&name) {
            let slot = found.entry(first).or_default();
            if is_index {
                slot.1 = true;
            } else {
                slot.0 = true;
            }
        }
    }
    let mut report = Recovered::default();
    let Some(&last_first) = found.keys().next_back() else {
        let (segment, index) = create_segment(dir, 0, 0)?;
        segment.sync_data()?;
        index.sync_data()?;
        File::open(dir)?.sync_all()?;
        return Ok(Opened {
            lock,
            segments: vec![SegmentSummary::empty(0, 0)],
            segment,
            index,
            last_epoch: 0,
            last_timestamp_ms: 0,
            report,
        });
    };
    let mut segments: Vec<SegmentSummary> = Vec::new();
    let mut at_head = true;
    for (&first, &(has_segment, has_index)) in found.range(..last_first) {
        if !(has_segment && has_index) {
            let missing = if has_segment {
                index::index_path(dir, first)
            } else {
                index::segment_path(dir, first)
            };
            if !at_head {
                return Err(corrupt(&missing, "missing"));
            }
            for p in [
                index::index_path(dir, first),
                index::segment_path(dir, first),
            ] {
                if p.exists() {
                    std::fs::remove_file(&p)?;
                    report.leftover_files_deleted += 1;
                }
            }
            continue;
        }
        at_head = false;
        let summary = closed_segment(dir, first)?;
        if let Some(prev) = segments.last() {
            check_follows(dir, prev, first, Some(summary.first_seq))?;
        }
        segments.push(summary);
    }
    if let Some(prev) = segments.last() {
        check_follows(dir, prev, last_first, None)?;
    }
    let expected_seq = segments.last().map(SegmentSummary::next_seq);
    let last = active_segment(dir, last_first, expected_seq, &mut report)?;
    let (last_epoch, last_timestamp_ms) = match last.last_record {
        Some(r) => (r.epoch, r.timestamp_ms),
        None => segments.last().map_or((0, 0), |s| {
            // The epoch of an earlier segment's last chunk: read its last index record.
            let epoch = last_record(dir, s).map_or(0, |r| r.epoch);
            (epoch, s.last_timestamp_ms)
        }),
    };
    if report != Recovered::default() {
        last.segment.sync_data()?;
        last.index.sync_data()?;
        File::open(dir)?.sync_all()?;
    }
    segments.push(last.summary);
    Ok(Opened {
        lock,
        segments,
        segment: last.segment,
        index: last.index,
        last_epoch,
        last_timestamp_ms,
        report,
    })
}

/// Whether the segment starting at `first` (chunk `first_seq`, when known) continues `prev`.
fn check_follows(
    dir: &Path,
    prev: &SegmentSummary,
    first: u64,
    first_seq: Option<u64>,
) -> Result<()> {
    if prev.next_offset != first || first_seq.is_some_and(|seq| seq != prev.next_seq()) {
        return Err(corrupt(
            &index::index_path(dir, first),
            format!(
                "starts at offset {first} (chunk {first_seq:?}), the segment before ends at \
                 offset {} (chunk {})",
                prev.next_offset,
                prev.next_seq()
            ),
        ));
    }
    Ok(())
}

fn read_record(file: &File, path: &Path, k: u64) -> Result<IndexRecord> {
    let mut b = [0u8; INDEX_RECORD_BYTES as usize];
    file.read_exact_at(&mut b, index::record_position(k))?;
    IndexRecord::decode(&b).ok_or_else(|| corrupt(path, format!("index record {k} is damaged")))
}

fn check_segment_header(file: &File, path: &Path) -> Result<()> {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    match file.read_exact_at(&mut h, 0) {
        Ok(()) if h == index::segment_header() => Ok(()),
        _ => Err(corrupt(path, "bad file header")),
    }
}

/// The first chunk sequence number of a whole index header.
fn read_index_header(file: &File) -> Option<u64> {
    let mut h = [0u8; INDEX_HEADER_BYTES as usize];
    file.read_exact_at(&mut h, 0).ok()?;
    index::parse_index_header(&h)
}

fn last_record(dir: &Path, s: &SegmentSummary) -> Result<IndexRecord> {
    let path = index::index_path(dir, s.first_offset);
    read_record(&File::open(&path)?, &path, s.chunks - 1)
}

/// A segment before the last: synced when the next one began, so its index is whole.
fn closed_segment(dir: &Path, first: u64) -> Result<SegmentSummary> {
    let index_path = index::index_path(dir, first);
    let segment_path = index::segment_path(dir, first);
    let idx = File::open(&index_path)?;
    let first_seq =
        read_index_header(&idx).ok_or_else(|| corrupt(&index_path, "bad file header"))?;
    let seg = File::open(&segment_path)?;
    check_segment_header(&seg, &segment_path)?;
    let index_bytes = idx.metadata()?.len();
    let records = (index_bytes - INDEX_HEADER_BYTES) / INDEX_RECORD_BYTES;
    if records == 0 || !(index_bytes - INDEX_HEADER_BYTES).is_multiple_of(INDEX_RECORD_BYTES) {
        return Err(corrupt(
            &index_path,
            format!("{index_bytes} bytes is not a whole, non-empty index"),
        ));
    }
    let head = read_record(&idx, &index_path, 0)?;
    let tail = read_record(&idx, &index_path, records - 1)?;
    let segment_bytes = seg.metadata()?.len();
    if head.chunk_id != first
        || u64::from(head.position) != SEGMENT_HEADER_BYTES
        || first_seq.checked_add(records).is_none()
        || tail.end_position() != segment_bytes
        || tail.chunk_id < head.chunk_id
    {
        return Err(corrupt(
            &index_path,
            "its first and last records do not match the segment",
        ));
    }
    Ok(SegmentSummary {
        first_offset: first,
        first_seq,
        next_offset: tail.next_offset(),
        first_timestamp_ms: head.timestamp_ms,
        last_timestamp_ms: tail.timestamp_ms,
        chunks: records,
        bytes: segment_bytes,
    })
}

struct Active {
    summary: SegmentSummary,
    segment: File,
    index: File,
    last_record: Option<IndexRecord>,
}

fn open_rw(path: &Path) -> Result<File> {
    Ok(OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?)
}

/// Reads `len` bytes at `pos` through a window of [`RECOVERY_READ_BYTES`] (or one chunk, if
/// larger), so that scanning a segment of small chunks costs few reads.
struct Window<'f> {
    file: &'f File,
    file_bytes: u64,
    start: u64,
    buf: Vec<u8>,
}

impl Window<'_> {
    /// The bytes at `pos..pos + len`, or `None` when the file ends first.
    fn get(&mut self, pos: u64, len: usize) -> Result<Option<&[u8]>> {
        if pos + len as u64 > self.file_bytes {
            return Ok(None);
        }
        let end = self.start + self.buf.len() as u64;
        if pos < self.start || pos + len as u64 > end {
            let want = len
                .max(RECOVERY_READ_BYTES)
                .min((self.file_bytes - pos) as usize);
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, pos)?;
            self.start = pos;
        }
        let at = (pos - self.start) as usize;
        Ok(Some(&self.buf[at..at + len]))
    }
}

/// The last segment: every chunk read and checked, the index made to agree with them.
/// `expected_seq` is where the segment before ends, if there is one.
fn active_segment(
    dir: &Path,
    first: u64,
    expected_seq: Option<u64>,
    report: &mut Recovered,
) -> Result<Active> {
    let segment_path = index::segment_path(dir, first);
    let index_path = index::index_path(dir, first);
    let segment = open_rw(&segment_path)?;
    let index = open_rw(&index_path)?;
    // A header that is not whole was never synced (a segment's headers are synced before its
    // first chunk is written), so the file holds nothing: it starts again empty.
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    if segment.read_exact_at(&mut h, 0).is_err() || h != index::segment_header() {
        report.segment_bytes_cut += segment.metadata()?.len();
        segment.set_len(0)?;
        segment.write_all_at(&index::segment_header(), 0)?;
        report.files_reset += 1;
    }
    let first_seq = match (read_index_header(&index), expected_seq) {
        (Some(seq), Some(expected)) if seq != expected => {
            return Err(corrupt(
                &index_path,
                format!("starts at chunk {seq}, the segment before ends at chunk {expected}"),
            ))
        }
        (Some(seq), _) => seq,
        (None, expected) => {
            // Only the stream's first segment may be without a segment before it to say
            // where it starts.
            let seq = match expected {
                Some(seq) => seq,
                None if first == 0 => 0,
                None => {
                    return Err(corrupt(
                        &index_path,
                        "bad file header, and no segment before it to say its first chunk",
                    ))
                }
            };
            index.set_len(0)?;
            index.write_all_at(&index::index_header(seq), 0)?;
            report.files_reset += 1;
            seq
        }
    };
    let segment_bytes = segment.metadata()?.len();
    let index_bytes = index.metadata()?.len();
    let index_records = (index_bytes - INDEX_HEADER_BYTES) / INDEX_RECORD_BYTES;
    let mut summary = SegmentSummary::empty(first, first_seq);
    let mut window = Window {
        file: &segment,
        file_bytes: segment_bytes,
        start: 0,
        buf: Vec::new(),
    };
    let mut index_window = Window {
        file: &index,
        file_bytes: index_bytes,
        start: 0,
        buf: Vec::new(),
    };
    let mut pos = SEGMENT_HEADER_BYTES;
    let mut last_epoch = 0;
    let mut next_offset = first;
    let mut k = 0u64;
    // Index records from `k_rewrite` on are rewritten from the chunks.
    let mut k_rewrite: Option<u64> = None;
    let mut last_record = None;
    while let Some(head) = window.get(pos, CHUNK_HEADER_BYTES)? {
        let Ok(header) = ChunkHeader::decode(head) else {
            break;
        };
        if header.chunk_id != next_offset
            || header.epoch < last_epoch
            || first_seq + k == u64::MAX
            || pos + header.chunk_bytes() > u64::from(u32::MAX)
            || header.chunk_bytes() > CHUNK_BYTES_MAX as u64
        {
            break;
        }
        let Some(bytes) = window.get(pos, header.chunk_bytes() as usize)? else {
            break;
        };
        if Chunk::parse(bytes).is_err() {
            break;
        }
        let record = IndexRecord::of(&header, pos as u32);
        if k_rewrite.is_none() {
            let on_disk = if k < index_records {
                index_window
                    .get(index::record_position(k), INDEX_RECORD_BYTES as usize)?
                    .and_then(IndexRecord::decode)
            } else {
                None
            };
            if on_disk != Some(record) {
                k_rewrite = Some(k);
            }
        }
        if k_rewrite.is_some() {
            index.write_all_at(&record.encode(), index::record_position(k))?;
        }
        summary.add(&record);
        last_record = Some(record);
        last_epoch = record.epoch;
        pos = record.end_position();
        next_offset = record.next_offset();
        k += 1;
    }
    if segment_bytes > pos {
        report.segment_bytes_cut += segment_bytes - pos;
        segment.set_len(pos)?;
    }
    let index_dropped = index_records.saturating_sub(k);
    let index_rewritten = k - k_rewrite.unwrap_or(k);
    report.index_records_repaired += index_dropped + index_rewritten;
    if index_bytes != index::record_position(k) {
        index.set_len(index::record_position(k))?;
        if index_dropped == 0 && index_rewritten == 0 {
            // A partial record at the end of the index.
            report.index_records_repaired += 1;
        }
    }
    debug_assert_eq!(summary.bytes, pos);
    Ok(Active {
        summary,
        segment,
        index,
        last_record,
    })
}
