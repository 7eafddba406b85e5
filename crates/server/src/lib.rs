//! The network edge: sockets, connections, channels and authentication.
//!
//! The map, a folder or file per concept:
//! - [`amqp`]: the AMQP front end: connection, handshake, channel, transactions, confirms,
//!   flow control, writer, and the limits and registry of open connections.
//! - [`queues`]: what a channel does with a queue, one implementation per place a queue can be
//!   (this node, another node, a quorum queue's Raft group, under [`queues::quorum`]).
//! - [`peers`]: messages across nodes: publishes forwarded to a queue's node, deliveries relayed
//!   to consumers connected elsewhere, and what other nodes ask of this one.
//! - [`storage`]: what a vhost's changes write to disk: durable topology to the metadata
//!   journal, messages to the storage engine; and their recovery at start.
//! - [`durability`]: what the storage engine, the queues' nodes and the quorum groups have
//!   taken, for publisher confirms.
//! - [`topology`]: exchanges, queues and bindings changed by one path, a command applied by
//!   the broker and made durable by the journal (one node) or Raft (a cluster);
//!   [`lost_queues`]: the transient and exclusive queues of a node that restarted or stays
//!   down, deleted everywhere.
//! - [`node`]: config, alarms, memory, data format, maintenance mode, fault injection.
//! - [`management`]: the HTTP management API and Prometheus metrics; [`queue_stats`]: queue
//!   figures asked of each queue's node; [`cluster_admin`]: its cluster membership routes
//!   (join, forget, reset); [`definitions`]: `GET /api/definitions`, the whole topology in
//!   RabbitMQ's export format; [`definitions_import`]: `POST` of one, and
//!   `--load-definitions` at boot.
//! - [`tls`]: AMQP over TLS, the management API over HTTPS, certificate logins and reloads.
//!
//! A frame flows: socket -> `amqp::connection` (decode) -> `amqp::channel` (command) -> the
//! broker's vhost (route, enqueue, dispatch) or a queue's [`queues`] implementation ->
//! consumer connection's outbox -> its `amqp::writer` -> socket.

pub mod amqp;
pub mod cluster_admin;
pub mod definitions;
pub mod definitions_import;
pub mod durability;
pub mod lost_queues;
pub mod management;
pub mod node;
pub mod peers;
pub mod queue_stats;
pub mod queues;
pub mod storage;
pub mod stream_protocol;
pub mod tls;
pub mod topology;

use node::config::ServerConfig;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use warren_broker::broker::Broker;

/// How often queues are checked for expired messages and unused queues.
const TICK_INTERVAL: Duration = Duration::from_millis(50);
/// How long a shutdown waits for clients to receive connection.close.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// What every connection of a node shares.
pub struct Shared {
    pub broker: Arc<Broker>,
    pub config: ServerConfig,
    pub shutdown: watch::Receiver<bool>,
    pub next_conn: AtomicU64,
    pub next_channel: AtomicU64,
    pub connections_open: AtomicUsize,
    /// Client sockets accepted and not yet closed (handshaking ones included), against
    /// `connection_max`.
    pub client_sockets: AtomicUsize,
    /// The open connections, for the management API.
    pub connections: amqp::registry::Registry,
    /// Message rates for the management API, sampled when it is asked.
    pub rates: management::stats::Rates,
    /// The snapshot of queues and channels `/metrics` reads, taken every 5 s.
    pub node_stats: management::node_stats::Board,
    pub counters: Counters,
    /// Memory and disk alarms; `warren ctl set_vm_memory_high_watermark` / `set_disk_free_limit`
    /// change their limits.
    pub alarms: Arc<node::alarms::Alarms>,
    /// Certificates for the TLS listeners, when there are any; reloadable.
    pub tls: Option<Arc<tls::Tls>>,
    /// Where durable-topology changes are written before they are acknowledged.
    pub journal: Option<std::sync::Mutex<warren_store::journal::Journal>>,
    /// The storage engine holding durable queues' persistent messages.
    pub store: Option<Arc<warren_store::Store>>,
    pub durability: Arc<durability::Durability>,
    /// The cluster this node belongs to; `None` for a single node. Topology changes then go
    /// through its replicated metadata instead of the local journal.
    pub cluster: Option<Arc<warren_cluster::Cluster>>,
    /// Requests waiting on quorum queue groups, and this node's replicas' figures.
    pub quorum: queues::quorum::client::QuorumQueues,
    /// Maintenance mode (`warren ctl drain`).
    pub maintenance: node::maintenance::Maintenance,
    /// The streams' logs and writers, and their consumers' readers.
    pub streams: queues::stream::Streams,
    pub streams_consumers: queues::stream::Consumers,
    /// The stream protocol's connections, publishers and consumers, for listings.
    pub stream_connections: stream_protocol::Registry,
    /// Single active consumer groups of the stream protocol.
    pub stream_groups: stream_protocol::Groups,
}

