//! The writer of one stream: appends chunks to the active segment and its index, rolls
//! segments at the size limit, syncs when told, applies retention by whole segments, and
//! publishes what readers may see (the segment summaries, the written and committed ends).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::chunk::{self, ChunkHeader, ChunkMeta, ChunkType, Entry};
use super::index::{self, IndexRecord};
use super::reader::{read_record, ChunkSlice, OffsetSpec, Reader};
use super::recovery::{self, Recovered};
use super::{Retention, StreamConfig};
use crate::{Error, Result};

/// What the writer knows of one segment, kept in memory for every segment (about 60 bytes
/// each, so a 100 GB stream of 500 MB segments holds 200 of them): enough to pick the segment
/// of an offset or a timestamp and to apply retention without opening a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSummary {
    /// The first chunk id (the files' name); for an empty segment, the offset its first
    /// chunk will have.
    pub first_offset: u64,
    /// The chunk sequence number of the first chunk (or of the next one, while empty).
    pub first_seq: u64,
    /// One past the last record of the segment.
    pub next_offset: u64,
    /// Timestamp of the first chunk (0 while empty).
    pub first_timestamp_ms: i64,
    /// Timestamp of the last chunk (0 while empty).
    pub last_timestamp_ms: i64,
    /// Chunks (index records) in the segment.
    pub chunks: u64,
    /// Bytes of the segment file, header included.
    pub bytes: u64,
}

impl SegmentSummary {
    pub(crate) fn empty(first_offset: u64, first_seq: u64) -> SegmentSummary {
        SegmentSummary {
            first_offset,
            first_seq,
            next_offset: first_offset,
            first_timestamp_ms: 0,
            last_timestamp_ms: 0,
            chunks: 0,
            bytes: index::SEGMENT_HEADER_BYTES,
        }
    }

    pub(crate) fn add(&mut self, record: &IndexRecord) {
        if self.chunks == 0 {
            self.first_timestamp_ms = record.timestamp_ms;
        }
        self.last_timestamp_ms = record.timestamp_ms;
        self.next_offset = record.next_offset();
        self.chunks += 1;
        self.bytes = record.end_position();
    }

    /// One past the last chunk's sequence number.
    pub fn next_seq(&self) -> u64 {
        self.first_seq + self.chunks
    }
}

/// What readers share with the writer.
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    /// Every segment, oldest first; never empty (the active segment is last).
    pub(crate) segments: RwLock<Vec<SegmentSummary>>,
    /// One past the last written record: published after the chunk and its index record are
    /// in their files, so a reader that sees it finds both.
    pub(crate) written_end: AtomicU64,
    /// Records below it are committed (replication decides; the writer is told).
    pub(crate) commit_end: AtomicU64,
}

impl Shared {
    /// Records below it may be read.
    pub(crate) fn visible_end(&self) -> u64 {
        self.commit_end
            .load(Ordering::Acquire)
            .min(self.written_end.load(Ordering::Acquire))
    }
}

/// A handle on a stream for readers and observers, cheap to clone and to send to other
/// threads; the writer ([`StreamLog`]) stays with its owner.
#[derive(Clone)]
pub struct StreamHandle {
    pub(crate) shared: Arc<Shared>,
}

/// A stream's figures at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overview {
    /// The first offset still held (retention moves it).
    pub first_offset: u64,
    /// One past the last written record: the offset of the next one.
    pub next_offset: u64,
    /// Records below it are committed.
    pub commit_end: u64,
    /// The chunk sequence number of the first chunk held.
    pub first_seq: u64,
    /// The chunk sequence number the next chunk gets.
    pub next_seq: u64,
    /// Segments on disk.
    pub segments: usize,
    /// Chunks on disk.
    pub chunks: u64,
    /// Bytes of the segment files.
    pub bytes: u64,
    /// Timestamp of the first chunk held (0 when none).
    pub first_timestamp_ms: i64,
    /// Timestamp of the last chunk (0 when none).
    pub last_timestamp_ms: i64,
}

impl StreamHandle {
    /// A consumer's reader positioned by `spec` (see [`OffsetSpec`]): user chunks only, up
    /// to the committed offset.
    pub fn reader(&self, spec: OffsetSpec) -> Result<Reader> {
        Reader::new(self.shared.clone(), spec)
    }

