//! Adding nodes to a running cluster and removing stopped ones: rabbitmqctl's `join_cluster`
//! and `forget_cluster_node`, as Raft configuration changes of the metadata group.
//!
//! **Joining.** A node that is not a founding seed takes a random Raft id at its first start
//! (ids 1..=N are the founders' positions; a joiner cannot learn a free small id before it can
//! talk Raft, and the transport names a node by its id from its first hello), kept in
//! `node.json`. Its group starts with an empty configuration, so it never stands for election
//! on its own. It asks a member over a one-shot connection (hello, then a [`MEMBERSHIP_GROUP`]
//! frame carrying a [`Request::Join`]); a member that is not the leader forwards the request to
//! it. The leader checks it ([`check_join`]) and proposes `AddNode` with the joiner's
//! [`NodeInfo`] in the change's context, so every node learns where to reach it when it applies
//! the change. Every node takes a snapshot right after applying an `AddNode`: the joiner's log
//! is empty, so the leader must send it a snapshot (one that already names it as a voter, or
//! raft-rs refuses it), never the log from index 1 (whose founding membership is implicit).
//! The joiner is a member once a snapshot naming it is installed; refusals come back as
//! [`Request::Refused`], and a joiner asks again every [`JOIN_RETRY`] until then.
//!
//! **Forgetting.** `forget_cluster_node` on a live member proposes `RemoveNode` for a stopped
//! member; it commits under the old configuration (so it needs a majority of it), and from then
//! on a majority is counted over the remaining voters. The id is remembered as forgotten: the
//! old node restarted with its data is not taken back (as in RabbitMQ, it must be reset first),
//! and the transport never dials it again.

use crate::address::HostPort;
use crate::frame::{self, NodeInfo};
use crate::metadata::MetadataGroup;
use crate::{Cluster, Identity};
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType, Entry, Message};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The group id of membership requests on the wire: even, so no queue's log id (those are
/// odd), and far from the metadata group's 0.
pub const MEMBERSHIP_GROUP: u64 = u64::MAX - 1;
/// How long `join_cluster` waits to be a member before it gives up: under the management
/// API's client timeout (10 s), so `warren ctl` reports our error, not its own.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(8);
/// How often a joining node asks again: a request or its answer may be lost to a link that is
/// still coming up, or find no leader.
pub const JOIN_RETRY: Duration = Duration::from_millis(1_000);
/// How long a membership change of this node waits to be applied before it is proposed again
/// (raft-rs drops a change proposed while another is pending, silently).
const CHANGE_RETRY: Duration = Duration::from_millis(500);
/// Joiners' random ids are at least this: far above any founding position.
const JOINER_ID_MIN: u64 = 1 << 16;
/// ...and below this: the server numbers connections `node id << 40 | n`, so an id must fit in
/// the top 24 bits to keep connection ids unique across nodes.
const JOINER_ID_MAX: u64 = 1 << 24;

/// Why a membership command was refused; the management API maps each kind to a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipError {
    /// Wrong as asked (forgetting the node it runs on, joining itself): 400.
    Invalid(String),
    /// No member of that name: 404.
    UnknownNode(String),
    /// Not in the cluster's present state (a running node, already a member, a name in use):
    /// 409.
    Conflict(String),
    /// No majority answered in time: 503.
    NoMajority(String),
}

impl MembershipError {
    pub fn reason(&self) -> &str {
        match self {
            MembershipError::Invalid(r)
            | MembershipError::UnknownNode(r)
            | MembershipError::Conflict(r)
            | MembershipError::NoMajority(r) => r,
        }
    }
}

/// A refusal of this node's join request, as the leader (or the member asked) sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRefusal {
    pub reason: String,
    /// Asking again cannot help (a name in use); otherwise it may (no leader yet).
    pub fatal: bool,
}

/// What travels in the context of a [`MEMBERSHIP_GROUP`] message.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
enum Request {
    Join { info: NodeInfo },
    Refused { refusal: JoinRefusal },
}

