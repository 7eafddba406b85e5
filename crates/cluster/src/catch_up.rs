//! A member installing a leader's snapshot fetches the entries kept below it in chunks, off
//! the groups loop, instead of receiving them inside the snapshot.
//!
//! A quorum queue's snapshot names its waiting messages, whose bodies are in the log entries
//! that enqueued them ([`crate::snapshot_transfer`]). Carried inside the snapshot, a backlog of
//! gigabytes would be one message held whole in the leader's memory, the transport's and the
//! follower's. So past [`crate::groups::GroupsTiming::catch_up_chunk_bytes`] the snapshot
//! only names the range, and the member receiving it:
//! 1. holds the snapshot's ready (raft-rs waits for it: the group is paused on this node, it
//!    neither answers nor ticks nor votes) and readies its log to start at the range;
//! 2. asks a member for the range one chunk at a time (the snapshot's sender first, then the
//!    other voters), writing each chunk to its log as it comes: memory holds one chunk;
//! 3. tells the loop, which installs the snapshot on the entries now below it and goes on.
//!
//! Any member whose log holds the snapshot's last entry with its term holds the same entries
//! below it (Raft's log matching), so any of them may answer. An entry a member no longer has
//! was released there: its message was settled by a later entry, which this member applies
//! soon after, so the answer starts past it and the fetch skips it. The asked member reads
//! its store on this thread, never on the loop.
//!
//! A crash mid-fetch leaves a log that matches no snapshot on disk: the marker file
//! [`RESTORING`] says so, and the log is reset to the snapshot on disk at the next start
//! ([`crate::raft_log::RaftLog::open`]); such a member does not vote until it has caught up
//! again, since it may have lost entries it had acknowledged.

use crate::groups::Input;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use protobuf::Message as _;
use raft::eraftpb::Entry;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_store::Store;

/// The marker file in a group's directory while a fetch is under way: the snapshot index
/// being installed (8 bytes, little endian).
pub const RESTORING: &str = "restoring";

/// How long a chunk is waited for before the next member is asked.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// How a catch-up message reaches a peer node; false if the link is down.
pub type SendCatchUp = Arc<dyn Fn(u64, &CatchUpMessage) -> bool + Send + Sync>;

/// What members exchange to fetch the entries below a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum CatchUpMessage {
    /// Entries `from..=to` of `group`, at most `max_bytes` of them; `to` has term `to_term`.
    Fetch {
        group: u64,
        from: u64,
        to: u64,
        to_term: u64,
        max_bytes: u32,
    },
    /// The entries from `start` on (as stored: serialised raft entries); `start` is past the
    /// asked `from` when those before it were released, and past `to` when all were.
    /// `prev_term` is the term of `start - 1`.
    Chunk {
        group: u64,
        start: u64,
        prev_term: u64,
        entries: Vec<Bytes>,
    },
    /// The asked member's log does not hold the asked `to` with its term (it is behind, or
    /// holds no replica): ask another.
    Behind { group: u64 },
}

const M_FETCH: u8 = 1;
const M_CHUNK: u8 = 2;
const M_BEHIND: u8 = 3;

impl CatchUpMessage {
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            CatchUpMessage::Fetch {
                group,
                from,
                to,
                to_term,
                max_bytes,
            } => {
                out.put_u8(M_FETCH);
                out.put_u64_le(*group);
                out.put_u64_le(*from);
                out.put_u64_le(*to);
                out.put_u64_le(*to_term);
                out.put_u32_le(*max_bytes);
            }
            CatchUpMessage::Chunk {
                group,
                start,
                prev_term,
                entries,
            } => {
                out.put_u8(M_CHUNK);
                out.put_u64_le(*group);
                out.put_u64_le(*start);
                out.put_u64_le(*prev_term);
                out.put_u32_le(entries.len() as u32);
                for e in entries {
                    out.put_u32_le(e.len() as u32);
                    out.extend_from_slice(e);
                }
            }
            CatchUpMessage::Behind { group } => {
                out.put_u8(M_BEHIND);
                out.put_u64_le(*group);
            }
        }
    }

    pub fn decode(mut p: Bytes) -> Result<CatchUpMessage, String> {
        let short = || "a short catch-up message".to_string();
        let u64_of = |p: &mut Bytes| (p.len() >= 8).then(|| p.get_u64_le()).ok_or_else(short);
        if p.is_empty() {
            return Err(short());
        }
        Ok(match p.get_u8() {
            M_FETCH => {
                let (group, from, to, to_term) = (
                    u64_of(&mut p)?,
                    u64_of(&mut p)?,
                    u64_of(&mut p)?,
                    u64_of(&mut p)?,
                );
                if p.len() != 4 {
                    return Err(short());
                }
                CatchUpMessage::Fetch {
                    group,
                    from,
                    to,
                    to_term,
                    max_bytes: p.get_u32_le(),
                }
            }
            M_CHUNK => {
                let (group, start, prev_term) = (u64_of(&mut p)?, u64_of(&mut p)?, u64_of(&mut p)?);
                if p.len() < 4 {
                    return Err(short());
                }
                let count = p.get_u32_le() as usize;
                let mut entries = Vec::with_capacity(count.min(p.len() / 4));
                for _ in 0..count {
                    if p.len() < 4 {
                        return Err(short());
                    }
                    let n = p.get_u32_le() as usize;
                    if p.len() < n {
                        return Err(short());
                    }
                    entries.push(p.split_to(n));
                }
                if !p.is_empty() {
                    return Err("bytes after a catch-up chunk".into());
                }
                CatchUpMessage::Chunk {
                    group,
                    start,
                    prev_term,
                    entries,
                }
            }
            M_BEHIND => CatchUpMessage::Behind {
                group: u64_of(&mut p)?,
            },
            other => return Err(format!("unknown catch-up message {other}")),
        })
    }
}

