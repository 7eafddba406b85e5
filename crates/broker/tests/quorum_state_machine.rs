//! The quorum queue state machine, one behaviour per test, through its public API only: the
//! commands the server will propose and the effects it will carry out.

use bytes::Bytes;
use warren_broker::quorum::{
    Command, ConsumerId, ConsumerSpec, DeadLetterReason, Effect, EnqueueHeader, MsgId, Op,
    OverflowMode, PublisherId, QuorumConfig, QuorumQueue,
};

/// A queue and the log it is fed: each `apply` is the next entry.
struct Log {
    q: QuorumQueue,
    index: u64,
    now_ms: u64,
}

fn config() -> QuorumConfig {
    QuorumConfig {
        vhost: "/".into(),
        name: "q".into(),
        ..QuorumConfig::default()
    }
}

fn consumer(node: &str, channel: u64, tag: &str) -> ConsumerId {
    ConsumerId::new(node, channel, tag)
}

fn publisher() -> PublisherId {
    PublisherId::new("n1", 1)
}

fn spec(credit: u32) -> ConsumerSpec {
    ConsumerSpec {
        credit,
        ..ConsumerSpec::default()
    }
}

impl Log {
    fn new(config: QuorumConfig) -> Self {
        Log {
            q: QuorumQueue::new(config, 0),
            index: 0,
            now_ms: 0,
        }
    }

    fn apply(&mut self, op: Op) -> Vec<Effect> {
        self.index += 1;
        self.q.apply(self.index, Command::new(self.now_ms, op))
    }

    /// Publishes with confirms; returns the entry's index.
    fn publish_sized(&mut self, size_bytes: u32, ttl_ms: Option<u64>) -> (u64, Vec<Effect>) {
        let seq = self.index + 1;
        let effects = self.apply(Op::Enqueue {
            publisher: Some(publisher()),
            seq,
            header: EnqueueHeader {
                size_bytes,
                ttl_ms,
                high_priority: false,
            },
            payload: Bytes::from_static(b"body"),
        });
        (self.index, effects)
    }

    fn publish(&mut self) -> u64 {
        self.publish_sized(4, None).0
    }

    fn consume(&mut self, c: &ConsumerId, spec: ConsumerSpec) -> Vec<Effect> {
        self.apply(Op::Checkout {
            consumer: c.clone(),
            spec,
        })
    }

    fn get(&mut self, node: &str, channel: u64, no_ack: bool) -> Vec<Effect> {
        self.apply(Op::Dequeue {
            node: node.into(),
            channel,
            no_ack,
        })
    }

    fn ready_indexes(&self) -> Vec<u64> {
        self.q.ready().map(|m| m.index).collect()
    }
}

/// (consumer tag, index) of every delivery among `effects`.
fn deliveries(effects: &[Effect]) -> Vec<(String, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver {
                consumer, index, ..
            } => Some((consumer.tag.clone(), *index)),
            _ => None,
        })
        .collect()
}

fn msg_ids(effects: &[Effect]) -> Vec<MsgId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver { msg_id, .. } | Effect::Got { msg_id, .. } => Some(*msg_id),
            _ => None,
        })
        .collect()
}

/// (index, redelivered, delivery_count) of the one basic.get result among `effects`.
fn got(effects: &[Effect]) -> Option<(u64, bool, u32)> {
    effects.iter().find_map(|e| match e {
        Effect::Got {
            index,
            redelivered,
            delivery_count,
            ..
        } => Some((*index, *redelivered, *delivery_count)),
        _ => None,
    })
}