/// The context of a configuration change entry: who proposed it (to answer its caller when it
/// is applied there) and, for an added node, where to reach it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChangeContext {
    pub origin: u64,
    pub request: u64,
    pub info: Option<NodeInfo>,
}

/// A change this node proposed, until it is applied.
struct PendingChange {
    change: ConfChange,
    reply: tokio::sync::oneshot::Sender<Result<(), MembershipError>>,
    tried: Instant,
}

/// The metadata group's membership state beside raft-rs's own configuration.
pub(crate) struct Membership {
    /// Ids removed by `forget_cluster_node`: replicated (applied from the log, kept in the
    /// snapshot), so every node refuses them alike.
    pub forgotten: BTreeSet<u64>,
    /// Set when an applied change asks for a snapshot at once (after an `AddNode`).
    pub snapshot_due: bool,
    pending: HashMap<u64, PendingChange>,
}

impl Membership {
    pub fn new(forgotten: Vec<u64>) -> Membership {
        Membership {
            forgotten: forgotten.into_iter().collect(),
            snapshot_due: false,
            pending: HashMap::new(),
        }
    }
}

/// What the leader does with a join request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum JoinCheck {
    Add,
    /// Already a voter: nothing to change (an answer lost, a request repeated).
    AlreadyMember,
    Refuse(JoinRefusal),
}

fn fatal(reason: String) -> JoinCheck {
    JoinCheck::Refuse(JoinRefusal {
        reason,
        fatal: true,
    })
}

/// Whether `info` may join, given the members, the voters and the forgotten ids. Pure, so
/// the rules are tested without a cluster.
pub(crate) fn check_join(
    info: &NodeInfo,
    members: &BTreeMap<u64, NodeInfo>,
    voters: &[u64],
    forgotten: &BTreeSet<u64>,
) -> JoinCheck {
    if forgotten.contains(&info.id) {
        return fatal(format!(
            "node {} was forgotten by this cluster: delete its data directory before it joins \
             again",
            info.name
        ));
    }
    if voters.contains(&info.id) {
        return match members.get(&info.id) {
            // A member's address may change (a restart elsewhere); its name may not.
            Some(m) if m.name != info.name => fatal(format!(
                "member {} has this node's id {}: delete this node's data directory so that it \
                 draws another",
                m.name, info.id
            )),
            _ => JoinCheck::AlreadyMember,
        };
    }
    let others = || members.values().filter(|m| m.id != info.id);
    if let Some(m) = others().find(|m| m.name == info.name) {
        return fatal(format!(
            "a node named {} is already a member (cluster address {}): give the new node \
             another --node-name",
            m.name, m.cluster
        ));
    }
    if let Some(m) = others().find(|m| m.cluster == info.cluster) {
        return fatal(format!(
            "member {} already uses cluster address {}",
            m.name, m.cluster
        ));
    }
    JoinCheck::Add
}

/// The member `forget_cluster_node name` would remove, or why not. A voter that never said who
/// it is (a seed that never started) goes by the name status shows for it, `node-<id>`.
pub(crate) fn check_forget(
    name: &str,
    me: &NodeInfo,
    members: &BTreeMap<u64, NodeInfo>,
    voters: &[u64],
    is_up: impl Fn(u64) -> bool,
) -> Result<u64, MembershipError> {
    if name == me.name {
        return Err(MembershipError::Invalid(format!(
            "{name} is the node this command runs on: run forget_cluster_node on another member"
        )));
    }
    let id = members
        .values()
        .find(|m| m.name == name)
        .map(|m| m.id)
        .or_else(|| {
            voters
                .iter()
                .copied()
                .find(|id| !members.contains_key(id) && format!("node-{id}") == name)
        })
        .filter(|id| voters.contains(id) || members.contains_key(id))
        .ok_or_else(|| {
            MembershipError::UnknownNode(format!("{name} is not a member of this cluster"))
        })?;
    if is_up(id) {
        return Err(MembershipError::Conflict(format!(
            "{name} is running: stop it before forgetting it"
        )));
    }
    Ok(id)
}

/// Whether `reachable` of `voters` nodes are a majority.
pub(crate) fn is_majority(reachable: usize, voters: usize) -> bool {
    reachable * 2 > voters
}

