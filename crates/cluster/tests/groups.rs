//! Queue groups on three nodes in one process: each node has its own store (a real WAL on
//! disk) and its own loop; a router stands in for the transport and can cut a node off. Every
//! wait polls to a deadline; no verdict depends on how fast the machine is.

use raft::eraftpb::{Message, MessageType};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warren_cluster::catch_up::CatchUpMessage;
use warren_cluster::groups::{GroupsTiming, Input, Links, Machine, QueueGroups};
use warren_store::{Config, NoopListener, Store};

/// Applied entries: (index, data).
type Applied = Vec<(u64, Vec<u8>)>;

/// A machine that records what it applies, shared with the test, and at each flush how many
/// entries it had applied and whether it was caught up.
#[derive(Clone, Default)]
struct Recorder {
    applied: Arc<Mutex<Applied>>,
    flushes: Arc<Mutex<Vec<(usize, bool)>>>,
    /// Snapshots restored from a leader.
    restores: Arc<AtomicU64>,
    /// Keeps every entry it applied live (as a queue whose messages are all waiting): its
    /// snapshots release nothing.
    keeps_all: bool,
    /// Keeps this many of the last entries it applied live (a queue with a short backlog).
    keeps_recent: u64,
}

impl Machine for Recorder {
    fn apply(&mut self, index: u64, data: bytes::Bytes) {
        self.applied.lock().unwrap().push((index, data.to_vec()));
    }
    fn flush(&mut self, caught_up: bool) {
        let n = self.applied.lock().unwrap().len();
        self.flushes.lock().unwrap().push((n, caught_up));
    }
    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&*self.applied.lock().unwrap()).unwrap()
    }
    fn restore(&mut self, data: &[u8]) {
        self.restores.fetch_add(1, Ordering::Relaxed);
        *self.applied.lock().unwrap() = serde_json::from_slice(data).unwrap();
    }
    fn live_from(&self) -> u64 {
        let last = self.applied.lock().unwrap().last().map_or(0, |(i, _)| *i);
        if self.keeps_all {
            1
        } else if self.keeps_recent > 0 {
            last.saturating_sub(self.keeps_recent - 1).max(1)
        } else {
            u64::MAX
        }
    }
}

impl Recorder {
    fn payloads(&self) -> Vec<Vec<u8>> {
        self.applied
            .lock()
            .unwrap()
            .iter()
            .map(|(_, d)| d.clone())
            .collect()
    }
}

/// Delivers groups' messages between the nodes' loops; a node in `cut` neither sends nor
/// receives. Counts what it carries.
#[derive(Default)]
struct Router {
    nodes: Mutex<Vec<Option<QueueGroups>>>,
    cut: Mutex<HashSet<u64>>,
    carried: AtomicU64,
    /// Chunks of entries fetched below a snapshot, carried.
    chunks: AtomicU64,
    /// Chunks are dropped (a fetch stalls).
    drop_chunks: std::sync::atomic::AtomicBool,
    /// Every message carried that holds entries: (from, type, entries).
    with_entries: Mutex<Vec<(u64, MessageType, usize)>>,
}

impl Router {
    fn up(&self, id: u64) -> bool {
        !self.cut.lock().unwrap().contains(&id)
    }

    fn route(&self, from: u64, to: u64, group: u64, messages: &[Message]) -> bool {
        if !self.up(from) || !self.up(to) {
            return false;
        }
        let nodes = self.nodes.lock().unwrap();
        let Some(Some(node)) = nodes.get(to as usize - 1) else {
            return false;
        };
        self.carried.fetch_add(1, Ordering::Relaxed);
        self.with_entries.lock().unwrap().extend(
            messages
                .iter()
                .filter(|m| !m.get_entries().is_empty())
                .map(|m| (from, m.get_msg_type(), m.get_entries().len())),
        );
        node.send(Input::Peer {
            group,
            messages: messages.to_vec(),
        });
        true
    }

    fn route_catch_up(&self, from: u64, to: u64, message: &CatchUpMessage) -> bool {
        if !self.up(from) || !self.up(to) {
            return false;
        }
        if matches!(message, CatchUpMessage::Chunk { .. }) {
            if self.drop_chunks.load(Ordering::Relaxed) {
                return true;
            }
            self.chunks.fetch_add(1, Ordering::Relaxed);
        }
        let nodes = self.nodes.lock().unwrap();
        let Some(Some(node)) = nodes.get(to as usize - 1) else {
            return false;
        };
        node.catch_up_received(from, message.clone());
        true
    }
}

