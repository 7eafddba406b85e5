//! A stream in a cluster: a Raft group per stream, run by the cluster's groups loop with the
//! quorum queues (one WAL sync and one network batch per node pair per round for all of them),
//! whose entries are the stream's chunks.
//!
//! - On the node a publisher is connected to, the stream's writer (`writer.rs`) batches the
//!   publishes of a round into chunk-sized [`RoundEntry`]s and proposes them through this
//!   node's member (raft-rs forwards them to the leader). Their confirms wait until this
//!   node's member applied the round: an entry is applied only once committed, that is once a
//!   majority of members has it in its WAL, synced.
//! - On every member, [`StreamMember`] (the group's [`Machine`]) applies each committed entry
//!   as one chunk appended to the member's own segment files, in log order, so every member's
//!   files hold the same chunks at the same offsets; then it moves the committed offset, which
//!   wakes the consumers reading this member's files.
//! - Retention runs on every member by whole segments. The group's log (in the WAL) is kept
//!   from the first chunk of the first segment kept ([`Machine::live_from`]), so a member that
//!   was down, or that restarts with a torn tail, is given every chunk it lacks from the log:
//!   as appends, or as a snapshot carrying the log's entries, which [`StreamMember`] writes
//!   into its files when it restores it.
//!
//! Every applied chunk is committed, so a member's files never hold an uncommitted chunk and
//! nothing there is ever truncated: what a restart finds is committed.

use super::consumer::Consumers;
use bytes::{Buf, BufMut, Bytes};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use warren_cluster::groups::Machine;
use warren_store::stream::{AppendMeta, ChunkType, Entry, Retention, StreamLog};
use warren_store::Store;

/// First byte of a [`RoundEntry`]: tells it from anything else a group's log could hold.
const ROUND_ENTRY_MAGIC: u8 = 0xa7;
const ROUND_ENTRY_VERSION: u8 = 1;
/// Bytes before a round entry's messages.
const ROUND_ENTRY_HEADER_BYTES: usize = 2 + 8 + 8 + 4 + 4 + 8 + 8 + 4;
/// A round's messages are cut into entries (chunks) of at most this many bytes: raft-rs sends
/// a follower at most a megabyte of entries per message.
pub const ROUND_ENTRY_BYTES_TARGET: usize = 1 << 20;
/// How long a writer waits for its round to be committed before it nacks the round's
/// publishes (no leader, or a leader change dropped the proposal).
pub const ROUND_COMMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a member applies retention, at most.
const RETENTION_INTERVAL: Duration = Duration::from_secs(1);

/// One proposal: part of a round of one writer's publishes, appended as one chunk.
#[derive(Debug, PartialEq, Eq)]
pub struct RoundEntry<'a> {
    /// The proposing writer (random per writer life), so only its own rounds confirm its
    /// publishes, and a round of a writer from before a restart confirms nothing.
    pub writer: u64,
    pub round: u64,
    pub part: u32,
    pub parts: u32,
    pub timestamp_ms: i64,
    /// The group's term as the proposer saw it: the chunk's epoch (raised to the previous
    /// chunk's when lower, alike on every member).
    pub epoch: u64,
    pub messages: Vec<&'a [u8]>,
}

