//! The metadata group: one Raft group over every node, whose log is the cluster's topology
//! commands (users, vhosts, permissions, exchanges, queues, bindings) and its member table.
//! Every node applies the committed commands to its own broker in log order, so every node
//! routes with the same topology; a command is acknowledged to the client once a majority has
//! it durably and the client's node has applied it (so the client reads its own write there).
//!
//! The group runs on one thread of its own: it steps raft-rs's `RawNode` with what peers sent,
//! ticks it, and handles each ready in the order raft-rs asks: send the leader's messages,
//! install a snapshot, apply committed entries, append new entries and the hard state to the
//! WAL, sync once, send the messages that had to wait for the sync, advance.

use crate::applied_requests::{self, AppliedRequests};
use crate::frame::NodeInfo;
use crate::inputs::take_inputs;
use crate::membership::{self, Membership, MembershipError, MEMBERSHIP_GROUP};
use crate::raft_log::RaftLog;
use crate::replicas::{group_id, QueueReplica, Replicas};
use crate::transport::{Inbound, Transport};
use raft::eraftpb::{EntryType, Message, Snapshot};
use raft::{RawNode, StateRole};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warren_broker::broker::Broker;
use warren_broker::command::{Command, Outcome};
use warren_broker::error::AmqpError;
use warren_broker::persistence::StoreOp;
use warren_protocol::constants::INTERNAL_ERROR;
use warren_store::Store;

/// The metadata group's log in the storage engine. Queue logs have odd ids, so no queue ever
/// takes it.
pub const METADATA_LOG_ID: u64 = 2;
/// The group id on the wire.
pub const METADATA_GROUP: u64 = 0;

/// Timing of the metadata group.
#[derive(Debug, Clone)]
pub struct Timing {
    pub tick: Duration,
    /// Ticks without a leader before a follower stands for election (randomised up to twice).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// Applied entries between snapshots.
    pub snapshot_entries: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            snapshot_entries: 8192,
        }
    }
}

/// One entry of the metadata log.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LogEntry {
    /// The node that proposed it, and its request id there: that node answers its client when
    /// it applies the entry.
    origin: u64,
    request: u64,
    /// The lowest request its node still waited for (see `applied_requests`); 0 in entries
    /// written before copies were told apart, which are applied as they come.
    #[serde(default)]
    floor: u64,
    op: Op,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Broker {
        command: Command,
    },
    /// A node says who it is and where to reach it (after it started, or when that changed).
    Node {
        info: NodeInfo,
    },
}

/// The state machine's snapshot: the topology as commands, the member table, and the ids of
/// forgotten nodes (so that one restarted with its old data is not taken back silently).
#[derive(Serialize, Deserialize)]
struct SnapshotData {
    commands: Vec<Command>,
    members: Vec<NodeInfo>,
    #[serde(default)]
    forgotten: Vec<u64>,
    #[serde(default)]
    applied_requests: AppliedRequests,
}

/// How soon a registration that did not commit (its proposal lost in an election) is
/// proposed again.
const REGISTER_RETRY: Duration = Duration::from_millis(500);

/// The exit status of a node that finds its name taken by another member (EX_CONFIG).
pub const DUPLICATE_NAME_EXIT: i32 = 78;

/// The exit status of a node whose metadata log is shorter than what it acknowledged.
pub const LOG_LOST_EXIT: i32 = 76;

/// What the group reports for the management API, `warren ctl` and metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupStatus {
    pub role: String,
    pub leader: u64,
    pub term: u64,
    pub commit: u64,
    pub applied: u64,
    /// The commit index this node had durably when it started: the topology it had is back
    /// once `applied` reaches it.
    pub replay_target: u64,
    pub voters: Vec<u64>,
    /// Every node the cluster knows, by id.
    pub members: BTreeMap<u64, NodeInfo>,
    /// Why the cluster last refused this node's join request (for `join_cluster`).
    #[serde(skip)]
    pub join_refusal: Option<membership::JoinRefusal>,
}

