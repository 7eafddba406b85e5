//! Single active consumer groups (RabbitMQ 3.11): subscriptions of one stream with the same
//! `name` and `single-active-consumer=true`, across the node's connections. The first member
//! is active; when it goes, the next in order of arrival becomes active and its connection is
//! told to ask its client where to start (ConsumerUpdate).

use std::collections::HashMap;
use std::sync::Mutex;

/// (vhost, stream, name).
type Key = (String, String, String);

#[derive(Default)]
pub struct Groups {
    groups: Mutex<HashMap<Key, Vec<(u64, u8)>>>,
}

impl Groups {
    /// Adds subscription `sub` of connection `conn` to the group; whether it is the active one.
    pub fn join(&self, vhost: &str, (stream, name): &(String, String), conn: u64, sub: u8) -> bool {
        let mut g = self.groups.lock().expect("stream groups");
        let members = g
            .entry((vhost.to_string(), stream.clone(), name.clone()))
            .or_default();
        members.push((conn, sub));
        members.len() == 1
    }

    /// Removes a member; the member that becomes active, if the active one left and another
    /// is waiting.
    pub fn leave(
        &self,
        vhost: &str,
        (stream, name): &(String, String),
        conn: u64,
        sub: u8,
    ) -> Option<(u64, u8)> {
        let mut g = self.groups.lock().expect("stream groups");
        let key = (vhost.to_string(), stream.clone(), name.clone());
        let members = g.get_mut(&key)?;
        let at = members.iter().position(|m| *m == (conn, sub))?;
        members.remove(at);
        let next = (at == 0).then(|| members.first().copied()).flatten();
        if members.is_empty() {
            g.remove(&key);
        }
        next
    }

    /// The members of a group in order, the active one first (for listings).
    pub fn members(&self, vhost: &str, stream: &str, name: &str) -> Vec<(u64, u8)> {
        self.groups
            .lock()
            .expect("stream groups")
            .get(&(vhost.to_string(), stream.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_member_in_order_of_arrival_takes_over_from_the_active_one() {
        let g = Groups::default();
        let key = ("s".to_string(), "app".to_string());
        assert!(g.join("/", &key, 1, 0));
        assert!(!g.join("/", &key, 2, 0));
        assert!(!g.join("/", &key, 3, 5));
        // An inactive member leaving changes nothing.
        assert_eq!(g.leave("/", &key, 2, 0), None);
        assert_eq!(g.leave("/", &key, 1, 0), Some((3, 5)));
        assert_eq!(g.members("/", "s", "app"), vec![(3, 5)]);
        assert_eq!(g.leave("/", &key, 3, 5), None);
        assert!(g.members("/", "s", "app").is_empty());
        // Another vhost's group of the same name is another group.
        assert!(g.join("/", &key, 1, 0));
        assert!(g.join("other", &key, 1, 1));
    }
}
