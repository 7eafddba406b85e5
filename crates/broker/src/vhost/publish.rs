//! Publishing: routing a message (exchanges, CC/BCC, alternate exchanges, direct reply-to)
//! and putting it in its queues, stored when the queue is durable and the message persistent.

use super::delivery::{deliver, drop_head_over_limit};
use super::*;

impl VHost {
    // ---- publishing ------------------------------------------------------------------------

    /// Routes and enqueues a message, then delivers what consumers have credit for.
    /// Routes and enqueues a message published on `channel`, then delivers what consumers
    /// have credit for.
    pub fn publish(
        &mut self,
        channel: ChannelKey,
        exchange: &str,
        mut message: Message,
        props: &Properties,
        now_ms: u64,
    ) -> Result<PublishOutcome> {
        if props.reply_to.as_deref() == Some(REPLY_TO_QUEUE.as_bytes()) {
            message = self.stamp_reply_to(channel, message, props)?;
        }
        if exchange.is_empty() && message.routing_key.starts_with(REPLY_TO_PREFIX.as_bytes()) {
            return Ok(self.deliver_reply(message));
        }
        let mut targets = std::mem::take(&mut self.scratch);
        targets.clear();
        let result = self.route(exchange, &message, props, &mut targets);
        let outcome = match result {
            Ok(()) => {
                let message = self.strip_bcc(message, props);
                Ok(self.enqueue_all(&targets, Arc::new(message), now_ms))
            }
            Err(e) => Err(e),
        };
        self.scratch = targets;
        outcome
    }

    /// Replaces `reply_to: amq.rabbitmq.reply-to` with the channel's own reply address.
    pub(super) fn stamp_reply_to(
        &self,
        channel: ChannelKey,
        message: Message,
        props: &Properties,
    ) -> Result<Message> {
        let token = self
            .channels
            .get(&channel)
            .and_then(|c| c.reply_to.as_ref())
            .map(|(token, _)| token.clone());
        let Some(token) = token else {
            return Err(AmqpError::precondition(
                "fast reply consumer does not exist",
            ));
        };
        let mut p = props.clone();
        let mut address = Vec::with_capacity(REPLY_TO_PREFIX.len() + token.len());
        address.extend_from_slice(REPLY_TO_PREFIX.as_bytes());
        address.extend_from_slice(&token);
        p.reply_to = Some(Bytes::from(address));
        Ok(Message {
            properties: p.encode(),
            ..message
        })
    }

    /// Whether `name` is the direct reply-to address of a channel still consuming its replies:
    /// RabbitMQ answers a passive queue.declare of it with declare-ok, and responders use that
    /// to check the requester is still there.
    pub fn reply_to_is_live(&self, name: &str) -> bool {
        name.strip_prefix(REPLY_TO_PREFIX)
            .is_some_and(|token| self.reply_tokens.contains_key(token.as_bytes()))
    }

    /// A reply to a direct reply-to address goes straight to the requester's channel, or
    /// nowhere if it has gone.
    pub(super) fn deliver_reply(&mut self, message: Message) -> PublishOutcome {
        let token = message.routing_key.slice(REPLY_TO_PREFIX.len()..);
        let Some(&key) = self.reply_tokens.get(&token) else {
            return PublishOutcome::default();
        };
        let Some(ch) = self.channels.get_mut(&key) else {
            return PublishOutcome::default();
        };
        let Some((_, tag)) = ch.reply_to.clone() else {
            return PublishOutcome::default();
        };
        let delivery_tag = ch.next_delivery_tag();
        let m = QueuedMessage {
            msg: Arc::new(message),
            redelivered: false,
            delivery_count: 0,
            expires_at_ms: None,
            seq: 0,
            store_index: None,
        };
        // No queue in between, so none of a queue type's annotations.
        deliver(ch, &tag, delivery_tag, &m, QueueType::Classic, true);
        PublishOutcome {
            routed: true,
            rejected: false,
        }
    }