    /// A replication reader from chunk sequence number `seq`: every chunk, whatever its type,
    /// up to what is written (committed or not). A truncation ([`StreamLog::truncate_from_seq`])
    /// past its position invalidates it: drop it when the node stops leading.
    pub fn replication_reader(&self, seq: u64) -> Result<Reader> {
        Reader::from_seq(self.shared.clone(), seq)
    }

    /// The chunk with sequence number `seq` (the n-th chunk of the stream, from 0), found with
    /// one seek in its segment's index; `None` when retention deleted it or it is not written.
    /// Its index record says its offsets, epoch (a Raft term) and type without reading it.
    pub fn chunk_by_seq(&self, seq: u64) -> Result<Option<ChunkSlice>> {
        let summary = {
            let segments = self.shared.segments.read().expect("segments lock");
            let at = segments.partition_point(|s| s.first_seq <= seq);
            match at.checked_sub(1).map(|i| segments[i]) {
                Some(s) if seq < s.next_seq() => s,
                _ => return Ok(None),
            }
        };
        let dir = &self.shared.dir;
        let opened = File::open(index::index_path(dir, summary.first_offset)).and_then(|idx| {
            let seg = File::open(index::segment_path(dir, summary.first_offset))?;
            Ok((idx, seg))
        });
        let (idx, seg) = match opened {
            Ok(files) => files,
            // Retention deleted the segment meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let record = read_record(&idx, seq - summary.first_seq)?;
        Ok(Some(ChunkSlice {
            file: Arc::new(seg),
            record,
        }))
    }

    /// The stream's figures now.
    pub fn overview(&self) -> Overview {
        let segments = self.shared.segments.read().expect("segments lock");
        let first = segments.first().expect("at least one segment");
        let with_chunks = segments.iter().find(|s| s.chunks > 0);
        Overview {
            first_offset: first.first_offset,
            next_offset: self.shared.written_end.load(Ordering::Acquire),
            commit_end: self.shared.commit_end.load(Ordering::Acquire),
            first_seq: first.first_seq,
            next_seq: segments.last().expect("at least one segment").next_seq(),
            segments: segments.len(),
            chunks: segments.iter().map(|s| s.chunks).sum(),
            bytes: segments.iter().map(|s| s.bytes).sum(),
            first_timestamp_ms: with_chunks.map_or(0, |s| s.first_timestamp_ms),
            last_timestamp_ms: segments
                .iter()
                .rev()
                .find(|s| s.chunks > 0)
                .map_or(0, |s| s.last_timestamp_ms),
        }
    }

    /// Every segment's summary, oldest first.
    pub fn segments(&self) -> Vec<SegmentSummary> {
        self.shared.segments.read().expect("segments lock").clone()
    }

    /// Records below `end` are committed: readers may now see them (never past what is
    /// written). Never goes back.
    pub fn set_commit_end(&self, end: u64) {
        self.shared.commit_end.fetch_max(end, Ordering::AcqRel);
    }
}

/// What a write or retention did, for the caller's counters and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Segments deleted.
    pub segments_deleted: usize,
    /// Bytes of the segment files deleted.
    pub bytes_deleted: u64,
    /// The stream's first offset afterwards.
    pub first_offset: u64,
}

/// How a user chunk is stamped; the entries come apart.
#[derive(Clone, Copy, Debug)]
pub struct AppendMeta<'a> {
    /// What the chunk holds.
    pub chunk_type: ChunkType,
    /// The caller's clock, in ms since the Unix epoch (the log reads no clock). A value below
    /// the last chunk's is raised to it, so timestamps never go back in a stream and a search
    /// by timestamp is a binary search.
    pub timestamp_ms: i64,
    /// The writer's epoch: at least the last chunk's.
    pub epoch: u64,
    /// Filter bytes (3.13's Bloom filter), empty for none.
    pub filter: &'a [u8],
    /// Trailer bytes (tracking), empty for none.
    pub trailer: &'a [u8],
}