struct Node {
    id: u64,
    dir: PathBuf,
    store: Arc<Store>,
    /// The node's storage engine's fault switches.
    faults: Arc<warren_store::Faults>,
    groups: QueueGroups,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Node {
    fn stop(&mut self) {
        self.groups.send(Input::Stop);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn timing() -> GroupsTiming {
    GroupsTiming {
        tick: Duration::from_millis(10),
        election_ticks: 10,
        heartbeat_ticks: 2,
        sleep_ticks: 5,
        snapshot_entries: 50,
        catch_up_chunk_bytes: 4 << 20,
    }
}

fn temp_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "warren-groups-{}-{name}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn start_node(id: u64, dir: PathBuf, router: &Arc<Router>) -> Node {
    start_node_timed(id, dir, router, timing())
}

fn start_node_timed(id: u64, dir: PathBuf, router: &Arc<Router>, timing: GroupsTiming) -> Node {
    let config = Config::new(dir.join("store"));
    let faults = config.faults.clone();
    let (store, _) = Store::open(config, Arc::new(NoopListener)).unwrap();
    let store = Arc::new(store);
    let (r1, r2, r3) = (router.clone(), router.clone(), router.clone());
    let (groups, thread) = QueueGroups::start(
        id,
        store.clone(),
        &dir.join("groups"),
        Links {
            send: Arc::new(move |to, group, messages: &[Message]| {
                r1.route(id, to, group, messages)
            }),
            send_catch_up: Arc::new(move |to, message: &CatchUpMessage| {
                r3.route_catch_up(id, to, message)
            }),
            // The router hands messages over as they are sent: nothing waits for a flush.
            flush: Arc::new(|| {}),
            is_up: Arc::new(move |peer| r2.up(peer)),
        },
        timing,
    )
    .unwrap();
    let mut nodes = router.nodes.lock().unwrap();
    if nodes.len() < id as usize {
        nodes.resize(id as usize, None);
    }
    nodes[id as usize - 1] = Some(groups.clone());
    Node {
        id,
        dir,
        store,
        faults,
        groups,
        thread: Some(thread),
    }
}

fn cluster(name: &str) -> (Arc<Router>, Vec<Node>) {
    let router = Arc::new(Router::default());
    let nodes = (1..=3)
        .map(|id| start_node(id, temp_dir(&format!("{name}-n{id}")), &router))
        .collect();
    (router, nodes)
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Opens `group` on every node with a recorder each.
fn open(nodes: &[Node], group: u64) -> Vec<Recorder> {
    open_with(nodes, group, Recorder::default)
}

/// Opens `group` on every node (founded by nodes 1 to 3) with a recorder `make` makes.
fn open_with(nodes: &[Node], group: u64, make: impl Fn() -> Recorder) -> Vec<Recorder> {
    nodes
        .iter()
        .map(|n| {
            let r = make();
            n.groups.send(Input::Create {
                group,
                voters: vec![1, 2, 3],
                machine: Box::new(r.clone()),
            });
            r
        })
        .collect()
}

fn leader(nodes: &[Node], group: u64) -> u64 {
    eventually("a leader", || {
        nodes
            .iter()
            .filter_map(|n| n.groups.view(group))
            .find(|v| v.is_leader)
            .map(|v| v.leader)
    })
}

fn propose(node: &Node, group: u64, data: &[u8]) {
    node.groups.send(Input::Propose {
        group,
        data: data.to_vec().into(),
        done: None,
    });
}

fn wait_applied(recorders: &[&Recorder], expected: &[Vec<u8>]) {
    eventually("every member applied the entries", || {
        recorders
            .iter()
            .all(|r| r.payloads() == expected)
            .then_some(())
    });
}

/// The recorders of every node but `except`, in node order.
fn recorders_except<'a>(nodes: &[Node], recs: &'a [Recorder], except: u64) -> Vec<&'a Recorder> {
    nodes
        .iter()
        .zip(recs)
        .filter(|(n, _)| n.id != except)
        .map(|(_, r)| r)
        .collect()
}

fn cleanup(mut nodes: Vec<Node>) {
    for n in &mut nodes {
        n.stop();
        let _ = std::fs::remove_dir_all(&n.dir);
    }
}

/// Cuts `old` (the group's leader) off and reports it down to the others, as the failure
/// detector does; a new leader among them applies "after" behind "before". Returns it.
fn cut_off_and_go_on(
    router: &Router,
    nodes: &[Node],
    rec: &[Recorder],
    group: u64,
    old: u64,
) -> u64 {
    router.cut.lock().unwrap().insert(old);
    for n in nodes.iter().filter(|n| n.id != old) {
        n.groups.send(Input::PeerDown(old));
    }
    let new = eventually("a new leader among the others", || {
        nodes
            .iter()
            .filter(|n| n.id != old)
            .filter_map(|n| n.groups.view(group))
            .find(|v| v.is_leader)
            .map(|v| v.leader)
    });
    assert_ne!(new, old);
    propose(&nodes[new as usize - 1], group, b"after");
    let others = recorders_except(nodes, rec, old);
    wait_applied(&others, &[b"before".to_vec(), b"after".to_vec()]);
    new
}

#[test]
fn entries_proposed_on_any_member_are_applied_in_one_order_everywhere() {
    let (_router, nodes) = cluster("order");
    let rec = open(&nodes, 7);
    let l = leader(&nodes, 7);
    let follower = nodes.iter().find(|n| n.id != l).unwrap();
    let mut expected = Vec::new();
    for i in 0..20u8 {
        // Half through a follower: raft forwards them to the leader.
        let via = if i % 2 == 0 {
            &nodes[l as usize - 1]
        } else {
            follower
        };
        propose(via, 7, &[i]);
        expected.push(vec![i]);
        // Wait for each, so the order is the proposal order.
        wait_applied(&rec.iter().collect::<Vec<_>>(), &expected);
    }
    cleanup(nodes);
}

#[test]
fn idle_groups_sleep_and_send_nothing_until_a_proposal_wakes_them() {
    let (router, nodes) = cluster("sleep");
    let groups: Vec<u64> = (1..=50).map(|g| g * 2 + 1).collect();
    let recs: Vec<Vec<Recorder>> = groups.iter().map(|g| open(&nodes, *g)).collect();
    for g in &groups {
        leader(&nodes, *g);
    }
    eventually("every group asleep on every node", || {
        nodes
            .iter()
            .all(|n| n.groups.awake() == 0 && groups.iter().all(|g| n.groups.view(*g).is_some()))
            .then_some(())
    });
    let before = router.carried.load(Ordering::Relaxed);
    // Long enough for dozens of heartbeats of 50 groups if anything still ticked.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        router.carried.load(Ordering::Relaxed),
        before,
        "asleep: no messages"
    );
    let l = leader(&nodes, groups[0]);
    propose(&nodes[l as usize - 1], groups[0], b"wake");
    wait_applied(&recs[0].iter().collect::<Vec<_>>(), &[b"wake".to_vec()]);
    eventually("back asleep", || {
        nodes.iter().all(|n| n.groups.awake() == 0).then_some(())
    });
    cleanup(nodes);
}

