//! The segment file parsers on corrupted files: a segment's name, and its header and index as
//! recovery reads them (`read_index` with any count). Errors are answers; panics are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Write;
use warren_store::segment;

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let (count, file_bytes) = data.split_at(4);
    let count = u32::from_le_bytes(count.try_into().expect("4 bytes")) % 8192;
    if let Ok(name) = std::str::from_utf8(file_bytes) {
        let _ = segment::parse_segment_name(name);
    }
    let path = std::env::temp_dir().join(format!("warren-fuzz-segment-{}", std::process::id()));
    let mut f = std::fs::File::create(&path).expect("temp file");
    f.write_all(file_bytes).expect("write temp file");
    let f = std::fs::File::open(&path).expect("reopen temp file");
    // The log and segment ids the header names, so a well-formed header gets to the index.
    let (log_id, id) = match file_bytes.get(16..28) {
        Some(b) => (
            u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            u32::from_le_bytes(b[8..].try_into().expect("4 bytes")),
        ),
        None => (1, 1),
    };
    if let Ok(entries) = segment::read_index(&f, log_id, id, count) {
        assert_eq!(entries.len(), count as usize);
    }
});