/// The writer of one stream, in its own directory. One owner appends; readers come from
/// [`StreamLog::handle`].
pub struct StreamLog {
    _lock: File,
    config: StreamConfig,
    shared: Arc<Shared>,
    segment: File,
    index: File,
    /// Where the next chunk goes in the active segment.
    segment_bytes: u64,
    /// Index records in the active segment.
    index_records: u64,
    /// The offset of the next record.
    next_offset: u64,
    /// The sequence number of the next chunk.
    next_seq: u64,
    last_epoch: u64,
    last_timestamp_ms: i64,
    /// Files written since the last sync.
    unsynced: bool,
    /// A file was created or deleted since the last sync: the directory needs one too.
    dir_unsynced: bool,
    /// Set by a failed fsync: the page cache may have dropped data that never reached the disk,
    /// so no later write or sync may claim durability. Reopen to recover what is durable.
    poisoned: Option<String>,
    buf: Vec<u8>,
}

impl StreamLog {
    /// Opens (creating it if needed) the stream in `dir`, which no other [`StreamLog`] may
    /// hold open ([`Error::AlreadyOpen`]), and recovers it: a torn tail of the
    /// last segment (a partial chunk, a bad CRC, an index record without its chunk) is cut,
    /// every complete chunk before it kept. Nothing is committed after a restart until the
    /// caller says so ([`StreamHandle::set_commit_end`]).
    pub fn open(dir: impl AsRef<Path>, config: StreamConfig) -> Result<(StreamLog, Recovered)> {
        let dir = dir.as_ref().to_path_buf();
        let opened = recovery::open(&dir)?;
        let last = *opened.segments.last().expect("recovery yields a segment");
        let shared = Arc::new(Shared {
            dir,
            segments: RwLock::new(opened.segments),
            written_end: AtomicU64::new(last.next_offset),
            commit_end: AtomicU64::new(0),
        });
        let log = StreamLog {
            _lock: opened.lock,
            config,
            shared,
            segment: opened.segment,
            index: opened.index,
            segment_bytes: last.bytes,
            index_records: last.chunks,
            next_offset: last.next_offset,
            next_seq: last.next_seq(),
            last_epoch: opened.last_epoch,
            last_timestamp_ms: opened.last_timestamp_ms,
            unsynced: false,
            dir_unsynced: false,
            poisoned: None,
            buf: Vec::new(),
        };
        Ok((log, opened.report))
    }

    /// Changes the size at which segments are cut from the next chunk on (a policy's
    /// `stream-max-segment-size-bytes`); the segments written keep their size.
    pub fn set_segment_bytes_max(&mut self, segment_bytes_max: u64) {
        self.config.segment_bytes_max = segment_bytes_max;
    }

    /// A handle for readers and observers.
    pub fn handle(&self) -> StreamHandle {
        StreamHandle {
            shared: self.shared.clone(),
        }
    }

    /// A reader positioned by `spec`.
    pub fn reader(&self, spec: OffsetSpec) -> Result<Reader> {
        Reader::new(self.shared.clone(), spec)
    }

    /// The offset the next record gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The chunk sequence number the next chunk gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The epoch of the last chunk written (0 for an empty stream).
    pub fn last_epoch(&self) -> u64 {
        self.last_epoch
    }

    /// Records below `end` are committed (see [`StreamHandle::set_commit_end`]).
    pub fn set_commit_end(&self, end: u64) {
        self.shared.commit_end.fetch_max(end, Ordering::AcqRel);
    }

