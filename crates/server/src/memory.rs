//! The memory alarm: above the high watermark, publishing connections are blocked
//! (connection.blocked) until memory falls again, as RabbitMQ does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// The process's resident set size, from /proc (Linux).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// Physical memory, from /proc/meminfo: the base of a watermark given as a fraction.
pub fn total_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|kb| kb.parse::<u64>().ok())
                })
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4 << 30)
}

/// Compares RSS with the watermark and raises or clears the alarm; called by the sampler and
/// at once when the watermark changes (rabbitmqctl's change takes effect immediately too).
pub fn evaluate(watermark_bytes: u64, alarm: &watch::Sender<bool>) {
    let rss = rss_bytes();
    let on = rss > watermark_bytes;
    if *alarm.borrow() != on {
        if on {
            tracing::warn!(
                watermark_bytes,
                rss,
                "memory alarm set: blocking publishers"
            );
        } else {
            tracing::info!("memory alarm cleared");
        }
        let _ = alarm.send(on);
    }
}

/// Samples RSS against the (runtime-adjustable) watermark.
pub async fn monitor(watermark_bytes: Arc<AtomicU64>, alarm: Arc<watch::Sender<bool>>) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    loop {
        tick.tick().await;
        evaluate(watermark_bytes.load(Ordering::Relaxed), &alarm);
    }
}
