//! The JSON the broker decodes from outside a client connection: metadata journal records and
//! replicated commands (read back from disk and from other nodes), and the limits of
//! `set_vhost_limits`/`set_user_limits` and the HTTP API. Whatever decodes must apply to a
//! fresh broker without a panic (a refusal is an answer) and encode back to what decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_broker::broker::Broker;
use warren_broker::command::Command;
use warren_broker::definitions::MetaRecord;
use warren_broker::limits::{self, Scope};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = MetaRecord::decode(data) {
        assert_eq!(MetaRecord::decode(&r.encode()).ok(), Some(r.clone()));
        let _ = Broker::new().apply(r);
    }
    if let Ok(c) = Command::decode(data) {
        assert_eq!(Command::decode(&c.encode()).ok(), Some(c.clone()));
        let _ = Broker::new().execute(&c);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        for scope in [Scope::Vhost, Scope::User] {
            if let Ok(l) = limits::parse(scope, text) {
                let again = serde_json::to_string(&l).expect("limits serialise");
                assert_eq!(limits::parse(scope, &again).ok(), Some(l));
            }
        }
    }
});
