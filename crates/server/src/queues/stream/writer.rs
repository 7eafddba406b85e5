//! A stream's writer: one thread per stream that owns its [`StreamLog`]. Publishes are
//! handed over under the vhost lock ([`StreamWriter::append`], which gives each its confirm's
//! [`Wait`]) and written in rounds: everything that arrived while the previous round was
//! being written and synced becomes the next round's chunks, then one fsync, then the
//! committed offset moves, the round's confirms go out and the stream's consumers wake. A
//! lone publisher gets a chunk per message; a busy one, chunks of thousands, one sync each
//! round, as the WAL's group commit does.
//!
//! A message is encoded as RabbitMQ 3.10 stores a 0-9-1 publish (an AMQP 1.0 message, see
//! `warren_protocol::amqp10::amqp091`) on this thread, off the publisher's path.

use super::replicated::{RoundEntry, RoundOutcome, Rounds, ROUND_ENTRY_BYTES_TARGET};
use crate::durability::{Durability, Wait};
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use warren_broker::message::MessageRef;
use warren_protocol::amqp10::amqp091::from_amqp091;
use warren_protocol::content::Properties;
use warren_store::stream::chunk::CHUNK_ENTRIES_MAX;
use warren_store::stream::{
    AppendMeta, ChunkType, Entry, Retention, StreamConfig as LogConfig, StreamHandle, StreamLog,
};

/// Bytes of messages waiting for the next round above which a publisher waits for the writer
/// (it holds its vhost's lock meanwhile: the publishers of the vhost slow to the disk's pace).
pub const PENDING_BYTES_MAX: usize = 64 << 20;
/// A round's messages are cut into chunks of at most this many bytes of entries (and
/// [`CHUNK_ENTRIES_MAX`] entries), so that a consumer's read of one chunk stays small.
pub const CHUNK_BYTES_TARGET: usize = 4 << 20;
/// How often retention (`x-max-length-bytes`, `x-max-age`) is applied, at most; a stream with
/// a `max-age` wakes this often while idle to apply it, so that its old segments go even when
/// nobody writes to it (RabbitMQ 3.10 leaves them until the next write).
const RETENTION_INTERVAL: Duration = Duration::from_secs(1);
/// The epoch of every chunk a single node writes (epochs count leaders once streams are
/// replicated).
const SINGLE_NODE_EPOCH: u64 = 1;

/// Why the writer's thread ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The node stops: what is pending is written first.
    Close,
    /// The stream was deleted: nothing more is written and its directory goes.
    Delete,
}

/// A message waiting for the next round.
enum Pending {
    /// Published over AMQP 0-9-1: encoded as an AMQP 1.0 message on the writer's thread.
    Amqp091(MessageRef),
    /// Published over the stream protocol: an AMQP 1.0 message as the client encoded it,
    /// stored as it came.
    Encoded(Bytes),
    /// A stream protocol sub-entry batch, stored as one osiris sub-batch entry as it came.
    SubBatch(warren_protocol::stream::SubBatch, Bytes),
}

/// An entry of a round, owned until its chunk is written.
enum OwnedEntry {
    Simple(Bytes),
    SubBatch(warren_protocol::stream::SubBatch, Bytes),
}

impl OwnedEntry {
    fn len(&self) -> usize {
        match self {
            OwnedEntry::Simple(b) | OwnedEntry::SubBatch(_, b) => b.len(),
        }
    }

    fn entry(&self) -> Entry<'_> {
        match self {
            OwnedEntry::Simple(b) => Entry::Simple(b),
            OwnedEntry::SubBatch(h, b) => Entry::SubBatch {
                compression: h.compression,
                records: h.records,
                uncompressed_bytes: h.uncompressed_bytes,
                body: b,
            },
        }
    }
}

struct State {
    pending: Vec<Pending>,
    /// Tracking changes (publisher sequences, consumer offsets) for the next round's
    /// tracking chunk, newest value per name.
    tracking_pending: Tracking,
    pending_bytes: usize,
    /// Messages handed over so far: the newest one's [`Wait::Stream`] sequence number.
    assigned: u64,
    stop: Option<Stop>,
    /// The log failed a write or a sync: nothing more is taken.
    failed: bool,
    /// What retention keeps, changed by policies.
    retention: Retention,
    /// A segment size a policy set since the last round, for the log to take.
    segment_bytes: Option<u64>,
}

