//! A stream's log through its public API: appends, segments, readers by every offset spec,
//! the committed offset, retention, a replica's byte-for-byte copy, and recovery from the torn
//! tails a kill -9 or a power cut leaves.

mod common;

use std::fs::OpenOptions;
use std::path::Path;

use common::TempDir;
use warren_store::stream::{
    index, AppendMeta, Chunk, ChunkType, Entry, OffsetSpec, Reader, Retention, StreamConfig,
    StreamLog,
};
use warren_store::Error;

fn meta(timestamp_ms: i64) -> AppendMeta<'static> {
    AppendMeta {
        chunk_type: ChunkType::User,
        timestamp_ms,
        epoch: 1,
        filter: b"",
        trailer: b"",
    }
}

fn body(offset: u64) -> Vec<u8> {
    format!("message {offset}").into_bytes()
}

/// Appends `chunks` chunks of `per_chunk` simple entries, the chunk `i` stamped `1000 * i`.
fn fill(log: &mut StreamLog, chunks: u64, per_chunk: u64) {
    for _ in 0..chunks {
        let first = log.next_offset();
        let bodies: Vec<Vec<u8>> = (first..first + per_chunk).map(body).collect();
        let entries: Vec<Entry<'_>> = bodies.iter().map(|b| Entry::Simple(b)).collect();
        log.append(&meta(first as i64 * 1000), &entries).unwrap();
    }
}

