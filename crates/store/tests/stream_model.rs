//! Property test: a stream's log against a model (a list of chunks), under random appends of
//! random sizes (user chunks, and tracking and Raft chunks that consumers skip), retention by
//! bytes and by age, truncations of what is not committed, and reopenings after the last
//! segment or its index was cut at a random byte (what kill -9 or a power cut leaves). After
//! each step a reader from a random offset spec must yield exactly the entries the model says,
//! in order; a replication reader from a random chunk sequence number, every chunk from it.

mod common;

use common::TempDir;
use proptest::prelude::*;
use warren_store::stream::{
    chunk, index, AppendMeta, ChunkType, Entry, OffsetSpec, Retention, StreamConfig, StreamLog,
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum ModelEntry {
    Simple(Vec<u8>),
    SubBatch { records: u16, body: Vec<u8> },
}

impl ModelEntry {
    fn records(&self) -> u64 {
        match self {
            ModelEntry::Simple(_) => 1,
            ModelEntry::SubBatch { records, .. } => u64::from(*records),
        }
    }

    fn as_entry(&self) -> Entry<'_> {
        match self {
            ModelEntry::Simple(b) => Entry::Simple(b),
            ModelEntry::SubBatch { records, body } => Entry::SubBatch {
                compression: 0,
                records: *records,
                uncompressed_bytes: body.len() as u32,
                body,
            },
        }
    }
}

#[derive(Clone, Debug)]
struct ModelChunk {
    seq: u64,
    chunk_type: ChunkType,
    id: u64,
    timestamp_ms: i64,
    entries: Vec<ModelEntry>,
}

impl ModelChunk {
    fn records(&self) -> u64 {
        self.entries.iter().map(ModelEntry::records).sum()
    }

    fn bytes(&self) -> u64 {
        let data: usize = self
            .entries
            .iter()
            .map(|e| e.as_entry().encoded_bytes())
            .sum();
        (chunk::CHUNK_HEADER_BYTES + data) as u64
    }

