//! Random sequences of publish / consume / get / ack / nack(requeue) / recover / cancel / qos /
//! channel close on one queue never lose or duplicate a message: at any moment a message is
//! ready, outstanding on exactly one channel, or acked once; at the end, after closing every
//! channel and draining with basic.get, each was acked exactly once or is still in the queue.

mod support;

use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use support::*;

const CHANNELS: usize = 3;

#[derive(Debug, Clone, Copy)]
enum QueueKind {
    Classic,
    Priority,
    Quorum,
    /// Durable, x-queue-mode lazy, mostly persistent messages: bodies paged out to the store.
    Lazy,
    /// Durable, lazy, with priorities, mostly persistent.
    PagedPriority,
    /// Quorum with x-max-in-memory-length 2 and a node budget smaller than a few messages.
    PagedQuorum,
}

#[derive(Debug, Clone)]
enum Op {
    Publish {
        priority: u8,
    },
    Consume {
        ch: usize,
        no_ack: bool,
    },
    Qos {
        ch: usize,
        prefetch: u16,
        global: bool,
    },
    Get {
        ch: usize,
        no_ack: bool,
    },
    Ack {
        ch: usize,
        pick: usize,
        multiple: bool,
    },
    Nack {
        ch: usize,
        pick: usize,
        multiple: bool,
    },
    Recover {
        ch: usize,
    },
    Cancel {
        ch: usize,
        pick: usize,
    },
    Close {
        ch: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let ch = 0..CHANNELS;
    prop_oneof![
        4 => (0u8..4).prop_map(|priority| Op::Publish { priority }),
        1 => (ch.clone(), any::<bool>()).prop_map(|(ch, no_ack)| Op::Consume { ch, no_ack: no_ack && ch == 0 }),
        1 => (ch.clone(), 0u16..4, any::<bool>()).prop_map(|(ch, prefetch, global)| Op::Qos { ch, prefetch, global }),
        1 => (ch.clone(), any::<bool>()).prop_map(|(ch, no_ack)| Op::Get { ch, no_ack }),
        3 => (ch.clone(), any::<usize>(), any::<bool>()).prop_map(|(ch, pick, multiple)| Op::Ack { ch, pick, multiple }),
        2 => (ch.clone(), any::<usize>(), any::<bool>()).prop_map(|(ch, pick, multiple)| Op::Nack { ch, pick, multiple }),
        1 => ch.clone().prop_map(|ch| Op::Recover { ch }),
        1 => (ch.clone(), any::<usize>()).prop_map(|(ch, pick)| Op::Cancel { ch, pick }),
        1 => ch.prop_map(|ch| Op::Close { ch }),
    ]
}

/// What the test knows from the frames it received, per message id (the body).
struct Model {
    h: Harness,
    keys: [u64; CHANNELS],
    /// Live consumers per channel: tag, no-ack, the per-consumer prefetch they got.
    consumers: [Vec<(String, bool, u16)>; CHANNELS],
    /// basic.qos per channel: (per-consumer prefetch for new consumers, global prefetch).
    qos: [(u16, u16); CHANNELS],
    /// Which consumer each outstanding consumer delivery went to, by (channel, tag).
    owner: HashMap<(usize, u64), String>,
    /// Outstanding (unacked) deliveries per channel: delivery tag -> message id.
    outstanding: [BTreeMap<u64, u32>; CHANNELS],
    acked: HashMap<u32, u32>,
    published: u32,
    next_tag: u32,
    kind: QueueKind,
    priorities: Vec<u8>,
}

impl Model {
    fn new(kind: QueueKind) -> Self {
        let mut h = Harness::new();
        match kind {
            QueueKind::Classic => h.declare_args("q", Default::default()),
            QueueKind::Priority => h.declare_args("q", table(&[("x-max-priority", int(2))])),
            QueueKind::Quorum => {
                h.declare_with(1, "q", true, table(&[("x-queue-type", long_str("quorum"))]))
            }
            QueueKind::Lazy => {
                h.enable_paging(usize::MAX);
                h.declare_with(1, "q", true, table(&[("x-queue-mode", long_str("lazy"))]))
            }
            QueueKind::PagedPriority => {
                h.enable_paging(usize::MAX);
                let args = [
                    ("x-max-priority", int(2)),
                    ("x-queue-mode", long_str("lazy")),
                ];
                h.declare_with(1, "q", true, table(&args))
            }
            QueueKind::PagedQuorum => {
                h.enable_paging(1000);
                let args = [
                    ("x-queue-type", long_str("quorum")),
                    ("x-max-in-memory-length", int(2)),
                ];
                h.declare_with(1, "q", true, table(&args))
            }
        }
        .expect("declare");
        let keys = [h.open(1), h.open(1), h.open(2)];
        Model {
            h,
            keys,
            consumers: Default::default(),
            outstanding: Default::default(),
            qos: Default::default(),
            owner: HashMap::new(),
            acked: HashMap::new(),
            published: 0,
            next_tag: 0,
            kind,
            priorities: Vec::new(),
        }
    }