/// Every (offset, body) the reader yields until it reaches the committed end.
fn drain(reader: &mut Reader) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(chunk) = reader.next_read().unwrap() {
        for (offset, e) in chunk.entries() {
            match e {
                Entry::Simple(b) => out.push((offset, b.to_vec())),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    out
}

fn expected(range: std::ops::Range<u64>) -> Vec<(u64, Vec<u8>)> {
    range.map(|o| (o, body(o))).collect()
}

fn small_segments() -> StreamConfig {
    StreamConfig {
        segment_bytes_max: 400,
        ..StreamConfig::default()
    }
}

#[test]
fn readers_start_where_each_offset_spec_says() {
    let dir = TempDir::new("stream-specs");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 20, 5); // offsets 0..100, chunk i at 5i stamped 5000i
    log.set_commit_end(100);
    assert!(
        log.handle().segments().len() > 3,
        "the test needs several segments"
    );
    let read = |spec| drain(&mut log.reader(spec).unwrap());
    assert_eq!(read(OffsetSpec::First), expected(0..100));
    assert_eq!(read(OffsetSpec::Last), expected(95..100));
    assert_eq!(read(OffsetSpec::Next), expected(100..100));
    assert_eq!(read(OffsetSpec::Offset(42)), expected(42..100));
    assert_eq!(read(OffsetSpec::Offset(45)), expected(45..100));
    assert_eq!(read(OffsetSpec::Offset(1000)), expected(100..100));
    // The first chunk stamped at or after the timestamp.
    assert_eq!(read(OffsetSpec::Timestamp(25_000)), expected(25..100));
    assert_eq!(read(OffsetSpec::Timestamp(25_001)), expected(30..100));
    assert_eq!(read(OffsetSpec::Timestamp(-1)), expected(0..100));
    assert_eq!(read(OffsetSpec::Timestamp(1_000_000)), expected(100..100));
}

#[test]
fn readers_see_nothing_past_the_committed_offset() {
    let dir = TempDir::new("stream-commit");
    let (mut log, _) = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
    let mut reader = log.reader(OffsetSpec::First).unwrap();
    let mut next = log.reader(OffsetSpec::Next).unwrap();
    fill(&mut log, 4, 10);
    assert_eq!(drain(&mut reader), vec![], "nothing committed yet");
    log.set_commit_end(20);
    assert_eq!(drain(&mut reader), expected(0..20));
    // "last" is the start of the last committed chunk, not of the last written one.
    assert_eq!(
        drain(&mut log.reader(OffsetSpec::Last).unwrap()),
        expected(10..20)
    );
    log.set_commit_end(40);
    assert_eq!(drain(&mut reader), expected(20..40));
    assert_eq!(
        drain(&mut next),
        expected(0..40),
        "next was 0 when it was made"
    );
    let mut next = log.reader(OffsetSpec::Next).unwrap();
    fill(&mut log, 1, 3);
    assert_eq!(drain(&mut next), vec![]);
    log.set_commit_end(43);
    assert_eq!(drain(&mut next), expected(40..43));
}

#[test]
fn a_chunk_slice_is_the_chunk_as_delivered() {
    let dir = TempDir::new("stream-slice");
    let (mut log, _) = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
    let header = log
        .append(&meta(77), &[Entry::Simple(b"a"), Entry::Simple(b"bc")])
        .unwrap();
    log.set_commit_end(2);
    let slice = log
        .reader(OffsetSpec::First)
        .unwrap()
        .next_chunk()
        .unwrap()
        .unwrap();
    assert_eq!(slice.position(), index::SEGMENT_HEADER_BYTES);
    assert_eq!(slice.len(), header.chunk_bytes());
    // The bytes at (file, position, length) are the chunk: what sendfile would send.
    let bytes = slice.read().unwrap();
    let chunk = Chunk::parse(&bytes).unwrap();
    assert_eq!(chunk.header, header);
    assert_eq!(bytes[0], 0x50);
}

#[test]
fn timestamps_never_go_back_and_epochs_are_fenced() {
    let dir = TempDir::new("stream-epoch");
    let (mut log, _) = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
    let h = log.append(&meta(5000), &[Entry::Simple(b"x")]).unwrap();
    assert_eq!(h.timestamp_ms, 5000);
    let h = log.append(&meta(10), &[Entry::Simple(b"y")]).unwrap();
    assert_eq!(h.timestamp_ms, 5000, "a clock that stepped back");
    let newer = AppendMeta {
        epoch: 4,
        ..meta(6000)
    };
    log.append(&newer, &[Entry::Simple(b"z")]).unwrap();
    let older = AppendMeta {
        epoch: 3,
        ..meta(7000)
    };
    match log.append(&older, &[Entry::Simple(b"w")]) {
        Err(Error::ChunkOutOfOrder {
            last_epoch: 4,
            epoch: 3,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let empty = AppendMeta {
        epoch: 4,
        ..meta(1)
    };
    assert!(matches!(
        log.append(&empty, &[]),
        Err(Error::InvalidChunk(_))
    ));
    assert_eq!(log.next_offset(), 3);
}

#[test]
fn a_replica_copies_chunks_byte_for_byte() {
    let leader_dir = TempDir::new("stream-leader");
    let replica_dir = TempDir::new("stream-replica");
    let (mut leader, _) = StreamLog::open(leader_dir.path(), small_segments()).unwrap();
    let (mut replica, _) = StreamLog::open(replica_dir.path(), small_segments()).unwrap();
    fill(&mut leader, 12, 4);
    leader.set_commit_end(leader.next_offset());
    let mut reader = leader.reader(OffsetSpec::First).unwrap();
    let mut chunks = Vec::new();
    while let Some(slice) = reader.next_chunk().unwrap() {
        chunks.push(slice.read().unwrap());
    }
    assert!(matches!(
        replica.append_chunk(&chunks[1]),
        Err(Error::ChunkOutOfOrder {
            expected_offset: 0,
            offset: 4,
            ..
        })
    ));
    let mut damaged = chunks[0].clone();
    *damaged.last_mut().unwrap() ^= 1;
    assert!(matches!(
        replica.append_chunk(&damaged),
        Err(Error::InvalidChunk(_))
    ));
    let mut two = chunks[0].clone();
    two.extend_from_slice(&chunks[1]);
    assert!(replica.append_chunk(&two).is_err(), "exactly one chunk");
    for c in &chunks {
        replica.append_chunk(c).unwrap();
    }
    replica.sync().unwrap();
    leader.sync().unwrap();
    for s in leader.handle().segments() {
        for path in [
            index::segment_path(leader_dir.path(), s.first_offset),
            index::index_path(leader_dir.path(), s.first_offset),
        ] {
            let copy = replica_dir.path().join(path.file_name().unwrap());
            assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(copy).unwrap());
        }
    }
}

#[test]
fn retention_deletes_whole_segments_and_moves_readers_on() {
    let dir = TempDir::new("stream-retention");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 30, 5);
    log.set_commit_end(150);
    let segments = log.handle().segments();
    assert!(segments.len() >= 5);
    let mut reader = log.reader(OffsetSpec::First).unwrap();
    let first_chunk = reader.next_chunk().unwrap().unwrap();
    assert_eq!(first_chunk.record.chunk_id, 0);

    // By age: segments whose last chunk is older than 40 s before "now" (the clock is ours).
    let now = 100_000;
    let out = log
        .apply_retention(
            &Retention {
                max_age_ms: Some(40_000),
                ..Retention::default()
            },
            now,
        )
        .unwrap();
    let left = log.handle().segments();
    assert_eq!(out.segments_deleted, segments.len() - left.len());
    assert!(out.segments_deleted > 0);
    assert_eq!(out.first_offset, left[0].first_offset);
    for s in &segments[..out.segments_deleted] {
        assert!(s.last_timestamp_ms < now - 40_000);
        assert!(!index::segment_path(dir.path(), s.first_offset).exists());
        assert!(!index::index_path(dir.path(), s.first_offset).exists());
    }
    assert!(left[0].last_timestamp_ms >= now - 40_000);
    // The reader was in a deleted segment: it goes on from the first chunk left.
    assert_eq!(drain(&mut reader), expected(out.first_offset..150));

    // By bytes: whole segments from the head while what is left is over the limit.
    let before: u64 = log.handle().overview().bytes;
    let segments = log.handle().segments();
    let limit = before / 2;
    let out = log
        .apply_retention(
            &Retention {
                max_bytes: Some(limit),
                ..Retention::default()
            },
            now,
        )
        .unwrap();
    let left = log.handle().segments();
    let kept: u64 = left.iter().map(|s| s.bytes).sum();
    assert!(out.segments_deleted > 0);
    assert_eq!(kept + out.bytes_deleted, before);
    assert!(kept <= limit, "{kept} kept, limit {limit}");
    // One segment fewer deleted would have left more than the limit.
    assert!(kept + segments[out.segments_deleted - 1].bytes > limit);
    assert_eq!(log.handle().overview().first_offset, left[0].first_offset);

    // Never the last segment, whatever the limits.
    log.apply_retention(
        &Retention {
            max_bytes: Some(0),
            max_age_ms: Some(0),
        },
        i64::MAX,
    )
    .unwrap();
    let left = log.handle().segments();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].next_offset, 150);
    assert_eq!(
        drain(&mut log.reader(OffsetSpec::First).unwrap()),
        expected(left[0].first_offset..150)
    );
    // Appends go on, and a restart finds the same stream.
    fill(&mut log, 1, 2);
    drop(log);
    let (log, report) = StreamLog::open(dir.path(), small_segments()).unwrap();
    assert_eq!(report, Default::default());
    // Readers made before anything is committed again wait at the first offset held.
    let mut early = log.reader(OffsetSpec::Next).unwrap();
    assert_eq!(early.next_offset(), left[0].first_offset);
    assert_eq!(drain(&mut log.reader(OffsetSpec::Last).unwrap()), vec![]);
    log.set_commit_end(152);
    assert_eq!(drain(&mut early), expected(left[0].first_offset..152));
    assert_eq!(
        drain(&mut log.reader(OffsetSpec::First).unwrap()),
        expected(left[0].first_offset..152)
    );
}

