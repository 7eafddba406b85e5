//! Several warren nodes as one broker: membership, the node-to-node transport, and the
//! metadata replicated by Raft.
//!
//! The map:
//! - [`frame`]: the wire format between nodes (hello, ping/pong, batches of Raft messages).
//! - [`transport`]: one outbound link per peer, batched writes, bounded buffers, per-node
//!   failure detection by ping; beside it a raft link per peer for quorum queues' Raft frames,
//!   read by the peer's groups loop itself (`groups/raft_links.rs`).
//! - [`link_tls`]: mutually authenticated TLS 1.3 on those links (`--cluster-tls-*`), so that
//!   only nodes whose certificates the cluster's CA signed can speak as nodes.
//! - [`raft_log`]: a Raft group's log on the node's shared WAL (entries, hard state) and its
//!   snapshot file; [`stored_entry`]: how an entry is kept in the WAL (a queue command's data
//!   bare, anything else as protobuf) and how it travels to another member.
//! - [`metadata`]: the metadata group, a Raft group over all nodes whose log is the topology
//!   commands; its thread applies them to the node's broker.
//! - [`applied_requests`]: which proposals were applied, so a command proposed twice (a retry
//!   after a leader change) takes effect once.
//! - [`groups`]: every quorum queue's Raft group on the node, driven by one loop: one WAL sync
//!   per round for all groups, idle groups asleep until a proposal, a message or a node down.
//!   Its files `groups/raft_links.rs` (what the loop waits on: its inputs and the peers'
//!   raft links, in one epoll), `groups/proposals.rs` (proposals waiting for a leader),
//!   `groups/apply.rs` (committed entries applied without waiting for this node's disk),
//!   `groups/syncer.rs` (the WAL writer tells the loop of each round's sync),
//!   `groups/voters.rs` (voters following the queue's members), `groups/commit_latency.rs` (a
//!   leader's append-to-apply time), `groups/failover.rs` (a leader's node down: elect
//!   another at once) and `groups/hibernation.rs` (when a quiet group stops ticking).
//!   Beside it, threads that keep slow work off the loop: [`snapshot_writer`] (a group's
//!   snapshot files) and [`catch_up`] (a member behind a snapshot fetches the entries below
//!   it in chunks, [`snapshot_transfer`] being what the snapshot carries).
//! - [`messaging`]: messages between nodes (forwarded publishes, deliveries to consumers on
//!   other nodes, their acks, requests to a queue's node) and the epochs that keep two nodes'
//!   views of each other consistent across broken links.
//! - [`membership`]: nodes joining a running cluster (`join_cluster`) and stopped ones removed
//!   (`forget_cluster_node`), as configuration changes of the metadata group.
//! - [`force_boot`]: `warren ctl force_boot`, a node that makes itself the only voter at its
//!   next start when the rest of its cluster is gone for good.
//! - [`metrics`]: the links' and the metadata group's Prometheus series.
//!
//! A topology change flows: a connection's channel (server) builds a
//! [`warren_broker::command::Command`] -> [`Cluster::execute`] -> the metadata group's thread
//! proposes it -> raft-rs replicates it through [`transport`] -> once committed, every node's
//! thread applies it with [`warren_broker::broker::Broker::execute`] -> the proposing node
//! answers its client with its own outcome.
//!
//! A publish to a queue on another node flows: the publisher's channel routes it (every node
//! has the topology) -> the vhost leaves a `Forward` effect -> [`Cluster::messaging`] sends it
//! in the next batch to the queue's node -> its server enqueues it and answers `Published` once
//! it is durable there -> the publisher's confirm goes out. Deliveries come back the same way.
//!
//! `docs/cluster.md` says what a user sees, `docs/design/cluster.md` why it is built this way.

pub mod address;
pub mod applied_requests;
pub mod catch_up;
mod discovery;
pub mod force_boot;
pub mod frame;
pub mod groups;
mod inputs;
pub mod link_tls;
pub mod membership;
pub mod messaging;
pub mod metadata;
pub mod metrics;
pub mod raft_log;
pub mod replicas;
pub mod snapshot_transfer;
pub mod snapshot_writer;
pub mod stored_entry;
pub mod transport;