fn dead(effects: &[Effect]) -> Vec<(u64, DeadLetterReason)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeadLetter { index, reason, .. } | Effect::Dropped { index, reason } => {
                Some((*index, *reason))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_consumer_holds_no_more_unsettled_messages_than_its_credit() {
    let mut log = Log::new(config());
    let a = consumer("n1", 1, "a");
    for _ in 0..5 {
        log.publish();
    }
    let effects = log.consume(&a, spec(2));
    assert_eq!(deliveries(&effects), [("a".into(), 1), ("a".into(), 2)]);
    assert_eq!(log.q.ready_count(), 3);
    let ids = msg_ids(&effects);
    let effects = log.apply(Op::Settle {
        consumer: a.clone(),
        msg_ids: vec![ids[0]],
    });
    assert_eq!(
        deliveries(&effects),
        [("a".into(), 3)],
        "one settled, one more"
    );
    let effects = log.apply(Op::Credit {
        consumer: a.clone(),
        credit: 4,
    });
    assert_eq!(
        deliveries(&effects),
        [("a".into(), 4), ("a".into(), 5)],
        "a larger prefetch takes the rest"
    );
    assert_eq!(log.q.consumer(&a).unwrap().checked_out.len(), 4);
}

#[test]
fn consumers_of_equal_priority_are_served_round_robin() {
    let mut log = Log::new(config());
    let (a, b, c) = (
        consumer("n1", 1, "a"),
        consumer("n2", 1, "b"),
        consumer("n3", 1, "c"),
    );
    for id in [&a, &b, &c] {
        log.consume(id, spec(0));
    }
    let tags: Vec<String> = (0..6)
        .flat_map(|_| deliveries(&log.publish_sized(1, None).1))
        .map(|(t, _)| t)
        .collect();
    assert_eq!(tags, ["a", "b", "c", "a", "b", "c"]);
}

#[test]
fn higher_priority_consumers_get_messages_while_they_have_credit() {
    let mut log = Log::new(config());
    let low = consumer("n1", 1, "low");
    let high = consumer("n1", 2, "high");
    log.consume(&low, spec(0));
    log.consume(
        &high,
        ConsumerSpec {
            credit: 2,
            priority: 5,
            ..ConsumerSpec::default()
        },
    );
    let tags: Vec<String> = (0..4)
        .flat_map(|_| deliveries(&log.publish_sized(1, None).1))
        .map(|(t, _)| t)
        .collect();
    assert_eq!(
        tags,
        ["high", "high", "low", "low"],
        "the low one only once the high one is full"
    );
}

#[test]
fn single_active_consumer_gets_everything_until_it_goes_then_the_next_takes_over() {
    let mut log = Log::new(QuorumConfig {
        single_active_consumer: true,
        ..config()
    });
    let (a, b, c) = (
        consumer("n1", 1, "a"),
        consumer("n2", 1, "b"),
        consumer("n3", 1, "c"),
    );
    for id in [&a, &b, &c] {
        log.consume(id, spec(1));
    }
    assert_eq!(log.q.active_consumer(), Some(&a));
    let i1 = log.index + 1;
    let effects: Vec<Effect> = (0..3).flat_map(|_| log.publish_sized(1, None).1).collect();
    assert_eq!(
        deliveries(&effects),
        [("a".into(), i1)],
        "b and c wait even though a is full"
    );
    let effects = log.apply(Op::Cancel {
        consumer: a.clone(),
    });
    assert_eq!(log.q.active_consumer(), Some(&b));
    assert_eq!(deliveries(&effects), [("b".into(), i1 + 1)]);
    assert_eq!(
        log.q.consumer(&a).unwrap().checked_out.len(),
        1,
        "a may still ack what it has"
    );
    let effects = log.apply(Op::ChannelDown {
        node: "n2".into(),
        channel: 1,
    });
    assert_eq!(log.q.active_consumer(), Some(&c));
    assert_eq!(
        deliveries(&effects),
        [("c".into(), i1 + 1)],
        "b's message came back and goes first"
    );
}

#[test]
fn a_rejected_message_goes_to_the_back() {
    // test_quorum_queue_requeue_puts_the_message_at_the_back, as RabbitMQ 3.10 does it.
    let mut log = Log::new(config());
    let first = log.publish();
    log.publish();
    log.publish();
    let effects = log.get("n1", 1, false);
    let id = msg_ids(&effects)[0];
    log.apply(Op::Return {
        consumer: ConsumerId::get("n1", 1),
        msg_ids: vec![id],
        rejected: true,
    });
    let got: Vec<(u64, bool, u32)> = (0..3)
        .map(|_| got(&log.get("n1", 1, true)).unwrap())
        .collect();
    assert_eq!(
        got,
        [(2, false, 0), (3, false, 0), (first, true, 1)],
        "index, redelivered, delivery count"
    );
}

#[test]
fn recovered_messages_go_behind_earlier_returns_and_ahead_of_the_rest() {
    let mut log = Log::new(config());
    for _ in 0..4 {
        log.publish();
    }
    let a = consumer("n1", 1, "a");
    let ids = msg_ids(&log.consume(&a, spec(2)));
    log.apply(Op::Return {
        consumer: a.clone(),
        msg_ids: vec![ids[1]],
        rejected: false,
    });
    // a took message 2 again (it had credit for one more): now it holds 1 and 2.
    log.apply(Op::Cancel {
        consumer: a.clone(),
    });
    log.apply(Op::ChannelDown {
        node: "n1".into(),
        channel: 1,
    });
    assert_eq!(
        log.ready_indexes(),
        [1, 2, 3, 4],
        "returned in delivery order, ahead of 3 and 4"
    );
    let counts: Vec<u32> = log.q.ready().map(|m| m.delivery_count).collect();
    assert_eq!(counts, [1, 2, 0, 0]);
}

#[test]
fn delivery_count_starts_at_zero_and_counts_every_return() {
    let mut log = Log::new(config());
    log.publish();
    let holder = ConsumerId::get("n1", 1);
    let mut counts = Vec::new();
    for rejected in [true, false] {
        let effects = log.get("n1", 1, false);
        counts.push(got(&effects).unwrap().2);
        log.apply(Op::Return {
            consumer: holder.clone(),
            msg_ids: msg_ids(&effects),
            rejected,
        });
    }
    counts.push(got(&log.get("n1", 1, true)).unwrap().2);
    assert_eq!(counts, [0, 1, 2]);
}

#[test]
fn past_the_delivery_limit_a_message_is_dead_lettered() {
    // test_quorum_queue_delivery_limit_drops_after_limit: the first delivery plus two.
    let mut log = Log::new(QuorumConfig {
        delivery_limit: Some(2),
        dead_letter_exchange: true,
        ..config()
    });
    let index = log.publish();
    let holder = ConsumerId::get("n1", 1);
    let mut last = Vec::new();
    for _ in 0..3 {
        let effects = log.get("n1", 1, false);
        assert!(got(&effects).is_some(), "still in the queue");
        last = log.apply(Op::Return {
            consumer: holder.clone(),
            msg_ids: msg_ids(&effects),
            rejected: true,
        });
    }
    assert_eq!(
        last,
        [Effect::DeadLetter {
            index,
            reason: DeadLetterReason::DeliveryLimit,
            delivery_count: 3,
            held: None
        }]
    );
    assert!(matches!(
        log.get("n1", 1, false)[..],
        [Effect::GetEmpty { .. }]
    ));
    assert_eq!(
        log.q.release_cursor(),
        log.index + 1,
        "nothing live is left"
    );
}

#[test]
fn returns_from_closed_channels_count_towards_the_delivery_limit() {
    let mut log = Log::new(QuorumConfig {
        delivery_limit: Some(1),
        ..config()
    });
    let index = log.publish();
    let mut effects = Vec::new();
    for channel in [1, 2] {
        assert!(got(&log.get("n1", channel, false)).is_some());
        effects = log.apply(Op::ChannelDown {
            node: "n1".into(),
            channel,
        });
    }
    assert_eq!(
        dead(&effects),
        [(index, DeadLetterReason::DeliveryLimit)],
        "no dead-letter exchange: dropped"
    );
    assert_eq!(log.q.ready_count(), 0);
}

#[test]
fn a_message_expires_at_the_head_by_the_time_in_the_entry() {
    let mut log = Log::new(QuorumConfig {
        message_ttl_ms: Some(100),
        dead_letter_exchange: true,
        ..config()
    });
    log.now_ms = 1_000;
    let index = log.publish();
    assert_eq!(log.q.next_expiry_ms(), Some(1_100));
    log.now_ms = 1_099;
    assert!(log.apply(Op::Tick).is_empty());
    log.now_ms = 1_100;
    assert_eq!(
        log.apply(Op::Tick),
        [Effect::DeadLetter {
            index,
            reason: DeadLetterReason::Expired,
            delivery_count: 0,
            held: None
        }]
    );
    assert_eq!(log.q.next_expiry_ms(), None);
}

#[test]
fn only_the_head_expires_and_the_shorter_ttl_wins() {
    let mut log = Log::new(QuorumConfig {
        message_ttl_ms: Some(1_000),
        ..config()
    });
    let long = log.publish_sized(1, None).0;
    let short = log.publish_sized(1, Some(10)).0;
    log.now_ms = 500;
    assert!(
        dead(&log.apply(Op::Tick)).is_empty(),
        "the short one waits behind the head"
    );
    log.now_ms = 1_000;
    assert_eq!(
        dead(&log.apply(Op::Tick)),
        [
            (long, DeadLetterReason::Expired),
            (short, DeadLetterReason::Expired)
        ]
    );
}

#[test]
fn a_ttl_of_zero_reaches_a_waiting_consumer_or_nobody() {
    let mut log = Log::new(config());
    let (index, effects) = log.publish_sized(1, Some(0));
    assert_eq!(dead(&effects), [(index, DeadLetterReason::Expired)]);
    let a = consumer("n1", 1, "a");
    log.consume(&a, spec(1));
    let (index, effects) = log.publish_sized(1, Some(0));
    assert_eq!(deliveries(&effects), [("a".into(), index)]);
    assert!(dead(&effects).is_empty());
}

#[test]
fn drop_head_keeps_the_newest_messages_and_confirms_them_all() {
    // test_quorum_queue_max_length_drop_head.
    let mut log = Log::new(QuorumConfig {
        max_length: Some(2),
        dead_letter_exchange: true,
        ..config()
    });
    let effects: Vec<Effect> = (0..4).flat_map(|_| log.publish_sized(1, None).1).collect();
    assert_eq!(log.ready_indexes(), [3, 4]);
    assert_eq!(
        dead(&effects),
        [(1, DeadLetterReason::MaxLen), (2, DeadLetterReason::MaxLen)]
    );
    let confirms = effects
        .iter()
        .filter(|e| matches!(e, Effect::Confirm { .. }))
        .count();
    assert_eq!(confirms, 4);
}

#[test]
fn reject_publish_refuses_once_the_queue_is_already_over_its_length() {
    // test_quorum_queue_reject_publish_nacks_once_the_queue_is_over_its_limit.
    let mut log = Log::new(QuorumConfig {
        max_length: Some(1),
        overflow: OverflowMode::RejectPublish,
        ..config()
    });
    let outcomes: Vec<&str> = (0..4)
        .map(|_| match log.publish_sized(1, None).1[..] {
            [Effect::Confirm { .. }] => "ack",
            [Effect::Reject { .. }] => "nack",
            _ => "other",
        })
        .collect();
    assert_eq!(outcomes, ["ack", "ack", "nack", "nack"]);
    assert_eq!(log.q.ready_count(), 2);
}

#[test]
fn reject_publish_refuses_from_over_the_limit_until_back_to_80_percent_of_it() {
    // rabbit_fifo's soft limit: making room for one message does not let one more in.
    let mut log = Log::new(QuorumConfig {
        max_length: Some(5),
        overflow: OverflowMode::RejectPublish,
        ..config()
    });
    let publish = |log: &mut Log| match log.publish_sized(1, None).1[..] {
        [Effect::Confirm { .. }] => "ack",
        [Effect::Reject { .. }] => "nack",
        _ => "other",
    };
    let filled: Vec<&str> = (0..7).map(|_| publish(&mut log)).collect();
    assert_eq!(filled, ["ack", "ack", "ack", "ack", "ack", "ack", "nack"]);
    assert!(got(&log.get("n1", 1, true)).is_some());
    assert_eq!(log.q.ready_count(), 5);
    assert_eq!(
        publish(&mut log),
        "nack",
        "5 of 5 is over 80 % of the limit"
    );
    assert!(got(&log.get("n1", 1, true)).is_some());
    assert_eq!(log.q.ready_count(), 4);
    assert_eq!(publish(&mut log), "ack", "4 of 5 is back to 80 %");
    assert_eq!(publish(&mut log), "ack");
    assert_eq!(publish(&mut log), "nack");
}

#[test]
fn reject_publish_refuses_a_message_that_would_exceed_the_byte_limit() {
    let mut log = Log::new(QuorumConfig {
        max_length_bytes: Some(10),
        overflow: OverflowMode::RejectPublish,
        ..config()
    });
    assert!(matches!(
        log.publish_sized(6, None).1[..],
        [Effect::Confirm { .. }]
    ));
    assert!(matches!(
        log.publish_sized(5, None).1[..],
        [Effect::Reject { .. }]
    ));
    assert!(matches!(
        log.publish_sized(4, None).1[..],
        [Effect::Confirm { .. }]
    ));
    assert_eq!(log.q.ready_bytes(), 10);
}

#[test]
fn a_waiting_consumer_gets_a_message_even_from_a_max_length_zero_queue() {
    let mut log = Log::new(QuorumConfig {
        max_length: Some(0),
        ..config()
    });
    let a = consumer("n1", 1, "a");
    log.consume(&a, spec(1));
    let (first, effects) = log.publish_sized(1, None);
    assert_eq!(deliveries(&effects), [("a".into(), first)]);
    let (second, effects) = log.publish_sized(1, None);
    assert_eq!(dead(&effects), [(second, DeadLetterReason::MaxLen)]);
}

#[test]
fn purge_takes_the_ready_messages_and_leaves_the_delivered_ones() {
    let mut log = Log::new(config());
    for _ in 0..5 {
        log.publish();
    }
    let a = consumer("n1", 1, "a");
    log.consume(&a, spec(2));
    assert_eq!(log.apply(Op::Purge), [Effect::Purged { count: 3 }]);
    assert_eq!(log.q.ready_count(), 0);
    assert_eq!(log.q.checked_out_count(), 2);
    assert_eq!(
        log.q.release_cursor(),
        1,
        "the delivered ones still need their entries"
    );
}

#[test]
fn a_node_going_down_cancels_its_consumers_and_returns_what_they_held() {
    let mut log = Log::new(config());
    let here = consumer("n1", 1, "here");
    let there = consumer("n2", 1, "there");
    log.consume(&there, spec(2));
    for _ in 0..2 {
        log.publish();
    }
    log.consume(&here, spec(0));
    let effects = log.apply(Op::NodeDown { node: "n2".into() });
    assert_eq!(effects[0], Effect::ConsumerCancelled { consumer: there });
    let redelivered: Vec<(u64, bool)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver {
                consumer,
                index,
                redelivered,
                ..
            } if *consumer == here => Some((*index, *redelivered)),
            _ => None,
        })
        .collect();
    assert_eq!(
        redelivered,
        [(2, true), (3, true)],
        "entry 1 was the checkout"
    );
    assert_eq!(log.q.consumer_count(), 1);
}