    /// Writes one chunk of `entries` at the stream's next offset and returns its header.
    /// Returns once the chunk is in the file (the page cache), not on the disk: see
    /// [`StreamLog::sync`].
    pub fn append(&mut self, meta: &AppendMeta<'_>, entries: &[Entry<'_>]) -> Result<ChunkHeader> {
        self.check_writable()?;
        if meta.epoch < self.last_epoch {
            return Err(self.out_of_order(self.next_offset, meta.epoch));
        }
        let chunk_meta = ChunkMeta {
            chunk_type: meta.chunk_type,
            timestamp_ms: meta.timestamp_ms.max(self.last_timestamp_ms),
            epoch: meta.epoch,
            chunk_id: self.next_offset,
            filter: meta.filter,
            trailer: meta.trailer,
        };
        chunk::check(&chunk_meta, entries).map_err(Error::InvalidChunk)?;
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let header = chunk::encode(&mut buf, &chunk_meta, entries);
        let written = self.write_chunk(&buf, &header);
        if buf.capacity() <= super::WRITE_BUFFER_KEPT_BYTES_MAX {
            self.buf = buf;
        }
        written.map(|()| header)
    }

    /// Writes a chunk received whole (a replica's copy of its leader's chunk), byte for byte,
    /// after checking it completely: it must be exactly one valid chunk, at the stream's next
    /// offset, of an epoch no older than the last chunk's.
    pub fn append_chunk(&mut self, bytes: &[u8]) -> Result<ChunkHeader> {
        self.check_writable()?;
        let chunk = chunk::Chunk::parse(bytes).map_err(Error::InvalidChunk)?;
        if chunk.bytes_len() != bytes.len() {
            return Err(Error::InvalidChunk(chunk::ChunkError::BadEntries));
        }
        let header = chunk.header;
        if header.chunk_id != self.next_offset || header.epoch < self.last_epoch {
            return Err(self.out_of_order(header.chunk_id, header.epoch));
        }
        self.write_chunk(bytes, &header)?;
        Ok(header)
    }

    fn out_of_order(&self, offset: u64, epoch: u64) -> Error {
        Error::ChunkOutOfOrder {
            expected_offset: self.next_offset,
            offset,
            last_epoch: self.last_epoch,
            epoch,
        }
    }

    fn check_writable(&self) -> Result<()> {
        match &self.poisoned {
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    fn write_chunk(&mut self, bytes: &[u8], header: &ChunkHeader) -> Result<()> {
        debug_assert_eq!(bytes.len() as u64, header.chunk_bytes());
        let active_full = self.index_records > 0
            && (self.segment_bytes + bytes.len() as u64 > self.config.segment_bytes()
                || self.index_records >= u64::from(self.config.segment_chunks()));
        if active_full {
            self.roll()?;
        }
        let position = self.segment_bytes;
        let record = IndexRecord::of(header, position as u32);
        if let Err(e) = self.segment.write_all_at(bytes, position) {
            // A partial chunk past the end is cut now rather than left for recovery.
            let _ = self.segment.set_len(position);
            return Err(write_error(e));
        }
        let index_at = index::record_position(self.index_records);
        if let Err(e) = self.index.write_all_at(&record.encode(), index_at) {
            // A chunk without its index record would come back at recovery although the
            // caller was told it failed: take it away (a failure here leaves a tail that
            // recovery cuts unless it is whole).
            let _ = self.segment.set_len(position);
            return Err(write_error(e));
        }
        self.segment_bytes = record.end_position();
        self.index_records += 1;
        self.next_offset = record.next_offset();
        self.next_seq += 1;
        self.last_epoch = header.epoch;
        self.last_timestamp_ms = header.timestamp_ms;
        self.unsynced = true;
        self.shared
            .segments
            .write()
            .expect("segments lock")
            .last_mut()
            .expect("active segment")
            .add(&record);
        self.shared
            .written_end
            .store(self.next_offset, Ordering::Release);
        Ok(())
    }

    /// Ends the active segment (synced, so that only the last segment can ever hold a torn
    /// tail and recovery reads only it) and starts a new one at the next offset, its headers
    /// synced before any chunk goes in (so the chunk sequence number its index header holds
    /// is never lost).
    fn roll(&mut self) -> Result<()> {
        self.sync_files()?;
        // The index too: recovery trusts a closed segment's index without reading its chunks.
        if let Err(e) = self.index.sync_data() {
            return Err(self.poison(e));
        }
        let dir = &self.shared.dir;
        let (segment, index) =
            create_segment(dir, self.next_offset, self.next_seq).map_err(write_error)?;
        if let Err(e) = segment
            .sync_data()
            .and_then(|()| index.sync_data())
            .and_then(|()| File::open(dir)?.sync_all())
        {
            return Err(self.poison(e));
        }
        self.segment = segment;
        self.index = index;
        self.segment_bytes = index::SEGMENT_HEADER_BYTES;
        self.index_records = 0;
        self.shared
            .segments
            .write()
            .expect("segments lock")
            .push(SegmentSummary::empty(self.next_offset, self.next_seq));
        Ok(())
    }

    fn poison(&mut self, e: io::Error) -> Error {
        let why = format!("fdatasync of stream {}: {e}", self.shared.dir.display());
        self.poisoned = Some(why.clone());
        Error::Poisoned(why)
    }

    /// Removes every chunk from sequence number `seq` on (a Raft follower's conflicting
    /// suffix), durably before it returns, so that the chunks written in their place never
    /// sit before stale ones on disk. Only what is not committed can go: a `seq` whose chunk
    /// is below the committed offset, or below the first chunk kept, is refused.
    pub fn truncate_from_seq(&mut self, seq: u64) -> Result<()> {
        self.check_writable()?;
        if seq >= self.next_seq {
            return Ok(());
        }
        let handle = self.handle();
        let commit_end = self.shared.commit_end.load(Ordering::Acquire);
        let refused = Error::TruncateRefused {
            seq,
            first_seq: handle.overview().first_seq,
            commit_end,
        };
        let cut = match handle.chunk_by_seq(seq)? {
            Some(slice) if slice.record.chunk_id >= commit_end => slice.record,
            _ => return Err(refused),
        };
        let dir = self.shared.dir.clone();
        // Whole segments after the one holding `seq` go, newest first, so that a crash
        // midway leaves a stream that recovery takes as it is.
        let (doomed, keep) = {
            let segments = self.shared.segments.read().expect("segments lock");
            let at = segments.partition_point(|s| s.first_seq <= seq) - 1;
            (segments[at + 1..].to_vec(), segments[at])
        };
        // Readers see the shorter stream before the files change.
        self.shared
            .written_end
            .store(cut.chunk_id, Ordering::Release);
        for s in doomed.iter().rev() {
            remove_if_present(&index::segment_path(&dir, s.first_offset))?;
            remove_if_present(&index::index_path(&dir, s.first_offset))?;
        }
        let k = seq - keep.first_seq;
        let segment = open_rw(&index::segment_path(&dir, keep.first_offset))?;
        let idx = open_rw(&index::index_path(&dir, keep.first_offset))?;
        segment.set_len(u64::from(cut.position))?;
        idx.set_len(index::record_position(k))?;
        if let Err(e) = segment
            .sync_data()
            .and_then(|()| idx.sync_data())
            .and_then(|()| File::open(&dir)?.sync_all())
        {
            return Err(self.poison(e));
        }
        // What is left: the summary of the kept segment, and the last chunk's epoch and
        // timestamp (from the record before the cut, wherever it is).
        let mut summary = SegmentSummary::empty(keep.first_offset, keep.first_seq);
        if k > 0 {
            let first = read_record(&idx, 0)?;
            let last = read_record(&idx, k - 1)?;
            summary.first_timestamp_ms = first.timestamp_ms;
            summary.last_timestamp_ms = last.timestamp_ms;
            summary.next_offset = last.next_offset();
            summary.chunks = k;
            summary.bytes = last.end_position();
        }
        let before = match seq.checked_sub(1) {
            Some(prev) => handle.chunk_by_seq(prev)?.map(|s| s.record),
            None => None,
        };
        {
            let mut segments = self.shared.segments.write().expect("segments lock");
            let at = segments.len() - doomed.len() - 1;
            segments.truncate(at + 1);
            segments[at] = summary;
        }
        self.segment = segment;
        self.index = idx;
        self.segment_bytes = u64::from(cut.position);
        self.index_records = k;
        self.next_offset = cut.chunk_id;
        self.next_seq = seq;
        self.last_epoch = before.map_or(0, |r| r.epoch);
        self.last_timestamp_ms = before.map_or(0, |r| r.timestamp_ms);
        self.unsynced = false;
        Ok(())
    }

    /// Makes every chunk written so far durable: fdatasync of the active segment (and of the
    /// directory when files came or went). Not of its index: recovery rebuilds the index
    /// records of whole chunks from the segment, so one fdatasync per sync is enough; a
    /// segment's index is synced when the segment is closed. Separate from
    /// [`StreamLog::append`] so that the caller chooses: sync before each confirm, or batch the
    /// syncs of many streams.
    pub fn sync(&mut self) -> Result<()> {
        self.check_writable()?;
        self.sync_files()
    }

    fn sync_files(&mut self) -> Result<()> {
        if self.unsynced {
            if let Err(e) = self.segment.sync_data() {
                return Err(self.poison(e));
            }
            self.unsynced = false;
        }
        if self.dir_unsynced {
            File::open(&self.shared.dir)?.sync_all()?;
            self.dir_unsynced = false;
        }
        Ok(())
    }

    /// Empties the stream and starts it again at chunk `first_seq`, offset `first_offset`, both
    /// at or past its end: a replica whose group's other members deleted (by retention) the
    /// chunks it lacks takes the next ones from there, as a snapshot install would. The old
    /// segments go first (index before segment, as retention does), then the new one's headers
    /// are synced: a crash in between leaves an empty stream, which the replica refills.
    /// Readers in the deleted segments move to the new start, as after retention.
    pub fn restart_at(&mut self, first_offset: u64, first_seq: u64) -> Result<()> {
        self.check_writable()?;
        if first_seq < self.next_seq || first_offset < self.next_offset {
            return Err(self.out_of_order(first_offset, self.last_epoch));
        }
        let old: Vec<SegmentSummary> = self.shared.segments.read().expect("segments lock").clone();
        for s in &old {
            remove_if_present(&index::index_path(&self.shared.dir, s.first_offset))?;
            remove_if_present(&index::segment_path(&self.shared.dir, s.first_offset))?;
        }
        let dir = &self.shared.dir;
        let (segment, index) = create_segment(dir, first_offset, first_seq).map_err(write_error)?;
        if let Err(e) = segment
            .sync_data()
            .and_then(|()| index.sync_data())
            .and_then(|()| File::open(dir)?.sync_all())
        {
            return Err(self.poison(e));
        }
        self.segment = segment;
        self.index = index;
        self.segment_bytes = index::SEGMENT_HEADER_BYTES;
        self.index_records = 0;
        self.next_offset = first_offset;
        self.next_seq = first_seq;
        self.unsynced = false;
        self.dir_unsynced = false;
        *self.shared.segments.write().expect("segments lock") =
            vec![SegmentSummary::empty(first_offset, first_seq)];
        self.shared
            .written_end
            .store(first_offset, Ordering::Release);
        self.shared
            .commit_end
            .fetch_max(first_offset, Ordering::AcqRel);
        Ok(())
    }

    /// Deletes the oldest segments that `retention` no longer wants, by whole segments and
    /// never the active one: a segment goes when the segments after it hold more than
    /// `max_bytes` together with it, or when its last chunk is older than `max_age_ms` before
    /// `now_ms` (the caller's clock). Readers in a deleted segment move to the first chunk left.
    pub fn apply_retention(
        &mut self,
        retention: &Retention,
        now_ms: i64,
    ) -> Result<RetentionOutcome> {
        let (deleted, first_offset) = {
            let mut segments = self.shared.segments.write().expect("segments lock");
            let mut total: u64 = segments.iter().map(|s| s.bytes).sum();
            let mut n = 0;
            while n + 1 < segments.len() {
                let s = &segments[n];
                let over_bytes = retention.max_bytes.is_some_and(|max| total > max);
                let too_old = retention.max_age_ms.is_some_and(|age| {
                    s.last_timestamp_ms < now_ms.saturating_sub(age.min(i64::MAX as u64) as i64)
                });
                if !(over_bytes || too_old) {
                    break;
                }
                total -= s.bytes;
                n += 1;
            }
            let deleted: Vec<SegmentSummary> = segments.drain(..n).collect();
            (deleted, segments[0].first_offset)
        };
        let mut outcome = RetentionOutcome {
            first_offset,
            ..RetentionOutcome::default()
        };
        for s in &deleted {
            // The index first: recovery takes a segment file without its index at the head of
            // the stream for what a crash left of this deletion, and finishes it.
            remove_if_present(&index::index_path(&self.shared.dir, s.first_offset))?;
            remove_if_present(&index::segment_path(&self.shared.dir, s.first_offset))?;
            outcome.segments_deleted += 1;
            outcome.bytes_deleted += s.bytes;
            self.dir_unsynced = true;
        }
        Ok(outcome)
    }
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// The answer to a failed write: a full disk is its own case (the caller blocks publishers
/// until space returns); nothing was published, so the stream is unchanged.
fn write_error(e: io::Error) -> Error {
    if e.raw_os_error() == Some(28) {
        Error::DiskFull
    } else {
        Error::Io(e)
    }
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Creates the files of a new, empty segment (headers only, not synced).
pub(crate) fn create_segment(dir: &Path, first: u64, first_seq: u64) -> io::Result<(File, File)> {
    let create = |path: PathBuf, header: &[u8]| -> io::Result<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.write_all_at(header, 0)?;
        Ok(f)
    };
    let index = create(
        index::index_path(dir, first),
        &index::index_header(first_seq),
    )?;
    let segment = create(index::segment_path(dir, first), &index::segment_header())?;
    Ok((segment, index))
}
