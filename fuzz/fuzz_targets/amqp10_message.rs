//! AMQP 1.0 messages as stream clients publish them (stored as they come, decoded when a 0-9-1
//! consumer reads the stream), and 0-9-1 properties going the other way. Nothing may panic,
//! overflow the stack or allocate past the input; a message that decodes re-encodes to bytes
//! that decode to the same encoding, and maps to 0-9-1; properties that decode map to a message
//! that decodes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use warren_protocol::amqp10::amqp091::{from_amqp091, to_amqp091};
use warren_protocol::amqp10::Message;
use warren_protocol::content::Properties;

fuzz_target!(|data: &[u8]| {
    let raw = Bytes::copy_from_slice(data);
    if let Ok(m) = Message::decode(raw.clone()) {
        let again = m.to_bytes();
        let round = Message::decode(again.clone()).expect("our own encoding decodes");
        assert_eq!(round.to_bytes(), again, "re-encoding changed the message");
        let (properties, _body) = to_amqp091(&m);
        let _ = Properties::decode(&properties.encode()).expect("mapped properties encode");
    }
    // The same bytes as a 0-9-1 property list (flags first), published with an empty body.
    if let Ok(p) = Properties::decode(&raw) {
        if let Ok(stored) = from_amqp091(b"", b"q", &p, &Bytes::new()) {
            // Sections given in x-amqp-1.0-* headers are stored as given, as RabbitMQ stores
            // them; without those the mapping makes a message (an amqp-1.0 type makes the body
            // the sections, empty here).
            let given = p.headers_table().ok().flatten().is_some_and(|h| {
                h.inner().keys().any(|k| k.as_str().starts_with("x-amqp-1.0-"))
            });
            let decoded = Message::decode(stored);
            assert!(given || decoded.is_ok(), "a mapped 0-9-1 message decodes");
        }
    }
});