#[test]
fn when_the_leaders_node_is_cut_off_the_others_elect_a_leader_and_go_on() {
    let (router, nodes) = cluster("failover");
    let rec = open(&nodes, 9);
    let old = leader(&nodes, 9);
    propose(&nodes[old as usize - 1], 9, b"before");
    wait_applied(&rec.iter().collect::<Vec<_>>(), &[b"before".to_vec()]);
    eventually("asleep", || {
        nodes.iter().all(|n| n.groups.awake() == 0).then_some(())
    });
    // The failure detector tells the others; the sleeping followers wake and stand.
    let new = cut_off_and_go_on(&router, &nodes, &rec, 9, old);
    // Back, the old leader learns what it missed.
    router.cut.lock().unwrap().remove(&old);
    propose(&nodes[new as usize - 1], 9, b"healed");
    wait_applied(
        &rec.iter().collect::<Vec<_>>(),
        &[b"before".to_vec(), b"after".to_vec(), b"healed".to_vec()],
    );
    cleanup(nodes);
}

#[test]
fn a_leaders_node_reported_down_is_replaced_at_once_not_after_an_election_timeout() {
    // Elections by timeout take 10 to 20 minutes here: far past the test's deadline, so only
    // the failure detector's report can bring a new leader in time.
    let slow = GroupsTiming {
        tick: Duration::from_millis(10),
        election_ticks: 60_000,
        ..timing()
    };
    let router = Arc::new(Router::default());
    let nodes: Vec<Node> = (1..=3)
        .map(|id| {
            start_node_timed(
                id,
                temp_dir(&format!("peer-down-n{id}")),
                &router,
                slow.clone(),
            )
        })
        .collect();
    let rec: Vec<Recorder> = (0..3).map(|_| Recorder::default()).collect();
    for (n, r) in nodes.iter().zip(&rec) {
        n.groups.send(Input::Create {
            group: 11,
            voters: vec![1, 2, 3],
            machine: Box::new(r.clone()),
        });
    }
    // Node 1 founded it and stands at once.
    let old = leader(&nodes, 11);
    propose(&nodes[old as usize - 1], 11, b"before");
    wait_applied(&rec.iter().collect::<Vec<_>>(), &[b"before".to_vec()]);
    cut_off_and_go_on(&router, &nodes, &rec, 11, old);
    cleanup(nodes);
}