impl RoundEntry<'_> {
    pub fn encode(&self) -> Bytes {
        let body: usize = self.messages.iter().map(|m| 4 + m.len()).sum();
        let mut out = Vec::with_capacity(ROUND_ENTRY_HEADER_BYTES + body);
        out.put_u8(ROUND_ENTRY_MAGIC);
        out.put_u8(ROUND_ENTRY_VERSION);
        out.put_u64(self.writer);
        out.put_u64(self.round);
        out.put_u32(self.part);
        out.put_u32(self.parts);
        out.put_i64(self.timestamp_ms);
        out.put_u64(self.epoch);
        out.put_u32(self.messages.len() as u32);
        for m in &self.messages {
            out.put_u32(m.len() as u32);
            out.put_slice(m);
        }
        out.into()
    }

    /// `None` for anything that is not exactly one well-formed round entry.
    pub fn decode(mut b: &[u8]) -> Option<RoundEntry<'_>> {
        if b.len() < ROUND_ENTRY_HEADER_BYTES
            || b[0] != ROUND_ENTRY_MAGIC
            || b[1] != ROUND_ENTRY_VERSION
        {
            return None;
        }
        b.advance(2);
        let (writer, round) = (b.get_u64(), b.get_u64());
        let (part, parts) = (b.get_u32(), b.get_u32());
        let (timestamp_ms, epoch) = (b.get_i64(), b.get_u64());
        let count = b.get_u32() as usize;
        if count == 0 || count > warren_store::stream::chunk::CHUNK_ENTRIES_MAX {
            return None;
        }
        let mut messages = Vec::with_capacity(count);
        for _ in 0..count {
            if b.len() < 4 {
                return None;
            }
            let len = b.get_u32() as usize;
            if b.len() < len {
                return None;
            }
            messages.push(&b[..len]);
            b = &b[len..];
        }
        if !b.is_empty() {
            return None;
        }
        Some(RoundEntry {
            writer,
            round,
            part,
            parts,
            timestamp_ms,
            epoch,
            messages,
        })
    }
}

/// What a writer learns of its rounds from this node's member.
#[derive(Default)]
pub struct Rounds {
    state: Mutex<RoundsState>,
    changed: Condvar,
}

#[derive(Default)]
struct RoundsState {
    /// The newest round of the writer applied here, and how many of its parts.
    round: u64,
    parts: u32,
    /// The newest round whose proposal was refused before entering the log.
    refused: u64,
    stopped: bool,
}

/// How a writer's round ended.
#[derive(Debug, PartialEq, Eq)]
pub enum RoundOutcome {
    Committed,
    Refused,
    Stopped,
}

impl Rounds {
    fn applied(&self, round: u64) {
        let mut st = self.state.lock().expect("rounds lock");
        if round > st.round {
            st.round = round;
            st.parts = 1;
        } else if round == st.round {
            st.parts += 1;
        }
        drop(st);
        self.changed.notify_all();
    }

    pub fn refused(&self, round: u64) {
        let mut st = self.state.lock().expect("rounds lock");
        st.refused = st.refused.max(round);
        drop(st);
        self.changed.notify_all();
    }

    pub fn stop(&self) {
        self.state.lock().expect("rounds lock").stopped = true;
        self.changed.notify_all();
    }

    /// Waits until `parts` parts of `round` are applied here, or it is refused, or it times out
    /// (a part lost with a leader change: the round's publishes get nacks).
    pub fn wait(&self, round: u64, parts: u32) -> RoundOutcome {
        let deadline = Instant::now() + ROUND_COMMIT_TIMEOUT;
        let mut st = self.state.lock().expect("rounds lock");
        loop {
            if st.round > round || st.round == round && st.parts >= parts {
                return RoundOutcome::Committed;
            }
            if st.refused >= round || st.round > round {
                return RoundOutcome::Refused;
            }
            if st.stopped {
                return RoundOutcome::Stopped;
            }
            let now = Instant::now();
            if now >= deadline {
                return RoundOutcome::Refused;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .expect("rounds lock")
                .0;
        }
    }
}

/// The first chunk of a segment this member keeps, and the group's log index that wrote it:
/// the log is kept from the first such index on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    seq: u64,
    index: u64,
    /// The chunk's first offset (the same on every member).
    offset: u64,
}

/// This node's member of a replicated stream: the group's state machine.
pub struct StreamMember {
    pub(super) log: u64,
    pub(super) group: u64,
    pub(super) writer_id: u64,
    pub(super) stream: StreamLog,
    pub(super) dir: PathBuf,
    pub(super) committed: watch::Sender<u64>,
    pub(super) rounds: Arc<Rounds>,
    pub(super) retention: Retention,
    pub(super) store: Arc<Store>,
    /// Runs when the group is removed here (the stream deleted): the writer stops.
    pub(super) on_removed: Option<Box<dyn FnOnce() + Send>>,
    pub(super) consumers: std::sync::Weak<crate::Shared>,
    /// Chunks the applied entries made: the sequence number the next one gets.
    chunks: u64,
    marks: VecDeque<Mark>,
    /// The index of the last entry applied.
    applied: u64,
    /// When retention last ran: `None` runs it at the next flush (a member that just opened or
    /// restored a snapshot may hold more than its stream keeps).
    retained_at: Option<Instant>,
    moved: bool,
    /// A chunk could not be written: nothing more is, until the node restarts (its readers
    /// see no gap: they stop at the last chunk written).
    failed: bool,
}

