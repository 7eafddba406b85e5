//! Readers: a position in a stream, moved chunk by chunk. A reader finds its chunks through the
//! index files (a binary search to position, then one index record per chunk) and hands each
//! out as (file, position, length), so a consumer can `sendfile` it whole; or reads and decodes
//! it. It never yields a chunk past the committed offset, and when retention deletes the
//! segment it is in, it moves on to the first chunk left.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::chunk::{Chunk, ChunkType, Entry};
use super::index::{self, IndexRecord, INDEX_RECORD_BYTES};
use super::log::{SegmentSummary, Shared};
use crate::{Error, Result};

/// Most index records "last" walks back over to find a user chunk; past it, "last" is "next"
/// (a stream whose tail is that long a run of tracking or Raft chunks has no last message
/// worth finding).
pub const LAST_USER_CHUNK_SCAN_MAX: u64 = 4096;

/// Where a reader starts, as a consumer asks (`x-stream-offset`, or the stream protocol's
/// subscribe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The first chunk still held.
    First,
    /// The start of the last committed chunk (the next one to be written when none is).
    Last,
    /// The next offset to be written: only what comes after.
    Next,
    /// The chunk holding this offset; records before it are skipped. Below the first offset
    /// held: the first; past the end: next.
    Offset(u64),
    /// The first chunk whose timestamp (ms since the Unix epoch) is at or after this one;
    /// next when there is none.
    Timestamp(i64),
}

/// A chunk found by a reader: where its bytes are. `file` stays readable even if retention
/// deletes the segment meanwhile (the descriptor keeps it).
#[derive(Clone, Debug)]
pub struct ChunkSlice {
    /// The segment file holding the chunk.
    pub file: Arc<File>,
    /// What the index says of the chunk: first offset, records, timestamp, epoch, type,
    /// position and length in `file`.
    pub record: IndexRecord,
}

impl ChunkSlice {
    /// Where the chunk starts in `file`.
    pub fn position(&self) -> u64 {
        u64::from(self.record.position)
    }

    /// Bytes of the whole chunk (header, filter, data, trailer).
    pub fn len(&self) -> u64 {
        u64::from(self.record.chunk_bytes)
    }

    /// Never true: a chunk has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Reads the chunk and checks it (CRC, entries, and that its header is what the index
    /// says), right after the read.
    pub fn read(&self) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.record.chunk_bytes as usize];
        self.file.read_exact_at(&mut bytes, self.position())?;
        match Chunk::parse(&bytes) {
            Ok(chunk) if self.record.matches(&chunk.header) => Ok(bytes),
            Ok(_) => Err(Error::Corrupt(format!(
                "stream chunk {} disagrees with its index record",
                self.record.chunk_id
            ))),
            Err(e) => Err(Error::Corrupt(format!(
                "stream chunk {}: {e}",
                self.record.chunk_id
            ))),
        }
    }
}

/// A chunk read and checked, with the offset below which its records are not for this
/// reader.
#[derive(Clone, Debug)]
pub struct ReadChunk {
    /// The chunk's bytes.
    pub bytes: Vec<u8>,
    /// Records below this offset are skipped by [`ReadChunk::entries`].
    pub skip_below: u64,
}

impl ReadChunk {
    /// The chunk, decoded (it was checked when read).
    pub fn chunk(&self) -> Chunk<'_> {
        Chunk::parse(&self.bytes).expect("checked when read")
    }

    /// The entries for this reader, each with its first offset: a sub-batch is kept whole if
    /// any of its records is at or past the reader's start.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Entry<'_>)> + '_ {
        let skip_below = self.skip_below;
        self.chunk()
            .entries()
            .filter(move |(offset, e)| offset + u64::from(e.records()) > skip_below)
    }
}

struct OpenSegment {
    summary: SegmentSummary,
    segment: Arc<File>,
    index: File,
    /// The index record of the reader's next chunk.
    cursor: u64,
}

/// A position in a stream. Independent of the writer: it may live on another thread.
pub struct Reader {
    shared: Arc<Shared>,
    /// A replication reader: every chunk type, up to what is written. Otherwise a consumer's:
    /// user chunks only, up to the committed offset.
    replication: bool,
    /// The first offset of the next chunk to yield.
    next_offset: u64,
    /// Records below it are not for this reader (a numeric offset spec inside a chunk).
    skip_below: u64,
    open: Option<OpenSegment>,
}