#[test]
fn a_restarted_member_replays_its_log_and_snapshot_and_catches_up() {
    let (router, mut nodes) = cluster("restart");
    let rec = open(&nodes, 11);
    let l = leader(&nodes, 11);
    let mut expected = Vec::new();
    // More than a snapshot's worth (50 entries), so the restart starts from a snapshot.
    for i in 0..120u32 {
        propose(&nodes[l as usize - 1], 11, &i.to_le_bytes());
        expected.push(i.to_le_bytes().to_vec());
    }
    wait_applied(&rec.iter().collect::<Vec<_>>(), &expected);
    let victim = nodes.iter().position(|n| n.id != l).unwrap();
    let id = nodes[victim].id;
    let dir = nodes[victim].dir.clone();
    nodes[victim].stop();
    drop(std::mem::replace(
        &mut nodes[victim].store,
        Arc::new(
            Store::open(Config::new(temp_dir("scratch")), Arc::new(NoopListener))
                .unwrap()
                .0,
        ),
    ));
    for i in 120..130u32 {
        propose(&nodes[l as usize - 1], 11, &i.to_le_bytes());
        expected.push(i.to_le_bytes().to_vec());
    }
    nodes[victim] = start_node(id, dir, &router);
    let again = Recorder::default();
    nodes[victim].groups.send(Input::Create {
        group: 11,
        voters: vec![1, 2, 3],
        machine: Box::new(again.clone()),
    });
    wait_applied(&[&again], &expected);
    cleanup(nodes);
}

#[test]
fn one_sync_covers_the_writes_of_every_group_in_a_round() {
    let router = Arc::new(Router::default());
    let node = start_node(1, temp_dir("batch"), &router);
    let groups: Vec<u64> = (1..=40).map(|g| g * 2 + 1).collect();
    let recs: Vec<Recorder> = groups
        .iter()
        .map(|g| {
            let r = Recorder::default();
            node.groups.send(Input::Create {
                group: *g,
                voters: vec![1],
                machine: Box::new(r.clone()),
            });
            r
        })
        .collect();
    for g in &groups {
        leader(std::slice::from_ref(&node), *g);
    }
    eventually("settled", || (node.groups.awake() == 0).then_some(()));
    let before = node.groups.syncs();
    node.groups.send(Input::ProposeMany(
        groups
            .iter()
            .map(|g| (*g, bytes::Bytes::from_static(b"x")))
            .collect(),
    ));
    for r in &recs {
        wait_applied(&[r], &[b"x".to_vec()]);
    }
    let syncs = node.groups.syncs() - before;
    // One round appends all 40 entries and waits for the WAL once; never once per group.
    assert!(syncs <= 2, "{syncs} syncs for 40 groups' entries");
    cleanup(vec![node]);
}

#[test]
fn a_proposal_through_a_follower_reaches_the_leader_without_waiting_for_the_followers_disk() {
    let (_router, nodes) = cluster("forward");
    let recs = open(&nodes, 5);
    let leader_id = leader(&nodes, 5);
    let follower = nodes.iter().find(|n| n.id != leader_id).unwrap();
    let others = recorders_except(&nodes, &recs, follower.id);
    // The follower's disk takes no more writes: the entry below is its round in flight,
    // unsynced for as long as the test holds it. The other two commit it.
    follower.faults.hold_writer.store(true, Ordering::Relaxed);
    let leader_node = nodes.iter().find(|n| n.id == leader_id).unwrap();
    propose(leader_node, 5, b"a");
    wait_applied(&others, &[b"a".to_vec()]);
    // A proposal made on the follower goes to the leader now, not after that sync (raft-rs
    // holds all of a follower's messages for its ready to be durable).
    propose(follower, 5, b"b");
    wait_applied(&others, &[b"a".to_vec(), b"b".to_vec()]);
    follower.faults.hold_writer.store(false, Ordering::Relaxed);
    wait_applied(
        &recs.iter().collect::<Vec<_>>(),
        &[b"a".to_vec(), b"b".to_vec()],
    );
    cleanup(nodes);
}

