//! The node's open AMQP connections, for the management API (`/api/connections`,
//! `/api/channels`, `/api/consumers`): what each one negotiated, and a switch that closes it
//! with 320 CONNECTION_FORCED (`DELETE /api/connections/{name}`).
//!
//! A connection registers once its handshake is over and leaves when it ends; the registry is
//! touched at those two moments only, never per frame, so the data path pays nothing for it.
//! Byte and frame counters are not kept (RabbitMQ's `recv_oct`, `send_oct` show as 0).
//!
//! It also counts connections per vhost and per user for their `max-connections` limits: a
//! connection is admitted at connection.open and counted until its [`Admission`] drops.

use amq_protocol_types::FieldTable;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use warren_broker::error::AmqpError;
use warren_broker::limits;
use warren_broker::queue::ConnId;

/// What the management API shows of one connection; fixed once it is open.
#[derive(Debug)]
pub struct Entry {
    pub id: ConnId,
    /// RabbitMQ's name: "client address -> server address".
    pub name: String,
    pub peer: SocketAddr,
    pub local: Option<SocketAddr>,
    pub user: String,
    pub vhost: String,
    pub client_properties: FieldTable,
    pub auth_mechanism: String,
    pub frame_max: u32,
    pub channel_max: u16,
    pub heartbeat_s: u16,
    pub tls: bool,
    /// Unix time in ms when the connection opened.
    pub connected_at_ms: u64,
    /// Whether publisher flow control holds this connection back (see `crate::amqp::flow`).
    pub flow: crate::amqp::flow::FlowState,
    close: Notify,
    close_reason: Mutex<Option<String>>,
}

impl Entry {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: ConnId,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        user: String,
        vhost: String,
        client_properties: FieldTable,
        auth_mechanism: String,
        frame_max: u32,
        channel_max: u16,
        heartbeat_s: u16,
        tls: bool,
    ) -> Entry {
        let name = match local {
            Some(l) => format!("{peer} -> {l}"),
            None => peer.to_string(),
        };
        let connected_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Entry {
            id,
            name,
            peer,
            local,
            user,
            vhost,
            client_properties,
            auth_mechanism,
            frame_max,
            channel_max,
            heartbeat_s,
            tls,
            connected_at_ms,
            flow: Default::default(),
            close: Notify::new(),
            close_reason: Mutex::new(None),
        }
    }

    /// The name the client gave itself (`connection_name` in its client properties).
    pub fn user_provided_name(&self) -> Option<String> {
        match self.client_properties.inner().get("connection_name") {
            Some(amq_protocol_types::AMQPValue::LongString(s)) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            Some(amq_protocol_types::AMQPValue::ShortString(s)) => Some(s.as_str().to_string()),
            _ => None,
        }
    }

    /// Asks the connection to close with 320 CONNECTION_FORCED and `reason`.
    pub fn close(&self, reason: &str) {
        *self.close_reason.lock().expect("close reason lock") = Some(reason.to_string());
        // A permit is kept if the connection is not waiting right now.
        self.close.notify_one();
    }

    /// Resolves once [`Entry::close`] was called; the reason it was given.
    pub async fn close_requested(&self) -> String {
        self.close.notified().await;
        self.close_reason
            .lock()
            .expect("close reason lock")
            .clone()
            .unwrap_or_default()
    }
}

/// Every open connection of this node, by id.
#[derive(Default)]
pub struct Registry {
    open: Mutex<BTreeMap<ConnId, Arc<Entry>>>,
    counts: Arc<Mutex<Counts>>,
}

/// This node's connections counted per vhost and per user, for their `max-connections`.
#[derive(Default)]
struct Counts {
    by_vhost: HashMap<String, usize>,
    by_user: HashMap<String, usize>,
}

/// A connection counted against its vhost's and user's limits until it is dropped (when the
/// connection ends, however it ends).
pub struct Admission {
    counts: Arc<Mutex<Counts>>,
    vhost: String,
    user: String,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut c = self.counts.lock().expect("counts lock");
        let down = |m: &mut HashMap<String, usize>, k: &str| {
            if let Some(n) = m.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(k);
                }
            }
        };
        down(&mut c.by_vhost, &self.vhost);
        down(&mut c.by_user, &self.user);
    }
}