#[test]
fn a_no_ack_consumer_settles_as_it_receives() {
    let mut log = Log::new(config());
    let a = consumer("n1", 1, "a");
    log.consume(
        &a,
        ConsumerSpec {
            credit: 1,
            no_ack: true,
            ..ConsumerSpec::default()
        },
    );
    let effects: Vec<Effect> = (0..3).flat_map(|_| log.publish_sized(1, None).1).collect();
    assert_eq!(
        deliveries(&effects).len(),
        3,
        "prefetch does not limit no-ack"
    );
    assert!(effects
        .iter()
        .all(|e| !matches!(e, Effect::Deliver { settled: false, .. })));
    assert_eq!(log.q.checked_out_count(), 0);
    assert_eq!(log.q.release_cursor(), log.index + 1);
}

#[test]
fn basic_get_reports_what_is_left_and_its_unacked_message_returns_when_the_channel_closes() {
    // test_unacked_quorum_messages_return_when_the_channel_closes.
    let mut log = Log::new(config());
    let index = log.publish();
    log.publish();
    let effects = log.get("n1", 2, false);
    assert!(matches!(
        effects[..],
        [Effect::Got {
            remaining: 1,
            settled: false,
            ..
        }]
    ));
    assert_eq!(log.q.checked_out_count(), 1);
    assert_eq!(log.q.consumer_count(), 0, "a get holder is no consumer");
    log.apply(Op::ChannelDown {
        node: "n1".into(),
        channel: 2,
    });
    assert_eq!(got(&log.get("n1", 1, true)), Some((index, true, 1)));
    assert_eq!(got(&log.get("n1", 1, true)), Some((2, false, 0)));
    assert!(matches!(
        log.get("n1", 1, true)[..],
        [Effect::GetEmpty { .. }]
    ));
}

