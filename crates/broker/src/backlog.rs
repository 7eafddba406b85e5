//! A queue's ready messages, by priority, with the bodies of a long backlog left on disk.
//!
//! Every stored message (a persistent one in a durable queue, any message of a quorum queue)
//! is in the storage engine already, so keeping its body in memory too is only a cache. A
//! backlog that outgrows its queue's limits (x-max-in-memory-length / -bytes, x-queue-mode
//! lazy) or the node's [`MemoryBudget`] keeps its head in memory and its tail as 16 bytes per
//! message: the index in the queue's log, the body size and the redelivery count. Consumers
//! reaching the tail read the bodies back in batches through a [`PayloadSource`].
//!
//! Order is kept by construction: each priority level is `mem` (the oldest messages, bodies
//! in memory) followed by `tail` (the rest), both sorted by arrival (`seq`). Once a level has
//! a tail, new messages join the tail, so the tail is always a suffix; loading moves its front
//! into `mem`; a requeued message goes back to its place by `seq`, in `mem` or in the tail.
//!
//! Paging out happens only in [`Backlog::page_out`], which the server calls once a command's
//! appends are in the engine: a message whose append is still on its way cannot be read back,
//! so messages pushed into a tail keep their body (`recent`) until then.

use crate::message::{decode_stored, MessageRef};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct QueuedMessage {
    pub msg: MessageRef,
    pub redelivered: bool,
    /// How many times this message was delivered and returned (x-delivery-count of quorum queues).
    pub delivery_count: u32,
    /// Milliseconds since the broker's epoch after which the message is dead.
    pub expires_at_ms: Option<u64>,
    /// Arrival order in its queue, set by [`Backlog::push_back`]: a requeue puts the message
    /// back at this position, as RabbitMQ's classic queues do.
    pub seq: u64,
    /// Its index in the queue's log when it is stored (a persistent message in a durable
    /// queue, or any message in a quorum queue).
    pub store_index: Option<u64>,
}

/// Where the bodies of paged-out messages are read back from: the storage engine, seen from
/// a crate that does not depend on it.
pub trait PayloadSource: Send + Sync {
    /// The stored payloads of `log` with an index in `from..to` that are not released, in
    /// index order, stopping once about `max_bytes` are gathered (at least one entry if any).
    fn read(
        &self,
        log: u64,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Bytes)>, String>;
}

/// The node-wide allowance for message bodies held in memory by queues that can page: when
/// the sum is over it, every such queue keeps only a short head in memory.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: AtomicUsize,
    used: AtomicUsize,
}

