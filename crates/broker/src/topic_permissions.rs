//! Topic permissions as RabbitMQ enforces them: per user, vhost and topic exchange, a `write`
//! regular expression over the routing keys the user may publish with and a `read` one over the
//! binding keys the user may bind (queue.bind, queue.unbind, exchange.bind, exchange.unbind with
//! the topic exchange as source). Exchanges of other types, and topic exchanges the user has no
//! topic permission for, are not restricted (rabbit_auth_backend_internal:check_topic_access).
//!
//! The patterns may name `{username}` and `{vhost}`, replaced before matching (RabbitMQ's
//! variable expansion, not escaped: a user named `a.b` puts a regex `.` there, as in RabbitMQ).
//! Both are fixed for an entry (it is kept under its user and vhost), so an entry is expanded
//! and compiled once when it is set, never on the publish path. An empty pattern is `^$`, as
//! RabbitMQ reads it; matching is unanchored, as Erlang's `re:run`.

use crate::error::AmqpError;
use crate::users::Access;
use regex::Regex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One user's topic permission on one exchange of one vhost.
#[derive(Debug)]
pub struct TopicPermission {
    pub exchange: String,
    /// The patterns as given (shown by the API and exported), before expansion.
    pub write: String,
    pub read: String,
    write_re: Regex,
    read_re: Regex,
}

/// `pattern` with `{username}` and `{vhost}` replaced, compiled.
fn compile(pattern: &str, user: &str, vhost: &str) -> Result<Regex, String> {
    let pattern = if pattern.is_empty() { "^$" } else { pattern };
    let expanded = pattern
        .replace("{username}", user)
        .replace("{vhost}", vhost);
    Regex::new(&expanded).map_err(|e| format!("invalid regular expression '{pattern}': {e}"))
}

impl TopicPermission {
    pub fn new(
        user: &str,
        vhost: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> Result<Self, String> {
        Ok(TopicPermission {
            exchange: exchange.to_string(),
            write: write.to_string(),
            read: read.to_string(),
            write_re: compile(write, user, vhost)?,
            read_re: compile(read, user, vhost)?,
        })
    }

    /// Whether `routing_key` may be used for `access` (write: publish; read: bind). Configure
    /// is not a topic permission: it always passes.
    pub fn allows(&self, access: Access, routing_key: &str) -> bool {
        match access {
            Access::Write => self.write_re.is_match(routing_key),
            Access::Read => self.read_re.is_match(routing_key),
            Access::Configure => true,
        }
    }

    /// [`TopicPermission::allows`], or RabbitMQ's 403 for `user` in `vhost`.
    pub fn check(
        &self,
        access: Access,
        routing_key: &str,
        user: &str,
        vhost: &str,
    ) -> Result<(), AmqpError> {
        if self.allows(access, routing_key) {
            return Ok(());
        }
        Err(AmqpError::access_refused(format!(
            "access to topic '{routing_key}' in exchange '{}' in vhost '{vhost}' refused for user '{user}'",
            self.exchange
        )))
    }
}

/// Every topic permission of the node, by user and vhost, then exchange.
#[derive(Debug, Default, Clone)]
pub struct TopicPermissions {
    entries: HashMap<(String, String), BTreeMap<String, Arc<TopicPermission>>>,
}

impl TopicPermissions {
    /// Sets (or replaces) `user`'s topic permission on `exchange` in `vhost`; refused when a
    /// pattern, once expanded, is not a regular expression.
    pub fn set(
        &mut self,
        user: &str,
        vhost: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> Result<(), String> {
        let p = TopicPermission::new(user, vhost, exchange, write, read)?;
        self.entries
            .entry((user.to_string(), vhost.to_string()))
            .or_default()
            .insert(exchange.to_string(), Arc::new(p));
        Ok(())
    }

    /// Clears `user`'s topic permission on `exchange`, or on every exchange when `None`, in
    /// `vhost`; whether there was one.
    pub fn clear(&mut self, user: &str, vhost: &str, exchange: Option<&str>) -> bool {
        let key = (user.to_string(), vhost.to_string());
        let Some(by_exchange) = self.entries.get_mut(&key) else {
            return false;
        };
        let removed = match exchange {
            Some(x) => by_exchange.remove(x).is_some(),
            None => {
                by_exchange.clear();
                true
            }
        };
        if by_exchange.is_empty() {
            self.entries.remove(&key);
        }
        removed
    }

    /// The permission that restricts `user` on `exchange` in `vhost`, if any: the check on the
    /// publish path costs one hash lookup when there is none.
    pub fn get(&self, user: &str, vhost: &str, exchange: &str) -> Option<Arc<TopicPermission>> {
        if self.entries.is_empty() {
            return None;
        }
        self.entries
            .get(&(user.to_string(), vhost.to_string()))?
            .get(exchange)
            .cloned()
    }

    /// Every (user, vhost, permission), sorted by user, vhost, exchange.
    pub fn all(&self) -> Vec<(String, String, Arc<TopicPermission>)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .flat_map(|((u, v), by_exchange)| {
                by_exchange
                    .values()
                    .map(move |p| (u.clone(), v.clone(), p.clone()))
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1, &a.2.exchange).cmp(&(&b.0, &b.1, &b.2.exchange)));
        out
    }

