//! The write-ahead log: one per node, shared by every log, written by one thread.
//!
//! Group commit: the writer takes every pending record of every log (up to
//! [`BATCH_ENTRIES_MAX`] records and [`BATCH_BYTES_MAX`] bytes), encodes them into one buffer,
//! ends it with a [`RecordKind::BatchEnd`] record on a page boundary, writes it with one
//! `pwrite`, then one `fdatasync`, and only then marks the entries durable and calls the
//! listener. While it syncs, new records pile up, so batches grow with the load.
//!
//! File `wal/<seq as 16 hex digits>.wal`:
//!
//! ```text
//!  0  8  magic "WRNWAL01"
//!  8  4  version (3; 2 is still read)
//! 12  4  zero
//! 16  8  sequence number (same as the name)
//! 24  4  zero
//! 28  4  crc32c of bytes 0..28
//! 32  .. batches of records (see `record`), each ended by a batch end record
//! ```
//!
//! Recycling: a settled WAL file is not deleted but renamed `wal/<seq>.spare` (up to
//! [`WAL_SPARE_FILES_MAX`] of them), and the next roll renames a spare to the new file's name
//! and writes over it from the start. An `fdatasync` after overwriting blocks the file already
//! has changes no metadata, so the file system commits no journal transaction for it; growing
//! a file makes every sync do that too. This is PostgreSQL's `wal_recycle`. Records of the
//! file's previous life lie past the current ones, which is why each batch ends with a record
//! naming the file and the batch's checksum (`wal_reader` takes only what those vouch for).
//!
//! Faults: a failed fdatasync poisons the engine (the kernel may have dropped the dirty pages,
//! so retrying could report lost data as durable). A write failing with ENOSPC truncates the
//! file back to its last durable length, deletes the spare files, answers
//! [`crate::Error::DiskFull`] to new appends and retries every [`DISK_FULL_RETRY_MS`] until
//! space returns; nothing already durable is touched.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::sync_dir;
use crate::config::{BATCH_BYTES_MAX, BATCH_ENTRIES_MAX, DISK_FULL_RETRY_MS, WAL_SPARE_FILES_MAX};
use crate::fault::is_disk_full;
use crate::id_hash::IdMap;
use crate::log::{Loc, FILE_ID_MAX};
use crate::record::{self, RecordKind, RECORD_HEADER_BYTES};
use crate::store::{Op, Shared, State};

const MAGIC: &[u8; 8] = b"WRNWAL01";
/// 3: batches end with a batch end record, so files can be recycled. 2: 32-byte record headers
/// (version 1 had 40).
const VERSION: u32 = 3;
/// The oldest version still read: its files were never recycled, so replay needs no batch ends.
const VERSION_READ_MIN: u32 = 2;
/// Size of the WAL file header.
pub const WAL_HEADER_BYTES: u64 = 32;

/// The WAL file being written.
pub(crate) struct WalFile {
    pub seq: u64,
    pub file: Arc<File>,
    /// Durable length: everything before it is synced.
    pub len: u64,
}

/// The path of WAL file `seq`.
pub fn wal_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.wal"))
}

/// The sequence number a WAL file name stands for.
pub fn parse_wal_name(name: &str) -> Option<u64> {
    parse_seq_name(name, ".wal")
}

/// The sequence number in a name of the WAL directory's files: 16 hex digits, then `suffix`.
pub(crate) fn parse_seq_name(name: &str, suffix: &str) -> Option<u64> {
    let stem = name.strip_suffix(suffix)?;
    if stem.len() != 16 {
        return None;
    }
    u64::from_str_radix(stem, 16).ok()
}

/// The path of spare WAL file `seq` (settled, kept to be recycled).
pub(crate) fn spare_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.spare"))
}

/// The sequence number a spare WAL file's name stands for.
pub(crate) fn parse_spare_name(name: &str) -> Option<u64> {
    parse_seq_name(name, ".spare")
}