#[test]
fn a_leader_whose_disk_stalls_applies_what_its_followers_made_durable() {
    let (_router, nodes) = cluster("stalled-leader");
    let recs = open(&nodes, 9);
    let leader_id = leader(&nodes, 9);
    let leader_node = &nodes[leader_id as usize - 1];
    let leader_rec = &recs[leader_id as usize - 1];
    let all: Vec<&Recorder> = recs.iter().collect();
    propose(leader_node, 9, b"first");
    let mut expected = vec![b"first".to_vec()];
    wait_applied(&all, &expected);

    // The leader's disk takes no more writes; the followers' two copies commit what follows.
    leader_node
        .faults
        .hold_writer
        .store(true, Ordering::Relaxed);
    for i in 0..10u8 {
        propose(leader_node, 9, &[i]);
        expected.push(vec![i]);
    }
    // Applied (confirmed, delivered) on the leader too, though its own log has none of it.
    wait_applied(&all, &expected);
    let view = leader_node.groups.view(9).unwrap();
    assert!(
        view.written < view.applied,
        "the leader applied {} with {} written",
        view.applied,
        view.written
    );

    // A snapshot falls due (every 50 entries here): one covering entries the leader's disk
    // does not have would outlive them in a crash. So the leader applies no further ahead.
    // One round each, so that the leader learns them committed one by one.
    let followers = recorders_except(&nodes, &recs, leader_id);
    for i in 10..70u8 {
        propose(leader_node, 9, &[i]);
        expected.push(vec![i]);
        wait_applied(&followers, &expected);
    }
    let last = followers[0].applied.lock().unwrap().last().unwrap().0;
    let view = eventually("the leader knows it all committed", || {
        leader_node.groups.view(9).filter(|v| v.commit >= last)
    });
    assert!(
        view.applied < last,
        "the leader applied {} of {last} with {} written",
        view.applied,
        view.written
    );
    assert!(view.snapshot_index <= view.written, "{view:?}");

    // Its disk back, it applies the rest and snapshots what it has written.
    leader_node
        .faults
        .hold_writer
        .store(false, Ordering::Relaxed);
    wait_applied(&[leader_rec], &expected);
    let view = eventually("a snapshot on the leader", || {
        leader_node
            .groups
            .view(9)
            .filter(|v| v.snapshot_index >= 50)
    });
    assert!(view.snapshot_index <= view.written, "{view:?}");
    cleanup(nodes);
}

/// The messages with entries of `kind` that `from` sent since `mark` (an index into the
/// router's log), as each one's entry count.
fn sent_since(router: &Router, mark: usize, from: u64, kind: MessageType) -> Vec<usize> {
    router.with_entries.lock().unwrap()[mark..]
        .iter()
        .filter(|(f, t, _)| *f == from && *t == kind)
        .map(|(_, _, n)| *n)
        .collect()
}

#[test]
fn a_rounds_proposals_travel_in_one_message_per_peer_not_one_each() {
    let (router, nodes) = cluster("coalesce");
    let recs = open(&nodes, 7);
    let leader_id = leader(&nodes, 7);
    let leader_node = nodes.iter().find(|n| n.id == leader_id).unwrap();
    let follower = nodes.iter().find(|n| n.id != leader_id).unwrap();
    let all: Vec<&Recorder> = recs.iter().collect();
    // A first entry committed everywhere: the leader now streams to both followers rather
    // than probing them one message at a time.
    propose(leader_node, 7, b"first");
    let mut expected = vec![b"first".to_vec()];
    wait_applied(&all, &expected);
    let batch = |tag: &str| -> Vec<(u64, bytes::Bytes)> {
        (0..100)
            .map(|i| (7, format!("{tag}{i}").into_bytes().into()))
            .collect()
    };

    // 100 proposals of one round on the leader: raft-rs would send each follower an append
    // per proposal; batched, one append per follower carries them.
    let mark = router.with_entries.lock().unwrap().len();
    leader_node.groups.send(Input::ProposeMany(batch("l")));
    expected.extend(batch("l").into_iter().map(|(_, d)| d.to_vec()));
    wait_applied(&all, &expected);
    let appends = sent_since(&router, mark, leader_id, MessageType::MsgAppend);
    assert_eq!(appends.iter().sum::<usize>(), 200, "{appends:?}");
    assert!(
        appends.len() <= 4,
        "100 entries took {} appends",
        appends.len()
    );

    // 100 proposals of one round on a follower: forwarded in one message, not 100.
    let mark = router.with_entries.lock().unwrap().len();
    follower.groups.send(Input::ProposeMany(batch("f")));
    expected.extend(batch("f").into_iter().map(|(_, d)| d.to_vec()));
    wait_applied(&all, &expected);
    let forwarded = sent_since(&router, mark, follower.id, MessageType::MsgPropose);
    assert_eq!(forwarded, vec![100]);
    let appends = sent_since(&router, mark, leader_id, MessageType::MsgAppend);
    assert!(
        appends.len() <= 4,
        "100 entries took {} appends",
        appends.len()
    );
    cleanup(nodes);
}