use address::HostPort;
use frame::NodeInfo;
use groups::QueueGroups;
use messaging::Messaging;
use metadata::{GroupStatus, Input, MetadataGroup, Timing};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use transport::{Inbound, LinkStats, Transport};
use warren_broker::broker::Broker;
use warren_broker::command::{Command, Outcome};
use warren_broker::error::AmqpError;
use warren_protocol::constants::INTERNAL_ERROR;
use warren_store::Store;

/// How long a topology change waits for a majority before it is refused.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a quorum queue's declare waits for the member table to name every voter.
pub const VOTER_NAMES_WAIT: Duration = Duration::from_secs(5);

/// The file `warren ctl reset` leaves in a node's emptied cluster directory: the node starts as
/// a joiner, never as the founder it may have been.
pub const RESET_NODE: &str = "reset_node";

/// What a node is told about the cluster at start.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub node_name: String,
    /// Where this node accepts other nodes' links, as written (a name is resolved at start).
    pub listen: HostPort,
    /// The address other nodes dial to reach this one (`--cluster-advertise`); `None`: the
    /// listen address, or for a node listening on every interface the seed that is this node,
    /// else this machine's host name ([`advertised_address`]).
    pub advertise: Option<HostPort>,
    /// At a node's first start, the founding nodes' cluster addresses (a founder's Raft id is
    /// its position here, plus 1), or, for a node not among them, the members it asks to join
    /// (none: it waits for `join_cluster`). At later starts, where to look for the other
    /// members when their stored addresses no longer reach them (a cluster restarted under new
    /// addresses); none given: the stored ones.
    pub seeds: Vec<HostPort>,
    /// How long a first start waits for every seed's name to resolve: which seed is this node
    /// is decided by what they resolve to (Kubernetes publishes a pod's name shortly after the
    /// pod starts).
    pub seed_resolve_timeout: Duration,
    pub amqp: SocketAddr,
    pub management: Option<SocketAddr>,
    /// Where the node keeps its cluster identity and the metadata snapshot.
    pub dir: PathBuf,
    pub timing: Timing,
    /// The node's certificate, key and the cluster's CA: every link is then TLS with both
    /// ends' certificates checked. None: plain TCP, open to anyone who reaches `listen`.
    pub tls: Option<link_tls::LinkTlsFiles>,
    /// The node was left in maintenance mode (`warren ctl drain`) when it last stopped.
    pub draining: bool,
}

/// Who this node is in the cluster, fixed at its first start.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Identity {
    id: u64,
    founders: Vec<u64>,
    /// The seeds of the first start, in their order (the founders' ids follow it).
    seeds: Vec<HostPort>,
}

/// A node's view of one member.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemberStatus {
    pub id: u64,
    pub name: String,
    pub cluster: String,
    pub amqp: Option<String>,
    pub management: Option<String>,
    pub running: bool,
    pub voter: bool,
    /// In maintenance mode (`warren ctl drain`), as the member table says.
    pub draining: bool,
}

/// What `warren ctl cluster_status`, `/api/nodes` and `/metrics` show.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterStatus {
    pub node: String,
    pub id: u64,
    pub metadata: GroupStatus,
    pub members: Vec<MemberStatus>,
    pub links: Vec<LinkStats>,
}

/// A running node's cluster side.
pub struct Cluster {
    me: NodeInfo,
    /// Maintenance mode, as last set here (`me.draining` is only its value at start).
    draining: std::sync::atomic::AtomicBool,
    seeds: BTreeMap<u64, HostPort>,
    transport: Transport,
    inputs: Mutex<std::sync::mpsc::Sender<Input>>,
    status: Arc<Mutex<GroupStatus>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    installs: Arc<tokio::sync::watch::Sender<u64>>,
    /// The index of the last metadata entry this node applied.
    applied: Arc<tokio::sync::watch::Sender<u64>>,
    messaging: Arc<Messaging>,
    queue_groups: QueueGroups,
    groups_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    replicas: Arc<replicas::Replicas>,
}

/// Raft groups other than the metadata's and the membership requests' are quorum queues'.
fn is_queue_group(group: u64) -> bool {
    group != metadata::METADATA_GROUP && group != membership::MEMBERSHIP_GROUP
}

