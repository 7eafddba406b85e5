//! The stream protocol's frame decoder over a byte stream as a client sends it (port 5552), at
//! RabbitMQ's default frame_max or a small one. Nothing may panic, stall or allocate past the
//! input; every command decoded re-encodes to a frame that decodes to the same command.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use warren_protocol::stream::{self, constants::FRAME_MAX_DEFAULT_BYTES, DecodeError};

fuzz_target!(|data: &[u8]| {
    // The first byte picks a small negotiated frame_max or the default one.
    let frame_max = if data.first().is_some_and(|b| b & 1 == 0) {
        256
    } else {
        FRAME_MAX_DEFAULT_BYTES
    };
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.len();
        match stream::decode(&mut buf, frame_max) {
            Ok(Some(command)) => {
                let mut again = BytesMut::new();
                stream::encode(&mut again, &command);
                let round = stream::decode(&mut again, 0).expect("our own encoding decodes");
                assert_eq!(round.as_ref(), Some(&command), "re-encoding changed the command");
                assert!(again.is_empty());
            }
            Ok(None) | Err(DecodeError::FrameTooLarge { .. }) => break,
            Err(_) => {}
        }
        assert!(buf.len() < before, "the decoder made no progress");
    }
});
