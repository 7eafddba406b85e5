//! The node's stream protocol connections, their publishers and their consumers, with their
//! counters: what `warren ctl list_stream_connections`, `list_stream_publishers`,
//! `list_stream_consumers` and the management API read (rabbitmq-streams' info items).
//!
//! A connection registers when it opens and leaves when it ends; a publisher or consumer when
//! it is declared or subscribed and when it goes. Counters are relaxed atomics that the data
//! path adds to once per frame or chunk; readers take a [`Registry::snapshot`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What other parts of the node tell a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// A stream of the vhost was deleted (by any client): the connection's publishers and
    /// consumers of it go, and the client gets a metadata update.
    StreamDeleted { vhost: String, stream: String },
    /// This connection's subscription became its group's single active consumer.
    Activate { subscription_id: u8 },
    /// Close the connection (`warren ctl close_connection`, the node stops).
    Close { reason: String },
}

/// A publisher's counters (rabbitmq-streams list_stream_publishers).
#[derive(Debug, Default)]
pub struct PublisherCounters {
    pub published: AtomicU64,
    pub confirmed: AtomicU64,
    pub errored: AtomicU64,
}

/// A consumer's counters and state (list_stream_consumers).
#[derive(Debug, Default)]
pub struct ConsumerCounters {
    /// Chunks sent.
    pub chunks: AtomicU64,
    /// Messages (records) in the chunks sent.
    pub consumed: AtomicU64,
    /// The first offset of the last chunk sent.
    pub offset: AtomicU64,
    pub credit: AtomicU64,
}

#[derive(Debug, Clone)]
pub struct PublisherInfo {
    pub publisher_id: u8,
    pub stream: String,
    /// Empty for a publisher without deduplication.
    pub reference: String,
    pub counters: Arc<PublisherCounters>,
}

#[derive(Debug, Clone)]
pub struct ConsumerInfo {
    pub subscription_id: u8,
    pub stream: String,
    /// The subscription's properties (`name`, `single-active-consumer`, ...).
    pub properties: Vec<(String, String)>,
    /// Whether it is its group's active consumer (always, outside a group).
    pub active: bool,
    pub counters: Arc<ConsumerCounters>,
}

/// One connection as listings show it.
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub id: u64,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub user: String,
    pub vhost: String,
    pub tls: bool,
    pub frame_max: u32,
    pub heartbeat_s: u32,
    pub client_properties: Vec<(String, String)>,
    pub connected_at_ms: u64,
    pub publishers: BTreeMap<u8, PublisherInfo>,
    pub consumers: BTreeMap<u8, ConsumerInfo>,
}

struct Registered {
    info: ConnectionInfo,
    control: mpsc::UnboundedSender<Control>,
}

/// The node's stream connections.
#[derive(Default)]
pub struct Registry {
    connections: Mutex<BTreeMap<u64, Registered>>,
    next_id: AtomicU64,
}

impl Registry {
    /// A connection id unique on this node.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Relaxed) + 1
    }

    pub fn register(&self, info: ConnectionInfo, control: mpsc::UnboundedSender<Control>) {
        self.connections
            .lock()
            .expect("stream registry")
            .insert(info.id, Registered { info, control });
    }

    pub fn unregister(&self, id: u64) {
        self.connections
            .lock()
            .expect("stream registry")
            .remove(&id);
    }

    /// Changes connection `id`'s entry (a publisher or consumer came or went).
    pub fn update(&self, id: u64, change: impl FnOnce(&mut ConnectionInfo)) {
        if let Some(r) = self
            .connections
            .lock()
            .expect("stream registry")
            .get_mut(&id)
        {
            change(&mut r.info);
        }
    }

    /// Every open connection, as it stands.
    pub fn snapshot(&self) -> Vec<ConnectionInfo> {
        self.connections
            .lock()
            .expect("stream registry")
            .values()
            .map(|r| r.info.clone())
            .collect()
    }

    /// Tells connection `id`; false when it is gone.
    pub fn tell(&self, id: u64, control: Control) -> bool {
        self.connections
            .lock()
            .expect("stream registry")
            .get(&id)
            .is_some_and(|r| r.control.send(control).is_ok())
    }

    /// Tells every connection of `vhost` that `stream` was deleted.
    pub fn stream_deleted(&self, vhost: &str, stream: &str) {
        for r in self.connections.lock().expect("stream registry").values() {
            if r.info.vhost == vhost {
                let _ = r.control.send(Control::StreamDeleted {
                    vhost: vhost.to_string(),
                    stream: stream.to_string(),
                });
            }
        }
    }

    /// Closes connection `id` (or every one, with `None`); how many were told.
    pub fn close(&self, id: Option<u64>, reason: &str) -> usize {
        let map = self.connections.lock().expect("stream registry");
        map.values()
            .filter(|r| id.is_none_or(|id| r.info.id == id))
            .filter(|r| {
                r.control
                    .send(Control::Close {
                        reason: reason.to_string(),
                    })
                    .is_ok()
            })
            .count()
    }
}
