//! The quorum queue state machine under random command sequences: what must hold after every
//! entry whatever the commands (every message in exactly one place or gone for exactly one
//! reason, credit respected, the release cursor below every live message), and determinism:
//! a member restored from a snapshot at any point and given the rest of the log ends in the
//! same state with the same effects as one that applied everything.

use bytes::Bytes;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use warren_broker::quorum::{
    Command, ConsumerId, ConsumerSpec, Effect, EnqueueHeader, MsgId, Op, OverflowMode, PublisherId,
    QuorumConfig, QuorumQueue, Status,
};

const NODES: [&str; 3] = ["a", "b", "c"];
/// Consumer slots: slot `s` is tag `t{s}` on node `NODES[s % 3]`, channel `s / 3 + 1`.
const SLOTS: usize = 6;
/// A message id no consumer holds: settling it must change nothing.
const UNKNOWN_MSG_ID: MsgId = 1 << 40;

fn slot_consumer(slot: usize) -> ConsumerId {
    ConsumerId::new(NODES[slot % 3], (slot / 3 + 1) as u64, format!("t{slot}"))
}

fn slot_holder(slot: usize, get: bool) -> ConsumerId {
    if get {
        ConsumerId::get(NODES[slot % 3], (slot / 3 + 1) as u64)
    } else {
        slot_consumer(slot)
    }
}

#[derive(Debug, Clone)]
enum Action {
    Enqueue {
        size: u32,
        ttl: Option<u64>,
        confirm: bool,
        high: bool,
    },
    Checkout {
        slot: usize,
        credit: u32,
        priority: i32,
        no_ack: bool,
        exclusive: bool,
    },
    Cancel {
        slot: usize,
    },
    ChannelDown {
        slot: usize,
    },
    /// `Settle`, `Return` (rejected or not) or `Discard` of `n` of what a holder has,
    /// starting at its `skip`th message; `n == 0` names an id it does not hold.
    Finish {
        slot: usize,
        get: bool,
        n: usize,
        skip: usize,
        how: u8,
    },
    Credit {
        slot: usize,
        credit: u32,
    },
    Dequeue {
        slot: usize,
        no_ack: bool,
    },
    Purge,
    NodeDown {
        node: usize,
    },
    Tick,
    /// `SettleDeadLetters` of `n` waiting dead letters from the `skip`th; `n == 0` names an id
    /// that is not waiting.
    SettleDeadLetters {
        n: usize,
        skip: usize,
    },
}

fn action() -> impl Strategy<Value = Action> {
    let slot = 0..SLOTS;
    prop_oneof![
        8 => (1u32..20, prop::option::weighted(0.3, 0u64..60), any::<bool>(), prop::bool::weighted(0.3))
            .prop_map(|(size, ttl, confirm, high)| Action::Enqueue { size, ttl, confirm, high }),
        3 => (slot.clone(), 0u32..4, 0i32..3, prop::bool::weighted(0.2), prop::bool::weighted(0.1))
            .prop_map(|(slot, credit, priority, no_ack, exclusive)| Action::Checkout {
                slot, credit, priority, no_ack, exclusive
            }),
        1 => slot.clone().prop_map(|slot| Action::Cancel { slot }),
        1 => slot.clone().prop_map(|slot| Action::ChannelDown { slot }),
        8 => (slot.clone(), prop::bool::weighted(0.3), 0usize..3, 0usize..3, 0u8..4)
            .prop_map(|(slot, get, n, skip, how)| Action::Finish { slot, get, n, skip, how }),
        1 => (slot.clone(), 0u32..4).prop_map(|(slot, credit)| Action::Credit { slot, credit }),
        2 => (slot, any::<bool>()).prop_map(|(slot, no_ack)| Action::Dequeue { slot, no_ack }),
        1 => Just(Action::Purge),
        1 => (0..NODES.len()).prop_map(|node| Action::NodeDown { node }),
        1 => Just(Action::Tick),
        2 => (0usize..3, 0usize..2).prop_map(|(n, skip)| Action::SettleDeadLetters { n, skip }),
    ]
}

fn queue_config() -> impl Strategy<Value = QuorumConfig> {
    (
        prop::option::weighted(0.3, 0u64..6),
        prop::option::weighted(0.2, 0u64..50),
        any::<bool>(),
        prop::option::weighted(0.3, 0u64..80),
        prop::option::weighted(0.3, 0u64..3),
        any::<bool>(),
        prop::bool::weighted(0.3),
        any::<bool>(),
    )
        .prop_map(
            |(max_length, max_length_bytes, reject, ttl, delivery_limit, dlx, sac, alo)| {
                QuorumConfig {
                    vhost: "/".into(),
                    name: "q".into(),
                    max_length,
                    max_length_bytes,
                    overflow: if reject {
                        OverflowMode::RejectPublish
                    } else {
                        OverflowMode::DropHead
                    },
                    message_ttl_ms: ttl,
                    delivery_limit,
                    dead_letter_exchange: dlx,
                    // As QuorumConfig::new takes it: only with reject-publish.
                    dead_letter_at_least_once: dlx && reject && alo,
                    single_active_consumer: sac,
                }
            },
        )
}