#[test]
fn basic_get_on_a_single_active_consumer_queue_is_refused_as_rabbitmq_does() {
    let mut log = Log::new(QuorumConfig {
        single_active_consumer: true,
        ..config()
    });
    log.publish();
    let effects = log.get("n1", 1, false);
    let [Effect::GetRefused { error, .. }] = &effects[..] else {
        panic!("{effects:?}");
    };
    assert_eq!(error.code, 405);
    assert_eq!(
        error.text,
        "RESOURCE_LOCKED - cannot obtain access to locked queue 'q' in vhost '/'. basic.get \
         operations are not supported by quorum queues with single active consumer"
    );
}

#[test]
fn an_exclusive_consumer_keeps_others_out_and_needs_the_queue_to_itself() {
    let mut log = Log::new(config());
    let a = consumer("n1", 1, "a");
    let b = consumer("n2", 1, "b");
    let exclusive = ConsumerSpec {
        exclusive: true,
        ..ConsumerSpec::default()
    };
    log.consume(&a, ConsumerSpec::default());
    let refused = log.consume(&b, exclusive);
    let [Effect::CheckoutRefused { consumer, error }] = &refused[..] else {
        panic!("{refused:?}");
    };
    assert_eq!(consumer, &b);
    assert_eq!(error.code, 403);
    assert_eq!(
        error.text,
        "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use"
    );
    log.apply(Op::Cancel {
        consumer: a.clone(),
    });
    assert!(log.consume(&b, exclusive).is_empty());
    assert!(matches!(
        log.consume(&a, ConsumerSpec::default())[..],
        [Effect::CheckoutRefused { .. }]
    ));
}