fn last_segment(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut firsts: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| index::parse_name(e.unwrap().file_name().to_str()?))
        .map(|(first, _)| first)
        .collect();
    firsts.sort();
    let first = *firsts.last().unwrap();
    (
        index::segment_path(dir, first),
        index::index_path(dir, first),
    )
}

fn set_len(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn reopen_and_read(dir: &Path) -> (Vec<(u64, Vec<u8>)>, warren_store::stream::Recovered) {
    let (log, report) = StreamLog::open(dir, small_segments()).unwrap();
    log.set_commit_end(u64::MAX);
    (drain(&mut log.reader(OffsetSpec::First).unwrap()), report)
}

#[test]
fn recovery_cuts_a_torn_tail_and_keeps_every_whole_chunk() {
    let dir = TempDir::new("stream-torn");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 9, 3); // 27 records, the last segment has a few chunks
    log.sync().unwrap();
    let last_chunk_bytes = {
        log.set_commit_end(27);
        let mut r = log.reader(OffsetSpec::Last).unwrap();
        r.next_chunk().unwrap().unwrap().len()
    };
    drop(log);
    let (segment, _) = last_segment(dir.path());
    let len = std::fs::metadata(&segment).unwrap().len();

    // A partial chunk: the last chunk is cut in the middle.
    set_len(&segment, len - 3);
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!(got, expected(0..24));
    assert_eq!(report.segment_bytes_cut, last_chunk_bytes - 3);
    assert_eq!(
        report.index_records_repaired, 1,
        "its index record went too"
    );
    // The repair is on disk: a second open finds nothing to do.
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!((got, report), (expected(0..24), Default::default()));
}