/// A joining node's identity at its first start: a random id of its own, no founders (its
/// group starts with an empty configuration), and the members to ask (`--cluster-seeds`).
pub(crate) fn joiner_identity(seeds: &[HostPort]) -> Identity {
    use std::hash::{BuildHasher, Hasher};
    // std's RandomState is seeded from the OS: enough to make two joiners' ids differ.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    let id = JOINER_ID_MIN + h.finish() % (JOINER_ID_MAX - JOINER_ID_MIN);
    Identity {
        id,
        founders: Vec::new(),
        seeds: seeds.to_vec(),
    }
}

fn encode_request(from: u64, request: &Request) -> Message {
    Message {
        from,
        context: serde_json::to_vec(request)
            .expect("requests serialise")
            .into(),
        ..Default::default()
    }
}

/// Why a join request did not get through.
enum JoinSendError {
    /// No connection (yet): worth asking again.
    Unreachable(String),
    /// The member refused this node's certificate: asking again would not change it.
    Refused(String),
}

/// Sends one join request to `target` over a connection of its own (TLS when the links are):
/// the transport knows peers by id, and the joiner does not know the target's.
async fn send_join_request(
    transport: &crate::transport::Transport,
    target: &HostPort,
    me: &NodeInfo,
) -> Result<(), JoinSendError> {
    let mut stream = transport
        .open(target)
        .await
        .map_err(JoinSendError::Unreachable)?;
    let mut out = bytes::BytesMut::new();
    // Boot 0: not a link of the node's own, so no peer takes it for a restart.
    frame::encode_hello(&mut out, &frame::Hello::new(me.clone(), 0, None));
    let request = Request::Join { info: me.clone() };
    frame::encode_raft(
        &mut out,
        MEMBERSHIP_GROUP,
        &[encode_request(me.id, &request)],
    );
    stream
        .write_all(&out)
        .await
        .map_err(|e| JoinSendError::Unreachable(format!("cannot reach {target}: {e}")))?;
    let _ = stream.shutdown().await;
    // The member closes once it has read what we sent; closing first could reset it unread.
    let mut rest = [0u8; 256];
    let read = tokio::time::timeout(JOIN_RETRY, async {
        loop {
            match stream.read(&mut rest).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    // In TLS 1.3 the member checks our certificate after the handshake: a refusal shows here.
    if let Ok(Err(e)) = read {
        if let Some(why) = crate::link_tls::LinkTls::describe(&e) {
            return Err(JoinSendError::Refused(format!(
                "{target} refused this node: the member {why}"
            )));
        }
    }
    Ok(())
}

impl Cluster {
    /// Whether this node is a voter of its metadata group (a founder, or a joiner that caught
    /// up from a snapshot naming it).
    pub fn is_member(&self) -> bool {
        self.status
            .lock()
            .expect("status lock")
            .voters
            .contains(&self.me.id)
    }

    /// `join_cluster`: asks the cluster that `target` (a member's cluster address) belongs to,
    /// to add this node, and waits until this node is a member, up to [`JOIN_TIMEOUT`].
    pub async fn join(&self, target: HostPort) -> Result<(), MembershipError> {
        if target == self.me.cluster {
            return Err(MembershipError::Invalid(format!(
                "{target} is this node's own cluster address: give a member of the cluster to join"
            )));
        }
        let voters = self.status.lock().expect("status lock").voters.clone();
        if !voters.is_empty() {
            return Err(MembershipError::Conflict(format!(
                "{} is already a member of a cluster of {} node(s): a node joins a cluster once \
                 (forget it there and delete its data directory to make it new)",
                self.me.name,
                voters.len()
            )));
        }
        self.status.lock().expect("status lock").join_refusal = None;
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut last = String::from("no answer");
        loop {
            match send_join_request(&self.transport, &target, &self.me).await {
                Ok(()) => {}
                Err(JoinSendError::Unreachable(e)) => last = e,
                Err(JoinSendError::Refused(e)) => return Err(MembershipError::Conflict(e)),
            }
            let asked = Instant::now();
            while asked.elapsed() < JOIN_RETRY && Instant::now() < deadline {
                if self.is_member() {
                    tracing::info!(node = %self.me.name, %target, "joined the cluster");
                    return Ok(());
                }
                let refusal = self.status.lock().expect("status lock").join_refusal.take();
                if let Some(r) = refusal {
                    if r.fatal {
                        return Err(MembershipError::Conflict(r.reason));
                    }
                    last = r.reason;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if Instant::now() >= deadline {
                return Err(MembershipError::NoMajority(format!(
                    "{} did not become a member of the cluster at {target} within {} s ({last}): \
                     joining needs the cluster's leader and a majority of its nodes",
                    self.me.name,
                    JOIN_TIMEOUT.as_secs()
                )));
            }
        }
    }

    /// `forget_cluster_node`: removes a stopped member from the cluster, once a majority of the
    /// present members has the change.
    pub async fn forget(&self, name: &str) -> Result<(), MembershipError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let stopped = || MembershipError::NoMajority("the metadata store has stopped".into());
        self.inputs
            .lock()
            .expect("inputs lock")
            .send(crate::metadata::Input::Forget {
                name: name.to_string(),
                reply,
            })
            .map_err(|_| stopped())?;
        match tokio::time::timeout(crate::PROPOSE_TIMEOUT, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Err(MembershipError::NoMajority(format!(
                "timed out after {} s waiting for a majority of the cluster to forget {name}: \
                 the change is not confirmed, and takes effect only if a majority already has it",
                crate::PROPOSE_TIMEOUT.as_secs()
            ))),
        }
    }
}

impl Cluster {
    /// `reset`: this node leaves the cluster (a `RemoveNode` of itself), once a majority of the
    /// members has the change; a node that is no member, or the only one, has nothing to leave.
    pub async fn leave(&self) -> Result<(), MembershipError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let stopped = || MembershipError::NoMajority("the metadata store has stopped".into());
        self.inputs
            .lock()
            .expect("inputs lock")
            .send(crate::metadata::Input::Leave { reply })
            .map_err(|_| stopped())?;
        match tokio::time::timeout(crate::PROPOSE_TIMEOUT, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Err(MembershipError::NoMajority(format!(
                "timed out after {} s waiting for a majority of the cluster to remove this \
                 node: it was not reset; the change takes effect only if a majority already has it",
                crate::PROPOSE_TIMEOUT.as_secs()
            ))),
        }
    }
}

/// A node started with seeds that do not list it asks them in turn until it is a member, or one
/// refuses it for good.
pub(crate) fn spawn_auto_join(cluster: std::sync::Arc<Cluster>, seeds: Vec<HostPort>) {
    tokio::spawn(async move {
        for target in seeds.iter().cycle() {
            if cluster.is_member() {
                return;
            }
            match cluster.join(target.clone()).await {
                Ok(()) => return,
                Err(MembershipError::NoMajority(e)) => {
                    tracing::warn!(%target, reason = %e, "not joined yet; asking again")
                }
                Err(e) => {
                    tracing::error!(%target, reason = %e.reason(), "the cluster refused this node");
                    return;
                }
            }
        }
    });
}

impl MetadataGroup {
    pub(crate) fn voter_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.raw.raft.prs().conf().voters().ids().iter().collect();
        v.sort_unstable();
        v
    }

    fn reaches_majority(&self) -> bool {
        let voters = self.voter_ids();
        let up = voters.iter().filter(|v| self.transport.is_up(**v)).count();
        is_majority(up, voters.len())
    }

    /// Membership requests from other nodes: joins to decide (leader) or forward, refusals of
    /// our own join.
    pub(crate) fn on_membership_messages(&mut self, messages: Vec<Message>) {
        for m in messages {
            match serde_json::from_slice::<Request>(&m.context) {
                Ok(Request::Join { info }) => self.on_join_request(m, info),
                Ok(Request::Refused { refusal }) => {
                    self.status.lock().expect("status lock").join_refusal = Some(refusal);
                }
                Err(e) => tracing::warn!(error = %e, "unreadable membership request ignored"),
            }
        }
    }

    fn on_join_request(&mut self, message: Message, info: NodeInfo) {
        let leader = self.raw.raft.leader_id;
        if leader != self.me.id {
            if leader != raft::INVALID_ID && self.voter_ids().contains(&leader) {
                self.transport
                    .send_raft(leader, MEMBERSHIP_GROUP, &[message]);
            } else {
                self.refuse_join(
                    &info,
                    "the cluster has no leader now: it reaches no majority of its nodes",
                    false,
                );
            }
            return;
        }
        match check_join(
            &info,
            &self.members,
            &self.voter_ids(),
            &self.membership.forgotten,
        ) {
            JoinCheck::AlreadyMember => {}
            JoinCheck::Refuse(r) => self.refuse_join(&info, &r.reason, r.fatal),
            JoinCheck::Add if !self.reaches_majority() => self.refuse_join(
                &info,
                "the leader reaches no majority of the cluster's nodes",
                false,
            ),
            JoinCheck::Add if self.raw.raft.has_pending_conf() => {
                self.refuse_join(&info, "another membership change is in progress", false)
            }
            JoinCheck::Add => {
                tracing::info!(node = %info.name, id = info.id, "adding a node to the cluster");
                let request = self.next_request;
                self.next_request += 1;
                let change = add_node(self.me.id, request, info);
                let _ = self.raw.propose_conf_change(vec![], change);
            }
        }
    }

    fn refuse_join(&mut self, info: &NodeInfo, reason: &str, fatal: bool) {
        tracing::info!(node = %info.name, reason, "join request refused");
        let refusal = JoinRefusal {
            reason: reason.to_string(),
            fatal,
        };
        // Dialled now, the link carries the next refusal if this one finds it still down.
        self.transport.connect(info.id, info.cluster.clone());
        let m = encode_request(self.me.id, &Request::Refused { refusal });
        self.transport.send_raft(info.id, MEMBERSHIP_GROUP, &[m]);
    }

    /// `forget_cluster_node name` on this node: checked here, then proposed; answered when
    /// applied here.
    pub(crate) fn forget(
        &mut self,
        name: &str,
        reply: tokio::sync::oneshot::Sender<Result<(), MembershipError>>,
    ) {
        let voters = self.voter_ids();
        let transport = self.transport.clone();
        let id = match check_forget(name, &self.me, &self.members, &voters, |id| {
            transport.is_up(id)
        }) {
            Ok(id) => id,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        if !self.reaches_majority() {
            let up = voters.iter().filter(|v| self.transport.is_up(**v)).count();
            let _ = reply.send(Err(MembershipError::NoMajority(format!(
                "this node reaches {up} of the cluster's {} nodes: forgetting a node needs a \
                 majority of them",
                voters.len()
            ))));
            return;
        }
        tracing::info!(node = name, id, "forgetting a node");
        let (request, change) = self.propose_removal(id);
        self.membership.pending.insert(
            request,
            PendingChange {
                change,
                reply,
                tried: Instant::now(),
            },
        );
    }

    /// `reset` on this node: refused without a majority (the others could never learn that it
    /// left), else proposed; answered when applied here.
    pub(crate) fn leave(
        &mut self,
        reply: tokio::sync::oneshot::Sender<Result<(), MembershipError>>,
    ) {
        let voters = self.voter_ids();
        if voters.iter().all(|v| *v == self.me.id) {
            let _ = reply.send(Ok(()));
            return;
        }
        if !self.reaches_majority() {
            let up = voters.iter().filter(|v| self.transport.is_up(**v)).count();
            let _ = reply.send(Err(MembershipError::NoMajority(format!(
                "this node reaches {up} of the cluster's {} nodes: it cannot leave the cluster \
                 without a majority of them, so it was not reset. Start the other nodes first; \
                 if they are gone for good, use warren ctl force_boot on the one that is left",
                voters.len()
            ))));
            return;
        }
        tracing::warn!("reset: this node leaves the cluster");
        let (request, change) = self.propose_removal(self.me.id);
        self.membership.pending.insert(
            request,
            PendingChange {
                change,
                reply,
                tried: Instant::now(),
            },
        );
    }

    /// Proposes removing voter `id` (forget, reset, force_boot), under a request id of this
    /// node's: the request and the change, for a caller that waits for it to apply.
    pub(crate) fn propose_removal(&mut self, id: u64) -> (u64, ConfChange) {
        let request = self.next_request;
        self.next_request += 1;
        let context = ChangeContext {
            origin: self.me.id,
            request,
            info: None,
        };
        let change = ConfChange {
            change_type: ConfChangeType::RemoveNode,
            node_id: id,
            context: serde_json::to_vec(&context)
                .expect("contexts serialise")
                .into(),
            ..Default::default()
        };
        let _ = self.raw.propose_conf_change(vec![], change.clone());
        (request, change)
    }

    /// Proposes again the changes of this node not applied in [`CHANGE_RETRY`] (no leader, or
    /// another change was pending); forgets those nobody waits for.
    pub(crate) fn retry_membership_changes(&mut self) {
        self.membership.pending.retain(|_, p| !p.reply.is_closed());
        let due: Vec<ConfChange> = self
            .membership
            .pending
            .values_mut()
            .filter(|p| p.tried.elapsed() >= CHANGE_RETRY)
            .map(|p| {
                p.tried = Instant::now();
                p.change.clone()
            })
            .collect();
        for change in due {
            let _ = self.raw.propose_conf_change(vec![], change);
        }
    }

    /// Applies a committed configuration change: the member table and links first, then
    /// raft-rs's configuration; answers this node's caller.
    pub(crate) fn apply_conf_change(&mut self, entry: &Entry) -> Result<(), String> {
        let change = ConfChange::parse_from_bytes(&entry.data).map_err(|e| e.to_string())?;
        let context: Option<ChangeContext> = serde_json::from_slice(&change.context).ok();
        let id = change.node_id;
        match change.get_change_type() {
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                if let Some(info) = context.as_ref().and_then(|c| c.info.clone()) {
                    self.transport.connect(info.id, info.cluster.clone());
                    self.members.insert(info.id, info);
                }
                // The new node's log is empty: what the leader sends it must be a snapshot
                // that names it (see the module's doc).
                self.membership.snapshot_due = true;
            }
            ConfChangeType::RemoveNode => {
                let name = self.members.remove(&id).map(|m| m.name);
                self.membership.forgotten.insert(id);
                self.transport.forget(id);
                self.applied_requests.forget(id);
                let left = context.as_ref().is_some_and(|c| c.origin == self.me.id);
                if id == self.me.id && left {
                    tracing::warn!("this node left the cluster (reset)");
                } else if id == self.me.id {
                    tracing::error!("this node was forgotten by the cluster: it takes no part in it any more; delete its data directory before it joins again");
                } else {
                    tracing::info!(id, name = ?name, "node forgotten");
                }
            }
        }
        self.raw
            .apply_conf_change(&change)
            .map_err(|e| e.to_string())?;
        if let Some(c) = context.filter(|c| c.origin == self.me.id) {
            if let Some(p) = self.membership.pending.remove(&c.request) {
                let _ = p.reply.send(Ok(()));
            }
        }
        Ok(())
    }
}

/// The links to present members only: a refused joiner dialled this node (and was dialled
/// back), and a forgotten node's link stays in the transport's table, undialled.
pub(crate) fn member_links(
    links: Vec<crate::transport::LinkStats>,
    members: &[crate::MemberStatus],
) -> Vec<crate::transport::LinkStats> {
    links
        .into_iter()
        .filter(|l| members.iter().any(|m| m.id == l.peer))
        .collect()
}

fn add_node(origin: u64, request: u64, info: NodeInfo) -> ConfChange {
    let id = info.id;
    let context = ChangeContext {
        origin,
        request,
        info: Some(info),
    };
    ConfChange {
        change_type: ConfChangeType::AddNode,
        node_id: id,
        context: serde_json::to_vec(&context)
            .expect("contexts serialise")
            .into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, name: &str, port: u16) -> NodeInfo {
        NodeInfo {
            id,
            name: name.into(),
            cluster: std::net::SocketAddr::from(([127, 0, 0, 1], port)).into(),
            amqp: std::net::SocketAddr::from(([127, 0, 0, 1], port + 1000)),
            management: None,
            draining: false,
        }
    }

    fn three() -> BTreeMap<u64, NodeInfo> {
        (1..=3)
            .map(|i| (i, node(i, &format!("n{i}"), 25670 + i as u16)))
            .collect()
    }

    #[test]
    fn a_new_node_is_added_and_a_repeated_request_changes_nothing() {
        let members = three();
        let joiner = node(1 << 20, "n4", 25674);
        let none = BTreeSet::new();
        assert_eq!(
            check_join(&joiner, &members, &[1, 2, 3], &none),
            JoinCheck::Add
        );
        let mut with_joiner = members.clone();
        with_joiner.insert(joiner.id, joiner.clone());
        assert_eq!(
            check_join(&joiner, &with_joiner, &[1, 2, 3, 1 << 20], &none),
            JoinCheck::AlreadyMember
        );
        // Another node that drew the same id.
        let twin = node(1 << 20, "n5", 25675);
        assert!(matches!(
            check_join(&twin, &with_joiner, &[1, 2, 3, 1 << 20], &none),
            JoinCheck::Refuse(JoinRefusal { fatal: true, .. })
        ));
    }

    #[test]
    fn a_join_with_a_members_name_or_address_or_a_forgotten_id_is_refused_for_good() {
        let members = three();
        let none = BTreeSet::new();
        let same_name = node(1 << 20, "n2", 25679);
        match check_join(&same_name, &members, &[1, 2, 3], &none) {
            JoinCheck::Refuse(r) => {
                assert!(r.fatal);
                assert!(r.reason.contains("named n2"), "{}", r.reason);
            }
            other => panic!("{other:?}"),
        }
        let same_address = node(1 << 20, "n9", 25673);
        assert!(matches!(
            check_join(&same_address, &members, &[1, 2, 3], &none),
            JoinCheck::Refuse(JoinRefusal { fatal: true, .. })
        ));
        let forgotten: BTreeSet<u64> = [3].into();
        assert!(matches!(
            check_join(&node(3, "n3", 25673), &members, &[1, 2], &forgotten),
            JoinCheck::Refuse(JoinRefusal { fatal: true, .. })
        ));
    }

    #[test]
    fn forget_refuses_this_node_unknown_nodes_and_running_ones() {
        let members = three();
        let me = members[&1].clone();
        let voters = [1, 2, 3];
        assert!(matches!(
            check_forget("n1", &me, &members, &voters, |_| false),
            Err(MembershipError::Invalid(_))
        ));
        assert!(matches!(
            check_forget("n7", &me, &members, &voters, |_| false),
            Err(MembershipError::UnknownNode(_))
        ));
        assert!(matches!(
            check_forget("n3", &me, &members, &voters, |_| true),
            Err(MembershipError::Conflict(_))
        ));
        assert_eq!(check_forget("n3", &me, &members, &voters, |_| false), Ok(3));
    }

    #[test]
    fn a_seed_that_never_registered_is_forgotten_by_the_name_status_gives_it() {
        let mut members = three();
        members.remove(&3);
        let me = members[&1].clone();
        assert_eq!(
            check_forget("node-3", &me, &members, &[1, 2, 3], |_| false),
            Ok(3)
        );
        assert!(check_forget("node-4", &me, &members, &[1, 2, 3], |_| false).is_err());
    }

    #[test]
    fn a_majority_is_more_than_half_of_the_voters() {
        assert!(is_majority(2, 3));
        assert!(!is_majority(1, 2));
        assert!(is_majority(2, 2));
        assert!(!is_majority(2, 4));
        assert!(is_majority(3, 4));
    }

    #[test]
    fn joiner_ids_never_collide_with_founding_positions() {
        let a = joiner_identity(&[]);
        let b = joiner_identity(&[]);
        assert!((JOINER_ID_MIN..JOINER_ID_MAX).contains(&a.id));
        assert!(a.founders.is_empty());
        assert_ne!(a.id, b.id);
    }
}
