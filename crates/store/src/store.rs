//! The public face of the engine: [`Store`], shared by every log of the node.
//!
//! Callers change the in-memory state under one short lock and queue a record for the WAL
//! writer; they never wait for I/O. The WAL writer thread ([`crate::wal`]) makes queued records
//! durable in batches and tells the [`DurabilityListener`]; the segment writer thread
//! (`segment_writer`) moves what outlives a WAL file into segments.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, WaitTimeoutResult};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use bytes::Bytes;

use crate::adopted::AdoptedFile;
use crate::config::{
    Config, APPEND_ENTRIES_MAX, CACHE_ENTRIES_MAX, LOGS_MAX, PAYLOAD_BYTES_MAX, PENDING_BYTES_MAX,
    PENDING_CONTROL_MAX, PENDING_ENTRIES_MAX, SNAPSHOT_BYTES_MAX,
};
use crate::id_hash::{IdMap, IdSet};
use crate::log::{Cached, Loc, LogState, Slot};
use crate::record::RecordKind;
use crate::sync_waiters::{self, SyncDone, SyncWaiters};
use crate::{recovery, segment_writer, wal, Error, Result};

/// One entry of a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Position in the log, from 1, contiguous.
    pub index: u64,
    /// Raft term (non-decreasing along the log); any constant for non-replicated queues.
    pub term: u64,
    /// The data.
    pub payload: Bytes,
}

/// Told when entries become durable. Called from the WAL writer thread right after each
/// fdatasync, once per log that had entries in the batch: it must be quick and must not block
/// (send to a channel, wake a task). It may read the store, but must not call [`Store::sync`]
/// or [`Store::wait_idle`], which wait for the very thread that calls it.
pub trait DurabilityListener: Send + Sync + 'static {
    /// Every entry of `log_id` up to `durable_index` is on disk.
    fn on_durable(&self, log_id: u64, durable_index: u64);
    /// The engine is poisoned; no more `on_durable` will come.
    fn on_failure(&self, _error: &Error) {}
}

/// A listener that ignores everything (for callers that poll [`Store::log_info`] or use
/// [`Store::sync`]).
pub struct NoopListener;

impl DurabilityListener for NoopListener {
    fn on_durable(&self, _log_id: u64, _durable_index: u64) {}
}

/// What the store knows of a log: what recovery hands back for each log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogInfo {
    /// The log.
    pub log_id: u64,
    /// First index held (snapshot index + 1).
    pub first_index: u64,
    /// Last index held (first_index - 1 when empty).
    pub last_index: u64,
    /// Term of the last entry, or of the snapshot when empty.
    pub last_term: u64,
    /// Entries up to here are durable.
    pub durable_index: u64,
    /// Index of the last prefix release (0 if none).
    pub snapshot_index: u64,
    /// Term given with the last prefix release.
    pub snapshot_term: u64,
    /// Entries between first and last not released.
    pub live_entries: u64,
}

/// The snapshot given with the last prefix release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Everything up to here was released.
    pub index: u64,
    /// The term of that index.
    pub term: u64,
    /// The caller's blob.
    pub blob: Bytes,
}

/// A Raft group's hard state: what a node must not forget across a crash (the term it is in,
/// whom it voted for in that term, and how far it knows the log to be committed). Kept in the
/// WAL beside the group's entries, so that one fsync covers both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardState {
    /// The current term.
    pub term: u64,
    /// The node voted for in `term` (0: none).
    pub vote: u64,
    /// The highest index known committed.
    pub commit: u64,
}

/// Counters for benches, metrics and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Entries appended.
    pub appends: u64,
    /// WAL write + fdatasync rounds (each one group commit).
    pub wal_syncs: u64,
    /// Bytes written to WAL files.
    pub wal_bytes: u64,
    /// Bytes written to segment files (records and index entries).
    pub segment_bytes: u64,
    /// Rolled WAL files whose live entries were copied into segments (the file then deleted).
    pub wal_files_flushed: u64,
    /// WAL files started by writing over a settled one rather than creating a new one.
    pub wal_files_recycled: u64,
    /// Segment files deleted because nothing in them was live.
    pub segments_deleted: u64,
    /// Segment files rewritten by compaction.
    pub segments_compacted: u64,
    /// Rolled WAL files kept in place as data files rather than copied into segments.
    pub wal_files_adopted: u64,
    /// Bytes written to the index sidecars of adopted WAL files.
    pub adopted_index_bytes: u64,
    /// Adopted WAL files deleted because nothing in them was live any more.
    pub adopted_files_deleted: u64,
    /// Adopted WAL files whose few live entries were copied into segments.
    pub adopted_files_compacted: u64,
    /// Bytes written to checkpoint files.
    pub checkpoint_bytes: u64,
    /// Payload bytes held by the cache.
    pub cache_bytes: u64,
    /// Records waiting for the WAL writer.
    pub pending_records: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub wal_syncs: AtomicU64,
    pub wal_bytes: AtomicU64,
    pub segment_bytes: AtomicU64,
    pub wal_files_flushed: AtomicU64,
    pub wal_files_recycled: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub segments_compacted: AtomicU64,
    pub wal_files_adopted: AtomicU64,
    pub adopted_index_bytes: AtomicU64,
    pub adopted_files_deleted: AtomicU64,
    pub adopted_files_compacted: AtomicU64,
    pub checkpoint_bytes: AtomicU64,
}