/// The concrete command for `action` given the queue's state (which ids a holder has).
fn resolve(q: &QuorumQueue, action: &Action, seq: u64) -> Op {
    match *action {
        Action::Enqueue {
            size,
            ttl,
            confirm,
            high,
        } => Op::Enqueue {
            publisher: confirm.then(|| PublisherId::new("a", 9)),
            seq,
            header: EnqueueHeader {
                size_bytes: size,
                ttl_ms: ttl,
                high_priority: high,
            },
            payload: Bytes::from_static(b"x"),
        },
        Action::Checkout {
            slot,
            credit,
            priority,
            no_ack,
            exclusive,
        } => Op::Checkout {
            consumer: slot_consumer(slot),
            spec: ConsumerSpec {
                credit,
                priority,
                no_ack,
                exclusive,
            },
        },
        Action::Cancel { slot } => Op::Cancel {
            consumer: slot_consumer(slot),
        },
        Action::ChannelDown { slot } => Op::ChannelDown {
            node: NODES[slot % 3].into(),
            channel: (slot / 3 + 1) as u64,
        },
        Action::Finish {
            slot,
            get,
            n,
            skip,
            how,
        } => {
            let consumer = slot_holder(slot, get);
            let held: Vec<MsgId> = q
                .consumer(&consumer)
                .map(|c| c.checked_out.keys().copied().collect())
                .unwrap_or_default();
            let msg_ids: Vec<MsgId> = if n == 0 {
                vec![UNKNOWN_MSG_ID]
            } else {
                held.iter()
                    .skip(skip % (held.len() + 1))
                    .take(n)
                    .copied()
                    .collect()
            };
            match how {
                0 => Op::Settle { consumer, msg_ids },
                1 => Op::Return {
                    consumer,
                    msg_ids,
                    rejected: true,
                },
                2 => Op::Return {
                    consumer,
                    msg_ids,
                    rejected: false,
                },
                _ => Op::Discard { consumer, msg_ids },
            }
        }
        Action::Credit { slot, credit } => Op::Credit {
            consumer: slot_consumer(slot),
            credit,
        },
        Action::Dequeue { slot, no_ack } => Op::Dequeue {
            node: NODES[slot % 3].into(),
            channel: (slot / 3 + 1) as u64,
            no_ack,
        },
        Action::Purge => Op::Purge,
        Action::NodeDown { node } => Op::NodeDown {
            node: NODES[node].into(),
        },
        Action::Tick => Op::Tick,
        Action::SettleDeadLetters { n, skip } => Op::SettleDeadLetters {
            ids: if n == 0 {
                vec![u64::MAX]
            } else {
                q.discards().skip(skip).take(n).map(|(id, _)| id).collect()
            },
        },
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Ready,
    Held(ConsumerId, MsgId),
    /// A dead letter of an at-least-once queue, waiting for its settle.
    Discarded(u64),
}

/// Where every live message is, asserting none is in two places.
fn places(q: &QuorumQueue) -> BTreeMap<u64, Place> {
    let mut out = BTreeMap::new();
    for m in q.ready() {
        assert!(
            out.insert(m.index, Place::Ready).is_none(),
            "{} twice in ready",
            m.index
        );
    }
    for (id, c) in q.consumers() {
        for (msg_id, m) in &c.checked_out {
            let old = out.insert(m.index, Place::Held(id.clone(), *msg_id));
            assert!(old.is_none(), "{} held by {id:?} and {old:?}", m.index);
        }
    }
    for (id, d) in q.discards() {
        let old = out.insert(d.index, Place::Discarded(id));
        assert!(old.is_none(), "{} discarded and {old:?}", d.index);
    }
    out
}

/// Checks one applied entry against the state before and after it.
struct Checker {
    before: BTreeMap<u64, Place>,
    last_msg_id: MsgId,
}

impl Checker {
    fn new() -> Self {
        Checker {
            before: BTreeMap::new(),
            last_msg_id: 0,
        }
    }

    fn check(&mut self, q: &QuorumQueue, index: u64, op: &Op, effects: &[Effect]) {
        let after = places(q);

        // Publishes: one answer each; an accepted one is a new message at this index.
        let mut entered = BTreeSet::new();
        if let Op::Enqueue { publisher, seq, .. } = op {
            let answers: Vec<&Effect> = effects
                .iter()
                .filter(|e| matches!(e, Effect::Confirm { .. } | Effect::Reject { .. }))
                .collect();
            let rejected = effects.iter().any(|e| matches!(e, Effect::Reject { .. }));
            match publisher {
                Some(p) => {
                    assert_eq!(answers.len(), 1, "one answer per publish: {effects:?}");
                    match answers[0] {
                        Effect::Confirm { publisher, seq: s }
                        | Effect::Reject { publisher, seq: s } => {
                            assert_eq!((publisher, s), (p, seq));
                        }
                        _ => unreachable!(),
                    }
                }
                None => assert!(answers.is_empty()),
            }
            let named = effects.iter().any(|e| match e {
                Effect::Deliver { index: i, .. }
                | Effect::DeadLetter { index: i, .. }
                | Effect::Dropped { index: i, .. } => *i == index,
                _ => false,
            });
            if publisher.is_none() && !named && !after.contains_key(&index) {
                // Refused without a publisher to tell: only a reject-publish queue does that.
                assert_eq!(q.config().overflow, OverflowMode::RejectPublish);
            } else if !rejected {
                entered.insert(index);
            }
        }
        for i in after.keys() {
            assert!(
                self.before.contains_key(i) || entered.contains(i),
                "{i} appeared from nowhere"
            );
        }

        // Deliveries: ids increase; an unsettled one is held by its consumer now.
        let mut delivered_to = BTreeSet::new();
        let mut settled_on_delivery = BTreeSet::new();
        for e in effects {
            if let Effect::Deliver {
                consumer,
                msg_id,
                index: i,
                settled,
                ..
            }
            | Effect::Got {
                consumer,
                msg_id,
                index: i,
                settled,
                ..
            } = e
            {
                assert!(*msg_id > self.last_msg_id, "message ids increase");
                self.last_msg_id = *msg_id;
                if *settled {
                    assert!(settled_on_delivery.insert(*i));
                } else {
                    assert_eq!(
                        after.get(i),
                        Some(&Place::Held(consumer.clone(), *msg_id)),
                        "delivered {i} is held by its consumer"
                    );
                }
                if matches!(e, Effect::Deliver { .. }) {
                    delivered_to.insert(consumer.clone());
                }
            }
        }

        // Departures: each explained exactly once.
        let mut dead = BTreeSet::new();
        for e in effects {
            if let Effect::DeadLetter { index: i, .. } | Effect::Dropped { index: i, .. } = e {
                assert!(dead.insert(*i), "{i} dead twice");
                assert!(
                    self.before.contains_key(i) || entered.contains(i),
                    "dead {i} was not live"
                );
                assert!(
                    !matches!(self.before.get(i), Some(Place::Discarded(_))),
                    "{i} died again"
                );
                let held = match e {
                    Effect::DeadLetter { held, .. } => *held,
                    _ => None,
                };
                assert_eq!(
                    held.is_some(),
                    q.config().dead_letter_at_least_once,
                    "kept exactly when at least once"
                );
                match held {
                    Some(id) => assert_eq!(after.get(i), Some(&Place::Discarded(id))),
                    None => assert!(!after.contains_key(i), "dead {i} still live"),
                }
            }
        }
        let purged_count = effects.iter().find_map(|e| match e {
            Effect::Purged { count } => Some(*count),
            _ => None,
        });
        let mut purged = 0;
        let gone = self
            .before
            .iter()
            .map(|(i, p)| (*i, Some(p)))
            .chain(entered.iter().map(|i| (*i, None)))
            .filter(|(i, _)| !after.contains_key(i));
        for (i, place) in gone {
            let settled_by_ack = match (op, place) {
                (
                    Op::Settle {
                        consumer, msg_ids, ..
                    },
                    Some(Place::Held(c, id)),
                ) => c == consumer && msg_ids.contains(id),
                _ => false,
            };
            let settled_dead_letter = match (op, place) {
                (Op::SettleDeadLetters { ids }, Some(Place::Discarded(id))) => ids.contains(id),
                _ => false,
            };
            let reasons = [
                dead.contains(&i) && !matches!(place, Some(Place::Discarded(_))),
                settled_on_delivery.contains(&i),
                settled_by_ack,
                settled_dead_letter,
            ];
            let explained = reasons.iter().filter(|r| **r).count();
            assert!(explained <= 1, "{i} gone for two reasons: {reasons:?}");
            if explained == 0 {
                assert!(
                    matches!(op, Op::Purge) && place == Some(&Place::Ready),
                    "{i} ({place:?}) vanished without a reason on {op:?}: {effects:?}"
                );
                purged += 1;
            }
        }
        assert_eq!(purged_count.unwrap_or(0), purged, "Purged counts what went");

        // Credit: a delivery never takes a consumer past its credit.
        for id in &delivered_to {
            let c = q.consumer(id).expect("a consumer that got a delivery");
            if c.spec.credit > 0 && !c.spec.no_ack {
                assert!(
                    c.checked_out.len() <= c.spec.credit as usize,
                    "{id:?} holds {} with credit {}",
                    c.checked_out.len(),
                    c.spec.credit
                );
            }
            if q.config().single_active_consumer {
                assert_eq!(q.active_consumer(), Some(id), "only the active one gets");
            }
        }

        // Exclusive use: an exclusive consumer is alone.
        let up: Vec<&Consumer> = q
            .consumers()
            .filter(|(id, c)| c.status == Status::Up && !id.is_get())
            .map(|(_, c)| c)
            .collect();
        if up.iter().any(|c| c.spec.exclusive) {
            assert_eq!(up.len(), 1, "an exclusive consumer shares the queue");
        }

        // The release cursor: the lowest live index, or past the log when none is live.
        let cursor = q.release_cursor();
        match after.keys().next() {
            Some(lowest) => assert_eq!(cursor, *lowest),
            None => assert_eq!(cursor, index + 1),
        }

        // Counts.
        let ready = after.values().filter(|p| **p == Place::Ready).count() as u64;
        assert_eq!(q.ready_count(), ready);
        assert_eq!(
            q.ready_bytes(),
            q.ready().map(|m| m.size_bytes as u64).sum::<u64>()
        );
        let discarded = after
            .values()
            .filter(|p| matches!(p, Place::Discarded(_)))
            .count() as u64;
        assert_eq!(
            q.checked_out_count(),
            after.len() as u64 - ready - discarded
        );
        assert_eq!(q.discards_count().0, discarded);

        self.before = after;
    }
}

use warren_broker::quorum::Consumer;

/// Applies `steps` to a new queue, resolving each action against the state it meets and
/// checking every entry; returns the commands (the log) and each entry's effects.
fn run(
    config: &QuorumConfig,
    steps: &[(u64, Action)],
) -> (QuorumQueue, Vec<Command>, Vec<Vec<Effect>>) {
    let mut q = QuorumQueue::new(config.clone(), 0);
    let mut checker = Checker::new();
    let mut now_ms = 0;
    let mut log = Vec::new();
    let mut all_effects = Vec::new();
    for (i, (dt, action)) in steps.iter().enumerate() {
        let index = i as u64 + 1;
        now_ms += dt;
        let command = Command::new(now_ms, resolve(&q, action, index));
        let effects = q.apply(index, command.clone());
        checker.check(&q, index, &command.op, &effects);
        log.push(command);
        all_effects.push(effects);
    }
    (q, log, all_effects)
}

fn steps() -> impl Strategy<Value = Vec<(u64, Action)>> {
    prop::collection::vec((0u64..25, action()), 1..150)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_message_is_in_one_place_or_gone_for_one_reason(
        config in queue_config(),
        steps in steps(),
    ) {
        run(&config, &steps);
    }

    #[test]
    fn a_member_restored_from_a_snapshot_ends_where_the_others_do(
        config in queue_config(),
        steps in steps(),
        at in any::<prop::sample::Index>(),
    ) {
        let (full, log, effects) = run(&config, &steps);
        let k = at.index(log.len() + 1);
        let mut upto = QuorumQueue::new(config.clone(), 0);
        for (i, c) in log[..k].iter().enumerate() {
            upto.apply(i as u64 + 1, c.clone());
        }
        let mut restored = QuorumQueue::restore(&upto.snapshot()).expect("own snapshot");
        prop_assert_eq!(&restored, &upto);
        for (i, c) in log.iter().enumerate().skip(k) {
            let e = restored.apply(i as u64 + 1, c.clone());
            prop_assert_eq!(&e, &effects[i], "entry {} after a snapshot at {}", i + 1, k);
        }
        prop_assert_eq!(&restored, &full);
        prop_assert_eq!(restored.snapshot(), full.snapshot());
    }

    #[test]
    fn a_cut_snapshot_is_refused_not_misread(
        config in queue_config(),
        steps in steps(),
        cut in any::<prop::sample::Index>(),
    ) {
        let (q, _, _) = run(&config, &steps);
        let bytes = q.snapshot();
        let at = cut.index(bytes.len());
        prop_assert!(QuorumQueue::restore(&bytes[..at]).is_err(), "cut at {} of {}", at, bytes.len());
    }

    #[test]
    fn commands_survive_serialisation_unchanged(config in queue_config(), steps in steps()) {
        let (_, log, _) = run(&config, &steps);
        for c in log {
            let json = serde_json::to_vec(&c).expect("serialise");
            let back: Command = serde_json::from_slice(&json).expect("deserialise");
            prop_assert_eq!(back, c);
        }
    }
}
