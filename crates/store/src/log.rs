//! The in-memory index of one log: where each entry lives, its term, what is released.
//!
//! Payloads are not kept here (only a bounded cache of recent ones): each entry costs one
//! 16-byte [`Slot`], and terms are kept as runs, so 10 million entries cost about 160 MiB.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

const KIND_SHIFT: u32 = 62;
const KIND_SEGMENT: u64 = 0;
const KIND_WAL: u64 = 1;
const KIND_PENDING: u64 = 2;
const FILE_BITS: u32 = 30;
const FILE_MASK: u64 = (1 << FILE_BITS) - 1;
/// Largest WAL file sequence or segment id a [`Loc`] can hold.
pub(crate) const FILE_ID_MAX: u64 = FILE_MASK;

/// Where an entry's record is.
///
/// Packed into a `u64` whose numeric order is segment < WAL (by file sequence, then offset) <
/// pending. A log's slots are split at the highest WAL file flushed or adopted (the settled
/// sequence): before that point they are *settled* (in segments, in adopted WAL files, or
/// released) in no particular order of location, since an adopted file may hold older indexes
/// than a segment written after it; after it they point into WAL files not flushed yet, then
/// at pending records, sorted by age. Every settled location sorts below the first unsettled
/// WAL file, so the entries of one unsettled WAL file form one run found by binary search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    /// In segment file `id` of the log, record at `offset`.
    Segment { id: u32, offset: u32 },
    /// In WAL file `seq`, record at `offset`.
    Wal { seq: u64, offset: u32 },
    /// Not written yet: the payload is in the cache; `seq` is the append's submission number.
    Pending { seq: u64 },
}

impl Loc {
    pub(crate) fn pack(self) -> u64 {
        match self {
            Loc::Segment { id, offset } => {
                debug_assert!(u64::from(id) <= FILE_MASK);
                (KIND_SEGMENT << KIND_SHIFT) | (u64::from(id) << 32) | u64::from(offset)
            }
            Loc::Wal { seq, offset } => {
                assert!(
                    seq <= FILE_MASK,
                    "WAL sequence {seq} beyond what a slot can hold"
                );
                (KIND_WAL << KIND_SHIFT) | (seq << 32) | u64::from(offset)
            }
            Loc::Pending { seq } => {
                assert!(seq < 1 << KIND_SHIFT);
                (KIND_PENDING << KIND_SHIFT) | seq
            }
        }
    }

    pub(crate) fn unpack(v: u64) -> Loc {
        match v >> KIND_SHIFT {
            KIND_SEGMENT => Loc::Segment {
                id: ((v >> 32) & FILE_MASK) as u32,
                offset: v as u32,
            },
            KIND_WAL => Loc::Wal {
                seq: (v >> 32) & FILE_MASK,
                offset: v as u32,
            },
            _ => Loc::Pending {
                seq: v & ((1 << KIND_SHIFT) - 1),
            },
        }
    }

    /// The smallest packed location of WAL file `seq`.
    pub(crate) fn wal_file_start(seq: u64) -> u64 {
        Loc::Wal { seq, offset: 0 }.pack()
    }
}

/// One entry of a log, 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    /// A packed [`Loc`].
    pub loc: u64,
    /// Payload length.
    pub len: u32,
    flags: u32,
}

const FLAG_RELEASED: u32 = 1;

impl Slot {
    pub(crate) fn new(loc: Loc, len: u32) -> Slot {
        Slot {
            loc: loc.pack(),
            len,
            flags: 0,
        }
    }

    /// A slot for an entry released before it reached a segment: its bytes are nowhere.
    pub(crate) fn released_at(loc: u64) -> Slot {
        Slot {
            loc,
            len: 0,
            flags: FLAG_RELEASED,
        }
    }

    pub(crate) fn loc(&self) -> Loc {
        Loc::unpack(self.loc)
    }

    pub(crate) fn released(&self) -> bool {
        self.flags & FLAG_RELEASED != 0
    }

    pub(crate) fn set_released(&mut self) {
        self.flags |= FLAG_RELEASED;
    }
}

/// A recently appended payload kept in memory.
#[derive(Clone, Debug)]
pub(crate) struct Cached {
    pub index: u64,
    pub seq: u64,
    pub payload: Bytes,
}

/// What the segment writer and recovery know of one segment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentMeta {
    /// Valid index entries in the file (a crash may leave more, which are ignored).
    pub count: u32,
    /// End of the valid data area, where the next record goes.
    pub data_end: u64,
    /// Highest entry index in the file (indexes increase with position).
    pub last_index: u64,
}

/// What of one log is still live in one (adopted) WAL file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LiveInFile {
    pub entries: u64,
    /// Records (header + payload) of those entries.
    pub bytes: u64,
    /// Lowest and highest live index (meaningful when `entries > 0`).
    pub lo: u64,
    pub hi: u64,
}