/// One stream's writer, shared by the publishers that hand it messages and the consumers that
/// read what it committed.
pub struct StreamWriter {
    pub log: u64,
    pub handle: StreamHandle,
    state: Mutex<State>,
    /// The writer waits here for messages; publishers for room.
    wake: Condvar,
    room: Condvar,
    /// The committed end offset; consumers wait for it to move. Its sender lives on the
    /// writer's thread, so consumers see the writer end.
    committed: watch::Receiver<u64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Publisher sequences and consumer offsets as they stand (what was handed over, synced
    /// or not), for deduplication and the stream protocol's queries.
    tracking: Mutex<Tracking>,
    /// In a cluster: what this node's member says of the writer's rounds.
    rounds: Option<Arc<Rounds>>,
}

/// The stream's tracking: the last publishing id of each named publisher (deduplication)
/// and the offset each named consumer stored (server-side offset tracking). Kept in the log
/// as osiris keeps it: tracking delta chunks after the rounds that change it, and a snapshot
/// at the start of each segment, so that retention never takes the only copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracking {
    pub sequences: std::collections::HashMap<String, u64>,
    pub offsets: std::collections::HashMap<String, u64>,
}

/// Osiris's tracking entry types.
const TRACKING_SEQUENCE: u8 = 0;
const TRACKING_OFFSET: u8 = 1;
/// A tracking reference is at most this long (its length is one byte on disk; the stream
/// protocol allows 256, RabbitMQ refuses longer ones).
pub const TRACKING_REFERENCE_BYTES_MAX: usize = 255;

impl Tracking {
    fn is_empty(&self) -> bool {
        self.sequences.is_empty() && self.offsets.is_empty()
    }

    /// Each change as one entry: type (1), reference length (1), reference, value (8).
    fn encode(&self) -> Vec<Bytes> {
        let entry = |kind: u8, id: &str, value: u64| {
            let id = &id.as_bytes()[..id.len().min(TRACKING_REFERENCE_BYTES_MAX)];
            let mut b = Vec::with_capacity(10 + id.len());
            b.push(kind);
            b.push(id.len() as u8);
            b.extend_from_slice(id);
            b.extend_from_slice(&value.to_be_bytes());
            Bytes::from(b)
        };
        let mut out: Vec<Bytes> = self
            .sequences
            .iter()
            .map(|(k, v)| entry(TRACKING_SEQUENCE, k, *v))
            .collect();
        out.extend(
            self.offsets
                .iter()
                .map(|(k, v)| entry(TRACKING_OFFSET, k, *v)),
        );
        out
    }

    /// Applies a tracking chunk's entries; an entry that does not parse is skipped (and
    /// logged by the caller's count), never a reason to refuse the stream.
    fn apply(&mut self, entry: &[u8]) -> bool {
        if entry.len() < 2 {
            return false;
        }
        let (kind, len) = (entry[0], entry[1] as usize);
        if entry.len() != 2 + len + 8 {
            return false;
        }
        let Ok(id) = std::str::from_utf8(&entry[2..2 + len]) else {
            return false;
        };
        let value = u64::from_be_bytes(entry[2 + len..].try_into().expect("8 bytes"));
        match kind {
            TRACKING_SEQUENCE => self.sequences.insert(id.to_string(), value),
            TRACKING_OFFSET => self.offsets.insert(id.to_string(), value),
            _ => return false,
        };
        true
    }
}

/// Reads the tracking of a stream's log: its tracking chunks, oldest first.
fn recover_tracking(handle: &StreamHandle) -> Result<Tracking, String> {
    let mut tracking = Tracking::default();
    let first_seq = handle.overview().first_seq;
    let mut reader = handle
        .replication_reader(first_seq)
        .map_err(|e| format!("cannot read the stream's tracking: {e}"))?;
    let mut skipped = 0usize;
    while let Some(slice) = reader
        .next_chunk()
        .map_err(|e| format!("cannot read the stream's tracking: {e}"))?
    {
        if !matches!(
            slice.record.chunk_type,
            ChunkType::TrackingDelta | ChunkType::TrackingSnapshot
        ) {
            continue;
        }
        let bytes = slice
            .read()
            .map_err(|e| format!("cannot read the stream's tracking: {e}"))?;
        let chunk = warren_store::stream::Chunk::parse(&bytes).map_err(|e| e.to_string())?;
        for (_, entry) in chunk.entries() {
            if let Entry::Simple(b) = entry {
                if !tracking.apply(b) {
                    skipped += 1;
                }
            }
        }
    }
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "stream tracking entries not understood were skipped"
        );
    }
    Ok(tracking)
}