/// A record waiting for the WAL writer.
#[derive(Debug)]
pub(crate) struct Op {
    pub seq: u64,
    pub kind: RecordKind,
    pub log_id: u64,
    pub index: u64,
    pub term: u64,
    pub payload: Bytes,
    /// Nobody waits for it (see [`State::lazy_pending`]).
    pub lazy: bool,
}

/// Everything behind the engine's lock.
pub(crate) struct State {
    pub logs: IdMap<LogState>,
    pub next_generation: u64,
    pub pending: Vec<Op>,
    pub pending_bytes: usize,
    /// How many of `pending` nobody waits for (a Raft commit index): while they are all there
    /// is, the writer lets them wait for the next batch (or [`crate::wal::LAZY_WRITE_AFTER`])
    /// rather than sync for them.
    pub lazy_pending: usize,
    /// The newest record a [`Store::sync`] caller waits for: lazy records up to it are written
    /// now too.
    pub sync_target: u64,
    /// The newest record a [`Store::sync_now_then`] caller waits for: a batch holding it is
    /// synced without waiting out the commit window.
    pub sync_now_target: u64,
    /// Submission number of the next record.
    pub next_seq: u64,
    /// Every record up to this submission number is durable.
    pub synced_seq: u64,
    /// Cache entries in submission order: (log id, index, seq), for eviction.
    pub fifo: VecDeque<(u64, u64, u64)>,
    pub cache_bytes: usize,
    pub poisoned: Option<String>,
    pub disk_full: bool,
    pub shutdown: bool,
    /// Read handles of WAL files still referenced.
    pub wal_files: BTreeMap<u64, Arc<File>>,
    pub active_wal_seq: u64,
    /// Logs with appends in each WAL file, so a flush visits only them.
    pub wal_touched: IdMap<IdSet>,
    /// Rolled WAL files waiting for the segment writer, oldest first.
    pub flush_queue: VecDeque<u64>,
    pub wal_flushed_seq: u64,
    pub roll_requested: bool,
    /// A requested roll happens once every record up to this one is written.
    pub roll_after_seq: u64,
    pub segment_writer_busy: bool,
    pub gc_requested: bool,
    pub gc_forced: bool,
    pub seg_files: HashMap<(u64, u32), Arc<File>>,
    /// Segments no longer referenced, deleted after the next checkpoint.
    pub dead_segments: Vec<(u64, u32)>,
    /// Rolled WAL files kept as data files, by sequence (see `adopted`).
    pub adopted: BTreeMap<u64, AdoptedFile>,
    /// WAL files nothing points into any more (flushed, or adopted and since emptied or
    /// compacted), deleted after the next checkpoint; true for those that were adopted.
    pub dead_wal: Vec<(u64, bool)>,
    /// Settled WAL files kept to be recycled, by their old sequence (see `wal`).
    pub spare_wal: Vec<u64>,
    pub room_wakers: Vec<Waker>,
    /// Callers of [`Store::sync_then`] not told yet.
    pub sync_waiters: SyncWaiters,
}

impl State {
    pub(crate) fn new() -> State {
        State {
            logs: IdMap::default(),
            next_generation: 1,
            pending: Vec::new(),
            pending_bytes: 0,
            lazy_pending: 0,
            sync_target: 0,
            sync_now_target: 0,
            next_seq: 1,
            synced_seq: 0,
            fifo: VecDeque::new(),
            cache_bytes: 0,
            poisoned: None,
            disk_full: false,
            shutdown: false,
            wal_files: BTreeMap::new(),
            active_wal_seq: 0,
            wal_touched: IdMap::default(),
            flush_queue: VecDeque::new(),
            wal_flushed_seq: 0,
            roll_requested: false,
            roll_after_seq: 0,
            segment_writer_busy: false,
            gc_requested: false,
            gc_forced: false,
            seg_files: HashMap::new(),
            dead_segments: Vec::new(),
            adopted: BTreeMap::new(),
            dead_wal: Vec::new(),
            spare_wal: Vec::new(),
            room_wakers: Vec::new(),
            sync_waiters: SyncWaiters::default(),
        }
    }

    fn check_writable(&self) -> Result<()> {
        if let Some(why) = &self.poisoned {
            return Err(Error::Poisoned(why.clone()));
        }
        if self.shutdown {
            return Err(Error::Closed);
        }
        if self.disk_full {
            return Err(Error::DiskFull);
        }
        Ok(())
    }