impl MemoryBudget {
    pub fn new(limit_bytes: usize) -> Self {
        MemoryBudget {
            limit: AtomicUsize::new(limit_bytes),
            used: AtomicUsize::new(0),
        }
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    fn over(&self) -> bool {
        self.used() > self.limit()
    }

    fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What a queue needs to page: where to read bodies back, the node's budget, and the clock
/// offset that turns stored wall-clock expiries back into broker time.
#[derive(Clone)]
pub struct Paging {
    pub source: Arc<dyn PayloadSource>,
    pub budget: Arc<MemoryBudget>,
    pub unix_ms_at_epoch: u64,
}

impl std::fmt::Debug for Paging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paging")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// Most messages read back in one load: one engine read, amortised over the batch.
const LOAD_BATCH: usize = 256;
/// Most payload bytes read back in one load (always at least one message).
const LOAD_BATCH_BYTES: usize = 4 << 20;
/// Messages each queue keeps in memory while the node is over its budget: enough for the
/// next deliveries, few enough that 10,000 queues stay small.
const BUDGET_WINDOW: usize = 16;
/// Memory a message in a queue costs besides its body and properties (the message, its
/// queue entry, the shared pointer, exchange and routing key): counted against the budget.
const MESSAGE_OVERHEAD_BYTES: usize = 256;

/// A paged-out message: 24 bytes instead of the message.
#[derive(Debug, Clone, Copy)]
struct Paged {
    /// Its log index, or [`HELD`] for a message that is not stored (a transient message that
    /// arrived while the level had a tail): that one is the next of `held`.
    index: u64,
    /// Its arrival order, kept so that a requeue finds its place in the tail too.
    seq: u64,
    /// Body bytes, for x-max-length-bytes (estimated from the stored size after a restart,
    /// corrected when the message is read back).
    bytes: u32,
    /// Delivery count, with [`REDELIVERED`] set when the message was delivered before.
    returns: u32,
}

const HELD: u64 = u64::MAX;
const REDELIVERED: u32 = 1 << 31;

/// Bytes a stored message adds around its body (the envelope of `encode_stored` with empty
/// exchange, routing key and properties): what a restart subtracts to estimate a body size.
const STORED_ENVELOPE_BYTES: u32 = 5;

#[derive(Debug, Default)]
struct Level {
    /// The oldest messages of the level, bodies in memory; sorted by `seq`.
    mem: VecDeque<QueuedMessage>,
    /// The rest, in arrival order.
    tail: VecDeque<Paged>,
    /// Transient messages standing in the tail, in order.
    held: VecDeque<QueuedMessage>,
    /// Stored messages that joined the tail since the last [`Backlog::page_out`], in order:
    /// their appends may not have reached the engine yet, so they keep their bodies.
    recent: VecDeque<QueuedMessage>,
}

impl Level {
    fn is_empty(&self) -> bool {
        self.mem.is_empty() && self.tail.is_empty()
    }
}

/// Of two levels whose heads are in memory, the one whose head arrived first.
fn older(levels: &[Level]) -> Option<usize> {
    let seq = |l: &Level| l.mem.front().map(|m| m.seq);
    match (seq(levels.first()?), seq(levels.get(1)?)) {
        (Some(a), Some(b)) => Some(if a < b { 0 } else { 1 }),
        _ => None,
    }
}

/// The paging state of a queue whose messages are stored.
#[derive(Debug)]
struct Pager {
    log: u64,
    paging: Paging,
    /// x-max-in-memory-length (0 for a lazy queue).
    max_len: usize,
    /// x-max-in-memory-bytes.
    max_bytes: usize,
    /// Messages with their bodies in memory (`mem`, `held` and `recent`), their body bytes and
    /// their cost against the budget.
    mem_len: usize,
    mem_bytes: usize,
    mem_cost: usize,
    /// Stored messages found missing or unreadable when read back, for the queue to settle.
    lost: Vec<u64>,
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.paging.budget.sub(self.mem_cost);
    }
}

impl Pager {
    fn hold(&mut self, m: &QueuedMessage) {
        let cost = cost(m);
        self.mem_len += 1;
        self.mem_bytes += m.msg.size_bytes();
        self.mem_cost += cost;
        self.paging.budget.add(cost);
    }

    fn unhold(&mut self, m: &QueuedMessage) {
        let cost = cost(m);
        self.mem_len -= 1;
        self.mem_bytes -= m.msg.size_bytes();
        self.mem_cost -= cost;
        self.paging.budget.sub(cost);
    }

    /// Whether bodies in memory exceed what the queue or the node allows. One message always
    /// stays, so that the head can be delivered without a read per look.
    fn over(&self) -> bool {
        self.mem_len > 1
            && (self.mem_len > self.max_len
                || self.mem_bytes > self.max_bytes
                || (self.mem_len > BUDGET_WINDOW && self.paging.budget.over()))
    }

    /// How many messages a load may bring into memory without being over at once.
    fn load_room(&self) -> usize {
        let mut room = LOAD_BATCH.min(self.max_len);
        if self.paging.budget.over() {
            room = room.min(BUDGET_WINDOW);
        }
        room.saturating_sub(self.mem_len).max(1)
    }
}

fn cost(m: &QueuedMessage) -> usize {
    m.msg.body.len() + m.msg.properties.len() + MESSAGE_OVERHEAD_BYTES
}

impl Paged {
    fn of(m: &QueuedMessage, index: u64) -> Self {
        Paged {
            index,
            seq: m.seq,
            bytes: m.msg.size_bytes().min(u32::MAX as usize) as u32,
            returns: m.delivery_count.min(REDELIVERED - 1)
                | if m.redelivered { REDELIVERED } else { 0 },
        }
    }
}

/// Ready messages, one FIFO per priority level (one level without x-max-priority).
#[derive(Debug, Default)]
pub struct Backlog {
    levels: Vec<Level>,
    len: usize,
    bytes: usize,
    next_seq: u64,
    /// Set for queues whose messages are stored, when the node has a store to read from.
    pager: Option<Pager>,
    /// Two levels weighed as RabbitMQ 4's quorum queues weigh them ([`Backlog::two_priorities`])
    /// rather than the higher level always first.
    weighted: bool,
    /// Messages taken while weighted, modulo `WEIGHT + 1`: at `WEIGHT` the older head goes.
    served: u8,
}

/// Of every `WEIGHT + 1` messages taken while both priorities wait, `WEIGHT` are high.
const WEIGHT: u8 = 2;

/// What a purge took out of a backlog.
#[derive(Debug, Default)]
pub struct Cleared {
    pub count: usize,
    /// Log indexes of the stored messages among them, to release.
    pub stored: Vec<u64>,
}

impl Backlog {
    pub fn new(max_priority: Option<u8>) -> Self {
        let n = max_priority.map(|p| p as usize + 1).unwrap_or(1);
        Backlog {
            levels: (0..n).map(|_| Level::default()).collect(),
            len: 0,
            bytes: 0,
            next_seq: 0,
            pager: None,
            weighted: false,
            served: 0,
        }
    }

