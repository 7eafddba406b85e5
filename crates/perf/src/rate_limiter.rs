//! Rate limiting of producers and consumers (PerfTest's -r and -R): a token bucket that paces
//! sends in batches of a millisecond's worth, since tokio's timers cannot wake more often.

use std::time::{Duration, Instant};

/// How far ahead of its schedule a rate-limited producer may burst, in seconds of its rate.
pub const RATE_BURST_S: f64 = 0.05;
/// A rate-limited producer sends at most once per this many seconds (1 ms, tokio's timer
/// resolution): a batch of `rate * 1 ms` messages. Without it every confirm that wakes the
/// producer would send the one or two messages that became due, one syscall each.
pub const RATE_PACE_S: f64 = 0.001;

/// A token bucket: how many messages a rate allows now, bursting at most [`RATE_BURST_S`].
pub struct RateLimiter {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    pub fn new(rate: f64) -> Self {
        RateLimiter {
            rate,
            tokens: 1.0_f64.min(rate),
            last: Instant::now(),
        }
    }

    /// Messages due in one pacing interval: what a wake-up waits for before it sends.
    pub fn batch_min(&self) -> f64 {
        (self.rate * RATE_PACE_S).floor().max(1.0)
    }

    pub fn available(&mut self) -> u64 {
        let now = Instant::now();
        let cap = (self.rate * RATE_BURST_S).max(1.0);
        let tokens = self.tokens + self.rate * now.duration_since(self.last).as_secs_f64();
        // Past the cap only whole messages are forgone: the fraction is the producer's phase,
        // kept so that producers held up together do not come out of it in step.
        self.tokens = if tokens > cap {
            cap + (tokens - cap).fract()
        } else {
            tokens
        };
        self.last = now;
        if self.tokens < self.batch_min() {
            return 0;
        }
        self.tokens.max(0.0).floor() as u64
    }

    pub fn take(&mut self, n: u64) {
        self.tokens -= n as f64;
    }

    /// Time until the next batch is due.
    pub fn wait(&self) -> Duration {
        if self.rate <= 0.0 {
            return Duration::from_secs(3600);
        }
        Duration::from_secs_f64(((self.batch_min() - self.tokens) / self.rate).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limiter_allows_the_rate_and_no_burst_beyond_its_cap() {
        let mut l = RateLimiter::new(1000.0);
        l.last -= Duration::from_secs(10);
        assert_eq!(l.available(), 50);
        l.take(50);
        assert_eq!(l.available(), 0);
        assert!(l.wait() <= Duration::from_millis(1));
        // At 10k msg/s a wake-up sends only once 10 messages (1 ms) are due.
        let mut fast = RateLimiter::new(10_000.0);
        fast.tokens = 5.0;
        fast.last = Instant::now();
        assert_eq!(fast.available(), 0);
        fast.tokens = 12.0;
        assert_eq!(fast.available(), 12);
    }

    /// 40 producers at 10 msg/s held up together (a pause of the client's runtime) came out of
    /// it in step when the cap dropped their phase: a burst of many messages every 100 ms from
    /// then on, and `warren perf`'s 40-queue median rose from 1.2 to 2.5 ms over a minute.
    #[test]
    fn a_late_producer_keeps_its_phase() {
        let mut l = RateLimiter::new(10.0);
        l.tokens = 0.0;
        // Its message was due 30 ms ago.
        l.last = Instant::now() - Duration::from_millis(130);
        assert_eq!(l.available(), 1, "one message, no burst");
        l.take(1);
        assert!(
            l.wait() <= Duration::from_millis(70),
            "the next is due on the old schedule, not 100 ms from now: {:?}",
            l.wait()
        );
    }
}
