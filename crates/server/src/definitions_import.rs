//! Importing definitions: `POST /api/definitions` (and `/api/definitions/{vhost}`),
//! `warren ctl import_definitions` and `--load-definitions` at boot, in RabbitMQ 3.10's JSON
//! format, so a file exported from RabbitMQ (or from warren) provisions a node.
//!
//! The document is read whole and checked before anything changes (a malformed entry refuses
//! the import, naming it), then applied in RabbitMQ's order: users, vhosts, permissions,
//! operator policies (`parameters` of component `operator_policy`), policies, queues,
//! exchanges, bindings. Users keep RabbitMQ's `rabbit_password_hashing_sha256` hashes, the
//! very bytes warren stores, so their logins work unchanged.
//!
//! Importing is idempotent: a user, vhost, grant or policy equal to what the node has is left
//! alone (nothing journalled), a queue or exchange that exists is left as it is (even with
//! other properties: RabbitMQ 3.10 answers 204 and keeps the existing one too), and binding
//! again changes nothing. Entities go through the management API's
//! AMQP session (see [`crate::management::session`]), so in a cluster each change is
//! replicated exactly as a client's; users, vhosts, grants and policies are metadata records,
//! replicated as the API's own changes are.

use crate::management::bindings::bind_method;
use crate::management::session::Session;
use crate::management::{json_table, policies, short_string};
use crate::Shared;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use warren_broker::definitions::MetaRecord;
use warren_broker::policy::PolicyKind;
use warren_broker::users::{Pattern, Permissions};
use warren_protocol::amqp::{exchange, queue, AMQPClass};

/// The largest definitions document accepted, in bytes: 10,000 queues with their bindings fit
/// in a few MiB; anything far beyond is not a definitions file.
pub const DOCUMENT_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The one hash algorithm warren stores (RabbitMQ 3.10's default).
const SHA256: &str = "rabbit_password_hashing_sha256";

/// A queue, exchange or binding to declare, by vhost.
enum Entity {
    Queue {
        name: String,
        durable: bool,
        auto_delete: bool,
        arguments: Value,
    },
    Exchange {
        name: String,
        kind: String,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Value,
    },
    Binding {
        source: String,
        destination: String,
        to_queue: bool,
        key: String,
        arguments: Value,
    },
}

/// What a document asks for, checked, in the order it is applied.
#[derive(Default)]
struct Plan {
    meta: Vec<MetaRecord>,
    /// Users given a plain `password` rather than a hash: their record's hash has a fresh salt,
    /// so whether the node has them already is asked of the password.
    passwords: std::collections::HashMap<String, String>,
    policies: Vec<MetaRecord>,
    entities: Vec<(String, Entity)>,
}

fn list<'a>(doc: &'a Value, key: &str) -> Result<&'a [Value], String> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(format!("'{key}' must be a list")),
    }
}

fn field<'a>(entry: &'a Value, section: &str, key: &str) -> Result<&'a str, String> {
    entry[key]
        .as_str()
        .ok_or_else(|| format!("an entry of '{section}' has no string '{key}': {entry}"))
}

fn flag(entry: &Value, key: &str) -> bool {
    match &entry[key] {
        Value::Bool(b) => *b,
        Value::String(s) => s == "true",
        _ => false,
    }
}

/// An entry's vhost: its own `vhost` field in a whole document, the path's in a per-vhost one.
fn vhost_of(entry: &Value, section: &str, only: Option<&str>) -> Result<String, String> {
    match only {
        Some(v) => Ok(v.to_string()),
        None => field(entry, section, "vhost").map(String::from),
    }
}

