//! Recovery: rebuilds every log from the checkpoint, the segment indexes and the WAL files.
//!
//! 1. Read the checkpoint: for each log its range, terms, snapshot, segments and adopted WAL
//!    files, and which entries are live in them.
//! 2. Read the index area of each segment it names (32 bytes per entry, no payload), and the
//!    sidecar of each adopted WAL file it names (8 bytes per entry), pointing live entries at
//!    their records. The live entries found must be as many as the checkpoint says. Segment
//!    files, WAL files up to `wal_flushed_seq` and sidecars it does not name are leftovers of a
//!    crash or of deleted logs, and are deleted.
//! 3. Replay every WAL file newer than the checkpoint's `wal_flushed_seq`, in order, batch by
//!    batch, verifying each record's checksum and each batch's end (`wal_reader`). The first
//!    torn or corrupt record, or batch nothing vouches for, ends the file: the file is truncated
//!    there, so that nothing after it is ever handed out. Settled WAL files still there, and
//!    spare ones, become the spares to recycle.
//! 4. Hand the replayed WAL files to the segment writer and start a new WAL file.
//!
//! Cost: payloads are never read (only segment indexes, sidecars and WAL files younger than the
//! last flush), so the work is proportional to the number of entries plus at most a few WAL
//! files.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::sync::Arc;
use std::time::Instant;

use crate::adopted::{self, AdoptedFile};
use crate::checkpoint::{self, LogCheckpoint};
use crate::config::{Config, WAL_SPARE_FILES_MAX};
use crate::id_hash::IdMap;
use crate::log::{Loc, LogState, Slot, SnapshotMeta};
use crate::record::{RecordHeader, RecordKind, RECORD_HEADER_BYTES};
use crate::segment;
use crate::store::State;
use crate::wal::{self, WalFile, WAL_HEADER_BYTES};
use crate::wal_reader::WalReader;
use crate::{Error, Result};

pub(crate) struct Recovered {
    pub state: State,
    pub active: WalFile,
    /// Holds the exclusive lock on the meta directory for the engine's lifetime.
    pub lock: File,
}

const LOCK_FILE: &str = "LOCK";

/// Takes an exclusive, non-blocking flock on `meta/LOCK`: a second engine on the same
/// directories would interleave WAL writes and delete each other's files.
fn lock_dirs(config: &Config) -> Result<File> {
    use std::os::fd::AsRawFd;
    let path = config.meta_dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    // SAFETY: flock on a valid, owned file descriptor has no memory-safety requirement.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Err(Error::AlreadyOpen(path));
        }
        return Err(e.into());
    }
    Ok(file)
}