#[test]
fn a_member_back_from_a_cut_is_not_caught_up_until_it_applied_what_was_committed_meanwhile() {
    // No snapshots: the member catches up from appends (a snapshot holds no effects).
    let router = Arc::new(Router::default());
    let no_snapshots = GroupsTiming {
        snapshot_entries: 1_000_000,
        ..timing()
    };
    let nodes: Vec<Node> = (1..=3)
        .map(|id| {
            let dir = temp_dir(&format!("catch-up-n{id}"));
            start_node_timed(id, dir, &router, no_snapshots.clone())
        })
        .collect();
    let rec = open(&nodes, 11);
    let l = leader(&nodes, 11);
    let away = nodes.iter().find(|n| n.id != l).unwrap().id;
    router.cut.lock().unwrap().insert(away);
    // More than one append's worth (1 MiB): the catch-up takes several rounds.
    let mut expected = Vec::new();
    for i in 0..300u32 {
        let mut data = vec![0u8; 8 * 1024];
        data[..4].copy_from_slice(&i.to_be_bytes());
        propose(&nodes[l as usize - 1], 11, &data);
        expected.push(data);
    }
    let present = recorders_except(&nodes, &rec, away);
    wait_applied(&present, &expected);
    let back = &rec[away as usize - 1];
    let before = back.flushes.lock().unwrap().len();
    router.cut.lock().unwrap().remove(&away);
    wait_applied(&[back], &expected);
    let flushes = back.flushes.lock().unwrap()[before..].to_vec();
    assert!(
        flushes.iter().any(|(_, caught_up)| !caught_up),
        "the catch-up took more than one round: {flushes:?}"
    );
    // Rounds before the leader's first append (a heartbeat) know of nothing to catch up on;
    // once it applies entries, it is caught up only with all of them.
    for (applied, caught_up) in flushes {
        assert!(
            !caught_up || applied == 0 || applied == expected.len(),
            "caught up at {applied} of {} entries",
            expected.len()
        );
    }
    cleanup(nodes);
}

#[test]
fn a_follower_behind_the_leaders_snapshot_catches_up_from_the_entries_it_still_keeps() {
    let (router, nodes) = cluster("behind-snapshot");
    let rec = open_with(&nodes, 13, || Recorder {
        keeps_all: true,
        ..Recorder::default()
    });
    let l = leader(&nodes, 13);
    let away = nodes.iter().find(|n| n.id != l).unwrap().id;
    router.cut.lock().unwrap().insert(away);
    // Well past the snapshot interval (50): the leader snapshots, but keeps the entries.
    let expected: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_be_bytes().to_vec()).collect();
    for data in &expected {
        propose(&nodes[l as usize - 1], 13, data);
    }
    let present = recorders_except(&nodes, &rec, away);
    wait_applied(&present, &expected);
    router.cut.lock().unwrap().remove(&away);
    let back = &rec[away as usize - 1];
    wait_applied(&[back], &expected);
    assert_eq!(
        back.restores.load(Ordering::Relaxed),
        0,
        "caught up from entries, not from a snapshot (whose live entries it would lack)"
    );
    // The leader restarts from its snapshot and the entries after it, applied once each.
    let mut nodes = nodes;
    let victim = l as usize - 1;
    nodes[victim].stop();
    let dir = nodes[victim].dir.clone();
    // The store closes with its last handle: swap in a scratch one.
    drop(std::mem::replace(
        &mut nodes[victim].store,
        Arc::new(
            Store::open(Config::new(temp_dir("scratch")), Arc::new(NoopListener))
                .unwrap()
                .0,
        ),
    ));
    nodes[victim] = start_node(l, dir, &router);
    let again = Recorder {
        keeps_all: true,
        ..Recorder::default()
    };
    nodes[l as usize - 1].groups.send(Input::Create {
        group: 13,
        voters: vec![1, 2, 3],
        machine: Box::new(again.clone()),
    });
    wait_applied(&[&again], &expected);
    cleanup(nodes);
}

#[test]
fn proposals_made_while_a_new_group_elects_its_first_leader_keep_their_order() {
    let (_router, nodes) = cluster("first-leader");
    // Proposed in a stream from the group's creation until it has a leader, through each
    // node in turn: the member learns of the leader between two proposals, while earlier ones
    // still wait for one.
    let mut expected = Vec::new();
    let mut rec = Vec::new();
    for (group, via) in (0..9u64).map(|k| (21 + 2 * k, k as usize % 3)) {
        let r = open(&nodes, group);
        let mut sent = Vec::new();
        let start = Instant::now();
        let mut i = 0u32;
        while nodes
            .iter()
            .all(|n| n.groups.view(group).is_none_or(|v| !v.is_leader))
            || start.elapsed() < Duration::from_millis(50)
        {
            propose(&nodes[via], group, &i.to_be_bytes());
            sent.push(i.to_be_bytes().to_vec());
            i += 1;
            std::thread::sleep(Duration::from_micros(50));
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no leader elected"
            );
        }
        rec.push(r);
        expected.push(sent);
    }
    for (r, sent) in rec.iter().zip(&expected) {
        wait_applied(&r.iter().collect::<Vec<_>>(), sent);
    }
    cleanup(nodes);
}

