//! The node's broker state: its vhosts and users.

use crate::backlog::{MemoryBudget, Paging, PayloadSource};
use crate::definitions::MetaRecord;
use crate::users::{Pattern, Permissions, Users};
use crate::vhost::VHost;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

pub type SharedVHost = Arc<Mutex<VHost>>;

pub struct Broker {
    vhosts: RwLock<HashMap<String, SharedVHost>>,
    pub users: RwLock<Users>,
    epoch: Instant,
    /// Unix time in ms at `epoch`: turns broker-relative expiries into wall-clock ones.
    pub(crate) unix_ms_at_epoch: u64,
    /// Set once the node has a store: durable queues may then page bodies out.
    paging: RwLock<Option<Paging>>,
    /// Why durable changes are refused (the node's storage failed); every vhost shares it.
    durable_changes_refused: Arc<OnceLock<String>>,
    /// In a cluster, this node's name (given to every vhost, now and later).
    local_node: RwLock<Option<Arc<str>>>,
    /// Queues declared, created and deleted through this node; every vhost shares it.
    pub queue_churn: Arc<QueueChurn>,
}

/// RabbitMQ's queue churn counters (`rabbitmq_queues_declared_total`, `..._created_total`,
/// `..._deleted_total`, and `queue_declared`, ... of `/api/nodes`), counted once in a cluster:
/// a client's declare or delete on the node it is connected to (the server counts those, from
/// the outcome every node agreed on), a queue that deletes itself (auto-delete, `x-expires`,
/// its exclusive owner gone) by the vhost on the one node that decides it. A replicated
/// change applied on every node is not counted by the others, so a sum over nodes is the
/// cluster's churn, as RabbitMQ's Overview dashboard sums it.
#[derive(Debug, Default)]
pub struct QueueChurn {
    /// queue.declare answered with declare-ok (not passive): a new queue or an existing one.
    pub declared: std::sync::atomic::AtomicU64,
    /// Those declares that made a new queue.
    pub created: std::sync::atomic::AtomicU64,
    pub deleted: std::sync::atomic::AtomicU64,
}

impl QueueChurn {
    /// A non-passive declare-ok; `created` when it made the queue.
    pub fn declared(&self, created: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.declared.fetch_add(1, Relaxed);
        if created {
            self.created.fetch_add(1, Relaxed);
        }
    }

