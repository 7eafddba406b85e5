//! Two vhosts as two nodes of a cluster, with the values they exchange carried by hand: a
//! queue lives on n1, its publisher and consumer are connected to n2.

mod support;

use std::sync::{Arc, Mutex};
use support::{Event, Harness};
use warren_broker::queue::ChannelKey;
use warren_broker::relay::{Delivery, Relay, RemoteEffect, SettleOp};

/// A stand-in's relay that keeps what it is handed, as the cluster's link would carry it.
#[derive(Default)]
struct Link {
    deliveries: Mutex<Vec<Delivery>>,
    cancelled: Mutex<Vec<(ChannelKey, Vec<u8>)>>,
}

impl Relay for Link {
    fn deliver(&self, d: Delivery) {
        self.deliveries.lock().unwrap().push(d);
    }
    fn cancelled(&self, channel: ChannelKey, consumer_tag: &[u8]) {
        self.cancelled
            .lock()
            .unwrap()
            .push((channel, consumer_tag.to_vec()));
    }
    fn is_congested(&self) -> bool {
        false
    }
}

/// n1 hosts "q"; n2 has the same topology.
fn nodes() -> (Harness, Harness) {
    let mut n1 = Harness::new();
    let mut n2 = Harness::new();
    for (h, me) in [(&mut n1, "n1"), (&mut n2, "n2")] {
        h.vh.set_local_node(me.into());
        h.declare("q");
        h.vh.set_queue_home("q", "n1");
    }
    (n1, n2)
}

/// Carries n2's forwards to n1, as the server does with a `Publish` frame.
fn carry_forwards(from: &mut Harness, to: &mut Harness) -> usize {
    let mut n = 0;
    for e in from.vh.take_remote() {
        if let RemoteEffect::Forward {
            node,
            queues,
            message,
        } = e
        {
            assert_eq!(&*node, "n1");
            to.vh.enqueue_forwarded(&queues, message, to.now_ms);
            n += 1;
        }
    }
    n
}

#[test]
fn a_publish_on_the_client_node_is_forwarded_and_enqueued_only_where_the_queue_lives() {
    let (mut n1, mut n2) = nodes();
    let outcome = n2.publish("", "q", "hello");
    assert!(outcome.routed && !outcome.rejected);
    assert_eq!(n2.ready("q"), 0, "n2's copy of the queue holds nothing");
    assert_eq!(carry_forwards(&mut n2, &mut n1), 1);
    assert_eq!(n1.ready("q"), 1);
    // A forward names the queues; n1 does not route it again (n1 has no binding for it).
    n1.exchange("x", "fanout");
    n2.exchange("x", "fanout");
    n2.bind("q", "x", "");
    n2.publish("x", "", "via x");
    assert_eq!(carry_forwards(&mut n2, &mut n1), 1);
    assert_eq!(n1.ready("q"), 2);
}

#[test]
fn a_forward_to_a_queue_its_node_does_not_know_yet_is_refused_not_confirmed() {
    let (mut n1, mut n2) = nodes();
    // n2 has applied a declare of "late" on n1 that n1 has not applied yet.
    n2.declare("late");
    n2.vh.set_queue_home("late", "n1");
    n2.publish("", "late", "early bird");
    let mut outcomes = Vec::new();
    for e in n2.vh.take_remote() {
        if let RemoteEffect::Forward {
            queues, message, ..
        } = e
        {
            outcomes.push(n1.vh.enqueue_forwarded(&queues, message, n1.now_ms));
        }
    }
    assert_eq!(outcomes.len(), 1);
    assert!(
        outcomes[0].rejected,
        "the publisher gets a nack and publishes again"
    );
}

#[test]
fn a_remote_consumer_gets_its_own_channels_tags_and_its_acks_settle_on_the_queues_node() {
    let (mut n1, mut n2) = nodes();
    for body in ["a", "b", "c"] {
        n1.publish("", "q", body);
    }
    let ch = n2.open(7);
    // A local queue's delivery first, so the channel's tags are not the queue node's.
    n2.declare("local");
    n2.vh.set_queue_home("local", "n2");
    n2.publish("", "local", "here");
    n2.consume(ch, "local", "lc", false);
    assert_eq!(n2.bodies(ch), vec!["here"]);

    let (tag, node) = n2.vh.consume_remote(ch, "q", "rc").unwrap();
    assert_eq!((tag.as_str(), &*node), ("rc", "n1"));
    let link = Arc::new(Link::default());
    n1.vh
        .open_stand_in(ch, 7, 1, "guest", "n2".into(), link.clone());
    n1.qos(ch, 2, false);
    n1.consume(ch, "q", "rc", false);
    n1.vh.kick("q", n1.now_ms);
    let relayed: Vec<Delivery> = std::mem::take(&mut *link.deliveries.lock().unwrap());
    assert_eq!(
        relayed.len(),
        2,
        "the stand-in honours the client's prefetch"
    );
    for d in relayed {
        n2.vh.accept_delivery(&node, d, None);
    }
    let got = n2.deliveries(ch);
    assert_eq!(
        got.iter()
            .map(|d| (d.delivery_tag, d.body_str()))
            .collect::<Vec<_>>(),
        vec![(2, "a"), (3, "b")]
    );
    assert_eq!(got[0].consumer_tag.as_deref(), Some("rc"));

    // Acking the client's tags 1..=3 at once: the local one settles here, the others there.
    n2.ack(ch, 3, true).unwrap();
    let effects = n2.vh.take_remote();
    let [RemoteEffect::Settle {
        node,
        channel,
        op,
        tags,
    }] = effects.as_slice()
    else {
        panic!("one settle for n1, got {effects:?}");
    };
    assert_eq!((&**node, *channel, *op), ("n1", ch, SettleOp::Ack));
    assert_eq!(tags, &vec![1, 2], "n1's own tags");
    n1.vh.settle_stand_in(ch, SettleOp::Ack, tags, n1.now_ms);
    assert_eq!(
        (n1.ready("q"), n1.unacked("q")),
        (0, 1),
        "c went out as credit returned"
    );
}

