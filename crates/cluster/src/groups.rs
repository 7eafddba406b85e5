//! Every quorum queue's Raft group on this node, driven by one loop (TiKV's raftstore is the
//! model): per round it steps what peers sent, proposes what clients asked, then handles every
//! group's ready together: all groups' new entries go to their logs in the shared WAL and one
//! sync covers them all; each group's messages leave in the transport's next write to that peer
//! (one write carries every group's). Committed entries go to the group's [`Machine`].
//!
//! The loop never waits for the disk (TiKV's async I/O, raft-rs's `advance_append_async`): a
//! round's writes are handed to the WAL writer, and the loop goes on stepping what peers send
//! while the WAL syncs. What raft-rs says may leave only once the writes are durable (a
//! follower's answers, votes) waits in [`Unsynced`] until the WAL writer reports the sync done
//! ([`Input::Synced`]: `groups/syncer.rs`). Otherwise an append arriving during another group's
//! sync waited for it whole, at every hop of a publish. Committed entries do not wait for this
//! node's sync either: a majority has them, and the member applies them from raft-rs's
//! in-memory log (`groups/apply.rs`). At a low rate (`groups/load.rs`) the writer syncs a
//! round without its commit window, and the loop writes the round's deliveries to the
//! consumers' sockets itself (`warren_broker::outbox::WriteThrough`): a thread wake-up
//! fewer per hop.
//!
//! Idle groups hibernate (TiKV's hibernate regions, Ra's quiet clusters): a group that has had
//! nothing to do for a few heartbeats stops ticking, so 10,000 idle queues cost no timers and
//! send no heartbeats. A leader sleeps once its followers have everything; a follower once it
//! knows a leader that is up. What wakes a group: a proposal, any message from a peer (a
//! restarted member's pre-vote wakes its leader, whose heartbeats then tell it who leads), and
//! the node-level failure detector: when the transport finds a node down, every group with a
//! member there wakes, so followers of a dead leader elect a new one and a cut-off leader steps
//! down (check-quorum).

use crate::catch_up::{CatchUpInput, CatchUpMessage, FetchJob, SendCatchUp};
use crate::raft_log::RaftLog;
use raft::eraftpb::{Message, MessageType, Snapshot};
use raft::{RawNode, StateRole};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warren_store::Store;

/// What a group replicates: the quorum queue state machine, as the server wires it.
pub trait Machine: Send {
    /// Applies a committed entry, in log order, exactly once per index on this node (after a
    /// restart, from the last snapshot on). `data` is the entry's (shared, not copied).
    fn apply(&mut self, index: u64, data: bytes::Bytes);
    /// The state as of the last applied index, for a snapshot.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with a snapshot's.
    fn restore(&mut self, data: &[u8]);
    /// The group's leader or this node's role changed (`leader` 0: none known).
    fn leader_changed(&mut self, _leader: u64, _term: u64) {}
    /// The lowest index whose entry the machine still reads (a message's body): a snapshot
    /// releases the log below it only. `u64::MAX`: nothing.
    fn live_from(&self) -> u64 {
        u64::MAX
    }
    /// The entries of a round are applied: effects gathered while applying them can go out
    /// together (one lock, one wake-up for many confirms and deliveries). `caught_up` is false
    /// while this member applies entries behind what a leader told it is committed (it was
    /// cut off, paused or restarted): effects of old entries may be undone by later ones it
    /// has yet to apply (a delivery to a consumer a later entry found gone), so it may hold
    /// them back until it has applied those too.
    fn flush(&mut self, _caught_up: bool) {}
    /// The group was removed here (its queue deleted, or this node no longer a member) and its
    /// log deleted: a machine with files of its own (a stream's segments) deletes them.
    fn removed(&mut self) {}
}

/// How long a member leaving its group waits, unspoken to, before it closes anyway.
const LEAVE_QUIET: Duration = Duration::from_secs(5);

/// How a group's messages reach a peer node; false if the link is down.
pub type SendRaft = Arc<dyn Fn(u64, u64, &[Message]) -> bool + Send + Sync>;

mod apply;
mod commit_latency;
mod failover;
mod hibernation;
mod load;
mod maintenance;
mod proposals;
mod raft_links;
mod syncer;
mod voters;
use apply::{advance_apply, apply_ahead, apply_handed_out, snapshot_may_cover};
use failover::{elect_without, stand_again};
use hibernation::{is_heartbeat, may_sleep};
use load::Load;
use maintenance::hand_off;
use proposals::{proposals_apart, propose, propose_waiting};
pub use raft_links::InputSender;
use raft_links::RaftLinks;
use syncer::Syncer;
use voters::{change_voters, current_voters};

/// How the loop reaches other nodes, and learns which are up.
pub struct Links {
    /// Queues a group's messages for a peer; they leave at the next `flush`.
    pub send: SendRaft,
    /// Sends what `send` queued, once per pass of the loop: every group's messages of a round
    /// to a peer in one write.
    pub flush: Flush,
    pub send_catch_up: SendCatchUp,
    pub is_up: IsUp,
}
/// Sends what [`Links::send`] queued.
pub type Flush = Arc<dyn Fn() + Send + Sync>;
/// Whether a peer node is up, as the node-level failure detector sees it.
pub type IsUp = Arc<dyn Fn(u64) -> bool + Send + Sync>;
/// Called with the outcome of a proposal as it enters (or fails to enter) the log.
pub type Proposed = Box<dyn FnOnce(Result<(), String>) + Send>;