/// The snapshot taken at the last prefix release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SnapshotMeta {
    pub index: u64,
    pub term: u64,
    pub blob: Bytes,
}

/// A Raft group's hard state, kept with its log (see [`crate::store::HardState`]).
pub(crate) use crate::store::HardState;

/// One log's state.
#[derive(Debug)]
pub(crate) struct LogState {
    /// Distinguishes this life of the log from earlier ones with the same id (deleted logs).
    pub generation: u64,
    /// Index of `slots[0]`; `snapshot.index + 1` once a prefix is released.
    pub first_index: u64,
    pub slots: VecDeque<Slot>,
    /// `(first index, term)` runs covering `first_index..=last_index`, ascending.
    pub terms: Vec<(u64, u64)>,
    pub snapshot: SnapshotMeta,
    /// The Raft hard state last set (all zeros if never).
    pub hard_state: HardState,
    /// Entries up to here are known durable.
    pub durable_index: u64,
    /// Recent payloads, ascending by index, always a suffix-ordered subset of the slots.
    pub cache: VecDeque<Cached>,
    /// Segment files of this log by id.
    pub segments: BTreeMap<u32, SegmentMeta>,
    pub next_segment_id: u32,
    /// Entries not released.
    pub live_count: u64,
}

impl LogState {
    pub(crate) fn new(generation: u64) -> LogState {
        LogState {
            generation,
            first_index: 1,
            slots: VecDeque::new(),
            terms: Vec::new(),
            snapshot: SnapshotMeta::default(),
            hard_state: HardState::default(),
            durable_index: 0,
            cache: VecDeque::new(),
            segments: BTreeMap::new(),
            next_segment_id: 1,
            live_count: 0,
        }
    }

    pub(crate) fn last_index(&self) -> u64 {
        self.first_index + self.slots.len() as u64 - 1
    }

    pub(crate) fn last_term(&self) -> u64 {
        self.terms.last().map_or(self.snapshot.term, |t| t.1)
    }