impl Registry {
    /// Counts a connection to `vhost` by `user`, unless that would go past `vhost_max` or
    /// `user_max` (the vhost's checked first, as RabbitMQ does); checked and counted under one
    /// lock, so connections opening at once cannot pass a limit together.
    /// `elsewhere` are the other nodes' open connections to `vhost` and of `user`.
    pub fn admit(
        &self,
        vhost: &str,
        user: &str,
        vhost_max: Option<u64>,
        user_max: Option<u64>,
        elsewhere: (usize, usize),
    ) -> Result<Admission, AmqpError> {
        let mut c = self.counts.lock().expect("counts lock");
        let in_vhost = c.by_vhost.get(vhost).copied().unwrap_or(0) + elsewhere.0;
        if limits::reached(vhost_max, in_vhost) {
            let limit = vhost_max.unwrap_or_default();
            return Err(limits::vhost_connections_refused(vhost, user, limit));
        }
        let of_user = c.by_user.get(user).copied().unwrap_or(0) + elsewhere.1;
        if limits::reached(user_max, of_user) {
            let limit = user_max.unwrap_or_default();
            return Err(limits::user_connections_refused(user, limit));
        }
        *c.by_vhost.entry(vhost.to_string()).or_default() += 1;
        *c.by_user.entry(user.to_string()).or_default() += 1;
        Ok(Admission {
            counts: self.counts.clone(),
            vhost: vhost.to_string(),
            user: user.to_string(),
        })
    }

    /// This node's open connections to `vhost`, and of `user`.
    pub fn counts(&self, vhost: &str, user: &str) -> (usize, usize) {
        let c = self.counts.lock().expect("counts lock");
        (
            c.by_vhost.get(vhost).copied().unwrap_or(0),
            c.by_user.get(user).copied().unwrap_or(0),
        )
    }

    pub fn insert(&self, entry: Arc<Entry>) {
        self.open
            .lock()
            .expect("registry lock")
            .insert(entry.id, entry);
    }

    pub fn remove(&self, id: ConnId) {
        self.open.lock().expect("registry lock").remove(&id);
    }

    /// The open connections, oldest first.
    pub fn list(&self) -> Vec<Arc<Entry>> {
        self.open
            .lock()
            .expect("registry lock")
            .values()
            .cloned()
            .collect()
    }

    pub fn get(&self, id: ConnId) -> Option<Arc<Entry>> {
        self.open.lock().expect("registry lock").get(&id).cloned()
    }

    pub fn by_name(&self, name: &str) -> Option<Arc<Entry>> {
        self.open
            .lock()
            .expect("registry lock")
            .values()
            .find(|e| e.name == name)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_counts_per_vhost_and_user_until_dropped() {
        let r = Registry::default();
        let a = r.admit("/", "bob", Some(2), Some(1), (0, 0)).unwrap();
        let e = r.admit("/", "bob", Some(2), Some(1), (0, 0)).err().unwrap();
        assert_eq!(e, limits::user_connections_refused("bob", 1));
        let b = r.admit("/", "alice", Some(2), None, (0, 0)).unwrap();
        let e = r.admit("/", "carol", Some(2), None, (0, 0)).err().unwrap();
        assert_eq!(e, limits::vhost_connections_refused("/", "carol", 2));
        assert!(r.admit("other", "carol", Some(2), None, (0, 0)).is_ok());
        drop(a);
        drop(b);
        let _again = r
            .admit("/", "bob", Some(2), Some(1), (0, 0))
            .expect("counted down on drop");
        let e = r.admit("/", "x", Some(0), None, (0, 0)).err().unwrap();
        assert_eq!(e, limits::vhost_connections_refused("/", "x", 0));
    }

    #[test]
    fn other_nodes_connections_count_against_the_limits() {
        let r = Registry::default();
        let e = r.admit("/", "bob", Some(3), None, (3, 0)).err().unwrap();
        assert_eq!(e, limits::vhost_connections_refused("/", "bob", 3));
        let e = r.admit("/", "bob", Some(3), Some(2), (1, 2)).err().unwrap();
        assert_eq!(e, limits::user_connections_refused("bob", 2));
        let _a = r.admit("/", "bob", Some(3), Some(2), (1, 1)).unwrap();
        assert_eq!(
            r.counts("/", "bob"),
            (1, 1),
            "only this node's own are counted here"
        );
        let e = r.admit("/", "bob", Some(3), None, (2, 0)).err().unwrap();
        assert_eq!(e, limits::vhost_connections_refused("/", "bob", 3));
    }
}
