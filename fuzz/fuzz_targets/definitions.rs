//! Definitions documents (`POST /api/definitions`, `warren ctl import_definitions`,
//! `--load-definitions`): any bytes an administrator or a tool may send, through the JSON parser
//! and the very importer the HTTP API runs, into a fresh broker each time.
//!
//! Properties, beyond no panic and no hang: an import that succeeds exports a document that
//! imports into another fresh broker and exports again to the same document (what imports,
//! exports back to an equivalent document); importing the same document twice changes nothing
//! (imports are idempotent); a per-vhost import of the document refuses or succeeds, never
//! panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use warren_broker::broker::Broker;
use warren_server::node::config::ServerConfig;
use warren_server::definitions::export;
use warren_server::definitions_import::import;
use warren_server::Shared;

/// The importer is async (it waits on cluster proposals in a cluster); one runtime serves
/// every input.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

fn fresh() -> Arc<Shared> {
    Shared::standalone(ServerConfig::default(), Arc::new(Broker::new()))
}

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let rt = runtime();
    let node = fresh();
    if rt.block_on(import(&node, &doc, None, "guest")).is_ok() {
        let exported = export(&node, None);
        rt.block_on(import(&node, &doc, None, "guest"))
            .expect("a document that imported once imports again");
        assert_eq!(export(&node, None), exported, "a second import changed the node");
        let other = fresh();
        rt.block_on(import(&other, &exported, None, "guest"))
            .expect("an exported document imports");
        assert_eq!(export(&other, None), exported, "export, import, export differ");
    }
    let _ = rt.block_on(import(&fresh(), &doc, Some("/"), "guest"));
});