    fn is_outstanding(&self, id: u32) -> bool {
        self.outstanding
            .iter()
            .any(|o| o.values().any(|v| *v == id))
    }

    /// Reads every channel's frames and books each delivery.
    fn collect(&mut self) {
        for ch in 0..CHANNELS {
            for e in self.h.events(self.keys[ch]) {
                let d = match e {
                    Event::Deliver(d) | Event::GetOk(d) => d,
                    other => panic!("unexpected frame {other:?}"),
                };
                self.book(ch, &d, None);
            }
        }
    }

    fn book(&mut self, ch: usize, d: &Delivery, get_no_ack: Option<bool>) {
        let id: u32 = d.body_str().parse().expect("bodies are ids");
        assert!(id < self.published, "delivered a message never published");
        assert!(
            !self.is_outstanding(id),
            "message {id} delivered twice at once"
        );
        assert_eq!(
            self.acked.get(&id),
            None,
            "message {id} delivered after its ack"
        );
        let no_ack = match (&d.consumer_tag, get_no_ack) {
            (None, Some(no_ack)) => no_ack,
            (Some(tag), None) => {
                let &(_, no_ack, prefetch) = self.consumers[ch]
                    .iter()
                    .find(|(t, _, _)| t == tag)
                    .expect("delivery to a live consumer of this channel");
                if !no_ack {
                    // Prefetch: the delivery is only allowed while under both limits.
                    let global = self.qos[ch].1 as usize;
                    // Consumer deliveries only: basic.get ones take no channel credit.
                    let on_channel = self.owner.keys().filter(|(c, _)| *c == ch).count();
                    assert!(
                        global == 0 || on_channel < global,
                        "channel {ch} over its global prefetch {global}"
                    );
                    let mine = self
                        .owner
                        .iter()
                        .filter(|((c, _), t)| *c == ch && *t == tag)
                        .count();
                    assert!(
                        prefetch == 0 || mine < prefetch as usize,
                        "consumer {tag} over its prefetch {prefetch}"
                    );
                    self.owner.insert((ch, d.delivery_tag), tag.clone());
                }
                no_ack
            }
            _ => unreachable!("a delivery is a deliver or a get-ok"),
        };
        if no_ack {
            *self.acked.entry(id).or_default() += 1;
        } else {
            let previous = self.outstanding[ch].insert(d.delivery_tag, id);
            assert_eq!(previous, None, "delivery tag reused on a channel");
        }
    }

    fn pick_tag(&self, ch: usize, pick: usize) -> Option<u64> {
        let o = &self.outstanding[ch];
        (!o.is_empty()).then(|| *o.keys().nth(pick % o.len()).expect("in range"))
    }

