//! Whether the groups loop is lightly loaded, which decides two things it does differently at a
//! low rate: it asks the WAL writer to sync a round at once rather than after the commit window
//! (`Store::sync_now_then`), and it writes a round's deliveries to the consumers' sockets itself
//! (`warren_broker::outbox::WriteThrough`). Under load both would cost more than they save: the
//! window batches a stream into fuller pages, and the loop is the node's busiest thread.
//!
//! The signal is the loop's own idleness: at a low rate every pass begins after the loop parked
//! with nothing queued; under load inputs queue while a pass runs, so the next finds them. A
//! streak tells the two apart, since a loaded loop still finds its queue empty now and then.
//!
//! A node that only follows a busy leader parks between its appends too, and counts as lightly
//! loaded: its acks then leave without the window. Judging by the rounds' size as well (more than
//! 4 entries or 16 KiB: not light) cost the one-queue leader case 8 % (PerfTest, 3 runs each:
//! 48.2-53.5k msg/s against 53.5-56.9k).

/// Passes in a row that began idle that make the loop [`Load::light`].
const LIGHT_LOAD_STREAK: u32 = 8;

#[derive(Default)]
pub(super) struct Load {
    /// Passes in a row that began with nothing queued.
    idle_streak: u32,
}

impl Load {
    /// A pass begins: `idle` when the loop found nothing queued and parked for its input.
    pub(super) fn pass_began(&mut self, idle: bool) {
        self.idle_streak = if idle {
            self.idle_streak.saturating_add(1)
        } else {
            0
        };
    }

    pub(super) fn light(&self) -> bool {
        self.idle_streak >= LIGHT_LOAD_STREAK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_streak_of_idle_passes_is_light_and_one_busy_pass_ends_it() {
        let mut load = Load::default();
        for _ in 1..LIGHT_LOAD_STREAK {
            load.pass_began(true);
            assert!(!load.light());
        }
        load.pass_began(true);
        assert!(load.light());
        load.pass_began(false);
        assert!(!load.light());
    }
}
