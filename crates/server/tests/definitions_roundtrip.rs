//! The `definitions` fuzz target's properties on its seed corpus and on every input it ever
//! crashed on, so that `cargo test` checks them on every machine, nightly or not: a document
//! that imports into a fresh broker exports one that imports elsewhere and exports the same; a
//! second import of it changes nothing; refused documents are refused with a reason, never a
//! panic.

use serde_json::{json, Value};
use std::sync::Arc;
use warren_broker::broker::Broker;
use warren_server::definitions::export;
use warren_server::definitions_import::import;
use warren_server::node::config::ServerConfig;
use warren_server::Shared;

fn fresh() -> Arc<Shared> {
    Shared::standalone(ServerConfig::default(), Arc::new(Broker::new()))
}

/// The fuzz target's property: `Ok(exported)` if `doc` imports, `Err(reason)` if it is refused.
async fn round_trip(doc: &Value) -> Result<Value, String> {
    let node = fresh();
    import(&node, doc, None, "guest").await?;
    let exported = export(&node, None);
    import(&node, doc, None, "guest")
        .await
        .expect("a document that imported once imports again");
    assert_eq!(
        export(&node, None),
        exported,
        "a second import changed the node"
    );
    let other = fresh();
    import(&other, &exported, None, "guest")
        .await
        .expect("an exported document imports");
    assert_eq!(
        export(&other, None),
        exported,
        "export, import, export differ"
    );
    let _ = import(&fresh(), doc, Some("/"), "guest").await;
    Ok(exported)
}

