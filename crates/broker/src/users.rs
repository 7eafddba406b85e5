//! Users, their passwords and their permissions per vhost, as RabbitMQ models them; with
//! their topic permissions ([`crate::topic_permissions`]) and limits ([`crate::limits`]), which
//! go when the user goes.
//!
//! Passwords are stored as RabbitMQ stores them (salted SHA-256), so definitions can move
//! between the two brokers later. Permission patterns are regular expressions over resource
//! names; `.*` (the common case) is checked without running a regex.

use crate::limits::LimitMap;
use crate::topic_permissions::TopicPermissions;
use regex::Regex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    salt: [u8; 4],
    hash: [u8; 32],
    pub tags: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Pattern(Option<Regex>, String);

impl Pattern {
    pub fn new(p: &str) -> Result<Pattern, regex::Error> {
        if p == ".*" {
            return Ok(Pattern(None, p.to_string()));
        }
        // RabbitMQ matches the whole name against the pattern as given (re:run, unanchored).
        Ok(Pattern(Some(Regex::new(p)?), p.to_string()))
    }

    pub fn matches(&self, name: &str) -> bool {
        match &self.0 {
            None => true,
            Some(r) => !self.1.is_empty() && r.is_match(name),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.1
    }
}

#[derive(Debug, Clone)]
pub struct Permissions {
    pub configure: Pattern,
    pub write: Pattern,
    pub read: Pattern,
}

impl Permissions {
    pub fn all() -> Self {
        let p = Pattern::new(".*").expect("valid pattern");
        Permissions {
            configure: p.clone(),
            write: p.clone(),
            read: p,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Configure,
    Write,
    Read,
}

#[derive(Debug, Default)]
pub struct Users {
    users: HashMap<String, User>,
    permissions: HashMap<(String, String), Permissions>,
    pub topic_permissions: TopicPermissions,
    /// Each user's limits (`max-connections`, `max-channels`); users without any are absent.
    limits: HashMap<String, LimitMap>,
}

fn hash(salt: &[u8; 4], password: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(password.as_bytes());
    h.finalize().into()
}

impl Users {
    pub fn add_user(&mut self, name: &str, password: &str, tags: Vec<String>) -> bool {
        self.add_user_salted(name, password, rand::random(), tags)
    }

    /// [`Users::add_user`] with a given salt: for the default user only, whose password is
    /// public anyway, so that every node of a cluster (each makes it on its own at start, outside
    /// the replicated log) stores the same hash and their definitions compare equal.
    pub(crate) fn add_user_salted(
        &mut self,
        name: &str,
        password: &str,
        salt: [u8; 4],
        tags: Vec<String>,
    ) -> bool {
        if self.users.contains_key(name) {
            return false;
        }
        self.users.insert(
            name.to_string(),
            User {
                name: name.to_string(),
                salt,
                hash: hash(&salt, password),
                tags,
            },
        );
        true
    }

    pub fn change_password(&mut self, name: &str, password: &str) -> bool {
        let Some(u) = self.users.get_mut(name) else {
            return false;
        };
        u.salt = rand::random();
        u.hash = hash(&u.salt, password);
        true
    }

    pub fn delete_user(&mut self, name: &str) -> bool {
        self.permissions.retain(|(u, _), _| u != name);
        self.topic_permissions.forget_user(name);
        self.limits.remove(name);
        self.users.remove(name).is_some()
    }

    pub fn authenticate(&self, name: &str, password: &str) -> bool {
        self.users
            .get(name)
            .is_some_and(|u| hash(&u.salt, password) == u.hash)
    }

    pub fn exists(&self, name: &str) -> bool {
        self.users.contains_key(name)
    }

    /// The password hash in RabbitMQ's definitions format: base64(salt ++ SHA-256(salt ++ password)).
    pub fn password_hash(&self, name: &str) -> Option<String> {
        use base64::Engine;
        let u = self.users.get(name)?;
        let mut raw = u.salt.to_vec();
        raw.extend_from_slice(&u.hash);
        Some(base64::engine::general_purpose::STANDARD.encode(raw))
    }

    /// Creates or replaces a user from a stored hash (see [`Users::password_hash`]).
    pub fn put_user_hashed(&mut self, name: &str, password_hash: &str, tags: Vec<String>) -> bool {
        use base64::Engine;
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(password_hash) else {
            return false;
        };
        if raw.len() != 36 {
            return false;
        }
        let salt: [u8; 4] = raw[..4].try_into().expect("4 bytes");
        let hash: [u8; 32] = raw[4..].try_into().expect("32 bytes");
        self.users.insert(
            name.to_string(),
            User {
                name: name.to_string(),
                salt,
                hash,
                tags,
            },
        );
        true
    }

    /// Every (user, vhost, permissions) grant.
    pub fn all_permissions(&self) -> Vec<(String, String, Permissions)> {
        self.permissions
            .iter()
            .map(|((u, v), p)| (u.clone(), v.clone(), p.clone()))
            .collect()
    }

    pub fn tags(&self, name: &str) -> Vec<String> {
        self.users
            .get(name)
            .map(|u| u.tags.clone())
            .unwrap_or_default()
    }

    pub fn set_tags(&mut self, name: &str, tags: Vec<String>) {
        if let Some(u) = self.users.get_mut(name) {
            u.tags = tags;
        }
    }

    pub fn is_administrator(&self, name: &str) -> bool {
        self.users
            .get(name)
            .is_some_and(|u| u.tags.iter().any(|t| t == "administrator"))
    }

    pub fn user_names(&self) -> Vec<String> {
        self.users.keys().cloned().collect()
    }

    pub fn set_permissions(&mut self, user: &str, vhost: &str, p: Permissions) {
        self.permissions
            .insert((user.to_string(), vhost.to_string()), p);
    }

    pub fn clear_permissions(&mut self, user: &str, vhost: &str) {
        self.permissions
            .remove(&(user.to_string(), vhost.to_string()));
    }

    pub fn permissions(&self, user: &str, vhost: &str) -> Option<&Permissions> {
        self.permissions.get(&(user.to_string(), vhost.to_string()))
    }

    /// A user's limits; empty when none is set.
    pub fn limits(&self, user: &str) -> LimitMap {
        self.limits.get(user).cloned().unwrap_or_default()
    }

    /// Replaces a user's limits (none when `limits` is empty).
    pub fn set_limits(&mut self, user: &str, limits: LimitMap) {
        if limits.is_empty() {
            self.limits.remove(user);
        } else {
            self.limits.insert(user.to_string(), limits);
        }
    }

    /// Every user with limits, by name.
    pub fn all_limits(&self) -> Vec<(String, LimitMap)> {
        let mut out: Vec<_> = self
            .limits
            .iter()
            .map(|(u, l)| (u.clone(), l.clone()))
            .collect();
        out.sort();
        out
    }

    /// The limit `name` of `user` when it limits anything (set and not negative).
    pub fn limit(&self, user: &str, name: &str) -> Option<u64> {
        crate::limits::effective(self.limits.get(user)?, name)
    }

    pub fn can_access_vhost(&self, user: &str, vhost: &str) -> bool {
        self.permissions(user, vhost).is_some()
    }

    pub fn check(&self, user: &str, vhost: &str, access: Access, resource: &str) -> bool {
        let Some(p) = self.permissions(user, vhost) else {
            return false;
        };
        match access {
            Access::Configure => p.configure.matches(resource),
            Access::Write => p.write.matches(resource),
            Access::Read => p.read.matches(resource),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_checked_and_permissions_are_per_vhost() {
        let mut u = Users::default();
        u.add_user("bob", "secret", vec![]);
        assert!(u.authenticate("bob", "secret"));
        assert!(!u.authenticate("bob", "Secret"));
        assert!(!u.authenticate("alice", "secret"));
        u.set_permissions(
            "bob",
            "/",
            Permissions {
                configure: Pattern::new("^bob-").unwrap(),
                write: Pattern::new(".*").unwrap(),
                read: Pattern::new("").unwrap(),
            },
        );
        assert!(u.check("bob", "/", Access::Configure, "bob-q"));
        assert!(!u.check("bob", "/", Access::Configure, "q"));
        assert!(!u.check("bob", "/", Access::Read, "q"));
        assert!(!u.check("bob", "other", Access::Write, "q"));
    }
}