#[derive(Debug, Clone)]
pub struct GroupsTiming {
    pub tick: Duration,
    /// Ticks without a leader before a follower stands (raft-rs randomises up to twice).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// Quiet ticks after which a group sleeps: more than a heartbeat, so followers have heard
    /// the last commit index; fewer than an election timeout, so they never stand meanwhile.
    pub sleep_ticks: usize,
    /// Applied entries between snapshots.
    pub snapshot_entries: u64,
    /// Entry bytes a snapshot sent to a follower carries at most, and a chunk of those it
    /// fetches instead holds ([`crate::catch_up`]).
    pub catch_up_chunk_bytes: usize,
}

impl Default for GroupsTiming {
    fn default() -> Self {
        GroupsTiming {
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            sleep_ticks: 5,
            snapshot_entries: 4096,
            catch_up_chunk_bytes: 4 << 20,
        }
    }
}

/// What the loop is asked to do.
pub enum Input {
    /// Opens a group this node is a member of (at declare, or at start for existing queues):
    /// `voters` are the founding members, used only if its log is new.
    Create {
        group: u64,
        voters: Vec<u64>,
        machine: Box<dyn Machine>,
    },
    /// Closes a group and deletes its log and snapshot (the queue was deleted).
    Remove {
        group: u64,
    },
    /// An entry for a group. `Bytes`, not `Vec`: the entry goes into the log as it is, and a
    /// proposer may keep it to propose again without encoding it again.
    Propose {
        group: u64,
        data: bytes::Bytes,
        done: Option<Proposed>,
    },
    /// Entries for several groups at once (a publish routed to several quorum queues): they
    /// enter the same round, so one sync covers them.
    ProposeMany(Vec<(u64, bytes::Bytes)>),
    Peer {
        group: u64,
        messages: Vec<Message>,
    },
    /// The failure detector found a node down: its groups here wake.
    PeerDown(u64),
    /// A peer's raft link, for the loop to read itself ([`raft_links`]).
    RaftLink(crate::transport::RaftLinkSocket),
    /// The voters a group is to have (its queue's members changed): its leader changes the
    /// group's membership to match, one node at a time.
    SetVoters {
        group: u64,
        voters: Vec<u64>,
    },
    /// Hands the group's leadership to `to` (a voter), as rabbitmq-queues rebalance does;
    /// raft-rs forwards it to the leader from any member.
    TransferLeader {
        group: u64,
        to: u64,
    },
    /// The node entered (true) or left maintenance mode: while in it, every group it leads
    /// hands its leadership to another member ([`maintenance`]).
    SetDraining(bool),
    /// The other nodes in maintenance mode, as the member table says: a leaderless group
    /// elects, and a draining leader hands on to, a member outside them when it can.
    PeersDraining(BTreeSet<u64>),
    /// This node is no longer among the queue's members: its replica stays until the group's
    /// leader (another member) has removed it from the voters, then closes and deletes its log.
    /// Closing at once could leave a two-member group without the majority that removal needs.
    Leave {
        group: u64,
    },
    /// A metadata snapshot from the leader replaced the topology: `groups` are the replicas it
    /// gives this node. Any other group here belongs to a queue deleted, or that this node was
    /// removed from, while it was away (the entries that said so are not replayed): an open one
    /// leaves as a removed member does, a closed one's log and files are deleted.
    Retain {
        groups: std::collections::HashSet<u64>,
    },
    /// The WAL writer's report: the WAL is synced through a round (sent from the callback the
    /// loop gave it, not constructible elsewhere).
    Synced(Synced),
    /// The snapshot writer's report on a group's snapshot.
    SnapshotWritten(crate::snapshot_writer::SnapshotWritten),
    /// The catch-up thread's report: the entries below the snapshot a group is installing
    /// are in its log.
    Fetched {
        group: u64,
    },
    Stop,
}

/// Rounds synced up to `round`, or the sync failed.
pub struct Synced(Result<u64, String>);

/// What a round must not let out before its writes are durable: per group, the number of its
/// ready (for `on_persist_ready`) and the messages raft-rs held back until then.
struct Unsynced {
    round: u64,
    readies: Vec<(u64, u64, Vec<Message>)>,
}

/// One group as others on this node see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupView {
    pub leader: u64,
    pub term: u64,
    pub is_leader: bool,
    pub asleep: bool,
    pub applied: u64,
    /// The group's voters as this member last applied them.
    pub voters: Vec<u64>,
    /// The highest index this member knows committed (Prometheus' `raft_log_commit_index`).
    pub commit: u64,
    /// The highest index this member has durably in its log (`raft_log_last_written_index`).
    pub written: u64,
    /// The index of this member's latest snapshot (`raft_log_snapshot_index`).
    pub snapshot_index: u64,
    /// How long the latest of its entries timed took to commit while this member led
    /// (`raft_entry_commit_latency_seconds`); `None` if it never led.
    pub commit_latency: Option<Duration>,
}

