//! The stream chunk decoder on any bytes (a replica's input, a torn segment), and its agreement
//! with the encoder: a chunk that parses re-encodes, from its entries, filter and trailer, to
//! the same bytes (but for the bits osiris reserves and the version nibble, which are read and
//! not kept). Index records too: one that decodes re-encodes to its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_store::stream::{chunk, Chunk, ChunkMeta, Entry, IndexRecord};

fuzz_target!(|data: &[u8]| {
    if let Some(r) = IndexRecord::decode(data) {
        assert_eq!(&r.encode()[..], &data[..48], "index record round trip");
    }
    let mut rest = data;
    while let Ok(c) = Chunk::parse(rest) {
        let len = c.bytes_len();
        assert!(len <= rest.len() && len <= chunk::CHUNK_BYTES_MAX);
        let entries: Vec<Entry<'_>> = c.entries().map(|(_, e)| e).collect();
        assert_eq!(entries.len(), usize::from(c.header.entries));
        let records: u64 = entries.iter().map(|e| u64::from(e.records())).sum();
        assert_eq!(records, u64::from(c.header.records));
        let meta = ChunkMeta {
            chunk_type: c.header.chunk_type,
            timestamp_ms: c.header.timestamp_ms,
            epoch: c.header.epoch,
            chunk_id: c.header.chunk_id,
            filter: c.filter,
            trailer: c.trailer,
        };
        let mut again = Vec::new();
        let header = chunk::encode(&mut again, &meta, &entries);
        assert_eq!(header, c.header, "header round trip");
        let reparsed = Chunk::parse(&again).expect("re-encoded chunk parses");
        assert_eq!(reparsed.header, c.header);
        assert!(reparsed.entries().eq(c.entries()), "entries round trip");
        assert_eq!(again.len(), len);
        rest = &rest[len..];
    }
});