impl Reader {
    pub(crate) fn new(shared: Arc<Shared>, spec: OffsetSpec) -> Result<Reader> {
        let position = match Reader::position(&shared, spec) {
            // Retention deleted the segment searched meanwhile: once more, past it.
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                Reader::position(&shared, spec)
            }
            other => other,
        };
        let (next_offset, skip_below) = position?;
        Ok(Reader {
            shared,
            replication: false,
            next_offset,
            skip_below,
            open: None,
        })
    }

    pub(crate) fn from_seq(shared: Arc<Shared>, seq: u64) -> Result<Reader> {
        let handle = super::StreamHandle {
            shared: shared.clone(),
        };
        let overview = handle.overview();
        let next_offset = if seq >= overview.next_seq {
            overview.next_offset
        } else {
            match handle.chunk_by_seq(seq)? {
                Some(slice) => slice.record.chunk_id,
                None => {
                    return Err(Error::OutOfRange {
                        log_id: 0,
                        index: seq,
                    })
                }
            }
        };
        Ok(Reader {
            shared,
            replication: true,
            next_offset,
            skip_below: 0,
            open: None,
        })
    }

    /// The first offset of the first chunk for `spec`, and the offset below which records
    /// are skipped.
    fn position(shared: &Shared, spec: OffsetSpec) -> Result<(u64, u64)> {
        // Both ends before the summaries: a summary is updated before the ends move, so the
        // copy holds every chunk below them.
        let written_end = shared.written_end.load(Ordering::Acquire);
        let visible_end = shared.visible_end();
        let segments = shared.segments.read().expect("segments lock").clone();
        let first = segments[0].first_offset;
        // Nothing is committed after a restart until the caller says so: below the first
        // offset held is the same as at it.
        let visible_end = visible_end.max(first);
        let dir = &shared.dir;
        // "Next" is the committed end: a chunk boundary (Raft commits whole chunks), so a
        // truncation of what is not committed never cuts under a reader's position.
        let next = if visible_end < written_end {
            (chunk_holding(dir, &segments, visible_end)?, visible_end)
        } else {
            (written_end, 0)
        };
        let (next_offset, skip_below) = match spec {
            OffsetSpec::First => (first, 0),
            OffsetSpec::Next => next,
            OffsetSpec::Last if visible_end <= first => next,
            OffsetSpec::Last => match last_user_chunk(dir, &segments, visible_end)? {
                Some(id) => (id, 0),
                None => next,
            },
            OffsetSpec::Offset(o) if o < first => (first, 0),
            OffsetSpec::Offset(o) if o < visible_end => (chunk_holding(dir, &segments, o)?, o),
            OffsetSpec::Offset(o) if o < written_end => (next.0, o),
            OffsetSpec::Offset(_) => next,
            OffsetSpec::Timestamp(t) => match chunk_at_or_after(dir, &segments, t)? {
                Some(id) if id < visible_end => (id, 0),
                _ => next,
            },
        };
        Ok((next_offset, skip_below))
    }

    /// The first offset of the next chunk this reader yields.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The next chunk (for a consumer's reader: the next committed user chunk), or `None`
    /// when the reader has reached the end (call again once more is written or committed).
    pub fn next_chunk(&mut self) -> Result<Option<ChunkSlice>> {
        let mut retried = false;
        loop {
            let end = if self.replication {
                self.shared.written_end.load(Ordering::Acquire)
            } else {
                self.shared.visible_end()
            };
            let (first, summary) = {
                let segments = self.shared.segments.read().expect("segments lock");
                let first = segments[0].first_offset;
                let at = segments.partition_point(|s| s.first_offset <= self.next_offset);
                (first, segments[at.max(1) - 1])
            };
            if self.next_offset < first {
                // Retention took the chunks this reader was to read.
                self.next_offset = first;
                self.skip_below = 0;
                self.open = None;
            }
            if self.next_offset >= end {
                return Ok(None);
            }
            let same = self
                .open
                .as_ref()
                .is_some_and(|o| o.summary.first_offset == summary.first_offset);
            if same {
                self.open.as_mut().expect("open").summary = summary;
            } else {
                match self.open_segment(summary) {
                    Ok(open) => self.open = Some(open),
                    // Retention deleted the segment meanwhile: look again, once.
                    Err(Error::Io(e)) if e.kind() == io::ErrorKind::NotFound && !retried => {
                        retried = true;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let open = self.open.as_mut().expect("open");
            if open.cursor >= open.summary.chunks {
                return Err(Error::Corrupt(format!(
                    "stream {}: offset {} is past the index of segment {}",
                    self.shared.dir.display(),
                    self.next_offset,
                    open.summary.first_offset
                )));
            }
            let record = read_record(&open.index, open.cursor)?;
            if record.chunk_id != self.next_offset {
                return Err(Error::Corrupt(format!(
                    "stream {}: index record {} of segment {} is chunk {}, expected {}",
                    self.shared.dir.display(),
                    open.cursor,
                    open.summary.first_offset,
                    record.chunk_id,
                    self.next_offset
                )));
            }
            if record.next_offset() > end {
                return Ok(None);
            }
            open.cursor += 1;
            self.next_offset = record.next_offset();
            if self.replication || record.chunk_type == ChunkType::User {
                return Ok(Some(ChunkSlice {
                    file: open.segment.clone(),
                    record,
                }));
            }
            // Tracking and Raft's own chunks take offsets but are not for consumers.
        }
    }

    /// The next committed chunk, read and checked, with the records before this reader's
    /// start marked to skip (see [`ReadChunk::entries`]).
    pub fn next_read(&mut self) -> Result<Option<ReadChunk>> {
        let skip_below = self.skip_below;
        let Some(slice) = self.next_chunk()? else {
            return Ok(None);
        };
        Ok(Some(ReadChunk {
            bytes: slice.read()?,
            skip_below,
        }))
    }

    fn open_segment(&self, summary: SegmentSummary) -> Result<OpenSegment> {
        let dir = &self.shared.dir;
        let index = File::open(index::index_path(dir, summary.first_offset))?;
        let segment = Arc::new(File::open(index::segment_path(dir, summary.first_offset))?);
        let cursor = search(&index, summary.chunks, |r| r.chunk_id <= self.next_offset)?;
        Ok(OpenSegment {
            summary,
            segment,
            index,
            cursor: cursor.saturating_sub(1),
        })
    }
}

pub(crate) fn read_record(index: &File, k: u64) -> Result<IndexRecord> {
    let mut b = [0u8; INDEX_RECORD_BYTES as usize];
    index.read_exact_at(&mut b, index::record_position(k))?;
    IndexRecord::decode(&b)
        .ok_or_else(|| Error::Corrupt(format!("stream index record {k} is damaged")))
}

/// The number of leading records of an index of `count` for which `below` holds (`below`
/// must hold for a prefix): a binary search reading log2(count) records.
fn search(index: &File, count: u64, below: impl Fn(&IndexRecord) -> bool) -> Result<u64> {
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(&read_record(index, mid)?) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// The first offset of the chunk holding `offset`, which must be within the stream.
fn chunk_holding(dir: &std::path::Path, segments: &[SegmentSummary], offset: u64) -> Result<u64> {
    let at = segments.partition_point(|s| s.first_offset <= offset);
    let s = &segments[at.max(1) - 1];
    if s.chunks == 0 || offset >= s.next_offset {
        return Err(Error::Corrupt(format!(
            "stream {}: offset {offset} is in no segment",
            dir.display()
        )));
    }
    let index = File::open(index::index_path(dir, s.first_offset))?;
    match search(&index, s.chunks, |r| r.chunk_id <= offset)? {
        0 => Err(Error::Corrupt(format!(
            "stream {}: the index of segment {} starts past offset {offset}",
            dir.display(),
            s.first_offset
        ))),
        k => Ok(read_record(&index, k - 1)?.chunk_id),
    }
}

/// The first offset of the last user chunk wholly below `end`, if any: the index is walked
/// back from `end`, past tracking and Raft chunks (a run of them is short: they come between
/// user chunks), for at most [`LAST_USER_CHUNK_SCAN_MAX`] records.
fn last_user_chunk(
    dir: &std::path::Path,
    segments: &[SegmentSummary],
    end: u64,
) -> Result<Option<u64>> {
    let mut scanned = 0;
    for s in segments
        .iter()
        .rev()
        .filter(|s| s.chunks > 0 && s.first_offset < end)
    {
        let index = File::open(index::index_path(dir, s.first_offset))?;
        let below = search(&index, s.chunks, |r| r.next_offset() <= end)?;
        for k in (0..below).rev() {
            scanned += 1;
            if scanned > LAST_USER_CHUNK_SCAN_MAX {
                return Ok(None);
            }
            let record = read_record(&index, k)?;
            if record.chunk_type == ChunkType::User {
                return Ok(Some(record.chunk_id));
            }
        }
    }
    Ok(None)
}

/// The first chunk stamped at or after `timestamp_ms`, if any (timestamps never go back in a
/// stream: the writer raises a late one).
fn chunk_at_or_after(
    dir: &std::path::Path,
    segments: &[SegmentSummary],
    timestamp_ms: i64,
) -> Result<Option<u64>> {
    let Some(s) = segments
        .iter()
        .find(|s| s.chunks > 0 && s.last_timestamp_ms >= timestamp_ms)
    else {
        return Ok(None);
    };
    let index = File::open(index::index_path(dir, s.first_offset))?;
    let k = search(&index, s.chunks, |r| r.timestamp_ms < timestamp_ms)?;
    Ok(Some(read_record(&index, k.min(s.chunks - 1))?.chunk_id))
}
