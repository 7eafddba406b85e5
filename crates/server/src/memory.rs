//! The memory alarm: above the high watermark, publishing connections are blocked
//! (connection.blocked) until memory falls again, as RabbitMQ does.

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

/// Samples RSS and publishes whether the alarm is on.
pub async fn monitor(watermark_bytes: u64, alarm: watch::Sender<bool>) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    loop {
        tick.tick().await;
        let on = rss_bytes() > watermark_bytes;
        if *alarm.borrow() != on {
            if on {
                tracing::warn!(
                    watermark_bytes,
                    rss = rss_bytes(),
                    "memory alarm set: blocking publishers"
                );
            } else {
                tracing::info!("memory alarm cleared");
            }
            let _ = alarm.send(on);
        }
    }
}