    fn has_room(&self) -> bool {
        self.pending.len() < PENDING_ENTRIES_MAX && self.pending_bytes < PENDING_BYTES_MAX
    }

    /// A new log, whose segment ids cannot collide with files of an earlier life of the same id
    /// that are not deleted yet.
    /// The log, created empty if it does not exist yet (within [`LOGS_MAX`]).
    pub(crate) fn log_or_new(&mut self, log_id: u64) -> Result<&mut LogState> {
        if !self.logs.contains_key(&log_id) {
            if self.logs.len() >= LOGS_MAX {
                return Err(Error::TooManyLogs);
            }
            let log = self.new_log(log_id);
            self.logs.insert(log_id, log);
        }
        Ok(self.logs.get_mut(&log_id).expect("inserted above"))
    }

    pub(crate) fn new_log(&mut self, log_id: u64) -> LogState {
        let mut log = LogState::new(self.next_generation);
        self.next_generation += 1;
        let floor = self
            .dead_segments
            .iter()
            .filter(|(l, _)| *l == log_id)
            .map(|(_, id)| id + 1)
            .max()
            .unwrap_or(1);
        log.next_segment_id = floor;
        // Segment ids of an earlier life may be reused once its files are gone: forget any
        // read handle of them.
        self.seg_files.retain(|(l, _), _| *l != log_id);
        log
    }

    fn push_op(&mut self, kind: RecordKind, log_id: u64, index: u64, term: u64, payload: Bytes) {
        self.push(kind, log_id, index, term, payload, false);
    }

    /// [`Self::push_op`] for a record nobody waits for: it goes with the next batch.
    fn push_lazy_op(
        &mut self,
        kind: RecordKind,
        log_id: u64,
        index: u64,
        term: u64,
        payload: Bytes,
    ) {
        self.lazy_pending += 1;
        self.push(kind, log_id, index, term, payload, true);
    }

    fn push(
        &mut self,
        kind: RecordKind,
        log_id: u64,
        index: u64,
        term: u64,
        payload: Bytes,
        lazy: bool,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending_bytes += payload.len();
        self.pending.push(Op {
            seq,
            kind,
            log_id,
            index,
            term,
            payload,
            lazy,
        });
    }

    /// Drops cached payloads beyond the budget, oldest first; entries not yet durable stay.
    pub(crate) fn evict(&mut self, budget_bytes: usize) {
        while self.cache_bytes > budget_bytes || self.fifo.len() > CACHE_ENTRIES_MAX {
            let Some(&(log_id, index, seq)) = self.fifo.front() else {
                break;
            };
            if seq > self.synced_seq {
                break;
            }
            self.fifo.pop_front();
            if let Some(log) = self.logs.get_mut(&log_id) {
                if log
                    .cache
                    .front()
                    .is_some_and(|c| c.index == index && c.seq == seq)
                {
                    let c = log.cache.pop_front().expect("non-empty");
                    self.cache_bytes -= c.payload.len();
                }
            }
        }
    }

    pub(crate) fn wake_room_waiters(&mut self) {
        for waker in self.room_wakers.drain(..) {
            waker.wake();
        }
    }

    pub(crate) fn log_info(&self, log_id: u64) -> Option<LogInfo> {
        let log = self.logs.get(&log_id)?;
        Some(LogInfo {
            log_id,
            first_index: log.first_index,
            last_index: log.last_index(),
            last_term: log.last_term(),
            durable_index: log.durable_index,
            snapshot_index: log.snapshot.index,
            snapshot_term: log.snapshot.term,
            live_entries: log.live_count,
        })
    }
}

/// A condvar rung by the WAL writer after every round, whose waiters are rare (blocking
/// callers, tests, tools): a notify is a futex syscall whether anyone waits or not, so it
/// rings only when someone does. Waiters count themselves in under the state's lock, and the
/// state they wait on changes under it, so a ring that finds nobody comes before any wait.
#[derive(Default)]
pub(crate) struct Bell {
    cv: Condvar,
    waiters: AtomicUsize,
}

impl Bell {
    pub(crate) fn wait<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        st
    }

    pub(crate) fn wait_timeout<'a>(
        &self,
        st: MutexGuard<'a, State>,
        timeout: std::time::Duration,
    ) -> (MutexGuard<'a, State>, WaitTimeoutResult) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let out = self
            .cv
            .wait_timeout(st, timeout)
            .unwrap_or_else(|e| e.into_inner());
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        out
    }

    pub(crate) fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }
}