pub(crate) fn header_of_version(seq: u64, version: u32) -> [u8; WAL_HEADER_BYTES as usize] {
    let mut h = [0u8; WAL_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[16..24].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

pub(crate) fn header(seq: u64) -> [u8; WAL_HEADER_BYTES as usize] {
    header_of_version(seq, VERSION)
}

/// The format version of WAL file `seq` whose first bytes are `h`, if they are its header in
/// a version this build reads.
pub(crate) fn header_version(h: &[u8; WAL_HEADER_BYTES as usize], seq: u64) -> Option<u32> {
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    (VERSION_READ_MIN..=VERSION)
        .contains(&version)
        .then_some(version)
        .filter(|v| *h == header_of_version(seq, *v))
}

/// Creates WAL file `seq` with its header, durably (file and directory entry synced), so that
/// records written into it later are found after a crash.
pub(crate) fn create(dir: &Path, seq: u64) -> io::Result<WalFile> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(wal_path(dir, seq))?;
    start(dir, seq, file)
}

/// Makes spare file `spare` WAL file `seq`, durably, to be written over from its start (see
/// the module's doc); `None` if it cannot, and a new file is made instead.
pub(crate) fn recycle(dir: &Path, seq: u64, spare: u64) -> Option<WalFile> {
    let path = wal_path(dir, seq);
    std::fs::rename(spare_path(dir, spare), &path).ok()?;
    let file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
    start(dir, seq, file).ok()
}

/// Drops what the page cache holds of a spare's previous life: nobody reads it again, and
/// the kernel reads a settled file back in large folios (readahead), which each batch written
/// over them would dirty, and the process be charged for, whole: `write_bytes` in
/// `/proc/<pid>/io` showed 1.5 bytes per byte written, where the disk wrote 1.
///
/// Done as the file is retired, on the segment writer's thread, not as it is recycled: on the
/// WAL writer's thread, dropping a 256 MiB file's pages held every confirm for the while (2 %
/// of a busy follower's samples, all on the roll).
fn forget_cached_pages(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise on a valid, owned file descriptor only advises the kernel.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Writes the header of WAL file `seq` and syncs the file and its directory entry.
fn start(dir: &Path, seq: u64, file: File) -> io::Result<WalFile> {
    assert!(seq <= FILE_ID_MAX, "WAL sequence space exhausted");
    file.write_all_at(&header(seq), 0)?;
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(WalFile {
        seq,
        file: Arc::new(file),
        len: WAL_HEADER_BYTES,
    })
}

/// Keeps settled WAL file `seq` as a spare to be recycled, or deletes it when there are
/// [`WAL_SPARE_FILES_MAX`] spares already. The caller (the segment writer, the only thread
/// that adds spares) has made sure nothing points into it.
pub(crate) fn retire(shared: &Shared, seq: u64) -> io::Result<()> {
    let dir = &shared.config.wal_dir;
    // No other thread adds spares (the WAL writer only takes them): the room seen stays.
    if shared.lock().spare_wal.len() < WAL_SPARE_FILES_MAX {
        if let Ok(file) = File::open(wal_path(dir, seq)) {
            forget_cached_pages(&file);
        }
        match std::fs::rename(wal_path(dir, seq), spare_path(dir, seq)) {
            Ok(()) => {
                shared.lock().spare_wal.push(seq);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Deleting it below frees the disk all the same.
            Err(_) => {}
        }
    }
    match std::fs::remove_file(wal_path(dir, seq)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Deletes every spare WAL file: on a full disk, their space is worth more than their speed.
fn drop_spares(shared: &Shared) {
    let spares = std::mem::take(&mut shared.lock().spare_wal);
    for seq in spares {
        let _ = std::fs::remove_file(spare_path(&shared.config.wal_dir, seq));
    }
}

enum WriteOutcome {
    Durable,
    /// Shut down while the disk was full: the batch was never durable nor acknowledged.
    GaveUp,
    Poisoned,
}

/// The WAL writer thread. A panic in it (a bug) poisons the engine, so that callers get errors
/// instead of waiting forever for durability.
///
/// `started` hears once this thread holds the engine's lock for its first wait, so that
/// [`crate::Store::open`] returns only then: a record queued afterwards without a wake-up
/// ([`crate::Store::append_blocking_for_sync`]) stays pending until someone asks for a sync,
/// rather than racing a thread that is still starting.
pub(crate) fn run_writer(
    shared: Arc<Shared>,
    mut writer: Writer,
    started: std::sync::mpsc::Sender<()>,
) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        write_batches(&shared, &mut writer, started)
    }));
    if result.is_err() {
        shared.poison("WAL writer panicked".into());
    }
    // Stopped (shut down, gave up on a full disk, or poisoned): nobody will sync for them.
    let (waiters, poisoned) = {
        let mut st = shared.lock();
        (st.sync_waiters.take_all(), st.poisoned.clone())
    };
    crate::sync_waiters::tell(waiters, || {
        Err(crate::sync_waiters::stopped(poisoned.as_ref()))
    });
}

/// What writes batches: the active WAL file and the scratch space of encoding one, owned by
/// the writer thread.
pub(crate) struct Writer {
    wal: WalFile,
    wal_bytes_max: u64,
    batch: Vec<Op>,
    buf: Vec<u8>,
    offsets: Vec<u32>,
    durable: IdMap<u64>,
    notes: Vec<(u64, u64)>,
    release_from: Vec<u64>,
    open_runs: IdMap<(u64, usize)>,
}

impl Writer {
    pub(crate) fn new(wal: WalFile, wal_bytes_max: u64) -> Writer {
        Writer {
            wal,
            wal_bytes_max,
            batch: Vec::new(),
            buf: Vec::with_capacity(1 << 20),
            offsets: Vec::new(),
            durable: IdMap::default(),
            notes: Vec::new(),
            release_from: Vec::new(),
            open_runs: IdMap::default(),
        }
    }

    /// Takes the oldest pending records (within the batch limits) as the next batch.
    pub(crate) fn take(&mut self, st: &mut State) {
        take_batch(&mut st.pending, &mut self.batch);
        st.lazy_pending = st.pending.iter().filter(|op| op.lazy).count();
        st.pending_bytes -= self.batch.iter().map(|op| op.payload.len()).sum::<usize>();
        st.wake_room_waiters();
    }

    /// Writes and syncs the taken batch (if any), marks its entries durable and tells the
    /// listener, rolls the file when due, then tells whoever waited for the batch.
    /// [`Written::Stopped`]: the engine is poisoned or shut down.
    pub(crate) fn write(&mut self, shared: &Shared) -> Written {
        if !self.batch.is_empty() {
            self.buf.clear();
            self.offsets.clear();
            coalesce_releases(&self.batch, &mut self.release_from, &mut self.open_runs);
            for (op, from) in self.batch.iter().zip(&self.release_from) {
                let offset = self.wal.len + self.buf.len() as u64;
                self.offsets
                    .push(u32::try_from(offset).expect("WAL files stay below 4 GiB"));
                match (op.kind, *from) {
                    (RecordKind::Release, MERGED_LATER) => {}
                    (RecordKind::Release, from) if from < op.index => {
                        let kind = RecordKind::ReleaseRange;
                        record::encode(&mut self.buf, kind, op.log_id, from, op.index, b"");
                    }
                    _ => {
                        let (kind, log, index, term) = (op.kind, op.log_id, op.index, op.term);
                        record::encode(&mut self.buf, kind, log, index, term, &op.payload);
                    }
                }
            }
            end_batch(&mut self.buf, self.wal.len, self.wal.seq);
            match write_and_sync(shared, &mut self.wal, &self.buf) {
                WriteOutcome::Durable => {}
                WriteOutcome::GaveUp | WriteOutcome::Poisoned => return Written::Stopped,
            }
            shared.counters.wal_syncs.fetch_add(1, Ordering::Relaxed);
            shared
                .counters
                .wal_bytes
                .fetch_add(self.buf.len() as u64, Ordering::Relaxed);

            self.durable.clear();
            self.notes.clear();
            {
                let mut guard = shared.lock();
                let st = &mut *guard;
                let touched = st.wal_touched.entry(self.wal.seq).or_default();
                let mut last_log = None;
                for (op, offset) in self.batch.iter().zip(&self.offsets) {
                    if op.kind != RecordKind::Append {
                        continue;
                    }
                    if last_log != Some(op.log_id) {
                        touched.insert(op.log_id);
                        last_log = Some(op.log_id);
                    }
                    let Some(log) = st.logs.get_mut(&op.log_id) else {
                        continue;
                    };
                    // An entry released with a prefix before it was written is still reported
                    // durable: the broker confirms publishes from these notifications.
                    if op.index >= log.first_index {
                        let Some(slot) = log.slot_mut(op.index) else {
                            continue;
                        };
                        // A truncated or re-appended entry has another submission number.
                        if slot.loc != (Loc::Pending { seq: op.seq }).pack() {
                            continue;
                        }
                        slot.loc = Loc::Wal {
                            seq: self.wal.seq,
                            offset: *offset,
                        }
                        .pack();
                    }
                    if op.index > log.durable_index {
                        log.durable_index = op.index;
                        self.durable.insert(op.log_id, op.index);
                    }
                }
            }
            self.notes
                .extend(self.durable.iter().map(|(l, i)| (*l, *i)));
            for (log_id, index) in &self.notes {
                shared.listener.on_durable(*log_id, *index);
            }
        }

        // Roll before publishing the batch as synced, so that a caller who waited for it
        // (`Store::wait_idle`) finds the rolled file already queued for the segment writer.
        let written_through = match self.batch.last() {
            Some(op) => op.seq,
            None => shared.lock().next_seq - 1,
        };
        let asked = {
            let st = shared.lock();
            st.roll_requested && st.roll_after_seq <= written_through
        };
        if asked || self.wal.len >= self.wal_bytes_max {
            // A recycled file rolled early still has its previous life's bytes past this one's:
            // cut them, so that the file's size is its records' (the segment writer weighs
            // what is live against it). Not synced: replay ignores them either way.
            if self
                .wal
                .file
                .metadata()
                .is_ok_and(|m| m.len() > self.wal.len)
            {
                let _ = self.wal.file.set_len(self.wal.len);
            }
            let (dir, seq) = (&shared.config.wal_dir, self.wal.seq + 1);
            let spare = shared.lock().spare_wal.pop();
            let recycled = spare.and_then(|old| recycle(dir, seq, old));
            if recycled.is_some() {
                shared
                    .counters
                    .wal_files_recycled
                    .fetch_add(1, Ordering::Relaxed);
            }
            match recycled.map(Ok).unwrap_or_else(|| create(dir, seq)) {
                Ok(next) => {
                    {
                        let mut st = shared.lock();
                        st.wal_files.insert(next.seq, next.file.clone());
                        st.active_wal_seq = next.seq;
                        st.flush_queue.push_back(self.wal.seq);
                        if st.roll_requested && st.roll_after_seq <= written_through {
                            st.roll_requested = false;
                        }
                    }
                    self.wal = next;
                    shared.segment_writer_cv.notify_one();
                }
                // Keep writing the current file; the roll is tried again after the next
                // batch.
                Err(e) if is_disk_full(&e) => {}
                Err(e) => {
                    shared.poison(format!("creating WAL file {}: {e}", self.wal.seq + 1));
                    return Written::Stopped;
                }
            }
        }
        // Published after the listener ran, so that a caller of `Store::sync` knows the
        // listener has heard of everything it waited for.
        let due = match self.batch.last() {
            Some(op) => {
                let mut st = shared.lock();
                st.synced_seq = op.seq;
                st.evict(shared.config.cache_bytes_max);
                st.sync_waiters.take_due(op.seq)
            }
            None => Vec::new(),
        };
        self.batch.clear();
        shared.synced_cv.notify_all();
        crate::sync_waiters::tell(due, || Ok(()));
        shared.idle_cv.notify_all();
        Written::Durable
    }
}

/// How [`Writer::write`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Written {
    Durable,
    Stopped,
}