    /// A quorum queue's: RabbitMQ 4's two priorities, normal (0-4, or none) and high (above
    /// 4), high messages taken two to one while both wait, the third being the older head,
    /// so that normal ones are never starved (rabbit_fifo_q's weighted out).
    pub fn two_priorities() -> Self {
        Backlog {
            weighted: true,
            ..Backlog::new(Some(1))
        }
    }

    /// Lets the backlog page the bodies of `log`'s messages out: `max_len` / `max_bytes` are the
    /// queue's in-memory limits (`None`: only the node's budget applies; lazy: `Some(0)`).
    pub fn enable_paging(
        &mut self,
        log: u64,
        paging: Paging,
        max_len: Option<u64>,
        max_bytes: Option<u64>,
    ) {
        let clamp = |v: Option<u64>| v.map_or(usize::MAX, |v| v.min(usize::MAX as u64) as usize);
        let mut pager = Pager {
            log,
            paging,
            max_len: clamp(max_len),
            max_bytes: clamp(max_bytes),
            mem_len: 0,
            mem_bytes: 0,
            mem_cost: 0,
            lost: Vec::new(),
        };
        for level in &self.levels {
            for m in level.mem.iter().chain(&level.held).chain(&level.recent) {
                pager.hold(m);
            }
        }
        self.pager = Some(pager);
    }

    fn level_of(&self, m: &QueuedMessage) -> usize {
        if self.weighted {
            return (m.msg.priority > 4) as usize;
        }
        (m.msg.priority as usize).min(self.levels.len() - 1)
    }

    /// Appends a message; returns the sequence number it got.
    pub fn push_back(&mut self, mut m: QueuedMessage) -> u64 {
        let seq = self.next_seq;
        m.seq = seq;
        self.next_seq += 1;
        self.len += 1;
        self.bytes += m.msg.size_bytes();
        if let Some(p) = &mut self.pager {
            p.hold(&m);
        }
        let l = self.level_of(&m);
        let level = &mut self.levels[l];
        if level.tail.is_empty() {
            level.mem.push_back(m);
        } else if let Some(index) = m.store_index {
            level.tail.push_back(Paged::of(&m, index));
            level.recent.push_back(m);
        } else {
            level.tail.push_back(Paged::of(&m, HELD));
            level.held.push_back(m);
        }
        seq
    }

    /// Takes back the message just appended with `seq`, if it is still the newest of its level.
    pub fn pop_back_if(&mut self, seq: u64) -> Option<QueuedMessage> {
        let level = self.levels.iter_mut().find(|l| {
            if l.tail.is_empty() {
                l.mem.back().is_some_and(|m| m.seq == seq)
            } else {
                let from = if l.tail.back().is_some_and(|p| p.index == HELD) {
                    &l.held
                } else {
                    &l.recent
                };
                from.back().is_some_and(|m| m.seq == seq)
            }
        })?;
        let m = if level.tail.is_empty() {
            level.mem.pop_back()
        } else {
            let p = level.tail.pop_back().expect("found at the back");
            if p.index == HELD {
                level.held.pop_back()
            } else {
                level.recent.pop_back()
            }
        }
        .expect("found at the back");
        self.taken(&m);
        Some(m)
    }

    fn taken(&mut self, m: &QueuedMessage) {
        self.len -= 1;
        self.bytes -= m.msg.size_bytes();
        if let Some(p) = &mut self.pager {
            p.unhold(m);
        }
    }

    fn returned(&mut self, m: &QueuedMessage) -> usize {
        self.len += 1;
        self.bytes += m.msg.size_bytes();
        if let Some(p) = &mut self.pager {
            p.hold(m);
        }
        self.level_of(m)
    }

    /// Returns a delivered message to its original position, ahead of everything that arrived
    /// after it, whatever order the requeues come in (several channels, single nacks). The
    /// position is near the head in practice, so the insert moves few entries.
    pub fn requeue(&mut self, m: QueuedMessage) {
        let l = self.returned(&m);
        let level = &mut self.levels[l];
        if level.tail.front().is_some_and(|p| p.seq < m.seq) {
            // Younger than the head of the tail (messages older than it were paged out while
            // it was out): back into the tail. Its append was carried out long ago, so a
            // stored one leaves its body on disk.
            let i = level.tail.partition_point(|p| p.seq < m.seq);
            match m.store_index {
                Some(index) => {
                    level.tail.insert(i, Paged::of(&m, index));
                    self.pager.as_mut().expect("a tail has a pager").unhold(&m);
                }
                None => {
                    level.tail.insert(i, Paged::of(&m, HELD));
                    let j = level.held.partition_point(|x| x.seq < m.seq);
                    level.held.insert(j, m);
                }
            }
            return;
        }
        let i = level.mem.partition_point(|x| x.seq < m.seq);
        level.mem.insert(i, m);
    }