/// A handle on the node's groups.
#[derive(Clone)]
pub struct QueueGroups {
    inputs: InputSender,
    catch_up: Arc<Mutex<Sender<CatchUpInput>>>,
    views: Arc<Mutex<HashMap<u64, GroupView>>>,
    syncs: Arc<AtomicU64>,
}

impl QueueGroups {
    /// Starts the loop on a thread of its own. Groups keep their logs in `store` (log id =
    /// group id) and snapshots under `dir`.
    pub fn start(
        me: u64,
        store: Arc<Store>,
        dir: &Path,
        links: Links,
        timing: GroupsTiming,
    ) -> Result<(QueueGroups, std::thread::JoinHandle<()>), String> {
        let Links {
            send,
            flush,
            send_catch_up,
            is_up,
        } = links;
        let (tx, rx) = std::sync::mpsc::channel();
        let (links, tx) = RaftLinks::new(tx).map_err(|e| format!("cannot set up an epoll: {e}"))?;
        let views = Arc::new(Mutex::new(HashMap::new()));
        let syncs = Arc::new(AtomicU64::new(0));
        let syncer = Syncer::new(store.clone(), tx.clone(), syncs.clone());
        let snapshots = crate::snapshot_writer::start(tx.clone())?;
        let (catch_up, catch_up_thread) = crate::catch_up::start(
            store.clone(),
            send_catch_up,
            timing.catch_up_chunk_bytes,
            tx.clone(),
        )?;
        let runner = Runner {
            links,
            syncer,
            load: Load::default(),
            snapshots,
            catch_up: catch_up.clone(),
            catch_up_thread: Some(catch_up_thread),
            resumed: Vec::new(),
            unsynced: VecDeque::new(),
            sync_wanted: None,
            next_round: 1,
            me,
            store,
            dir: dir.to_path_buf(),
            send,
            flush,
            is_up,
            timing,
            draining: false,
            draining_nodes: BTreeSet::new(),
            groups: BTreeMap::new(),
            touched: BTreeSet::new(),
            views: views.clone(),
            early: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("queue-groups".into())
            .spawn(move || runner.run(rx))
            .map_err(|e| e.to_string())?;
        Ok((
            QueueGroups {
                inputs: tx,
                catch_up: Arc::new(Mutex::new(catch_up)),
                views,
                syncs,
            },
            thread,
        ))
    }

    pub fn send(&self, input: Input) {
        self.inputs.send(input);
    }

    /// A catch-up message from peer `from` ([`crate::catch_up`]).
    pub fn catch_up_received(&self, from: u64, message: CatchUpMessage) {
        let _ = self
            .catch_up
            .lock()
            .expect("catch-up lock")
            .send(CatchUpInput::Received { from, message });
    }

    pub fn view(&self, group: u64) -> Option<GroupView> {
        self.views.lock().expect("views lock").get(&group).cloned()
    }

    /// How many syncs the loop asked the WAL for: once per round that wrote, whatever the
    /// number of groups in it.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// How many groups this node leads now.
    pub fn led(&self) -> usize {
        self.views
            .lock()
            .expect("views lock")
            .values()
            .filter(|v| v.is_leader)
            .count()
    }

    /// How many groups are awake (ticking) now.
    pub fn awake(&self) -> usize {
        self.views
            .lock()
            .expect("views lock")
            .values()
            .filter(|v| !v.asleep)
            .count()
    }
}

struct Group {
    raw: RawNode<RaftLog>,
    machine: Box<dyn Machine>,
    voters: Vec<u64>,
    /// The voters the queue's members say the group should have (empty: no change asked).
    wanted: Vec<u64>,
    /// A snapshot is taken at the end of the round whatever the interval (the membership
    /// changed).
    snapshot_due: bool,
    /// A snapshot of the group is with the snapshot writer: the next waits for its report.
    snapshot_writing: bool,
    /// Leaving the group ([`Input::Leave`]): when a peer last spoke to this member.
    leaving: Option<Instant>,
    asleep: bool,
    quiet_ticks: usize,
    /// The machine's applied index: ahead of raft-rs's while this node's disk lags
    /// (`groups/apply.rs`).
    applied: u64,
    /// The last committed entry raft-rs handed out (or the snapshot installed): raft-rs counts
    /// applied no more than this.
    handed_out: u64,
    /// The highest commit index a leader's append named: at least what it had committed.
    /// Applied below it, this member is catching up.
    commit_hint: u64,
    snapshot_index: u64,
    leader_seen: (u64, u64),
    /// Proposals made while the group knew no leader, proposed once it knows one.
    waiting: Vec<(Instant, bytes::Bytes, Option<Proposed>)>,
    /// The entries below a snapshot being installed are being fetched ([`crate::catch_up`]):
    /// the group is paused here, neither stepping, ticking nor voting. Holds the snapshot's
    /// ready, which goes on once they are in; `None` when the install resumed after a restart.
    fetching: Option<Option<raft::Ready>>,
    /// The leader's node went down and this member stands in its place
    /// ([`elect_without`]): it stands again each tick while no leader is known and that
    /// node is still down, since a voter that has not heard of the loss yet refuses it.
    standing_for: Option<u64>,
    commit_timer: commit_latency::CommitTimer,
}

impl Group {
    /// Something happened: tick again, and count quiet from now.
    fn wake(&mut self) {
        self.asleep = false;
        self.quiet_ticks = 0;
    }
}

struct Runner {
    /// Where the loop waits: its inputs' doorbell and the peers' raft links.
    links: RaftLinks,
    /// Asks the WAL writer to make a round durable and to tell the loop.
    syncer: Syncer,
    load: Load,
    /// Hands snapshots to the snapshot writer.
    snapshots: Sender<crate::snapshot_writer::SnapshotJob>,
    /// Starts and cancels fetches of snapshots' entries.
    catch_up: Sender<CatchUpInput>,
    /// Stopped with the loop: it holds the store.
    catch_up_thread: Option<std::thread::JoinHandle<()>>,
    /// Snapshot readies whose entries were fetched, to go on with in the next `on_ready`.
    resumed: Vec<(u64, raft::Ready)>,
    /// Rounds whose writes are not known durable yet, oldest first.
    unsynced: VecDeque<Unsynced>,
    /// The round this pass wrote, to be synced once its messages left.
    sync_wanted: Option<u64>,
    next_round: u64,
    me: u64,
    store: Arc<Store>,
    dir: PathBuf,
    send: SendRaft,
    flush: Flush,
    is_up: IsUp,
    timing: GroupsTiming,
    /// In maintenance mode: groups led here hand their leadership on ([`hand_off`]).
    draining: bool,
    /// The nodes in maintenance mode, this one included while it is.
    draining_nodes: BTreeSet<u64>,
    groups: BTreeMap<u64, Group>,
    /// Groups stepped, ticked or proposed to since their last ready: only they can have one,
    /// so a round costs what happened, not the number of (mostly sleeping) groups.
    touched: BTreeSet<u64>,
    views: Arc<Mutex<HashMap<u64, GroupView>>>,
    /// Messages for groups not opened here yet, by group, with when the first came
    /// ([`Runner::keep_early`]).
    early: HashMap<u64, (Instant, Vec<Message>)>,
}

/// How long, for how many groups and how many messages each, a node keeps what peers sent
/// for groups it has not opened yet.
const EARLY_KEPT_FOR: Duration = Duration::from_secs(2);
const EARLY_GROUPS_MAX: usize = 1024;
const EARLY_MESSAGES_MAX: usize = 64;

/// The loop's threads end with it: once its thread is joined, none of them holds the store
/// (a node's store reopened in the same process finds it unlocked).
impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.catch_up.send(CatchUpInput::Stop);
        if let Some(thread) = self.catch_up_thread.take() {
            let _ = thread.join();
        }
    }
}

