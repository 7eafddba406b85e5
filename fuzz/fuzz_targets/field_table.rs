//! The field-table parser (arguments, headers, client properties, AMQPLAIN responses) and its
//! round trip: a table that parses encodes to bytes that parse to the same table. Compared as
//! encodings, since a NaN float never equals itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_protocol::content::{decode_table, encode_table};

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = decode_table(data) {
        let bytes = encode_table(&t);
        let again = decode_table(&bytes).expect("an encoded table parses");
        assert_eq!(encode_table(&again), bytes, "field table round trip");
    }
});