/// What [`StreamWriter::append_published`] did with a Publish frame's messages.
pub struct Appended {
    /// What their confirm waits for; `None`: nothing (every message a duplicate of one
    /// already synced), confirm at once.
    pub wait: Option<Wait>,
    /// Messages dropped as duplicates of earlier publishing ids (they are confirmed too, as
    /// RabbitMQ confirms them).
    pub duplicates: usize,
}

/// What this node's member of a replicated stream owns, handed to it when it opens: its log
/// (the member alone writes it), where it lives, the committed offset's sender, and the
/// writer's rounds, by the writer's id.
pub struct MemberParts {
    pub stream: StreamLog,
    pub dir: PathBuf,
    pub committed: watch::Sender<u64>,
    pub rounds: Arc<Rounds>,
    pub writer_id: u64,
}

/// How a replicated stream's writer hands its rounds to the stream's Raft group.
pub struct Proposer {
    /// Proposes an entry through this node's member; the callback says if it entered the log.
    pub propose: Box<dyn Fn(Bytes, warren_cluster::groups::Proposed) + Send + Sync>,
    /// The group's term as this node's member sees it: the epoch of the round's chunks.
    pub term: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl StreamWriter {
    /// Opens (creating it) the stream in `dir`: everything recovered is committed, as it was
    /// all synced or at least written before the restart, and the thread starts.
    pub fn open(
        log: u64,
        dir: &Path,
        segment_bytes: u64,
        retention: Retention,
        durability: Arc<Durability>,
    ) -> Result<Arc<StreamWriter>, String> {
        let config = LogConfig {
            segment_bytes_max: segment_bytes,
            ..LogConfig::default()
        };
        let (stream, recovered) = StreamLog::open(dir, config)
            .map_err(|e| format!("cannot open stream log {}: {e}", dir.display()))?;
        tracing::debug!(dir = %dir.display(), ?recovered, "stream log opened");
        stream.set_commit_end(stream.next_offset());
        let tracking = recover_tracking(&stream.handle())?;
        let (committed_tx, committed) = watch::channel(stream.next_offset());
        let writer = Arc::new(StreamWriter {
            log,
            handle: stream.handle(),
            state: Mutex::new(State {
                pending: Vec::new(),
                tracking_pending: Tracking::default(),
                pending_bytes: 0,
                assigned: 0,
                stop: None,
                failed: false,
                retention,
                segment_bytes: None,
            }),
            wake: Condvar::new(),
            room: Condvar::new(),
            committed,
            thread: Mutex::new(None),
            rounds: None,
            tracking: Mutex::new(tracking),
        });
        let run = writer.clone();
        let dir = dir.to_path_buf();
        let thread = std::thread::Builder::new()
            .name(format!("stream-{log:x}"))
            .spawn(move || run.run(stream, dir, committed_tx, durability))
            .map_err(|e| format!("cannot start a stream writer: {e}"))?;
        *writer.thread.lock().expect("writer thread") = Some(thread);
        Ok(writer)
    }

    /// Opens (creating it) the files of this node's member of a replicated stream and starts
    /// the writer that proposes this node's publishes; returns the member (the group's state
    /// machine, which owns the files). Everything recovered is committed: a member writes only
    /// committed chunks.
    pub fn open_replicated(
        log: u64,
        dir: &Path,
        segment_bytes: u64,
        durability: Arc<Durability>,
        proposer: Proposer,
    ) -> Result<(Arc<StreamWriter>, MemberParts), String> {
        let config = LogConfig {
            segment_bytes_max: segment_bytes,
            ..LogConfig::default()
        };
        let (stream, recovered) = StreamLog::open(dir, config)
            .map_err(|e| format!("cannot open stream log {}: {e}", dir.display()))?;
        tracing::debug!(dir = %dir.display(), ?recovered, "stream member's log opened");
        stream.set_commit_end(stream.next_offset());
        let (committed_tx, committed) = watch::channel(stream.next_offset());
        let rounds = Arc::new(Rounds::default());
        let writer = Arc::new(StreamWriter {
            log,
            handle: stream.handle(),
            state: Mutex::new(State {
                pending: Vec::new(),
                tracking_pending: Tracking::default(),
                pending_bytes: 0,
                assigned: 0,
                stop: None,
                failed: false,
                // A member applies retention itself (`replicated.rs`).
                retention: Retention::default(),
                segment_bytes: None,
            }),
            wake: Condvar::new(),
            room: Condvar::new(),
            committed,
            thread: Mutex::new(None),
            rounds: Some(rounds.clone()),
            // Not replicated yet: deduplication and stored offsets are a single node's.
            tracking: Mutex::new(Tracking::default()),
        });
        let writer_id = rand::random::<u64>();
        let run = writer.clone();
        let run_rounds = rounds.clone();
        let thread = std::thread::Builder::new()
            .name(format!("stream-{log:x}"))
            .spawn(move || run.run_replicated(writer_id, &run_rounds, &proposer, durability))
            .map_err(|e| format!("cannot start a stream writer: {e}"))?;
        *writer.thread.lock().expect("writer thread") = Some(thread);
        let parts = MemberParts {
            stream,
            dir: dir.to_path_buf(),
            committed: committed_tx,
            rounds,
            writer_id,
        };
        Ok((writer, parts))
    }

    /// Hands `message` to the next round; the wait is its publisher's confirm. `None` when the
    /// writer takes no more (the log failed, or the stream is going): the publisher gets a
    /// nack.
    pub fn append(&self, message: &MessageRef) -> Option<Wait> {
        let mut st = self.state.lock().expect("stream writer state");
        while st.pending_bytes > PENDING_BYTES_MAX && !st.failed && st.stop.is_none() {
            st = self.room.wait(st).expect("stream writer state");
        }
        if st.failed || st.stop.is_some() {
            return None;
        }
        st.assigned += 1;
        st.pending_bytes += message.body.len() + message.properties.len();
        st.pending.push(Pending::Amqp091(message.clone()));
        let seq = st.assigned;
        drop(st);
        self.wake.notify_one();
        Some(Wait::Stream { log: self.log, seq })
    }

    /// Hands a stream protocol Publish's messages (publishing id, AMQP 1.0 bytes) to the next
    /// round. With a publisher `reference`, a message whose publishing id is not above the
    /// last one this reference published is a resend: dropped, and confirmed with the rest
    /// (osiris's deduplication). `None` when the writer takes no more.
    pub fn append_published(
        &self,
        reference: Option<&str>,
        messages: impl IntoIterator<Item = (u64, Bytes, Option<warren_protocol::stream::SubBatch>)>,
    ) -> Option<Appended> {
        let mut st = self.state.lock().expect("stream writer state");
        while st.pending_bytes > PENDING_BYTES_MAX && !st.failed && st.stop.is_none() {
            st = self.room.wait(st).expect("stream writer state");
        }
        if st.failed || st.stop.is_some() {
            return None;
        }
        let mut tracking = self.tracking.lock().expect("stream tracking");
        let mut last = reference.and_then(|r| tracking.sequences.get(r).copied());
        let mut duplicates = 0;
        let mut taken = 0;
        for (publishing_id, message, sub_batch) in messages {
            if reference.is_some() {
                if last.is_some_and(|l| publishing_id <= l) {
                    duplicates += 1;
                    continue;
                }
                last = Some(publishing_id);
            }
            st.assigned += 1;
            st.pending_bytes += message.len();
            st.pending.push(match sub_batch {
                // An empty batch would take no offset: a chunk's records must be at least one.
                Some(h) if h.records > 0 => Pending::SubBatch(h, message),
                _ => Pending::Encoded(message),
            });
            taken += 1;
        }
        if let (Some(r), Some(l)) = (reference, last) {
            if taken > 0 {
                tracking.sequences.insert(r.to_string(), l);
                st.tracking_pending.sequences.insert(r.to_string(), l);
            }
        }
        drop(tracking);
        // A resend waits for what was handed over before it (the original may not be synced
        // yet); with nothing ever handed over, there is nothing to wait for.
        let seq = st.assigned;
        drop(st);
        if taken > 0 {
            self.wake.notify_one();
        }
        Some(Appended {
            wait: (seq > 0).then_some(Wait::Stream { log: self.log, seq }),
            duplicates,
        })
    }

    /// Stores a named consumer's offset (the stream protocol's StoreOffset): known to
    /// [`StreamWriter::tracking`] at once, written with the next round. `false` when the
    /// writer takes no more.
    pub fn store_offset(&self, reference: &str, offset: u64) -> bool {
        let mut st = self.state.lock().expect("stream writer state");
        if st.failed || st.stop.is_some() {
            return false;
        }
        self.tracking
            .lock()
            .expect("stream tracking")
            .offsets
            .insert(reference.to_string(), offset);
        st.tracking_pending
            .offsets
            .insert(reference.to_string(), offset);
        drop(st);
        self.wake.notify_one();
        true
    }

    /// The last publishing id of publisher `reference`, if it ever published.
    pub fn publisher_sequence(&self, reference: &str) -> Option<u64> {
        self.tracking
            .lock()
            .expect("stream tracking")
            .sequences
            .get(reference)
            .copied()
    }

    /// The offset consumer `reference` stored last, if it stored one.
    pub fn stored_offset(&self, reference: &str) -> Option<u64> {
        self.tracking
            .lock()
            .expect("stream tracking")
            .offsets
            .get(reference)
            .copied()
    }

    /// Applies a new retention and segment size (a policy changed) from the writer's next
    /// round or retention tick on.
    pub fn reconfigure(&self, retention: Retention, segment_bytes: u64) {
        let mut st = self.state.lock().expect("stream writer state");
        st.retention = retention;
        st.segment_bytes = Some(segment_bytes);
        drop(st);
        self.wake.notify_one();
    }

    /// A receiver of the committed end offset, for a consumer to wait on.
    pub fn committed(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    /// Stops the thread (writing what is pending unless the stream is deleted) and waits for
    /// it; a deleted stream's directory is gone when this returns.
    fn stop(&self, how: Stop) {
        self.state.lock().expect("stream writer state").stop = Some(how);
        self.wake.notify_all();
        self.room.notify_all();
        if let Some(rounds) = &self.rounds {
            rounds.stop();
        }
        let thread = self.thread.lock().expect("writer thread").take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    fn run(
        &self,
        mut stream: StreamLog,
        dir: PathBuf,
        committed: watch::Sender<u64>,
        durability: Arc<Durability>,
    ) {
        let mut retained_at = Instant::now();
        let mut retention_due = false;
        let mut entries: Vec<OwnedEntry> = Vec::new();
        let stop = loop {
            let (batch, tracking, upto, retention) = {
                let mut st = self.state.lock().expect("stream writer state");
                while st.pending.is_empty() && st.tracking_pending.is_empty() && st.stop.is_none() {
                    // Retention due since the last round is applied when the stream goes
                    // quiet, not only when the next round comes; a max-age is due again
                    // every interval, as time alone ages segments out (the clock is read
                    // here, at the edge; the log is given the time).
                    if !retention_due && st.retention.max_age_ms.is_none() {
                        st = self.wake.wait(st).expect("stream writer state");
                        continue;
                    }
                    let left = RETENTION_INTERVAL.saturating_sub(retained_at.elapsed());
                    if left.is_zero() {
                        break;
                    }
                    st = self
                        .wake
                        .wait_timeout(st, left)
                        .expect("stream writer state")
                        .0;
                }
                if st.pending.is_empty() && st.tracking_pending.is_empty() && st.stop.is_none() {
                    let retention = st.retention;
                    drop(st);
                    retention_due = false;
                    retained_at = Instant::now();
                    retain(&mut stream, &retention, &dir);
                    continue;
                }
                if st.stop == Some(Stop::Delete)
                    || (st.pending.is_empty() && st.tracking_pending.is_empty())
                {
                    break st.stop;
                }
                if let Some(bytes) = st.segment_bytes.take() {
                    stream.set_segment_bytes_max(bytes);
                }
                st.pending_bytes = 0;
                (
                    std::mem::take(&mut st.pending),
                    std::mem::take(&mut st.tracking_pending),
                    st.assigned,
                    st.retention,
                )
            };
            self.room.notify_all();
            entries.clear();
            entries.extend(batch.iter().map(|p| match p {
                Pending::Amqp091(m) => OwnedEntry::Simple(encode(m)),
                Pending::Encoded(b) => OwnedEntry::Simple(b.clone()),
                Pending::SubBatch(h, b) => OwnedEntry::SubBatch(*h, b.clone()),
            }));
            drop(batch);
            if let Err(e) = write_round(&mut stream, &entries, &tracking, &self.tracking) {
                tracing::error!(dir = %dir.display(), error = %e,
                    "stream write failed: the stream takes no more messages until restarted");
                self.state.lock().expect("stream writer state").failed = true;
                self.room.notify_all();
                durability.stream_stopped(self.log);
                return;
            }
            durability.stream_synced(self.log, upto);
            committed.send_replace(stream.next_offset());
            let retains = retention.max_bytes.is_some() || retention.max_age_ms.is_some();
            retention_due = retains;
            if retains && retained_at.elapsed() >= RETENTION_INTERVAL {
                retention_due = false;
                retained_at = Instant::now();
                retain(&mut stream, &retention, &dir);
            }
        };
        durability.stream_stopped(self.log);
        drop(committed);
        if stop == Some(Stop::Delete) {
            drop(stream);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "deleted stream's files left");
            }
        }
    }
}

impl StreamWriter {
    /// A replicated stream's writer: each round's publishes become entries of at most
    /// [`ROUND_ENTRY_BYTES_TARGET`] (a chunk each), proposed together; their confirms go out
    /// once this node's member applied every one (committed: a majority has them), or nacks
    /// if the round was refused or not committed in time. One round in flight: what arrives
    /// meanwhile is the next round, so a busy stream's rounds grow to fill the time a commit
    /// takes.
    fn run_replicated(
        &self,
        writer_id: u64,
        rounds: &Rounds,
        proposer: &Proposer,
        durability: Arc<Durability>,
    ) {
        let mut round = 0u64;
        let mut confirmed = 0u64;
        let mut entries: Vec<Bytes> = Vec::new();
        loop {
            let (batch, upto) = {
                let mut st = self.state.lock().expect("stream writer state");
                while st.pending.is_empty() && st.stop.is_none() {
                    st = self.wake.wait(st).expect("stream writer state");
                }
                if st.stop.is_some() {
                    break;
                }
                st.pending_bytes = 0;
                // Tracking (the stream protocol's) is not replicated yet: dropped here.
                st.tracking_pending = Tracking::default();
                (std::mem::take(&mut st.pending), st.assigned)
            };
            self.room.notify_all();
            entries.clear();
            let mut compressed = false;
            for p in &batch {
                match p {
                    Pending::Amqp091(m) => entries.push(encode(m)),
                    Pending::Encoded(b) => entries.push(b.clone()),
                    // A round entry holds plain messages: an uncompressed sub-batch is its
                    // records, each an offset as on one node. A compressed one would have to
                    // travel as it came, which round entries cannot carry yet.
                    Pending::SubBatch(h, b) if h.compression == 0 => {
                        match sub_batch_records(b, h.records) {
                            Some(records) => entries.extend(records),
                            None => compressed = true,
                        }
                    }
                    Pending::SubBatch(..) => compressed = true,
                }
            }
            drop(batch);
            round += 1;
            if compressed {
                tracing::warn!(
                    log = self.log,
                    "a compressed (or malformed) sub-entry batch on a replicated stream: the round is nacked"
                );
                durability.stream_refused(self.log, confirmed + 1, upto);
                confirmed = upto;
                continue;
            }
            let parts = split_round(&entries);
            let (timestamp_ms, epoch) = (unix_ms(), (proposer.term)());
            for (part, messages) in parts.iter().enumerate() {
                let data = RoundEntry {
                    writer: writer_id,
                    round,
                    part: part as u32,
                    parts: parts.len() as u32,
                    timestamp_ms,
                    epoch,
                    messages: messages.iter().map(|m| &m[..]).collect(),
                }
                .encode();
                let refused = self.rounds.clone();
                (proposer.propose)(
                    data,
                    Box::new(move |r| {
                        if let (Err(e), Some(rounds)) = (r, refused) {
                            tracing::debug!(error = %e, "a stream round's proposal was refused");
                            rounds.refused(round);
                        }
                    }),
                );
            }
            match rounds.wait(round, parts.len() as u32) {
                RoundOutcome::Committed => durability.stream_synced(self.log, upto),
                RoundOutcome::Refused => {
                    tracing::debug!(
                        log = self.log,
                        round,
                        "a stream round was not committed in time: its publishes are nacked"
                    );
                    durability.stream_refused(self.log, confirmed + 1, upto);
                }
                RoundOutcome::Stopped => break,
            }
            confirmed = upto;
        }
        durability.stream_stopped(self.log);
    }
}

/// An uncompressed sub-entry batch's records (each a 4-byte big-endian size and the message),
/// `None` unless it holds exactly `records` of them and nothing else.
fn sub_batch_records(mut body: &[u8], records: u16) -> Option<Vec<Bytes>> {
    let mut out = Vec::with_capacity(records as usize);
    while !body.is_empty() {
        let (size, rest) = body.split_first_chunk::<4>()?;
        let size = u32::from_be_bytes(*size) as usize;
        let message = rest.get(..size)?;
        out.push(Bytes::copy_from_slice(message));
        body = &rest[size..];
    }
    (out.len() == records as usize).then_some(out)
}

/// A round's messages cut into entries of at most [`ROUND_ENTRY_BYTES_TARGET`] bytes and
/// [`CHUNK_ENTRIES_MAX`] messages (one message larger than that is an entry of its own).
fn split_round(entries: &[Bytes]) -> Vec<&[Bytes]> {
    let mut parts = Vec::new();
    let mut rest = entries;
    while !rest.is_empty() {
        let mut n = 0;
        let mut bytes = 0;
        while n < rest.len()
            && n < CHUNK_ENTRIES_MAX
            && (n == 0 || bytes + rest[n].len() <= ROUND_ENTRY_BYTES_TARGET)
        {
            bytes += rest[n].len();
            n += 1;
        }
        parts.push(&rest[..n]);
        rest = &rest[n..];
    }
    parts
}

/// Applies `retention` now, logging what it removed or why it failed (the stream goes on
/// either way: a failed deletion is tried again at the next tick).
fn retain(stream: &mut StreamLog, retention: &Retention, dir: &Path) {
    if retention.max_bytes.is_none() && retention.max_age_ms.is_none() {
        return;
    }
    match stream.apply_retention(retention, unix_ms()) {
        Ok(o) if o.segments_deleted > 0 => tracing::debug!(dir = %dir.display(),
            segments = o.segments_deleted, first_offset = o.first_offset, "stream retention"),
        Ok(_) => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "stream retention failed"),
    }
}