    /// The term of entry `index`, also answering for the snapshot's index.
    pub(crate) fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.snapshot.index && index < self.first_index {
            return Some(self.snapshot.term);
        }
        if index < self.first_index || index > self.last_index() {
            return None;
        }
        let run = self.terms.partition_point(|t| t.0 <= index);
        Some(self.terms[run - 1].1)
    }

    pub(crate) fn slot(&self, index: u64) -> Option<&Slot> {
        if index < self.first_index {
            return None;
        }
        self.slots.get((index - self.first_index) as usize)
    }

    pub(crate) fn slot_mut(&mut self, index: u64) -> Option<&mut Slot> {
        if index < self.first_index {
            return None;
        }
        self.slots.get_mut((index - self.first_index) as usize)
    }

    /// Adds entry `index` at the end.
    pub(crate) fn push(&mut self, index: u64, term: u64, slot: Slot) {
        assert_eq!(index, self.last_index() + 1, "log entries are contiguous");
        if self.terms.last().is_none_or(|t| t.1 != term) {
            self.terms.push((index, term));
        }
        if !slot.released() {
            self.live_count += 1;
        }
        self.slots.push_back(slot);
    }

    /// Drops entries from `index` on; returns the cache bytes freed.
    pub(crate) fn truncate_from(&mut self, index: u64) -> usize {
        let index = index.max(self.first_index);
        if index > self.last_index() {
            return 0;
        }
        let keep = (index - self.first_index) as usize;
        for slot in self.slots.range(keep..) {
            if !slot.released() {
                self.live_count -= 1;
            }
        }
        self.slots.truncate(keep);
        let run = self.terms.partition_point(|t| t.0 < index);
        self.terms.truncate(run);
        self.durable_index = self.durable_index.min(index - 1);
        let mut freed = 0;
        while self.cache.back().is_some_and(|c| c.index >= index) {
            freed += self.cache.pop_back().expect("non-empty").payload.len();
        }
        freed
    }

    /// Releases entry `index`; returns the cache bytes freed, or `None` if nothing changed.
    pub(crate) fn release(&mut self, index: u64) -> Option<usize> {
        let slot = self.slot_mut(index)?;
        if slot.released() {
            return None;
        }
        slot.set_released();
        self.live_count -= 1;
        let mut freed = 0;
        if let Ok(at) = self.cache.binary_search_by_key(&index, |c| c.index) {
            freed = self.cache[at].payload.len();
            self.cache[at].payload = Bytes::new();
        }
        Some(freed)
    }

    /// Forgets everything up to `index` and keeps the snapshot; returns the cache bytes freed.
    pub(crate) fn release_prefix(&mut self, index: u64, term: u64, blob: Bytes) -> usize {
        if index < self.snapshot.index || index < self.first_index.saturating_sub(1) {
            return 0;
        }
        self.snapshot = SnapshotMeta { index, term, blob };
        let drop_count = ((index + 1 - self.first_index) as usize).min(self.slots.len());
        for slot in self.slots.range(..drop_count) {
            if !slot.released() {
                self.live_count -= 1;
            }
        }
        self.slots.drain(..drop_count);
        self.first_index = index + 1;
        if self.slots.is_empty() {
            self.terms.clear();
        } else {
            let run = self.terms.partition_point(|t| t.0 <= self.first_index);
            self.terms.drain(..run - 1);
            self.terms[0].0 = self.first_index;
        }
        let mut freed = 0;
        while self.cache.front().is_some_and(|c| c.index <= index) {
            freed += self.cache.pop_front().expect("non-empty").payload.len();
        }
        freed
    }

    /// The cached payload of `index`, if any.
    pub(crate) fn cached(&self, index: u64) -> Option<&Bytes> {
        let at = self.cache.binary_search_by_key(&index, |c| c.index).ok()?;
        Some(&self.cache[at].payload)
    }

    /// Slot positions (relative to `first_index`) of the entries in WAL file `seq`.
    pub(crate) fn wal_file_range(&self, seq: u64) -> std::ops::Range<usize> {
        let lo = Loc::wal_file_start(seq);
        let hi = Loc::wal_file_start(seq + 1);
        let start = self.slots.partition_point(|s| s.loc < lo);
        let end = self.slots.partition_point(|s| s.loc < hi);
        start..end
    }

    /// Number of settled slots (see [`Loc`]): those pointing at segments, at WAL files up to
    /// `settled_seq` (adopted ones), or released there.
    pub(crate) fn settled_end(&self, settled_seq: u64) -> usize {
        let bound = Loc::wal_file_start(settled_seq + 1);
        self.slots.partition_point(|s| s.loc < bound)
    }

    /// The live entries among `lo..=hi` that point into WAL file `seq`.
    pub(crate) fn live_in_wal_file(&self, seq: u64, lo: u64, hi: u64) -> LiveInFile {
        let mut live = LiveInFile::default();
        let lo = lo.max(self.first_index);
        let hi = hi.min(self.last_index());
        if lo > hi {
            return live;
        }
        let start = (lo - self.first_index) as usize;
        let end = (hi + 1 - self.first_index) as usize;
        for (at, slot) in self.slots.range(start..end).enumerate() {
            if !slot.released() && matches!(slot.loc(), Loc::Wal { seq: s, .. } if s == seq) {
                let index = lo + at as u64;
                if live.entries == 0 {
                    live.lo = index;
                }
                live.hi = index;
                live.entries += 1;
                live.bytes += crate::record::RECORD_HEADER_BYTES as u64 + u64::from(slot.len);
            }
        }
        live
    }

    /// Live entries per segment id.
    pub(crate) fn live_per_segment(&self, settled_seq: u64) -> BTreeMap<u32, u32> {
        let mut live: BTreeMap<u32, u32> = self.segments.keys().map(|id| (*id, 0)).collect();
        let end = self.settled_end(settled_seq);
        for slot in self.slots.range(..end) {
            if let (false, Loc::Segment { id, .. }) = (slot.released(), slot.loc()) {
                if let Some(n) = live.get_mut(&id) {
                    *n += 1;
                }
            }
        }
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_is_sixteen_bytes_so_ten_million_entries_fit_in_160_mib() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }

    #[test]
    fn locations_sort_by_age_and_round_trip() {
        let seg = Loc::Segment { id: 9, offset: 77 };
        let wal1 = Loc::Wal {
            seq: 1,
            offset: u32::MAX,
        };
        let wal2 = Loc::Wal { seq: 2, offset: 0 };
        let pending = Loc::Pending { seq: 5 };
        assert!(
            seg.pack() < wal1.pack() && wal1.pack() < wal2.pack() && wal2.pack() < pending.pack()
        );
        for loc in [seg, wal1, wal2, pending] {
            assert_eq!(Loc::unpack(loc.pack()), loc);
        }
    }

    #[test]
    fn terms_follow_truncation_and_prefix_release() {
        let mut log = LogState::new(1);
        for (i, term) in [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3)] {
            log.push(i, term, Slot::new(Loc::Pending { seq: i }, 1));
        }
        assert_eq!(log.term_of(3), Some(2));
        log.truncate_from(4);
        assert_eq!((log.last_index(), log.last_term()), (3, 2));
        log.release_prefix(2, 1, Bytes::from_static(b"s"));
        assert_eq!(
            (log.first_index, log.term_of(2), log.term_of(3)),
            (3, Some(1), Some(2))
        );
        log.release_prefix(10, 7, Bytes::new());
        assert_eq!(
            (log.first_index, log.last_index(), log.last_term()),
            (11, 10, 7)
        );
        assert_eq!(log.live_count, 0);
    }
}