pub(crate) fn recover(config: &Config) -> Result<Recovered> {
    for dir in [&config.wal_dir, &config.segment_dir, &config.meta_dir] {
        fs::create_dir_all(dir)?;
    }
    let lock = lock_dirs(config)?;
    let mut state = State::new();
    let cp = checkpoint::read(&config.meta_dir)?.unwrap_or_default();
    state.wal_flushed_seq = cp.wal_flushed_seq;
    let mut named: HashMap<(u64, u32), ()> = HashMap::new();
    let mut by_log: IdMap<&LogCheckpoint> = IdMap::default();
    for log_cp in &cp.logs {
        let log = load_log(config, &mut state, log_cp)?;
        for (id, _) in &log_cp.segments {
            named.insert((log_cp.log_id, *id), ());
        }
        state.logs.insert(log_cp.log_id, log);
        by_log.insert(log_cp.log_id, log_cp);
    }
    for (seq, entries) in &cp.adopted {
        load_adopted(config, &mut state, &by_log, *seq, *entries)?;
    }
    for log_cp in &cp.logs {
        let log = state.logs.get_mut(&log_cp.log_id).expect("loaded above");
        log.live_count = log.slots.iter().filter(|s| !s.released()).count() as u64;
        if log.live_count != log_cp.live_count() {
            return Err(Error::Corrupt(format!(
                "log {}: {} live entries expected in segments and adopted WAL files, {} found",
                log_cp.log_id,
                log_cp.live_count(),
                log.live_count
            )));
        }
    }
    let adopted_seqs: HashSet<u64> = cp.adopted.iter().map(|a| a.0).collect();
    if !adopted_seqs.is_empty() {
        // Count what is live in them, and delete the ones emptied before the crash.
        state.gc_requested = true;
    }
    for entry in fs::read_dir(&config.segment_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(key) = name.to_str().and_then(segment::parse_segment_name) {
            if !named.contains_key(&key) {
                fs::remove_file(entry.path())?;
            }
        }
    }

    let mut seqs: Vec<u64> = Vec::new();
    for entry in fs::read_dir(&config.wal_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_str();
        if let Some(seq) = name.and_then(wal::parse_wal_name) {
            if adopted_seqs.contains(&seq) {
                continue;
            }
            if seq <= cp.wal_flushed_seq {
                // Settled before the crash, and not yet retired.
                keep_spare_or_remove(
                    &mut state,
                    entry.path(),
                    wal::spare_path(&config.wal_dir, seq),
                    seq,
                )?;
            } else {
                seqs.push(seq);
            }
        } else if let Some(seq) = name.and_then(wal::parse_spare_name) {
            keep_spare_or_remove(&mut state, entry.path(), entry.path(), seq)?;
        } else if let Some(seq) = name.and_then(adopted::parse_sidecar_name) {
            // A sidecar not named: its file was flushed or emptied, or its adoption never
            // reached a checkpoint (the file is replayed and settled again).
            if !adopted_seqs.contains(&seq) {
                fs::remove_file(entry.path())?;
            }
        }
    }
    seqs.sort_unstable();
    let mut last_seq = cp.wal_flushed_seq;
    for (n, seq) in seqs.iter().enumerate() {
        let is_last = n + 1 == seqs.len();
        let path = wal::wal_path(&config.wal_dir, *seq);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        if !replay(&mut state, &file, *seq)? {
            if is_last {
                // Torn while being created, or recycled: it holds nothing durable.
                drop(file);
                fs::remove_file(&path)?;
                continue;
            }
            return Err(Error::Corrupt(format!("WAL file {seq}: bad header")));
        }
        state.wal_files.insert(*seq, Arc::new(file));
        state.flush_queue.push_back(*seq);
        last_seq = *seq;
    }
    for log in state.logs.values_mut() {
        log.durable_index = log.last_index();
    }
    let (dir, seq) = (&config.wal_dir, last_seq + 1);
    let recycled = state
        .spare_wal
        .pop()
        .and_then(|old| wal::recycle(dir, seq, old));
    let active = match recycled {
        Some(active) => active,
        None => wal::create(dir, seq)?,
    };
    state.wal_files.insert(active.seq, active.file.clone());
    state.active_wal_seq = active.seq;
    Ok(Recovered {
        state,
        active,
        lock,
    })
}

