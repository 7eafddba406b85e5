//! A vhost's side of messages that cross nodes (see [`crate::relay`]).
//!
//! Two roles, often on the same node at once:
//! - **The client's node** routes a publish and forwards what is bound for queues hosted
//!   elsewhere; it registers its clients' consumers of remote queues in their channels, gives
//!   each relayed delivery a tag of the client's channel, and turns acks of those tags back into
//!   the tags of the queue's node.
//! - **The queue's node** enqueues forwarded publishes without routing them again, and serves
//!   remote consumers through stand-in channels whose deliveries go to a [`Relay`].
//!
//! Either side of a link that broke forgets the other's share: the client's node cancels its
//! clients' consumers of the lost node's queues (basic.cancel, as RabbitMQ does when a queue's
//! node goes down) and drops their deliveries from its ledgers; the queue's node closes the
//! stand-ins, requeueing everything they had out.

use super::*;

impl VHost {
    // ---- effects ---------------------------------------------------------------------------

    /// Work for other nodes since the last call, in the order it was made.
    pub fn take_remote(&mut self) -> Vec<RemoteEffect> {
        std::mem::take(&mut self.remote)
    }

    pub fn has_remote(&self) -> bool {
        !self.remote.is_empty()
    }

    /// The settlements of quorum queue deliveries among the work for other nodes, taken out
    /// (the rest stays, in order): a transaction's commit waits for them to be applied.
    pub fn take_quorum_settles(&mut self) -> Vec<RemoteEffect> {
        let (settles, rest) = std::mem::take(&mut self.remote)
            .into_iter()
            .partition(|e| matches!(e, RemoteEffect::QuorumSettle { .. }));
        self.remote = rest;
        settles
    }

    /// The node hosting `queue`, when it exists and that is not this node.
    pub fn remote_home(&self, queue: &str) -> Option<Arc<str>> {
        let q = self.queues.get(self.queues_by_name.get(queue)?)?;
        // A stream is read from, and published to through, this node's member of it.
        if hosts(&self.local_node, q)
            || member_here(&self.local_node, q)
            || q.config.queue_type == QueueType::Stream
        {
            None
        } else {
            q.home_node.clone()
        }
    }

    /// Queues `node` held in memory only, which its restart lost: the non-durable ones and
    /// the exclusive ones (their connections are gone), with their owners. RabbitMQ deletes
    /// them when their node goes; a warren node deletes them everywhere when it comes back.
    pub fn queues_of_a_previous_life(&self, node: &str) -> Vec<(String, ConnId)> {
        self.queues
            .values()
            .filter(|q| q.home_node.as_deref() == Some(node))
            .filter(|q| !q.durable || q.exclusive_owner.is_some())
            .map(|q| (q.name.clone(), q.exclusive_owner.unwrap_or(0)))
            .collect()
    }

    // ---- the client's node -----------------------------------------------------------------

    /// Hands settled deliveries from remote queues to their nodes as `op`; returns the local
    /// ones.
    pub(super) fn settle_remote(
        &mut self,
        key: ChannelKey,
        settled: Vec<Unacked>,
        op: SettleOp,
    ) -> Vec<Unacked> {
        let mut local = Vec::with_capacity(settled.len());
        for u in settled {
            if u.home_tag == 0 {
                local.push(u);
                continue;
            }
            // A deleted queue's deliveries are gone with it on its node.
            let Some(q) = self.queues.get(&u.queue) else {
                continue;
            };
            if let Some((log, _)) = super::stream::stream_config(q) {
                if op == SettleOp::Ack {
                    self.settle_stream(key, log, &u);
                }
                continue;
            }
            if member_here(&self.local_node, q) {
                let Some(log) = q.log_id else { continue };
                let consumer_tag = u.consumer_tag.clone().unwrap_or_default();
                let msg_id = u.home_tag - 1;
                match self.remote.last_mut() {
                    Some(RemoteEffect::QuorumSettle {
                        log: l,
                        channel,
                        consumer_tag: t,
                        op: o,
                        msg_ids,
                    }) if *l == log && *channel == key && *t == consumer_tag && *o == op => {
                        msg_ids.push(msg_id)
                    }
                    _ => self.remote.push(RemoteEffect::QuorumSettle {
                        log,
                        channel: key,
                        consumer_tag,
                        op,
                        msg_ids: vec![msg_id],
                    }),
                }
                continue;
            }
            let Some(node) = q.home_node.clone() else {
                continue;
            };
            match self.remote.last_mut() {
                Some(RemoteEffect::Settle {
                    node: n,
                    channel,
                    op: o,
                    tags,
                }) if *n == node && *channel == key && *o == op => tags.push(u.home_tag),
                _ => self.remote.push(RemoteEffect::Settle {
                    node,
                    channel: key,
                    op,
                    tags: vec![u.home_tag],
                }),
            }
        }
        local
    }

