//! The segment writer: settles rolled WAL files (copies what outlives them into per-log segment
//! files, or adopts a mostly-live file in place), deletes segments and adopted files nobody
//! needs, compacts mostly-dead ones, and writes the checkpoint.
//!
//! One thread, one job at a time:
//! 1. **Settle** a rolled WAL file. When its live append records make up at least
//!    [`ADOPT_LIVE_PERCENT_MIN`] percent of it (a backlog), **adopt** it: write an index sidecar
//!    of its live entries (see `adopted`), fsync it, and keep the file as a data file; entries
//!    keep pointing into it, so each payload byte is written once. Otherwise **flush** it: for
//!    each log that appended to it, copy the entries of that file that are still live (not
//!    released, not truncated) into the log's open segment, as the very same record bytes
//!    (checksum verified after reading them back from the WAL), then one fdatasync per segment
//!    file, or one syncfs when many logs took part (see [`PendingSync`]). Entries released
//!    before this point are never written again.
//! 2. **Collect**: adopted files with no live entry die; those below
//!    [`ADOPTED_COMPACT_LIVE_PERCENT_MAX`] percent live whose count stopped changing have their
//!    live entries copied into segments and die. Segments with no live entries are forgotten;
//!    full segments with fewer than [`COMPACT_LIVE_PERCENT_MAX`] percent live entries are
//!    rewritten into a new segment.
//! 3. **Checkpoint** the state (see `checkpoint`), and only then delete the dead WAL files
//!    (flushed or dead adopted ones, with their sidecars) and the dead segment files.
//!
//! When the WAL is idle, a collection pass also runs every [`GC_INTERVAL_MS`] if anything was
//! released, so acknowledged backlogs free their disk space without waiting for a rollover.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::adopted::{self, AdoptedFile, SidecarWriter};
use crate::checkpoint::{self, sync_dir, LogCheckpoint};
use crate::config::{
    ADOPTED_COMPACT_LIVE_PERCENT_MAX, ADOPTED_COMPACT_PER_PASS_MAX, ADOPTED_QUIET_MS,
    COMPACT_LIVE_PERCENT_MAX, COMPACT_SEGMENTS_PER_PASS_MAX, DISK_FULL_RETRY_MS, GC_INTERVAL_MS,
    SEGMENT_DATA_BYTES_MAX, SEGMENT_ENTRIES_MAX,
};
use crate::fault::{is_disk_full, CrashPoint};
use crate::id_hash::IdMap;
use crate::log::{Loc, SegmentMeta};
use crate::record::{decode, Decoded, RecordKind, RECORD_HEADER_BYTES};
use crate::segment::{self, IndexEntry, DATA_START};
use crate::store::Shared;
use crate::wal::WAL_HEADER_BYTES;
use crate::{Error, Result};

/// Bytes of records gathered in memory before they are written to a segment file.
const SEGMENT_WRITE_BYTES_MAX: usize = 8 << 20;
/// Logs whose checkpoint is built under one acquisition of the lock.
const CHECKPOINT_LOGS_PER_LOCK: usize = 256;
/// Slots looked at under one acquisition of the lock while gathering the entries of one log in
/// one file (a backlog of millions in one log must not hold appends back).
const GATHER_SLOTS_PER_LOCK: u64 = 65_536;

enum Job {
    Flush(u64),
    /// A collection pass; true when asked by [`crate::Store::compact`] (no waiting for quiet).
    Collect(bool),
}

/// The segment writer thread. A panic in it (a bug) poisons the engine rather than leaving
/// rolled WAL files unflushed forever.
pub(crate) fn run(shared: Arc<Shared>) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_jobs(&shared)));
    if result.is_err() {
        shared.poison("segment writer panicked".into());
    }
}