    /// Drops a deleted user's permissions.
    pub fn forget_user(&mut self, user: &str) {
        self.entries.retain(|(u, _), _| u != user);
    }

    /// Drops a deleted vhost's permissions.
    pub fn forget_vhost(&mut self, vhost: &str) {
        self.entries.retain(|(_, v), _| v != vhost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_pattern_restricts_publish_keys_and_read_pattern_binding_keys() {
        let mut t = TopicPermissions::default();
        t.set("bob", "/", "amq.topic", r"^a\..*", "^r-").unwrap();
        let p = t.get("bob", "/", "amq.topic").unwrap();
        assert!(p.allows(Access::Write, "a.x"));
        assert!(!p.allows(Access::Write, "b.x"));
        assert!(p.allows(Access::Read, "r-1"));
        assert!(!p.allows(Access::Read, "a.x"));
        assert!(t.get("bob", "/", "other").is_none(), "other exchanges free");
        assert!(
            t.get("alice", "/", "amq.topic").is_none(),
            "other users free"
        );
        assert!(
            t.get("bob", "v2", "amq.topic").is_none(),
            "other vhosts free"
        );
    }

    #[test]
    fn username_and_vhost_variables_are_expanded() {
        let mut t = TopicPermissions::default();
        t.set("bob", "prod", "x", "^{vhost}\\.", "^r-{username}$")
            .unwrap();
        let p = t.get("bob", "prod", "x").unwrap();
        assert!(p.allows(Access::Write, "prod.events"));
        assert!(!p.allows(Access::Write, "dev.events"));
        assert!(p.allows(Access::Read, "r-bob"));
        assert!(!p.allows(Access::Read, "r-alice"));
        assert_eq!(p.read, "^r-{username}$", "shown as given");
    }

    #[test]
    fn empty_pattern_allows_only_the_empty_key_and_matching_is_unanchored() {
        let mut t = TopicPermissions::default();
        t.set("bob", "/", "x", "", "mid").unwrap();
        let p = t.get("bob", "/", "x").unwrap();
        assert!(p.allows(Access::Write, ""));
        assert!(!p.allows(Access::Write, "a"));
        assert!(p.allows(Access::Read, "a.mid.b"));
    }

    #[test]
    fn refusal_is_rabbitmqs_403_text() {
        let mut t = TopicPermissions::default();
        t.set("bob", "/", "amq.topic", "^a", ".*").unwrap();
        let e = t
            .get("bob", "/", "amq.topic")
            .unwrap()
            .check(Access::Write, "b.x", "bob", "/")
            .unwrap_err();
        assert_eq!(e.code, warren_protocol::constants::ACCESS_REFUSED);
        assert_eq!(
            e.text,
            "ACCESS_REFUSED - access to topic 'b.x' in exchange 'amq.topic' in vhost '/' refused for user 'bob'"
        );
    }

    #[test]
    fn invalid_patterns_are_refused_and_clear_removes_one_or_all() {
        let mut t = TopicPermissions::default();
        assert!(t.set("bob", "/", "x", "(", ".*").is_err());
        t.set("bob", "/", "x", ".*", ".*").unwrap();
        t.set("bob", "/", "y", ".*", ".*").unwrap();
        t.set("bob", "v", "x", ".*", ".*").unwrap();
        assert!(t.clear("bob", "/", Some("x")));
        assert!(!t.clear("bob", "/", Some("x")));
        assert_eq!(t.all().len(), 2);
        assert!(t.clear("bob", "/", None));
        assert_eq!(t.all().len(), 1);
        t.forget_vhost("v");
        assert!(t.all().is_empty());
        t.set("bob", "/", "x", ".*", ".*").unwrap();
        t.forget_user("bob");
        assert!(t.all().is_empty());
    }
}