    /// Registers a consumer of a queue hosted on another node in the client's channel, before
    /// the queue's node is asked (so deliveries that follow its consume-ok find it). Returns
    /// the consumer tag (generated if empty) and the queue's node.
    pub fn consume_remote(
        &mut self,
        key: ChannelKey,
        queue: &str,
        tag: &str,
    ) -> Result<(String, Arc<str>)> {
        let conn = self
            .channels
            .get(&key)
            .expect("consume on an open channel")
            .conn;
        let q = self.usable_queue(queue, conn)?;
        let qid = q.id;
        let Some(node) = q.home_node.clone() else {
            return Err(AmqpError::not_found(format!("no home node for '{queue}'")));
        };
        let ch = self.channels.get_mut(&key).expect("checked above");
        let tag = super::delivery::new_consumer_tag(ch, tag)?;
        ch.consumers.insert(Bytes::from(tag.clone()), qid);
        if !ch.remote_nodes.contains(&node) {
            ch.remote_nodes.push(node.clone());
        }
        Ok((tag, node))
    }

    /// Notes that `node` holds a stand-in for the channel (a basic.get from its queue).
    pub fn note_remote_node(&mut self, key: ChannelKey, node: &Arc<str>) {
        if let Some(ch) = self.channels.get_mut(&key) {
            if !ch.remote_nodes.contains(node) {
                ch.remote_nodes.push(node.clone());
            }
        }
    }

    /// The node of a consumer's queue, when the consumer is one of a remote queue.
    pub fn remote_consumer_home(&self, key: ChannelKey, tag: &str) -> Option<Arc<str>> {
        let qid = self.channels.get(&key)?.consumers.get(tag.as_bytes())?;
        let q = self.queues.get(qid)?;
        (!hosts(&self.local_node, q) && !member_here(&self.local_node, q))
            .then(|| q.home_node.clone())?
    }

    /// The log id of a consumer's queue, when the consumer is one of a quorum queue.
    pub fn quorum_consumer_log(&self, key: ChannelKey, tag: &str) -> Option<u64> {
        let qid = self.channels.get(&key)?.consumers.get(tag.as_bytes())?;
        let q = self.queues.get(qid)?;
        member_here(&self.local_node, q).then_some(q.log_id)?
    }

    /// Forgets a consumer of a remote queue (cancelled, or its consume refused).
    pub fn forget_remote_consumer(&mut self, key: ChannelKey, tag: &str) {
        if let Some(ch) = self.channels.get_mut(&key) {
            ch.consumers.remove(tag.as_bytes());
        }
    }