impl Runner {
    fn run(mut self, inputs: Receiver<Input>) {
        let mut next_tick = Instant::now() + self.timing.tick;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            if !self.take_inputs(&inputs, wait) {
                return;
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.timing.tick;
                self.tick();
                self.close_left();
            }
            if let Err(e) = self.ready_and_send() {
                tracing::error!(error = %e, "queue groups stopped: their logs cannot be written");
                return;
            }
            self.sync_round();
            self.publish_views();
        }
    }

    /// Sleeps until an input, a peer's frame or `wait` (unless something is queued already),
    /// then takes everything that came meanwhile, so one round handles a whole burst and one
    /// sync covers it. False once the loop is to stop (a stop input, or every sender gone).
    fn take_inputs(&mut self, inputs: &Receiver<Input>, wait: Duration) -> bool {
        let Some(mut took) = self.drain(inputs) else {
            return false;
        };
        self.load.pass_began(!took);
        if !took {
            self.links.park();
            // Anything sent before the doorbell was armed would not ring it.
            match self.drain(inputs) {
                None => return false,
                Some(more) => took = more,
            }
        }
        let mut frames = Vec::new();
        self.links.wait(
            if took { Duration::ZERO } else { wait },
            |group, messages| frames.push((group, messages)),
        );
        for (group, messages) in frames {
            self.handle(Input::Peer { group, messages });
        }
        self.drain(inputs).is_some()
    }

    /// Handles every queued input: whether there was any, `None` to stop.
    fn drain(&mut self, inputs: &Receiver<Input>) -> Option<bool> {
        let mut took = false;
        loop {
            match inputs.try_recv() {
                Ok(Input::Stop) | Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
                Ok(Input::Synced(Synced(Err(e)))) => {
                    tracing::error!(error = %e, "queue groups stopped: their logs cannot be synced");
                    return None;
                }
                Ok(input) => {
                    took = true;
                    self.handle(input);
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => return Some(took),
            }
        }
    }

    fn handle(&mut self, input: Input) {
        match input {
            Input::RaftLink(link) => self.links.add(link),
            Input::Create {
                group,
                voters,
                machine,
            } => {
                if let Err(e) = self.create(group, voters, machine) {
                    tracing::error!(group, error = %e, "cannot open a queue group");
                }
                self.touched.insert(group);
                if let Some((at, messages)) = self.early.remove(&group) {
                    if at.elapsed() < EARLY_KEPT_FOR {
                        self.handle(Input::Peer { group, messages });
                    }
                }
            }
            Input::Remove { group } => self.remove(group),
            Input::TransferLeader { group, to } => {
                if let Some(g) = self.groups.get_mut(&group).filter(|g| g.fetching.is_none()) {
                    g.wake();
                    g.raw.transfer_leader(to);
                    self.touched.insert(group);
                }
            }
            Input::PeersDraining(mut nodes) => {
                if self.draining {
                    nodes.insert(self.me);
                }
                self.draining_nodes = nodes;
            }
            Input::SetDraining(draining) => {
                self.draining = draining;
                if draining {
                    self.draining_nodes.insert(self.me);
                } else {
                    self.draining_nodes.remove(&self.me);
                }
                if draining {
                    // Asleep or not: a sleeping leader must hand on too.
                    let (me, is_up, avoid) = (self.me, &self.is_up, &self.draining_nodes);
                    for (id, g) in self.groups.iter_mut().filter(|(_, g)| g.fetching.is_none()) {
                        if hand_off(g, me, is_up, avoid) {
                            g.wake();
                            self.touched.insert(*id);
                        }
                    }
                }
            }
            Input::Leave { group } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.leaving = Some(Instant::now());
                    g.wake();
                    self.touched.insert(group);
                }
            }
            Input::Retain { groups } => self.retain(&groups),
            Input::Propose { group, data, done } => {
                self.touched.insert(group);
                match self.groups.get_mut(&group) {
                    None => {
                        if let Some(done) = done {
                            done(Err(format!("no queue group {group} on this node")));
                        }
                    }
                    Some(g) => {
                        g.wake();
                        propose(g, data, done);
                    }
                }
            }
            Input::ProposeMany(entries) => {
                for (group, data) in entries {
                    self.touched.insert(group);
                    if let Some(g) = self.groups.get_mut(&group) {
                        g.wake();
                        propose(g, data, None);
                    }
                }
            }
            Input::Peer { group, messages } => {
                self.touched.insert(group);
                if !self.groups.contains_key(&group) {
                    self.keep_early(group, messages);
                    return;
                }
                if let Some(g) = self.groups.get_mut(&group).filter(|g| g.fetching.is_none()) {
                    if g.leaving.is_some() {
                        g.leaving = Some(Instant::now());
                    }
                    if messages.iter().all(is_heartbeat) {
                        g.asleep = false;
                    } else {
                        g.wake();
                    }
                    for m in messages {
                        match m.get_msg_type() {
                            MessageType::MsgAppend => g.commit_hint = g.commit_hint.max(m.commit),
                            MessageType::MsgSnapshot => {
                                let index = m.get_snapshot().get_metadata().index;
                                g.commit_hint = g.commit_hint.max(index);
                            }
                            _ => {}
                        }
                        let _ = g.raw.step(m);
                    }
                }
            }
            Input::SetVoters { group, voters } => {
                if let Some(g) = self.groups.get_mut(&group) {
                    g.wanted = voters;
                    g.wake();
                    change_voters(g);
                    self.touched.insert(group);
                }
            }
            Input::Synced(Synced(Ok(round))) => self.synced(round),
            // Stopped in `run`, which checks for it before handing inputs here.
            Input::Synced(Synced(Err(_))) => {}
            Input::SnapshotWritten(written) => self.snapshot_written(written),
            Input::Fetched { group } => self.fetched(group),
            Input::PeerDown(peer) => {
                let me = self.me;
                for (id, g) in self.groups.iter_mut().filter(|(_, g)| g.fetching.is_none()) {
                    if g.voters.contains(&peer) {
                        g.wake();
                        if g.raw.raft.leader_id == peer {
                            elect_without(g, me, peer, &self.draining_nodes);
                        }
                        self.touched.insert(*id);
                    }
                }
            }
            Input::Stop => {}
        }
    }

    /// Keeps what a peer sent for a group this node has not opened yet: a new queue's first
    /// member stands at once, and its vote requests reach the others before they applied
    /// the declare. Dropped, they would cost the queue an election timeout before its first
    /// leader. Bounded in groups and age: a group that never opens here costs nothing.
    fn keep_early(&mut self, group: u64, messages: Vec<Message>) {
        self.early
            .retain(|_, (at, _)| at.elapsed() < EARLY_KEPT_FOR);
        if self.early.len() >= EARLY_GROUPS_MAX && !self.early.contains_key(&group) {
            return;
        }
        let (_, kept) = self
            .early
            .entry(group)
            .or_insert_with(|| (Instant::now(), Vec::new()));
        if kept.len() + messages.len() <= EARLY_MESSAGES_MAX {
            kept.extend(messages);
        }
    }

    fn remove(&mut self, group: u64) {
        if let Some(mut g) = self.groups.remove(&group) {
            let _ = self.catch_up.send(CatchUpInput::Cancel(group));
            g.machine.removed();
            g.raw.store().snapshot_file().close();
            let _ = self.store.delete_log(group);
            let _ = std::fs::remove_dir_all(self.group_dir(group));
            self.views.lock().expect("views lock").remove(&group);
        }
    }

    /// See [`Input::Retain`].
    fn retain(&mut self, keep: &std::collections::HashSet<u64>) {
        for (id, g) in self.groups.iter_mut() {
            if !keep.contains(id) && g.leaving.is_none() {
                g.leaving = Some(Instant::now());
                g.wake();
                self.touched.insert(*id);
            }
        }
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let closed: Vec<u64> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("group-")?.parse().ok())
            .filter(|id| !keep.contains(id) && !self.groups.contains_key(id))
            .collect();
        for group in closed {
            tracing::info!(
                group,
                "a queue group this node no longer holds a replica of goes"
            );
            let _ = self.store.delete_log(group);
            let _ = std::fs::remove_dir_all(self.group_dir(group));
        }
    }

    /// A snapshot is on disk (or could not be written): it becomes the group's latest and the
    /// log behind it goes.
    fn snapshot_written(&mut self, written: crate::snapshot_writer::SnapshotWritten) {
        let job = written.job;
        let Some(g) = self.groups.get_mut(&job.group) else {
            return;
        };
        g.snapshot_writing = false;
        let saved = match written.result {
            Ok(true) => g.raw.store().snapshot_saved(&job.snapshot, job.upto),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = saved {
            // The previous snapshot and the log after it stand; the next snapshot tries again.
            tracing::error!(group = job.group, error = %e, "a queue group's snapshot was not saved");
        }
    }

    /// Members that left their group's membership ([`Input::Leave`]) close once the group's
    /// voters no longer name them, or once nobody has spoken to them for [`LEAVE_QUIET`] (a
    /// member removed may never hear that its removal committed).
    fn close_left(&mut self) {
        let me = self.me;
        let gone: Vec<u64> = self
            .groups
            .iter()
            .filter(|(_, g)| {
                g.leaving.is_some_and(|heard| {
                    !g.voters.contains(&me)
                        || (g.raw.raft.state != StateRole::Leader && heard.elapsed() >= LEAVE_QUIET)
                })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.remove(id);
        }
    }

    fn group_dir(&self, group: u64) -> PathBuf {
        self.dir.join(format!("group-{group}"))
    }

    fn create(
        &mut self,
        group: u64,
        voters: Vec<u64>,
        mut machine: Box<dyn Machine>,
    ) -> Result<(), String> {
        if let Some(g) = self.groups.get_mut(&group) {
            // Made a member again while leaving (removed and added back while it was away).
            g.leaving = None;
            return Ok(());
        }
        let fresh = self.store.hard_state(group).is_none() && self.store.log_info(group).is_none();
        let log = RaftLog::open(self.store.clone(), group, &self.group_dir(group), &voters)?
            .carrying_entries(self.timing.catch_up_chunk_bytes);
        let resumed = log.restoring();
        let snapshot = log.latest_snapshot();
        let snapshot_index = snapshot.get_metadata().index;
        if snapshot_index > 0 {
            machine.restore(&snapshot.data);
        }
        let config = raft::Config {
            id: self.me,
            election_tick: self.timing.election_ticks,
            heartbeat_tick: self.timing.heartbeat_ticks,
            applied: snapshot_index,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            // A round's proposals leave in one append per follower rather than one each:
            // one answer to step, not hundreds (the follower case's CPU is these messages).
            batch_append: true,
            ..Default::default()
        };
        config.validate().map_err(|e| e.to_string())?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&config, log, &logger).map_err(|e| e.to_string())?;
        // The first member of a new group is where the queue was placed: it stands at once,
        // so it leads unless another member was quicker (leadership may move later anyway).
        if fresh && voters.first() == Some(&self.me) {
            let _ = raw.campaign();
        }
        let current = current_voters(&raw);
        let fetching = resumed.map(|r| {
            tracing::info!(
                group,
                "fetching again the entries below a snapshot a restart interrupted"
            );
            fetch(&self.catch_up, self.me, group, &r, 0);
            None
        });
        self.groups.insert(
            group,
            Group {
                raw,
                machine,
                // No opinion until the queue's members change ([`Input::SetVoters`]).
                wanted: Vec::new(),
                snapshot_due: false,
                snapshot_writing: false,
                leaving: None,
                voters: current,
                asleep: false,
                quiet_ticks: 0,
                applied: snapshot_index,
                handed_out: snapshot_index,
                snapshot_index,
                commit_hint: 0,
                leader_seen: (0, 0),
                waiting: Vec::new(),
                fetching,
                standing_for: None,
                commit_timer: Default::default(),
            },
        );
        Ok(())
    }

    /// The catch-up thread fetched a group's snapshot entries: its install goes on.
    fn fetched(&mut self, group: u64) {
        let Some(g) = self.groups.get_mut(&group) else {
            return;
        };
        match g.fetching.take() {
            Some(Some(ready)) => self.resumed.push((group, ready)),
            Some(None) => {
                // Resumed after a restart: the snapshot is the log's already; it goes to disk.
                if let Err(e) = g.raw.store().finish_restore() {
                    tracing::error!(group, error = %e, "a fetched snapshot was not installed");
                }
            }
            None => {}
        }
        g.wake();
        self.touched.insert(group);
    }

    /// Ticks the awake groups; puts to sleep those quiet long enough.
    fn tick(&mut self) {
        let is_up = &self.is_up;
        for (id, g) in self
            .groups
            .iter_mut()
            .filter(|(_, g)| !g.asleep && g.fetching.is_none())
        {
            self.touched.insert(*id);
            g.raw.tick();
            stand_again(g, is_up);
            if self.draining {
                hand_off(g, self.me, is_up, &self.draining_nodes);
            }
            propose_waiting(g);
            change_voters(g);
            g.quiet_ticks += 1;
            if g.quiet_ticks >= self.timing.sleep_ticks && may_sleep(g, is_up) {
                g.asleep = true;
            }
        }
    }

    fn on_ready(&mut self) -> Result<(), String> {
        let resumed = std::mem::take(&mut self.resumed);
        let ready: Vec<u64> = self
            .touched
            .iter()
            .filter(|id| {
                self.groups
                    .get(id)
                    .is_some_and(|g| g.fetching.is_none() && g.raw.has_ready())
            })
            .copied()
            .collect();
        if ready.is_empty() && resumed.is_empty() {
            return Ok(());
        }
        let mut held = Vec::new();
        let mut wrote = false;
        for (id, rd) in resumed {
            self.handle_ready(id, rd, true, &mut held, &mut wrote)?;
        }
        for id in ready {
            let rd = self.groups.get_mut(&id).expect("listed above").raw.ready();
            self.handle_ready(id, rd, false, &mut held, &mut wrote)?;
        }
        if wrote {
            // One sync for every group's writes of this round (and of any round before it
            // whose sync has not begun).
            let round = self.next_round;
            self.next_round += 1;
            self.unsynced.push_back(Unsynced {
                round,
                readies: held,
            });
            self.sync_wanted = Some(round);
        } else if let Some(last) = self.unsynced.back_mut() {
            // Nothing of its own to sync, but raft-rs's order holds: after what is in flight.
            last.readies.extend(held);
        } else {
            for (id, number, messages) in held {
                self.persisted(id, number, messages);
            }
        }
        Ok(())
    }

    /// Handles one group's ready: `resumed` for a snapshot's ready held while its entries
    /// were fetched.
    fn handle_ready(
        &mut self,
        id: u64,
        mut rd: raft::Ready,
        resumed: bool,
        held: &mut Vec<(u64, u64, Vec<Message>)>,
        wrote: &mut bool,
    ) -> Result<(), String> {
        // A group removed since its entries were fetched.
        let Some(g) = self.groups.get_mut(&id) else {
            return Ok(());
        };
        if !rd.entries().is_empty() || !rd.committed_entries().is_empty() {
            g.wake();
        }
        send(&self.send, id, rd.take_messages(), &mut g.raw);
        if !rd.snapshot().is_empty() {
            let snapshot = rd.snapshot().clone();
            if !resumed {
                if let Some(r) = g.raw.store().begin_restore(&snapshot)? {
                    // Paused until the entries are in: raft-rs waits for this ready.
                    fetch(&self.catch_up, self.me, id, &r, g.raw.raft.leader_id);
                    g.fetching = Some(Some(rd));
                    return Ok(());
                }
            }
            let machine = g.raw.mut_store().install_snapshot(&snapshot)?;
            g.machine.restore(&machine);
            g.applied = snapshot.get_metadata().index;
            g.handed_out = g.applied;
            g.snapshot_index = g.applied;
        }
        if g.raw.raft.state == StateRole::Leader {
            if let Some(last) = rd.entries().last() {
                g.commit_timer.appended(last.index, Instant::now());
            }
        }
        apply_handed_out(g, rd.take_committed_entries());
        // A changed commit index alone need not be durable now (raft-rs: must_sync).
        *wrote |= rd.must_sync();
        g.raw.store().append(rd.entries())?;
        if let Some(hs) = rd.hs() {
            g.raw.store().set_hard_state(hs)?;
        }
        if rd.snapshot().is_empty() {
            // What a majority has, this member applies without waiting for its own disk.
            apply_ahead(g, self.timing.snapshot_entries);
            let (forwarded, after_sync) = proposals_apart(rd.take_persisted_messages());
            send(&self.send, id, forwarded, &mut g.raw);
            held.push((id, rd.number(), after_sync));
            g.raw.advance_append_async(rd);
        } else {
            // raft-rs counts an installed snapshot applied only once it is persisted, and a
            // member campaigning before then reads the entries from its old applied index on,
            // which the snapshot released: raft-rs panics. Snapshots are rare: this one is
            // made durable now rather than by the round's sync.
            self.store.sync().map_err(|e| e.to_string())?;
            let (number, messages) = (rd.number(), rd.take_persisted_messages());
            g.raw.advance_append_async(rd);
            g.raw.on_persist_ready(number);
            send(&self.send, id, messages, &mut g.raw);
        }
        advance_apply(g);
        // raft-rs reads the entries it hands out later from the cache, applied early or not.
        g.raw.store().applied_to(g.raw.raft.raft_log.applied);
        g.machine.flush(g.applied >= g.commit_hint);
        let leader = (g.raw.raft.leader_id, g.raw.raft.term);
        if leader != g.leader_seen {
            g.leader_seen = leader;
            g.commit_timer.forget_rounds();
            g.machine.leader_changed(leader.0, leader.1);
            propose_waiting(g);
        }
        if let Some(job) = maybe_snapshot(id, g, self.timing.snapshot_entries)? {
            self.snapshots
                .send(job)
                .map_err(|_| "the snapshot writer thread is gone".to_string())?;
        }
        Ok(())
    }

    /// Asks for the round `on_ready` wrote to be made durable, after its messages left (a
    /// leader's appends reach the followers while it syncs).
    fn sync_round(&mut self) {
        if let Some(round) = self.sync_wanted.take() {
            self.syncer.ask(round, self.load.light());
        }
    }

    /// Handles every ready group, then sends the pass's messages (one write per peer) and its
    /// deliveries: at a low rate written through to the clients' sockets on this thread
    /// (`warren_broker::outbox`); under load the connections' writer tasks batch them.
    fn ready_and_send(&mut self) -> Result<(), String> {
        let light = self.load.light();
        let deliveries = light.then(warren_broker::outbox::WriteThrough::begin);
        self.on_ready()?;
        (self.flush)();
        drop(deliveries);
        Ok(())
    }

    /// The WAL is durable through `round`: what those rounds held back goes out.
    fn synced(&mut self, round: u64) {
        while self.unsynced.front().is_some_and(|u| u.round <= round) {
            let done = self.unsynced.pop_front().expect("checked");
            for (id, number, messages) in done.readies {
                self.persisted(id, number, messages);
            }
        }
    }

    fn persisted(&mut self, id: u64, number: u64, messages: Vec<Message>) {
        let Some(g) = self.groups.get_mut(&id) else {
            return;
        };
        g.raw.on_persist_ready(number);
        advance_apply(g);
        send(&self.send, id, messages, &mut g.raw);
        self.touched.insert(id);
    }

    fn publish_views(&mut self) {
        let mut views = self.views.lock().expect("views lock");
        let touched = std::mem::take(&mut self.touched);
        for id in touched {
            let Some(g) = self.groups.get(&id) else {
                continue;
            };
            // A ready may follow an advance: look again next round.
            if g.raw.has_ready() {
                self.touched.insert(id);
            }
            let view = GroupView {
                leader: g.raw.raft.leader_id,
                term: g.raw.raft.term,
                is_leader: g.raw.raft.state == StateRole::Leader,
                asleep: g.asleep,
                applied: g.applied,
                voters: g.voters.clone(),
                commit: g.raw.raft.raft_log.committed,
                written: g.raw.raft.raft_log.persisted,
                snapshot_index: g.snapshot_index,
                commit_latency: g.commit_timer.latest(),
            };
            if views.get(&id) != Some(&view) {
                views.insert(id, view);
            }
        }
    }
}