/// Tags as RabbitMQ 3.10 exports them (a list) or as older releases did (a comma string).
fn tags(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a
            .iter()
            .filter_map(|t| t.as_str().map(String::from))
            .collect(),
        Value::String(s) => s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// Adds `record` to `records`, or puts it in the place of an earlier one with the same `key`.
fn keep_last<K: std::hash::Hash + Eq>(
    records: &mut Vec<MetaRecord>,
    at: &mut HashMap<K, usize>,
    key: K,
    record: MetaRecord,
) {
    match at.get(&key) {
        Some(&i) => records[i] = record,
        None => {
            at.insert(key, records.len());
            records.push(record);
        }
    }
}

fn plan(doc: &Value, only: Option<&str>) -> Result<Plan, String> {
    if !doc.is_object() {
        return Err("a definitions document is a JSON object".into());
    }
    let mut p = Plan::default();
    if only.is_none() {
        // A user or grant given twice: applied in order the last would win, and a second
        // import would then rewrite the user from the first entry (a fresh salt for a plain
        // password) before the last set it back. So only the last entry of each is kept.
        let mut users = HashMap::new();
        for u in list(doc, "users")? {
            let name = field(u, "users", "name")?.to_string();
            let password_hash = match (u.get("password_hash"), u.get("password")) {
                (Some(Value::String(h)), _) if !h.is_empty() => {
                    p.passwords.remove(&name);
                    let algorithm = u["hashing_algorithm"].as_str().unwrap_or(SHA256);
                    if algorithm != SHA256 {
                        return Err(format!(
                            "user '{name}': hashing algorithm '{algorithm}' is not supported (only {SHA256})"
                        ));
                    }
                    h.clone()
                }
                (_, Some(Value::String(password))) => {
                    p.passwords.insert(name.clone(), password.clone());
                    let mut scratch = warren_broker::users::Users::default();
                    scratch.add_user(&name, password, vec![]);
                    scratch.password_hash(&name).unwrap_or_default()
                }
                _ => {
                    return Err(format!(
                        "user '{name}' has neither password_hash nor password"
                    ))
                }
            };
            let record = MetaRecord::PutUser {
                name: name.clone(),
                password_hash,
                tags: tags(&u["tags"]),
            };
            keep_last(&mut p.meta, &mut users, name, record);
        }
        for v in list(doc, "vhosts")? {
            p.meta.push(MetaRecord::AddVhost {
                name: field(v, "vhosts", "name")?.to_string(),
            });
        }
        let mut grants = HashMap::new();
        for g in list(doc, "permissions")? {
            let pattern = |key: &str| -> Result<String, String> {
                let s = field(g, "permissions", key)?;
                Pattern::new(s).map_err(|e| format!("invalid pattern '{s}': {e}"))?;
                Ok(s.to_string())
            };
            let (user, vhost) = (
                field(g, "permissions", "user")?,
                field(g, "permissions", "vhost")?,
            );
            let record = MetaRecord::SetPermissions {
                user: user.to_string(),
                vhost: vhost.to_string(),
                configure: pattern("configure")?,
                write: pattern("write")?,
                read: pattern("read")?,
            };
            keep_last(&mut p.meta, &mut grants, (user, vhost), record);
        }
    }
    for param in list(doc, "parameters")? {
        // Other components (federation upstreams, shovels) belong to plugins warren has not.
        if param["component"] != "operator_policy" {
            continue;
        }
        let vhost = vhost_of(param, "parameters", only)?;
        let name = field(param, "parameters", "name")?;
        p.policies.push(
            policies::policy_record(PolicyKind::Operator, &vhost, name, &param["value"]).map_err(
                |e| format!("operator policy '{name}' in vhost '{vhost}': {}", e.text()),
            )?,
        );
    }
    for pol in list(doc, "policies")? {
        let vhost = vhost_of(pol, "policies", only)?;
        let name = field(pol, "policies", "name")?;
        p.policies.push(
            policies::policy_record(PolicyKind::Policy, &vhost, name, pol)
                .map_err(|e| format!("policy '{name}' in vhost '{vhost}': {}", e.text()))?,
        );
    }
    for q in list(doc, "queues")? {
        p.entities.push((
            vhost_of(q, "queues", only)?,
            Entity::Queue {
                name: field(q, "queues", "name")?.to_string(),
                durable: flag(q, "durable"),
                auto_delete: flag(q, "auto_delete"),
                arguments: q["arguments"].clone(),
            },
        ));
    }
    for x in list(doc, "exchanges")? {
        p.entities.push((
            vhost_of(x, "exchanges", only)?,
            Entity::Exchange {
                name: field(x, "exchanges", "name")?.to_string(),
                kind: field(x, "exchanges", "type")?.to_string(),
                durable: flag(x, "durable"),
                auto_delete: flag(x, "auto_delete"),
                internal: flag(x, "internal"),
                arguments: x["arguments"].clone(),
            },
        ));
    }
    for b in list(doc, "bindings")? {
        let kind = field(b, "bindings", "destination_type")?;
        if kind != "queue" && kind != "exchange" {
            return Err(format!("a binding's destination_type is '{kind}'"));
        }
        p.entities.push((
            vhost_of(b, "bindings", only)?,
            Entity::Binding {
                source: field(b, "bindings", "source")?.to_string(),
                destination: field(b, "bindings", "destination")?.to_string(),
                to_queue: kind == "queue",
                key: b["routing_key"].as_str().unwrap_or_default().to_string(),
                arguments: b["arguments"].clone(),
            },
        ));
    }
    Ok(p)
}

/// Whether `record` would change nothing on this node (re-importing the same document).
/// `passwords`: the plain passwords of users the document gave one (see [`Plan::passwords`]).
fn already(
    s: &Shared,
    record: &MetaRecord,
    passwords: &std::collections::HashMap<String, String>,
) -> bool {
    let users = || s.broker.users.read().expect("users lock");
    match record {
        MetaRecord::AddVhost { name } => s.broker.vhost(name).is_some(),
        MetaRecord::PutUser {
            name,
            password_hash,
            tags,
        } => {
            let users = users();
            let same_password = match passwords.get(name) {
                Some(password) => users.authenticate(name, password),
                None => users.password_hash(name).as_ref() == Some(password_hash),
            };
            same_password && users.tags(name) == *tags
        }
        MetaRecord::SetPermissions {
            user,
            vhost,
            configure,
            write,
            read,
        } => users().permissions(user, vhost).is_some_and(|p| {
            (p.configure.as_str(), p.write.as_str(), p.read.as_str())
                == (configure.as_str(), write.as_str(), read.as_str())
        }),
        MetaRecord::SetPolicy {
            vhost,
            name,
            kind,
            pattern,
            apply_to,
            priority,
            definition,
        } => s.broker.vhost(vhost).is_some_and(|v| {
            v.lock()
                .expect("vhost lock")
                .policies()
                .get(*kind, name)
                .is_some_and(|p| {
                    p.pattern == *pattern
                        && p.apply_to.name() == apply_to
                        && p.priority == *priority
                        && p.definition == *definition
                })
        }),
        _ => false,
    }
}

/// Whether a queue or exchange of that name is in the vhost already (bindings: never asked,
/// since binding again changes nothing).
fn exists(s: &Shared, vhost: &str, entity: &Entity) -> bool {
    let Some(v) = s.broker.vhost(vhost) else {
        return false;
    };
    let v = v.lock().expect("vhost lock");
    match entity {
        Entity::Queue { name, .. } => v.queue_stats(name).is_some(),
        Entity::Exchange { name, .. } => v.exchange_names().iter().any(|n| n == name),
        Entity::Binding { .. } => false,
    }
}

/// Applies a user, vhost or grant record by the node's topology: journalled here, or in a
/// cluster everywhere.
async fn apply_meta(s: &Arc<Shared>, record: MetaRecord) -> Result<(), String> {
    crate::topology::of(s)
        .change(warren_broker::command::Command::Meta { record })
        .await
        .map(drop)
        .map_err(|e| e.text)
}

/// Imports `doc` (a whole document, or one vhost's when `only` names it). `user` is the
/// importing administrator, in whose name entities are declared. `Err` names the first entry
/// that could not be imported; what came before it stays imported, as in RabbitMQ.
pub async fn import(
    s: &Arc<Shared>,
    doc: &Value,
    only: Option<&str>,
    user: &str,
) -> Result<(), String> {
    let plan = plan(doc, only)?;
    if let Some(v) = only {
        if s.broker.vhost(v).is_none() {
            return Err(format!("vhost '{v}' does not exist"));
        }
    }
    for record in plan.meta {
        if !already(s, &record, &plan.passwords) {
            apply_meta(s, record).await?;
        }
    }
    for record in plan.policies {
        if !already(s, &record, &plan.passwords) {
            policies::change(s, record).await.map_err(|(_, why)| why)?;
        }
    }
    let mut session: Option<(String, Session)> = None;
    for (vhost, entity) in plan.entities {
        if session.as_ref().is_none_or(|(v, _)| *v != vhost) {
            let opened = Session::open_with(s, user, &vhost, Permissions::all())
                .ok_or_else(|| format!("vhost '{vhost}' does not exist"))?;
            session = Some((vhost.clone(), opened));
        }
        let (_, session) = session.as_mut().expect("opened above");
        if exists(s, &vhost, &entity) {
            // RabbitMQ's import leaves an existing queue or exchange as it is, even one whose
            // properties differ from the document's.
            continue;
        }
        let (what, method) = match entity {
            Entity::Queue {
                name,
                durable,
                auto_delete,
                arguments,
            } => (
                format!("queue '{name}'"),
                short_string("queue name", &name).and_then(|queue| {
                    Ok(AMQPClass::Queue(queue::AMQPMethod::Declare(
                        queue::Declare {
                            queue,
                            passive: false,
                            durable,
                            exclusive: false,
                            auto_delete,
                            nowait: false,
                            arguments: json_table(&arguments)?,
                        },
                    )))
                }),
            ),
            Entity::Exchange {
                name,
                kind,
                durable,
                auto_delete,
                internal,
                arguments,
            } => (
                format!("exchange '{name}'"),
                short_string("exchange name", &name).and_then(|exchange| {
                    Ok(AMQPClass::Exchange(exchange::AMQPMethod::Declare(
                        exchange::Declare {
                            exchange,
                            kind: short_string("exchange type", &kind)?,
                            passive: false,
                            durable,
                            auto_delete,
                            internal,
                            nowait: false,
                            arguments: json_table(&arguments)?,
                        },
                    )))
                }),
            ),
            Entity::Binding {
                source,
                destination,
                to_queue,
                key,
                arguments,
            } => (
                format!("binding of '{destination}' to '{source}' with key '{key}'"),
                json_table(&arguments).and_then(|arguments| {
                    bind_method(true, to_queue, &source, &destination, &key, arguments)
                }),
            ),
        };
        let method = method.map_err(|why| format!("{what} in vhost '{vhost}': {why}"))?;
        session.control(method).await.map_err(|e| {
            format!(
                "{what} in vhost '{vhost}': {}",
                crate::management::detail(&e)
            )
        })?;
    }
    Ok(())
}

/// `--load-definitions FILE`: imports the file as the default administrator would, before
/// clients are served.
pub async fn load_at_boot(s: &Arc<Shared>, path: &std::path::Path) {
    let doc = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
    {
        Ok(doc) => doc,
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "cannot read definitions");
            return;
        }
    };
    let what = format!("definitions in {}", path.display());
    at_boot(s, what, move |s| {
        let doc = doc.clone();
        async move { import(&s, &doc, None, "rmq-internal").await }
    })
    .await;
}