fn corpus() -> Vec<(String, Value)> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/definitions");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            let doc = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), doc)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test]
async fn every_seed_imports_and_exports_to_a_fixed_point_or_is_refused_with_a_reason() {
    let seeds = corpus();
    assert!(seeds.len() >= 5, "the seed corpus is there");
    for (name, doc) in seeds {
        match round_trip(&doc).await {
            Ok(exported) => {
                // What the document declared is in the export.
                for q in doc["queues"].as_array().into_iter().flatten() {
                    if doc.get("users").is_some() || q.get("vhost").is_some() {
                        let found = exported["queues"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .any(|e| e["name"] == q["name"]);
                        assert!(found, "{name}: queue {} not exported", q["name"]);
                    }
                }
            }
            Err(why) if name.starts_with("per-vhost") => {
                // A vhost's document has no `vhost` fields: whole, it is refused; into a vhost,
                // it imports, and that vhost's export holds what it declared.
                assert!(why.contains("no string 'vhost'"), "{name}: {why}");
                let node = fresh();
                import(&node, &doc, Some("/"), "guest").await.unwrap();
                let exported = export(&node, Some("/"));
                for section in ["queues", "exchanges", "bindings", "policies"] {
                    assert_eq!(
                        exported[section].as_array().map(Vec::len),
                        doc[section].as_array().map(Vec::len),
                        "{name}: {section}"
                    );
                }
            }
            Err(why) => {
                assert!(name.starts_with("bad-"), "{name} refused: {why}");
                assert!(!why.is_empty());
            }
        }
    }
}

#[tokio::test]
async fn the_rabbitmq_export_round_trips_with_its_users_and_grants() {
    let (_, doc) = corpus()
        .into_iter()
        .find(|(n, _)| n == "rabbitmq-3.10.8-export.json")
        .unwrap();
    let exported = round_trip(&doc).await.unwrap();
    let users: Vec<&str> = exported["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert!(users.contains(&"importer") && users.contains(&"importer2"));
    let hash = |d: &Value, name: &str| {
        d["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == name)
            .map(|u| u["password_hash"].clone())
    };
    assert_eq!(hash(&exported, "importer"), hash(&doc, "importer"));
}

#[tokio::test]
async fn documents_that_are_not_definitions_are_refused_with_a_reason() {
    for doc in [
        json!([]),
        json!("text"),
        json!({"queues": {}}),
        json!({"users": [{"name": 1}]}),
        json!({"bindings": [{"source": "a", "vhost": "/", "destination": "b", "destination_type": "x"}]}),
    ] {
        let why = round_trip(&doc).await.unwrap_err();
        assert!(!why.is_empty(), "{doc}");
    }
}

/// Found by the property on the seed corpus: a user given by a plain `password` was hashed with
/// a fresh salt on every import, so importing the same document again rewrote (and journalled)
/// the user each time, where the import is meant to leave what is equal alone.
#[tokio::test]
async fn a_user_given_by_password_is_left_alone_when_imported_again() {
    let node = fresh();
    let doc = json!({"users": [{"name": "alice", "password": "s3cret", "tags": "management"}]});
    import(&node, &doc, None, "guest").await.unwrap();
    let first = export(&node, None);
    import(&node, &doc, None, "guest").await.unwrap();
    assert_eq!(export(&node, None), first);
    assert!(node
        .broker
        .users
        .read()
        .unwrap()
        .authenticate("alice", "s3cret"));
    // A changed password is a change.
    let doc = json!({"users": [{"name": "alice", "password": "other", "tags": "management"}]});
    import(&node, &doc, None, "guest").await.unwrap();
    assert!(node
        .broker
        .users
        .read()
        .unwrap()
        .authenticate("alice", "other"));
}

/// Found by the `definitions` fuzz target: a queue named with more than 255 bytes panicked the
/// importer (the AMQP short string conversion), taking the HTTP request's task with it. Every
/// name, key and table key of a document that becomes an AMQP short string is checked now.
#[tokio::test]
async fn names_longer_than_amqp_allows_are_refused_with_a_reason() {
    let long = "q".repeat(256);
    let docs = [
        json!({"queues": [{"name": long, "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}]}),
        json!({"queues": [{"name": "q", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {long.clone(): 1}}]}),
        json!({"exchanges": [{"name": long, "vhost": "/", "type": "direct", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}]}),
        json!({"queues": [{"name": "q", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}],
               "bindings": [{"source": "amq.direct", "vhost": "/", "destination": "q", "destination_type": "queue", "routing_key": long, "arguments": {}}]}),
    ];
    for doc in docs {
        for only in [None, Some("/")] {
            let node = fresh();
            let why = import(&node, &doc, only, "guest").await.unwrap_err();
            assert!(why.contains("at most 255"), "{why}");
            let exported = export(&node, None);
            let named = |section: &str| {
                exported[section]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["name"] == long)
            };
            assert!(!named("queues") && !named("exchanges"), "{doc}");
        }
    }
    // 255 bytes is a name AMQP carries.
    let node = fresh();
    let doc = json!({"queues": [{"name": "q".repeat(255), "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}]});
    import(&node, &doc, None, "guest").await.unwrap();
}

/// Found by the `definitions` fuzz target: a user given twice in one document (by a plain
/// password, with different tags) was rewritten from its first entry by a second import, with
/// a fresh salt, before the last entry set its tags back: the second import changed the hash.
/// The last entry of a user or a grant is the one applied, as applying them in order gives.
#[tokio::test]
async fn a_user_or_grant_given_twice_is_applied_once_as_its_last_entry() {
    let doc = json!({
        "users": [
            {"name": "b", "password": "s1cret", "tags": "management"},
            {"name": "b", "password": "s1cret", "tags": "monitoring"},
        ],
        "vhosts": [{"name": "/"}],
        "permissions": [
            {"user": "b", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
            {"user": "b", "vhost": "/", "configure": "", "write": "q", "read": ""},
        ],
    });
    let exported = round_trip(&doc).await.unwrap();
    let b = exported["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "b")
        .unwrap();
    assert_eq!(b["tags"], json!(["monitoring"]));
    let grant = exported["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["user"] == "b")
        .unwrap();
    assert_eq!(
        (&grant["configure"], &grant["write"]),
        (&json!(""), &json!("q"))
    );
}