#[test]
fn a_follower_behind_every_entry_the_leader_kept_gets_them_with_the_snapshot() {
    let (router, nodes) = cluster("carried");
    let rec = open_with(&nodes, 15, || Recorder {
        keeps_recent: 30,
        ..Recorder::default()
    });
    let l = leader(&nodes, 15);
    let away = nodes.iter().find(|n| n.id != l).unwrap().id;
    router.cut.lock().unwrap().insert(away);
    // Snapshots every 50 entries release all but the last 30: the follower, cut off from the
    // start, is behind every entry the leader keeps.
    let expected: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_be_bytes().to_vec()).collect();
    for data in &expected {
        propose(&nodes[l as usize - 1], 15, data);
    }
    let present = recorders_except(&nodes, &rec, away);
    wait_applied(&present, &expected);
    eventually("the leader's snapshot released a prefix", || {
        let info = nodes[l as usize - 1].store.log_info(15)?;
        (info.first_index > 1).then_some(())
    });
    router.cut.lock().unwrap().remove(&away);
    let back = &rec[away as usize - 1];
    wait_applied(&[back], &expected);
    assert!(
        back.restores.load(Ordering::Relaxed) >= 1,
        "caught up from a snapshot"
    );
    // The live entries below the snapshot (a queue's waiting messages' bodies) are readable
    // on the follower as on the leader.
    let store = &nodes[away as usize - 1].store;
    let applied = back.applied.lock().unwrap().clone();
    let recent = &applied[applied.len() - 30..];
    for (index, data) in recent {
        assert_eq!(
            warren_cluster::raft_log::read_entry_data(store, 15, *index).as_deref(),
            Some(data.as_slice()),
            "entry {index} on the follower"
        );
    }
    cleanup(nodes);
}

#[test]
fn a_member_added_catches_up_and_a_member_removed_no_longer_counts_for_a_majority() {
    let (router, mut nodes) = cluster("members");
    let recorder = || Recorder {
        keeps_recent: 30,
        ..Recorder::default()
    };
    let mut rec = open_with(&nodes, 17, recorder);
    let l = leader(&nodes, 17);
    let mut expected: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_be_bytes().to_vec()).collect();
    for data in &expected {
        propose(&nodes[l as usize - 1], 17, data);
    }
    wait_applied(&rec.iter().collect::<Vec<_>>(), &expected);
    // Node 4 joins: its replica opens empty and the leader adds it (the queue's members say so).
    nodes.push(start_node(4, temp_dir("members-n4"), &router));
    let r4 = recorder();
    nodes[3].groups.send(Input::Create {
        group: 17,
        voters: vec![1, 2, 3, 4],
        machine: Box::new(r4.clone()),
    });
    rec.push(r4.clone());
    for n in &nodes {
        n.groups.send(Input::SetVoters {
            group: 17,
            voters: vec![1, 2, 3, 4],
        });
    }
    wait_applied(&[&r4], &expected);
    eventually("every member sees four voters", || {
        nodes
            .iter()
            .all(|n| n.groups.view(17).is_some_and(|v| v.voters == [1, 2, 3, 4]))
            .then_some(())
    });
    // Node 1 leaves (leading or not): it stays until the others removed it, then closes.
    nodes[0].groups.send(Input::Leave { group: 17 });
    for n in &nodes {
        n.groups.send(Input::SetVoters {
            group: 17,
            voters: vec![2, 3, 4],
        });
    }
    eventually("the others see three voters", || {
        nodes[1..]
            .iter()
            .all(|n| n.groups.view(17).is_some_and(|v| v.voters == [2, 3, 4]))
            .then_some(())
    });
    eventually("node 1 closed its replica", || {
        nodes[0].groups.view(17).is_none().then_some(())
    });
    // Two of the old four cut off: with node 1 still a voter, 3 and 4 would be no majority.
    router.cut.lock().unwrap().extend([1, 2]);
    let more: Vec<Vec<u8>> = (200..220u32).map(|i| i.to_be_bytes().to_vec()).collect();
    let l = eventually("a leader among 3 and 4", || {
        nodes[2..]
            .iter()
            .find(|n| n.groups.view(17).is_some_and(|v| v.is_leader))
            .map(|n| n.id)
    });
    for data in &more {
        propose(&nodes[l as usize - 1], 17, data);
    }
    expected.extend(more);
    wait_applied(&[&rec[2], &rec[3]], &expected);
    cleanup(nodes);
}

/// A cluster whose group 19 has a follower (`away`) behind every entry its leader keeps.
struct Behind {
    router: Arc<Router>,
    nodes: Vec<Node>,
    rec: Vec<Recorder>,
    expected: Vec<Vec<u8>>,
    away: u64,
}