    /// Gives a relayed delivery (from `node`) its tag in the client's channel and writes it to
    /// the client. A delivery for a channel or consumer that is gone goes back to its queue.
    /// `queue` names the queue of a basic.get; consumer deliveries find it by consumer tag.
    pub fn accept_delivery(&mut self, node: &Arc<str>, d: Delivery, queue: Option<&str>) {
        let qid = match queue {
            Some(name) => self.queues_by_name.get(name).copied(),
            None => self
                .channels
                .get(&d.channel)
                .and_then(|ch| ch.consumers.get(&d.consumer_tag).copied()),
        };
        let ch = match (qid, self.channels.get_mut(&d.channel)) {
            (Some(_), Some(ch)) => ch,
            _ => {
                if !d.no_ack {
                    self.remote.push(RemoteEffect::Settle {
                        node: node.clone(),
                        channel: d.channel,
                        op: SettleOp::Requeue,
                        tags: vec![d.tag],
                    });
                }
                return;
            }
        };
        let qid = qid.expect("matched above");
        let tag = ch.next_delivery_tag();
        let number = ch.number;
        let frame_max = ch.outbox.frame_max();
        let m = &d.message;
        if queue.is_some() {
            let get_ok = Method::GetOk(warren_protocol::method::GetOk {
                delivery_tag: tag,
                redelivered: d.redelivered,
                exchange: m.exchange.clone(),
                routing_key: m.routing_key.clone(),
                message_count: d.message_count,
            });
            ch.outbox.push(|buf| {
                get_ok.encode(number, buf);
                encode_header(buf, number, 60, m.body.len() as u64, &d.properties);
                encode_body(buf, number, &m.body, frame_max);
            });
        } else {
            ch.outbox.push(|buf| {
                encode_deliver(
                    buf,
                    number,
                    &d.consumer_tag,
                    tag,
                    d.redelivered,
                    &m.exchange,
                    &m.routing_key,
                );
                encode_header(buf, number, 60, m.body.len() as u64, &d.properties);
                encode_body(buf, number, &m.body, frame_max);
            });
        }
        if !d.no_ack {
            ch.record(Unacked {
                tag,
                queue: qid,
                consumer_tag: queue.is_none().then(|| d.consumer_tag.clone()),
                message: QueuedMessage {
                    msg: d.message.clone(),
                    redelivered: d.redelivered,
                    delivery_count: 0,
                    expires_at_ms: None,
                    seq: 0,
                    store_index: None,
                },
                settled: false,
                home_tag: d.tag,
            });
        }
    }

    // ---- quorum queues (the client's node) ----------------------------------------------

    /// A quorum queue's storage log id (its group is found from it), when `queue` is one of a
    /// cluster with a member on this node.
    pub fn quorum_log(&self, queue: &str) -> Option<u64> {
        let q = self.queues.get(self.queues_by_name.get(queue)?)?;
        member_here(&self.local_node, q).then_some(q.log_id)?
    }

    /// Registers a consumer of a quorum queue in the client's channel, before its group is
    /// asked (deliveries follow the checkout at once), after the checks RabbitMQ makes of the
    /// consume itself (the group decides exclusivity). Returns the consumer tag (generated if
    /// empty), the queue's log id, the consumer's priority and its prefetch.
    pub fn consume_quorum(
        &mut self,
        key: ChannelKey,
        queue: &str,
        tag: &str,
        arguments: &FieldTable,
    ) -> Result<QuorumConsume> {
        let ch = self.channels.get(&key).expect("consume on an open channel");
        let (conn, prefetch, global_qos) = (ch.conn, ch.consumer_prefetch, ch.channel_prefetch > 0);
        let (vhost, local) = (self.name.clone(), self.local_node.clone());
        let q = self.usable_queue(queue, conn)?;
        let (qid, log) = (q.id, q.log_id);
        let Some(log) = log.filter(|_| member_here(&local, q)) else {
            return Err(AmqpError::not_found(format!("no quorum queue '{queue}'")));
        };
        let priority = match arguments.inner().get("x-priority") {
            None => 0,
            Some(v) => args::integer(v).ok_or_else(|| {
                AmqpError::precondition(format!(
                    "invalid arg 'x-priority' for queue '{queue}' in vhost '{vhost}': \"expected integer, got {}\"",
                    args::type_name(v)
                ))
            })? as i32,
        };
        if global_qos {
            return Err(AmqpError::not_implemented(format!(
                "queue '{queue}' in vhost '{vhost}' does not support global qos"
            )));
        }
        let ch = self.channels.get_mut(&key).expect("checked above");
        let tag = super::delivery::new_consumer_tag(ch, tag)?;
        ch.consumers.insert(Bytes::from(tag.clone()), qid);
        note_quorum_log(ch, log);
        Ok(QuorumConsume {
            tag,
            log,
            priority,
            prefetch,
        })
    }