impl StreamMember {
    pub(super) fn new(
        log: u64,
        group: u64,
        parts: super::writer::MemberParts,
        retention: Retention,
        store: Arc<Store>,
        on_removed: Box<dyn FnOnce() + Send>,
        shared: std::sync::Weak<crate::Shared>,
    ) -> StreamMember {
        let super::writer::MemberParts {
            stream,
            dir,
            committed,
            rounds,
            writer_id,
        } = parts;
        StreamMember {
            log,
            group,
            writer_id,
            stream,
            dir,
            committed,
            rounds,
            retention,
            store,
            on_removed: Some(on_removed),
            consumers: shared,
            chunks: 0,
            marks: VecDeque::new(),
            applied: 0,
            retained_at: None,
            moved: false,
            failed: false,
        }
    }

    /// Writes the chunk of the `seq`-th round entry unless the files have it already (a
    /// restart replays the log from its snapshot; what recovery kept is committed).
    fn write(&mut self, index: u64, seq: u64, entry: &RoundEntry<'_>) {
        let have = self.stream.next_seq();
        if seq < have {
            if let Some(offset) = self.segment_start(seq) {
                if self.marks.back().is_none_or(|m| m.seq < seq) {
                    self.marks.push_back(Mark { seq, index, offset });
                }
            }
            return;
        }
        if seq > have || self.failed {
            if !self.failed {
                tracing::error!(log = self.log, seq, have,
                    "a stream member lacks chunks before a committed one: it takes no more until restarted");
            }
            self.failed = true;
            return;
        }
        let entries: Vec<Entry<'_>> = entry.messages.iter().map(|m| Entry::Simple(m)).collect();
        let meta = AppendMeta {
            chunk_type: ChunkType::User,
            timestamp_ms: entry.timestamp_ms,
            epoch: entry.epoch.max(self.stream.last_epoch()),
            filter: &[],
            trailer: &[],
        };
        let header = match self.stream.append(&meta, &entries) {
            Ok(header) => header,
            Err(e) => {
                tracing::error!(log = self.log, error = %e,
                    "a stream member's write failed: it takes no more until restarted");
                self.failed = true;
                return;
            }
        };
        self.moved = true;
        if self.segment_start(seq).is_some() {
            self.marks.push_back(Mark {
                seq,
                index,
                offset: header.chunk_id,
            });
        }
    }

    /// The first offset of the segment chunk `seq` starts, if it starts one.
    fn segment_start(&self, seq: u64) -> Option<u64> {
        self.stream
            .handle()
            .segments()
            .iter()
            .rev()
            .find(|s| s.first_seq == seq && s.chunks > 0)
            .map(|s| s.first_offset)
    }

    /// Writes the chunks `self.stream.next_seq()..upto` from the group's log, walking it from
    /// the mark at or below the files' end (a restored snapshot names what it covers; the
    /// log holds every chunk from its first mark on).
    fn fill_from_log(&mut self, upto: u64, last_index: u64) {
        let have = self.stream.next_seq();
        if have >= upto {
            return;
        }
        let from = match self.marks.iter().rev().find(|m| m.seq <= have).copied() {
            Some(from) => from,
            None => {
                // Retention on the other members deleted what this one lacks: it starts
                // again at their first chunk kept, which the group's log holds.
                let Some(first) = self.marks.front().copied() else {
                    return;
                };
                tracing::info!(log = self.log, have, first_kept = first.seq,
                    "a stream member behind its group's retention starts again at the first chunk kept");
                if let Err(e) = self.stream.restart_at(first.offset, first.seq) {
                    tracing::error!(log = self.log, error = %e,
                        "a stream member could not start again at its group's first chunk");
                    self.failed = true;
                    return;
                }
                self.moved = true;
                first
            }
        };
        let mut seq = from.seq;
        for index in from.index..=last_index {
            if seq >= upto {
                break;
            }
            // An entry the log no longer holds may have been a chunk: going on would number
            // the chunks after it wrongly, so the fill stops there (and says so below).
            let Some(data) =
                warren_cluster::raft_log::read_entry_data(&self.store, self.group, index)
            else {
                break;
            };
            let Some(entry) = RoundEntry::decode(&data) else {
                continue;
            };
            self.write(index, seq, &entry);
            seq += 1;
        }
        if self.stream.next_seq() < upto {
            tracing::error!(
                log = self.log,
                have = self.stream.next_seq(),
                upto,
                "a stream member could not fill its files from the log"
            );
            self.failed = true;
        }
    }