/// A group whose leader keeps 300 entries of 64 bytes below its snapshots, with snapshots
/// carrying at most 2 KiB of them: a follower behind them all fetches them in chunks.
fn fetching_cluster(name: &str) -> Behind {
    let router = Arc::new(Router::default());
    let small_chunks = GroupsTiming {
        catch_up_chunk_bytes: 2048,
        ..timing()
    };
    let nodes: Vec<Node> = (1..=3)
        .map(|id| {
            let dir = temp_dir(&format!("{name}-n{id}"));
            start_node_timed(id, dir, &router, small_chunks.clone())
        })
        .collect();
    let rec = open_with(&nodes, 19, || Recorder {
        keeps_recent: 300,
        ..Recorder::default()
    });
    let l = leader(&nodes, 19);
    let away = nodes.iter().find(|n| n.id != l).unwrap().id;
    router.cut.lock().unwrap().insert(away);
    let expected: Vec<Vec<u8>> = (0..600u32)
        .map(|i| {
            let mut d = i.to_be_bytes().to_vec();
            d.resize(64, i as u8);
            d
        })
        .collect();
    for data in &expected {
        propose(&nodes[l as usize - 1], 19, data);
    }
    let present = recorders_except(&nodes, &rec, away);
    wait_applied(&present, &expected);
    eventually("the leader's snapshot released a prefix", || {
        let info = nodes[l as usize - 1].store.log_info(19)?;
        (info.first_index > 1).then_some(())
    });
    Behind {
        router,
        nodes,
        rec,
        expected,
        away,
    }
}

/// The last 300 entries a member applied are readable from its own log, as a queue's
/// member reads its waiting messages' bodies.
fn assert_live_entries_readable(node: &Node, rec: &Recorder) {
    let applied = rec.applied.lock().unwrap().clone();
    for (index, data) in &applied[applied.len() - 300..] {
        assert_eq!(
            warren_cluster::raft_log::read_entry_data(&node.store, 19, *index).as_deref(),
            Some(data.as_slice()),
            "entry {index} on node {}",
            node.id
        );
    }
}

#[test]
fn a_follower_behind_more_entries_than_a_snapshot_carries_fetches_them_in_chunks() {
    let Behind {
        router,
        nodes,
        rec,
        expected,
        away,
    } = fetching_cluster("fetch");
    router.cut.lock().unwrap().remove(&away);
    let back = &rec[away as usize - 1];
    wait_applied(&[back], &expected);
    assert!(
        back.restores.load(Ordering::Relaxed) >= 1,
        "from a snapshot"
    );
    let chunks = router.chunks.load(Ordering::Relaxed);
    assert!(
        chunks >= 5,
        "300 x 64 B in chunks of 2 KiB, not at once: {chunks}"
    );
    assert_live_entries_readable(&nodes[away as usize - 1], back);
    // It takes part again: with the leader cut off, it and the other elect and go on.
    let l = leader(&nodes, 19);
    router.cut.lock().unwrap().insert(l);
    for n in nodes.iter().filter(|n| n.id != l) {
        n.groups.send(Input::PeerDown(l));
    }
    let new = eventually("a new leader", || {
        nodes
            .iter()
            .filter(|n| n.id != l)
            .filter_map(|n| n.groups.view(19))
            .find(|v| v.is_leader)
            .map(|v| v.leader)
    });
    propose(&nodes[new as usize - 1], 19, b"after");
    let mut more = expected.clone();
    more.push(b"after".to_vec());
    wait_applied(&[back], &more);
    cleanup(nodes);
}

#[test]
fn a_member_restarted_in_the_middle_of_a_fetch_fetches_again_and_catches_up() {
    let Behind {
        router,
        mut nodes,
        expected,
        away,
        ..
    } = fetching_cluster("refetch");
    router.drop_chunks.store(true, Ordering::Relaxed);
    router.cut.lock().unwrap().remove(&away);
    let victim = away as usize - 1;
    let dir = nodes[victim].dir.clone();
    let marker = dir.join("groups/group-19/restoring");
    eventually("the fetch began", || marker.exists().then_some(()));
    nodes[victim].stop();
    drop(std::mem::replace(
        &mut nodes[victim].store,
        Arc::new(
            Store::open(Config::new(temp_dir("scratch")), Arc::new(NoopListener))
                .unwrap()
                .0,
        ),
    ));
    router.drop_chunks.store(false, Ordering::Relaxed);
    let small_chunks = GroupsTiming {
        catch_up_chunk_bytes: 2048,
        ..timing()
    };
    nodes[victim] = start_node_timed(away, dir, &router, small_chunks);
    let again = Recorder {
        keeps_recent: 300,
        ..Recorder::default()
    };
    nodes[victim].groups.send(Input::Create {
        group: 19,
        voters: vec![1, 2, 3],
        machine: Box::new(again.clone()),
    });
    wait_applied(&[&again], &expected);
    // The restarted member's machine has the snapshot's state at once (it was on disk); the
    // entries below it are readable once the fetch is done and the install finished.
    eventually("the install finished", || (!marker.exists()).then_some(()));
    assert_live_entries_readable(&nodes[victim], &again);
    cleanup(nodes);
}