#[test]
fn a_cancelled_consumer_may_still_settle_and_goes_once_it_holds_nothing() {
    let mut log = Log::new(config());
    let a = consumer("n1", 1, "a");
    let b = consumer("n1", 1, "b");
    log.consume(&a, spec(0));
    log.publish();
    let ids: Vec<MsgId> = log
        .q
        .consumer(&a)
        .unwrap()
        .checked_out
        .keys()
        .copied()
        .collect();
    log.apply(Op::Cancel {
        consumer: a.clone(),
    });
    log.consume(&b, spec(0));
    let (index, effects) = log.publish_sized(1, None);
    assert_eq!(
        deliveries(&effects),
        [("b".into(), index)],
        "no more deliveries to a"
    );
    log.apply(Op::Settle {
        consumer: a.clone(),
        msg_ids: ids,
    });
    assert!(log.q.consumer(&a).is_none());
    assert_eq!(log.q.checked_out_count(), 1);
}

#[test]
fn discard_dead_letters_as_rejected_without_counting_a_delivery() {
    let mut log = Log::new(QuorumConfig {
        dead_letter_exchange: true,
        ..config()
    });
    let index = log.publish();
    let effects = log.get("n1", 1, false);
    let effects = log.apply(Op::Discard {
        consumer: ConsumerId::get("n1", 1),
        msg_ids: msg_ids(&effects),
    });
    assert_eq!(
        effects,
        [Effect::DeadLetter {
            index,
            reason: DeadLetterReason::Rejected,
            delivery_count: 0,
            held: None
        }]
    );
}