/// `--default-user` and `--default-pass`: the user, an administrator with every permission on
/// vhost `/`, imported as a definitions entry (so a password already right changes nothing),
/// and guest deleted, which RabbitMQ never creates beside a default user.
pub async fn default_user_at_boot(s: &Arc<Shared>, name: &str, password: &str) {
    let doc = serde_json::json!({
        "users": [{"name": name, "password": password, "tags": ["administrator"]}],
        "permissions": [{"user": name, "vhost": "/",
            "configure": ".*", "write": ".*", "read": ".*"}],
    });
    let name = name.to_string();
    let what = format!("default user '{name}'");
    at_boot(s, what, move |s| {
        let (doc, name) = (doc.clone(), name.clone());
        async move {
            import(&s, &doc, None, "rmq-internal").await?;
            let guest = crate::node::config::LOOPBACK_USER_DEFAULT;
            let has_guest = s.broker.users.read().expect("users lock").exists(guest);
            if name != guest && has_guest {
                apply_meta(&s, MetaRecord::DeleteUser { name: guest.into() }).await?;
                tracing::info!(user = guest, "deleted: a default user is set");
            }
            Ok(())
        }
    })
    .await;
}

/// Runs a boot-time import: at once on a single node, before clients are served. In a cluster
/// the metadata group may not have a leader yet at boot, so it is retried each second until it
/// goes through.
async fn at_boot<F, Fut>(s: &Arc<Shared>, what: String, attempt: F)
where
    F: Fn(Arc<Shared>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    if s.cluster.is_none() {
        match attempt(s.clone()).await {
            Ok(()) => tracing::info!(what = %what, "imported"),
            Err(e) => tracing::error!(what = %what, error = %e, "import failed"),
        }
        return;
    }
    let s = s.clone();
    tokio::spawn(async move {
        for _ in 0..BOOT_IMPORT_ATTEMPTS_MAX {
            match attempt(s.clone()).await {
                Ok(()) => {
                    tracing::info!(what = %what, "imported");
                    return;
                }
                Err(e) => {
                    tracing::warn!(what = %what, error = %e, "import failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
        tracing::error!(what = %what, "import gave up");
    });
}

/// How many times a cluster node tries its boot-time import (once a second).
const BOOT_IMPORT_ATTEMPTS_MAX: u32 = 120;