    /// A client channel's number and outbox, for replies written in order with deliveries.
    pub fn channel_outbox(&self, key: ChannelKey) -> Option<(u16, Arc<Outbox>)> {
        let ch = self.channels.get(&key)?;
        Some((ch.number, ch.outbox.clone()))
    }

    /// Notes that the channel holds (or may hold) basic.get messages of a quorum queue.
    pub fn note_quorum_get(&mut self, key: ChannelKey, log: u64) {
        if let Some(ch) = self.channels.get_mut(&key) {
            note_quorum_log(ch, log);
        }
    }

    /// Whether a channel's consumer of a quorum queue is there to take a delivery.
    pub fn has_quorum_consumer(&self, key: ChannelKey, tag: &[u8]) -> bool {
        self.channels
            .get(&key)
            .is_some_and(|ch| ch.consumers.contains_key(tag))
    }

    /// Writes a delivery of a quorum queue, read from this node's copy of its log, to a
    /// consumer (or, with an empty `consumer_tag`, as basic.get-ok) and gives it a tag of the
    /// channel; acks of that tag name `msg_id` to the group. A stand-in (its client is on a
    /// node that is not a member) relays a consumer's delivery, and returns a basic.get's for
    /// the request's answer. `None` when the channel or consumer is gone: the caller returns
    /// the message to the queue.
    #[allow(clippy::too_many_arguments)]
    pub fn accept_quorum_delivery(
        &mut self,
        key: ChannelKey,
        queue: &str,
        consumer_tag: &[u8],
        msg_id: u64,
        message: MessageRef,
        redelivered: bool,
        delivery_count: u32,
        no_ack: bool,
        message_count: u32,
    ) -> Option<Accepted> {
        let &qid = self.queues_by_name.get(queue)?;
        let is_get = consumer_tag.is_empty();
        let stand_in = match self.channels.get(&key) {
            Some(ch) if is_get || ch.consumers.get(consumer_tag) == Some(&qid) => {
                ch.relay.is_some()
            }
            _ => return None,
        };
        let m = QueuedMessage {
            msg: message.clone(),
            redelivered,
            delivery_count,
            expires_at_ms: None,
            seq: 0,
            store_index: None,
        };
        let properties = super::delivery::delivery_properties(&m, QueueType::Quorum);
        let mut d = Delivery {
            channel: key,
            consumer_tag: Bytes::copy_from_slice(consumer_tag),
            tag: msg_id + 1,
            redelivered,
            no_ack,
            message_count,
            message,
            properties,
        };
        if !stand_in {
            // The channel was checked above, so the delivery is never sent back to a node:
            // no node names it (one shared empty name, not an allocation per delivery).
            static NO_NODE: std::sync::LazyLock<Arc<str>> =
                std::sync::LazyLock::new(|| Arc::from(""));
            self.accept_delivery(&NO_NODE, d, is_get.then_some(queue));
            return Some(Accepted::Written);
        }
        let ch = self.channels.get_mut(&key).expect("checked above");
        let tag = ch.next_delivery_tag();
        if !no_ack {
            ch.record(Unacked {
                tag,
                queue: qid,
                consumer_tag: (!is_get).then(|| d.consumer_tag.clone()),
                message: m,
                settled: false,
                home_tag: msg_id + 1,
            });
        }
        d.tag = tag;
        if is_get {
            return Some(Accepted::StandInGet(d));
        }
        if let Some(relay) = &ch.relay {
            relay.deliver(d);
        }
        Some(Accepted::Written)
    }