    pub(super) fn route(
        &mut self,
        exchange: &str,
        message: &Message,
        props: &Properties,
        out: &mut Vec<QueueId>,
    ) -> Result<()> {
        let target = if exchange.is_empty() {
            None
        } else {
            let id = self.exchange_id(exchange)?;
            if self.exchanges[&id].internal {
                return Err(AmqpError::access_refused(format!(
                    "cannot publish to internal exchange '{exchange}' in vhost '{}'",
                    self.name
                )));
            }
            Some(id)
        };
        let headers = match &props.headers {
            Some(raw)
                if needs_headers(raw)
                    || self.exchange_kind(exchange) == Some(ExchangeKind::Headers) =>
            {
                props.headers_table().ok().flatten()
            }
            _ => None,
        };
        // Sender-selected distribution: CC and BCC add routing keys (arrays of strings). The
        // common case (no CC/BCC) routes the one key without allocating.
        let mut keys: Vec<Bytes> = Vec::new();
        if let Some(h) = &headers {
            for name in ["CC", "BCC"] {
                match h.inner().get(name) {
                    None => {}
                    // rabbit_basic:header_routes takes the long strings of the array.
                    Some(AMQPValue::FieldArray(a)) => {
                        keys.extend(a.as_slice().iter().filter_map(|v| match v {
                            AMQPValue::LongString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
                            _ => None,
                        }))
                    }
                    // ... and refuses anything else, which rabbit_channel answers with 406.
                    Some(other) => {
                        return Err(AmqpError::precondition(format!(
                            "invalid message: {{unacceptable_type_in_header,\"{name}\",{}}}",
                            args::type_name(other)
                        )));
                    }
                }
            }
        }
        // A dead letter's BCC keys, kept when the header was stripped.
        keys.extend(message.bcc.iter().cloned());
        if !keys.is_empty() {
            keys.insert(0, message.routing_key.clone());
        }
        let keys: &[Bytes] = if keys.is_empty() {
            std::slice::from_ref(&message.routing_key)
        } else {
            &keys
        };
        let Some(id) = target else {
            for k in keys {
                if let Some(&q) = std::str::from_utf8(k)
                    .ok()
                    .and_then(|k| self.queues_by_name.get(k))
                {
                    if !out.contains(&q) {
                        out.push(q);
                    }
                }
            }
            return Ok(());
        };
        // The table follows alternate exchanges as RabbitMQ's route1 does: for every exchange
        // on the way (exchange-to-exchange destinations too) whose bindings matched nothing.
        self.route_from(id, keys, headers.as_ref(), out);
        Ok(())
    }

    pub(super) fn route_from(
        &mut self,
        id: ExchangeId,
        keys: &[Bytes],
        headers: Option<&FieldTable>,
        out: &mut Vec<QueueId>,
    ) {
        let _ = self.routes.route_keys(id, keys, headers, out);
    }

    pub(super) fn exchange_kind(&self, name: &str) -> Option<ExchangeKind> {
        self.exchanges_by_name
            .get(name)
            .map(|id| self.exchanges[id].kind)
    }