/// What the engine's threads share.
pub(crate) struct Shared {
    pub config: Config,
    pub state: Mutex<State>,
    /// Wakes the WAL writer: records are pending, a roll is asked, or shutdown. Notified only
    /// through [`Shared::wake_writer`], except at shutdown.
    pub writer_cv: Condvar,
    /// Whether the WAL writer waits on `writer_cv`: set by it under the state's lock before
    /// each wait, cleared by whoever wakes it. A condvar's notify is a futex syscall whether
    /// anyone waits or not, and every append, release and truncate asks for one: two per
    /// message consumed (issue 37), where a round of the writer needs one.
    pub writer_asleep: AtomicBool,
    /// Wakes blocking submitters: the pending queue has room.
    pub room_cv: Bell,
    /// Wakes [`Store::sync`] callers: a batch is durable.
    pub synced_cv: Bell,
    /// Wakes the segment writer.
    pub segment_writer_cv: Condvar,
    /// Wakes [`Store::wait_idle`] callers.
    pub idle_cv: Bell,
    pub listener: Arc<dyn DurabilityListener>,
    pub counters: Counters,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the WAL writer if it waits, after the caller changed the state under the lock:
    /// the writer sets `writer_asleep` under that lock before it waits, so a change made
    /// before it looked is seen by it, and one made after finds the flag set.
    pub(crate) fn wake_writer(&self) {
        if self.writer_asleep.swap(false, Ordering::SeqCst) {
            self.writer_cv.notify_one();
        }
    }

    /// Marks the engine failed for good and tells everyone waiting.
    pub(crate) fn poison(&self, why: String) {
        let waiters = {
            let mut st = self.lock();
            if st.poisoned.is_none() {
                st.poisoned = Some(why.clone());
            }
            st.pending.clear();
            st.pending_bytes = 0;
            st.wake_room_waiters();
            st.sync_waiters.take_all()
        };
        sync_waiters::tell(waiters, || Err(Error::Poisoned(why.clone())));
        self.listener.on_failure(&Error::Poisoned(why));
        self.synced_cv.notify_all();
        self.room_cv.notify_all();
        self.idle_cv.notify_all();
        self.segment_writer_cv.notify_all();
    }
}

/// The storage engine of one node: many logs, one WAL, per-log segments.
///
/// Cheap to share (`Arc<Store>`); every method takes `&self`, never blocks on I/O except the
/// documented `*_blocking`, [`Store::sync`] and [`Store::wait_idle`] helpers, and reads, which
/// read a file when the entry is no longer cached.
pub struct Store {
    pub(crate) shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Released (closing the flock) only after both threads stopped.
    _lock: File,
}

