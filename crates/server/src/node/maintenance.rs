//! Maintenance mode, as `rabbitmq-upgrade drain` / `revive` have it, for upgrades and host
//! maintenance: a draining node stops its client listeners (AMQP and AMQPS; the management API
//! stays up), closes its clients' connections with RabbitMQ's reason, hands every leadership
//! it holds (quorum queues', the metadata's) to other members and takes no new ones nor new
//! queues (`warren_cluster::Cluster::set_draining`, `crate::placement`). It stays so across
//! restarts until `revive`: the mode is kept in `META_DIR/maintenance.json`, written before
//! anything else happens, and in the replicated member table, where every node sees it.
//!
//! - `POST /api/warren/drain`, `POST /api/warren/revive`: `warren ctl drain` / `revive`. RabbitMQ
//!   has no HTTP API for these; the paths are warren's. Drain answers once the leaderships
//!   have moved, or after [`HANDOVER_WAIT`] with those that could not (no other member up).
//!
//! SIGTERM uses the same handover, bounded and not remembered ([`hand_over_before_stop`]).

use crate::Shared;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The reason a draining node's clients are given with 320 CONNECTION_FORCED: RabbitMQ's
/// words, which some clients and libraries match to tell maintenance from a failure.
pub const CLOSE_REASON: &str = "Node was put into maintenance mode";

/// How long drain waits for other members to take over this node's leaderships before it
/// answers (the transfers go on after it).
pub const HANDOVER_WAIT: Duration = Duration::from_secs(5);

/// How long SIGTERM waits for the leaderships to move before the node stops anyway: short,
/// since a process manager kills a node that takes long to stop, and a transfer takes a round
/// trip or two once the new leader has the log.
pub const STOP_HANDOVER_WAIT: Duration = Duration::from_secs(3);

const FILE: &str = "maintenance.json";

