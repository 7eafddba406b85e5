//! `message_stats`: per queue (publish, deliver_get, ack, redeliver) and for the node in
//! `/api/overview`, each with RabbitMQ's `_details: {"rate": per second}`, and the rates of
//! change of a queue's message counts (`messages_details`, ...).
//!
//! The counts are those of the node that has them (see [`crate::queue_stats`]): a classic
//! queue's own counters on its node, a quorum queue's as its replicas apply its log (every
//! member applies the same entries, so a follower's counts are its leader's). Rates are taken
//! from those same figures as a listing sees them, so they are right on whichever node is
//! asked: computed from this node's own vhost counters, a quorum queue (whose messages never
//! pass through those) or a queue hosted on another node showed 0.0/s everywhere.
//!
//! A queue's rate is the change between two of its samples at least [`SAMPLE_INTERVAL`] apart;
//! a sample is a few integers copied when a listing is asked for, so nobody polling costs
//! nothing, and a UI refreshing every 5 s gets a new rate every 5 s.

use crate::queue_stats::QueueView;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use warren_broker::queue::QueueStats;

/// RabbitMQ's statistics interval: rates change at most this often.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// A queue's samples not refreshed for this long are dropped: its queue was deleted, or no
/// listing has shown it since (its next rate starts again from 0).
const SAMPLE_KEPT_MAX: Duration = Duration::from_secs(600);

/// Per-second rates of a queue's counters and of its message counts (which may fall).
#[derive(Debug, Default, Clone, Copy)]
pub struct PerSecond {
    pub publish: f64,
    pub deliver_get: f64,
    pub redeliver: f64,
    pub ack: f64,
    pub messages: f64,
    pub messages_ready: f64,
    pub messages_unacknowledged: f64,
}

impl std::ops::AddAssign for PerSecond {
    fn add_assign(&mut self, o: PerSecond) {
        self.publish += o.publish;
        self.deliver_get += o.deliver_get;
        self.redeliver += o.redeliver;
        self.ack += o.ack;
        self.messages += o.messages;
        self.messages_ready += o.messages_ready;
        self.messages_unacknowledged += o.messages_unacknowledged;
    }
}

/// A queue's figures at one moment.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    stats: QueueStats,
    ready: u64,
    unacked: u64,
}

struct Sample {
    at: Instant,
    figures: Figures,
    /// The rate between this sample and the one before it.
    rate: PerSecond,
}

/// The rate sampler of a node.
#[derive(Default)]
pub struct Rates {
    samples: Mutex<HashMap<(String, String), Sample>>,
}

fn per_second(new: &Figures, old: &Figures, dt: f64) -> PerSecond {
    let up = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
    let change = |a: u64, b: u64| (a as f64 - b as f64) / dt;
    PerSecond {
        publish: up(new.stats.publish, old.stats.publish),
        deliver_get: up(new.stats.deliver_get, old.stats.deliver_get),
        redeliver: up(new.stats.redeliver, old.stats.redeliver),
        ack: up(new.stats.ack, old.stats.ack),
        messages: change(new.ready + new.unacked, old.ready + old.unacked),
        messages_ready: change(new.ready, old.ready),
        messages_unacknowledged: change(new.unacked, old.unacked),
    }
}

impl Rates {
    /// Samples the queues of a listing (each whose last sample is older than
    /// [`SAMPLE_INTERVAL`]) and forgets samples no listing refreshed for [`SAMPLE_KEPT_MAX`].
    /// A queue whose node did not answer is not sampled: its zeroes are not a fall to zero.
    pub fn observe(&self, views: &[QueueView]) {
        self.observe_at(views, Instant::now());
    }

    fn observe_at(&self, views: &[QueueView], now: Instant) {
        let mut samples = self.samples.lock().expect("rates lock");
        for view in views.iter().filter(|v| v.running) {
            let figures = Figures {
                stats: view.info.stats,
                ready: view.info.messages_ready,
                unacked: view.info.messages_unacknowledged,
            };
            let key = (view.vhost.clone(), view.info.name.clone());
            match samples.get_mut(&key) {
                Some(s) if now.duration_since(s.at) < SAMPLE_INTERVAL => {}
                Some(s) => {
                    let dt = now.duration_since(s.at).as_secs_f64();
                    s.rate = per_second(&figures, &s.figures, dt);
                    s.at = now;
                    s.figures = figures;
                }
                None => {
                    samples.insert(
                        key,
                        Sample {
                            at: now,
                            figures,
                            rate: PerSecond::default(),
                        },
                    );
                }
            }
        }
        samples.retain(|_, s| now.duration_since(s.at) < SAMPLE_KEPT_MAX);
    }

    pub fn queue(&self, vhost: &str, queue: &str) -> PerSecond {
        self.samples
            .lock()
            .expect("rates lock")
            .get(&(vhost.to_string(), queue.to_string()))
            .map(|s| s.rate)
            .unwrap_or_default()
    }
}

/// RabbitMQ's `message_stats` object.
pub fn message_stats_json(counts: &QueueStats, rates: &PerSecond) -> Value {
    json!({
        "publish": counts.publish, "publish_details": { "rate": rates.publish },
        "deliver_get": counts.deliver_get, "deliver_get_details": { "rate": rates.deliver_get },
        "redeliver": counts.redeliver, "redeliver_details": { "rate": rates.redeliver },
        "ack": counts.ack, "ack_details": { "rate": rates.ack },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_broker::vhost::QueueInfo;

    fn view(publish: u64, ready: u64, running: bool) -> QueueView {
        let info = QueueInfo {
            name: "q".into(),
            durable: true,
            auto_delete: false,
            exclusive: false,
            queue_type: "quorum",
            arguments: Default::default(),
            messages_ready: ready,
            messages_unacknowledged: 0,
            message_bytes_ready: 0,
            messages_paged_out: 0,
            consumers: 0,
            node: None,
            stats: QueueStats {
                publish,
                ..Default::default()
            },
            members: Vec::new(),
            log_id: None,
            policy: None,
            operator_policy: None,
            effective_policy_definition: Default::default(),
        };
        QueueView {
            vhost: "/".into(),
            info,
            running,
            leader: None,
            stream: None,
        }
    }

    #[test]
    fn a_rate_is_the_change_between_samples_an_interval_apart() {
        let rates = Rates::default();
        let t0 = Instant::now();
        rates.observe_at(&[view(100, 50, true)], t0);
        assert_eq!(rates.queue("/", "q").publish, 0.0);
        // Too soon: the previous rate stands.
        rates.observe_at(&[view(110, 55, true)], t0 + Duration::from_secs(1));
        assert_eq!(rates.queue("/", "q").publish, 0.0);
        rates.observe_at(&[view(200, 30, true)], t0 + Duration::from_secs(10));
        let r = rates.queue("/", "q");
        assert_eq!((r.publish, r.messages_ready), (10.0, -2.0));
    }

    #[test]
    fn a_queue_whose_node_did_not_answer_is_not_sampled() {
        let rates = Rates::default();
        let t0 = Instant::now();
        rates.observe_at(&[view(100, 50, true)], t0);
        rates.observe_at(&[view(0, 0, false)], t0 + Duration::from_secs(10));
        rates.observe_at(&[view(300, 50, true)], t0 + Duration::from_secs(20));
        assert_eq!(rates.queue("/", "q").publish, 10.0);
    }
}
