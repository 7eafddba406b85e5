//! How long a leader's new entries take to commit: RabbitMQ's
//! `rabbitmq_raft_entry_commit_latency_seconds`, the Raft dashboard's latency heatmap.
//!
//! Ra stamps every command with the time it was appended and measures, on each member, the
//! stamp's age when the command is applied. Our entries carry no clock (8 bytes more per
//! message, and followers' clocks would enter the figure), so the leader measures alone: the
//! time from the round that appended an entry to the round that applied it, which is the
//! replication round trip and both WAL syncs a publisher's confirm waits for. A round is
//! timed once, not each of its entries, so the data path pays one clock read per group and
//! round.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Rounds timed at once: under load a leader has a few rounds in flight (each waits for a
/// sync); past this many, rounds go untimed until the oldest commit, which only thins the
/// samples.
const ROUNDS_TIMED_MAX: usize = 64;

/// A leader's rounds of appended entries not yet applied, and the latest latency measured.
#[derive(Debug, Default)]
pub(crate) struct CommitTimer {
    /// (the last index a round appended, when), oldest first.
    appended: VecDeque<(u64, Instant)>,
    latest: Option<Duration>,
}

impl CommitTimer {
    /// The leader appended entries up to `last` at `now`.
    pub(crate) fn appended(&mut self, last: u64, now: Instant) {
        if self.appended.len() < ROUNDS_TIMED_MAX {
            self.appended.push_back((last, now));
        }
    }

    /// The group applied entries up to `index` at `now`: every round wholly applied is
    /// measured, and the latest of them is the figure (a gauge, as Ra's).
    pub(crate) fn applied(&mut self, index: u64, now: Instant) {
        while let Some(&(last, at)) = self.appended.front() {
            if last > index {
                break;
            }
            self.appended.pop_front();
            self.latest = Some(now.saturating_duration_since(at));
        }
    }

    /// Leadership changed: what an old term appended may commit under a new leader, or
    /// never, so its time says nothing about this one's.
    pub(crate) fn forget_rounds(&mut self) {
        self.appended.clear();
    }

    /// The time the latest measured round took to commit; `None` before any (a member that
    /// never led).
    pub(crate) fn latest(&self) -> Option<Duration> {
        self.latest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_round_is_measured_from_its_append_to_the_apply_that_covers_it() {
        let t0 = Instant::now();
        let mut timer = CommitTimer::default();
        assert_eq!(timer.latest(), None);
        timer.appended(5, t0);
        timer.appended(9, t0 + ms(1));
        // Index 7 covers the first round only.
        timer.applied(7, t0 + ms(3));
        assert_eq!(timer.latest(), Some(ms(3)));
        timer.applied(9, t0 + ms(4));
        assert_eq!(timer.latest(), Some(ms(3)));
        // Nothing pending: an apply (a follower's entries, a no-op) changes nothing.
        timer.applied(12, t0 + ms(50));
        assert_eq!(timer.latest(), Some(ms(3)));
    }

    #[test]
    fn rounds_of_an_old_term_are_not_measured_under_a_new_one() {
        let t0 = Instant::now();
        let mut timer = CommitTimer::default();
        timer.appended(5, t0);
        timer.forget_rounds();
        timer.applied(5, t0 + ms(900));
        assert_eq!(timer.latest(), None);
    }

    #[test]
    fn past_the_bound_rounds_go_untimed_until_the_oldest_commits() {
        let t0 = Instant::now();
        let mut timer = CommitTimer::default();
        for i in 0..ROUNDS_TIMED_MAX as u64 + 10 {
            timer.appended(i + 1, t0 + ms(i));
        }
        assert_eq!(timer.appended.len(), ROUNDS_TIMED_MAX);
        timer.applied(ROUNDS_TIMED_MAX as u64 + 10, t0 + ms(100));
        // The last timed round was appended at ROUNDS_TIMED_MAX - 1 ms.
        assert_eq!(
            timer.latest(),
            Some(ms(100 - (ROUNDS_TIMED_MAX as u64 - 1)))
        );
        assert!(timer.appended.is_empty());
    }
}