    /// A quorum queue dropped a consumer of this node (the group found its node down): the
    /// client is told with basic.cancel, and what it held went back to the queue there.
    pub fn quorum_consumer_dropped(&mut self, key: ChannelKey, queue: &str, consumer_tag: &[u8]) {
        let Some(&qid) = self.queues_by_name.get(queue) else {
            return;
        };
        let Some(ch) = self.channels.get_mut(&key) else {
            return;
        };
        if ch.consumers.get(consumer_tag) != Some(&qid) {
            return;
        }
        ch.consumers.remove(consumer_tag);
        notify_cancel(ch, consumer_tag);
        let mut dropped = 0u32;
        ch.unacked.retain(|u| {
            let gone = u.home_tag != 0
                && !u.settled
                && u.queue == qid
                && u.consumer_tag.as_deref() == Some(consumer_tag);
            dropped += gone as u32;
            !gone
        });
        ch.unacked_live -= dropped;
        ch.consumer_unacked -= dropped;
    }

    /// The queue's node cancelled a consumer (its queue was deleted): the client is told with
    /// basic.cancel, as for a local queue.
    pub fn remote_consumer_cancelled(&mut self, channel: ChannelKey, consumer_tag: &[u8]) {
        let Some(ch) = self.channels.get_mut(&channel) else {
            return;
        };
        if ch.consumers.remove(consumer_tag).is_some() {
            notify_cancel(ch, consumer_tag);
        }
    }

    /// From now until [`Self::release_cancels`], basic.cancel to the channel's consumers
    /// waits: the channel is deleting a queue and its delete-ok goes first.
    pub fn hold_cancels(&mut self, key: ChannelKey) {
        if let Some(ch) = self.channels.get_mut(&key) {
            ch.held_cancels.get_or_insert_with(Vec::new);
        }
    }

    /// Sends the basic.cancel held since [`Self::hold_cancels`] (after the delete-ok).
    pub fn release_cancels(&mut self, key: ChannelKey) {
        if let Some(ch) = self.channels.get_mut(&key) {
            for tag in ch.held_cancels.take().unwrap_or_default() {
                send_cancel(ch, &tag);
            }
        }
    }

    /// The link to `node` broke, or it went down: what this node's clients had from its
    /// queues is gone there (consumers are cancelled with basic.cancel, their deliveries will
    /// be redelivered by that node, so they leave the channels' ledgers).
    pub fn remote_node_lost(&mut self, node: &str) {
        let lost: Vec<QueueId> = self
            .queues
            .values()
            .filter(|q| q.home_node.as_deref() == Some(node) && !hosts(&self.local_node, q))
            // A quorum queue carries on on its other members.
            .filter(|q| !member_here(&self.local_node, q))
            .map(|q| q.id)
            .collect();
        if lost.is_empty() {
            return;
        }
        for ch in self.channels.values_mut() {
            ch.remote_nodes.retain(|n| &**n != node);
            let cancelled: Vec<Bytes> = ch
                .consumers
                .iter()
                .filter(|(_, q)| lost.contains(q))
                .map(|(t, _)| t.clone())
                .collect();
            for tag in cancelled {
                ch.consumers.remove(&tag);
                notify_cancel(ch, &tag);
            }
            let before = ch.unacked.len();
            let mut dropped = 0u32;
            let mut dropped_consumer = 0u32;
            ch.unacked.retain(|u| {
                let gone = u.home_tag != 0 && !u.settled && lost.contains(&u.queue);
                if gone {
                    dropped += 1;
                    dropped_consumer += u.consumer_tag.is_some() as u32;
                }
                !gone
            });
            if ch.unacked.len() != before {
                ch.unacked_live -= dropped;
                ch.consumer_unacked -= dropped_consumer;
            }
        }
    }

