//! The WAL/segment record decoder on any bytes (a torn or corrupted file), and its agreement
//! with the encoder: a record that verifies re-encodes to exactly the bytes it was read from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_store::record::{self, Decoded, RECORD_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Decoded::Record(h, payload) = record::decode(rest) {
        let total = RECORD_HEADER_BYTES + payload.len();
        assert_eq!(h.len as usize, payload.len());
        let mut again = Vec::new();
        let crc = record::encode(&mut again, h.kind, h.log_id, h.index, h.term, payload);
        assert_eq!(crc, h.crc);
        assert_eq!(&again[..], &rest[..total], "record round trip");
        rest = &rest[total..];
    }
});