fn at_least_once() -> QuorumConfig {
    QuorumConfig {
        dead_letter_exchange: true,
        dead_letter_at_least_once: true,
        overflow: OverflowMode::RejectPublish,
        ..config()
    }
}

/// Publishes one message, takes it with basic.get and rejects it: returns its index and the
/// effects of the reject.
fn publish_and_discard(log: &mut Log) -> (u64, Vec<Effect>) {
    let index = log.publish();
    let got = log.get("n1", 1, false);
    let effects = log.apply(Op::Discard {
        consumer: ConsumerId::get("n1", 1),
        msg_ids: msg_ids(&got),
    });
    (index, effects)
}

#[test]
fn an_at_least_once_dead_letter_is_kept_until_its_settle_commits() {
    let mut log = Log::new(at_least_once());
    let (index, effects) = publish_and_discard(&mut log);
    let [Effect::DeadLetter {
        index: i,
        reason: DeadLetterReason::Rejected,
        held: Some(id),
        ..
    }] = effects[..]
    else {
        panic!("{effects:?}");
    };
    assert_eq!(i, index);
    assert_eq!(log.q.discards_count(), (1, 4));
    assert_eq!(log.q.release_cursor(), index, "its body stays in the log");
    let restored = QuorumQueue::restore(&log.q.snapshot()).unwrap();
    assert_eq!(restored, log.q);
    assert_eq!(restored.release_cursor(), index, "and after a restore");

    log.apply(Op::SettleDeadLetters { ids: vec![id] });
    assert_eq!(log.q.discards_count(), (0, 0));
    assert_eq!(log.q.release_cursor(), log.index + 1);
    // A second leader settling it again changes nothing.
    log.apply(Op::SettleDeadLetters { ids: vec![id] });
    assert_eq!(log.q.discards_count(), (0, 0));
}