/// Writes a round's messages as chunks, then its tracking changes as a tracking chunk, syncs
/// them and commits them. When the round started a segment, the whole of the stream's
/// `tracking` follows as a snapshot in it, so that retention, which deletes whole segments,
/// never takes the only copy of a publisher's sequence or a consumer's offset.
fn write_round(
    stream: &mut StreamLog,
    entries: &[OwnedEntry],
    tracking: &Tracking,
    all_tracking: &Mutex<Tracking>,
) -> warren_store::Result<()> {
    let segments_before = stream.handle().overview().segments;
    let mut rest = entries;
    while !rest.is_empty() {
        let mut n = 0;
        let mut bytes = 0;
        while n < rest.len() && n < CHUNK_ENTRIES_MAX && (n == 0 || bytes < CHUNK_BYTES_TARGET) {
            bytes += rest[n].len();
            n += 1;
        }
        let chunk: Vec<Entry<'_>> = rest[..n].iter().map(OwnedEntry::entry).collect();
        stream.append(
            &AppendMeta {
                chunk_type: ChunkType::User,
                timestamp_ms: unix_ms(),
                epoch: SINGLE_NODE_EPOCH,
                filter: &[],
                trailer: &[],
            },
            &chunk,
        )?;
        rest = &rest[n..];
    }
    append_tracking(stream, ChunkType::TrackingDelta, tracking)?;
    if stream.handle().overview().segments != segments_before {
        let snapshot = all_tracking.lock().expect("stream tracking").clone();
        append_tracking(stream, ChunkType::TrackingSnapshot, &snapshot)?;
    }
    stream.sync()?;
    stream.set_commit_end(stream.next_offset());
    Ok(())
}