/// Asks the catch-up thread for the entries below `r`'s snapshot, from `sender` first (0:
/// none), then the snapshot's other voters.
fn fetch(
    catch_up: &Sender<CatchUpInput>,
    me: u64,
    group: u64,
    r: &crate::raft_log::Restoring,
    sender: u64,
) {
    let meta = r.snapshot.get_metadata();
    let mut sources: Vec<u64> = vec![sender];
    for v in meta.get_conf_state().get_voters() {
        if !sources.contains(v) {
            sources.push(*v);
        }
    }
    sources.retain(|n| *n != 0 && *n != me);
    let _ = catch_up.send(CatchUpInput::Start(FetchJob {
        group,
        first: r.first,
        to: meta.index,
        to_term: meta.term,
        sources,
    }));
}

fn send(send: &SendRaft, group: u64, messages: Vec<Message>, raw: &mut RawNode<RaftLog>) {
    if messages.is_empty() {
        return;
    }
    let mut by_peer: BTreeMap<u64, Vec<Message>> = BTreeMap::new();
    for m in messages {
        by_peer.entry(m.to).or_default().push(m);
    }
    for (to, batch) in by_peer {
        let snapshot = batch
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgSnapshot);
        let sent = send(to, group, &batch);
        if !sent {
            raw.report_unreachable(to);
        }
        // Handed to the transport is as far as the leader follows it: the follower's answer
        // (or its silence, then a probe and another snapshot) says the rest. Unreported, a
        // snapshot the follower refused would pause its progress for good.
        if snapshot {
            let status = if sent {
                raft::SnapshotStatus::Finish
            } else {
                raft::SnapshotStatus::Failure
            };
            raw.report_snapshot(to, status);
        }
    }
}