    // ---- the queue's node ------------------------------------------------------------------

    /// Closes the stand-ins of `node`'s clients, requeueing what they had out: the link to it
    /// broke, so their acks may never come.
    pub fn close_stand_ins(&mut self, node: &str, now_ms: u64) {
        if self.stand_ins == 0 {
            return;
        }
        let stand_ins: Vec<ChannelKey> = self
            .channels
            .iter()
            .filter(|(_, ch)| ch.relayed_to.as_deref() == Some(node))
            .map(|(k, _)| *k)
            .collect();
        for key in stand_ins {
            self.channel_close(key, now_ms);
        }
    }

    /// The prefetch a channel's next consumer gets, and the channel-wide one, for a stand-in.
    pub fn channel_prefetch(&self, key: ChannelKey) -> (u32, u32) {
        self.channels
            .get(&key)
            .map_or((0, 0), |c| (c.consumer_prefetch, c.channel_prefetch))
    }

    /// Enqueues a publish routed on another node into this node's queues among `queues`.
    pub fn enqueue_forwarded(
        &mut self,
        queues: &[String],
        message: MessageRef,
        now_ms: u64,
    ) -> PublishOutcome {
        let mut targets = std::mem::take(&mut self.scratch);
        targets.clear();
        let mut unknown = false;
        for name in queues {
            match self.queues_by_name.get(name.as_str()) {
                Some(&qid) => {
                    if self.queues.get(&qid).is_some_and(|q| {
                        hosts(&self.local_node, q) || member_here(&self.local_node, q)
                    }) {
                        targets.push(qid);
                    }
                }
                None => unknown = true,
            }
        }
        let mut outcome = self.enqueue_all(&targets, message, now_ms);
        // A queue this node does not know yet (its metadata lags the sender's) or any more
        // (deleted since the sender routed): the publisher gets a nack and may publish again,
        // never a confirm for a message stored nowhere.
        outcome.rejected |= unknown;
        self.scratch = targets;
        outcome
    }

    /// Opens the stand-in for a channel of a client connected to `node`, unless it is open.
    #[allow(clippy::too_many_arguments)]
    pub fn open_stand_in(
        &mut self,
        key: ChannelKey,
        conn: ConnId,
        number: u16,
        user: &str,
        node: Arc<str>,
        relay: Arc<dyn Relay>,
    ) {
        if self.channels.contains_key(&key) {
            return;
        }
        // Never written to: the relay takes the deliveries.
        let outbox = Outbox::new(0, Box::new(|| {}));
        let mut ch = ChannelState::new(key, conn, number, outbox, user.to_string());
        ch.relay = Some(relay);
        ch.relayed_to = Some(node);
        self.channels.insert(key, ch);
        self.stand_ins += 1;
    }

    /// Gives a stand-in its client channel's limits, both at once: set one after the other
    /// (as two basic.qos), the moment between would dispatch without the channel-wide limit.
    pub fn set_stand_in_prefetch(
        &mut self,
        key: ChannelKey,
        consumer_prefetch: u32,
        channel_prefetch: u32,
        now_ms: u64,
    ) {
        let Some(ch) = self.channels.get_mut(&key) else {
            return;
        };
        ch.consumer_prefetch = consumer_prefetch;
        ch.channel_prefetch = channel_prefetch;
        let queues: Vec<QueueId> = ch.consumers.values().copied().collect();
        for q in queues {
            self.dispatch(q, now_ms);
        }
    }

    /// The client channel's channel-wide prefetch changed (basic.qos global).
    pub fn set_stand_in_channel_prefetch(&mut self, key: ChannelKey, prefetch: u32, now_ms: u64) {
        let consumer_prefetch = match self.channels.get(&key) {
            Some(ch) => ch.consumer_prefetch,
            None => return,
        };
        self.set_stand_in_prefetch(key, consumer_prefetch, prefetch, now_ms);
    }