/// A fetch the loop starts: the entries `first..=to` below a snapshot at `to` (term
/// `to_term`), from `sources` in order (the snapshot's sender first).
#[derive(Debug, Clone)]
pub struct FetchJob {
    pub group: u64,
    pub first: u64,
    pub to: u64,
    pub to_term: u64,
    pub sources: Vec<u64>,
}

/// What the catch-up thread is told.
pub enum CatchUpInput {
    Start(FetchJob),
    /// The group closed: its fetch stops.
    Cancel(u64),
    Received {
        from: u64,
        message: CatchUpMessage,
    },
    /// The loop stopped.
    Stop,
}

/// A fetch under way.
struct Fetch {
    job: FetchJob,
    /// The next entry wanted.
    next: u64,
    /// Which of the sources is asked now.
    source: usize,
    asked: Instant,
    chunks: u64,
}

/// Starts the thread; it reports finished fetches to the loop's `inputs`.
pub fn start(
    store: Arc<Store>,
    send: SendCatchUp,
    chunk_bytes: usize,
    inputs: crate::groups::InputSender,
) -> Result<(Sender<CatchUpInput>, std::thread::JoinHandle<()>), String> {
    let (tx, rx) = std::sync::mpsc::channel::<CatchUpInput>();
    let thread = std::thread::Builder::new()
        .name("queue-groups-catch-up".into())
        .spawn(move || {
            CatchUp {
                store,
                send,
                chunk_bytes,
                inputs,
                fetches: HashMap::new(),
            }
            .run(rx)
        })
        .map_err(|e| e.to_string())?;
    Ok((tx, thread))
}

struct CatchUp {
    store: Arc<Store>,
    send: SendCatchUp,
    chunk_bytes: usize,
    inputs: crate::groups::InputSender,
    fetches: HashMap<u64, Fetch>,
}

impl CatchUp {
    fn run(mut self, rx: Receiver<CatchUpInput>) {
        loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(CatchUpInput::Start(job)) => {
                    let mut f = Fetch {
                        next: job.first,
                        job,
                        source: 0,
                        asked: Instant::now(),
                        chunks: 0,
                    };
                    self.ask(&mut f);
                    self.fetches.insert(f.job.group, f);
                }
                Ok(CatchUpInput::Cancel(group)) => {
                    self.fetches.remove(&group);
                }
                Ok(CatchUpInput::Received { from, message }) => self.received(from, message),
                Err(RecvTimeoutError::Timeout) => {}
                Ok(CatchUpInput::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            }
            let send = self.send.clone();
            let chunk_bytes = self.chunk_bytes;
            for f in self.fetches.values_mut() {
                if f.asked.elapsed() >= ANSWER_WAIT {
                    f.source += 1;
                    ask(&send, chunk_bytes, f);
                }
            }
        }
    }

    fn ask(&self, f: &mut Fetch) {
        ask(&self.send, self.chunk_bytes, f);
    }

    fn received(&mut self, from: u64, message: CatchUpMessage) {
        match message {
            CatchUpMessage::Fetch {
                group,
                from: low,
                to,
                to_term,
                max_bytes,
            } => {
                let answer = serve(&self.store, group, low, to, to_term, max_bytes as usize);
                (self.send)(from, &answer);
            }
            CatchUpMessage::Behind { group } => {
                if let Some(f) = self.fetches.get_mut(&group) {
                    if f.job.sources.get(f.source % f.job.sources.len()) == Some(&from) {
                        f.source += 1;
                        ask(&self.send, self.chunk_bytes, f);
                    }
                }
            }
            CatchUpMessage::Chunk {
                group,
                start,
                prev_term,
                entries,
            } => {
                let Some(f) = self.fetches.get_mut(&group) else {
                    return;
                };
                if f.job.sources.get(f.source % f.job.sources.len()) != Some(&from) {
                    return;
                }
                match write(&self.store, f, start, prev_term, entries) {
                    Ok(true) => {
                        let f = self.fetches.remove(&group).expect("present");
                        tracing::info!(
                            group,
                            entries = f.job.to + 1 - f.job.first,
                            chunks = f.chunks,
                            "a snapshot's entries were fetched"
                        );
                        let _ = self.inputs.send(Input::Fetched { group });
                    }
                    Ok(false) => ask(&self.send, self.chunk_bytes, f),
                    Err(e) => {
                        tracing::warn!(group, from, error = %e, "a catch-up chunk was refused: asking another member");
                        f.source += 1;
                        ask(&self.send, self.chunk_bytes, f);
                    }
                }
            }
        }
    }
}