    fn retain(&mut self) {
        if self.retention.max_bytes.is_none() && self.retention.max_age_ms.is_none()
            || self
                .retained_at
                .is_some_and(|at| at.elapsed() < RETENTION_INTERVAL)
        {
            return;
        }
        self.retained_at = Some(Instant::now());
        match self.stream.apply_retention(&self.retention, unix_ms()) {
            Ok(outcome) if outcome.segments_deleted > 0 => {
                let first = self
                    .stream
                    .handle()
                    .segments()
                    .first()
                    .map_or(0, |s| s.first_seq);
                while self.marks.len() > 1 && self.marks[0].seq < first {
                    self.marks.pop_front();
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "stream retention failed")
            }
        }
    }
}

const MARK_BYTES: usize = 24;

/// What a snapshot of a member says: the chunks the log made up to its index, and the marks.
fn encode_snapshot(chunks: u64, index: u64, marks: &VecDeque<Mark>) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + MARK_BYTES * marks.len());
    out.put_u64(chunks);
    out.put_u64(index);
    out.put_u32(marks.len() as u32);
    for m in marks {
        out.put_u64(m.seq);
        out.put_u64(m.index);
        out.put_u64(m.offset);
    }
    out
}

fn decode_snapshot(mut b: &[u8]) -> Option<(u64, u64, VecDeque<Mark>)> {
    if b.len() < 20 {
        return None;
    }
    let (chunks, index, n) = (b.get_u64(), b.get_u64(), b.get_u32() as usize);
    if b.len() != n * MARK_BYTES {
        return None;
    }
    let marks = (0..n)
        .map(|_| Mark {
            seq: b.get_u64(),
            index: b.get_u64(),
            offset: b.get_u64(),
        })
        .collect();
    Some((chunks, index, marks))
}

