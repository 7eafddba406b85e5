//! A stream's recovery over damaged files: a stream of several segments (chunks of simple and
//! sub-batch entries, a filter, a trailer) is made once; each input flips, zeroes or cuts bytes
//! of a copy of its segment and index files, then the stream is opened and read from every
//! offset spec and by a replication reader. Opening may fail (an answer naming the file); it
//! must not panic or hang, and readers must yield chunks in order, within the stream, each
//! passing its checks (a consumer's: user chunks only; a replication reader's: back to back).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use warren_store::stream::{
    AppendMeta, ChunkType, Entry, OffsetSpec, Overview, Reader, Retention, StreamConfig, StreamLog,
};

/// Small segments, so the template has several and each input copies little.
fn config() -> StreamConfig {
    StreamConfig {
        segment_bytes_max: 2048,
        segment_chunks_max: 8,
    }
}

/// Most chunks one reader takes per input: bounds the work of an input whose damage makes a
/// reader loop (it must not, but a hang is reported as a timeout, not as this).
const CHUNKS_READ_MAX: usize = 10_000;

fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("warren-fuzz-stream-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (mut log, _) = StreamLog::open(&root, config()).expect("open");
        for i in 0..60u64 {
            let body = vec![i as u8; 10 + (i as usize * 13) % 150];
            let sub = Entry::SubBatch {
                compression: (i % 5) as u8,
                records: 1 + (i % 3) as u16,
                uncompressed_bytes: 99,
                body: &body[..body.len() / 2],
            };
            let entries = [Entry::Simple(&body), sub, Entry::Simple(b"")];
            let meta = AppendMeta {
                chunk_type: if i % 10 == 9 {
                    ChunkType::TrackingDelta
                } else {
                    ChunkType::User
                },
                timestamp_ms: 1_000 * i as i64,
                epoch: 1 + i / 20,
                filter: if i % 2 == 0 { b"filter" } else { b"" },
                trailer: if i % 3 == 0 { b"trailer" } else { b"" },
            };
            log.append(&meta, &entries[..1 + (i % 3) as usize])
                .expect("append");
        }
        // A retention pass, so the head segment is not the stream's first.
        log.apply_retention(
            &Retention {
                max_bytes: None,
                max_age_ms: Some(55_000),
            },
            60_000,
        )
        .expect("retention");
        log.sync().expect("sync");
        drop(log);
        root
    })
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    names.sort();
    names
}

fn read_all(mut reader: Reader, overview: &Overview, contiguous: bool) {
    let mut end = None;
    for _ in 0..CHUNKS_READ_MAX {
        match reader.next_read() {
            Ok(Some(chunk)) => {
                let c = chunk.chunk();
                assert!(c.header.chunk_id >= overview.first_offset);
                assert!(c.header.next_offset() <= overview.next_offset);
                assert!(contiguous || c.header.chunk_type == ChunkType::User);
                if let Some(end) = end {
                    if contiguous {
                        assert_eq!(c.header.chunk_id, end, "chunks back to back");
                    } else {
                        assert!(c.header.chunk_id >= end, "chunks in order");
                    }
                }
                end = Some(c.header.next_offset());
                for _ in chunk.entries() {}
            }
            Ok(None) | Err(_) => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let template = template();
    let work = std::env::temp_dir().join(format!("warren-fuzz-stream-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    for p in files(template) {
        // Read and write rather than fs::copy: copy_file_range is not retried when libFuzzer's
        // timer signal interrupts it (EINTR), and that would be the harness's crash, not ours.
        let bytes = std::fs::read(&p).expect("read template file");
        std::fs::write(work.join(p.file_name().expect("name")), bytes).expect("write copy");
    }
    let targets = files(&work);
    // Each 7 bytes: which file (the last segment's files are the likeliest), where (a fraction
    // of its length), and what: xor a byte, zero 8 bytes, or cut the file there.
    for m in data.chunks_exact(7) {
        let pick = if m[0] < 128 {
            targets.len() - 1 - (m[0] as usize % 2.min(targets.len()))
        } else {
            m[0] as usize % targets.len()
        };
        let path = &targets[pick];
        let Ok(mut bytes) = std::fs::read(path) else {
            continue;
        };
        if bytes.is_empty() {
            continue;
        }
        let at = (u32::from_le_bytes([m[1], m[2], m[3], m[4]]) as usize) % bytes.len();
        match m[5] % 4 {
            0 | 1 => bytes[at] ^= m[6].max(1),
            2 => {
                let end = (at + 8).min(bytes.len());
                bytes[at..end].fill(0)
            }
            _ => bytes.truncate(at),
        }
        std::fs::write(path, &bytes).expect("write damaged file");
    }
    if let Ok((log, _report)) = StreamLog::open(&work, config()) {
        let overview = log.handle().overview();
        log.set_commit_end(u64::MAX);
        // Consumers' readers: user chunks, in order (tracking chunks between them skipped).
        for spec in [
            OffsetSpec::First,
            OffsetSpec::Last,
            OffsetSpec::Next,
            OffsetSpec::Offset(overview.first_offset + 7),
            OffsetSpec::Timestamp(30_000),
        ] {
            let Ok(reader) = log.reader(spec) else {
                continue;
            };
            read_all(reader, &overview, false);
        }
        // A replication reader: every chunk, back to back.
        if let Ok(reader) = log.handle().replication_reader(overview.first_seq) {
            read_all(reader, &overview, true);
        }
        drop(log);
    }
    let _ = std::fs::remove_dir_all(&work);
});
