//! Arbitrary bytes never panic the decoders: a malformed frame must become an AMQP error, not a crash.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use warren_protocol::content::{ContentHeader, Properties};
use warren_protocol::frame;
use warren_protocol::method::Method;

fn decode_everything(input: &[u8], frame_max: u32) {
    let mut buf = BytesMut::from(input);
    while let Ok(Some(f)) = frame::decode(&mut buf, frame_max) {
        match f.kind {
            frame::FRAME_METHOD => {
                let _ = Method::decode(f.payload);
            }
            frame::FRAME_HEADER => {
                if let Ok(h) = ContentHeader::decode(f.payload) {
                    if let Ok(p) = Properties::decode(&h.properties) {
                        let _ = p.headers_table();
                    }
                }
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn random_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_everything(&input, 4096);
    }

    #[test]
    fn random_method_payloads_never_panic(class in prop_oneof![Just(10u16), Just(20), Just(40), Just(50), Just(60), Just(85), Just(90)],
                                          method in 0u16..130,
                                          rest in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut payload = Vec::with_capacity(rest.len() + 4);
        payload.extend_from_slice(&class.to_be_bytes());
        payload.extend_from_slice(&method.to_be_bytes());
        payload.extend_from_slice(&rest);
        let _ = Method::decode(Bytes::from(payload));
    }

    #[test]
    fn random_property_lists_never_panic(rest in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(p) = Properties::decode(&Bytes::from(rest)) {
            let _ = p.headers_table();
            let _ = Properties::decode(&p.encode());
        }
    }
}