    /// Returns a delivered message as a quorum queue does (rabbit_fifo's `returns` queue):
    /// after the messages returned before it and not yet redelivered, ahead of all others.
    /// Returned messages stay at the front of their level.
    pub fn requeue_after_returns(&mut self, m: QueuedMessage) {
        debug_assert!(m.redelivered, "only returned messages go here");
        let l = self.returned(&m);
        let mem = &mut self.levels[l].mem;
        // A linear scan, not a binary search: a rejected message requeued at the back is
        // redelivered too, so redelivered ones are not only at the front.
        let i = mem.iter().position(|x| !x.redelivered).unwrap_or(mem.len());
        mem.insert(i, m);
    }

    /// The level served next, with its head in memory (read back if need be): the highest
    /// level holding a message, or, weighted, every third time the older of the two heads.
    fn head_level(&mut self) -> Option<usize> {
        if self.weighted && self.served == WEIGHT {
            if let Some(l) = self.older_head_level() {
                return Some(l);
            }
        }
        loop {
            let l = self
                .levels
                .iter()
                .rposition(|l| !l.mem.is_empty() || !l.tail.is_empty())?;
            if !self.levels[l].mem.is_empty() || self.load(l) {
                return Some(l);
            }
        }
    }

    /// With both priorities waiting: the level whose head arrived first (read back if need
    /// be); `None` when one is empty or a head could not be read.
    fn older_head_level(&mut self) -> Option<usize> {
        if self.levels.iter().any(Level::is_empty) {
            return None;
        }
        for l in 0..self.levels.len() {
            if self.levels[l].mem.is_empty() && !self.load(l) {
                return None;
            }
        }
        older(&self.levels)
    }

    /// The head if its body is in memory: a look that never reads from disk.
    pub fn peek_in_memory(&self) -> Option<&QueuedMessage> {
        if self.weighted && self.served == WEIGHT && self.levels.iter().all(|l| !l.is_empty()) {
            return older(&self.levels).and_then(|l| self.levels[l].mem.front());
        }
        let level = self
            .levels
            .iter()
            .rev()
            .find(|l| !l.mem.is_empty() || !l.tail.is_empty())?;
        level.mem.front()
    }

    pub fn peek(&mut self) -> Option<&QueuedMessage> {
        let l = self.head_level()?;
        self.levels[l].mem.front()
    }