    pub fn deleted(&self) {
        self.deleted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Default for Broker {
    fn default() -> Self {
        Self::new()
    }
}

/// The default user's salt: fixed, so that every node's guest/guest hashes alike (see
/// [`Users::add_user_salted`]); a password set later gets a random one.
const DEFAULT_USER_SALT: [u8; 4] = *b"wrrn";
/// RabbitMQ's default user and vhost, which every broker starts with.
const DEFAULT_USER: &str = "guest";
const DEFAULT_VHOST: &str = "/";

impl Broker {
    /// A broker with RabbitMQ's defaults: vhost "/" and user guest/guest with all permissions.
    pub fn new() -> Self {
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            users: RwLock::new(Users::default()),
            epoch: Instant::now(),
            unix_ms_at_epoch: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            paging: RwLock::new(None),
            durable_changes_refused: Arc::default(),
            local_node: RwLock::new(None),
            queue_churn: Arc::default(),
        };
        b.add_vhost(DEFAULT_VHOST);
        {
            let mut users = b.users.write().expect("users lock");
            users.add_user_salted(
                DEFAULT_USER,
                DEFAULT_USER,
                DEFAULT_USER_SALT,
                vec!["administrator".into()],
            );
            users.set_permissions(DEFAULT_USER, DEFAULT_VHOST, Permissions::all());
        }
        b
    }

    /// Milliseconds since the broker started: the clock every queue's TTL uses.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// `now_ms`, a time of this broker's clock, in ms since the Unix epoch: how a command
    /// carries a time to other nodes, whose brokers started at other moments.
    pub fn unix_ms_at(&self, now_ms: u64) -> u64 {
        self.unix_ms_at_epoch + now_ms
    }

    pub fn add_vhost(&self, name: &str) -> bool {
        let mut v = self.vhosts.write().expect("vhosts lock");
        if v.contains_key(name) {
            return false;
        }
        let mut vhost = VHost::new(name);
        vhost.unix_ms_at_epoch = self.unix_ms_at_epoch;
        if let Some(paging) = self.paging.read().expect("paging lock").clone() {
            vhost.set_paging(paging);
        }
        vhost.share_durable_refusal(self.durable_changes_refused.clone());
        vhost.share_queue_churn(self.queue_churn.clone());
        if let Some(node) = self.local_node.read().expect("node lock").clone() {
            vhost.set_local_node(node);
        }
        v.insert(name.to_string(), Arc::new(Mutex::new(vhost)));
        true
    }

    /// Lets every durable queue, now and later, keep the bodies of a long backlog on disk only
    /// (read back through `source`), within the node's `budget` for bodies in memory.
    pub fn enable_paging(&self, source: Arc<dyn PayloadSource>, budget: Arc<MemoryBudget>) {
        let paging = Paging {
            source,
            budget,
            unix_ms_at_epoch: self.unix_ms_at_epoch,
        };
        *self.paging.write().expect("paging lock") = Some(paging.clone());
        for (_, v) in self.vhosts() {
            v.lock().expect("vhost lock").set_paging(paging.clone());
        }
    }

    /// Makes this broker a cluster node named `node`: queues hosted elsewhere are copies here.
    pub fn set_local_node(&self, node: &str) {
        let node: Arc<str> = node.into();
        *self.local_node.write().expect("node lock") = Some(node.clone());
        for (_, v) in self.vhosts() {
            v.lock().expect("vhost lock").set_local_node(node.clone());
        }
    }

    /// Refuses, in every vhost now and later, each command that would change durable state:
    /// the node's storage failed, so such a change could not be written. Only a restart
    /// lifts it.
    /// Takes no vhost lock, so it may be called while one is held.
    pub fn refuse_durable_changes(&self, why: &str) {
        let _ = self.durable_changes_refused.set(why.to_string());
    }

    /// The node's budget for message bodies in memory, once paging is enabled.
    pub fn memory_budget(&self) -> Option<Arc<MemoryBudget>> {
        let paging = self.paging.read().expect("paging lock");
        paging.as_ref().map(|p| p.budget.clone())
    }

    /// Deletes a vhost with its limits (kept in it) and its topic permissions.
    pub fn delete_vhost(&self, name: &str) -> bool {
        self.users
            .write()
            .expect("users lock")
            .topic_permissions
            .forget_vhost(name);
        self.vhosts
            .write()
            .expect("vhosts lock")
            .remove(name)
            .is_some()
    }

    pub(crate) fn clear_vhosts(&self) {
        self.vhosts.write().expect("vhosts lock").clear();
    }

    pub fn vhost(&self, name: &str) -> Option<SharedVHost> {
        self.vhosts.read().expect("vhosts lock").get(name).cloned()
    }

    /// Replays one metadata record (at start, from the journal). Replay goes through the same
    /// commands clients use, so a record means exactly what it meant when it was written.
    pub fn apply(&self, record: MetaRecord) -> Result<(), String> {
        let now = self.now_ms();
        let vhost = |name: &str| self.vhost(name).ok_or_else(|| format!("no vhost '{name}'"));
        let amqp = |e: crate::error::AmqpError| e.text;
        match record {
            MetaRecord::AddVhost { name } => {
                self.add_vhost(&name);
            }
            MetaRecord::DeleteVhost { name } => {
                self.delete_vhost(&name);
            }
            MetaRecord::PutUser {
                name,
                password_hash,
                tags,
            } => {
                if !self.users.write().expect("users lock").put_user_hashed(
                    &name,
                    &password_hash,
                    tags,
                ) {
                    return Err(format!("bad password hash for user '{name}'"));
                }
            }
            MetaRecord::DeleteUser { name } => {
                self.users.write().expect("users lock").delete_user(&name);
            }
            MetaRecord::SetPermissions {
                user,
                vhost,
                configure,
                write,
                read,
            } => {
                let p = |s: &str| Pattern::new(s).map_err(|e| e.to_string());
                let perms = Permissions {
                    configure: p(&configure)?,
                    write: p(&write)?,
                    read: p(&read)?,
                };
                self.users
                    .write()
                    .expect("users lock")
                    .set_permissions(&user, &vhost, perms);
            }
            MetaRecord::ClearPermissions { user, vhost } => {
                self.users
                    .write()
                    .expect("users lock")
                    .clear_permissions(&user, &vhost);
            }
            MetaRecord::DeclareExchange {
                vhost: v,
                name,
                kind,
                auto_delete,
                internal,
                arguments,
            } => {
                vhost(&v)?
                    .lock()
                    .expect("vhost lock")
                    .exchange_declare(&name, &kind, false, true, auto_delete, internal, arguments)
                    .map_err(amqp)?;
            }
            MetaRecord::DeleteExchange { vhost: v, name } => {
                vhost(&v)?
                    .lock()
                    .expect("vhost lock")
                    .exchange_delete(&name, false)
                    .map_err(amqp)?;
            }
            MetaRecord::DeclareQueue {
                vhost: v,
                name,
                auto_delete,
                arguments,
                log_id,
            } => {
                let v = vhost(&v)?;
                let mut v = v.lock().expect("vhost lock");
                // Replay restores a queue that was accepted once: a max-queues lowered since
                // (or recorded before it, after compaction) must not drop it.
                let limits = v.limits().clone();
                v.set_limits(Default::default());
                let declared =
                    v.queue_declare(0, &name, false, true, false, auto_delete, arguments, now);
                v.set_limits(limits);
                declared.map_err(amqp)?;
                if log_id != 0 {
                    v.set_queue_log(&name, log_id);
                }
            }
            MetaRecord::DeleteQueue { vhost: v, name } => {
                vhost(&v)?
                    .lock()
                    .expect("vhost lock")
                    .queue_delete(0, &name, false, false)
                    .map_err(amqp)?;
            }
            MetaRecord::Bind {
                vhost: v,
                source,
                destination,
                to_queue,
                key,
                arguments,
            } => {
                let v = vhost(&v)?;
                let mut v = v.lock().expect("vhost lock");
                if to_queue {
                    v.queue_bind(0, &destination, &source, &key, &arguments)
                        .map_err(amqp)?;
                } else {
                    v.exchange_bind(&destination, &source, &key, &arguments)
                        .map_err(amqp)?;
                }
            }
            MetaRecord::Unbind {
                vhost: v,
                source,
                destination,
                to_queue,
                key,
                arguments,
            } => {
                let v = vhost(&v)?;
                let mut v = v.lock().expect("vhost lock");
                if to_queue {
                    v.queue_unbind(0, &destination, &source, &key, &arguments)
                        .map_err(amqp)?;
                } else {
                    v.exchange_unbind(&destination, &source, &key, &arguments)
                        .map_err(amqp)?;
                }
            }
            MetaRecord::SetPolicy {
                vhost: v,
                name,
                kind,
                pattern,
                apply_to,
                priority,
                definition,
            } => {
                let policy = crate::policy::Policy::new(
                    kind,
                    &name,
                    &serde_json::Value::String(pattern),
                    &apply_to,
                    &serde_json::Value::Number(priority),
                    &serde_json::Value::Object(definition),
                )?;
                vhost(&v)?
                    .lock()
                    .expect("vhost lock")
                    .set_policy(kind, policy, now);
            }
            MetaRecord::ClearPolicy {
                vhost: v,
                name,
                kind,
            } => {
                vhost(&v)?
                    .lock()
                    .expect("vhost lock")
                    .clear_policy(kind, &name, now);
            }
            MetaRecord::SetVhostLimits { vhost: v, limits } => {
                vhost(&v)?.lock().expect("vhost lock").set_limits(limits);
            }
            MetaRecord::SetUserLimits { user, limits } => {
                self.users
                    .write()
                    .expect("users lock")
                    .set_limits(&user, limits);
            }
            MetaRecord::SetTopicPermissions {
                user,
                vhost,
                exchange,
                write,
                read,
            } => {
                self.users
                    .write()
                    .expect("users lock")
                    .topic_permissions
                    .set(&user, &vhost, &exchange, &write, &read)?;
            }
            MetaRecord::ClearTopicPermissions {
                user,
                vhost,
                exchange,
            } => {
                self.users
                    .write()
                    .expect("users lock")
                    .topic_permissions
                    .clear(&user, &vhost, exchange.as_deref());
            }
        }
        Ok(())
    }

    /// Forgets the records replay produced: they are already in the journal.
    pub fn discard_meta(&self) {
        for (_, v) in self.vhosts() {
            v.lock().expect("vhost lock").take_meta();
        }
    }

    /// The records that rebuild the whole durable state: what journal compaction writes.
    pub fn export_meta(&self) -> Vec<MetaRecord> {
        let mut out = Vec::new();
        let mut vhosts = self.vhosts();
        vhosts.sort_by(|a, b| a.0.cmp(&b.0));
        // Replay starts from a broker with RabbitMQ's defaults: a default deleted is written as
        // its deletion, or a compacted journal would bring guest/guest back at the next start.
        if !vhosts.iter().any(|(name, _)| name == DEFAULT_VHOST) {
            out.push(MetaRecord::DeleteVhost {
                name: DEFAULT_VHOST.into(),
            });
        }
        if !self.users.read().expect("users lock").exists(DEFAULT_USER) {
            out.push(MetaRecord::DeleteUser {
                name: DEFAULT_USER.into(),
            });
        }
        for (name, _) in &vhosts {
            out.push(MetaRecord::AddVhost { name: name.clone() });
        }
        {
            let users = self.users.read().expect("users lock");
            for name in users.user_names() {
                if let Some(password_hash) = users.password_hash(&name) {
                    out.push(MetaRecord::PutUser {
                        tags: users.tags(&name),
                        name,
                        password_hash,
                    });
                }
            }
            for (user, vhost, p) in users.all_permissions() {
                out.push(MetaRecord::SetPermissions {
                    user,
                    vhost,
                    configure: p.configure.as_str().to_string(),
                    write: p.write.as_str().to_string(),
                    read: p.read.as_str().to_string(),
                });
            }
        }
        for (_, v) in &vhosts {
            v.lock().expect("vhost lock").export_meta(&mut out);
        }
        out.extend(self.export_access());
        out
    }

    /// The records of every limit and topic permission: last in an export, after the queues a
    /// `max-queues` counts, so that replaying the export declares them all first.
    pub fn export_access(&self) -> Vec<MetaRecord> {
        let mut out = Vec::new();
        let mut vhosts = self.vhosts();
        vhosts.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, v) in &vhosts {
            let limits = v.lock().expect("vhost lock").limits().clone();
            if !limits.is_empty() {
                out.push(MetaRecord::SetVhostLimits {
                    vhost: name.clone(),
                    limits,
                });
            }
        }
        let users = self.users.read().expect("users lock");
        for (user, limits) in users.all_limits() {
            out.push(MetaRecord::SetUserLimits { user, limits });
        }
        for (user, vhost, p) in users.topic_permissions.all() {
            out.push(MetaRecord::SetTopicPermissions {
                user,
                vhost,
                exchange: p.exchange.clone(),
                write: p.write.clone(),
                read: p.read.clone(),
            });
        }
        out
    }