impl Shared {
    /// A node's shared state without listeners, journal, store or cluster: what the definitions
    /// import and export work on, for tests and the `definitions` fuzz target, which run the
    /// very code `POST /api/definitions` runs on a fresh broker each time.
    pub fn standalone(config: ServerConfig, broker: Arc<Broker>) -> Arc<Shared> {
        let alarms = Arc::new(node::alarms::Alarms::new(
            config.memory_high_watermark_bytes,
            config.disk_free_limit_bytes,
            Vec::new(),
        ));
        let (_, shutdown) = watch::channel(false);
        let maintenance = node::maintenance::Maintenance::new(&config.meta_dir(), false);
        let stream_dir = config.stream_dir();
        Arc::new(Shared {
            broker,
            config,
            shutdown,
            next_conn: AtomicU64::new(1),
            next_channel: AtomicU64::new(1),
            connections_open: AtomicUsize::new(0),
            client_sockets: AtomicUsize::new(0),
            connections: amqp::registry::Registry::default(),
            rates: management::stats::Rates::default(),
            node_stats: management::node_stats::Board::default(),
            counters: Counters::default(),
            alarms,
            tls: None,
            journal: None,
            store: None,
            durability: Default::default(),
            cluster: None,
            quorum: Default::default(),
            maintenance,
            streams: queues::stream::Streams::new(stream_dir),
            streams_consumers: Default::default(),
            stream_connections: Default::default(),
            stream_groups: Default::default(),
        })
    }

    /// Stops the node's writes for good after a failed fsync (of the WAL or the metadata
    /// journal): publishers are blocked by the storage alarm, durable changes are refused.
    /// Safe to call under a vhost or journal lock: it takes neither.
    pub fn storage_failed(&self, why: &str) {
        self.broker
            .refuse_durable_changes(&format!("storage failure: {why}"));
        self.alarms.raise_storage_failure(why);
    }
}

/// Node-wide message counters for metrics; relaxed atomics, added to once per read batch.
#[derive(Default)]
pub struct Counters {
    pub published: AtomicU64,
    pub confirmed: AtomicU64,
    pub unroutable: AtomicU64,
    /// Logins refused (bad password, unknown user, no usable client certificate).
    pub auth_failures: AtomicU64,
    /// Connections closed because their handshake outlasted `handshake_timeout`.
    pub handshake_timeouts: AtomicU64,
    /// Unroutable mandatory publishes sent back with basic.return (the rest of `unroutable`
    /// were dropped).
    pub returned: AtomicU64,
    /// AMQP connections that completed their handshake, and those of them that ended.
    pub connections_opened: AtomicU64,
    pub connections_closed: AtomicU64,
    /// Channels opened and closed (the management API's own included, as RabbitMQ counts its
    /// direct connections').
    pub channels_opened: AtomicU64,
    pub channels_closed: AtomicU64,
    /// Open channels that have published at least once: RabbitMQ's publishers.
    pub publishers: AtomicU64,
}

