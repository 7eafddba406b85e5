//! A Raft group's log on the node's storage engine: entries in a log of the shared WAL (one
//! fsync covers every group's writes), the hard state as the engine's hard-state record, and
//! the latest snapshot in a file of its own (a snapshot of the whole topology can be megabytes,
//! too large to rewrite with every checkpoint of the engine).

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use warren_store::Store;

/// What raft-rs reads through [`raft::Storage`]; writes go through [`RaftLog::append`] and
/// friends, called by the group's loop between `ready` and `advance`.
pub struct RaftLog {
    store: Arc<Store>,
    log_id: u64,
    file: Arc<SnapshotFile>,
    /// The latest snapshot (data and metadata) on disk, as far as raft-rs is concerned: one
    /// being written off the loop counts once [`RaftLog::snapshot_saved`] says so.
    snapshot: Mutex<Snapshot>,
    /// The membership as of the snapshot, or the founding voters without one: where raft-rs
    /// starts; later membership changes come back from the log as it is replayed.
    conf_state: ConfState,
    /// Entries appended and not applied yet, in index order: raft-rs reads them back to apply
    /// them (and to send them to a follower once persisted), and kept here they are neither
    /// read from the store nor parsed again (TiKV's entry cache). Emptied as they are
    /// applied, so an idle group holds none; bounded for a member that applies late.
    cache: Mutex<std::collections::VecDeque<Entry>>,
    /// Whether a snapshot sent to a follower carries the entries kept below it (a quorum
    /// queue's: see [`crate::snapshot_transfer`]), and up to how many bytes of them: past
    /// that it names them for the follower to fetch ([`crate::catch_up`]).
    carries_entries: Option<usize>,
    /// A leader's snapshot being installed while its entries are fetched (written to the
    /// [`crate::catch_up::RESTORING`] file first).
    restoring: Mutex<Option<Restoring>>,
}

/// A snapshot whose entries `first..=index` are being fetched into the log.
#[derive(Debug, Clone)]
pub struct Restoring {
    pub first: u64,
    pub prev_term: u64,
    pub snapshot: Snapshot,
}

impl Restoring {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&self.prev_term.to_le_bytes());
        out.extend_from_slice(&self.snapshot.write_to_bytes().expect("snapshots serialise"));
        out
    }

    fn decode(bytes: &[u8]) -> Result<Restoring, String> {
        if bytes.len() < 16 {
            return Err("a short restoring file".into());
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Ok(Restoring {
            first: u64_at(0),
            prev_term: u64_at(8),
            snapshot: Snapshot::parse_from_bytes(&bytes[16..]).map_err(|e| e.to_string())?,
        })
    }
}

/// Most entries a group's cache holds (a member far behind reads the rest from the store).
const CACHE_ENTRIES_MAX: usize = 4096;

