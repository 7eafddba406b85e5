//! Counting and latency recording shared by every producer and consumer of a run.
//!
//! Tasks count into a [`LocalStats`] (plain integers and a bounded sample buffer, no locking)
//! and hand it over to the run's [`SharedStats`] once per batch of frames, so the lock is taken
//! once per read or write syscall, not once per message. Latencies land in HdrHistograms, which
//! give exact percentiles (3 significant digits) without keeping every sample.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

/// Latencies above an hour are clamped: a message that late says all there is to say.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Samples a task buffers before it must hand them over.
pub const LOCAL_SAMPLES_MAX: usize = 4096;

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("static histogram bounds are valid")
}

/// Percentiles of one histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub min: u64,
    pub p50: u64,
    pub p75: u64,
    pub p95: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            min: h.min(),
            p50: h.value_at_quantile(0.50),
            p75: h.value_at_quantile(0.75),
            p95: h.value_at_quantile(0.95),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }

    /// PerfTest's `min/median/75th/95th/99th` rendering.
    pub fn perftest(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.min, self.p50, self.p75, self.p95, self.p99
        )
    }
}

/// What one task counted since it last handed over.
#[derive(Debug)]
pub struct LocalStats {
    pub sent: u64,
    pub confirmed: u64,
    pub nacked: u64,
    pub returned: u64,
    pub received: u64,
    pub latency_us: Vec<u64>,
    pub confirm_latency_us: Vec<u64>,
}

impl Default for LocalStats {
    fn default() -> Self {
        LocalStats {
            sent: 0,
            confirmed: 0,
            nacked: 0,
            returned: 0,
            received: 0,
            latency_us: Vec::with_capacity(LOCAL_SAMPLES_MAX),
            confirm_latency_us: Vec::with_capacity(LOCAL_SAMPLES_MAX),
        }
    }
}

impl LocalStats {
    pub fn is_empty(&self) -> bool {
        self.sent == 0
            && self.confirmed == 0
            && self.nacked == 0
            && self.returned == 0
            && self.received == 0
            && self.latency_us.is_empty()
            && self.confirm_latency_us.is_empty()
    }

    /// True when a sample buffer is full and must be handed over before recording more.
    pub fn full(&self) -> bool {
        self.latency_us.len() >= LOCAL_SAMPLES_MAX
            || self.confirm_latency_us.len() >= LOCAL_SAMPLES_MAX
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub sent: u64,
    pub confirmed: u64,
    pub nacked: u64,
    pub returned: u64,
    pub received: u64,
}

impl Counters {
    pub fn minus(&self, earlier: &Counters) -> Counters {
        Counters {
            sent: self.sent - earlier.sent,
            confirmed: self.confirmed - earlier.confirmed,
            nacked: self.nacked - earlier.nacked,
            returned: self.returned - earlier.returned,
            received: self.received - earlier.received,
        }
    }
}

struct Inner {
    totals: Counters,
    interval_latency: Histogram<u64>,
    interval_confirm: Histogram<u64>,
    run_latency: Histogram<u64>,
    run_confirm: Histogram<u64>,
}

/// The run-wide totals and histograms.
pub struct SharedStats {
    inner: Mutex<Inner>,
}

impl Default for SharedStats {
    fn default() -> Self {
        SharedStats {
            inner: Mutex::new(Inner {
                totals: Counters::default(),
                interval_latency: new_histogram(),
                interval_confirm: new_histogram(),
                run_latency: new_histogram(),
                run_confirm: new_histogram(),
            }),
        }
    }
}

/// One interval as the reporter saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct IntervalSnapshot {
    pub totals: Counters,
    pub latency_us: Percentiles,
    pub confirm_latency_us: Percentiles,
}

impl SharedStats {
    /// Takes a task's counts and samples and clears them for reuse (no reallocation).
    pub fn absorb(&self, local: &mut LocalStats) {
        if local.is_empty() {
            return;
        }
        let mut g = self.inner.lock().expect("stats lock poisoned");
        let inner = &mut *g;
        inner.totals.sent += local.sent;
        inner.totals.confirmed += local.confirmed;
        inner.totals.nacked += local.nacked;
        inner.totals.returned += local.returned;
        inner.totals.received += local.received;
        for &v in &local.latency_us {
            let v = v.clamp(1, LATENCY_US_MAX);
            inner.interval_latency.saturating_record(v);
            inner.run_latency.saturating_record(v);
        }
        for &v in &local.confirm_latency_us {
            let v = v.clamp(1, LATENCY_US_MAX);
            inner.interval_confirm.saturating_record(v);
            inner.run_confirm.saturating_record(v);
        }
        drop(g);
        local.sent = 0;
        local.confirmed = 0;
        local.nacked = 0;
        local.returned = 0;
        local.received = 0;
        local.latency_us.clear();
        local.confirm_latency_us.clear();
    }

    pub fn totals(&self) -> Counters {
        self.inner.lock().expect("stats lock poisoned").totals
    }

    /// Closes the current interval: returns its percentiles and starts a new one.
    pub fn take_interval(&self) -> IntervalSnapshot {
        let mut g = self.inner.lock().expect("stats lock poisoned");
        let snap = IntervalSnapshot {
            totals: g.totals,
            latency_us: Percentiles::of(&g.interval_latency),
            confirm_latency_us: Percentiles::of(&g.interval_confirm),
        };
        g.interval_latency.reset();
        g.interval_confirm.reset();
        snap
    }

    pub fn run_percentiles(&self) -> (Percentiles, Percentiles) {
        let g = self.inner.lock().expect("stats lock poisoned");
        (
            Percentiles::of(&g.run_latency),
            Percentiles::of(&g.run_confirm),
        )
    }

    /// Forgets the run-wide latencies recorded so far (the warm-up); intervals go on.
    pub fn reset_run(&self) {
        let mut g = self.inner.lock().expect("stats lock poisoned");
        g.run_latency.reset();
        g.run_confirm.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absorb_counts_and_percentiles_are_exact_for_known_samples() {
        let shared = SharedStats::default();
        let mut local = LocalStats::default();
        for v in 1..=1000u64 {
            local.latency_us.push(v);
        }
        local.received = 1000;
        local.sent = 1000;
        shared.absorb(&mut local);
        assert!(local.is_empty());
        let snap = shared.take_interval();
        assert_eq!(snap.totals.received, 1000);
        assert_eq!(snap.latency_us.min, 1);
        assert_eq!(snap.latency_us.p50, 500);
        assert_eq!(snap.latency_us.p99, 990);
        assert_eq!(snap.latency_us.max, 1000);
        // The interval restarts, the run keeps everything.
        assert_eq!(shared.take_interval().latency_us.count, 0);
        assert_eq!(shared.run_percentiles().0.count, 1000);
    }
}