impl Counters {
    pub fn channel_opened(&self) {
        self.channels_opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A channel's end; `publisher` when it had published (it then leaves the publishers).
    pub fn channel_closed(&self, publisher: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.channels_closed.fetch_add(1, Relaxed);
        if publisher {
            self.publishers.fetch_sub(1, Relaxed);
        }
    }
}

/// The node's AMQP listeners, bound, and the certificates the TLS one serves.
pub struct Listeners {
    /// Plain AMQP, one per `--listen` address; none with `--listen none`.
    pub amqp: Vec<TcpListener>,
    /// AMQP over TLS; None without `--tls-listen`.
    pub amqps: Option<TcpListener>,
    pub tls: Option<Arc<tls::Tls>>,
    /// The management API over HTTP and HTTPS, when configured.
    pub management: Option<TcpListener>,
    pub management_tls: Option<TcpListener>,
    /// RabbitMQ's stream protocol, plain and over TLS, when configured.
    pub stream: Option<TcpListener>,
    pub stream_tls: Option<TcpListener>,
}

/// Loads the certificates and binds the listeners, the management API's included; separate
/// from [`serve`] so callers learn of a busy port or a bad certificate file at once, and stop
/// (as RabbitMQ refuses to boot when a listener's port is taken). The error says which.
pub async fn bind(config: &ServerConfig) -> Result<Listeners, String> {
    let tls = tls::Tls::load(&config.tls).map_err(|e| e.to_string())?;
    if config.auth_mechanisms.iter().any(|m| m == "EXTERNAL") && !config.tls.verify_peer {
        tracing::warn!("EXTERNAL is offered but --tls-verify-peer is off: every EXTERNAL login will be refused, as in RabbitMQ");
    }
    async fn listen(addr: Option<std::net::SocketAddr>) -> Result<Option<TcpListener>, String> {
        match addr {
            Some(a) => bind_listener(a).map(Some),
            None => Ok(None),
        }
    }
    let mut amqp = Vec::with_capacity(config.listen.len());
    for a in &config.listen {
        amqp.push(bind_listener(*a)?);
    }
    let management_tls = match (config.tls.management_listen, &tls) {
        (Some(a), Some(_)) => Some(bind_management(a, "HTTPS ")?),
        _ => None,
    };
    let (stream, stream_tls) = stream_protocol::bind(config)?;
    Ok(Listeners {
        stream,
        stream_tls,
        amqp,
        amqps: listen(config.tls.listen).await?,
        tls,
        management: config
            .management_listen
            .map(|a| bind_management(a, ""))
            .transpose()?,
        management_tls,
    })
}

fn bind_management(a: std::net::SocketAddr, what: &str) -> Result<TcpListener, String> {
    bind_listener(a).map_err(|e| {
        format!(
            "{e}: the management API {what}cannot start (set --management-listen to a free \
             address, or none)"
        )
    })
}

/// How many connections may wait in a listener's accept queue (the kernel caps it further at
/// net.core.somaxconn); tokio's `TcpListener::bind` uses the same.
const LISTEN_BACKLOG: u32 = 1024;

/// Binds one listener as `TcpListener::bind` would, except that an IPv6 one takes IPv6 only
/// (IPV6_V6ONLY): `[::]:5672` beside `0.0.0.0:5672` is then two listeners, as in RabbitMQ,
/// rather than a failed second bind because the first took both families.
pub(crate) fn bind_listener(a: std::net::SocketAddr) -> Result<TcpListener, String> {
    let fail = |e: std::io::Error| format!("cannot listen on {a}: {e}");
    let socket = match a {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(fail)?;
    socket.set_reuseaddr(true).map_err(fail)?;
    if a.is_ipv6() {
        use std::os::fd::AsRawFd;
        let on: libc::c_int = 1;
        // SAFETY: a valid socket descriptor, and a pointer to a c_int with its size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                &on as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
    }
    socket.bind(a).map_err(fail)?;
    socket.listen(LISTEN_BACKLOG).map_err(fail)
}

/// Accepts on whichever of the plain listeners has a connection first (never returns when
/// there are none).
async fn accept_any(
    listeners: &[TcpListener],
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    if listeners.is_empty() {
        return std::future::pending().await;
    }
    std::future::poll_fn(|cx| {
        for l in listeners {
            if let std::task::Poll::Ready(r) = l.poll_accept(cx) {
                return std::task::Poll::Ready(r);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Whether the node holds `connection_max` client sockets already (RabbitMQ's
/// `connection_max`): one more is closed as it is accepted.
fn at_connection_max(shared: &Shared, sockets: usize) -> bool {
    shared
        .config
        .connection_max
        .is_some_and(|max| sockets as u64 >= max)
}

/// Accepts on a listener that may be off (then never returns).
async fn accept(
    listener: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// 16 bits that differ between two starts of a node (the start's second, wrapping every 18
/// hours): each start numbers its channels from a range of its own.
fn boot_stamp() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        & 0xFFFF
}

/// Accepts connections until `stop` turns true, then closes the client listeners, hands the
/// node's leaderships to other members while its clients are still connected (bounded:
/// [`node::maintenance::hand_over_before_stop`]), and closes every connection with 320
/// CONNECTION_FORCED, as RabbitMQ does when it stops.
pub async fn serve(
    listeners: Listeners,
    config: ServerConfig,
    broker: Arc<Broker>,
    mut stop: watch::Receiver<bool>,
    journal: Option<warren_store::journal::Journal>,
    storage: Option<(Arc<warren_store::Store>, Arc<durability::Durability>)>,
    cluster: Option<Arc<warren_cluster::Cluster>>,
) {
    let mut listeners = listeners;
    let alarms = Arc::new(node::alarms::Alarms::new(
        config.memory_high_watermark_bytes,
        config.disk_free_limit_bytes,
        vec![config.wal_dir(), config.segment_dir(), config.meta_dir()],
    ));
    if let Some((store, _)) = &storage {
        alarms.watch_store(store.clone());
    }
    tokio::spawn(node::alarms::monitor(alarms.clone()));
    let config_meta_dir = config.meta_dir();
    let streams = if cluster.is_some() {
        queues::stream::Streams::replicated(config.stream_dir())
    } else {
        queues::stream::Streams::new(config.stream_dir())
    };
    // What the connections watch: turned on once the leaderships are handed over.
    let (shutdown_tx, shutdown) = watch::channel(false);
    let shared = Arc::new(Shared {
        broker,
        config,
        shutdown: shutdown.clone(),
        // Connection ids own exclusive queues in the replicated topology, so each node numbers
        // its connections from a range of its own.
        next_conn: AtomicU64::new(cluster.as_ref().map_or(0, |c| c.node_id() << 40) + 1),
        // Channel keys too: a stand-in on a queue's node has its client channel's key.
        // And from a range of each start of the node: a quorum queue's group may still name
        // consumers of the node's previous life, which must not be taken for new channels.
        next_channel: AtomicU64::new(
            cluster
                .as_ref()
                .map_or(0, |c| (c.node_id() << 40) | (boot_stamp() << 24))
                + 1,
        ),
        connections_open: AtomicUsize::new(0),
        client_sockets: AtomicUsize::new(0),
        connections: amqp::registry::Registry::default(),
        rates: management::stats::Rates::default(),
        node_stats: management::node_stats::Board::default(),
        counters: Counters::default(),
        alarms,
        tls: listeners.tls.clone(),
        journal: journal.map(std::sync::Mutex::new),
        store: storage.as_ref().map(|s| s.0.clone()),
        durability: storage.map(|s| s.1).unwrap_or_default(),
        maintenance: node::maintenance::Maintenance::new(
            &config_meta_dir,
            node::maintenance::stored(&config_meta_dir).unwrap_or_else(|e| {
                tracing::error!(error = %e, "maintenance mode: staying in it");
                true
            }),
        ),
        cluster,
        quorum: Default::default(),
        streams,
        streams_consumers: Default::default(),
        stream_connections: Default::default(),
        stream_groups: Default::default(),
    });
    peers::install(&shared);
    queues::stream::open_all(&shared);
    queues::quorum::replica::install(&shared);
    tokio::spawn(lost_queues::sweep(shared.clone()));
    let mut failure = shared.durability.subscribe_failure();
    let failing = shared.clone();
    tokio::spawn(async move {
        if let Ok(why) = failure.wait_for(Option::is_some).await {
            let why = why.clone().unwrap_or_default();
            failing.storage_failed(&why);
        }
    });
    if let (Some(user), Some(pass)) = (&shared.config.default_user, &shared.config.default_pass) {
        definitions_import::default_user_at_boot(&shared, user, pass).await;
    }
    if let Some(path) = shared.config.load_definitions.clone() {
        // Before the first client is accepted, as RabbitMQ's load_definitions.
        definitions_import::load_at_boot(&shared, &path).await;
    }
    management::node_stats::start(shared.clone());
    let ticking = shared.clone();
    tokio::spawn(async move {
        let mut t = tokio::time::interval(TICK_INTERVAL);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            storage::tick(&ticking);
        }
    });
    if let Some(l) = listeners.management.take() {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(listen = %addr, "management API started");
        }
        let app = management::router(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
    }
    if let (Some(l), Some(tls)) = (listeners.management_tls.take(), &shared.tls) {
        tls::https::start(l, tls.clone(), shared.clone());
    }
    for (listener, tls) in [
        (listeners.stream.take(), false),
        (listeners.stream_tls.take(), true),
    ] {
        if let Some(l) = listener {
            if let Some(addr) = stream_protocol::describe(&l) {
                tracing::info!(listen = %addr, tls, "stream protocol listener started");
            }
            tokio::spawn(stream_protocol::accept(l, tls, shared.clone()));
        }
    }
    // Maintenance mode (`maintenance`): the client listeners closed while on, bound again by
    // revive and taken up here.
    let mut listening = shared.maintenance.listening.subscribe();
    if !*listening.borrow_and_update() {
        tracing::warn!("the node is in maintenance mode (warren ctl drain): client listeners stay closed until warren ctl revive");
        listeners.amqp.clear();
        listeners.amqps = None;
        shared.maintenance.suspended.send_replace(true);
    }
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Ok(()) = listening.changed() => {
                if *listening.borrow_and_update() {
                    let resumed = shared.maintenance.resumed.lock().expect("resumed lock").take();
                    if let Some(r) = resumed {
                        listeners.amqp = r.amqp;
                        listeners.amqps = r.amqps;
                    }
                    shared.maintenance.suspended.send_replace(false);
                } else {
                    listeners.amqp.clear();
                    listeners.amqps = None;
                    shared.maintenance.suspended.send_replace(true);
                }
            }
            accepted = accept_any(&listeners.amqp) => match accepted {
                Ok((stream, peer)) if at_connection_max(&shared, connections.len()) => {
                    drop(stream);
                    tracing::debug!(%peer, "connection_max reached: connection closed");
                }
                Ok((stream, peer)) => {
                    connections.spawn(amqp::connection::serve(stream, peer, shared.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            accepted = accept(listeners.amqps.as_ref()) => match accepted {
                Ok((stream, peer)) if at_connection_max(&shared, connections.len()) => {
                    drop(stream);
                    tracing::debug!(%peer, "connection_max reached: TLS connection closed");
                }
                Ok((stream, peer)) => {
                    connections.spawn(tls::serve_amqps(stream, peer, shared.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "TLS accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stop.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
        shared
            .client_sockets
            .store(connections.len(), std::sync::atomic::Ordering::Relaxed);
    }
    drop(listeners);
    node::maintenance::hand_over_before_stop(&shared).await;
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE * 8, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    // What the streams' writers still hold is written and synced (its publishers are gone).
    let closing = shared.clone();
    let _ = tokio::task::spawn_blocking(move || closing.streams.close_all()).await;
}
