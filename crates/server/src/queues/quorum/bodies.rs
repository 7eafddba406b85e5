//! Bodies of a quorum queue's messages that wait in the queue, kept in memory by the replica so
//! that delivering them later does not read them back from the store: a consumer that fell
//! behind (a consumer on a follower's node, one whose prefetch is full) would otherwise read
//! and parse a log entry per message on the groups' thread, fall further behind, and never
//! catch up.
//!
//! Every replica of the node draws on one byte budget ([`BodyBudget`]): past it, bodies are
//! read from the store as before, so a backlog far larger than memory stays on disk. A body
//! leaves when its message is delivered (a redelivery reads the store), dead-lettered,
//! dropped or purged.

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of bodies the node's replicas may keep in all.
pub const BODY_BUDGET_BYTES: usize = 128 << 20;

/// What the node's replicas keep, against [`BODY_BUDGET_BYTES`].
#[derive(Default)]
pub struct BodyBudget {
    used: AtomicUsize,
}

impl BodyBudget {
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

pub struct Bodies {
    by_index: HashMap<u64, Bytes>,
    bytes: usize,
    budget: Arc<BodyBudget>,
}

impl Bodies {
    pub fn new(budget: Arc<BodyBudget>) -> Self {
        Bodies {
            by_index: HashMap::new(),
            bytes: 0,
            budget,
        }
    }

    /// Keeps the body of the message at `index`, if the budget allows. A copy: the payload is
    /// a slice of a whole network frame or log buffer, which it would otherwise pin.
    pub fn keep(&mut self, index: u64, payload: &Bytes) {
        let len = payload.len();
        let used = self.budget.used.fetch_add(len, Ordering::Relaxed);
        if used + len > BODY_BUDGET_BYTES {
            self.budget.used.fetch_sub(len, Ordering::Relaxed);
            return;
        }
        self.bytes += len;
        if let Some(old) = self.by_index.insert(index, Bytes::copy_from_slice(payload)) {
            self.release(old.len());
        }
    }

    /// The body of the message at `index`, which leaves the cache.
    pub fn take(&mut self, index: u64) -> Option<Bytes> {
        let body = self.by_index.remove(&index)?;
        self.release(body.len());
        Some(body)
    }

    pub fn len(&self) -> usize {
        self.by_index.len()
    }

    /// Keeps only the bodies of messages `live` says are still waiting in the queue.
    pub fn retain(&mut self, live: impl Fn(u64) -> bool) {
        let mut freed = 0;
        self.by_index.retain(|index, body| {
            let keep = live(*index);
            if !keep {
                freed += body.len();
            }
            keep
        });
        self.release(freed);
    }

    pub fn clear(&mut self) {
        self.by_index.clear();
        self.release(self.bytes);
    }

    fn release(&mut self, len: usize) {
        self.bytes -= len;
        self.budget.used.fetch_sub(len, Ordering::Relaxed);
    }
}

impl Drop for Bodies {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_kept_within_the_nodes_budget_and_given_back() {
        let budget = Arc::new(BodyBudget::default());
        let mut a = Bodies::new(budget.clone());
        let mut b = Bodies::new(budget.clone());
        let big = Bytes::from(vec![7u8; BODY_BUDGET_BYTES / 2]);
        a.keep(1, &big);
        b.keep(1, &big);
        // The budget is spent: a third body is not kept, and is read from the store instead.
        a.keep(2, &Bytes::from_static(b"x"));
        assert_eq!(a.take(2), None);
        assert_eq!(budget.used(), BODY_BUDGET_BYTES);
        assert_eq!(a.take(1).map(|b| b.len()), Some(big.len()));
        assert_eq!(a.take(1), None, "taken once");
        a.keep(3, &Bytes::from_static(b"abc"));
        a.keep(4, &Bytes::from_static(b"de"));
        a.retain(|i| i == 4);
        assert_eq!(a.len(), 1);
        assert_eq!(budget.used(), big.len() + 2);
        drop(b);
        drop(a);
        assert_eq!(budget.used(), 0);
    }
}