#[test]
fn recovery_cuts_a_chunk_that_fails_its_crc() {
    let dir = TempDir::new("stream-crc");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 9, 3);
    drop(log);
    let (segment, _) = last_segment(dir.path());
    let mut bytes = std::fs::read(&segment).unwrap();
    let n = bytes.len();
    bytes[n - 2] ^= 0x40; // inside the last chunk's data
    std::fs::write(&segment, bytes).unwrap();
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!(got, expected(0..24));
    assert!(report.segment_bytes_cut > 0);
}

#[test]
fn recovery_rebuilds_index_records_of_whole_chunks_and_drops_those_without_one() {
    let dir = TempDir::new("stream-index");
    let (mut log, _) = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
    fill(&mut log, 6, 2);
    drop(log);
    let (segment, index_file) = last_segment(dir.path());
    // Chunks whose index records never reached the file (a crash between the two writes).
    set_len(&index_file, index::record_position(2) + 7);
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!(got, expected(0..12), "whole chunks are kept");
    assert_eq!(report.index_records_repaired, 4);
    assert_eq!(report.segment_bytes_cut, 0);
    // Index records whose chunks are gone: the segment cut at a chunk boundary.
    let (log, _) = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
    log.set_commit_end(u64::MAX);
    let mut r = log.reader(OffsetSpec::Offset(8)).unwrap();
    let boundary = r.next_chunk().unwrap().unwrap().position();
    drop((r, log));
    set_len(&segment, boundary);
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!(got, expected(0..8));
    assert_eq!(report.index_records_repaired, 2);
    // A damaged index record in the middle: rewritten from its chunk.
    let mut idx = std::fs::read(&index_file).unwrap();
    idx[index::record_position(1) as usize + 3] ^= 0xff;
    std::fs::write(&index_file, idx).unwrap();
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!(got, expected(0..8));
    assert_eq!(
        report.index_records_repaired, 3,
        "records 1, 2 and 3 rewritten"
    );
}

#[test]
fn recovery_finishes_a_retention_cut_short_and_refuses_a_hole() {
    let dir = TempDir::new("stream-leftover");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 20, 3);
    let segments = log.handle().segments();
    assert!(segments.len() >= 4);
    drop(log);
    // Retention removed the first index, then the process died.
    std::fs::remove_file(index::index_path(dir.path(), segments[0].first_offset)).unwrap();
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!(report.leftover_files_deleted, 1);
    assert_eq!(got, expected(segments[1].first_offset..60));
    assert!(!index::segment_path(dir.path(), segments[0].first_offset).exists());
    // A missing file in the middle is not a crash's doing: an error that names it.
    let lost = index::segment_path(dir.path(), segments[2].first_offset);
    std::fs::remove_file(&lost).unwrap();
    match StreamLog::open(dir.path(), small_segments()) {
        Err(Error::Corrupt(why)) => assert!(why.contains(lost.to_str().unwrap()), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a stream with a hole"),
    }
}

#[test]
fn a_segment_created_just_before_a_crash_starts_again_empty() {
    let dir = TempDir::new("stream-new-segment");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 6, 3);
    let next = log.next_offset();
    drop(log);
    // What a crash right after creating the next segment's files can leave: no header.
    for path in [
        index::segment_path(dir.path(), next),
        index::index_path(dir.path(), next),
    ] {
        std::fs::write(path, b"").unwrap();
    }
    let (got, report) = reopen_and_read(dir.path());
    assert_eq!(got, expected(0..next));
    assert_eq!(report.files_reset, 2);
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 1, 1);
    assert_eq!(log.next_offset(), next + 1);
}

