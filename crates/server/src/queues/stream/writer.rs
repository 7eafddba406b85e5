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
/// How often retention (`x-max-length-bytes`, `x-max-age`) is applied, at most.
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

struct State {
    pending: Vec<MessageRef>,
    pending_bytes: usize,
    /// Messages handed over so far: the newest one's [`Wait::Stream`] sequence number.
    assigned: u64,
    stop: Option<Stop>,
    /// The log failed a write or a sync: nothing more is taken.
    failed: bool,
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
    /// In a cluster: what this node's member says of the writer's rounds.
    rounds: Option<Arc<Rounds>>,
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
        let (committed_tx, committed) = watch::channel(stream.next_offset());
        let writer = Arc::new(StreamWriter {
            log,
            handle: stream.handle(),
            state: Mutex::new(State {
                pending: Vec::new(),
                pending_bytes: 0,
                assigned: 0,
                stop: None,
                failed: false,
            }),
            wake: Condvar::new(),
            room: Condvar::new(),
            committed,
            thread: Mutex::new(None),
            rounds: None,
        });
        let run = writer.clone();
        let dir = dir.to_path_buf();
        let thread = std::thread::Builder::new()
            .name(format!("stream-{log:x}"))
            .spawn(move || run.run(stream, dir, retention, committed_tx, durability))
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
                pending_bytes: 0,
                assigned: 0,
                stop: None,
                failed: false,
            }),
            wake: Condvar::new(),
            room: Condvar::new(),
            committed,
            thread: Mutex::new(None),
            rounds: Some(rounds.clone()),
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
        st.pending.push(message.clone());
        let seq = st.assigned;
        drop(st);
        self.wake.notify_one();
        Some(Wait::Stream { log: self.log, seq })
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
        retention: Retention,
        committed: watch::Sender<u64>,
        durability: Arc<Durability>,
    ) {
        let mut retained_at = Instant::now();
        let mut entries: Vec<Bytes> = Vec::new();
        let stop = loop {
            let (batch, upto) = {
                let mut st = self.state.lock().expect("stream writer state");
                while st.pending.is_empty() && st.stop.is_none() {
                    st = self.wake.wait(st).expect("stream writer state");
                }
                if st.stop == Some(Stop::Delete) || st.pending.is_empty() {
                    break st.stop;
                }
                st.pending_bytes = 0;
                (std::mem::take(&mut st.pending), st.assigned)
            };
            self.room.notify_all();
            entries.clear();
            entries.extend(batch.iter().map(encode));
            drop(batch);
            if let Err(e) = write_round(&mut stream, &entries) {
                tracing::error!(dir = %dir.display(), error = %e,
                    "stream write failed: the stream takes no more messages until restarted");
                self.state.lock().expect("stream writer state").failed = true;
                self.room.notify_all();
                durability.stream_stopped(self.log);
                return;
            }
            durability.stream_synced(self.log, upto);
            committed.send_replace(stream.next_offset());
            if (retention.max_bytes.is_some() || retention.max_age_ms.is_some())
                && retained_at.elapsed() >= RETENTION_INTERVAL
            {
                retained_at = Instant::now();
                if let Err(e) = stream.apply_retention(&retention, unix_ms()) {
                    tracing::warn!(dir = %dir.display(), error = %e, "stream retention failed");
                }
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
                (std::mem::take(&mut st.pending), st.assigned)
            };
            self.room.notify_all();
            entries.clear();
            entries.extend(batch.iter().map(encode));
            drop(batch);
            round += 1;
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

/// Writes a round's messages as chunks, syncs them and commits them.
fn write_round(stream: &mut StreamLog, entries: &[Bytes]) -> warren_store::Result<()> {
    let mut rest = entries;
    while !rest.is_empty() {
        let mut n = 0;
        let mut bytes = 0;
        while n < rest.len() && n < CHUNK_ENTRIES_MAX && (n == 0 || bytes < CHUNK_BYTES_TARGET) {
            bytes += rest[n].len();
            n += 1;
        }
        let chunk: Vec<Entry<'_>> = rest[..n].iter().map(|b| Entry::Simple(b)).collect();
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
    stream.sync()?;
    stream.set_commit_end(stream.next_offset());
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