    pub fn vhosts(&self) -> Vec<(String, SharedVHost)> {
        self.vhosts
            .read()
            .expect("vhosts lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Runs time-driven work (TTL expiry, x-expires) in every vhost.
    pub fn tick(&self) {
        let now = self.now_ms();
        for (_, v) in self.vhosts() {
            v.lock().expect("vhost lock").tick(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_defaults_stay_deleted_through_an_export_and_replay() {
        let b = Broker::new();
        b.apply(MetaRecord::AddVhost { name: "app".into() })
            .unwrap();
        b.apply(MetaRecord::DeleteUser {
            name: "guest".into(),
        })
        .unwrap();
        b.apply(MetaRecord::DeleteVhost { name: "/".into() })
            .unwrap();
        // What journal compaction writes, replayed on a fresh broker as recovery does.
        let replayed = Broker::new();
        for r in b.export_meta() {
            replayed.apply(r).unwrap();
        }
        assert!(!replayed.users.read().unwrap().exists("guest"));
        assert!(replayed.vhost("/").is_none());
        assert!(replayed.vhost("app").is_some());
        // Defaults still there are exported as they are, not deleted.
        let fresh = Broker::new();
        let again = Broker::new();
        for r in fresh.export_meta() {
            again.apply(r).unwrap();
        }
        assert!(again.users.read().unwrap().authenticate("guest", "guest"));
        assert!(again.vhost("/").is_some());
    }
}