/// Takes a snapshot when one is due: returned for the writer, or, when a membership change
/// asked for it (a member added must be sent one that names it), saved at once.
fn maybe_snapshot(
    id: u64,
    g: &mut Group,
    every: u64,
) -> Result<Option<crate::snapshot_writer::SnapshotJob>, String> {
    let due = g.snapshot_due;
    if (g.applied < g.snapshot_index + every || g.snapshot_writing) && !due
        || !snapshot_may_cover(g)
    {
        return Ok(None);
    }
    g.snapshot_due = false;
    let index = g.applied;
    let term = g.raw.store().term_of(index)?;
    let mut snapshot = Snapshot {
        data: g.machine.snapshot().into(),
        ..Default::default()
    };
    let meta = snapshot.mut_metadata();
    meta.index = index;
    meta.term = term;
    meta.set_conf_state(g.raw.raft.prs().conf().to_conf_state());
    let upto = g.machine.live_from().saturating_sub(1);
    g.snapshot_index = index;
    if due {
        g.raw.mut_store().save_snapshot_releasing(&snapshot, upto)?;
        return Ok(None);
    }
    g.snapshot_writing = true;
    Ok(Some(crate::snapshot_writer::SnapshotJob {
        group: id,
        snapshot,
        upto,
        file: g.raw.store().snapshot_file(),
    }))
}