fn has_header(file: &File, seq: u64) -> Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut h = [0u8; WAL_HEADER_BYTES as usize];
    match file.read_exact_at(&mut h, 0) {
        Ok(()) => Ok(wal::header_version(&h, seq).is_some()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Keeps the settled WAL file at `path` as spare `seq` (at `spare`) while the pool has room,
/// else deletes it.
fn keep_spare_or_remove(
    state: &mut State,
    path: std::path::PathBuf,
    spare: std::path::PathBuf,
    seq: u64,
) -> Result<()> {
    if state.spare_wal.len() < WAL_SPARE_FILES_MAX && fs::rename(&path, &spare).is_ok() {
        state.spare_wal.push(seq);
        return Ok(());
    }
    fs::remove_file(&path)?;
    Ok(())
}

fn load_log(config: &Config, state: &mut State, cp: &LogCheckpoint) -> Result<LogState> {
    let corrupt = |why: String| Error::Corrupt(format!("log {}: {why}", cp.log_id));
    let mut log = state.new_log(cp.log_id);
    log.first_index = cp.first_index;
    log.hard_state = cp.hard_state;
    log.snapshot = SnapshotMeta {
        index: cp.snapshot_index,
        term: cp.snapshot_term,
        blob: cp.snapshot_blob.clone(),
    };
    log.next_segment_id = cp.next_segment_id;
    if cp.last_index >= cp.first_index && cp.terms.first().map(|t| t.0) != Some(cp.first_index) {
        return Err(corrupt("term runs do not cover the log".into()));
    }
    log.terms = cp.terms.clone();
    let len = (cp.last_index + 1 - cp.first_index) as usize;
    log.slots = std::iter::repeat_n(Slot::released_at(0), len).collect();
    for (id, meta) in &cp.segments {
        if u64::from(*id) > crate::log::FILE_ID_MAX {
            return Err(corrupt(format!("segment id {id}")));
        }
        let file = segment::open(&config.segment_dir, cp.log_id, *id)
            .map_err(|e| corrupt(format!("segment {id}: {e}")))?;
        for e in segment::read_index(&file, cp.log_id, *id, meta.count)? {
            if e.index < cp.first_index || e.index > cp.last_index || !cp.is_settled_live(e.index) {
                continue;
            }
            // An older version of the entry (written before a truncation) has another term; the
            // current one is in this or a later segment, which overrides it.
            if log.term_of(e.index) != Some(e.term) {
                continue;
            }
            let payload_len = e.length as usize - RECORD_HEADER_BYTES;
            let slot = log.slot_mut(e.index).expect("within range");
            *slot = Slot::new(
                Loc::Segment {
                    id: *id,
                    offset: e.offset,
                },
                payload_len as u32,
            );
        }
        log.segments.insert(*id, *meta);
    }
    Ok(log)
}

/// Points the live entries of adopted WAL file `seq` at their records, from its sidecar (or,
/// when the sidecar is unusable, from the WAL file's own records, rewriting the sidecar), for
/// the logs whose checkpoint names the file.
fn load_adopted(
    config: &Config,
    state: &mut State,
    by_log: &IdMap<&LogCheckpoint>,
    seq: u64,
    entries: u64,
) -> Result<()> {
    let corrupt = |why: String| Error::Corrupt(format!("adopted WAL file {seq}: {why}"));
    if seq > crate::log::FILE_ID_MAX {
        return Err(corrupt("sequence out of range".into()));
    }
    let path = wal::wal_path(&config.wal_dir, seq);
    let file = OpenOptions::new()
        .read(true)
        .open(&path)
        .map_err(|e| corrupt(e.to_string()))?;
    if !has_header(&file, seq)? {
        return Err(corrupt("bad header".into()));
    }
    let wal_len = file.metadata()?.len();
    let (runs, sidecar_entries) = match adopted::read(&config.wal_dir, seq, entries, wal_len)? {
        Some(runs) => (runs, entries),
        None => {
            eprintln!(
                "warren-store: the index sidecar of adopted WAL file {seq} is missing or damaged; rebuilding it from the WAL file"
            );
            let runs = adopted::scan_wal(&file, seq)?;
            let count = runs.iter().map(|r| r.entries.len() as u64).sum();
            if let Err(e) = adopted::write_runs(&config.wal_dir, seq, &runs) {
                // Only a speed-up: the next open scans the WAL file again.
                eprintln!("warren-store: rewriting the sidecar of WAL file {seq}: {e}");
            }
            (runs, count)
        }
    };
    let mut ranges: IdMap<(u64, u64, u64)> = IdMap::default();
    for run in &runs {
        let Some(cp) = by_log.get(&run.log_id) else {
            continue; // a log deleted since
        };
        if cp.adopted.binary_search(&seq).is_err() {
            continue; // nothing live here, or entries of an earlier life of the log
        }
        let log = state
            .logs
            .get_mut(&run.log_id)
            .expect("loaded with its checkpoint");
        for (k, (offset, len)) in run.entries.iter().enumerate() {
            let index = run.first_index + k as u64;
            if index < cp.first_index || index > cp.last_index || !cp.is_settled_live(index) {
                continue;
            }
            // An older version of the entry (before a truncation) has another term.
            if log.term_of(index) != Some(run.term) {
                continue;
            }
            *log.slot_mut(index).expect("within range") = Slot::new(
                Loc::Wal {
                    seq,
                    offset: *offset,
                },
                *len,
            );
            let range = ranges
                .entry(run.log_id)
                .or_insert((log.generation, index, index));
            range.1 = range.1.min(index);
            range.2 = range.2.max(index);
        }
    }
    state.wal_files.insert(seq, Arc::new(file));
    state.adopted.insert(
        seq,
        AdoptedFile {
            file_bytes: wal_len,
            sidecar_entries,
            // Counted by the first collection pass.
            live_bytes: u64::MAX,
            live_entries: u64::MAX,
            logs: ranges,
            changed_at: Instant::now(),
        },
    );
    Ok(())
}

/// Replays WAL file `seq` into `state`, truncating the file where its valid records end, so
/// that nothing after them is ever handed out. False when its header is not that file's.
fn replay(state: &mut State, file: &File, seq: u64) -> Result<bool> {
    let Some(mut reader) = WalReader::open(file, seq)? else {
        return Ok(false);
    };
    while let Some(batch) = reader.next_batch()? {
        for r in batch {
            apply(state, &r.header, &r.payload, seq, r.offset as u32);
        }
    }
    let end = reader.end();
    if end < file.metadata()?.len() {
        // A version 3 file normally ends so: a recycled file's earlier life follows its records.
        if let (2, Some(why)) = (reader.version(), reader.stopped()) {
            eprintln!("warren-store: WAL file {seq}: {why} at offset {end}; truncating the tail");
        }
        file.set_len(end)?;
        file.sync_all()?;
    }
    Ok(true)
}

fn apply(state: &mut State, h: &RecordHeader, payload: &[u8], seq: u64, offset: u32) {
    match h.kind {
        RecordKind::Append => {
            if !state.logs.contains_key(&h.log_id) {
                let log = state.new_log(h.log_id);
                state.logs.insert(h.log_id, log);
            }
            let log = state.logs.get_mut(&h.log_id).expect("inserted above");
            if h.index < log.first_index {
                return;
            }
            log.truncate_from(h.index);
            let here = Loc::Wal { seq, offset }.pack();
            // Entries missing before this one were lost with an earlier corrupt record.
            while log.last_index() + 1 < h.index {
                let index = log.last_index() + 1;
                log.push(index, h.term, Slot::released_at(here));
            }
            log.push(h.index, h.term, Slot::new(Loc::Wal { seq, offset }, h.len));
            state.wal_touched.entry(seq).or_default().insert(h.log_id);
        }
        RecordKind::Truncate => {
            if let Some(log) = state.logs.get_mut(&h.log_id) {
                log.truncate_from(h.index);
            }
        }
        RecordKind::Release => {
            if let Some(log) = state.logs.get_mut(&h.log_id) {
                log.release(h.index);
            }
        }
        RecordKind::Padding | RecordKind::BatchEnd => {}
        RecordKind::HardState => {
            if !state.logs.contains_key(&h.log_id) {
                let log = state.new_log(h.log_id);
                state.logs.insert(h.log_id, log);
            }
            let log = state.logs.get_mut(&h.log_id).expect("inserted above");
            let mut vote = [0u8; 8];
            let n = payload.len().min(8);
            vote[..n].copy_from_slice(&payload[..n]);
            log.hard_state = crate::store::HardState {
                term: h.term,
                vote: u64::from_le_bytes(vote),
                commit: h.index,
            };
        }
        RecordKind::ReleaseRange => {
            if let Some(log) = state.logs.get_mut(&h.log_id) {
                // Only the entries the log still has: the rest went with a prefix release.
                let from = h.index.max(log.first_index);
                let to = h.term.min(log.last_index());
                for index in from..=to {
                    log.release(index);
                }
            }
        }
        RecordKind::ReleasePrefix => {
            if !state.logs.contains_key(&h.log_id) {
                let log = state.new_log(h.log_id);
                state.logs.insert(h.log_id, log);
            }
            let log = state.logs.get_mut(&h.log_id).expect("inserted above");
            log.release_prefix(h.index, h.term, bytes::Bytes::copy_from_slice(payload));
        }
        RecordKind::DeleteLog => {
            if let Some(log) = state.logs.remove(&h.log_id) {
                state
                    .dead_segments
                    .extend(log.segments.keys().map(|id| (h.log_id, *id)));
            }
        }
    }
}