fn typed(chunk_type: ChunkType, epoch: u64) -> AppendMeta<'static> {
    AppendMeta {
        chunk_type,
        epoch,
        ..meta(0)
    }
}

#[test]
fn consumers_skip_tracking_and_raft_chunks_but_replication_reads_them() {
    let dir = TempDir::new("stream-types");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    log.append(&typed(ChunkType::Empty, 1), &[Entry::Simple(b"")])
        .unwrap(); // offset 0
    fill(&mut log, 2, 2); // 1..5
    log.append(
        &typed(ChunkType::Configuration, 1),
        &[Entry::Simple(b"conf")],
    )
    .unwrap(); // 5
    fill(&mut log, 1, 3); // 6..9
    log.append(
        &typed(ChunkType::TrackingDelta, 1),
        &[Entry::Simple(b"trk")],
    )
    .unwrap(); // 9
    log.set_commit_end(10);
    let all_user: Vec<_> = [1, 2, 3, 4, 6, 7, 8]
        .into_iter()
        .map(|o| (o, body(o)))
        .collect();
    assert_eq!(drain(&mut log.reader(OffsetSpec::First).unwrap()), all_user);
    // "last" is the last user chunk, not the tracking chunk after it.
    assert_eq!(
        drain(&mut log.reader(OffsetSpec::Last).unwrap()),
        expected(6..9)
    );
    assert_eq!(
        drain(&mut log.reader(OffsetSpec::Offset(5)).unwrap()),
        expected(6..9)
    );
    let mut replication = log.handle().replication_reader(0).unwrap();
    let mut types = Vec::new();
    while let Some(slice) = replication.next_chunk().unwrap() {
        types.push((slice.record.chunk_id, slice.record.chunk_type));
    }
    assert_eq!(
        types,
        vec![
            (0, ChunkType::Empty),
            (1, ChunkType::User),
            (3, ChunkType::User),
            (5, ChunkType::Configuration),
            (6, ChunkType::User),
            (9, ChunkType::TrackingDelta),
        ]
    );
}

#[test]
fn chunk_sequence_numbers_survive_retention_and_restarts() {
    let dir = TempDir::new("stream-seq");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 20, 3); // chunk n holds offsets 3n..3n+3
    assert_eq!(log.next_seq(), 20);
    let handle = log.handle();
    for seq in [0, 7, 19] {
        let slice = handle.chunk_by_seq(seq).unwrap().unwrap();
        assert_eq!(slice.record.chunk_id, 3 * seq);
        assert_eq!(slice.record.timestamp_ms, 3000 * seq as i64);
    }
    assert!(handle.chunk_by_seq(20).unwrap().is_none());
    log.apply_retention(
        &Retention {
            max_bytes: Some(700),
            ..Retention::default()
        },
        0,
    )
    .unwrap();
    let overview = handle.overview();
    assert!(overview.first_seq > 0);
    assert_eq!(overview.first_offset, 3 * overview.first_seq);
    assert!(handle
        .chunk_by_seq(overview.first_seq - 1)
        .unwrap()
        .is_none());
    drop((log, handle));
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    assert_eq!(log.next_seq(), 20);
    assert_eq!(log.handle().overview().first_seq, overview.first_seq);
    fill(&mut log, 1, 1);
    let slice = log.handle().chunk_by_seq(20).unwrap().unwrap();
    assert_eq!((slice.record.chunk_id, slice.record.records), (60, 1));
}

