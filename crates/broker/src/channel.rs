//! The consumer side of a channel, held by the vhost: delivery tags, the unacked ledger and
//! prefetch credit. (Publishing state such as confirms and transactions stays in the server.)

use crate::outbox::Outbox;
use crate::queue::{ChannelKey, ConnId, QueuedMessage};
use crate::relay::Relay;
use crate::routing::QueueId;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

#[derive(Debug)]
pub struct Unacked {
    pub tag: u64,
    pub queue: QueueId,
    /// `None` for a basic.get delivery, which no consumer's credit counts.
    pub consumer_tag: Option<Bytes>,
    pub message: QueuedMessage,
    pub settled: bool,
    /// For a delivery from a queue on another node, its tag there (what settling it names);
    /// 0 for a local one.
    pub home_tag: u64,
}

#[derive(Debug)]
pub struct ChannelState {
    /// Unique across a cluster's nodes: a stand-in has its client channel's key.
    pub key: ChannelKey,
    pub conn: ConnId,
    pub number: u16,
    pub outbox: Arc<Outbox>,
    pub next_tag: u64,
    /// Ordered by tag; settled entries in the middle are removed lazily from the front.
    pub unacked: VecDeque<Unacked>,
    pub unacked_live: u32,
    /// The unacked deliveries made to consumers, which the channel prefetch limits: RabbitMQ's
    /// limiter counts neither basic.get deliveries nor their acks (notify_limiter).
    pub consumer_unacked: u32,
    /// Prefetch applied to consumers created from now on (basic.qos global=false).
    pub consumer_prefetch: u32,
    /// Prefetch shared by the whole channel (basic.qos global=true); 0 means unlimited.
    pub channel_prefetch: u32,
    pub consumers: HashMap<Bytes, QueueId>,
    /// channel.flow active=false pauses deliveries.
    pub flow_active: bool,
    pub user: String,
    /// Direct reply-to: this channel's token and the consumer tag replies are delivered with.
    pub reply_to: Option<(Bytes, Bytes)>,
    /// Set on a stand-in for a channel whose client is connected to another node: deliveries
    /// go there as values instead of into `outbox`.
    pub relay: Option<Arc<dyn Relay>>,
    /// The node a stand-in's client is connected to.
    pub relayed_to: Option<Arc<str>>,
    /// A stand-in's client has more waiting in its socket's outbox than a local client may
    /// (its node said so): deliveries wait, as for a local client whose outbox is full.
    pub client_congested: bool,
    /// The nodes holding stand-ins for this channel (it consumed or got from their queues):
    /// they are told when it closes.
    pub remote_nodes: Vec<Arc<str>>,
    /// The storage log ids of the quorum queues (in a cluster) this channel consumed or got
    /// from: their groups are told when it closes, so what it held goes back to the queue.
    pub quorum_logs: Vec<u64>,
    /// Whether the client said consumer_cancel_notify in its capabilities: only then is it sent
    /// basic.cancel when the broker ends one of its consumers (RabbitMQ's rule); otherwise the
    /// consumer just stops getting messages.
    pub cancel_notify: bool,
    /// The queue whose consumer on this channel got the last delivery: under a channel-wide
    /// prefetch, freed credit goes to the channel's other queues first (round robin).
    pub last_served: Option<QueueId>,
    /// Consumer tags whose basic.cancel waits for the channel's queue.delete-ok (`Some` while
    /// the channel deletes a queue): RabbitMQ's channel answers delete-ok before it learns that
    /// its own consumers of the queue are gone, and clients such as py-amqp raise on a cancel
    /// that comes first.
    pub held_cancels: Option<Vec<Bytes>>,
}

impl std::fmt::Debug for dyn Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Relay")
    }
}

impl ChannelState {
    pub fn new(
        key: ChannelKey,
        conn: ConnId,
        number: u16,
        outbox: Arc<Outbox>,
        user: String,
    ) -> Self {
        ChannelState {
            key,
            conn,
            number,
            outbox,
            next_tag: 1,
            unacked: VecDeque::new(),
            unacked_live: 0,
            consumer_unacked: 0,
            consumer_prefetch: 0,
            channel_prefetch: 0,
            consumers: HashMap::new(),
            flow_active: true,
            user,
            reply_to: None,
            relay: None,
            relayed_to: None,
            client_congested: false,
            remote_nodes: Vec::new(),
            quorum_logs: Vec::new(),
            cancel_notify: true,
            last_served: None,
            held_cancels: None,
        }
    }