#[test]
fn at_least_once_needs_reject_publish_and_a_dead_letter_exchange() {
    use warren_broker::args::{Overflow, QueueConfig};
    let declared = |overflow, dlx: Option<&str>| QueueConfig {
        overflow,
        dead_letter_exchange: dlx.map(String::from),
        dead_letter_at_least_once: true,
        ..QueueConfig::default()
    };
    let effective = |c: &QueueConfig| QuorumConfig::new("/", "q", c).dead_letter_at_least_once;
    assert!(effective(&declared(Overflow::RejectPublish, Some("dlx"))));
    assert!(!effective(&declared(Overflow::DropHead, Some("dlx"))));
    assert!(!effective(&declared(Overflow::RejectPublish, None)));
    // Falling back, a dead letter is gone at once.
    let mut log = Log::new(QuorumConfig::new(
        "/",
        "q",
        &declared(Overflow::DropHead, Some("dlx")),
    ));
    let (_, effects) = publish_and_discard(&mut log);
    assert!(matches!(
        effects[..],
        [Effect::DeadLetter { held: None, .. }]
    ));
    assert_eq!(log.q.discards_count(), (0, 0));
}

#[test]
fn waiting_dead_letters_count_against_the_length_limit() {
    let mut log = Log::new(QuorumConfig {
        max_length: Some(1),
        ..at_least_once()
    });
    publish_and_discard(&mut log);
    let outcome = |log: &mut Log| match log.publish_sized(1, None).1[..] {
        [Effect::Confirm { .. }] => "ack",
        [Effect::Reject { .. }] => "nack",
        _ => "other",
    };
    // One ready message and one dead letter waiting: over the limit of 1.
    assert_eq!(outcome(&mut log), "ack");
    assert_eq!(outcome(&mut log), "nack");
    let id = log.q.discards().next().unwrap().0;
    log.apply(Op::SettleDeadLetters { ids: vec![id] });
    // Settled, it no longer counts; the ready one alone is still over 80 % of the limit.
    assert_eq!(outcome(&mut log), "nack");
    assert!(got(&log.get("n1", 1, true)).is_some());
    assert_eq!(outcome(&mut log), "ack", "empty: back under the soft limit");
}

#[test]
fn the_release_cursor_is_the_lowest_index_a_live_message_needs() {
    let mut log = Log::new(config());
    let a = consumer("n1", 1, "a");
    log.consume(&a, spec(1));
    let i1 = log.publish();
    let i2 = log.publish();
    let i3 = log.publish();
    assert_eq!(log.q.release_cursor(), i1, "i1 is delivered, unsettled");
    let settle_all = |log: &mut Log| {
        let held: Vec<MsgId> = log
            .q
            .consumer(&a)
            .unwrap()
            .checked_out
            .keys()
            .copied()
            .collect();
        log.apply(Op::Settle {
            consumer: a.clone(),
            msg_ids: held,
        })
    };
    let effects = settle_all(&mut log);
    assert_eq!(deliveries(&effects), [("a".into(), i2)]);
    assert_eq!(log.q.release_cursor(), i2);
    // Rejected, i2 goes behind i3, which a takes: i2 is ready but older than anything held.
    let effects = log.apply(Op::Return {
        consumer: a.clone(),
        msg_ids: msg_ids(&effects),
        rejected: true,
    });
    assert_eq!(deliveries(&effects), [("a".into(), i3)]);
    assert_eq!(log.ready_indexes(), [i2]);
    assert_eq!(log.q.release_cursor(), i2);
    let effects = settle_all(&mut log);
    assert_eq!(deliveries(&effects), [("a".into(), i2)]);
    assert_eq!(log.q.release_cursor(), i2);
    settle_all(&mut log);
    assert_eq!(
        log.q.release_cursor(),
        log.index + 1,
        "nothing live is left"
    );
}