fn storage_error(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

impl RaftLog {
    /// Opens the group's log; `founders` is the membership of a group that has no snapshot yet.
    pub fn open(
        store: Arc<Store>,
        log_id: u64,
        dir: &Path,
        founders: &[u64],
    ) -> Result<RaftLog, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let snapshot_path = dir.join("snapshot");
        let mut snapshot = match std::fs::read(&snapshot_path) {
            Ok(bytes) => Snapshot::parse_from_bytes(&bytes)
                .map_err(|e| format!("{}: {e}", snapshot_path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Snapshot::default(),
            Err(e) => return Err(format!("{}: {e}", snapshot_path.display())),
        };
        let restoring = resume_restoring(&store, log_id, dir, &mut snapshot)?;
        let conf_state = if snapshot.get_metadata().index > 0 {
            snapshot.get_metadata().get_conf_state().clone()
        } else {
            ConfState::from((founders.to_vec(), vec![]))
        };
        let file = Arc::new(SnapshotFile {
            on_disk: Mutex::new(Some(snapshot.get_metadata().index)),
            path: snapshot_path,
        });
        Ok(RaftLog {
            store,
            log_id,
            file,
            snapshot: Mutex::new(snapshot),
            conf_state,
            cache: Mutex::new(std::collections::VecDeque::new()),
            carries_entries: None,
            restoring: Mutex::new(restoring),
        })
    }

    /// Snapshots sent from this log carry the entries it keeps below them, up to `max_bytes`
    /// (past that, they name them to fetch), and snapshots installed in it bring theirs.
    pub fn carrying_entries(mut self, max_bytes: usize) -> RaftLog {
        self.carries_entries = Some(max_bytes);
        self
    }

    /// The snapshot whose entries are being fetched, if any: a group opened with one was
    /// interrupted installing it, and fetches them again before it takes part.
    pub fn restoring(&self) -> Option<Restoring> {
        self.restoring.lock().expect("restoring lock").clone()
    }

    /// Begins installing a leader's snapshot whose entries are to be fetched: keeps it in the
    /// restoring file (durably: a crash from here on resumes the fetch), then empties the log
    /// and starts it where the entries begin. `None` if the snapshot carries its entries.
    pub fn begin_restore(&self, snapshot: &Snapshot) -> Result<Option<Restoring>, String> {
        let carried = crate::snapshot_transfer::Carried::decode(&snapshot.data)?;
        let Some((first, last)) = carried.fetch else {
            return Ok(None);
        };
        if last != snapshot.get_metadata().index || first == 0 {
            return Err(format!(
                "a snapshot at {} names entries {first}..={last}",
                snapshot.get_metadata().index
            ));
        }
        let mut plain = snapshot.clone();
        plain.data = carried.machine.into();
        let restoring = Restoring {
            first,
            prev_term: carried.prev_term,
            snapshot: plain,
        };
        write_atomically(&self.restoring_path(), &restoring.encode())
            .map_err(|e| format!("{}: {e}", self.restoring_path().display()))?;
        self.cache.lock().expect("cache lock").clear();
        start_log_at(&self.store, self.log_id, first, carried.prev_term)?;
        *self.restoring.lock().expect("restoring lock") = Some(restoring.clone());
        Ok(Some(restoring))
    }

    /// The entries of the snapshot being restored are in the log: the snapshot becomes the
    /// latest, durably, with them below it. Returns the state machine's part.
    pub fn finish_restore(&self) -> Result<Vec<u8>, String> {
        let Some(r) = self.restoring() else {
            return Err("no snapshot is being restored".into());
        };
        let meta = r.snapshot.get_metadata();
        let err = |e: warren_store::Error| e.to_string();
        let descriptor = descriptor(meta.index, meta.term);
        if self.store.term(self.log_id, meta.index) != Some(meta.term) {
            // Every entry asked for was released where it was fetched from (settled).
            self.store
                .release_prefix(self.log_id, meta.index, meta.term, descriptor)
                .map_err(err)?;
        }
        // The entries first: the snapshot on disk then always has its entries below it.
        self.store.sync().map_err(err)?;
        self.save_snapshot_releasing(&r.snapshot, 0)?;
        *self.restoring.lock().expect("restoring lock") = None;
        match std::fs::remove_file(self.restoring_path()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", self.restoring_path().display())),
        }
        Ok(r.snapshot.data.to_vec())
    }

    fn restoring_path(&self) -> PathBuf {
        self.file.path.with_file_name(crate::catch_up::RESTORING)
    }

    pub fn snapshot_meta(&self) -> (u64, u64) {
        let s = self.snapshot.lock().expect("snapshot lock");
        (s.get_metadata().index, s.get_metadata().term)
    }

    pub fn latest_snapshot(&self) -> Snapshot {
        self.snapshot.lock().expect("snapshot lock").clone()
    }

    pub fn term_of(&self, index: u64) -> Result<u64, String> {
        raft::Storage::term(self, index).map_err(|e| e.to_string())
    }

    /// Appends entries from a ready, first dropping any the leader overwrote.
    pub fn append(&self, entries: &[Entry]) -> Result<(), String> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        if let Some(info) = self.store.log_info(self.log_id) {
            if first.index <= info.last_index {
                self.store
                    .truncate(self.log_id, first.index)
                    .map_err(|e| e.to_string())?;
            }
        }
        let stored: Vec<warren_store::Entry> = entries
            .iter()
            .map(|e| warren_store::Entry {
                index: e.index,
                term: e.term,
                payload: crate::stored_entry::payload(e),
            })
            .collect();
        for chunk in stored.chunks(warren_store::config::APPEND_ENTRIES_MAX) {
            // The loop syncs at the end of its round: that wakes the WAL writer.
            self.store
                .append_blocking_for_sync(self.log_id, chunk)
                .map_err(|e| e.to_string())?;
        }
        let mut cache = self.cache.lock().expect("cache lock");
        while cache.back().is_some_and(|e| e.index >= first.index) {
            cache.pop_back();
        }
        if cache.back().is_some_and(|e| e.index + 1 != first.index) {
            cache.clear();
        }
        cache.extend(entries.iter().cloned());
        while cache.len() > CACHE_ENTRIES_MAX {
            cache.pop_front();
        }
        Ok(())
    }

    /// Entries up to `index` are applied: the cache lets them go.
    pub fn applied_to(&self, index: u64) {
        let mut cache = self.cache.lock().expect("cache lock");
        while cache.front().is_some_and(|e| e.index <= index) {
            cache.pop_front();
        }
    }

    /// Entries `low..high` from the cache, if it holds them all (at most `max` bytes, at
    /// least one entry, as raft-rs's storage contract has it).
    fn cached(&self, low: u64, high: u64, max: u64) -> Option<Vec<Entry>> {
        let cache = self.cache.lock().expect("cache lock");
        let first = cache.front()?.index;
        if low < first || high > cache.back()?.index + 1 {
            return None;
        }
        let mut out = Vec::with_capacity((high - low) as usize);
        let mut size = 0u64;
        for e in cache.range((low - first) as usize..(high - first) as usize) {
            size += u64::from(e.compute_size());
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e.clone());
        }
        Some(out)
    }

    pub fn set_hard_state(&self, hs: &HardState) -> Result<(), String> {
        self.store
            .set_hard_state_for_sync(
                self.log_id,
                warren_store::HardState {
                    term: hs.term,
                    vote: hs.vote,
                    commit: hs.commit,
                },
            )
            .map_err(|e| e.to_string())
    }

    /// Sets only the commit index of the hard state (after `advance`).
    pub fn set_commit(&self, commit: u64) -> Result<(), String> {
        let mut hs = self.store.hard_state(self.log_id).unwrap_or_default();
        if commit > hs.commit {
            hs.commit = commit;
            self.store
                .set_hard_state(self.log_id, hs)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Waits until everything written so far is durable.
    pub fn sync(&self) -> Result<(), String> {
        self.store.sync().map_err(|e| e.to_string())
    }

    /// Installs a snapshot a leader sent; returns the state machine's part to restore. The
    /// entries it carries replace this log below its index: the log then starts where the
    /// leader's does, with the bodies of the messages the snapshot names.
    pub fn install_snapshot(&self, snapshot: &Snapshot) -> Result<Vec<u8>, String> {
        let carried = crate::snapshot_transfer::Carried::decode(&snapshot.data)?;
        if carried.fetch.is_some() {
            // Fetched since `begin_restore`.
            return self.finish_restore();
        }
        let entries = carried.parsed()?;
        let meta = snapshot.get_metadata();
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            let mut plain = snapshot.clone();
            plain.data = carried.machine.clone().into();
            self.save_snapshot(&plain)?;
            return Ok(carried.machine);
        };
        if last.0 != meta.index {
            return Err(format!(
                "a snapshot at {} carries entries up to {}",
                meta.index, last.0
            ));
        }
        self.cache.lock().expect("cache lock").clear();
        let err = |e: warren_store::Error| e.to_string();
        start_log_at(&self.store, self.log_id, first.0, carried.prev_term)?;
        let stored: Vec<warren_store::Entry> = entries
            .into_iter()
            .map(|(index, term, payload)| warren_store::Entry {
                index,
                term,
                payload,
            })
            .collect();
        for chunk in stored.chunks(warren_store::config::APPEND_ENTRIES_MAX) {
            // The loop syncs at the end of its round: that wakes the WAL writer.
            self.store
                .append_blocking_for_sync(self.log_id, chunk)
                .map_err(err)?;
        }
        let mut plain = snapshot.clone();
        plain.data = carried.machine.clone().into();
        // The file only: the log below the snapshot is the entries just written.
        self.save_snapshot_releasing(&plain, 0)?;
        Ok(carried.machine)
    }

    /// The latest snapshot as a follower is sent it: with the entries kept below it.
    fn snapshot_to_send(&self) -> raft::Result<Snapshot> {
        let mut snapshot = self.latest_snapshot();
        let index = snapshot.get_metadata().index;
        let first = raft::Storage::first_index(self)?;
        let Some(max) = self.carries_entries.filter(|_| first <= index) else {
            return Ok(snapshot);
        };
        let prev_term = raft::Storage::term(self, first - 1)?;
        let stored = self.read_stored(first, index + 1, max)?;
        let carried = if stored.last().map(|e| e.index) == Some(index) {
            crate::snapshot_transfer::Carried {
                machine: snapshot.data.to_vec(),
                prev_term,
                entries: stored
                    .into_iter()
                    .map(crate::stored_entry::portable)
                    .collect(),
                fetch: None,
            }
        } else {
            crate::snapshot_transfer::Carried {
                machine: snapshot.data.to_vec(),
                prev_term,
                entries: Vec::new(),
                fetch: Some((first, index)),
            }
        };
        snapshot.data = carried.encode().into();
        Ok(snapshot)
    }

    /// The stored entries of `low..high`, contiguous, until `max_bytes` of them are gathered
    /// (at least one).
    fn read_stored(
        &self,
        low: u64,
        high: u64,
        max_bytes: usize,
    ) -> raft::Result<Vec<warren_store::Entry>> {
        let mut out = Vec::new();
        let mut from = low;
        let mut bytes = 0usize;
        while from < high && (bytes < max_bytes || out.is_empty()) {
            let got = self
                .store
                .read_range(
                    self.log_id,
                    from,
                    high,
                    max_bytes.saturating_sub(bytes).max(1),
                )
                .map_err(storage_error)?;
            if got.is_empty() {
                return Err(raft::Error::Store(StorageError::Unavailable));
            }
            for e in got {
                if e.index != from {
                    return Err(storage_error(format!("log gap at {from}")));
                }
                bytes += e.payload.len();
                out.push(e);
                from += 1;
            }
        }
        Ok(out)
    }

    /// Keeps `snapshot` as the latest (file first, atomically), then releases the log up to its
    /// index: entries behind a snapshot are never read again.
    pub fn save_snapshot(&self, snapshot: &Snapshot) -> Result<(), String> {
        // A leader's snapshot may replace a log whose tail the cache still holds.
        self.cache.lock().expect("cache lock").clear();
        self.save_snapshot_releasing(snapshot, snapshot.get_metadata().index)
    }

    /// Like [`RaftLog::save_snapshot`], but releases only up to `upto`: a queue's snapshot
    /// names messages whose bodies stay in the log entries that enqueued them.
    pub fn save_snapshot_releasing(&self, snapshot: &Snapshot, upto: u64) -> Result<(), String> {
        if self.file.write(snapshot)? {
            self.snapshot_saved(snapshot, upto)?;
        }
        Ok(())
    }

    /// The file the group's snapshots go to, for a writer off the loop.
    pub fn snapshot_file(&self) -> Arc<SnapshotFile> {
        self.file.clone()
    }

    /// `snapshot` is durable in the file (written off the loop): it becomes the latest, and
    /// the log up to `upto` goes. An older one than the latest (a leader's snapshot was
    /// installed meanwhile) changes nothing.
    pub fn snapshot_saved(&self, snapshot: &Snapshot, upto: u64) -> Result<(), String> {
        let meta = snapshot.get_metadata();
        {
            let mut latest = self.snapshot.lock().expect("snapshot lock");
            if meta.index < latest.get_metadata().index {
                return Ok(());
            }
            *latest = snapshot.clone();
        }
        let upto = upto.min(meta.index);
        if upto == 0 {
            return Ok(());
        }
        let term = if upto == meta.index {
            meta.term
        } else {
            match self.store.term(self.log_id, upto) {
                Some(term) => term,
                // Released already.
                None => return Ok(()),
            }
        };
        self.store
            .release_prefix(self.log_id, upto, term, descriptor(meta.index, meta.term))
            .map_err(|e| e.to_string())
    }
}

/// What the store keeps with a released prefix: the snapshot's index and term.
fn descriptor(index: u64, term: u64) -> bytes::Bytes {
    let mut out = Vec::with_capacity(16);
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(&term.to_le_bytes());
    out.into()
}

/// Empties the log and starts it at `first` (after `prev_term`): whatever this member had is
/// replaced by a leader's entries, and some of it may conflict with them.
fn start_log_at(store: &Store, log_id: u64, first: u64, prev_term: u64) -> Result<(), String> {
    let err = |e: warren_store::Error| e.to_string();
    if let Some(info) = store.log_info(log_id) {
        if info.last_index >= info.first_index {
            store.truncate(log_id, info.first_index).map_err(err)?;
        }
    }
    store
        .release_prefix(log_id, first - 1, prev_term, bytes::Bytes::new())
        .map_err(err)
}

/// At open: a restoring file left by a crash mid-fetch. If its snapshot made it to disk, the
/// install finished and the file goes; otherwise the snapshot becomes the log's latest (in
/// memory) with its entries to fetch again, and the hard state's commit moves up to it (a
/// snapshot is of committed entries; raft-rs wants the commit within the log).
fn resume_restoring(
    store: &Store,
    log_id: u64,
    dir: &Path,
    snapshot: &mut Snapshot,
) -> Result<Option<Restoring>, String> {
    let path = dir.join(crate::catch_up::RESTORING);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let r = Restoring::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = r.snapshot.get_metadata();
    if snapshot.get_metadata().index >= meta.index {
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(None);
    }
    start_log_at(store, log_id, r.first, r.prev_term)?;
    let mut hs = store.hard_state(log_id).unwrap_or_default();
    hs.commit = hs.commit.max(meta.index);
    if meta.term > hs.term {
        hs.term = meta.term;
        hs.vote = 0;
    }
    store
        .set_hard_state(log_id, hs)
        .map_err(|e| e.to_string())?;
    *snapshot = r.snapshot.clone();
    Ok(Some(r))
}

/// A group's snapshot file. Written from the loop (an installed snapshot) and from the
/// snapshot writer (one the group took), so each write checks under the lock that the file
/// does not hold a later snapshot already, and none is written once the group closed.
pub struct SnapshotFile {
    path: PathBuf,
    /// The index of the snapshot on disk; `None` once the group closed.
    on_disk: Mutex<Option<u64>>,
}

impl SnapshotFile {
    /// Writes `snapshot` (file, fsync, rename, directory fsync); false if the file holds a
    /// later one or the group closed, and nothing was written.
    pub fn write(&self, snapshot: &Snapshot) -> Result<bool, String> {
        let index = snapshot.get_metadata().index;
        let mut on_disk = self.on_disk.lock().expect("snapshot file lock");
        match *on_disk {
            Some(current) if current <= index => {}
            _ => return Ok(false),
        }
        let bytes = snapshot.write_to_bytes().map_err(|e| e.to_string())?;
        write_atomically(&self.path, &bytes)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        *on_disk = Some(index);
        Ok(true)
    }

    /// The group closed (its files are about to go): no write from now on.
    pub fn close(&self) {
        *self.on_disk.lock().expect("snapshot file lock") = None;
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl raft::Storage for RaftLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let hs = self.store.hard_state(self.log_id).unwrap_or_default();
        let hard_state = HardState {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
            ..Default::default()
        };
        Ok(RaftState::new(hard_state, self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < raft::Storage::first_index(self)? {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let max_size = max_size.into().unwrap_or(u64::MAX);
        if let Some(entries) = self.cached(low, high, max_size) {
            return Ok(entries);
        }
        let max = max_size.min(usize::MAX as u64) as usize;
        self.read_stored(low, high, max)?
            .iter()
            .map(|e| crate::stored_entry::entry(e.index, e.term, &e.payload).map_err(storage_error))
            .collect()
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let (snap_index, snap_term) = self.snapshot_meta();
        if idx == snap_index {
            return Ok(snap_term);
        }
        if idx == 0 {
            return Ok(0);
        }
        match self.store.term(self.log_id, idx) {
            Some(term) => Ok(term),
            None if idx < snap_index => Err(raft::Error::Store(StorageError::Compacted)),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    /// The first entry the store still holds, which may be behind the snapshot: a quorum
    /// queue's snapshot releases the log only up to its oldest live message, whose body is in
    /// its entry. A follower behind the snapshot then catches up from those entries rather
    /// than from the snapshot, whose live messages' bodies it would not have.
    fn first_index(&self) -> raft::Result<u64> {
        let (snap_index, _) = self.snapshot_meta();
        let stored = self
            .store
            .log_info(self.log_id)
            .map(|i| i.first_index)
            .filter(|first| (1..=snap_index).contains(first));
        Ok(stored.unwrap_or(snap_index + 1))
    }

    fn last_index(&self) -> raft::Result<u64> {
        let (snap_index, _) = self.snapshot_meta();
        Ok(self
            .store
            .log_info(self.log_id)
            .map(|i| i.last_index)
            .unwrap_or(0)
            .max(snap_index))
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        self.snapshot_to_send()
    }
}

/// The data of the entry at `index` of a group's log in `store` (a quorum queue member reads
/// a message's body from its own copy of the log this way); `None` if released or unreadable.
pub fn read_entry_data(store: &Store, log_id: u64, index: u64) -> Option<bytes::Bytes> {
    let stored = store.read(log_id, index).ok()??;
    let mut entry = crate::stored_entry::entry(stored.index, stored.term, &stored.payload).ok()?;
    Some(entry.take_data())
}