fn run_jobs(shared: &Arc<Shared>) {
    let interval = Duration::from_millis(GC_INTERVAL_MS);
    let mut last_collect = Instant::now();
    loop {
        let job = {
            let mut st = shared.lock();
            loop {
                if st.shutdown || st.poisoned.is_some() {
                    st.segment_writer_busy = false;
                    drop(st);
                    shared.idle_cv.notify_all();
                    return;
                }
                if let Some(&seq) = st.flush_queue.front() {
                    st.segment_writer_busy = true;
                    break Job::Flush(seq);
                }
                if st.gc_forced || (st.gc_requested && last_collect.elapsed() >= interval) {
                    let forced = st.gc_forced;
                    st.gc_forced = false;
                    st.gc_requested = false;
                    st.segment_writer_busy = true;
                    break Job::Collect(forced);
                }
                st = shared
                    .segment_writer_cv
                    .wait_timeout(st, interval)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let result = match job {
            Job::Flush(seq) => settle(shared, seq).and_then(|()| collect(shared, false)),
            Job::Collect(forced) => collect(shared, forced),
        };
        last_collect = Instant::now();
        let retry = match result {
            Ok(()) => {
                if let Job::Flush(seq) = job {
                    let mut st = shared.lock();
                    if st.flush_queue.front() == Some(&seq) {
                        st.flush_queue.pop_front();
                    }
                }
                false
            }
            Err(Error::Io(e)) if is_disk_full(&e) => true,
            Err(e) => {
                shared.poison(format!("segment writer: {e}"));
                return;
            }
        };
        shared.lock().segment_writer_busy = false;
        shared.idle_cv.notify_all();
        if retry {
            std::thread::sleep(Duration::from_millis(DISK_FULL_RETRY_MS));
        }
    }
}

/// One entry to copy into a segment.
struct Item {
    index: u64,
    term: u64,
    /// Where it is now (packed [`Loc`]); the copy is adopted only if it is still there.
    old_loc: u64,
    /// Which of the source files holds it, and where.
    source: usize,
    offset: u64,
    len: u32,
}

/// Most segment files synced one by one after a flush; beyond this, one `syncfs` of the segment
/// directory's file system is cheaper.
const SYNC_FILES_MAX: usize = 8;

/// Segment files written by a flush or a compaction and not yet synced. A WAL file shared by
/// 10,000 logs touches 10,000 segment files: one fdatasync each (plus a directory fsync per
/// new file) took seconds per 256 MiB file, so the segment writer fell ever further behind
/// the WAL and recovery had gigabytes to replay. One syncfs makes them all durable at once;
/// nothing names the new data before the checkpoint, which is written only after this.
#[derive(Default)]
struct PendingSync {
    files: Vec<File>,
    whole_fs: bool,
    dir_changed: bool,
}

impl PendingSync {
    fn add(&mut self, file: File) {
        if self.whole_fs {
            return;
        }
        if self.files.len() < SYNC_FILES_MAX {
            self.files.push(file);
        } else {
            self.files.clear();
            self.whole_fs = true;
        }
    }

    fn finish(self, dir: &std::path::Path) -> Result<()> {
        if self.whole_fs {
            syncfs(dir)?;
        } else {
            for f in &self.files {
                f.sync_data()?;
            }
        }
        if self.dir_changed {
            sync_dir(dir)?;
        }
        Ok(())
    }
}

/// Flushes every dirty page and inode of the file system holding `dir` (syncfs(2), which
/// reports write-back errors since Linux 5.8).
fn syncfs(dir: &std::path::Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let d = File::open(dir)?;
    // SAFETY: syncfs only reads the descriptor, which `d` keeps open for the call.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

/// What a copy produced, to adopt under the lock.
#[derive(Default)]
struct Written {
    /// (index, old packed loc, new packed loc).
    placed: Vec<(u64, u64, u64)>,
    metas: Vec<(u32, SegmentMeta)>,
    created: Vec<u32>,
}

/// Copies `items` (ascending indexes) from `sources` into segments of `log_id`, appending to
/// `open` while it has room and its entries are all below the first item.
fn write_items(
    shared: &Shared,
    log_id: u64,
    generation: u64,
    sources: &[&File],
    items: &[Item],
    open: Option<(u32, SegmentMeta)>,
    sync: &mut PendingSync,
) -> Result<Option<Written>> {
    let mut out = Written::default();
    match copy_items(
        shared, log_id, generation, sources, items, open, &mut out, sync,
    ) {
        Ok(true) => Ok(Some(out)),
        Ok(false) => {
            discard(shared, log_id, &out.created);
            Ok(None)
        }
        // Files created by a failed copy (a full disk) are named nowhere: remove them now
        // rather than leaving them to the next recovery. Bytes appended to an existing segment
        // past its valid end are overwritten by the next attempt.
        Err(e) => {
            discard(shared, log_id, &out.created);
            Err(e)
        }
    }
}

/// The body of [`write_items`]; false when the log was deleted meanwhile.
#[allow(clippy::too_many_arguments)]
fn copy_items(
    shared: &Shared,
    log_id: u64,
    generation: u64,
    sources: &[&File],
    items: &[Item],
    mut open: Option<(u32, SegmentMeta)>,
    out: &mut Written,
    sync: &mut PendingSync,
) -> Result<bool> {
    let dir = &shared.config.segment_dir;
    let mut data: Vec<u8> = Vec::new();
    let mut index_buf: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let fits = |m: &SegmentMeta| {
            m.count < SEGMENT_ENTRIES_MAX
                && m.data_end - DATA_START < SEGMENT_DATA_BYTES_MAX
                && m.last_index < items[i].index
        };
        let (id, mut meta, file) = match open.take() {
            Some((id, meta)) if fits(&meta) => (id, meta, segment::open(dir, log_id, id)?),
            _ => {
                let id = {
                    let mut st = shared.lock();
                    match st.logs.get_mut(&log_id) {
                        Some(log) if log.generation == generation => {
                            let id = log.next_segment_id;
                            log.next_segment_id += 1;
                            id
                        }
                        _ => return Ok(false),
                    }
                };
                let file = segment::create(dir, log_id, id)?;
                out.created.push(id);
                let meta = SegmentMeta {
                    count: 0,
                    data_end: DATA_START,
                    last_index: 0,
                };
                (id, meta, file)
            }
        };
        let first_position = meta.count;
        let first_data = meta.data_end;
        data.clear();
        index_buf.clear();
        while i < items.len()
            && meta.count < SEGMENT_ENTRIES_MAX
            && meta.data_end - DATA_START < SEGMENT_DATA_BYTES_MAX
            && data.len() < SEGMENT_WRITE_BYTES_MAX
        {
            let item = &items[i];
            let start = data.len();
            let record_len = RECORD_HEADER_BYTES + item.len as usize;
            data.resize(start + record_len, 0);
            sources[item.source].read_exact_at(&mut data[start..], item.offset)?;
            let crc = match decode(&data[start..]) {
                Decoded::Record(h, _)
                    if h.kind == RecordKind::Append
                        && h.log_id == log_id
                        && h.index == item.index
                        && h.term == item.term =>
                {
                    h.crc
                }
                _ => {
                    return Err(Error::Corrupt(format!(
                        "log {log_id} entry {}: bad record at offset {} while copying to a segment",
                        item.index, item.offset
                    )))
                }
            };
            IndexEntry {
                index: item.index,
                term: item.term,
                offset: meta.data_end as u32,
                length: record_len as u32,
                crc,
            }
            .encode(&mut index_buf);
            out.placed.push((
                item.index,
                item.old_loc,
                Loc::Segment {
                    id,
                    offset: meta.data_end as u32,
                }
                .pack(),
            ));
            meta.data_end += record_len as u64;
            meta.count += 1;
            meta.last_index = item.index;
            i += 1;
        }
        file.write_all_at(&data, first_data)?;
        file.write_all_at(&index_buf, segment::index_entry_offset(first_position))?;
        sync.add(file);
        shared
            .counters
            .segment_bytes
            .fetch_add((data.len() + index_buf.len()) as u64, Ordering::Relaxed);
        if let Some(last) = out.metas.last_mut().filter(|m| m.0 == id) {
            last.1 = meta;
        } else {
            out.metas.push((id, meta));
        }
        // Keep filling the same segment if the write buffer, not the segment, was full.
        open = Some((id, meta));
    }
    if !out.created.is_empty() {
        sync.dir_changed = true;
    }
    Ok(true)
}

/// Deletes segment files this writer created for a log that has since been deleted.
fn discard(shared: &Shared, log_id: u64, created: &[u32]) {
    for id in created {
        let _ = std::fs::remove_file(segment::segment_path(
            &shared.config.segment_dir,
            log_id,
            *id,
        ));
    }
}

/// Points released entries of flushed WAL file `seq` nowhere (packed location 0, which sorts
/// with segment locations): their bytes die with the WAL file, and keeping a WAL location
/// behind entries already in segments would break the age order of locations along the log.
fn forget_released(log: &mut crate::log::LogState, seq: u64) {
    let range = log.wal_file_range(seq);
    for slot in log.slots.range_mut(range) {
        if slot.released() {
            slot.loc = 0;
        }
    }
}

/// Points the log's entries at their copies, if they are still where they were copied from.
fn repoint(
    shared: &Shared,
    log_id: u64,
    generation: u64,
    written: Written,
    replaced: &[u32],
    flushed_seq: Option<u64>,
) {
    let mut guard = shared.lock();
    let st = &mut *guard;
    let Some(log) = st
        .logs
        .get_mut(&log_id)
        .filter(|l| l.generation == generation)
    else {
        drop(guard);
        discard(shared, log_id, &written.created);
        return;
    };
    // Before repointing: the range is found by binary search over locations in age order.
    if let Some(seq) = flushed_seq {
        forget_released(log, seq);
    }
    for (index, old, new) in written.placed {
        if let Some(slot) = log.slot_mut(index) {
            if slot.loc == old {
                slot.loc = new;
            }
        }
    }
    for (id, meta) in written.metas {
        log.segments.insert(id, meta);
    }
    for old in replaced {
        log.segments.remove(old);
        st.dead_segments.push((log_id, *old));
    }
}

/// Settles rolled WAL file `seq`: adopts it in place when mostly live, else flushes it.
fn settle(shared: &Shared, seq: u64) -> Result<()> {
    let (logs, source) = {
        let st = shared.lock();
        // Already settled by an attempt whose collection pass then failed (a full disk).
        if seq <= st.wal_flushed_seq {
            return Ok(());
        }
        let mut logs: Vec<u64> = st
            .wal_touched
            .get(&seq)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        logs.sort_unstable();
        (logs, st.wal_files.get(&seq).cloned())
    };
    let Some(source) = source else {
        return Err(Error::Corrupt(format!(
            "WAL file {seq} to settle is not open"
        )));
    };
    let file_bytes = source.metadata()?.len();
    let mut live_bytes = 0u64;
    for chunk in logs.chunks(CHECKPOINT_LOGS_PER_LOCK) {
        let st = shared.lock();
        for log_id in chunk {
            if let Some(log) = st.logs.get(log_id) {
                for slot in log.slots.range(log.wal_file_range(seq)) {
                    if !slot.released() {
                        live_bytes += (RECORD_HEADER_BYTES as u64) + u64::from(slot.len);
                    }
                }
            }
        }
    }
    let records_bytes = file_bytes.saturating_sub(WAL_HEADER_BYTES);
    let percent_min = shared.config.adopt_live_percent_min;
    if live_bytes > 0 && percent_min <= 100 && live_bytes * 100 >= records_bytes * percent_min {
        adopt_file(shared, seq, &logs, file_bytes)
    } else {
        flush(shared, seq)
    }
}

/// Adopts rolled WAL file `seq` as a data file: writes the sidecar index of its live entries
/// and fsyncs it (the next checkpoint names the file); the entries keep pointing into it.
fn adopt_file(shared: &Shared, seq: u64, logs: &[u64], file_bytes: u64) -> Result<()> {
    let dir = &shared.config.wal_dir;
    let result = write_sidecar(shared, seq, logs).and_then(|done| {
        sync_dir(dir)?;
        Ok(done)
    });
    let (ranges, live_entries, live_bytes, sidecar_entries, sidecar_bytes) = match result {
        Ok(done) => done,
        Err(e) => {
            // Named nowhere yet: a retry (or recovery) starts over.
            let _ = adopted::remove(dir, seq);
            return Err(e);
        }
    };
    shared
        .counters
        .adopted_index_bytes
        .fetch_add(sidecar_bytes, Ordering::Relaxed);
    shared.config.faults.crash_point(CrashPoint::AfterSidecar)?;
    let mut st = shared.lock();
    st.adopted.insert(
        seq,
        AdoptedFile {
            file_bytes,
            sidecar_entries,
            live_bytes,
            live_entries,
            logs: ranges,
            changed_at: Instant::now(),
        },
    );
    st.wal_touched.remove(&seq);
    st.wal_flushed_seq = st.wal_flushed_seq.max(seq);
    drop(st);
    shared
        .counters
        .wal_files_adopted
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Where one log's entries in an adopted file are: (generation, lowest index, highest index).
type Ranges = IdMap<(u64, u64, u64)>;

/// Writes the sidecar of WAL file `seq` from the live entries of `logs` in it. Returns the
/// logs' ranges, the live entries and bytes, and the sidecar's entries and bytes.
fn write_sidecar(shared: &Shared, seq: u64, logs: &[u64]) -> Result<(Ranges, u64, u64, u64, u64)> {
    let mut writer = SidecarWriter::create(&shared.config.wal_dir, seq)?;
    let mut ranges = Ranges::default();
    let (mut live_entries, mut live_bytes) = (0u64, 0u64);
    let mut batch: Vec<(u64, u64, u32, u32)> = Vec::new();
    for log_id in logs {
        let (generation, lo, hi) = {
            let st = shared.lock();
            let Some(log) = st.logs.get(log_id) else {
                continue;
            };
            let range = log.wal_file_range(seq);
            if range.is_empty() {
                continue;
            }
            let first = log.first_index;
            (
                log.generation,
                first + range.start as u64,
                first + range.end as u64 - 1,
            )
        };
        // By index, a window per lock hold: releases of a prefix meanwhile shift positions.
        let mut span: Option<(u64, u64)> = None;
        let mut index = lo;
        while index <= hi {
            let end = (index + GATHER_SLOTS_PER_LOCK).min(hi + 1);
            batch.clear();
            {
                let st = shared.lock();
                let Some(log) = st.logs.get(log_id).filter(|l| l.generation == generation) else {
                    break;
                };
                for i in index..end {
                    let Some(slot) = log.slot(i) else {
                        continue;
                    };
                    if slot.released() {
                        continue;
                    }
                    if let Loc::Wal { seq: s, offset } = slot.loc() {
                        if s == seq {
                            let term = log.term_of(i).expect("in range");
                            batch.push((i, term, offset, slot.len));
                        }
                    }
                }
            }
            for (i, term, offset, len) in &batch {
                writer.push(*log_id, *i, *term, *offset, *len)?;
                live_entries += 1;
                live_bytes += (RECORD_HEADER_BYTES as u64) + u64::from(*len);
                span = Some(span.map_or((*i, *i), |(a, _)| (a, *i)));
            }
            index = end;
        }
        if let Some((a, b)) = span {
            ranges.insert(*log_id, (generation, a, b));
        }
    }
    let (sidecar_entries, sidecar_bytes) = writer.finish()?;
    Ok((
        ranges,
        live_entries,
        live_bytes,
        sidecar_entries,
        sidecar_bytes,
    ))
}

/// Counts again the live entries of adopted file `seq`, narrowing each log's range to them.
/// Returns the live entries and bytes (zero when the file is not adopted).
fn recount(shared: &Shared, seq: u64) -> (u64, u64) {
    let logs: Vec<(u64, (u64, u64, u64))> = {
        let st = shared.lock();
        let Some(file) = st.adopted.get(&seq) else {
            return (0, 0);
        };
        file.logs.iter().map(|(l, r)| (*l, *r)).collect()
    };
    let mut keep = Ranges::default();
    let (mut entries, mut bytes) = (0, 0);
    for chunk in logs.chunks(CHECKPOINT_LOGS_PER_LOCK) {
        let st = shared.lock();
        for (log_id, (generation, lo, hi)) in chunk {
            let Some(log) = st.logs.get(log_id).filter(|l| l.generation == *generation) else {
                continue;
            };
            let live = log.live_in_wal_file(seq, *lo, *hi);
            if live.entries > 0 {
                keep.insert(*log_id, (*generation, live.lo, live.hi));
                entries += live.entries;
                bytes += live.bytes;
            }
        }
    }
    // Nothing ever starts pointing into an adopted file, so what was not counted is gone.
    let mut st = shared.lock();
    if let Some(file) = st.adopted.get_mut(&seq) {
        if file.live_bytes != bytes {
            file.changed_at = Instant::now();
        }
        file.live_bytes = bytes;
        file.live_entries = entries;
        file.logs = keep;
    }
    (entries, bytes)
}

/// Counts the live entries of every adopted file: files with none die; files below
/// [`ADOPTED_COMPACT_LIVE_PERCENT_MAX`] percent live whose count has not changed for
/// [`ADOPTED_QUIET_MS`] (or at once when `forced`) are compacted into segments, then die.
fn collect_adopted(shared: &Shared, forced: bool) -> Result<()> {
    let seqs: Vec<u64> = shared.lock().adopted.keys().copied().collect();
    let quiet = Duration::from_millis(ADOPTED_QUIET_MS);
    let mut compacted = 0;
    let mut waiting = false;
    for seq in seqs {
        let (entries, bytes) = recount(shared, seq);
        let (file_bytes, changed_at) = {
            let st = shared.lock();
            let Some(file) = st.adopted.get(&seq) else {
                continue;
            };
            (file.file_bytes, file.changed_at)
        };
        if entries > 0 && bytes * 100 < file_bytes * ADOPTED_COMPACT_LIVE_PERCENT_MAX {
            if (forced || changed_at.elapsed() >= quiet) && compacted < ADOPTED_COMPACT_PER_PASS_MAX
            {
                compact_adopted(shared, seq)?;
                compacted += 1;
                shared
                    .counters
                    .adopted_files_compacted
                    .fetch_add(1, Ordering::Relaxed);
                shared
                    .config
                    .faults
                    .crash_point(CrashPoint::AfterAdoptedCompaction)?;
                if recount(shared, seq).0 > 0 {
                    return Err(Error::Corrupt(format!(
                        "adopted WAL file {seq} still holds live entries after its compaction"
                    )));
                }
            } else if compacted >= ADOPTED_COMPACT_PER_PASS_MAX && forced {
                // The rest in the next pass, still as asked (`wait_idle` waits for it).
                shared.lock().gc_forced = true;
            } else {
                waiting = true;
            }
        }
        let mut st = shared.lock();
        if st.adopted.get(&seq).is_some_and(|f| f.live_entries == 0) {
            st.adopted.remove(&seq);
            st.dead_wal.push((seq, true));
        }
    }
    if waiting {
        // Look again once the quiet period is over, even if nothing else happens.
        shared.lock().gc_requested = true;
    }
    Ok(())
}

/// Copies the live entries of adopted file `seq` into the logs' segments.
fn compact_adopted(shared: &Shared, seq: u64) -> Result<()> {
    let (source, logs) = {
        let st = shared.lock();
        let Some(file) = st.adopted.get(&seq) else {
            return Ok(());
        };
        let source = st
            .wal_files
            .get(&seq)
            .cloned()
            .ok_or_else(|| Error::Corrupt(format!("adopted WAL file {seq} is not open")))?;
        let mut logs: Vec<(u64, (u64, u64, u64))> =
            file.logs.iter().map(|(l, r)| (*l, *r)).collect();
        logs.sort_unstable();
        (source, logs)
    };
    let sources = [source.as_ref()];
    let mut sync = PendingSync::default();
    for (log_id, (generation, lo, hi)) in logs {
        let mut index = lo;
        while index <= hi {
            let end = (index + GATHER_SLOTS_PER_LOCK).min(hi + 1);
            let (items, open) = {
                let st = shared.lock();
                let Some(log) = st.logs.get(&log_id).filter(|l| l.generation == generation) else {
                    break;
                };
                let mut items = Vec::new();
                for i in index.max(log.first_index)..end.min(log.last_index() + 1) {
                    let slot = *log.slot(i).expect("in range");
                    if slot.released() {
                        continue;
                    }
                    if let Loc::Wal { seq: s, offset } = slot.loc() {
                        if s == seq {
                            items.push(Item {
                                index: i,
                                term: log.term_of(i).expect("in range"),
                                old_loc: slot.loc,
                                source: 0,
                                offset: u64::from(offset),
                                len: slot.len,
                            });
                        }
                    }
                }
                let open = log.segments.last_key_value().map(|(id, m)| (*id, *m));
                (items, open)
            };
            index = end;
            if items.is_empty() {
                continue;
            }
            match write_items(
                shared, log_id, generation, &sources, &items, open, &mut sync,
            ) {
                Ok(Some(written)) => repoint(shared, log_id, generation, written, &[], None),
                Ok(None) => break,
                Err(e) => {
                    // As in a flush: copies already repointed must be durable before a retry.
                    if let Err(sync_error) = sync.finish(&shared.config.segment_dir) {
                        return Err(Error::Poisoned(format!(
                            "syncing segments after a failed copy ({e}): {sync_error}"
                        )));
                    }
                    return Err(e);
                }
            }
        }
    }
    sync.finish(&shared.config.segment_dir)
}

/// Copies the live entries of rolled WAL file `seq` into segments.
fn flush(shared: &Shared, seq: u64) -> Result<()> {
    let (mut logs, source) = {
        let st = shared.lock();
        let logs: Vec<u64> = st
            .wal_touched
            .get(&seq)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        (logs, st.wal_files.get(&seq).cloned())
    };
    let Some(source) = source else {
        return Err(Error::Corrupt(format!(
            "WAL file {seq} to flush is not open"
        )));
    };
    logs.sort_unstable();
    let mut sync = PendingSync::default();
    for log_id in logs {
        let (generation, items, open) = {
            let st = shared.lock();
            let Some(log) = st.logs.get(&log_id) else {
                continue;
            };
            let range = log.wal_file_range(seq);
            let mut items = Vec::new();
            for pos in range {
                let slot = log.slots[pos];
                if slot.released() {
                    continue;
                }
                let index = log.first_index + pos as u64;
                let Loc::Wal { offset, .. } = slot.loc() else {
                    unreachable!("slots of the range are in the WAL file");
                };
                items.push(Item {
                    index,
                    term: log.term_of(index).expect("in range"),
                    old_loc: slot.loc,
                    source: 0,
                    offset: u64::from(offset),
                    len: slot.len,
                });
            }
            let open = log.segments.last_key_value().map(|(id, m)| (*id, *m));
            (log.generation, items, open)
        };
        if items.is_empty() {
            let mut st = shared.lock();
            if let Some(log) = st.logs.get_mut(&log_id) {
                forget_released(log, seq);
            }
            continue;
        }
        let sources = [source.as_ref()];
        let written = match write_items(
            shared, log_id, generation, &sources, &items, open, &mut sync,
        ) {
            Ok(written) => written,
            Err(e) => {
                // Logs copied before the failure already point at their copies, and a retry
                // will not copy them again: make those durable now, or stop the engine.
                if let Err(sync_error) = sync.finish(&shared.config.segment_dir) {
                    return Err(Error::Poisoned(format!(
                        "syncing segments after a failed copy ({e}): {sync_error}"
                    )));
                }
                return Err(e);
            }
        };
        if let Some(written) = written {
            // Repointed before the sync: reads find the copies in the page cache, and only the
            // checkpoint, written after the sync, makes anything depend on them.
            repoint(shared, log_id, generation, written, &[], Some(seq));
        }
    }
    sync.finish(&shared.config.segment_dir)?;
    let mut st = shared.lock();
    st.wal_touched.remove(&seq);
    st.wal_flushed_seq = st.wal_flushed_seq.max(seq);
    // Nothing points into the file any more; it goes once a checkpoint says so.
    st.dead_wal.push((seq, false));
    drop(st);
    shared
        .counters
        .wal_files_flushed
        .fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Deals with adopted files, forgets dead segments, compacts mostly-dead ones, writes the
/// checkpoint, then deletes the files the checkpoint no longer needs: dead WAL files (flushed
/// ones, adopted ones emptied or compacted) and dead segments.
fn collect(shared: &Shared, forced: bool) -> Result<()> {
    collect_adopted(shared, forced)?;
    let mut to_compact: BTreeMap<(u64, u64), Vec<u32>> = BTreeMap::new();
    let mut to_compact_count = 0;
    let (with_segments, settled_seq) = {
        let st = shared.lock();
        let logs: Vec<u64> = st
            .logs
            .iter()
            .filter(|(_, log)| !log.segments.is_empty())
            .map(|(id, _)| *id)
            .collect();
        (logs, st.wal_flushed_seq)
    };
    // A few logs per lock hold: counting live entries is linear in the log's length, and
    // appends wait for the lock meanwhile.
    for chunk in with_segments.chunks(CHECKPOINT_LOGS_PER_LOCK) {
        let mut guard = shared.lock();
        let st = &mut *guard;
        for log_id in chunk {
            let Some(log) = st.logs.get_mut(log_id) else {
                continue;
            };
            let Some(open_id) = log.segments.keys().next_back().copied() else {
                continue;
            };
            let mut chosen: Vec<u32> = Vec::new();
            let mut small: Vec<u32> = Vec::new();
            for (id, live) in log.live_per_segment(settled_seq) {
                let meta = log.segments[&id];
                if live == 0 {
                    log.segments.remove(&id);
                    st.dead_segments.push((*log_id, id));
                } else if (id != open_id || meta.count == SEGMENT_ENTRIES_MAX)
                    && u64::from(live) * 100 < u64::from(meta.count) * COMPACT_LIVE_PERCENT_MAX
                {
                    chosen.push(id);
                } else if id != open_id && live < SEGMENT_ENTRIES_MAX / 2 {
                    small.push(id);
                }
            }
            // Segments left small by earlier merges (passes run as releases come, so one
            // burst of releases may be merged in several passes) join this merge, so that
            // merges do not leave a trail of small segments behind.
            if !chosen.is_empty() {
                chosen.extend(small);
                chosen.sort_unstable();
                chosen.truncate(COMPACT_SEGMENTS_PER_PASS_MAX - to_compact_count);
                if !chosen.is_empty() {
                    to_compact_count += chosen.len();
                    to_compact.insert((*log_id, log.generation), chosen);
                }
            }
        }
    }
    for ((log_id, generation), ids) in to_compact {
        compact(shared, log_id, generation, &ids)?;
    }

    // The dead list is taken before the checkpoint is built, so nothing in it can be named by
    // the checkpoint; segments that die meanwhile wait for the next one.
    let (dead, dead_wal, wal_flushed_seq, adopted_files, log_ids) = {
        let mut st = shared.lock();
        let dead = std::mem::take(&mut st.dead_segments);
        let dead_wal = std::mem::take(&mut st.dead_wal);
        let adopted_files: Vec<(u64, u64)> = st
            .adopted
            .iter()
            .map(|(seq, f)| (*seq, f.sidecar_entries))
            .collect();
        let mut ids: Vec<u64> = st.logs.keys().copied().collect();
        ids.sort_unstable();
        (dead, dead_wal, st.wal_flushed_seq, adopted_files, ids)
    };
    let mut body = Vec::new();
    let mut count = 0u64;
    let mut seen_seq = 0;
    for chunk in log_ids.chunks(CHECKPOINT_LOGS_PER_LOCK) {
        let st = shared.lock();
        seen_seq = st.next_seq - 1;
        for log_id in chunk {
            if let Some(log) = st.logs.get(log_id) {
                checkpoint::push_log(
                    &mut body,
                    &LogCheckpoint::from_state(*log_id, log, wal_flushed_seq),
                );
                count += 1;
            }
        }
    }
    // The state just described may include releases, truncations or deletions whose records
    // are not durable yet; the checkpoint must not be more durable than the WAL, or a crash
    // could leave, e.g., a truncation without the entries that followed it.
    let give_back = |shared: &Shared| {
        let mut st = shared.lock();
        st.dead_segments.extend(dead.iter().copied());
        st.dead_wal.extend(dead_wal.iter().copied());
    };
    if !wait_synced(shared, seen_seq)? {
        give_back(shared);
        return Ok(());
    }
    let mut bytes = checkpoint::begin(wal_flushed_seq, &adopted_files, count);
    bytes.extend_from_slice(&body);
    let bytes = checkpoint::finish(bytes);
    if let Err(e) = checkpoint::write(&shared.config.meta_dir, &bytes) {
        give_back(shared);
        return Err(e.into());
    }
    shared
        .counters
        .checkpoint_bytes
        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
    shared
        .config
        .faults
        .crash_point(CrashPoint::AfterCheckpoint)?;

    for (log_id, id) in &dead {
        shared.lock().seg_files.remove(&(*log_id, *id));
        match std::fs::remove_file(segment::segment_path(
            &shared.config.segment_dir,
            *log_id,
            *id,
        )) {
            Ok(()) => {
                shared
                    .counters
                    .segments_deleted
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    for (n, (seq, was_adopted)) in dead_wal.iter().enumerate() {
        shared.lock().wal_files.remove(seq);
        let removed = crate::wal::retire(shared, *seq)
            .and_then(|()| adopted::remove(&shared.config.wal_dir, *seq));
        if let Err(e) = removed {
            // The checkpoint no longer names them; recovery would delete them too, but try
            // again at the next pass rather than leave disk behind until a restart.
            shared.lock().dead_wal.extend(dead_wal[n..].iter().copied());
            return Err(e.into());
        }
        if *was_adopted {
            shared
                .counters
                .adopted_files_deleted
                .fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Waits until every record up to `seq` is durable. False when the engine shuts down first
/// (the writer gave up on a full disk): the caller then writes nothing.
fn wait_synced(shared: &Shared, seq: u64) -> Result<bool> {
    let mut st = shared.lock();
    loop {
        if let Some(why) = &st.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        if st.synced_seq >= seq {
            return Ok(true);
        }
        if st.shutdown && st.pending.is_empty() && st.synced_seq < seq {
            // The writer exits once pending is empty; give it one more interval to finish its
            // last batch.
            let (next, timeout) = shared
                .synced_cv
                .wait_timeout(st, Duration::from_millis(DISK_FULL_RETRY_MS));
            st = next;
            if timeout.timed_out() && st.synced_seq < seq {
                return Ok(false);
            }
            continue;
        }
        st = shared
            .synced_cv
            .wait_timeout(st, Duration::from_millis(DISK_FULL_RETRY_MS))
            .0;
    }
}

/// Rewrites the live entries of segments `ids` of one log into new segments (merging them, so
/// that compaction also reduces the number of files).
fn compact(shared: &Shared, log_id: u64, generation: u64, ids: &[u32]) -> Result<()> {
    let items = {
        let st = shared.lock();
        let Some(log) = st.logs.get(&log_id).filter(|l| l.generation == generation) else {
            return Ok(());
        };
        let end = log.settled_end(st.wal_flushed_seq);
        let mut items = Vec::new();
        for (pos, slot) in log.slots.range(..end).enumerate() {
            if slot.released() {
                continue;
            }
            if let Loc::Segment { id, offset } = slot.loc() {
                if let Some(source) = ids.iter().position(|c| *c == id) {
                    let index = log.first_index + pos as u64;
                    items.push(Item {
                        index,
                        term: log.term_of(index).expect("in range"),
                        old_loc: slot.loc,
                        source,
                        offset: u64::from(offset),
                        len: slot.len,
                    });
                }
            }
        }
        items
    };
    if items.is_empty() {
        return Ok(());
    }
    let files = ids
        .iter()
        .map(|id| segment::open(&shared.config.segment_dir, log_id, *id))
        .collect::<io::Result<Vec<File>>>()?;
    let sources: Vec<&File> = files.iter().collect();
    let mut sync = PendingSync::default();
    let written = write_items(
        shared, log_id, generation, &sources, &items, None, &mut sync,
    )?;
    sync.finish(&shared.config.segment_dir)?;
    if let Some(written) = written {
        repoint(shared, log_id, generation, written, ids, None);
        shared
            .counters
            .segments_compacted
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}