impl Cluster {
    /// Joins (or founds, with the other seeds) the cluster: binds the cluster listener, opens
    /// the metadata group on `store` and installs its state into `broker`. The cluster forms
    /// once a majority of the seeds run; until then topology changes are refused.
    pub async fn start(
        config: ClusterConfig,
        store: Arc<Store>,
        broker: Arc<Broker>,
    ) -> Result<Arc<Cluster>, String> {
        let bind = listen_address(&config.listen)?;
        let stored = stored_identity(&config.dir)?;
        // A first start decides which seed it is from what every seed resolves to.
        let resolved = if stored.is_none() {
            resolve_seeds(&config.seeds, config.seed_resolve_timeout).await?
        } else {
            resolve_seeds_now(&config.seeds)
        };
        let placed = place_in_seeds(&config, bind, &resolved)?;
        let advertise = match (&config.advertise, &placed) {
            (Some(a), _) => a.clone(),
            (None, _) if !config.listen.is_unspecified() => config.listen.clone(),
            (None, Some(position)) => config.seeds[*position].clone(),
            (None, None) => {
                let host = address::host_name().ok_or_else(|| {
                    format!(
                        "--cluster-listen {} is every interface and this machine has no host \
                         name: set --cluster-advertise HOST:PORT, the address other nodes reach \
                         this one at",
                        config.listen
                    )
                })?;
                HostPort::named(&host, bind.port())?
            }
        };
        let identity = match stored {
            Some(identity) => identity,
            // A reset node is new to the cluster even where the seeds list it: its founding
            // id is taken (and forgotten), so it joins under a new one.
            None if config.dir.join(RESET_NODE).is_file() => {
                let others: Vec<HostPort> = config
                    .seeds
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| Some(*i) != placed)
                    .map(|(_, s)| s.clone())
                    .collect();
                let identity = store_identity(&config.dir, membership::joiner_identity(&others))?;
                let _ = std::fs::remove_file(config.dir.join(RESET_NODE));
                identity
            }
            None => store_identity(&config.dir, first_identity(&config.seeds, placed))?,
        };
        let tls = config
            .tls
            .clone()
            .map(link_tls::LinkTls::load)
            .transpose()?;
        let me = NodeInfo {
            id: identity.id,
            name: config.node_name.clone(),
            cluster: advertise.clone(),
            amqp: config.amqp,
            management: config.management,
            draining: config.draining,
        };
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| format!("cannot listen for cluster links on {bind}: {e}"))?;
        let (tx, rx) = std::sync::mpsc::channel::<Input>();
        let deliver_tx = Mutex::new(tx.clone());
        // Quorum queues' groups, once the loop runs (it needs the transport to send).
        let groups_slot: Arc<std::sync::OnceLock<QueueGroups>> = Arc::default();
        let (g1, g2, g3) = (
            groups_slot.clone(),
            groups_slot.clone(),
            groups_slot.clone(),
        );
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64);
        // The transport calls into the messaging layer, which sends through the transport.
        let messaging_slot: Arc<std::sync::OnceLock<Arc<Messaging>>> = Arc::default();
        let (m1, m2, m3) = (
            messaging_slot.clone(),
            messaging_slot.clone(),
            messaging_slot.clone(),
        );
        let transport = Transport::start_with_tls(
            me.clone(),
            boot,
            listener,
            transport::Callbacks {
                inbound: Arc::new(move |inbound| match inbound {
                    Inbound::Raft {
                        group, messages, ..
                    } if is_queue_group(group) => {
                        if let Some(groups) = g1.get() {
                            groups.send(groups::Input::Peer { group, messages });
                        }
                    }
                    Inbound::CatchUp { from, message } => {
                        if let Some(groups) = g1.get() {
                            groups.catch_up_received(from, message);
                        }
                    }
                    inbound => {
                        let _ = deliver_tx
                            .lock()
                            .expect("inputs lock")
                            .send(Input::Peer(inbound));
                    }
                }),
                data: Arc::new(move |from, payload| match m1.get() {
                    Some(m) => m.receive(from, payload),
                    // Nothing may be dropped silently (see Messaging::receive).
                    None => Err("this node does not serve other nodes yet".into()),
                }),
                link_up: Arc::new(move |peer, boot| {
                    if let Some(m) = m2.get() {
                        m.link_up(peer, boot);
                    }
                }),
                raft_link: Some(Arc::new(move |link| {
                    if let Some(groups) = g3.get() {
                        groups.send(groups::Input::RaftLink(link));
                    }
                })),
                link_broken: Arc::new(move |peer| {
                    if let Some(m) = m3.get() {
                        m.link_broken(peer);
                    }
                    // The node-level failure detector wakes the sleeping groups it concerns.
                    if let Some(groups) = g2.get() {
                        groups.send(groups::Input::PeerDown(peer));
                    }
                }),
            },
            tls,
        );
        check_advertised(&transport, &me, boot, bind).await?;
        let (queue_groups, groups_thread) = {
            let (t1, t2, t3) = (transport.clone(), transport.clone(), transport.clone());
            QueueGroups::start(
                me.id,
                store.clone(),
                &config.dir.join("groups"),
                groups::Links {
                    send: Arc::new(move |to, group, messages| t1.queue_raft(to, group, messages)),
                    flush: {
                        let t = transport.clone();
                        Arc::new(move || t.flush_queued())
                    },
                    send_catch_up: Arc::new(move |to, message| t3.send_catch_up(to, message)),
                    is_up: Arc::new(move |peer| t2.is_up(peer)),
                },
                groups::GroupsTiming::default(),
            )?
        };
        let _ = groups_slot.set(queue_groups.clone());
        let replicas = Arc::new(replicas::Replicas::new(queue_groups.clone()));
        let messaging = Arc::new(Messaging::new(transport.clone(), boot));
        let _ = messaging_slot.set(messaging.clone());
        {
            // Requests whose node never answers fail after CALL_TIMEOUT (checked each second).
            let messaging = messaging.clone();
            tokio::spawn(async move {
                let mut marks = std::collections::VecDeque::new();
                let mut every = tokio::time::interval(Duration::from_secs(1));
                loop {
                    every.tick().await;
                    marks.push_back(messaging.call_watermark());
                    if marks.len() as u64 > messaging::CALL_TIMEOUT.as_secs() {
                        let mark = marks.pop_front().expect("non-empty");
                        messaging.expire_calls(mark);
                    }
                }
            });
        }
        // A joiner's seeds are members to ask, whose ids it does not know.
        let founding = !identity.founders.is_empty();
        let seeds: BTreeMap<u64, HostPort> = identity
            .seeds
            .iter()
            .enumerate()
            .filter(|_| founding)
            .map(|(i, a)| (i as u64 + 1, a.clone()))
            .collect();
        let status = Arc::new(Mutex::new(GroupStatus::default()));
        let installs = Arc::new(tokio::sync::watch::channel(0u64).0);
        let applied = Arc::new(tokio::sync::watch::channel(0u64).0);
        let group = MetadataGroup::open(
            me.clone(),
            &identity.founders,
            &seeds,
            &config.dir,
            metadata::NodeParts {
                store,
                broker,
                transport: transport.clone(),
                status: status.clone(),
                installs: installs.clone(),
                applied: applied.clone(),
                replicas: replicas.clone(),
            },
            config.timing.clone(),
        )?;
        // The group dials new peers (a joined node, a member met in a snapshot): the
        // transport spawns their links on this runtime.
        let runtime = tokio::runtime::Handle::current();
        let thread = std::thread::Builder::new()
            .name("metadata-raft".into())
            .spawn(move || {
                let _runtime = runtime.enter();
                // A node whose metadata group died would serve a topology that no longer
                // changes: better to stop where an operator sees it.
                let run = std::panic::AssertUnwindSafe(move || group.run(rx));
                if std::panic::catch_unwind(run).is_err() {
                    tracing::error!("the metadata group failed; stopping the node");
                    std::process::abort();
                }
            })
            .map_err(|e| e.to_string())?;
        tracing::info!(
            node = %me.name,
            id = me.id,
            advertise = %me.cluster,
            listen = %bind,
            "cluster node started"
        );
        // The seeds of this start: the configured ones, or those of the first start.
        let current_seeds: Vec<HostPort> = if config.seeds.is_empty() {
            identity.seeds.clone()
        } else {
            config
                .seeds
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != placed)
                .map(|(_, s)| s.clone())
                .collect()
        };
        let cluster = Arc::new(Cluster {
            draining: std::sync::atomic::AtomicBool::new(me.draining),
            me,
            seeds,
            transport,
            inputs: Mutex::new(tx),
            status,
            thread: Mutex::new(Some(thread)),
            installs,
            applied,
            messaging,
            queue_groups,
            groups_thread: Mutex::new(Some(groups_thread)),
            replicas,
        });
        if !founding && !current_seeds.is_empty() {
            membership::spawn_auto_join(cluster.clone(), current_seeds.clone());
        }
        discovery::spawn(cluster.clone(), current_seeds);
        Ok(cluster)
    }

    pub fn node_name(&self) -> &str {
        &self.me.name
    }

    pub fn node_id(&self) -> u64 {
        self.me.id
    }

    /// Messages to and from other nodes.
    pub fn messaging(&self) -> &Arc<Messaging> {
        &self.messaging
    }

    /// The id of the member named `name` (`None`: no such member).
    pub fn member_id(&self, name: &str) -> Option<u64> {
        if name == self.me.name {
            return Some(self.me.id);
        }
        let status = self.status.lock().expect("status lock");
        status
            .members
            .values()
            .find(|m| m.name == name)
            .map(|m| m.id)
    }

    /// The name of member `id`, as the member table has it.
    pub fn member_name(&self, id: u64) -> Option<String> {
        if id == self.me.id {
            return Some(self.me.name.clone());
        }
        let status = self.status.lock().expect("status lock");
        status.members.get(&id).map(|m| m.name.clone())
    }

    /// The voters' names as the replicated member table holds them, once it names every voter,
    /// or after [`VOTER_NAMES_WAIT`] whichever voters it names by then. Just after the cluster
    /// formed, a voter's registration (its hello, replicated) may not be applied yet, and a
    /// quorum queue whose members name a node the table does not know never opens that
    /// replica: every node must find each member's id by its name when it applies the
    /// declare.
    pub async fn voter_names(&self) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + VOTER_NAMES_WAIT;
        loop {
            let (names, complete) = {
                let status = self.status.lock().expect("status lock");
                let names: Vec<String> = status
                    .voters
                    .iter()
                    .filter_map(|id| status.members.get(id).map(|m| m.name.clone()))
                    .collect();
                let complete = !status.voters.is_empty() && names.len() == status.voters.len();
                (names, complete)
            };
            if complete || tokio::time::Instant::now() >= deadline {
                return names;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Replicates `command` and returns this node's outcome of applying it, once a majority has
    /// it durably; refused when no majority answers in [`PROPOSE_TIMEOUT`].
    pub async fn execute(&self, command: Command) -> Result<Outcome, AmqpError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self
            .inputs
            .lock()
            .expect("inputs lock")
            .send(Input::Propose { command, reply });
        if sent.is_err() {
            return Err(AmqpError::new(
                INTERNAL_ERROR,
                "the cluster's metadata store has stopped",
            ));
        }
        match tokio::time::timeout(PROPOSE_TIMEOUT, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(AmqpError::new(
                INTERNAL_ERROR,
                "the cluster's metadata store has stopped",
            )),
            Err(_) => Err(AmqpError::new(
                INTERNAL_ERROR,
                format!(
                    "timed out after {} s waiting for a majority of the cluster's nodes: the \
                     change is not confirmed, and takes effect only if a majority already has it",
                    PROPOSE_TIMEOUT.as_secs()
                ),
            )),
        }
    }

    /// The cluster links' TLS, when the node has cluster certificates: for `/metrics` and
    /// certificate reloads.
    pub fn link_tls(&self) -> Option<&Arc<link_tls::LinkTls>> {
        self.transport.tls()
    }

    pub fn status(&self) -> ClusterStatus {
        let metadata = self.status.lock().expect("status lock").clone();
        let mut ids: Vec<u64> = metadata.members.keys().copied().collect();
        if metadata.voters.is_empty() && metadata.role.is_empty() {
            // Before the group's first status, the founders are the seeds; after, the voters
            // are (a forgotten seed is gone).
            ids.extend(self.seeds.keys());
        }
        ids.extend(metadata.voters.iter());
        ids.sort_unstable();
        ids.dedup();
        let members: Vec<MemberStatus> = ids
            .into_iter()
            .map(|id| {
                let info = if id == self.me.id {
                    Some(&self.me)
                } else {
                    metadata.members.get(&id)
                };
                MemberStatus {
                    id,
                    name: info
                        .map(|i| i.name.clone())
                        .unwrap_or_else(|| format!("node-{id}")),
                    cluster: info
                        .map(|i| i.cluster.clone())
                        .or_else(|| self.seeds.get(&id).cloned())
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    amqp: info.map(|i| i.amqp.to_string()),
                    management: info.and_then(|i| i.management.map(|a| a.to_string())),
                    running: self.transport.is_up(id),
                    voter: metadata.voters.contains(&id),
                    draining: if id == self.me.id {
                        self.is_draining()
                    } else {
                        info.is_some_and(|i| i.draining)
                    },
                }
            })
            .collect();
        ClusterStatus {
            node: self.me.name.clone(),
            id: self.me.id,
            metadata,
            links: membership::member_links(self.transport.links(), &members),
            members,
        }
    }

    /// The cluster protocol the member with this name speaks (0: not known yet; this node's
    /// own: [`frame::PROTOCOL`]): requests a peer's build does not know are not sent to it.
    pub fn member_protocol(&self, name: &str) -> u32 {
        if name == self.me.name {
            return frame::PROTOCOL;
        }
        self.member_id(name)
            .map_or(0, |id| self.transport.peer_protocol(id))
    }

    /// Whether the node with this name is up, as this node sees it (`None`: no such member).
    pub fn is_node_running(&self, name: &str) -> Option<bool> {
        if name == self.me.name {
            return Some(true);
        }
        let status = self.status.lock().expect("status lock");
        let id = status.members.values().find(|m| m.name == name)?.id;
        drop(status);
        Some(self.transport.is_up(id))
    }

    /// Changes each time a snapshot from the leader replaced this node's topology while it ran:
    /// connections made before hold vhosts that no longer exist, so they are closed.
    /// The index of the last metadata entry applied here: once an answer to a proposal has
    /// arrived, at least that proposal's.
    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Waits until this node has applied the metadata log up to `index` (true), or `timeout`
    /// passed (false): another node's request may follow a change this node has not applied.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        let mut applied = self.applied.subscribe();
        tokio::time::timeout(timeout, applied.wait_for(|a| *a >= index))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    pub fn snapshot_installs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.installs.subscribe()
    }

    /// Waits until the node has applied again what it knew committed when it stopped (from its
    /// own disk: no peer is needed for it), so its topology is back.
    pub async fn wait_replayed(&self) {
        loop {
            {
                let s = self.status.lock().expect("status lock");
                if s.applied >= s.replay_target {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the metadata group's and the queue groups' threads (the node is shutting down).
    pub fn stop(&self) {
        let _ = self.inputs.lock().expect("inputs lock").send(Input::Stop);
        if let Some(t) = self.thread.lock().expect("thread lock").take() {
            let _ = t.join();
        }
        self.queue_groups.send(groups::Input::Stop);
        if let Some(t) = self.groups_thread.lock().expect("thread lock").take() {
            let _ = t.join();
        }
    }

    /// Puts the node into maintenance mode or takes it out: the member table says so to every
    /// node (placement skips it), and the metadata group and every quorum queue group whose
    /// leader it is or becomes hand the leadership to another member that is up.
    pub fn set_draining(&self, draining: bool) {
        self.draining
            .store(draining, std::sync::atomic::Ordering::Relaxed);
        let _ = self
            .inputs
            .lock()
            .expect("inputs lock")
            .send(Input::SetDraining(draining));
        self.queue_groups.send(groups::Input::SetDraining(draining));
    }

    /// The node is stopping: every leadership it holds goes to another member now, so that
    /// clients see a handover rather than wait for an election, but the member table is not
    /// told (the node is not in maintenance mode when it comes back).
    pub fn hand_off_leaderships(&self) {
        let _ = self
            .inputs
            .lock()
            .expect("inputs lock")
            .send(Input::HandOff);
        self.queue_groups.send(groups::Input::SetDraining(true));
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this node leads the metadata group, and how many quorum queue groups it leads.
    pub fn leaderships(&self) -> (bool, usize) {
        let metadata = self.status.lock().expect("status lock").leader == self.me.id;
        (metadata, self.queue_groups.led())
    }

    /// The metadata group's leader, when this node knows one it can reach (itself, or a node
    /// whose link is up). Without one, this node can change nothing: its side of a partition
    /// is the minority, or the cluster has not formed; RabbitMQ's paused-minority nodes stop.
    pub fn reachable_metadata_leader(&self) -> Option<String> {
        let leader = self.status.lock().expect("status lock").leader;
        if leader == 0 || leader != self.me.id && !self.transport.is_up(leader) {
            return None;
        }
        self.member_name(leader)
            .or_else(|| Some(format!("node-{leader}")))
    }

    /// The node's quorum queue groups.
    pub fn queue_groups(&self) -> &QueueGroups {
        &self.queue_groups
    }

    /// How this node makes a quorum queue replica's state machine (the server's).
    pub fn set_replica_factory(&self, factory: replicas::MachineFactory) {
        self.replicas.set_factory(factory);
    }

    /// The current leader of the quorum queue whose log id is `queue_log_id`, by name, as this
    /// node (a member) sees it.
    pub fn queue_leader(&self, queue_log_id: u64) -> Option<String> {
        let view = self.queue_groups.view(replicas::group_id(queue_log_id))?;
        (view.leader != 0)
            .then(|| self.member_name(view.leader))
            .flatten()
    }
}

/// The node's identity as its cluster directory keeps it; `None` at its first start.
fn stored_identity(dir: &std::path::Path) -> Result<Option<Identity>, String> {
    let path = dir.join("node.json");
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// A first start's identity: the position in the seed list (so every founding node computes
/// the same ids and founding membership), or, not among them, a joiner's.
fn first_identity(seeds: &[HostPort], placed: Option<usize>) -> Identity {
    match placed {
        Some(position) => Identity {
            id: position as u64 + 1,
            founders: (1..=seeds.len() as u64).collect(),
            seeds: seeds.to_vec(),
        },
        None => membership::joiner_identity(seeds),
    }
}

fn store_identity(dir: &std::path::Path, identity: Identity) -> Result<Identity, String> {
    let path = dir.join("node.json");
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&identity).expect("identity serialises"),
    )
    .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
    .and_then(|_| std::fs::rename(&tmp, &path))
    .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(identity)
}

/// The address to bind the cluster listener to: the listen address, a name resolved to one of
/// this machine's addresses.
fn listen_address(listen: &HostPort) -> Result<SocketAddr, String> {
    let found = listen
        .resolve_blocking()
        .map_err(|e| format!("--cluster-listen: {e}"))?;
    found
        .iter()
        .copied()
        .find(|a| address::is_local_ip(a.ip()))
        .ok_or_else(|| {
            format!(
                "--cluster-listen {listen} resolves to {}, none of them an address of this \
                 machine: listen on one of its addresses (or 0.0.0.0) and give the name to \
                 --cluster-advertise",
                list(&found)
            )
        })
}

fn list(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every seed's addresses, waiting up to `timeout` for names that do not resolve yet; a seed
/// still unresolved then stops the start with its name.
async fn resolve_seeds(
    seeds: &[HostPort],
    timeout: Duration,
) -> Result<Vec<Vec<SocketAddr>>, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut out = Vec::with_capacity(seeds.len());
    for seed in seeds {
        let mut logged = false;
        loop {
            match seed.resolve().await {
                Ok(found) => {
                    out.push(found);
                    break;
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!(
                        "--cluster-seeds: {e}, after waiting {} s: a first start must know \
                         which seed is this node, so every seed must resolve (fix the name, or \
                         wait longer with --cluster-seed-resolve-timeout-s)",
                        timeout.as_secs()
                    ))
                }
                Err(e) => {
                    if !logged {
                        tracing::warn!("--cluster-seeds: {e}; waiting for it to resolve");
                        logged = true;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
    Ok(out)
}

/// Every seed's addresses as they resolve now (none for a seed that does not): at a restart
/// they only help find this node among them.
fn resolve_seeds_now(seeds: &[HostPort]) -> Vec<Vec<SocketAddr>> {
    seeds
        .iter()
        .map(|s| s.resolve_blocking().unwrap_or_default())
        .collect()
}

/// Which seed is this node, if any: the one written as its advertised (or listen) address, or
/// else the one that resolves to an address of this machine on the cluster port (on the
/// listen address itself when that is not every interface). Two candidates, or a seed that
/// resolves here while another address is advertised, stop the start: either would make this
/// node a member twice over, once under each address.
fn place_in_seeds(
    config: &ClusterConfig,
    bind: SocketAddr,
    resolved: &[Vec<SocketAddr>],
) -> Result<Option<usize>, String> {
    let here = |a: &SocketAddr| {
        a.port() == bind.port()
            && if bind.ip().is_unspecified() {
                address::is_local_ip(a.ip())
            } else {
                a.ip() == bind.ip()
            }
    };
    let resolving_here: Vec<usize> = resolved
        .iter()
        .enumerate()
        .filter(|(_, addrs)| addrs.iter().any(here))
        .map(|(i, _)| i)
        .collect();
    let named = config
        .advertise
        .as_ref()
        .or((!config.listen.is_unspecified()).then_some(&config.listen));
    let by_name = named.and_then(|n| config.seeds.iter().position(|s| s == n));
    if let (Some(p), Some(here)) = (by_name, resolving_here.first()) {
        if !resolving_here.contains(&p) {
            return Err(format!(
                "--cluster-advertise {} is not an address of this machine (it resolves to {}), \
                 but seed {} is (it resolves to {}): advertise {}",
                config.seeds[p],
                list(&resolved[p]),
                config.seeds[*here],
                list(&resolved[*here]),
                config.seeds[*here]
            ));
        }
    }
    let mut candidates: Vec<usize> = by_name.into_iter().chain(resolving_here).collect();
    candidates.sort_unstable();
    candidates.dedup();
    match (candidates.as_slice(), by_name, &config.advertise) {
        ([], _, _) => Ok(None),
        ([one], Some(_), _) | ([one], None, None) => Ok(Some(*one)),
        ([one], None, Some(advertise)) => Err(format!(
            "seed {} is this node (it resolves to {}), but --cluster-advertise is {advertise}: \
             list this node in --cluster-seeds as {advertise}, or advertise {}",
            config.seeds[*one],
            list(&resolved[*one]),
            config.seeds[*one]
        )),
        (many, _, _) => Err(format!(
            "seeds {} are all this node (by name or by what they resolve to): list each node \
             once in --cluster-seeds, or the cluster would count this node twice",
            many.iter()
                .map(|i| config.seeds[*i].to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Refuses to start a node whose advertised address would send its peers elsewhere: it must
/// be one of this machine's addresses, or (behind NAT) reach this very node.
async fn check_advertised(
    transport: &Transport,
    me: &NodeInfo,
    boot: u64,
    bind: SocketAddr,
) -> Result<(), String> {
    let advertise = &me.cluster;
    let found = advertise
        .resolve()
        .await
        .map_err(|e| format!("--cluster-advertise: {e}"))?;
    if found
        .iter()
        .any(|a| address::is_local_ip(a.ip()) && (a.port() == bind.port()))
    {
        return Ok(());
    }
    match transport.identify(advertise).await {
        Ok(hello) if hello.info.id == me.id && hello.boot == boot => Ok(()),
        Ok(hello) => Err(format!(
            "--cluster-advertise {advertise} reaches another node, {} (id {}): each node \
             advertises an address of its own",
            hello.info.name, hello.info.id
        )),
        Err(e) => Err(format!(
            "--cluster-advertise {advertise} resolves to {}, which is not an address of this \
             machine on port {}, and it does not reach this node ({e}): advertise the address \
             other nodes reach this one at",
            list(&found),
            bind.port()
        )),
    }
}