/// Appends `t`'s entries as chunks of `chunk_type` (none when it is empty).
fn append_tracking(
    stream: &mut StreamLog,
    chunk_type: ChunkType,
    t: &Tracking,
) -> warren_store::Result<()> {
    if t.is_empty() {
        return Ok(());
    }
    let encoded = t.encode();
    for part in encoded.chunks(CHUNK_ENTRIES_MAX) {
        let chunk: Vec<Entry<'_>> = part.iter().map(|b| Entry::Simple(b)).collect();
        stream.append(
            &AppendMeta {
                chunk_type,
                timestamp_ms: unix_ms(),
                epoch: SINGLE_NODE_EPOCH,
                filter: &[],
                trailer: &[],
            },
            &chunk,
        )?;
    }
    Ok(())
}

/// The AMQP 1.0 message RabbitMQ 3.10 stores for a 0-9-1 publish. Properties were checked
/// when published; were they not to decode, the message is kept with its body alone rather
/// than lost.
fn encode(m: &MessageRef) -> Bytes {
    let props = Properties::decode(&m.properties).unwrap_or_default();
    from_amqp091(&m.exchange, &m.routing_key, &props, &m.body).unwrap_or_else(|_| {
        from_amqp091(&m.exchange, &m.routing_key, &Properties::default(), &m.body)
            .expect("no headers to fail on")
    })
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The node's open streams by storage log id, under `<data dir>/streams/<log id>`: a log id
/// is random and never reused, so a stream deleted and declared again starts afresh.
pub struct Streams {
    dir: PathBuf,
    open: Mutex<warren_store::IdHashMap<u64, Arc<StreamWriter>>>,
    /// In a cluster a stream is opened by this node's member of it, when its group opens
    /// (`replicated.rs`), never on first use: a node without a member has none.
    replicated: bool,
}

impl Streams {
    pub fn new(dir: PathBuf) -> Streams {
        Streams {
            dir,
            open: Mutex::new(Default::default()),
            replicated: false,
        }
    }

    /// A cluster node's streams: each opened by its member ([`Streams::open_member`]).
    pub fn replicated(dir: PathBuf) -> Streams {
        Streams {
            replicated: true,
            ..Streams::new(dir)
        }
    }

    /// Opens this node's member of replicated stream `log`: its files, and the writer that
    /// proposes this node's publishes. `None` when it is open already (the group is then open
    /// too, and drops a second machine).
    pub(super) fn open_member(
        &self,
        log: u64,
        segment_bytes: u64,
        durability: &Arc<Durability>,
        proposer: Proposer,
    ) -> Result<Option<MemberParts>, String> {
        let mut open = self.open.lock().expect("streams lock");
        if open.contains_key(&log) {
            return Ok(None);
        }
        let dir = self.dir_of(log);
        let (w, parts) =
            StreamWriter::open_replicated(log, &dir, segment_bytes, durability.clone(), proposer)?;
        open.insert(log, w);
        Ok(Some(parts))
    }

    /// This node's member of stream `log` was removed: its writer stops (the member deletes
    /// the files it owns).
    pub(super) fn member_removed(&self, log: u64) {
        let writer = self.open.lock().expect("streams lock").remove(&log);
        if let Some(w) = writer {
            w.stop(Stop::Delete);
        }
    }

    fn dir_of(&self, log: u64) -> PathBuf {
        self.dir.join(format!("{log:016x}"))
    }

    /// The writer of stream `log`, opened on first use (at declare, at start, or when its
    /// first publish or consumer comes).
    pub fn get(
        &self,
        log: u64,
        config: &warren_broker::stream_args::StreamConfig,
        durability: &Arc<Durability>,
    ) -> Result<Arc<StreamWriter>, String> {
        let mut open = self.open.lock().expect("streams lock");
        if let Some(w) = open.get(&log) {
            return Ok(w.clone());
        }
        if self.replicated {
            return Err("this node holds no member of the stream".into());
        }
        let retention = Retention {
            max_bytes: config.max_bytes,
            max_age_ms: config.max_age_ms,
        };
        let w = StreamWriter::open(
            log,
            &self.dir_of(log),
            config.segment_bytes,
            retention,
            durability.clone(),
        )?;
        open.insert(log, w.clone());
        Ok(w)
    }

    /// Hands stream `log`'s writer its new effective configuration (a policy changed it);
    /// a log not open here takes it when it opens, from its queue.
    pub fn reconfigure(&self, log: u64, config: &warren_broker::stream_args::StreamConfig) {
        if let Some(w) = self.opened(log) {
            w.reconfigure(
                Retention {
                    max_bytes: config.max_bytes,
                    max_age_ms: config.max_age_ms,
                },
                config.segment_bytes,
            );
        }
    }

    /// The writer of stream `log` if it is open.
    pub fn opened(&self, log: u64) -> Option<Arc<StreamWriter>> {
        self.open.lock().expect("streams lock").get(&log).cloned()
    }

    /// Stream `log` was deleted: its writer stops, its consumers' readers see it end, its
    /// files go. A log never opened on this node may still have files from before a restart.
    pub fn delete(&self, log: u64) {
        let writer = self.open.lock().expect("streams lock").remove(&log);
        match writer {
            Some(w) => w.stop(Stop::Delete),
            None => {
                let dir = self.dir_of(log);
                if dir.exists() {
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %e,
                            "deleted stream's files left");
                    }
                }
            }
        }
    }

    /// Writes what is pending and stops every writer (the node stops).
    pub fn close_all(&self) {
        let writers: Vec<_> = self
            .open
            .lock()
            .expect("streams lock")
            .drain()
            .map(|(_, w)| w)
            .collect();
        for w in writers {
            w.stop(Stop::Close);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sub_batch_records;

    #[test]
    fn an_uncompressed_sub_batch_is_its_records_and_nothing_else() {
        let body = [&[0, 0, 0, 2][..], b"ab", &[0, 0, 0, 0], &[0, 0, 0, 1], b"c"].concat();
        let records = sub_batch_records(&body, 3).expect("three records");
        assert_eq!(records, vec![&b"ab"[..], b"", b"c"]);
        assert_eq!(
            sub_batch_records(&body, 2),
            None,
            "a count it does not hold"
        );
        assert_eq!(
            sub_batch_records(&body[..body.len() - 1], 3),
            None,
            "a record cut short"
        );
        assert_eq!(sub_batch_records(&body[..2], 0), None, "a size cut short");
        assert_eq!(sub_batch_records(&[], 0), Some(vec![]));
    }
}