impl Store {
    /// Opens (or creates) the store: recovers every log from the checkpoint, segments and WAL
    /// files, truncating a torn WAL tail, then starts the WAL writer and segment writer threads.
    /// Returns what each log holds.
    pub fn open(
        config: Config,
        listener: Arc<dyn DurabilityListener>,
    ) -> Result<(Store, Vec<LogInfo>)> {
        let recovered = recovery::recover(&config)?;
        let mut infos: Vec<LogInfo> = recovered
            .state
            .logs
            .keys()
            .filter_map(|id| recovered.state.log_info(*id))
            .collect();
        infos.sort_by_key(|i| i.log_id);
        let wal_bytes_max = config.wal_file_bytes();
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(recovered.state),
            writer_cv: Condvar::new(),
            writer_asleep: AtomicBool::new(false),
            room_cv: Bell::default(),
            synced_cv: Bell::default(),
            segment_writer_cv: Condvar::new(),
            idle_cv: Bell::default(),
            listener,
            counters: Counters::default(),
        });
        let writer = {
            let shared = shared.clone();
            let writer = wal::Writer::new(recovered.active, wal_bytes_max);
            let (started, writer_started) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new()
                .name("warren-wal".into())
                .spawn(move || wal::run_writer(shared, writer, started))?;
            // An error means the thread ended before its first wait: the engine is poisoned
            // and says so on the first call.
            let _ = writer_started.recv();
            thread
        };
        let segments = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("warren-segments".into())
                .spawn(move || segment_writer::run(shared))?
        };
        Ok((
            Store {
                shared,
                threads: vec![writer, segments],
                _lock: recovered.lock,
            },
            infos,
        ))
    }

    /// Queues entries for the WAL. They are readable at once and durable when the listener says
    /// so. `entries` must continue the log: the first index is `last_index + 1` (use
    /// [`Store::truncate`] first on a Raft conflict), indexes are contiguous, terms do not go
    /// back. Never blocks: answers [`Error::Backpressure`] when the WAL writer is behind, and
    /// [`Error::DiskFull`] while the disk is full.
    pub fn append(&self, log_id: u64, entries: &[Entry]) -> Result<()> {
        self.queue_append(log_id, entries, true)
    }

    fn queue_append(&self, log_id: u64, entries: &[Entry], wake_writer: bool) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        if entries.len() > APPEND_ENTRIES_MAX {
            return Err(Error::TooLarge {
                what: "append batch",
                bytes: entries.len(),
                max: APPEND_ENTRIES_MAX,
            });
        }
        let mut bytes = 0;
        for e in entries {
            if e.payload.len() > PAYLOAD_BYTES_MAX {
                return Err(Error::TooLarge {
                    what: "payload",
                    bytes: e.payload.len(),
                    max: PAYLOAD_BYTES_MAX,
                });
            }
            bytes += e.payload.len();
        }
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        st.check_writable()?;
        if st.pending.len() + entries.len() > PENDING_ENTRIES_MAX
            || (st.pending_bytes + bytes > PENDING_BYTES_MAX && !st.pending.is_empty())
        {
            return Err(Error::Backpressure);
        }
        if !st.logs.contains_key(&log_id) {
            if st.logs.len() >= LOGS_MAX {
                return Err(Error::TooManyLogs);
            }
            let log = st.new_log(log_id);
            st.logs.insert(log_id, log);
        }
        let log = st.logs.get_mut(&log_id).expect("inserted above");
        let mut term = log.last_term();
        for (expected, e) in (log.last_index() + 1..).zip(entries) {
            if e.index != expected || e.term < term {
                return Err(Error::InvalidAppend {
                    log_id,
                    expected_index: expected,
                    index: e.index,
                });
            }
            term = e.term;
        }
        for e in entries {
            let seq = st.next_seq;
            st.next_seq += 1;
            log.push(
                e.index,
                e.term,
                Slot::new(Loc::Pending { seq }, e.payload.len() as u32),
            );
            log.cache.push_back(Cached {
                index: e.index,
                seq,
                payload: e.payload.clone(),
            });
            st.fifo.push_back((log_id, e.index, seq));
            st.pending.push(Op {
                seq,
                kind: RecordKind::Append,
                log_id,
                index: e.index,
                term: e.term,
                payload: e.payload.clone(),
                lazy: false,
            });
        }
        st.cache_bytes += bytes;
        st.pending_bytes += bytes;
        st.evict(self.shared.config.cache_bytes_max);
        drop(guard);
        self.shared
            .counters
            .appends
            .fetch_add(entries.len() as u64, Ordering::Relaxed);
        if wake_writer {
            self.shared.wake_writer();
        }
        Ok(())
    }

    /// Like [`Store::append`], but waits (blocking the thread) while the WAL writer is behind.
    /// For threads that are not async tasks: tests, benches, tools.
    pub fn append_blocking(&self, log_id: u64, entries: &[Entry]) -> Result<()> {
        self.append_blocking_waking(log_id, entries, true)
    }

    /// [`Store::append_blocking`] without waking the WAL writer: for a Raft loop that asks for
    /// a sync ([`Store::sync_then`], [`Store::sync`]) once its round's appends and hard states
    /// are all queued. Woken at the first of them, the writer would take the round in pieces,
    /// a sync each, and meet the loop's thread on the store's lock meanwhile.
    pub fn append_blocking_for_sync(&self, log_id: u64, entries: &[Entry]) -> Result<()> {
        self.append_blocking_waking(log_id, entries, false)
    }

    fn append_blocking_waking(&self, log_id: u64, entries: &[Entry], wake: bool) -> Result<()> {
        loop {
            match self.queue_append(log_id, entries, wake) {
                Err(Error::Backpressure) => {
                    // What fills the queue may all have been queued without a wake-up.
                    self.shared.wake_writer();
                    let st = self.shared.lock();
                    if !st.has_room() && st.poisoned.is_none() && !st.shutdown {
                        drop(self.shared.room_cv.wait(st));
                    }
                }
                other => return other,
            }
        }
    }

    /// Resolves when the pending queue has room again (after [`Error::Backpressure`]), or
    /// when the engine is poisoned or closed (the next call then says so). Runtime-agnostic.
    pub fn ready(&self) -> Ready<'_> {
        Ready { store: self }
    }

    fn control_op(&self, st: &State) -> Result<()> {
        st.check_writable()?;
        if st.pending.len() >= PENDING_ENTRIES_MAX + PENDING_CONTROL_MAX {
            return Err(Error::Backpressure);
        }
        Ok(())
    }

    /// Drops entries from `from_index` on (a Raft conflict). Entries below stay; the next append
    /// must be at `from_index`.
    pub fn truncate(&self, log_id: u64, from_index: u64) -> Result<()> {
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        self.control_op(st)?;
        let log = st.logs.get_mut(&log_id).ok_or(Error::NoSuchLog(log_id))?;
        if from_index < log.first_index {
            return Err(Error::OutOfRange {
                log_id,
                index: from_index,
            });
        }
        if from_index > log.last_index() {
            return Ok(());
        }
        let freed = log.truncate_from(from_index);
        st.cache_bytes -= freed;
        st.push_op(RecordKind::Truncate, log_id, from_index, 0, Bytes::new());
        drop(guard);
        self.shared.wake_writer();
        Ok(())
    }

    /// Releases one entry (consumed and acknowledged, perhaps out of order): it is never read
    /// again, never copied to a segment if still in the WAL, and segments holding only released
    /// entries are deleted. Releasing twice, or below the first index, does nothing.
    pub fn release(&self, log_id: u64, index: u64) -> Result<()> {
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        self.control_op(st)?;
        let log = st.logs.get_mut(&log_id).ok_or(Error::NoSuchLog(log_id))?;
        if index > log.last_index() {
            return Err(Error::OutOfRange { log_id, index });
        }
        let Some(freed) = log.release(index) else {
            return Ok(());
        };
        st.cache_bytes -= freed;
        st.gc_requested = true;
        st.push_op(RecordKind::Release, log_id, index, 0, Bytes::new());
        drop(guard);
        self.shared.wake_writer();
        Ok(())
    }

    /// Releases every entry up to `index` and keeps `snapshot` (the caller's state at that
    /// index, e.g. a Raft snapshot or a queue's counters). `term` is the term of `index`. An
    /// `index` beyond the last entry empties the log and moves it there (Raft snapshot install).
    pub fn release_prefix(
        &self,
        log_id: u64,
        index: u64,
        term: u64,
        snapshot: Bytes,
    ) -> Result<()> {
        if snapshot.len() > crate::config::SNAPSHOT_BYTES_MAX {
            return Err(Error::TooLarge {
                what: "snapshot",
                bytes: snapshot.len(),
                max: SNAPSHOT_BYTES_MAX,
            });
        }
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        self.control_op(st)?;
        let log = st.log_or_new(log_id)?;
        if index < log.snapshot.index {
            return Ok(());
        }
        if let Some(known) = log.term_of(index) {
            if known != term {
                return Err(Error::InvalidAppend {
                    log_id,
                    expected_index: index,
                    index,
                });
            }
        }
        let freed = log.release_prefix(index, term, snapshot.clone());
        st.cache_bytes -= freed;
        st.gc_requested = true;
        st.push_op(RecordKind::ReleasePrefix, log_id, index, term, snapshot);
        drop(guard);
        self.shared.wake_writer();
        Ok(())
    }

    /// Sets the log's Raft hard state; durable with the next WAL sync (like appends queued before
    /// it), so [`Store::sync`] or the durability listener of a later append says when. Creates
    /// the log if it does not exist (a group that voted before it had any entry).
    pub fn set_hard_state(&self, log_id: u64, hard_state: HardState) -> Result<()> {
        self.queue_hard_state(log_id, hard_state, true)
    }

    /// [`Store::set_hard_state`] without waking the WAL writer, as
    /// [`Store::append_blocking_for_sync`].
    pub fn set_hard_state_for_sync(&self, log_id: u64, hard_state: HardState) -> Result<()> {
        self.queue_hard_state(log_id, hard_state, false)
    }

    fn queue_hard_state(
        &self,
        log_id: u64,
        hard_state: HardState,
        wake_writer: bool,
    ) -> Result<()> {
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        self.control_op(st)?;
        let log = st.log_or_new(log_id)?;
        if log.hard_state == hard_state {
            return Ok(());
        }
        // Only the commit index moved: Raft learns it again from the leader after a crash, so
        // it need not cost a sync of its own (half of a replicated queue's records).
        let commit_only = log.hard_state.term == hard_state.term
            && log.hard_state.vote == hard_state.vote
            && log.hard_state != HardState::default();
        log.hard_state = hard_state;
        let vote = Bytes::copy_from_slice(&hard_state.vote.to_le_bytes());
        let (kind, commit, term) = (RecordKind::HardState, hard_state.commit, hard_state.term);
        if commit_only {
            st.push_lazy_op(kind, log_id, commit, term, vote);
        } else {
            st.push_op(kind, log_id, commit, term, vote);
        }
        drop(guard);
        if wake_writer {
            self.shared.wake_writer();
        }
        Ok(())
    }

    /// The log's Raft hard state as last set (durable or not), if the log exists.
    pub fn hard_state(&self, log_id: u64) -> Option<HardState> {
        let st = self.shared.lock();
        st.logs.get(&log_id).map(|log| log.hard_state)
    }

    /// Deletes a log and, at the next checkpoint, its segment files.
    pub fn delete_log(&self, log_id: u64) -> Result<()> {
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        self.control_op(st)?;
        let Some(log) = st.logs.remove(&log_id) else {
            return Ok(());
        };
        st.cache_bytes -= log.cache.iter().map(|c| c.payload.len()).sum::<usize>();
        st.dead_segments
            .extend(log.segments.keys().map(|id| (log_id, *id)));
        st.gc_requested = true;
        st.push_op(RecordKind::DeleteLog, log_id, 0, 0, Bytes::new());
        drop(guard);
        self.shared.wake_writer();
        Ok(())
    }

    /// The term of entry `index`, also for the snapshot index; `None` outside the log.
    pub fn term(&self, log_id: u64, index: u64) -> Option<u64> {
        self.shared.lock().logs.get(&log_id)?.term_of(index)
    }

    /// What the store holds for `log_id`.
    pub fn log_info(&self, log_id: u64) -> Option<LogInfo> {
        self.shared.lock().log_info(log_id)
    }

    /// Every log's info, by log id.
    pub fn logs(&self) -> Vec<LogInfo> {
        let st = self.shared.lock();
        let mut out: Vec<LogInfo> = st.logs.keys().filter_map(|id| st.log_info(*id)).collect();
        out.sort_by_key(|i| i.log_id);
        out
    }

    /// The snapshot of the last prefix release.
    pub fn snapshot(&self, log_id: u64) -> Option<Snapshot> {
        let st = self.shared.lock();
        let log = st.logs.get(&log_id)?;
        (log.snapshot.index > 0).then(|| Snapshot {
            index: log.snapshot.index,
            term: log.snapshot.term,
            blob: log.snapshot.blob.clone(),
        })
    }

    /// Indexes of entries not released, from `from` on, at most `max` of them: how a recovering
    /// queue rebuilds its message list page by page.
    pub fn live_indexes(&self, log_id: u64, from: u64, max: usize) -> Vec<u64> {
        self.live_entries(log_id, from, max)
            .into_iter()
            .map(|(index, _)| index)
            .collect()
    }

    /// Like [`Store::live_indexes`], with each entry's payload length: what a recovering
    /// queue needs to account for a backlog it leaves on disk.
    pub fn live_entries(&self, log_id: u64, from: u64, max: usize) -> Vec<(u64, u32)> {
        let st = self.shared.lock();
        let Some(log) = st.logs.get(&log_id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut index = from.max(log.first_index);
        while index <= log.last_index() && out.len() < max {
            let slot = log.slot(index).expect("in range");
            if !slot.released() {
                out.push((index, slot.len));
            }
            index += 1;
        }
        out
    }

    /// Blocks until everything submitted before the call is durable.
    pub fn sync(&self) -> Result<()> {
        let mut st = self.shared.lock();
        let target = st.next_seq - 1;
        if st.synced_seq < target && st.sync_target < target {
            st.sync_target = target;
            self.shared.wake_writer();
        }
        loop {
            if let Some(why) = &st.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
            if st.synced_seq >= target {
                return Ok(());
            }
            if st.shutdown {
                return Err(Error::Closed);
            }
            st = self.shared.synced_cv.wait(st);
        }
    }

    /// Calls `done` once everything submitted before the call is durable (from the WAL
    /// writer's thread, or from this one when it is already), or with why it never will be. For
    /// a caller that must not block, such as the queue groups' loop.
    pub fn sync_then(&self, done: SyncDone) {
        self.ask_sync(done, false)
    }

    /// [`Store::sync_then`] for a caller whose records are one batch already and who is not
    /// streaming, such as the queue groups' loop at a low rate: the writer syncs them without
    /// letting [`crate::Config::commit_window_us`] pass first. A few records from several
    /// queues arriving during one sync look like a stream to the writer, and the window would
    /// then add up to its length to every publish's latency for no batching gained. (A window
    /// the writer already waits out, begun for a stream, is not cut short.)
    pub fn sync_now_then(&self, done: SyncDone) {
        self.ask_sync(done, true)
    }

    fn ask_sync(&self, done: SyncDone, now: bool) {
        let mut st = self.shared.lock();
        if st.poisoned.is_some() || st.shutdown {
            let why = sync_waiters::stopped(st.poisoned.as_ref());
            drop(st);
            return done(Err(why));
        }
        let target = st.next_seq - 1;
        if st.synced_seq >= target {
            drop(st);
            return done(Ok(()));
        }
        if now {
            st.sync_now_target = target;
        }
        if st.sync_target < target {
            st.sync_target = target;
            self.shared.wake_writer();
        }
        st.sync_waiters.push(target, done);
    }

    /// Asks the WAL writer to roll over to a new file now (as if the size limit were reached),
    /// handing the current one to the segment writer.
    pub fn roll_wal(&self) {
        let mut st = self.shared.lock();
        st.roll_requested = true;
        st.roll_after_seq = st.next_seq - 1;
        drop(st);
        self.shared.wake_writer();
    }

    /// Asks the segment writer for a pass of deletion of released segments, compaction and
    /// checkpoint now rather than at its next interval.
    pub fn compact(&self) {
        self.shared.lock().gc_forced = true;
        self.shared.segment_writer_cv.notify_one();
    }

    /// Whether the WAL writer is waiting for disk space (a write failed with ENOSPC): appends
    /// are refused with [`Error::DiskFull`] until a retry succeeds. What was appended before
    /// stays pending and becomes durable then; nothing is dropped.
    pub fn is_disk_full(&self) -> bool {
        self.shared.lock().disk_full
    }

    /// Blocks until the WAL writer and segment writer have nothing left to do: everything
    /// submitted is durable, asked rollovers done, rolled WAL files flushed, asked compaction
    /// done. For tests, tools and orderly shutdown.
    pub fn wait_idle(&self) -> Result<()> {
        self.sync()?;
        let mut st = self.shared.lock();
        loop {
            if let Some(why) = &st.poisoned {
                return Err(Error::Poisoned(why.clone()));
            }
            let idle = !st.roll_requested
                && st.pending.is_empty()
                && st.flush_queue.is_empty()
                && !st.gc_forced
                && !st.segment_writer_busy;
            if idle {
                return Ok(());
            }
            st = self
                .shared
                .idle_cv
                .wait_timeout(st, std::time::Duration::from_millis(50))
                .0;
        }
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let st = self.shared.lock();
        Stats {
            appends: c.appends.load(Ordering::Relaxed),
            wal_syncs: c.wal_syncs.load(Ordering::Relaxed),
            wal_bytes: c.wal_bytes.load(Ordering::Relaxed),
            segment_bytes: c.segment_bytes.load(Ordering::Relaxed),
            wal_files_flushed: c.wal_files_flushed.load(Ordering::Relaxed),
            wal_files_recycled: c.wal_files_recycled.load(Ordering::Relaxed),
            segments_deleted: c.segments_deleted.load(Ordering::Relaxed),
            segments_compacted: c.segments_compacted.load(Ordering::Relaxed),
            wal_files_adopted: c.wal_files_adopted.load(Ordering::Relaxed),
            adopted_index_bytes: c.adopted_index_bytes.load(Ordering::Relaxed),
            adopted_files_deleted: c.adopted_files_deleted.load(Ordering::Relaxed),
            adopted_files_compacted: c.adopted_files_compacted.load(Ordering::Relaxed),
            checkpoint_bytes: c.checkpoint_bytes.load(Ordering::Relaxed),
            cache_bytes: st.cache_bytes as u64,
            pending_records: st.pending.len() as u64,
        }
    }
}