pub type Reply = tokio::sync::oneshot::Sender<Result<Outcome, AmqpError>>;

/// A proposal of this node's, applied, with what it is answered.
type Answer = (Waiting, Result<Outcome, AmqpError>);

/// A proposal waiting to be applied on its node.
struct Waiting {
    command: Command,
    reply: Reply,
    tried: Instant,
}

/// A proposal not applied this long after it was made is made again: it may have gone to a
/// leader that died, or found no leader. Should both copies commit, only the first is applied
/// (`applied_requests`).
const PROPOSAL_RETRY: Duration = Duration::from_millis(500);

/// What the group's thread is asked to do.
pub enum Input {
    Peer(Inbound),
    Propose {
        command: Command,
        reply: Reply,
    },
    /// `forget_cluster_node`: remove a stopped member from the group.
    Forget {
        name: String,
        reply: tokio::sync::oneshot::Sender<Result<(), MembershipError>>,
    },
    /// `reset`: this node leaves the cluster.
    Leave {
        reply: tokio::sync::oneshot::Sender<Result<(), MembershipError>>,
    },
    /// Maintenance mode on or off: the member table is told (this node registers again with
    /// it), and while on, this node hands the group's leadership to another.
    SetDraining(bool),
    /// The node is stopping (SIGTERM): it hands the leadership on as a draining node does,
    /// without telling the member table (it is not in maintenance once it is back).
    HandOff,
    Stop,
}

/// What the group shares with the rest of its node.
pub struct NodeParts {
    pub store: Arc<Store>,
    pub broker: Arc<Broker>,
    pub transport: Transport,
    pub status: Arc<Mutex<GroupStatus>>,
    /// Counts snapshots installed while running: each replaced the broker's vhosts.
    pub installs: Arc<tokio::sync::watch::Sender<u64>>,
    /// The index of the last entry applied, for requests that must follow a change.
    pub applied: Arc<tokio::sync::watch::Sender<u64>>,
    /// Quorum queue replicas this node opens and closes as it applies declares and deletes.
    pub replicas: Arc<Replicas>,
}

pub struct MetadataGroup {
    pub me: NodeInfo,
    pub(crate) raw: RawNode<RaftLog>,
    pub(crate) transport: Transport,
    broker: Arc<Broker>,
    store: Arc<Store>,
    pub(crate) timing: Timing,
    /// Proposals of this node not yet applied here, by request id.
    waiting: HashMap<u64, Waiting>,
    pub(crate) next_request: u64,
    pub(crate) status: Arc<Mutex<GroupStatus>>,
    installs: Arc<tokio::sync::watch::Sender<u64>>,
    applied_watch: Arc<tokio::sync::watch::Sender<u64>>,
    replicas: Arc<Replicas>,
    pub(crate) members: BTreeMap<u64, NodeInfo>,
    /// Joins and forgets in flight, forgotten ids (see `membership`).
    pub(crate) membership: Membership,
    pub(crate) applied_requests: AppliedRequests,
    applied: u64,
    snapshot_index: u64,
    registering: Option<Instant>,
    /// Stopping: hand the leadership on ([`Input::HandOff`]).
    handing_off: bool,
    /// `warren ctl force_boot` asked for this start (see `force_boot`).
    pub(crate) force_boot: Option<crate::force_boot::ForceBoot>,
    /// The last entry this node knew committed when it started.
    replay_target: u64,
}

fn no_majority(why: &str) -> AmqpError {
    AmqpError::new(
        INTERNAL_ERROR,
        format!("{why}: topology changes need a majority of the cluster's nodes"),
    )
}