    /// (first offset, entry) of each entry.
    fn offsets(&self) -> Vec<(u64, ModelEntry)> {
        let mut at = self.id;
        self.entries
            .iter()
            .map(|e| {
                let here = at;
                at += e.records();
                (here, e.clone())
            })
            .collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append {
        chunk_type: u8,
        entries: Vec<(usize, u16)>,
        clock_step_ms: i64,
    },
    /// Truncate from a chunk picked among the last ones (refused when it is committed).
    Truncate {
        back: u64,
    },
    /// Look chunks up by sequence number, and read from one with a replication reader.
    BySeq {
        pick: u64,
    },
    RetainBytes {
        fraction: f64,
    },
    RetainAge {
        age_ms: u64,
    },
    /// Cut the last segment (`index` false) or its index at a fraction of its length (past
    /// its header), reopen.
    CutAndReopen {
        index: bool,
        fraction: f64,
    },
    Read {
        spec: u8,
        pick: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let entry = (0..300usize, prop_oneof![6 => Just(0u16), 1 => 1..6u16]);
    prop_oneof![
        10 => (0..8u8, prop::collection::vec(entry, 1..6), 0..3000i64)
            .prop_map(|(chunk_type, entries, clock_step_ms)| Op::Append {
                chunk_type,
                entries,
                clock_step_ms,
            }),
        2 => (0..6u64).prop_map(|back| Op::Truncate { back }),
        1 => any::<u64>().prop_map(|pick| Op::BySeq { pick }),
        1 => (0.0..1.2f64).prop_map(|fraction| Op::RetainBytes { fraction }),
        1 => (0..20_000u64).prop_map(|age_ms| Op::RetainAge { age_ms }),
        2 => (any::<bool>(), 0.0..1.0f64)
            .prop_map(|(index, fraction)| Op::CutAndReopen { index, fraction }),
        4 => (0..5u8, any::<u64>()).prop_map(|(spec, pick)| Op::Read { spec, pick }),
    ]
}

struct Harness {
    dir: TempDir,
    config: StreamConfig,
    /// `None` only while reopening: a stream has one writer at a time.
    log: Option<StreamLog>,
    chunks: Vec<ModelChunk>,
    clock_ms: i64,
    /// A counter that makes every body distinct.
    serial: u64,
}

impl Harness {
    fn log(&self) -> &StreamLog {
        self.log.as_ref().expect("open")
    }

    fn log_mut(&mut self) -> &mut StreamLog {
        self.log.as_mut().expect("open")
    }

    fn next_offset(&self) -> u64 {
        self.chunks
            .last()
            .map_or(self.log().handle().overview().first_offset, |c| {
                c.id + c.records()
            })
    }

    fn append(&mut self, chunk_type: u8, sizes: &[(usize, u16)], clock_step_ms: i64) {
        // Mostly user chunks; the others take offsets that consumers never see.
        let chunk_type = match chunk_type {
            5 => ChunkType::TrackingDelta,
            6 => ChunkType::Empty,
            7 => ChunkType::Configuration,
            _ => ChunkType::User,
        };
        self.clock_ms += clock_step_ms;
        let entries: Vec<ModelEntry> = sizes
            .iter()
            .map(|&(size, sub)| {
                self.serial += 1;
                let mut body = self.serial.to_be_bytes().to_vec();
                body.resize(8 + size, (self.serial % 251) as u8);
                match sub {
                    0 => ModelEntry::Simple(body),
                    records => ModelEntry::SubBatch { records, body },
                }
            })
            .collect();
        let refs: Vec<Entry<'_>> = entries.iter().map(ModelEntry::as_entry).collect();
        let meta = AppendMeta {
            chunk_type,
            timestamp_ms: self.clock_ms,
            epoch: 1,
            filter: b"",
            trailer: b"",
        };
        let id = self.next_offset();
        let seq = self.log().next_seq();
        let header = self.log_mut().append(&meta, &refs).unwrap();
        assert_eq!(header.chunk_id, id);
        let chunk = ModelChunk {
            seq,
            chunk_type,
            id,
            timestamp_ms: self.clock_ms,
            entries,
        };
        assert_eq!(header.chunk_bytes(), chunk.bytes());
        self.chunks.push(chunk);
    }

    /// What a consumer's reader from `spec` yields: user chunks only.
    fn expected(&self, spec: OffsetSpec) -> Vec<(u64, ModelEntry)> {
        let user: Vec<&ModelChunk> = self
            .chunks
            .iter()
            .filter(|c| c.chunk_type == ChunkType::User)
            .collect();
        let all = || user.iter().flat_map(|c| c.offsets());
        match spec {
            OffsetSpec::First => all().collect(),
            OffsetSpec::Next => vec![],
            OffsetSpec::Last => user.last().map_or(vec![], |c| c.offsets()),
            OffsetSpec::Offset(o) => all().filter(|(at, e)| at + e.records() > o).collect(),
            // The first chunk of any type stamped at or after it, then its user chunks.
            OffsetSpec::Timestamp(t) => match self.chunks.iter().find(|c| c.timestamp_ms >= t) {
                Some(from) => user
                    .iter()
                    .filter(|c| c.id >= from.id)
                    .flat_map(|c| c.offsets())
                    .collect(),
                None => vec![],
            },
        }
    }

    fn read(&self, spec: OffsetSpec) -> Vec<(u64, ModelEntry)> {
        self.log().set_commit_end(self.log().next_offset());
        let mut reader = self.log().reader(spec).unwrap();
        let mut out = Vec::new();
        while let Some(chunk) = reader.next_read().unwrap() {
            for (offset, e) in chunk.entries() {
                out.push((
                    offset,
                    match e {
                        Entry::Simple(b) => ModelEntry::Simple(b.to_vec()),
                        Entry::SubBatch { records, body, .. } => ModelEntry::SubBatch {
                            records,
                            body: body.to_vec(),
                        },
                    },
                ));
            }
        }
        out
    }

    fn spec(&self, kind: u8, pick: u64) -> OffsetSpec {
        let first = self.log().handle().overview().first_offset;
        let end = self.next_offset();
        match kind {
            0 => OffsetSpec::First,
            1 => OffsetSpec::Last,
            2 => OffsetSpec::Next,
            // Anywhere from a little before the first offset to a little past the end.
            3 => OffsetSpec::Offset(first.saturating_sub(3) + pick % (end - first + 6)),
            _ => OffsetSpec::Timestamp(pick as i64 % (self.clock_ms + 2000) - 1000),
        }
    }

    fn check_all_specs(&self) {
        for kind in 0..5 {
            for pick in [0, 7, 12345] {
                let spec = self.spec(kind, pick);
                assert_eq!(self.read(spec), self.expected(spec), "{spec:?}");
            }
        }
    }

    /// Truncates from the chunk `back` chunks before the end: refused when it is committed.
    fn truncate(&mut self, back: u64) {
        let next_seq = self.log().next_seq();
        let seq = next_seq.saturating_sub(back);
        let overview = self.log().handle().overview();
        let cut = self.chunks.iter().find(|c| c.seq == seq);
        let allowed = seq == next_seq || cut.is_some_and(|c| c.id >= overview.commit_end);
        let truncated = match self.log_mut().truncate_from_seq(seq) {
            Ok(()) => {
                assert!(
                    allowed,
                    "truncated chunk {seq}, committed below {}",
                    overview.commit_end
                );
                self.chunks.retain(|c| c.seq < seq);
                true
            }
            Err(warren_store::Error::TruncateRefused { .. }) => {
                assert!(!allowed, "refused to truncate from chunk {seq}");
                false
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(self.log().next_offset(), self.next_offset());
        let next_seq_after = if truncated { seq } else { next_seq };
        assert_eq!(self.log().next_seq(), next_seq_after);
    }

    /// Chunks by sequence number, and a replication reader from one: every chunk, any type.
    fn by_seq(&self, pick: u64) {
        let overview = self.log().handle().overview();
        let span = overview.next_seq - overview.first_seq + 2;
        let seq = (overview.first_seq + pick % span).saturating_sub(1);
        let found = self.log().handle().chunk_by_seq(seq).unwrap();
        let model = self.chunks.iter().find(|c| c.seq == seq);
        assert_eq!(
            found.map(|s| (s.record.chunk_id, s.record.records, s.record.chunk_type)),
            model.map(|c| (c.id, c.records() as u32, c.chunk_type)),
            "chunk {seq}"
        );
        if let Ok(mut reader) = self.log().handle().replication_reader(seq) {
            let mut got = Vec::new();
            while let Some(slice) = reader.next_chunk().unwrap() {
                slice.read().unwrap();
                got.push(slice.record.chunk_id);
            }
            let want: Vec<u64> = self
                .chunks
                .iter()
                .filter(|c| c.seq >= seq)
                .map(|c| c.id)
                .collect();
            assert_eq!(got, want, "replication from chunk {seq}");
        } else {
            assert!(
                seq < overview.first_seq,
                "no replication reader from chunk {seq}"
            );
        }
    }

    fn retain(&mut self, retention: Retention) {
        let before = self.log().handle().segments();
        let now_ms = self.clock_ms;
        let out = self.log_mut().apply_retention(&retention, now_ms).unwrap();
        let after = self.log().handle().segments();
        assert_eq!(after.len() + out.segments_deleted, before.len());
        assert_eq!(after.last(), before.last(), "the last segment is kept");
        assert_eq!(out.first_offset, after[0].first_offset);
        // Deleted: every segment that retention wanted gone, and no more.
        if after.len() > 1 {
            let total: u64 = after.iter().map(|s| s.bytes).sum();
            let over_bytes = retention.max_bytes.is_some_and(|m| total > m);
            let too_old = retention
                .max_age_ms
                .is_some_and(|a| after[0].last_timestamp_ms < self.clock_ms - a as i64);
            assert!(
                !over_bytes && !too_old,
                "kept a segment retention wanted gone"
            );
        }
        if let Some(gone) = out.segments_deleted.checked_sub(1).map(|i| before[i]) {
            let kept_with_it: u64 = after.iter().map(|s| s.bytes).sum::<u64>() + gone.bytes;
            let wanted_gone = retention.max_bytes.is_some_and(|m| kept_with_it > m)
                || retention
                    .max_age_ms
                    .is_some_and(|a| gone.last_timestamp_ms < self.clock_ms - a as i64);
            assert!(wanted_gone, "deleted a segment retention wanted kept");
        }
        self.chunks.retain(|c| c.id >= out.first_offset);
    }

    fn cut_and_reopen(&mut self, cut_index: bool, fraction: f64) {
        self.log_mut().sync().unwrap();
        let last = *self.log().handle().segments().last().unwrap();
        let path = if cut_index {
            index::index_path(self.dir.path(), last.first_offset)
        } else {
            index::segment_path(self.dir.path(), last.first_offset)
        };
        let len = std::fs::metadata(&path).unwrap().len();
        // An index header is synced before the segment takes its first chunk: no crash tears
        // it (a segment header may be torn: recovery starts such a segment again).
        let floor = if cut_index {
            index::INDEX_HEADER_BYTES
        } else {
            0
        };
        let cut = floor + ((len - floor) as f64 * fraction) as u64;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(cut).unwrap();
        drop(file);
        let config = self.config;
        self.log = None;
        let (log, _report) = StreamLog::open(self.dir.path(), config).unwrap();
        self.log = Some(log);
        if !cut_index {
            // Chunks of the last segment that end past the cut are gone (all of them when the
            // cut took part of the file header).
            let mut end = index::SEGMENT_HEADER_BYTES;
            let mut keep = self
                .chunks
                .iter()
                .take_while(|c| c.id < last.first_offset)
                .count();
            for c in &self.chunks[keep..] {
                end += c.bytes();
                if end > cut || cut < index::SEGMENT_HEADER_BYTES {
                    break;
                }
                keep += 1;
            }
            self.chunks.truncate(keep);
        }
        assert_eq!(self.log().next_offset(), self.next_offset());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn readers_yield_exactly_the_model_after_appends_retention_and_torn_reopens(
        segment_bytes_max in prop_oneof![Just(150u64), Just(700), Just(4000)],
        segment_chunks_max in prop_oneof![Just(3u32), Just(1000)],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let dir = TempDir::new("stream-model");
        let config = StreamConfig { segment_bytes_max, segment_chunks_max };
        let (log, _) = StreamLog::open(dir.path(), config).unwrap();
        let mut h = Harness { dir, config, log: Some(log), chunks: Vec::new(), clock_ms: 1_000_000, serial: 0 };
        for op in ops {
            match op {
                Op::Append { chunk_type, entries, clock_step_ms } => {
                    h.append(chunk_type, &entries, clock_step_ms)
                }
                Op::Truncate { back } => h.truncate(back),
                Op::BySeq { pick } => h.by_seq(pick),
                Op::RetainBytes { fraction } => {
                    let total = h.log().handle().overview().bytes;
                    h.retain(Retention {
                        max_bytes: Some((total as f64 * fraction) as u64),
                        max_age_ms: None,
                    });
                }
                Op::RetainAge { age_ms } => h.retain(Retention {
                    max_bytes: None,
                    max_age_ms: Some(age_ms),
                }),
                Op::CutAndReopen { index, fraction } => h.cut_and_reopen(index, fraction),
                Op::Read { spec, pick } => {
                    let spec = h.spec(spec, pick);
                    prop_assert_eq!(h.read(spec), h.expected(spec), "{:?}", spec);
                }
            }
        }
        h.check_all_specs();
    }
}