    /// Whether deliveries should wait until the client (or the node relaying to it) has
    /// taken what it has.
    pub fn is_congested(&self) -> bool {
        match &self.relay {
            Some(relay) => self.client_congested || relay.is_congested(),
            None => self.outbox.is_congested(),
        }
    }

    pub fn can_take(&self) -> bool {
        self.flow_active
            && (self.channel_prefetch == 0 || self.consumer_unacked < self.channel_prefetch)
    }

    pub fn next_delivery_tag(&mut self) -> u64 {
        let t = self.next_tag;
        self.next_tag += 1;
        t
    }

    pub fn record(&mut self, u: Unacked) {
        debug_assert!(
            self.unacked.back().is_none_or(|b| b.tag < u.tag),
            "delivery tags must increase"
        );
        self.unacked_live += 1;
        if u.consumer_tag.is_some() {
            self.consumer_unacked += 1;
        }
        self.unacked.push_back(u);
    }

    /// Settles `tag` (and everything below it when `multiple`); `None` when the tag is unknown,
    /// which RabbitMQ answers with 406 PRECONDITION_FAILED.
    pub fn settle(&mut self, tag: u64, multiple: bool) -> Option<Vec<Unacked>> {
        let mut out = Vec::new();
        if multiple {
            if tag != 0 && !self.unacked.iter().any(|u| u.tag == tag && !u.settled) {
                // RabbitMQ accepts multiple=true up to a tag only if that tag is outstanding.
                return None;
            }
            while let Some(front) = self.unacked.front() {
                if tag != 0 && front.tag > tag {
                    break;
                }
                let u = self.unacked.pop_front().expect("front exists");
                if !u.settled {
                    out.push(u);
                }
            }
        } else {
            let i = self.unacked.binary_search_by_key(&tag, |u| u.tag).ok()?;
            if self.unacked[i].settled {
                return None;
            }
            if i == 0 {
                out.push(self.unacked.pop_front().expect("front exists"));
            } else {
                // Keep a settled placeholder so the deque stays sorted; its message goes now.
                let u = &mut self.unacked[i];
                u.settled = true;
                out.push(Unacked {
                    tag: u.tag,
                    queue: u.queue,
                    consumer_tag: u.consumer_tag.clone(),
                    message: u.message.clone(),
                    settled: false,
                    home_tag: u.home_tag,
                });
            }
        }
        while self.unacked.front().is_some_and(|u| u.settled) {
            self.unacked.pop_front();
        }
        self.unacked_live -= out.len() as u32;
        self.consumer_unacked -= out.iter().filter(|u| u.consumer_tag.is_some()).count() as u32;
        Some(out)
    }

    /// Everything outstanding, for requeueing when the channel closes or recovers.
    pub fn drain_unacked(&mut self) -> Vec<Unacked> {
        self.drain_unacked_except(|_| false)
    }

    /// Everything outstanding but the tags `keep` names, which stay outstanding: basic.recover
    /// on a transactional channel leaves the deliveries its open transaction acked or nacked
    /// (RabbitMQ takes them out of the channel's unacked messages at the ack, not at commit).
    pub fn drain_unacked_except(&mut self, keep: impl Fn(u64) -> bool) -> Vec<Unacked> {
        let mut out = Vec::new();
        let mut kept = std::collections::VecDeque::new();
        // Settled placeholders only kept the deque sorted around a hole: a subsequence of it
        // is sorted too, so they go.
        for u in self.unacked.drain(..).filter(|u| !u.settled) {
            if keep(u.tag) {
                kept.push_back(u);
            } else {
                out.push(u);
            }
        }
        self.unacked_live = kept.len() as u32;
        self.consumer_unacked = kept.iter().filter(|u| u.consumer_tag.is_some()).count() as u32;
        self.unacked = kept;
        out
    }
}
