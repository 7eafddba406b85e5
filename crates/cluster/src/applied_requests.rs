//! Which proposals the metadata group has applied, so that a proposal committed twice takes
//! effect once.
//!
//! A node proposes a topology command again when it has not seen it applied after a while:
//! the first copy may have gone to a leader that died, or found none. Both copies may commit.
//! Applying the second one late is not harmless: a client told "declared" may delete the
//! queue in between, and the late copy would bring it back. So every entry carries its
//! node's request id, and the state machine applies each (node, request) once.
//!
//! The table must stay small and be the same on every node, so it is derived from the log
//! alone. Each entry also carries its node's *floor*: the lowest request that node still
//! waited for when it proposed. Below its floor a node waits for nothing, so any entry there
//! is a copy of something applied, or of something whose client went away (such a command
//! may or may not take effect, as with any unanswered request); only applied requests at or
//! above the floor need remembering. Request ids grow across a node's restarts (they start
//! from the clock), so a restarted node's new requests are never taken for old ones.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One node's applied requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRequests {
    /// Every request below it is settled.
    pub floor: u64,
    /// Requests at or above the floor that were applied.
    pub applied: BTreeSet<u64>,
}

/// Applied requests by proposing node; part of the metadata snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedRequests {
    nodes: BTreeMap<u64, NodeRequests>,
}

impl AppliedRequests {
    /// Called for each committed entry in log order: true when it is to be applied, false
    /// for a copy of one already settled.
    pub fn admit(&mut self, origin: u64, request: u64, floor: u64) -> bool {
        let node = self.nodes.entry(origin).or_default();
        if floor > node.floor {
            node.floor = floor;
            node.applied = node.applied.split_off(&floor);
        }
        if request < node.floor {
            return false;
        }
        node.applied.insert(request)
    }

    /// The highest request of `origin` seen applied: a node numbers its new requests above
    /// it, in case its clock went back across a restart.
    pub fn highest(&self, origin: u64) -> u64 {
        self.nodes
            .get(&origin)
            .map_or(0, |n| n.applied.last().copied().unwrap_or(0).max(n.floor))
    }

    /// A forgotten node proposes nothing any more.
    pub fn forget(&mut self, origin: u64) {
        self.nodes.remove(&origin);
    }
}

/// Where a node starts numbering its requests: the clock in microseconds, so that ids grow
/// across restarts without storing a counter.
pub fn first_request_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_copy_of_a_request_is_not_applied() {
        let mut t = AppliedRequests::default();
        assert!(t.admit(1, 10, 10));
        assert!(!t.admit(1, 10, 10));
    }

    #[test]
    fn a_late_copy_below_the_floor_is_not_applied() {
        let mut t = AppliedRequests::default();
        assert!(t.admit(1, 10, 10));
        assert!(t.admit(1, 11, 11));
        // The node no longer waits for 10 or 11 when it proposes 12.
        assert!(t.admit(1, 12, 12));
        assert!(!t.admit(1, 10, 10));
        assert!(!t.admit(1, 11, 10));
        assert_eq!(t.nodes[&1].applied, BTreeSet::from([12]));
    }

    #[test]
    fn requests_applied_out_of_order_are_each_applied_once() {
        let mut t = AppliedRequests::default();
        // 10 is still waited for while 11 and 12 are proposed; 10's retry lands last.
        assert!(t.admit(1, 11, 10));
        assert!(t.admit(1, 12, 10));
        assert!(t.admit(1, 10, 10));
        assert!(!t.admit(1, 11, 10));
        assert!(!t.admit(1, 12, 10));
        assert_eq!(t.highest(1), 12);
    }

    #[test]
    fn nodes_are_counted_apart() {
        let mut t = AppliedRequests::default();
        assert!(t.admit(1, 10, 10));
        assert!(t.admit(2, 10, 10));
        t.forget(1);
        assert_eq!(t.highest(1), 0);
        assert_eq!(t.highest(2), 10);
    }

    #[test]
    fn the_floor_never_goes_back() {
        let mut t = AppliedRequests::default();
        assert!(t.admit(1, 20, 20));
        // A copy proposed earlier, when the node still waited for 5, commits late.
        assert!(!t.admit(1, 5, 5));
        assert!(!t.admit(1, 20, 5));
        assert_eq!(t.nodes[&1].floor, 20);
    }
}
