//! Which quorum queue replicas this node holds: a node opens a queue's Raft group when it
//! applies the queue's declare and finds itself among the members, and closes it (deleting its
//! log) when it applies the delete. Both come from the metadata log, so every member opens the
//! same group with the same voters, at start too (replaying the log, or a snapshot, declares
//! every queue again).
//!
//! The group's state machine comes from the server (it knows the broker's queues); until the
//! server has said how to make one, replicas found while replaying wait in a list.

use crate::groups::{Input, Machine, QueueGroups};
use std::sync::Mutex;

/// A queue's group id: its log id plus one. A queue's own log id (odd) keeps what the
/// vhost stores for it; its group's log is the even id next to it.
pub fn group_id(queue_log_id: u64) -> u64 {
    queue_log_id.wrapping_add(1)
}

/// What a member needs to open its replica.
#[derive(Debug, Clone)]
pub struct QueueReplica {
    pub group: u64,
    pub vhost: String,
    pub queue: String,
    /// The members' node ids, the first leader first.
    pub voters: Vec<u64>,
}

pub type MachineFactory = Box<dyn Fn(&QueueReplica) -> Box<dyn Machine> + Send + Sync>;

#[derive(Default)]
struct Pending {
    factory: Option<MachineFactory>,
    waiting: Vec<QueueReplica>,
}

pub struct Replicas {
    groups: QueueGroups,
    pending: Mutex<Pending>,
}

impl Replicas {
    pub fn new(groups: QueueGroups) -> Replicas {
        Replicas {
            groups,
            pending: Mutex::new(Pending::default()),
        }
    }

    /// The server says how to make a queue's state machine; replicas waiting for it open.
    pub fn set_factory(&self, factory: MachineFactory) {
        let mut p = self.pending.lock().expect("replicas lock");
        for r in std::mem::take(&mut p.waiting) {
            let machine = factory(&r);
            self.create(&r, machine);
        }
        p.factory = Some(factory);
    }

    pub fn open(&self, replica: QueueReplica) {
        let mut p = self.pending.lock().expect("replicas lock");
        match &p.factory {
            Some(factory) => {
                let machine = factory(&replica);
                self.create(&replica, machine);
            }
            None => p.waiting.push(replica),
        }
    }

    /// Closes the replica of the queue whose log was `queue_log_id`, if this node has one.
    pub fn close(&self, queue_log_id: u64) {
        let group = group_id(queue_log_id);
        let mut p = self.pending.lock().expect("replicas lock");
        p.waiting.retain(|r| r.group != group);
        self.groups.send(Input::Remove { group });
    }

    /// This node left the queue's members: its replica closes once the group let it go.
    pub fn leave(&self, group: u64) {
        self.groups.send(Input::Leave { group });
    }

    /// A metadata snapshot gave this node the replicas of `groups` and no others.
    pub fn retain(&self, groups: std::collections::HashSet<u64>) {
        self.groups.send(Input::Retain { groups });
    }

    /// The other nodes in maintenance mode, for the queue groups' elections and handovers.
    pub fn set_peers_draining(&self, nodes: std::collections::BTreeSet<u64>) {
        self.groups.send(Input::PeersDraining(nodes));
    }

    /// The voters the queue's members are now: the group's leader changes Raft's to match.
    pub fn set_voters(&self, group: u64, voters: Vec<u64>) {
        self.groups.send(Input::SetVoters { group, voters });
    }

    fn create(&self, r: &QueueReplica, machine: Box<dyn Machine>) {
        self.groups.send(Input::Create {
            group: r.group,
            voters: r.voters.clone(),
            machine,
        });
    }
}