    /// A stand-in's client node says whether its client's outbox is over the bound: deliveries
    /// to the stand-in wait while it is, and resume when it drains.
    pub fn set_stand_in_congested(&mut self, key: ChannelKey, congested: bool, now_ms: u64) {
        let Some(ch) = self.channels.get_mut(&key).filter(|ch| ch.relay.is_some()) else {
            return;
        };
        ch.client_congested = congested;
        if !congested {
            let queues: Vec<QueueId> = ch.consumers.values().copied().collect();
            for q in queues {
                self.dispatch(q, now_ms);
            }
        }
    }

    /// Whether a client channel of this node has more waiting in its outbox than a consumer
    /// may be given: relayed deliveries to it should wait.
    pub fn is_client_congested(&self, key: ChannelKey) -> bool {
        self.channels
            .get(&key)
            .is_some_and(|ch| ch.relay.is_none() && ch.outbox.is_congested())
    }

    /// Settles deliveries of a stand-in by their tags here; tags it no longer knows (the
    /// stand-in closed and requeued them) are skipped.
    pub fn settle_stand_in(&mut self, key: ChannelKey, op: SettleOp, tags: &[u64], now_ms: u64) {
        for &tag in tags {
            if !self.channels.contains_key(&key) {
                return;
            }
            let _ = match op {
                SettleOp::Ack => self.basic_ack(key, tag, false, now_ms),
                SettleOp::Requeue => self.basic_nack(key, tag, false, true, now_ms),
                SettleOp::Discard => self.basic_nack(key, tag, false, false, now_ms),
            };
        }
    }

    /// Whether `key` is an open channel (a stand-in asked to consume may have closed since).
    pub fn has_channel(&self, key: ChannelKey) -> bool {
        self.channels.contains_key(&key)
    }

    /// Dispatches again to remote consumers: their relays may have drained since dispatch
    /// held off (there is no outbox writer to resume them as for local clients).
    pub fn resume_stand_ins(&mut self, now_ms: u64) {
        if self.stand_ins == 0 {
            return;
        }
        let queues: Vec<QueueId> = self
            .channels
            .values()
            .filter(|c| c.relay.is_some())
            .flat_map(|c| c.consumers.values().copied())
            .collect();
        for q in queues {
            self.dispatch(q, now_ms);
        }
    }
}

fn note_quorum_log(ch: &mut ChannelState, log: u64) {
    if !ch.quorum_logs.contains(&log) {
        ch.quorum_logs.push(log);
    }
}

/// What became of a quorum queue's delivery handed to a channel.
#[derive(Debug, Clone)]
pub enum Accepted {
    /// Written to the client, or relayed to its node.
    Written,
    /// A stand-in's basic.get: the message, for the request's answer.
    StandInGet(Delivery),
}

/// A consume of a quorum queue, registered in its channel: what its checkout carries.
#[derive(Debug, Clone)]
pub struct QuorumConsume {
    pub tag: String,
    pub log: u64,
    pub priority: i32,
    pub prefetch: u32,
}

/// basic.cancel to a client whose consumer the broker ended, if it asked for them
/// (consumer_cancel_notify); held back while the channel waits for its queue.delete-ok.
pub(super) fn notify_cancel(ch: &mut ChannelState, consumer_tag: &[u8]) {
    if !ch.cancel_notify {
        return;
    }
    if let Some(held) = &mut ch.held_cancels {
        held.push(Bytes::copy_from_slice(consumer_tag));
        return;
    }
    send_cancel(ch, consumer_tag);
}

fn send_cancel(ch: &ChannelState, consumer_tag: &[u8]) {
    let cancel = Method::Other(AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
        consumer_tag: String::from_utf8_lossy(consumer_tag).as_ref().into(),
        nowait: true,
    })));
    let number = ch.number;
    ch.outbox.push(|buf| cancel.encode(number, buf));
}