impl Machine for StreamMember {
    fn apply(&mut self, index: u64, data: Bytes) {
        self.applied = index;
        let Some(entry) = RoundEntry::decode(&data) else {
            tracing::warn!(
                log = self.log,
                index,
                "a stream's log holds an entry that is no chunk: skipped"
            );
            return;
        };
        let seq = self.chunks;
        self.chunks += 1;
        self.write(index, seq, &entry);
        if entry.writer == self.writer_id {
            self.rounds.applied(entry.round);
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        encode_snapshot(self.chunks, self.applied, &self.marks)
    }

    fn restore(&mut self, data: &[u8]) {
        let Some((chunks, index, marks)) = decode_snapshot(data) else {
            tracing::error!(
                log = self.log,
                "a stream member's snapshot does not decode: ignored"
            );
            return;
        };
        self.chunks = chunks;
        self.applied = index;
        self.marks = marks;
        self.fill_from_log(chunks, index);
        self.moved = true;
        self.retained_at = None;
    }

    fn live_from(&self) -> u64 {
        self.marks.front().map_or(u64::MAX, |m| m.index)
    }

    fn flush(&mut self, _caught_up: bool) {
        if self.moved {
            self.moved = false;
            let end = self.stream.next_offset();
            self.stream.set_commit_end(end);
            self.committed.send_replace(end);
        }
        self.retain();
    }

    fn removed(&mut self) {
        if let Some(done) = self.on_removed.take() {
            done();
        }
        if let Some(shared) = self.consumers.upgrade() {
            let consumers: &Consumers = &shared.streams_consumers;
            consumers.stop_stream(self.log);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "deleted stream's files left");
        }
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// This node's member of the stream a replica of the cluster is of: its state machine, with
/// its files and writer opened; `None` when the replica is no stream's. A member open already
/// (its declare replayed) gets a machine the groups drop, as they drop any second one.
pub fn member(
    shared: &Arc<crate::Shared>,
    replica: &warren_cluster::replicas::QueueReplica,
) -> Option<Box<dyn Machine>> {
    let v = shared.broker.vhost(&replica.vhost)?;
    let (log, config) = v.lock().expect("vhost lock").stream_of(&replica.queue)?;
    let cluster = shared.cluster.as_ref()?;
    let Some(store) = shared.store.clone() else {
        tracing::error!(queue = %replica.queue, "a stream member needs the node's storage engine");
        return Some(Box::new(Opened));
    };
    let group = replica.group;
    let (proposing, viewing) = (
        cluster.queue_groups().clone(),
        cluster.queue_groups().clone(),
    );
    let proposer = super::writer::Proposer {
        propose: Box::new(move |data, done| {
            proposing.send(warren_cluster::groups::Input::Propose {
                group,
                data,
                done: Some(done),
            })
        }),
        term: Box::new(move || viewing.view(group).map_or(0, |v| v.term)),
    };
    let opened =
        shared
            .streams
            .open_member(log, config.segment_bytes, &shared.durability, proposer);
    let parts = match opened {
        Ok(Some(parts)) => parts,
        Ok(None) => return Some(Box::new(Opened)),
        Err(e) => {
            tracing::error!(queue = %replica.queue, error = %e, "a stream member could not open its files");
            return Some(Box::new(Opened));
        }
    };
    let weak = Arc::downgrade(shared);
    let on_removed = {
        let weak = weak.clone();
        Box::new(move || {
            if let Some(s) = weak.upgrade() {
                s.streams.member_removed(log);
            }
        })
    };
    let retention = Retention {
        max_bytes: config.max_bytes,
        max_age_ms: config.max_age_ms,
    };
    Some(Box::new(StreamMember::new(
        log, group, parts, retention, store, on_removed, weak,
    )))
}

/// The machine given for a member open already (or that could not open): the groups keep the
/// open one and drop this; were it ever applied to, it holds nothing.
struct Opened;

impl Machine for Opened {
    fn apply(&mut self, _index: u64, _data: Bytes) {}
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }
    fn restore(&mut self, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_entry_decodes_as_encoded_and_nothing_else_decodes() {
        let e = RoundEntry {
            writer: 7,
            round: 3,
            part: 1,
            parts: 2,
            timestamp_ms: 1_700_000_000_000,
            epoch: 4,
            messages: vec![b"one", b"", b"three"],
        };
        let bytes = e.encode();
        assert_eq!(RoundEntry::decode(&bytes), Some(e));
        for cut in 0..bytes.len() {
            assert_eq!(RoundEntry::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert_eq!(RoundEntry::decode(&longer), None);
        assert_eq!(
            RoundEntry::decode(b"\x08\x01protobuf of a conf change"),
            None
        );
    }

    #[test]
    fn a_round_is_committed_once_all_its_parts_are_applied_and_refused_when_passed_over() {
        let rounds = Rounds::default();
        rounds.applied(1);
        rounds.applied(1);
        assert_eq!(rounds.wait(1, 2), RoundOutcome::Committed);
        rounds.refused(2);
        assert_eq!(rounds.wait(2, 1), RoundOutcome::Refused);
        rounds.applied(4);
        assert_eq!(rounds.wait(3, 1), RoundOutcome::Committed);
        rounds.stop();
        assert_eq!(rounds.wait(5, 1), RoundOutcome::Stopped);
    }

    #[test]
    fn a_snapshot_decodes_as_encoded() {
        let marks: VecDeque<Mark> = [
            Mark {
                seq: 0,
                index: 3,
                offset: 0,
            },
            Mark {
                seq: 9,
                index: 20,
                offset: 700,
            },
        ]
        .into();
        let b = encode_snapshot(12, 25, &marks);
        assert_eq!(decode_snapshot(&b), Some((12, 25, marks)));
        assert_eq!(decode_snapshot(&b[..b.len() - 1]), None);
    }
}