impl MetadataGroup {
    /// Opens the group on this node's store: installs its snapshot into `broker`, then raft-rs
    /// replays the committed entries after it as the first readies.
    pub fn open(
        me: NodeInfo,
        founders: &[u64],
        seeds: &BTreeMap<u64, crate::address::HostPort>,
        dir: &std::path::Path,
        node: NodeParts,
        timing: Timing,
    ) -> Result<MetadataGroup, String> {
        let NodeParts {
            store,
            broker,
            transport,
            status,
            installs,
            applied: applied_watch,
            replicas,
        } = node;
        let log = RaftLog::open(store.clone(), METADATA_LOG_ID, dir, founders)?;
        let snapshot = log.latest_snapshot();
        let snapshot_index = snapshot.get_metadata().index;
        let mut installed = Installed::default();
        if snapshot_index > 0 {
            installed = install(&broker, &snapshot)?;
        }
        let Installed {
            members,
            forgotten,
            applied_requests,
        } = installed;
        let next_request =
            applied_requests::first_request_id().max(applied_requests.highest(me.id) + 1);
        let config = raft::Config {
            id: me.id,
            election_tick: timing.election_ticks,
            heartbeat_tick: timing.heartbeat_ticks,
            applied: snapshot_index,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        config.validate().map_err(|e| e.to_string())?;
        let replay_target = store
            .hard_state(METADATA_LOG_ID)
            .map_or(0, |hs| hs.commit)
            .max(snapshot_index);
        status.lock().expect("status lock").replay_target = replay_target;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&config, log, &logger).map_err(|e| e.to_string())?;
        for &id in &forgotten {
            transport.forget(id);
        }
        for (id, addr) in seeds {
            transport.connect(*id, addr.clone());
        }
        for info in members.values() {
            transport.connect(info.id, info.cluster.clone());
        }
        let group = MetadataGroup {
            me,
            raw,
            transport,
            broker,
            store,
            timing,
            waiting: HashMap::new(),
            next_request,
            status,
            installs,
            applied_watch,
            replicas,
            members,
            membership: Membership::new(forgotten),
            applied_requests,
            applied: snapshot_index,
            snapshot_index,
            registering: None,
            handing_off: false,
            force_boot: crate::force_boot::ForceBoot::asked(dir),
            replay_target,
        };
        if snapshot_index > 0 {
            group.open_all_replicas();
        }
        Ok(group)
    }