fn write_batches(shared: &Arc<Shared>, w: &mut Writer, started: std::sync::mpsc::Sender<()>) {
    let window = Duration::from_micros(shared.config.commit_window_us);
    // A machine up for less than a window has no instant that far back: the first sync then
    // counts as just begun.
    let mut last_sync_started = Instant::now()
        .checked_sub(window)
        .unwrap_or_else(Instant::now);
    let mut started = Some(started);
    loop {
        {
            let mut st = shared.lock();
            if let Some(started) = started.take() {
                let _ = started.send(());
            }
            let mut lazy_deadline = None;
            while !must_write(&st) {
                // Under the lock, so that whoever changes the state after this look wakes us.
                shared.writer_asleep.store(true, Ordering::SeqCst);
                if st.pending.is_empty() {
                    st = shared.writer_cv.wait(st).unwrap_or_else(|e| e.into_inner());
                    shared.writer_asleep.store(false, Ordering::SeqCst);
                    continue;
                }
                let deadline =
                    *lazy_deadline.get_or_insert_with(|| Instant::now() + LAZY_WRITE_AFTER);
                let now = Instant::now();
                if now >= deadline {
                    shared.writer_asleep.store(false, Ordering::SeqCst);
                    break;
                }
                st = shared
                    .writer_cv
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                shared.writer_asleep.store(false, Ordering::SeqCst);
            }
            // A test holding the writer clears the switch without a wake-up: poll for it.
            while shared.config.faults.writer_held() && !st.shutdown {
                st = shared
                    .writer_cv
                    .wait_timeout(st, Duration::from_millis(1))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            if st.poisoned.is_some() || (st.shutdown && st.pending.is_empty()) {
                return;
            }
            let since = last_sync_started.elapsed();
            let asked_now = st
                .pending
                .first()
                .is_some_and(|op| op.seq <= st.sync_now_target);
            if since < window
                && !st.shutdown
                && !asked_now
                && streaming(st.pending.len(), st.pending_bytes)
            {
                drop(st);
                std::thread::sleep(window - since);
            }
        }
        last_sync_started = Instant::now();
        w.take(&mut shared.lock());
        shared.room_cv.notify_all();
        match w.write(shared) {
            Written::Durable => {}
            Written::Stopped => return,
        }
    }
}

/// Whether the writer writes now: a record somebody may wait for is pending (an append, a
/// vote, a release), a sync is asked for, or the file is to roll or the engine to stop.
pub(crate) fn must_write(st: &crate::store::State) -> bool {
    st.pending.len() > st.lazy_pending
        || st
            .pending
            .first()
            .is_some_and(|op| op.seq <= st.sync_target)
        || st.roll_requested
        || st.shutdown
}

/// Moves the oldest pending records into `batch`, within the batch limits (at least one).
/// Whether the records waiting for the writer look like a stream worth a longer batch: several
/// arrived during the last sync, and they are still far from filling a batch.
///
/// Then the writer lets [`crate::Config::commit_window_us`] pass since the last sync began
/// before it syncs again. Each sync costs a partly filled page (2 KiB on average) beyond the
/// records: at 30 000 messages of 1 KB a second a sync every 0.65 ms holds 20 of them, and that
/// page is 12 % more written; a sync every 2 ms holds 60 and it is 4 %. A publisher waiting for
/// each confirm before the next publish never looks like a stream, so it never waits.
fn streaming(records: usize, payload_bytes: usize) -> bool {
    records >= STREAM_RECORDS_MIN && payload_bytes < STREAM_BATCH_BYTES
}

/// The longest a record nobody waits for (a Raft commit index) stays unwritten when no other
/// record comes to carry it: bounds what a crash can take back of them.
pub(crate) const LAZY_WRITE_AFTER: Duration = Duration::from_millis(200);

/// Records that must have piled up during a sync for the next one to wait for more.
const STREAM_RECORDS_MIN: usize = 4;
/// Bytes a batch need not wait beyond: the page left over is under 2 % of it.
const STREAM_BATCH_BYTES: usize = 128 << 10;

/// The page size the batches are aligned to: the kernel's unit of dirtying and writeback.
pub(crate) const PAGE_BYTES: u64 = 4096;

/// Ends the batch in `buf`, to be written at file offset `at` of WAL file `seq`, with a
/// [`RecordKind::BatchEnd`] record that vouches for it and fills the rest of its last page.
///
/// Each fdatasync writes whole pages. Without the fill, the page a batch ends in is written
/// again, whole, by the next batch: 4 KiB more per sync, which at moderate rates (20 messages
/// of 1 KB per sync) is 20 % more bytes written than the messages themselves. With it, a batch
/// costs only the zeros of its last page (2 KiB on average), and file space, not writes.
pub(crate) fn end_batch(buf: &mut Vec<u8>, at: u64, seq: u64) {
    let crc = crc32c::crc32c(buf);
    let end = at + (buf.len() + RECORD_HEADER_BYTES) as u64;
    let gap = (PAGE_BYTES - end % PAGE_BYTES) % PAGE_BYTES;
    let zeros = [0u8; PAGE_BYTES as usize];
    let kind = RecordKind::BatchEnd;
    record::encode(buf, kind, seq, at, u64::from(crc), &zeros[..gap as usize]);
}

/// In [`coalesce_releases`]'s plan: this release is written as part of a later range record.
const MERGED_LATER: u64 = u64::MAX;

/// Plans one [`RecordKind::ReleaseRange`] record for each run of releases of consecutive
/// indexes of one log within a batch (consumers acking in order: one record per batch and
/// queue, not 40 bytes per message). For op `i`, `from[i]` is the first index of the range
/// written at op `i`, or [`MERGED_LATER`] when a later op of the batch writes it.
///
/// A range is written where its last release was, so every append it covers comes before it
/// in the WAL, as each release came after its append. Any other record of the log (a truncate,
/// prefix release, deletion) ends the run, so replay sees the same order of effects.
fn coalesce_releases(batch: &[Op], from: &mut Vec<u64>, open_runs: &mut IdMap<(u64, usize)>) {
    from.clear();
    open_runs.clear();
    for (i, op) in batch.iter().enumerate() {
        from.push(op.index);
        match op.kind {
            RecordKind::Append => {}
            RecordKind::Release => match open_runs.get_mut(&op.log_id) {
                Some((first, last_op)) if batch[*last_op].index + 1 == op.index => {
                    from[*last_op] = MERGED_LATER;
                    from[i] = *first;
                    *last_op = i;
                }
                _ => {
                    open_runs.insert(op.log_id, (op.index, i));
                }
            },
            _ => {
                open_runs.remove(&op.log_id);
            }
        }
    }
}

fn take_batch(pending: &mut Vec<Op>, batch: &mut Vec<Op>) {
    let mut bytes = 0;
    let mut n = 0;
    for op in pending.iter() {
        let size = RECORD_HEADER_BYTES + op.payload.len();
        if n > 0 && (n == BATCH_ENTRIES_MAX || bytes + size > BATCH_BYTES_MAX) {
            break;
        }
        bytes += size;
        n += 1;
    }
    if n == pending.len() {
        std::mem::swap(pending, batch);
    } else {
        batch.extend(pending.drain(..n));
    }
}

fn write_and_sync(shared: &Shared, wal: &mut WalFile, buf: &[u8]) -> WriteOutcome {
    let faults = &shared.config.faults;
    loop {
        let written = faults
            .before_write()
            .and_then(|()| wal.file.write_all_at(buf, wal.len));
        match written {
            Ok(()) => break,
            Err(e) if is_disk_full(&e) => {
                // Drop whatever part of the batch reached the file so the next attempt (and
                // recovery) sees the file end at its last durable record.
                let _ = wal.file.set_len(wal.len);
                drop_spares(shared);
                {
                    let mut st = shared.lock();
                    st.disk_full = true;
                    if st.shutdown {
                        return WriteOutcome::GaveUp;
                    }
                }
                std::thread::sleep(Duration::from_millis(DISK_FULL_RETRY_MS));
            }
            Err(e) => {
                shared.poison(format!("writing WAL file {}: {e}", wal.seq));
                return WriteOutcome::Poisoned;
            }
        }
    }
    // The clock is read only for a benchmark's stalls: every production sync passes here.
    let began = faults.stalling().then(std::time::SystemTime::now);
    if let Err(e) = faults.before_sync().and_then(|()| wal.file.sync_data()) {
        shared.poison(format!("fdatasync of WAL file {}: {e}", wal.seq));
        return WriteOutcome::Poisoned;
    }
    if let Some(began) = began {
        faults.after_sync(began);
    }
    wal.len += buf.len() as u64;
    let mut st = shared.lock();
    if st.disk_full {
        st.disk_full = false;
        st.wake_room_waiters();
        drop(st);
        shared.room_cv.notify_all();
    }
    WriteOutcome::Durable
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn batches_end_on_a_page_boundary_with_a_record_vouching_for_them() {
        for (at, len) in [
            (32, 0),
            (32, 100),
            (4096, 4064),
            (4096, 4032),
            (8000, 4000),
            (0, 4095),
            (4096, 1),
        ] {
            let mut buf = vec![1u8; len];
            let crc = crc32c::crc32c(&buf);
            end_batch(&mut buf, at, 9);
            assert_eq!((at + buf.len() as u64) % PAGE_BYTES, 0, "at {at} len {len}");
            assert!(buf.len() - len >= RECORD_HEADER_BYTES);
            assert!(buf.len() - len < PAGE_BYTES as usize + RECORD_HEADER_BYTES);
            match record::decode(&buf[len..]) {
                record::Decoded::Record(h, _) => assert_eq!(
                    (h.kind, h.log_id, h.index, h.term),
                    (RecordKind::BatchEnd, 9, at, u64::from(crc))
                ),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn in_order_releases_of_a_log_become_one_range_written_at_the_last_of_them() {
        use RecordKind::*;
        let ops: Vec<Op> = [
            (Append, 1, 10),
            (Release, 1, 1),
            (Release, 2, 7),
            (Append, 1, 11),
            (Release, 1, 2),
            (Release, 2, 8),
            (Release, 1, 3),
            (Release, 1, 5), // a gap: a new run
            (Release, 1, 6),
            (Release, 2, 9),
            (Truncate, 2, 20), // ends log 2's run
            (Release, 2, 10),
        ]
        .into_iter()
        .enumerate()
        .map(|(seq, (kind, log_id, index))| Op {
            seq: seq as u64,
            kind,
            log_id,
            index,
            term: 0,
            payload: Bytes::new(),
            lazy: false,
        })
        .collect();
        let (mut from, mut runs) = (Vec::new(), IdMap::default());
        coalesce_releases(&ops, &mut from, &mut runs);
        let m = MERGED_LATER;
        assert_eq!(from, vec![10, m, m, 11, m, m, 1, m, 5, 7, 20, 10]);
    }

    #[test]
    fn batches_respect_entry_and_byte_limits() {
        let op = |seq, len| Op {
            seq,
            kind: RecordKind::Append,
            log_id: 1,
            index: seq,
            term: 1,
            payload: Bytes::from(vec![0u8; len]),
            lazy: false,
        };
        let mut pending: Vec<Op> = (1..=BATCH_ENTRIES_MAX as u64 + 5)
            .map(|s| op(s, 1))
            .collect();
        let mut batch = Vec::new();
        take_batch(&mut pending, &mut batch);
        assert_eq!((batch.len(), pending.len()), (BATCH_ENTRIES_MAX, 5));
        assert_eq!(pending[0].seq, BATCH_ENTRIES_MAX as u64 + 1);

        let mut pending = vec![op(1, BATCH_BYTES_MAX), op(2, 10)];
        let mut batch = Vec::new();
        take_batch(&mut pending, &mut batch);
        assert_eq!(
            (batch.len(), pending.len()),
            (1, 1),
            "an oversized record goes alone"
        );
    }

    #[test]
    fn names_round_trip() {
        let p = wal_path(Path::new("/w"), 0x1f);
        assert_eq!(
            parse_wal_name(p.file_name().unwrap().to_str().unwrap()),
            Some(0x1f)
        );
        assert_eq!(parse_wal_name("checkpoint"), None);
        assert_eq!(parse_spare_name("000000000000001f.spare"), Some(0x1f));
        assert_eq!(parse_spare_name("000000000000001f.wal"), None);
        assert_eq!(parse_spare_name("1f.spare"), None);
    }
}