impl Drop for Store {
    /// Writes and syncs everything pending, lets the segment writer finish its current job,
    /// and stops both threads. Rolled WAL files not yet flushed are flushed at the next open.
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.writer_cv.notify_all();
        self.shared.segment_writer_cv.notify_all();
        self.shared.room_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The future returned by [`Store::ready`].
pub struct Ready<'a> {
    store: &'a Store,
}

impl Future for Ready<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.store.shared.lock();
        if (st.has_room() && !st.disk_full) || st.poisoned.is_some() || st.shutdown {
            return Poll::Ready(());
        }
        if !st.room_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.room_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

// The broker shares one `Store` between all its tasks and threads.
const _: fn() = || {
    fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<Store>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    struct Quiet;
    impl DurabilityListener for Quiet {
        fn on_durable(&self, _log_id: u64, _durable_index: u64) {}
    }

    #[test]
    fn only_records_nobody_waits_for_let_the_writer_wait() {
        let dir = std::env::temp_dir().join(format!("warren-store-lazy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = Config::new(&dir);
        let faults = config.faults.clone();
        let (store, _) = Store::open(config, Arc::new(Quiet)).unwrap();
        let hs = |commit| HardState {
            term: 2,
            vote: 1,
            commit,
        };
        store.set_hard_state(7, hs(1)).unwrap();
        store.sync().unwrap();
        // Held, the writer takes nothing: what is pending stays for the checks below.
        faults.hold_writer.store(true, Ordering::Relaxed);
        store.set_hard_state(7, hs(2)).unwrap();
        assert!(
            !crate::wal::must_write(&store.shared.lock()),
            "a commit index alone"
        );
        let entry = Entry {
            index: 1,
            term: 2,
            payload: Bytes::from_static(b"m"),
        };
        store.append(7, &[entry]).unwrap();
        assert!(crate::wal::must_write(&store.shared.lock()), "an append");
        faults.hold_writer.store(false, Ordering::Relaxed);
        store.sync().unwrap();
        faults.hold_writer.store(true, Ordering::Relaxed);
        store.set_hard_state(7, hs(3)).unwrap();
        let last = store.shared.lock().next_seq - 1;
        store.shared.lock().sync_target = last - 1;
        assert!(
            !crate::wal::must_write(&store.shared.lock()),
            "a sync of earlier records"
        );
        store.shared.lock().sync_target = last;
        assert!(
            crate::wal::must_write(&store.shared.lock()),
            "a sync waits for it"
        );
        faults.hold_writer.store(false, Ordering::Relaxed);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
