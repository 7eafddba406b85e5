//! The frame decoder over a byte stream as a client sends it, and what the connection does with
//! each frame: method frames through the method parser, header frames through the content-header
//! and property parsers. Nothing may panic or loop; every frame decoded is within `frame_max`.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use warren_protocol::content::{ContentHeader, Properties};
use warren_protocol::frame::{self, FRAME_HEADER, FRAME_METHOD, FRAME_MIN_BYTES};
use warren_protocol::method::Method;

/// What warren negotiates by default (RabbitMQ's 128 KiB).
const FRAME_MAX: u32 = 131_072;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the handshake's frame_max or the negotiated one.
    let frame_max = if data.first().is_some_and(|b| b & 1 == 0) {
        FRAME_MIN_BYTES
    } else {
        FRAME_MAX
    };
    let mut buf = BytesMut::from(data);
    while let Ok(Some(f)) = frame::decode(&mut buf, frame_max) {
        assert!(
            f.payload.len() + 8 <= frame_max as usize,
            "frame over frame_max"
        );
        match f.kind {
            FRAME_METHOD => {
                let _ = Method::decode(f.payload);
            }
            FRAME_HEADER => {
                if let Ok(h) = ContentHeader::decode(f.payload) {
                    if let Ok(p) = Properties::decode(&h.properties) {
                        let _ = p.headers_table();
                    }
                }
            }
            _ => {}
        }
    }
});