/// Writes a chunk to the group's log; true once the fetch is complete.
fn write(
    store: &Store,
    f: &mut Fetch,
    start: u64,
    prev_term: u64,
    entries: Vec<Bytes>,
) -> Result<bool, String> {
    let group = f.job.group;
    let err = |e: warren_store::Error| e.to_string();
    if start < f.next {
        return Err(format!("a chunk from {start} when {} was asked", f.next));
    }
    if start > f.next {
        // Released where it was asked: what this member has below `start` goes too
        // (settled as well), and the log starts again at `start`.
        store
            .release_prefix(group, start - 1, prev_term, Bytes::new())
            .map_err(err)?;
        f.next = start;
    }
    if start > f.job.to || entries.is_empty() {
        return Ok(true);
    }
    let mut stored = Vec::with_capacity(entries.len());
    for payload in entries {
        let e = Entry::parse_from_bytes(&payload).map_err(|e| e.to_string())?;
        if e.index != f.next + stored.len() as u64 || e.index > f.job.to {
            return Err(format!("a chunk's entry {} out of place", e.index));
        }
        stored.push(warren_store::Entry {
            index: e.index,
            term: e.term,
            payload,
        });
    }
    for chunk in stored.chunks(warren_store::config::APPEND_ENTRIES_MAX) {
        store.append_blocking(group, chunk).map_err(err)?;
    }
    f.next += stored.len() as u64;
    f.chunks += 1;
    Ok(f.next > f.job.to)
}

fn ask(send: &SendCatchUp, chunk_bytes: usize, f: &mut Fetch) {
    f.asked = Instant::now();
    if f.job.sources.is_empty() {
        return;
    }
    let to = f.job.sources[f.source % f.job.sources.len()];
    send(
        to,
        &CatchUpMessage::Fetch {
            group: f.job.group,
            from: f.next,
            to: f.job.to,
            to_term: f.job.to_term,
            max_bytes: chunk_bytes.min(u32::MAX as usize) as u32,
        },
    );
}

/// The answer to a fetch, from this node's copy of the group's log.
fn serve(
    store: &Store,
    group: u64,
    from: u64,
    to: u64,
    to_term: u64,
    max_bytes: usize,
) -> CatchUpMessage {
    let behind = CatchUpMessage::Behind { group };
    let Some(info) = store.log_info(group) else {
        return behind;
    };
    if info.first_index > to && store.term(group, info.first_index - 1).is_some() {
        // Everything asked was released here: settled, as this log's snapshot says.
        if store.hard_state(group).is_some_and(|hs| hs.commit >= to) {
            return CatchUpMessage::Chunk {
                group,
                start: info.first_index,
                prev_term: store.term(group, info.first_index - 1).unwrap_or(0),
                entries: Vec::new(),
            };
        }
        return behind;
    }
    if info.last_index < to || store.term(group, to) != Some(to_term) {
        return behind;
    }
    let start = from.max(info.first_index);
    let Some(prev_term) = store.term(group, start - 1) else {
        return behind;
    };
    let entries = match store.read_range(group, start, to + 1, max_bytes.max(1)) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(group, error = %e, "entries asked for by a catching-up member cannot be read");
            return behind;
        }
    };
    if entries.first().is_some_and(|e| e.index != start)
        || entries.windows(2).any(|w| w[1].index != w[0].index + 1)
    {
        return behind;
    }
    CatchUpMessage::Chunk {
        group,
        start,
        prev_term,
        entries: entries
            .into_iter()
            .map(crate::stored_entry::portable)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_back_as_they_went() {
        let all = [
            CatchUpMessage::Fetch {
                group: 7,
                from: 10,
                to: 90,
                to_term: 3,
                max_bytes: 4 << 20,
            },
            CatchUpMessage::Chunk {
                group: 7,
                start: 12,
                prev_term: 2,
                entries: vec![Bytes::from_static(b"one"), Bytes::new()],
            },
            CatchUpMessage::Behind { group: 7 },
        ];
        for m in all {
            let mut out = BytesMut::new();
            m.encode(&mut out);
            let bytes = out.freeze();
            assert_eq!(CatchUpMessage::decode(bytes.clone()).unwrap(), m);
            for cut in 0..bytes.len() {
                assert!(
                    CatchUpMessage::decode(bytes.slice(..cut)).is_err(),
                    "{m:?} cut at {cut}"
                );
            }
        }
    }
}