#[test]
fn a_restored_snapshot_is_the_same_queue() {
    let mut log = Log::new(QuorumConfig {
        message_ttl_ms: Some(50),
        delivery_limit: Some(3),
        ..config()
    });
    let a = consumer("n1", 1, "a");
    log.consume(&a, spec(1));
    for _ in 0..3 {
        log.publish();
    }
    log.get("n2", 7, false);
    let restored = QuorumQueue::restore(&log.q.snapshot()).unwrap();
    assert_eq!(restored, log.q);
    assert_eq!(restored.release_cursor(), log.q.release_cursor());
    assert!(QuorumQueue::restore(&[9, b'{', b'}']).is_err());
    assert!(QuorumQueue::restore(&[]).is_err());
}

#[test]
fn a_backlog_snapshot_costs_a_few_bytes_per_message() {
    let mut log = Log::new(config());
    const BACKLOG: u64 = 10_000;
    for _ in 0..BACKLOG {
        log.publish_sized(1_000, None);
    }
    let bytes = log.q.snapshot();
    assert!(
        (bytes.len() as u64) < BACKLOG * 6,
        "{} bytes for {BACKLOG} messages",
        bytes.len()
    );
    assert_eq!(QuorumQueue::restore(&bytes).unwrap(), log.q);
}

#[test]
fn a_queue_is_unused_from_when_its_last_consumer_went() {
    let mut log = Log::new(config());
    assert_eq!(log.q.unused_since_ms(), Some(0), "unused since its declare");
    let a = consumer("n1", 1, "a");
    log.now_ms = 100;
    log.consume(&a, spec(0));
    assert_eq!(log.q.unused_since_ms(), None);
    log.now_ms = 250;
    log.apply(Op::NodeDown { node: "n1".into() });
    assert_eq!(log.q.unused_since_ms(), Some(250));
    log.now_ms = 300;
    log.get("n2", 1, true);
    assert_eq!(log.q.unused_since_ms(), Some(300), "a basic.get uses it");
}

#[test]
fn a_single_active_consumer_on_a_downed_node_hands_over_what_it_held() {
    let mut log = Log::new(QuorumConfig {
        single_active_consumer: true,
        ..config()
    });
    let a = consumer("n1", 1, "a");
    let b = consumer("n2", 1, "b");
    log.consume(&a, spec(0));
    log.consume(&b, spec(0));
    let first = log.publish();
    let second = log.publish();
    let effects = log.apply(Op::NodeDown { node: "n1".into() });
    assert_eq!(effects[0], Effect::ConsumerCancelled { consumer: a });
    assert_eq!(
        deliveries(&effects),
        [("b".into(), first), ("b".into(), second)]
    );
    assert_eq!(log.q.active_consumer(), Some(&b));
}

#[test]
fn a_publish_proposed_again_is_applied_once_and_a_skipped_number_is_not_waited_for() {
    let mut log = Log::new(config());
    let enqueue = |seq: u64, channel: u64| Op::Enqueue {
        publisher: Some(PublisherId::new("n2", channel)),
        seq,
        header: EnqueueHeader::default(),
        payload: Bytes::from_static(b"body"),
    };
    let confirmed = |effects: &[Effect]| -> Vec<u64> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Confirm { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect()
    };
    assert_eq!(confirmed(&log.apply(enqueue(1, 5))), vec![1]);
    // 2 was lost with a leader; 3 is applied all the same, and 1 and 3 sent again are not.
    assert_eq!(confirmed(&log.apply(enqueue(3, 5))), vec![3]);
    assert!(log.apply(enqueue(1, 5)).is_empty());
    assert!(log.apply(enqueue(3, 5)).is_empty());
    assert!(
        log.apply(enqueue(2, 5)).is_empty(),
        "behind 3: never applied"
    );
    // Another channel numbers its own publishes.
    assert_eq!(confirmed(&log.apply(enqueue(1, 6))), vec![1]);
    assert_eq!(log.q.ready_count(), 3);
    // Publishers outlive a node going down (it may only be cut off) ...
    log.apply(Op::NodeDown { node: "n2".into() });
    assert!(log.apply(enqueue(3, 5)).is_empty());
    // ... and go with their channel: a new channel of that key would start afresh.
    let restored = QuorumQueue::restore(&log.q.snapshot()).unwrap();
    assert_eq!(restored, log.q, "the numbering survives a snapshot");
    log.apply(Op::ChannelDown {
        node: "n2".into(),
        channel: 5,
    });
    assert_eq!(confirmed(&log.apply(enqueue(1, 5))), vec![1]);
    assert_eq!(log.q.ready_count(), 4);
}
