//! The method parser (hand-coded data-plane methods and amq-protocol's for the rest) on any
//! payload, and a re-encoding of whatever parses: the broker re-encodes methods it forwards.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use warren_protocol::method::Method;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Method::decode(Bytes::copy_from_slice(data)) {
        let mut out = BytesMut::new();
        m.encode(1, &mut out);
    }
});