    /// BCC recipients must not see the BCC header, as RabbitMQ strips it before delivery.
    pub(super) fn strip_bcc(&self, message: Message, props: &Properties) -> Message {
        let Some(raw) = &props.headers else {
            return message;
        };
        if !raw.windows(4).any(|w| w == b"\x03BCC") {
            return message;
        }
        let Ok(Some(mut table)) = props.headers_table() else {
            return message;
        };
        let mut inner = table.inner().clone();
        let Some(bcc) = inner.remove("BCC") else {
            return message;
        };
        let bcc = match bcc {
            AMQPValue::FieldArray(a) => a
                .as_slice()
                .iter()
                .filter_map(|v| match v {
                    AMQPValue::LongString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        table = FieldTable::from(inner);
        let mut p = props.clone();
        p.set_headers_table(Some(&table));
        Message {
            properties: p.encode(),
            bcc,
            ..message
        }
    }

    pub(super) fn enqueue_all(
        &mut self,
        targets: &[QueueId],
        msg: MessageRef,
        now_ms: u64,
    ) -> PublishOutcome {
        let mut outcome = PublishOutcome::default();
        let mut dead = Vec::new();
        let mut elsewhere: Vec<(Arc<str>, String)> = Vec::new();
        let mut replicated = Vec::new();
        let mut streams = Vec::new();
        for &qid in targets {
            let Some(q) = self.queues.get_mut(&qid) else {
                continue;
            };
            if q.config.queue_type == QueueType::Stream {
                // Its writer appends it; a stream has no limit that refuses a publish.
                outcome.routed = true;
                streams.extend(q.log_id);
                continue;
            }
            if let Some(target) = quorum_target(&self.local_node, q) {
                // Its group applies its limits; a refusal there nacks the publisher.
                outcome.routed = true;
                replicated.push(target);
                continue;
            }
            if !super::hosts(&self.local_node, q) {
                // Its node applies its limits; a refusal there nacks the publisher.
                outcome.routed = true;
                let node = q.home_node.clone().expect("hosted elsewhere has a home");
                elsewhere.push((node, q.name.clone()));
                continue;
            }
            if q.refuses_publish(msg.size_bytes()) && q.config.overflow != Overflow::DropHead {
                outcome.rejected = true;
                if q.config.overflow == Overflow::RejectPublishDlx {
                    let qm = QueuedMessage {
                        msg: msg.clone(),
                        redelivered: false,
                        delivery_count: 0,
                        expires_at_ms: None,
                        seq: 0,
                        store_index: None,
                    };
                    dead.push(DeadLetter {
                        queue: q.name.clone(),
                        config: q.config.clone(),
                        message: qm,
                        reason: "maxlen",
                    });
                }
                continue;
            }
            outcome.routed = true;
            self.enqueue(qid, &msg, now_ms, &mut dead);
        }
        if targets.is_empty() {
            outcome.routed = false;
        }
        if !elsewhere.is_empty() {
            self.forward(elsewhere, &msg);
        }
        if !streams.is_empty() {
            self.remote.push(RemoteEffect::StreamAppend {
                logs: streams,
                message: msg.clone(),
            });
        }
        if !replicated.is_empty() {
            self.remote.push(RemoteEffect::Propose {
                queues: replicated,
                message: msg.clone(),
            });
        }
        self.dead_letter(dead, now_ms);
        outcome
    }

    /// One forward per node, naming its queues the message was routed to.
    pub(super) fn forward(&mut self, mut elsewhere: Vec<(Arc<str>, String)>, msg: &MessageRef) {
        elsewhere.sort_unstable();
        for (node, queue) in elsewhere {
            match self.remote.last_mut() {
                Some(RemoteEffect::Forward {
                    node: n,
                    queues,
                    message,
                }) if *n == node && Arc::ptr_eq(message, msg) => queues.push(queue),
                _ => self.remote.push(RemoteEffect::Forward {
                    node,
                    queues: vec![queue],
                    message: msg.clone(),
                }),
            }
        }
    }

    /// Puts a routed message in one queue and hands it to a consumer if one can take it, then
    /// applies what RabbitMQ's deliver_or_enqueue applies to a message nobody took: an
    /// x-message-ttl / expiration of 0 expires it at once, and drop-head trims the queue.
    pub(super) fn enqueue(
        &mut self,
        qid: QueueId,
        msg: &MessageRef,
        now_ms: u64,
        dead: &mut Vec<DeadLetter>,
    ) {
        let Some(q) = self.queues.get_mut(&qid) else {
            return;
        };
        let ttl_ms = match (q.config.message_ttl_ms, msg.expiration_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let expires_at_ms = ttl_ms.map(|t| now_ms.saturating_add(t.saturating_sub(1)));
        let store_index = if q.stores(msg.persistent) {
            let log = q.log_id.expect("stores() checked the log");
            let index = q.next_index;
            q.next_index += 1;
            q.released.appended(index);
            let expires_unix = expires_at_ms.map_or(0, |e| e + self.unix_ms_at_epoch);
            let payload = crate::message::encode_stored(msg, expires_unix);
            self.store_ops.push(StoreOp::Append {
                log,
                index,
                payload,
            });
            Some(index)
        } else {
            None
        };
        q.stats.publish += 1;
        let seq = q.backlog.push_back(QueuedMessage {
            msg: msg.clone(),
            redelivered: false,
            delivery_count: 0,
            // Dead once `now_ms > expires_at_ms`, i.e. from publish + TTL on, as RabbitMQ's
            // `Now >= Expiry`.
            expires_at_ms,
            seq: 0,
            store_index,
        });
        if store_index.is_some() && !q.page_out_due {
            q.page_out_due = true;
            self.page_out_due.push(qid);
        }
        self.dispatch(qid, now_ms);
        let Some(q) = self.queues.get_mut(&qid) else {
            return;
        };
        let mut delivered_at_once = false;
        if ttl_ms == Some(0) {
            match q.backlog.pop_back_if(seq) {
                Some(m) => dead.push(DeadLetter {
                    queue: q.name.clone(),
                    config: q.config.clone(),
                    message: m,
                    reason: "expired",
                }),
                None => delivered_at_once = true,
            }
        }
        drop_head_over_limit(q, dead);
        if delivered_at_once {
            self.expire_on_return(qid, seq, now_ms);
        }
    }

    /// A message with a TTL of 0 lives only the instant it is published: handed to a consumer
    /// then, it is past its TTL from the next instant on, so a requeue (reject, nack, recover,
    /// channel close) expires it rather than delivering it again, as RabbitMQ's
    /// `Now >= Expiry` does after requeue_and_run. Its expiry as enqueued is the publish
    /// millisecond, which would keep it alive for the rest of that millisecond: the delivery
    /// is found in its consumer's channel (the last it recorded) and moved a millisecond back.
    fn expire_on_return(&mut self, qid: QueueId, seq: u64, now_ms: u64) {
        let Some(q) = self.queues.get(&qid) else {
            return;
        };
        for c in &q.consumers {
            let Some(ch) = self.channels.get_mut(&c.channel) else {
                continue;
            };
            if let Some(u) = ch
                .unacked
                .back_mut()
                .filter(|u| u.queue == qid && u.message.seq == seq)
            {
                u.message.expires_at_ms = Some(now_ms.saturating_sub(1));
                return;
            }
        }
    }
}

/// Where a message for a quorum queue of a cluster goes: its Raft group, through this node's
/// member (a node that is not one forwards it to the queue's home, a member).
pub(super) fn quorum_target(local: &Option<Arc<str>>, q: &Queue) -> Option<QuorumTarget> {
    if !super::member_here(local, q) {
        return None;
    }
    Some(QuorumTarget {
        queue: q.name.clone(),
        log: q.log_id?,
        members: q.members.clone(),
    })
}

/// Whether a headers table might carry CC/BCC, checked on the raw bytes before parsing it.
pub(super) fn needs_headers(raw: &[u8]) -> bool {
    raw.windows(3).any(|w| w == b"\x02CC") || raw.windows(4).any(|w| w == b"\x03BCC")
}