    pub fn pop_front(&mut self) -> Option<QueuedMessage> {
        let l = self.head_level()?;
        let m = self.levels[l]
            .mem
            .pop_front()
            .expect("head level has a head");
        self.taken(&m);
        if self.weighted {
            self.served = if self.served >= WEIGHT {
                0
            } else {
                self.served + 1
            };
        }
        Some(m)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Body bytes of every ready message, paged out or not.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Messages whose bodies are on disk only (RabbitMQ's `messages_paged_out`).
    pub fn paged_out(&self) -> usize {
        self.pager.as_ref().map_or(0, |p| self.len - p.mem_len)
    }

    pub fn clear(&mut self) -> Cleared {
        let mut out = Cleared {
            count: self.len,
            stored: Vec::new(),
        };
        for level in &mut self.levels {
            out.stored
                .extend(level.mem.drain(..).filter_map(|m| m.store_index));
            out.stored.extend(
                level
                    .tail
                    .drain(..)
                    .filter(|p| p.index != HELD)
                    .map(|p| p.index),
            );
            level.held.clear();
            level.recent.clear();
        }
        self.len = 0;
        self.bytes = 0;
        if let Some(p) = &mut self.pager {
            p.paging.budget.sub(p.mem_cost);
            p.mem_len = 0;
            p.mem_bytes = 0;
            p.mem_cost = 0;
        }
        out
    }

    /// Drops the bodies of messages beyond the in-memory limits, now that every append made
    /// so far is in the engine and can be read back. Bodies go from the back: the lowest
    /// priority first, the youngest first.
    pub fn page_out(&mut self) {
        let Some(p) = &mut self.pager else { return };
        for level in &mut self.levels {
            for m in level.recent.drain(..) {
                p.unhold(&m);
            }
        }
        for level in &mut self.levels {
            while p.over() {
                let Some(index) = level.mem.back().and_then(|m| m.store_index) else {
                    // Empty, or a transient message that only memory holds.
                    break;
                };
                let m = level.mem.pop_back().expect("has a back");
                p.unhold(&m);
                level.tail.push_front(Paged::of(&m, index));
            }
        }
    }

    /// Stored messages that could not be read back: gone from the queue, still to settle.
    pub fn take_lost(&mut self) -> Vec<u64> {
        self.pager
            .as_mut()
            .map(|p| std::mem::take(&mut p.lost))
            .unwrap_or_default()
    }

    /// Puts the live entries of the queue's log back after a restart, as paged-out messages
    /// marked redelivered: `entries` holds (index, stored size) in index order. A queue with
    /// priorities reads each one to learn its level.
    pub fn restore(&mut self, entries: &[(u64, u32)]) {
        let Some(p) = &self.pager else { return };
        let source = p.paging.source.clone();
        let log = p.log;
        let levels = self.levels.len();
        for chunk in entries.chunks(LOAD_BATCH) {
            let mut priorities = Vec::new();
            if levels > 1 {
                let (from, to) = (chunk[0].0, chunk[chunk.len() - 1].0 + 1);
                match read_all(&*source, log, from, to) {
                    Ok(read) => {
                        priorities = read
                            .iter()
                            .map(|(i, raw)| {
                                let (m, _) = decode_stored(raw)?;
                                Some((*i, m.priority, m.size_bytes()))
                            })
                            .collect::<Option<Vec<_>>>()
                            .unwrap_or_default()
                    }
                    Err(e) => tracing::error!(log, error = %e, "cannot read stored messages"),
                }
            }
            for &(index, size) in chunk {
                let (level, bytes) = priorities.iter().find(|(i, _, _)| *i == index).map_or(
                    (0, size.saturating_sub(STORED_ENVELOPE_BYTES)),
                    |(_, p, b)| ((*p as usize).min(levels - 1), *b as u32),
                );
                self.levels[level].tail.push_back(Paged {
                    index,
                    seq: self.next_seq,
                    bytes,
                    returns: REDELIVERED,
                });
                self.next_seq += 1;
                self.len += 1;
                self.bytes += bytes as usize;
            }
        }
    }

    /// Reads the front of level `l`'s tail back into memory; false when nothing came back
    /// (every message read was missing, now in `lost`).
    fn load(&mut self, l: usize) -> bool {
        let Backlog {
            levels,
            pager,
            len,
            bytes,
            ..
        } = self;
        let level = &mut levels[l];
        let mut loaded = 0;
        let Some(p) = pager else {
            debug_assert!(false, "only a paging backlog has a tail");
            return false;
        };
        let room = p.load_room();
        while loaded < room {
            let Some(&front) = level.tail.front() else {
                break;
            };
            let from_memory = |m: QueuedMessage, level: &mut Level| {
                level.tail.pop_front();
                level.mem.push_back(m);
            };
            if front.index == HELD {
                let m = level
                    .held
                    .pop_front()
                    .expect("a held entry has its message");
                from_memory(m, level);
                loaded += 1;
                continue;
            }
            if level.recent.front().and_then(|m| m.store_index) == Some(front.index) {
                let m = level.recent.pop_front().expect("checked");
                from_memory(m, level);
                loaded += 1;
                continue;
            }
            // A run of paged-out messages in index order (a quorum queue puts a rejected
            // message back at the end with its old index): one read for all of them.
            let mut previous = 0;
            let run: Vec<Paged> = level
                .tail
                .iter()
                .take(room - loaded)
                .take_while(|e| {
                    let more = e.index != HELD
                        && e.index >= previous
                        && level.recent.front().and_then(|m| m.store_index) != Some(e.index);
                    previous = e.index + 1;
                    more
                })
                .copied()
                .collect();
            let (from, to) = (run[0].index, run[run.len() - 1].index + 1);
            // When the batch cannot be read, read its first message alone: one bad entry
            // costs only itself.
            let source = &p.paging.source;
            let (read, only_first) = match source.read(p.log, from, to, LOAD_BATCH_BYTES) {
                Ok(read) => (read, false),
                Err(_) => match source.read(p.log, from, from + 1, 0) {
                    Ok(read) => (read, true),
                    Err(e) => {
                        tracing::error!(log = p.log, index = from, error = %e, "stored message unreadable");
                        (Vec::new(), true)
                    }
                },
            };
            let last_read = read.last().map(|(i, _)| *i);
            let mut read = read.into_iter().peekable();
            for (k, e) in run.into_iter().enumerate() {
                if (only_first && k > 0) || last_read.is_some_and(|last| e.index > last) {
                    break;
                }
                level.tail.pop_front();
                while read.next_if(|(i, _)| *i < e.index).is_some() {}
                let decoded = read
                    .next_if(|(i, _)| *i == e.index)
                    .and_then(|(_, raw)| decode_stored(&raw));
                let Some((msg, expires_unix)) = decoded else {
                    tracing::error!(log = p.log, index = e.index, "stored message missing");
                    p.lost.push(e.index);
                    *len -= 1;
                    *bytes -= e.bytes as usize;
                    continue;
                };
                *bytes -= e.bytes as usize;
                *bytes += msg.size_bytes();
                let m = QueuedMessage {
                    msg: Arc::new(msg),
                    redelivered: e.returns & REDELIVERED != 0,
                    delivery_count: e.returns & !REDELIVERED,
                    expires_at_ms: (expires_unix != 0)
                        .then(|| expires_unix.saturating_sub(p.paging.unix_ms_at_epoch)),
                    seq: e.seq,
                    store_index: Some(e.index),
                };
                p.hold(&m);
                level.mem.push_back(m);
                loaded += 1;
            }
        }
        !level.mem.is_empty()
    }
}

/// Reads every live entry of `from..to`, over as many engine reads as it takes.
fn read_all(
    source: &dyn PayloadSource,
    log: u64,
    mut from: u64,
    to: u64,
) -> Result<Vec<(u64, Bytes)>, String> {
    let mut out = Vec::new();
    while from < to {
        let page = source.read(log, from, to, LOAD_BATCH_BYTES)?;
        let Some(&(last, _)) = page.last() else { break };
        out.extend(page);
        from = last + 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{encode_stored, Message};
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    fn msg(priority: u8) -> QueuedMessage {
        QueuedMessage {
            msg: Arc::new(Message {
                exchange: Bytes::new(),
                routing_key: Bytes::new(),
                properties: Bytes::new(),
                body: Bytes::from(vec![priority; 3]),
                persistent: false,
                priority,
                expiration_ms: None,
                bcc: Vec::new(),
            }),
            redelivered: false,
            delivery_count: 0,
            expires_at_ms: None,
            seq: 0,
            store_index: None,
        }
    }

    /// A log in memory, counting reads, standing in for the storage engine.
    #[derive(Default)]
    struct FakeLog {
        entries: Mutex<BTreeMap<u64, Bytes>>,
        reads: AtomicUsize,
    }

    impl PayloadSource for FakeLog {
        fn read(
            &self,
            _log: u64,
            from: u64,
            to: u64,
            max_bytes: usize,
        ) -> Result<Vec<(u64, Bytes)>, String> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let entries = self.entries.lock().unwrap();
            let mut out = Vec::new();
            let mut bytes = 0;
            for (i, b) in entries.range(from..to) {
                if !out.is_empty() && bytes >= max_bytes {
                    break;
                }
                bytes += b.len();
                out.push((*i, b.clone()));
            }
            Ok(out)
        }
    }

    /// A stored message with a 1 KB body saying its number, as the vhost would enqueue it.
    fn stored(log: &FakeLog, index: u64, priority: u8) -> QueuedMessage {
        let props = warren_protocol::content::Properties {
            priority: Some(priority),
            delivery_mode: Some(2),
            ..Default::default()
        }
        .encode();
        let p = warren_protocol::content::Properties::decode(&props).unwrap();
        let mut body = format!("{index:08}").into_bytes();
        body.resize(1024, b'.');
        let m = Message::new(
            Bytes::new(),
            Bytes::from_static(b"q"),
            props,
            &p,
            Bytes::from(body),
        );
        log.entries
            .lock()
            .unwrap()
            .insert(index, encode_stored(&m, 0));
        QueuedMessage {
            store_index: Some(index),
            ..QueuedMessage {
                msg: Arc::new(m),
                ..msg(priority)
            }
        }
    }

    fn paging(log: &Arc<FakeLog>, budget: usize) -> Paging {
        Paging {
            source: log.clone(),
            budget: Arc::new(MemoryBudget::new(budget)),
            unix_ms_at_epoch: 0,
        }
    }

    fn number(m: &QueuedMessage) -> u64 {
        std::str::from_utf8(&m.msg.body[..8])
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn higher_priority_is_served_first_and_fifo_within_a_level() {
        let mut b = Backlog::new(Some(5));
        b.push_back(msg(1));
        b.push_back(msg(9));
        b.push_back(msg(1));
        b.push_back(msg(3));
        let order: Vec<u8> = std::iter::from_fn(|| b.pop_front())
            .map(|m| m.msg.priority)
            .collect();
        assert_eq!(order, vec![9, 3, 1, 1]);
        assert_eq!(b.bytes(), 0);
    }

    #[test]
    fn two_priorities_take_high_ones_two_to_one_also_from_a_paged_out_tail() {
        for lazy in [false, true] {
            let log = Arc::new(FakeLog::default());
            let mut b = Backlog::two_priorities();
            if lazy {
                b.enable_paging(7, paging(&log, usize::MAX), Some(0), None);
            }
            for (i, priority) in [(1, 0), (2, 4), (3, 0), (4, 9), (5, 5), (6, 7)] {
                b.push_back(stored(&log, i, priority));
            }
            b.page_out();
            assert_eq!(b.paged_out() > 0, lazy);
            let order: Vec<u64> = std::iter::from_fn(|| b.pop_front())
                .map(|m| number(&m))
                .collect();
            assert_eq!(order, [4, 5, 1, 6, 2, 3], "lazy: {lazy}");
        }
    }

    #[test]
    fn requeue_restores_the_original_order_whatever_order_messages_return_in() {
        let mut b = Backlog::new(None);
        for p in 0..5 {
            b.push_back(msg(p));
        }
        let out: Vec<QueuedMessage> = (0..4).map(|_| b.pop_front().unwrap()).collect();
        for i in [2, 0, 3, 1] {
            b.requeue(out[i].clone());
        }
        let order: Vec<u8> = std::iter::from_fn(|| b.pop_front())
            .map(|m| m.msg.priority)
            .collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn without_max_priority_everything_is_fifo() {
        let mut b = Backlog::new(None);
        b.push_back(msg(1));
        b.push_back(msg(9));
        assert_eq!(b.pop_front().unwrap().msg.priority, 1);
    }

    #[test]
    fn a_backlog_over_its_in_memory_length_keeps_only_its_head_and_reads_the_rest_back_in_order() {
        let log = Arc::new(FakeLog::default());
        let mut b = Backlog::new(None);
        b.enable_paging(7, paging(&log, usize::MAX), Some(10), None);
        for i in 1..=1000 {
            b.push_back(stored(&log, i, 0));
            b.page_out();
        }
        assert_eq!(b.len(), 1000);
        assert_eq!(b.bytes(), 1000 * 1024);
        assert_eq!(b.paged_out(), 990, "only the 10 oldest keep their bodies");
        let p = b.pager.as_ref().unwrap();
        assert_eq!(p.mem_bytes, 10 * 1024);
        let mut got = Vec::new();
        while let Some(m) = b.pop_front() {
            assert!(b.pager.as_ref().unwrap().mem_len <= 10);
            got.push(number(&m));
        }
        assert_eq!(got, (1..=1000).collect::<Vec<_>>());
        assert_eq!(b.bytes(), 0);
        assert!(
            log.reads.load(Ordering::Relaxed) <= 100,
            "bodies are read back in batches"
        );
        assert_eq!(b.pager.as_ref().unwrap().paging.budget.used(), 0);
    }

    #[test]
    fn a_lazy_backlog_pages_everything_but_its_head_and_messages_pushed_meanwhile_are_not_read() {
        let log = Arc::new(FakeLog::default());
        let mut b = Backlog::new(None);
        b.enable_paging(7, paging(&log, usize::MAX), Some(0), None);
        for i in 1..=5 {
            b.push_back(stored(&log, i, 0));
        }
        b.page_out();
        assert_eq!(b.paged_out(), 4, "the head stays");
        // Pushed after the tail formed, before page_out: read from memory, not the log.
        log.entries.lock().unwrap().clear();
        let m6 = stored(&log, 6, 0);
        log.entries.lock().unwrap().clear();
        b.push_back(m6);
        assert_eq!(number(&b.pop_front().unwrap()), 1);
        assert_eq!(
            number(&b.pop_front().unwrap()),
            6,
            "2..=5 are gone from the log, 6 was still in memory"
        );
        let lost = b.take_lost();
        assert_eq!(lost, vec![2, 3, 4, 5], "missing entries are reported, once");
        assert!(b.take_lost().is_empty());
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn transient_messages_in_a_tail_keep_their_place() {
        let log = Arc::new(FakeLog::default());
        let mut b = Backlog::new(None);
        b.enable_paging(7, paging(&log, usize::MAX), Some(2), None);
        for i in 1..=4 {
            b.push_back(stored(&log, i, 0));
        }
        b.page_out();
        let mut t = msg(0);
        t.msg = Arc::new(Message {
            exchange: Bytes::new(),
            routing_key: Bytes::new(),
            properties: Bytes::new(),
            body: Bytes::from(format!("{:08}", 100).into_bytes()),
            persistent: false,
            priority: 0,
            expiration_ms: None,
            bcc: Vec::new(),
        });
        b.push_back(t);
        b.push_back(stored(&log, 5, 0));
        b.page_out();
        let got: Vec<u64> = std::iter::from_fn(|| b.pop_front())
            .map(|m| number(&m))
            .collect();
        assert_eq!(got, vec![1, 2, 3, 4, 100, 5]);
    }

    #[test]
    fn requeued_and_ttl_zero_messages_behave_as_without_paging() {
        let log = Arc::new(FakeLog::default());
        let mut b = Backlog::new(None);
        b.enable_paging(7, paging(&log, usize::MAX), Some(1), None);
        for i in 1..=3 {
            b.push_back(stored(&log, i, 0));
        }
        b.page_out();
        let first = b.pop_front().unwrap();
        let second = b.pop_front().unwrap();
        b.requeue(second);
        b.requeue(first);
        let seq = b.push_back(stored(&log, 4, 0));
        assert_eq!(
            b.pop_back_if(seq).map(|m| number(&m)),
            Some(4),
            "the newest comes back out of the tail"
        );
        b.page_out();
        let got: Vec<u64> = std::iter::from_fn(|| b.pop_front())
            .map(|m| number(&m))
            .collect();
        assert_eq!(got, vec![1, 2, 3]);
    }

    #[test]
    fn over_the_node_budget_every_paging_queue_keeps_a_short_head() {
        let log = Arc::new(FakeLog::default());
        let budget = paging(&log, 100 * 1024);
        let mut a = Backlog::new(None);
        a.enable_paging(1, budget.clone(), None, None);
        for i in 1..=1000 {
            a.push_back(stored(&log, i, 0));
            a.page_out();
        }
        let used = budget.budget.used();
        assert!(
            used <= 100 * 1024 + 2 * 1300,
            "the budget holds: {used} bytes in memory"
        );
        assert!(a.paged_out() >= 900);
        let got: Vec<u64> = std::iter::from_fn(|| a.pop_front())
            .map(|m| number(&m))
            .collect();
        assert_eq!(got, (1..=1000).collect::<Vec<_>>());
        drop(a);
        assert_eq!(
            budget.budget.used(),
            0,
            "a dropped queue gives its memory back"
        );
    }

    #[test]
    fn restored_entries_are_redelivered_in_order_and_priorities_find_their_level() {
        let log = Arc::new(FakeLog::default());
        let mut b = Backlog::new(Some(3));
        b.enable_paging(7, paging(&log, usize::MAX), None, None);
        let mut entries = Vec::new();
        for i in 1..=600u64 {
            let m = stored(&log, i, (i % 4) as u8);
            let len = log.entries.lock().unwrap()[&i].len() as u32;
            drop(m);
            entries.push((i, len));
        }
        b.restore(&entries);
        assert_eq!(b.len(), 600);
        assert_eq!(b.bytes(), 600 * 1024, "priority queues read sizes exactly");
        let got: Vec<(u64, bool)> = std::iter::from_fn(|| b.pop_front())
            .map(|m| (number(&m), m.redelivered))
            .collect();
        let mut want: Vec<(u64, bool)> = (1..=600u64).map(|i| (i, true)).collect();
        want.sort_by_key(|(i, _)| (std::cmp::Reverse(i % 4), *i));
        assert_eq!(got, want);

        let mut plain = Backlog::new(None);
        plain.enable_paging(7, paging(&log, usize::MAX), None, None);
        plain.restore(&entries[..10]);
        assert!(
            plain.bytes() >= 10 * 1024,
            "without priorities sizes are estimated from above"
        );
        let n: Vec<u64> = std::iter::from_fn(|| plain.pop_front())
            .map(|m| number(&m))
            .collect();
        assert_eq!(n, (1..=10).collect::<Vec<_>>());
        assert_eq!(
            plain.bytes(),
            0,
            "the estimate is corrected as messages load"
        );
    }

    #[test]
    fn purge_releases_paged_out_messages_too() {
        let log = Arc::new(FakeLog::default());
        let mut b = Backlog::new(None);
        b.enable_paging(7, paging(&log, usize::MAX), Some(2), None);
        for i in 1..=10 {
            b.push_back(stored(&log, i, 0));
        }
        b.page_out();
        b.push_back(msg(0));
        let c = b.clear();
        assert_eq!(c.count, 11);
        assert_eq!(c.stored, (1..=10).collect::<Vec<_>>());
        assert!(b.is_empty() && b.pop_front().is_none());
        assert_eq!(b.pager.as_ref().unwrap().paging.budget.used(), 0);
    }
}