/// Whether the node was in maintenance mode when it stopped (its file says so).
pub fn stored(meta_dir: &Path) -> Result<bool, String> {
    let path = meta_dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["draining"].as_bool())
            .ok_or_else(|| {
                format!(
                    "{}: unreadable (expected {{\"draining\": true|false}}); delete it to start \
                     out of maintenance mode",
                    path.display()
                )
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The client listeners a revive bound, for the accept loop to take up.
pub struct Resumed {
    pub amqp: Vec<TcpListener>,
    pub amqps: Option<TcpListener>,
}

/// The node's maintenance mode.
pub struct Maintenance {
    path: PathBuf,
    draining: AtomicBool,
    /// The node is stopping (SIGTERM): it no longer serves, whatever its mode.
    stopping: AtomicBool,
    /// Whether the accept loop should hold its client listeners (false) or drop them.
    pub(crate) listening: watch::Sender<bool>,
    /// Whether it does: a drain answers once the listeners are closed.
    pub(crate) suspended: watch::Sender<bool>,
    pub(crate) resumed: Mutex<Option<Resumed>>,
    /// One drain or revive at a time.
    changing: tokio::sync::Mutex<()>,
}

impl Maintenance {
    pub fn new(meta_dir: &Path, draining: bool) -> Maintenance {
        Maintenance {
            path: meta_dir.join(FILE),
            draining: AtomicBool::new(draining),
            stopping: AtomicBool::new(false),
            listening: watch::channel(!draining).0,
            suspended: watch::channel(false).0,
            resumed: Mutex::new(None),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Writes the mode down durably (a crash mid-drain restarts drained).
    fn store(&self, draining: bool) -> Result<(), String> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, json!({ "draining": draining }).to_string())
            .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|_| std::fs::rename(&tmp, &self.path))
            .and_then(|_| match self.path.parent() {
                Some(dir) => std::fs::File::open(dir)?.sync_all(),
                None => Ok(()),
            })
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

/// What a drain did.
#[derive(Debug, Default, serde::Serialize)]
pub struct Drained {
    pub connections_closed: usize,
    /// Leaderships still here when drain answered: no other member was up to take them, or
    /// the transfer took longer than [`HANDOVER_WAIT`] (it goes on).
    pub metadata_leader: bool,
    pub quorum_queue_leaders: usize,
}

/// Puts the node into maintenance mode (see the module's doc).
pub async fn drain(shared: &Arc<Shared>) -> Result<Drained, String> {
    let m = &shared.maintenance;
    let _one = m.changing.lock().await;
    m.store(true)?;
    m.draining.store(true, Ordering::SeqCst);
    tracing::warn!("maintenance mode: suspending client listeners, closing client connections, handing leaderships on");
    suspend_listeners(shared).await;
    let connections_closed = close_clients(shared, CLOSE_REASON);
    let (metadata_leader, quorum_queue_leaders) = match &shared.cluster {
        None => (false, 0),
        Some(cluster) => {
            cluster.set_draining(true);
            wait_for_handover(cluster, HANDOVER_WAIT).await
        }
    };
    tracing::warn!(
        connections_closed,
        metadata_leader,
        quorum_queue_leaders,
        "maintenance mode: node drained"
    );
    Ok(Drained {
        connections_closed,
        metadata_leader,
        quorum_queue_leaders,
    })
}

/// Takes the node out of maintenance mode: its listeners accept again, it takes leaderships
/// and new queues again (it does not take back those it gave: `warren ctl rebalance` does).
pub async fn revive(shared: &Arc<Shared>) -> Result<(), String> {
    let m = &shared.maintenance;
    let _one = m.changing.lock().await;
    if m.is_draining() {
        // Bound first: a port taken meanwhile leaves the node drained, and says so.
        let mut amqp = Vec::new();
        for a in &shared.config.listen {
            amqp.push(crate::bind_listener(*a)?);
        }
        let amqps = match shared.config.tls.listen {
            Some(a) => Some(crate::bind_listener(a)?),
            None => None,
        };
        *m.resumed.lock().expect("resumed lock") = Some(Resumed { amqp, amqps });
    }
    m.store(false)?;
    m.draining.store(false, Ordering::SeqCst);
    m.listening.send_replace(true);
    let mut suspended = m.suspended.subscribe();
    let _ = suspended.wait_for(|s| !*s).await;
    if let Some(cluster) = &shared.cluster {
        cluster.set_draining(false);
    }
    tracing::warn!("maintenance mode ended: client listeners resumed");
    Ok(())
}

/// SIGTERM's short drain: the leaderships go to other members while the clients are still
/// connected (their publishes and acks follow the new leaders), within
/// [`STOP_HANDOVER_WAIT`]; the clients are then closed by the shutdown as before.
pub async fn hand_over_before_stop(shared: &Arc<Shared>) {
    shared.maintenance.stopping.store(true, Ordering::SeqCst);
    let Some(cluster) = &shared.cluster else {
        return;
    };
    if cluster.leaderships() == (false, 0) {
        return;
    }
    cluster.hand_off_leaderships();
    let (metadata, queues) = wait_for_handover(cluster, STOP_HANDOVER_WAIT).await;
    tracing::info!(
        metadata_leader_left = metadata,
        quorum_queue_leaders_left = queues,
        "stopping: leaderships handed over"
    );
}

async fn suspend_listeners(shared: &Shared) {
    let m = &shared.maintenance;
    m.listening.send_replace(false);
    let mut suspended = m.suspended.subscribe();
    let _ = suspended.wait_for(|s| *s).await;
}

/// Closes every client connection of the node with 320 CONNECTION_FORCED and `reason`.
fn close_clients(shared: &Shared, reason: &str) -> usize {
    let open = shared.connections.list();
    for entry in &open {
        entry.close(reason);
    }
    open.len()
}

/// Waits until this node leads nothing or `wait` passed; what it still leads.
async fn wait_for_handover(cluster: &warren_cluster::Cluster, wait: Duration) -> (bool, usize) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let led = cluster.leaderships();
        if led == (false, 0) || tokio::time::Instant::now() >= deadline {
            return led;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