#[test]
fn truncation_removes_an_uncommitted_suffix_durably_and_appends_go_on_from_it() {
    let dir = TempDir::new("stream-truncate");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 20, 3); // chunks 0..20, offsets 0..60, several segments
    let segments_before = log.handle().segments().len();
    log.set_commit_end(15); // chunks 0..5 committed
                            // Committed chunks cannot go.
    assert!(matches!(
        log.truncate_from_seq(4),
        Err(Error::TruncateRefused {
            seq: 4,
            commit_end: 15,
            ..
        })
    ));
    let mut consumer = log.reader(OffsetSpec::First).unwrap();
    assert_eq!(drain(&mut consumer), expected(0..15));
    log.truncate_from_seq(6).unwrap();
    assert_eq!((log.next_seq(), log.next_offset()), (6, 18));
    assert!(log.handle().segments().len() < segments_before);
    assert!(log.handle().chunk_by_seq(6).unwrap().is_none());
    // A new term's chunks in place of the old ones.
    for i in 0..3u64 {
        let b = format!("term 2, chunk {i}").into_bytes();
        log.append(&typed(ChunkType::User, 2), &[Entry::Simple(&b)])
            .unwrap();
    }
    log.set_commit_end(21);
    let got = drain(&mut consumer);
    assert_eq!(got[..3], expected(15..18)[..]);
    assert_eq!(got[3].1, b"term 2, chunk 0");
    assert_eq!(got.len(), 6);
    // The same after a restart: nothing of the old suffix comes back.
    drop(log);
    let (log, report) = StreamLog::open(dir.path(), small_segments()).unwrap();
    assert_eq!(report, Default::default());
    assert_eq!(
        (log.next_seq(), log.next_offset(), log.last_epoch()),
        (9, 21, 2)
    );
    log.set_commit_end(21);
    assert_eq!(drain(&mut log.reader(OffsetSpec::First).unwrap()), {
        let mut all = expected(0..18);
        all.extend(got[3..].iter().cloned());
        all
    });
    // Truncating everything left: the stream goes on from the same place.
    let (mut log, _) = {
        drop(log);
        StreamLog::open(dir.path(), small_segments()).unwrap()
    };
    log.truncate_from_seq(0).unwrap();
    assert_eq!(
        (log.next_seq(), log.next_offset(), log.last_epoch()),
        (0, 0, 0)
    );
    fill(&mut log, 1, 2);
    log.set_commit_end(2);
    assert_eq!(
        drain(&mut log.reader(OffsetSpec::First).unwrap()),
        expected(0..2)
    );
}

#[test]
fn a_second_writer_on_the_same_stream_is_refused() {
    let dir = TempDir::new("stream-lock");
    let (log, _) = StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
    assert!(matches!(
        StreamLog::open(dir.path(), StreamConfig::default()),
        Err(Error::AlreadyOpen(_))
    ));
    drop(log);
    StreamLog::open(dir.path(), StreamConfig::default()).unwrap();
}

#[test]
fn a_replica_behind_retention_restarts_at_the_first_kept_chunk_and_keeps_it_across_a_reopen() {
    let dir = TempDir::new("stream-restart-at");
    let (mut log, _) = StreamLog::open(dir.path(), small_segments()).unwrap();
    fill(&mut log, 4, 3); // chunks 0..4, offsets 0..12
    log.set_commit_end(12);
    let mut consumer = log.reader(OffsetSpec::First).unwrap();
    assert_eq!(drain(&mut consumer), expected(0..12));
    // Backwards is refused: only a gap forward is what retention elsewhere leaves.
    assert!(log.restart_at(9, 3).is_err());
    log.restart_at(30, 10).unwrap();
    assert_eq!((log.next_seq(), log.next_offset()), (10, 30));
    assert_eq!(log.handle().segments().len(), 1);
    fill(&mut log, 2, 3); // chunks 10..12, offsets 30..36
    log.set_commit_end(36);
    // The consumer that had read everything goes on at the new start.
    assert_eq!(drain(&mut consumer), expected(30..36));
    assert_eq!(
        log.handle()
            .chunk_by_seq(10)
            .unwrap()
            .map(|c| c.position() > 0),
        Some(true)
    );
    drop(log);
    let (log, report) = StreamLog::open(dir.path(), small_segments()).unwrap();
    assert_eq!(report, Default::default());
    assert_eq!((log.next_seq(), log.next_offset()), (12, 36));
    log.set_commit_end(36);
    assert_eq!(
        drain(&mut log.reader(OffsetSpec::First).unwrap()),
        expected(30..36)
    );
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert!(files <= 2 * 2, "old segments gone: {files} files");
}
