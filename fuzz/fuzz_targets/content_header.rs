//! The content-header and basic-properties parsers, and their round trip: properties that parse
//! re-encode to bytes that parse to the same properties (dead-lettering and CC/BCC re-encode
//! them, so a difference would change a message on its way).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use warren_protocol::content::{ContentHeader, Properties};

fuzz_target!(|data: &[u8]| {
    let Ok(h) = ContentHeader::decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    let Ok(p) = Properties::decode(&h.properties) else {
        return;
    };
    let headers = p.headers_table();
    let again = Properties::decode(&p.encode()).expect("re-encoded properties parse");
    assert_eq!(again.encode(), p.encode(), "property round trip");
    // Compared as encodings, since a NaN float never equals itself.
    if let Ok(Some(t)) = headers {
        let t_again = again.headers_table().expect("re-encoded headers parse");
        let encoded = t_again.map(|t| warren_protocol::content::encode_table(&t));
        assert_eq!(encoded, Some(warren_protocol::content::encode_table(&t)));
    }
});