    /// Removes the tags an ack/nack settles from the model and returns their ids.
    fn settle(&mut self, ch: usize, tag: u64, multiple: bool) -> Vec<u32> {
        let o = &mut self.outstanding[ch];
        let tags: Vec<u64> = if multiple {
            o.range(..=tag).map(|(t, _)| *t).collect()
        } else {
            vec![tag]
        };
        for t in &tags {
            self.owner.remove(&(ch, *t));
        }
        let o = &mut self.outstanding[ch];
        tags.iter()
            .map(|t| o.remove(t).expect("outstanding"))
            .collect()
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Publish { priority } => {
                let id = self.published;
                self.published += 1;
                self.priorities.push(priority);
                let mut props = with_priority(priority);
                if !id.is_multiple_of(3) {
                    // Persistent: stored in a durable queue, so its body may be paged out.
                    props.delivery_mode = Some(2);
                }
                self.h
                    .publish_props("", "q", props, &id.to_string())
                    .expect("publish");
            }
            Op::Consume { ch, no_ack } => {
                let tag = format!("c{}", self.next_tag);
                self.next_tag += 1;
                match self.h.consume_with(
                    self.keys[ch],
                    "q",
                    &tag,
                    no_ack,
                    false,
                    Default::default(),
                ) {
                    Ok(_) => self.consumers[ch].push((tag, no_ack, self.qos[ch].0)),
                    // Quorum queues refuse consumers on channels with a global prefetch.
                    Err(e) if e.code == 540 => assert!(matches!(
                        self.kind,
                        QueueKind::Quorum | QueueKind::PagedQuorum
                    )),
                    Err(e) => panic!("consume failed: {e}"),
                }
            }
            Op::Qos {
                ch,
                prefetch,
                global,
            } => {
                if global {
                    self.qos[ch].1 = prefetch;
                } else {
                    // A per-consumer qos also lifts the channel limit, as in RabbitMQ 3.10.
                    self.qos[ch] = (prefetch, 0);
                }
                self.h.qos(self.keys[ch], prefetch, global);
            }
            Op::Get { ch, no_ack } => {
                self.collect();
                if let Some(d) = self.h.get(self.keys[ch], "q", no_ack) {
                    self.book(ch, &d, Some(no_ack));
                }
            }
            Op::Ack { ch, pick, multiple } => {
                if let Some(tag) = self.pick_tag(ch, pick) {
                    for id in self.settle(ch, tag, multiple) {
                        *self.acked.entry(id).or_default() += 1;
                    }
                    self.h
                        .ack(self.keys[ch], tag, multiple)
                        .expect("a live tag");
                }
            }
            Op::Nack { ch, pick, multiple } => {
                if let Some(tag) = self.pick_tag(ch, pick) {
                    self.settle(ch, tag, multiple);
                    self.h
                        .nack(self.keys[ch], tag, multiple, true)
                        .expect("a live tag");
                }
            }
            Op::Recover { ch } => {
                self.outstanding[ch].clear();
                self.owner.retain(|(c, _), _| *c != ch);
                self.h.recover(self.keys[ch]);
            }
            Op::Cancel { ch, pick } => {
                let cs = &mut self.consumers[ch];
                if !cs.is_empty() {
                    // The consumer's outstanding deliveries stay unacked on the channel; its
                    // no-ack flag is still needed to book frames already written, so collect
                    // before forgetting it.
                    self.collect();
                    let (tag, _, _) = self.consumers[ch].remove(pick % self.consumers[ch].len());
                    assert!(self.h.cancel(self.keys[ch], &tag));
                }
            }
            Op::Close { ch } => {
                self.collect();
                self.h.close(self.keys[ch]);
                self.outstanding[ch].clear();
                self.owner.retain(|(c, _), _| *c != ch);
                self.consumers[ch].clear();
                self.qos[ch] = (0, 0);
                self.keys[ch] = self.h.open(ch as u64 / 2 + 1);
            }
        }
        self.h.settle_store();
        self.collect();
        let acked: u32 = self.acked.values().sum();
        let outstanding: usize = self.outstanding.iter().map(|o| o.len()).sum();
        assert_eq!(
            self.h
                .vh
                .queue_stats("q")
                .map(|(ready, unacked, _)| (ready + unacked, unacked)),
            Some(((self.published - acked) as usize, outstanding)),
            "ready + unacked is everything published and not acked, after {op:?}"
        );
    }

    fn finish(mut self) {
        for ch in 0..CHANNELS {
            self.apply(&Op::Close { ch });
        }
        let drain = self.h.open(9);
        let mut remaining: HashMap<u32, u32> = HashMap::new();
        let left: Vec<u32> = self
            .h
            .drain(drain, "q")
            .iter()
            .map(|b| b.parse().unwrap())
            .collect();
        for id in &left {
            *remaining.entry(*id).or_default() += 1;
        }
        // Classic queues put requeued messages back where they were: what is left comes out in
        // publish order (within each priority level for a priority queue).
        let order_key = |id: &u32| match self.kind {
            QueueKind::Classic | QueueKind::Lazy => Some((0, *id)),
            QueueKind::Priority | QueueKind::PagedPriority => {
                Some((u8::MAX - self.priorities[*id as usize].min(2), *id))
            }
            QueueKind::Quorum | QueueKind::PagedQuorum => None,
        };
        let keys: Vec<_> = left.iter().map(order_key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "remaining messages out of order: {left:?}");
        for id in 0..self.published {
            let acked = self.acked.get(&id).copied().unwrap_or(0);
            let left = remaining.get(&id).copied().unwrap_or(0);
            assert_eq!(
                (acked, left, acked + left),
                (acked, left, 1),
                "message {id}: acked {acked} times, {left} copies left"
            );
        }
        assert_eq!(
            remaining.keys().filter(|id| **id >= self.published).count(),
            0
        );
        self.h.settle_store();
        if let Some(store) = &self.h.store {
            assert_eq!(
                store.live(),
                0,
                "every stored message was released once settled"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn no_message_is_lost_or_duplicated(
        kind in prop_oneof![
            Just(QueueKind::Classic),
            Just(QueueKind::Priority),
            Just(QueueKind::Quorum),
            Just(QueueKind::Lazy),
            Just(QueueKind::PagedPriority),
            Just(QueueKind::PagedQuorum)
        ],
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut m = Model::new(kind);
        for op in &ops {
            m.apply(op);
        }
        m.finish();
    }
}