    /// The group's loop: runs until [`Input::Stop`] or until every sender is gone.
    pub fn run(mut self, inputs: Receiver<Input>) {
        let mut next_tick = Instant::now() + self.timing.tick;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let stop = |i: &Input| matches!(i, Input::Stop);
            if !take_inputs(&inputs, wait, stop, |i| self.handle(i)) {
                return;
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.timing.tick;
                self.raw.tick();
                self.force_boot_step(self.applied >= self.replay_target);
                self.stand_first_if_founding();
                self.register_if_needed();
                self.hand_off_if_draining();
                self.retry_proposals();
                self.retry_membership_changes();
            }
            if let Err(e) = self.on_ready() {
                tracing::error!(error = %e, "metadata group stopped: its log cannot be written");
                for (_, w) in self.waiting.drain() {
                    let _ = w.reply.send(Err(no_majority("the node's storage failed")));
                }
                return;
            }
            self.publish_status();
        }
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::Peer(Inbound::Raft {
                group, messages, ..
            }) if group == METADATA_GROUP => {
                for m in messages {
                    self.refuse_if_log_lost(&m);
                    let _ = self.raw.step(m);
                }
            }
            Input::Peer(Inbound::Raft {
                group, messages, ..
            }) if group == MEMBERSHIP_GROUP => self.on_membership_messages(messages),
            Input::Peer(Inbound::Raft { .. } | Inbound::CatchUp { .. }) => {}
            Input::Forget { name, reply } => self.forget(&name, reply),
            Input::Leave { reply } => self.leave(reply),
            Input::SetDraining(draining) => {
                self.me.draining = draining;
                // Registered again at once, not after a retry interval.
                self.registering = None;
                self.register_if_needed();
                self.hand_off_if_draining();
            }
            Input::HandOff => {
                self.handing_off = true;
                self.hand_off_if_draining();
            }
            Input::Peer(Inbound::Hello(info)) => {
                tracing::debug!(peer = info.id, name = %info.name, "cluster peer said hello");
            }
            Input::Propose { command, reply } => {
                // Cut off from a majority: refused before it enters the log, so it can never
                // take effect later (once in the log, a proposal's fate is the majority's).
                let voters = self.raw.raft.prs().conf().voters().ids();
                if voters.is_empty() {
                    let _ = reply.send(Err(AmqpError::new(
                        INTERNAL_ERROR,
                        "this node is not a member of a cluster yet: topology changes wait until \
                         it joins one (warren ctl join_cluster)",
                    )));
                    return;
                }
                let reachable = voters.iter().filter(|v| self.transport.is_up(*v)).count();
                if reachable * 2 <= voters.len() {
                    let _ = reply.send(Err(no_majority(&format!(
                        "this node reaches {reachable} of the cluster's {} nodes",
                        voters.len()
                    ))));
                    return;
                }
                let request = self.next_request;
                self.next_request += 1;
                let floor = self.floor().min(request);
                self.propose(
                    request,
                    floor,
                    Op::Broker {
                        command: command.clone(),
                    },
                );
                self.waiting.insert(
                    request,
                    Waiting {
                        command,
                        reply,
                        tried: Instant::now(),
                    },
                );
            }
            Input::Stop => {}
        }
    }

    /// Proposes an entry; with no leader known it is dropped, and retried later if it waits.
    fn propose(&mut self, request: u64, floor: u64, op: Op) {
        let entry = LogEntry {
            origin: self.me.id,
            request,
            floor,
            op,
        };
        let data = serde_json::to_vec(&entry).expect("log entries serialise");
        let _ = self.raw.propose(vec![], data);
    }

    /// Proposes again what waited too long; forgets what nobody waits for any more.
    fn retry_proposals(&mut self) {
        self.waiting.retain(|_, w| !w.reply.is_closed());
        let due: Vec<(u64, Command)> = self
            .waiting
            .iter_mut()
            .filter(|(_, w)| w.tried.elapsed() >= PROPOSAL_RETRY)
            .map(|(request, w)| {
                w.tried = Instant::now();
                (*request, w.command.clone())
            })
            .collect();
        let floor = self.floor();
        for (request, command) in due {
            self.propose(request, floor, Op::Broker { command });
        }
    }

    /// The lowest request this node waits for: below it, every copy is stale.
    fn floor(&self) -> u64 {
        self.waiting
            .keys()
            .min()
            .copied()
            .unwrap_or(self.next_request)
    }

    /// On a cluster that never had a leader, the first founder stands for election as soon as
    /// it reaches a majority of the founders, instead of waiting out an election timeout
    /// (1-2 s) as every node does after a leader is lost: a fresh cluster forms in a tick.
    /// Only one node does so, so there is no split vote; standing early is safe in Raft at
    /// any time, and term 0 means nobody of this group has stood or led yet.
    fn stand_first_if_founding(&mut self) {
        let raft = &self.raw.raft;
        if raft.term != 0 || raft.leader_id != raft::INVALID_ID {
            return;
        }
        let voters: Vec<u64> = raft.prs().conf().voters().ids().iter().collect();
        if voters.iter().min() != Some(&self.me.id) {
            return;
        }
        let up = voters
            .iter()
            .filter(|id| self.transport.is_up(**id))
            .count();
        if up > voters.len() / 2 {
            let _ = self.raw.campaign();
        }
    }

    /// A leader only says entries are committed that it knows this node has: a heartbeat
    /// committing past the end of this node's log means the node lost what it had acknowledged
    /// (its data directory was deleted or replaced while the cluster kept its id). raft-rs
    /// would panic on it; the node stops with what to do instead.
    fn refuse_if_log_lost(&self, m: &Message) {
        let last = self.raw.raft.raft_log.last_index();
        if m.get_msg_type() != raft::eraftpb::MessageType::MsgHeartbeat || m.commit <= last {
            return;
        }
        tracing::error!(
            "the cluster's leader (id {}) knows this node ({}, id {}) to hold the metadata log up \
             to entry {}, but its log ends at {last}: this node's data directory was lost or \
             replaced. It stops rather than serve a topology it no longer has. Restore the data \
             directory, or on a member forget this node (warren ctl forget_cluster_node {}) and \
             add it again as a new node under another name.",
            m.from,
            self.me.name,
            self.me.id,
            m.commit,
            self.me.name
        );
        std::process::exit(LOG_LOST_EXIT);
    }

    /// Once a leader is known, makes sure the member table says who this node is. Soon: a
    /// quorum queue declared meanwhile waits for the table to name every voter.
    fn register_if_needed(&mut self) {
        if self.raw.raft.leader_id == raft::INVALID_ID {
            return;
        }
        if self.members.get(&self.me.id) == Some(&self.me) {
            return;
        }
        if let Some(other) = self
            .members
            .values()
            .find(|m| m.name == self.me.name && m.id != self.me.id)
        {
            // Two members under one name would be told apart by nobody: clients, `ctl`,
            // queues' member lists all go by name. The member that had it first keeps it.
            tracing::error!(
                "another member of the cluster is named {} (id {}, at {}); this node (id {}) \
                 stops: give each node its own --node-name, or forget the old member first \
                 (warren ctl forget_cluster_node) if this node replaces it",
                other.name,
                other.id,
                other.cluster,
                self.me.id
            );
            std::process::exit(DUPLICATE_NAME_EXIT);
        }
        if self
            .registering
            .is_some_and(|t| t.elapsed() < REGISTER_RETRY)
        {
            return;
        }
        self.registering = Some(Instant::now());
        let request = self.next_request;
        self.next_request += 1;
        // Registering twice does no harm: its entry is applied as often as it commits.
        self.propose(
            request,
            0,
            Op::Node {
                info: self.me.clone(),
            },
        );
    }

    /// In maintenance mode, a leader hands the leadership to a voter that is up, one not in
    /// maintenance itself if there is one, as RabbitMQ's drain transfers its metadata store's
    /// leadership. Once the member table says this node drains: a new leader must not take
    /// it for a node that serves.
    fn hand_off_if_draining(&mut self) {
        let raft = &self.raw.raft;
        let draining = self.me.draining && self.members.get(&self.me.id) == Some(&self.me);
        if !(draining || self.handing_off)
            || raft.state != StateRole::Leader
            || raft.lead_transferee.is_some()
        {
            return;
        }
        let to = raft
            .prs()
            .conf()
            .voters()
            .ids()
            .iter()
            .filter(|v| *v != self.me.id && self.transport.is_up(*v))
            .max_by_key(|v| {
                let serving = !self.members.get(v).is_some_and(|m| m.draining);
                (serving, raft.prs().get(*v).map_or(0, |p| p.matched))
            });
        if let Some(to) = to {
            tracing::info!(to, "maintenance mode: handing the metadata leadership on");
            self.raw.transfer_leader(to);
        }
    }

    fn send(&mut self, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        let mut by_peer: BTreeMap<u64, Vec<Message>> = BTreeMap::new();
        for m in messages {
            by_peer.entry(m.to).or_default().push(m);
        }
        for (to, batch) in by_peer {
            if !self.transport.send_raft(to, METADATA_GROUP, &batch) {
                // The leader then probes the peer instead of streaming entries into the void.
                self.raw.report_unreachable(to);
            }
        }
    }

    fn on_ready(&mut self) -> Result<(), String> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        self.send(rd.take_messages());
        if !rd.snapshot().is_empty() {
            let snapshot = rd.snapshot().clone();
            let installed = install(&self.broker, &snapshot)?;
            self.members = installed.members;
            for &id in &installed.forgotten {
                self.transport.forget(id);
            }
            self.membership.forgotten = installed.forgotten.into_iter().collect();
            self.applied_requests = installed.applied_requests;
            self.raw.mut_store().save_snapshot(&snapshot)?;
            self.applied = snapshot.get_metadata().index;
            self.applied_watch.send_replace(self.applied);
            self.snapshot_index = self.applied;
            for info in self.members.values() {
                self.transport.connect(info.id, info.cluster.clone());
            }
            tracing::info!(index = self.applied, "metadata snapshot installed");
            let held = self.open_all_replicas();
            self.replicas.retain(held);
            self.installs.send_modify(|n| *n += 1);
        }
        self.apply(rd.take_committed_entries())?;
        let wrote = !rd.entries().is_empty() || rd.hs().is_some();
        self.raw.store().append(rd.entries())?;
        if let Some(hs) = rd.hs() {
            self.raw.store().set_hard_state(hs)?;
        }
        if wrote {
            self.raw.store().sync()?;
        }
        self.send(rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.raw.store().set_commit(commit)?;
        }
        self.send(light.take_messages());
        self.apply(light.take_committed_entries())?;
        self.raw.advance_apply();
        self.maybe_snapshot()?;
        Ok(())
    }

    fn apply(&mut self, entries: Vec<raft::eraftpb::Entry>) -> Result<(), String> {
        for entry in entries {
            self.applied = entry.index;
            let reply = self.apply_one(&entry)?;
            // Published once the entry took effect, and before the reply: whoever waits for
            // the index (a client's node asking whether the queue's node has a policy change
            // yet, `Request::Applied`) or is answered finds the change in place.
            self.applied_watch.send_replace(entry.index);
            if let Some((w, outcome)) = reply {
                let _ = w.reply.send(outcome);
            }
        }
        Ok(())
    }

    /// Applies one committed entry; the proposal of this node it answers, if any.
    fn apply_one(&mut self, entry: &raft::eraftpb::Entry) -> Result<Option<Answer>, String> {
        if entry.data.is_empty() {
            // A new leader's empty entry.
            return Ok(None);
        }
        match entry.get_entry_type() {
            EntryType::EntryNormal => {
                let e: LogEntry = match serde_json::from_slice(&entry.data) {
                    Ok(e) => e,
                    Err(err) => {
                        tracing::error!(index = entry.index, error = %err, "unreadable metadata entry skipped");
                        return Ok(None);
                    }
                };
                let outcome = match e.op {
                    Op::Broker { .. }
                        if e.floor > 0
                            && !self.applied_requests.admit(e.origin, e.request, e.floor) =>
                    {
                        tracing::debug!(
                            origin = e.origin,
                            request = e.request,
                            "a second copy of a topology command skipped"
                        );
                        return Ok(None);
                    }
                    Op::Broker { command } => self.execute(&command),
                    Op::Node { info } => {
                        if let Some(holder) = self
                            .members
                            .values()
                            .find(|m| m.name == info.name && m.id != info.id)
                        {
                            // Every node applies the log in one order, so all keep the name
                            // with the member that registered it first.
                            tracing::error!(
                                name = %info.name,
                                id = info.id,
                                holder = holder.id,
                                "a second node registered under a member's name; ignored"
                            );
                        } else {
                            self.transport.connect(info.id, info.cluster.clone());
                            self.members.insert(info.id, info);
                        }
                        Ok(Outcome::Done)
                    }
                };
                if e.origin == self.me.id {
                    if let Some(w) = self.waiting.remove(&e.request) {
                        return Ok(Some((w, outcome)));
                    }
                }
            }
            EntryType::EntryConfChange => self.apply_conf_change(entry)?,
            EntryType::EntryConfChangeV2 => {}
        }
        Ok(None)
    }

    /// Applies one command to this node's broker, and carries out the storage work it asks of
    /// this node (deleting a deleted queue's log). What it would journal is already in the
    /// Raft log.
    fn execute(&self, command: &Command) -> Result<Outcome, AmqpError> {
        // A queue's members before the command: what this node opens or closes depends on
        // whether it is among them before and after.
        let members_before = match command {
            Command::QueueMembers { vhost, name, .. } => self
                .broker
                .vhost(vhost)
                .and_then(|v| v.lock().expect("vhost lock").replicated_queue(name)),
            _ => None,
        };
        let outcome = self.broker.execute(command);
        let vhost = command.vhost();
        let mut replica = None;
        let mut new_voters = None;
        if let Some(v) = vhost.and_then(|v| self.broker.vhost(v)) {
            let mut v = v.lock().expect("vhost lock");
            v.take_meta();
            // Whatever a replicated command deletes, it deletes on every node already.
            v.take_self_deleted();
            if let (Command::QueueDeclare { name, .. }, Ok(_)) = (command, &outcome) {
                replica = self.replica(&v, name);
            }
            if let (Command::QueueMembers { name, .. }, Ok(_)) = (command, &outcome) {
                if let Some((opened, group, voters)) =
                    self.members_changed(&v, name, members_before.as_ref())
                {
                    replica = opened;
                    new_voters = Some((group, voters));
                }
            }
            for op in v.take_store_ops() {
                let r = match op {
                    StoreOp::DeleteLog { log } => {
                        self.replicas.close(log);
                        self.store.delete_log(log)
                    }
                    StoreOp::Release { log, index } => self.store.release(log, index),
                    StoreOp::ReleasePrefix { log, index } => {
                        self.store
                            .release_prefix(log, index, 0, bytes::Bytes::new())
                    }
                    StoreOp::Append { .. } => Ok(()),
                };
                if let Err(e) = r {
                    tracing::warn!(error = %e, "storage work of a metadata command failed");
                }
            }
        } else {
            self.broker.discard_meta();
        }
        if let Some(r) = replica {
            self.replicas.open(r);
        }
        if let Some((group, voters)) = new_voters {
            self.replicas.set_voters(group, voters);
        }
        outcome
    }

    /// This node's replica of quorum queue `name`, if it is one of its members. Opened once
    /// the vhost is unlocked: making the replica's state machine reads the queue's settings.
    fn replica(&self, v: &warren_broker::vhost::VHost, name: &str) -> Option<QueueReplica> {
        let (log_id, members) = v.replicated_queue(name)?;
        if !members.iter().any(|m| **m == *self.me.name) {
            return None;
        }
        let voters: Option<Vec<u64>> = members
            .iter()
            .map(|m| self.members.values().find(|i| *i.name == **m).map(|i| i.id))
            .collect();
        let Some(voters) = voters else {
            tracing::error!(queue = name, members = ?members, "a quorum queue names a node the cluster does not know: its replica stays closed");
            return None;
        };
        Some(QueueReplica {
            group: group_id(log_id),
            vhost: v.name.clone(),
            queue: name.to_string(),
            voters,
        })
    }

    /// A quorum queue's members changed: a node that left closes and deletes its replica here;
    /// for a member, the replica to open (one that just joined: empty, to be caught up by the
    /// leader) and the voters its group is to have (its leader proposes the change to Raft),
    /// both done once the vhost is unlocked.
    fn members_changed(
        &self,
        v: &warren_broker::vhost::VHost,
        name: &str,
        before: Option<&(u64, Vec<std::sync::Arc<str>>)>,
    ) -> Option<(Option<QueueReplica>, u64, Vec<u64>)> {
        let (log_id, members) = v.replicated_queue(name)?;
        let me = &*self.me.name;
        let was_member = before.is_some_and(|(_, m)| m.iter().any(|n| &**n == me));
        let is_member = members.iter().any(|n| &**n == me);
        if was_member && !is_member {
            let voters: Vec<u64> = members
                .iter()
                .filter_map(|m| self.members.values().find(|i| *i.name == **m).map(|i| i.id))
                .collect();
            self.replicas.leave(group_id(log_id));
            return Some((None, group_id(log_id), voters));
        }
        let replica = self.replica(v, name)?;
        let voters = replica.voters.clone();
        Some(((!was_member).then_some(replica), group_id(log_id), voters))
    }

    /// After a snapshot replaced the topology: the replicas of every quorum queue in it
    /// (opening one that is open already does nothing). Returns their groups.
    fn open_all_replicas(&self) -> std::collections::HashSet<u64> {
        let mut open = Vec::new();
        for (_, v) in self.broker.vhosts() {
            let v = v.lock().expect("vhost lock");
            for (name, _, _) in v.replicated_queues() {
                open.extend(self.replica(&v, &name));
            }
        }
        let mut groups = std::collections::HashSet::new();
        for r in open {
            let (group, voters) = (r.group, r.voters.clone());
            groups.insert(group);
            self.replicas.open(r);
            // A members change the snapshot holds is carried on by the group's leader.
            self.replicas.set_voters(group, voters);
        }
        groups
    }

    fn maybe_snapshot(&mut self) -> Result<(), String> {
        let due = std::mem::take(&mut self.membership.snapshot_due);
        if !due && self.applied < self.snapshot_index + self.timing.snapshot_entries {
            return Ok(());
        }
        let index = self.applied;
        let term = self.raw.store().term_of(index)?;
        let data = SnapshotData {
            commands: self.broker.export_commands(),
            members: self.members.values().cloned().collect(),
            forgotten: self.membership.forgotten.iter().copied().collect(),
            applied_requests: self.applied_requests.clone(),
        };
        let mut snapshot = Snapshot {
            data: serde_json::to_vec(&data)
                .expect("snapshots serialise")
                .into(),
            ..Default::default()
        };
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.raw.raft.prs().conf().to_conf_state());
        self.raw.mut_store().save_snapshot(&snapshot)?;
        self.snapshot_index = index;
        tracing::info!(
            index,
            bytes = snapshot.data.len(),
            "metadata snapshot taken"
        );
        Ok(())
    }

    fn publish_status(&self) {
        let mut s = self.status.lock().expect("status lock");
        s.role = match self.raw.raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        }
        .to_string();
        s.leader = self.raw.raft.leader_id;
        s.term = self.raw.raft.term;
        s.commit = self.raw.raft.raft_log.committed;
        s.applied = self.applied;
        s.voters = self.raw.raft.prs().conf().voters().ids().iter().collect();
        s.voters.sort_unstable();
        if s.members != self.members {
            let draining = |members: &BTreeMap<u64, NodeInfo>| -> Vec<u64> {
                members
                    .values()
                    .filter(|m| m.draining && m.id != self.me.id)
                    .map(|m| m.id)
                    .collect()
            };
            if draining(&s.members) != draining(&self.members) {
                self.replicas
                    .set_peers_draining(draining(&self.members).into_iter().collect());
            }
            s.members = self.members.clone();
        }
    }
}

/// What a snapshot holds besides the topology.
#[derive(Default)]
struct Installed {
    members: BTreeMap<u64, NodeInfo>,
    forgotten: Vec<u64>,
    applied_requests: AppliedRequests,
}

/// Replaces the broker's topology with a snapshot's; returns the rest of it.
fn install(broker: &Broker, snapshot: &Snapshot) -> Result<Installed, String> {
    let data: SnapshotData =
        serde_json::from_slice(&snapshot.data).map_err(|e| format!("bad snapshot: {e}"))?;
    broker.clear_topology();
    for c in &data.commands {
        if let Err(e) = broker.execute(c) {
            tracing::warn!(error = %e.text, "snapshot command did not apply");
        }
    }
    broker.discard_meta();
    Ok(Installed {
        members: data.members.into_iter().map(|m| (m.id, m)).collect(),
        forgotten: data.forgotten,
        applied_requests: data.applied_requests,
    })
}