#[test]
fn a_rejected_remote_delivery_goes_back_and_a_closed_channel_requeues_everything_there() {
    let (mut n1, mut n2) = nodes();
    n1.publish("", "q", "a");
    n1.publish("", "q", "b");
    let ch = n2.open(7);
    let (_, node) = n2.vh.consume_remote(ch, "q", "rc").unwrap();
    let link = Arc::new(Link::default());
    n1.vh
        .open_stand_in(ch, 7, 1, "guest", "n2".into(), link.clone());
    n1.consume(ch, "q", "rc", false);
    for d in std::mem::take(&mut *link.deliveries.lock().unwrap()) {
        n2.vh.accept_delivery(&node, d, None);
    }
    assert_eq!(n2.bodies(ch), vec!["a", "b"]);
    n2.nack(ch, 1, false, true).unwrap();
    match n2.vh.take_remote().as_slice() {
        [RemoteEffect::Settle { op, tags, .. }] => {
            assert_eq!((*op, tags.as_slice()), (SettleOp::Requeue, &[1][..]))
        }
        other => panic!("{other:?}"),
    }
    // The channel closes before the requeue arrives: n1 is told to close the stand-in.
    n2.close(ch);
    assert!(n2.vh.take_remote().iter().any(
        |e| matches!(e, RemoteEffect::Close { node, channel } if &**node == "n1" && *channel == ch)
    ));
    n1.vh
        .settle_stand_in(ch, SettleOp::Requeue, &[1], n1.now_ms);
    n1.vh.channel_close(ch, n1.now_ms);
    assert_eq!((n1.ready("q"), n1.unacked("q")), (2, 0));
}

#[test]
fn when_the_queues_node_is_lost_its_consumers_are_cancelled_and_their_deliveries_forgotten() {
    let (mut n1, mut n2) = nodes();
    n1.publish("", "q", "a");
    let ch = n2.open(7);
    let (_, node) = n2.vh.consume_remote(ch, "q", "rc").unwrap();
    let link = Arc::new(Link::default());
    n1.vh
        .open_stand_in(ch, 7, 1, "guest", "n2".into(), link.clone());
    n1.consume(ch, "q", "rc", false);
    for d in std::mem::take(&mut *link.deliveries.lock().unwrap()) {
        n2.vh.accept_delivery(&node, d.clone(), None);
    }
    assert_eq!(n2.bodies(ch), vec!["a"]);
    n2.vh.remote_node_lost("n1");
    assert_eq!(n2.events(ch), vec![Event::Cancel("rc".into())]);
    assert!(
        n2.ack(ch, 1, false).is_err(),
        "the delivery is gone from the ledger"
    );
    // ... and n1, seeing the same break, requeues what the stand-in had out.
    n1.vh.close_stand_ins("n2", n1.now_ms);
    assert_eq!((n1.ready("q"), n1.unacked("q")), (1, 0));
}

#[test]
fn deleting_the_queue_cancels_remote_consumers_through_their_relay() {
    let (mut n1, mut n2) = nodes();
    let ch = n2.open(7);
    n2.vh.consume_remote(ch, "q", "rc").unwrap();
    let link = Arc::new(Link::default());
    n1.vh
        .open_stand_in(ch, 7, 1, "guest", "n2".into(), link.clone());
    n1.consume(ch, "q", "rc", false);
    n1.vh.queue_delete(1, "q", false, false).unwrap();
    let cancelled = link.cancelled.lock().unwrap().clone();
    assert_eq!(cancelled, vec![(ch, b"rc".to_vec())]);
    n2.vh.remote_consumer_cancelled(ch, b"rc");
    assert_eq!(n2.events(ch), vec![Event::Cancel("rc".into())]);
}
