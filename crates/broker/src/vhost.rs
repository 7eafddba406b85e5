//! A virtual host: its exchanges, queues, bindings and the consumer side of its channels,
//! driven by commands from connections and by the clock.
//!
//! Everything a message touches between publish and delivery lives here, under one lock held
//! by the server for the duration of a command, so that routing, enqueueing and dispatching
//! to consumers is plain sequential code with no message passing on the hot path. Outbound
//! frames go to the target connection's [`Outbox`].

use crate::args::{self, Overflow, QueueConfig, QueueType};
use crate::channel::{ChannelState, Unacked};
use crate::definitions::MetaRecord;
use crate::error::{AmqpError, Result};
use crate::exchange::{kind_from_name, kind_name, Exchange, STANDARD_EXCHANGES};
use crate::message::{Message, MessageRef};
use crate::outbox::Outbox;
use crate::persistence::StoreOp;
use crate::queue::{ChannelKey, ConnId, Consumer, Queue, QueuedMessage};
use crate::routing::{Destination, ExchangeId, ExchangeKind, QueueId, RoutingTable};
use amq_protocol_types::{AMQPValue, FieldArray, FieldTable, LongString};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use warren_protocol::amqp::{basic, AMQPClass};
use warren_protocol::content::{encode_header, Properties};
use warren_protocol::frame::encode_body;
use warren_protocol::method::{encode_deliver, Method};

/// The pseudo queue a client consumes from for direct reply-to.
pub const REPLY_TO_QUEUE: &str = "amq.rabbitmq.reply-to";
/// Replies are addressed to this prefix followed by the requester channel's token.
const REPLY_TO_PREFIX: &str = "amq.rabbitmq.reply-to.";

/// Stands for a deleted queue in unacked entries, whose id may be reused.
const GONE: QueueId = QueueId(u32::MAX);

/// How many dead-letter hops one event may cause before we stop (cycles are dropped earlier).
const DEAD_LETTER_HOPS_MAX: usize = 64;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PublishOutcome {
    /// Whether at least one queue accepted the message (false + mandatory means basic.return).
    pub routed: bool,
    /// A queue with x-overflow=reject-publish refused it: the publisher gets a nack.
    pub rejected: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclareOk {
    pub queue: String,
    pub message_count: u32,
    pub consumer_count: u32,
}

/// What basic.get found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GetResult {
    Empty,
    /// The get-ok and content were written to the channel's outbox.
    Delivered,
}

#[derive(Debug, Clone)]
pub struct QueueInfo {
    pub name: String,
    pub durable: bool,
    pub auto_delete: bool,
    pub exclusive: bool,
    pub queue_type: &'static str,
    pub arguments: FieldTable,
    pub messages_ready: u64,
    pub messages_unacknowledged: u64,
    pub message_bytes_ready: u64,
    pub consumers: u64,
}

#[derive(Debug, Clone)]
pub struct ExchangeInfo {
    pub name: String,
    pub kind: &'static str,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
}

pub struct VHost {
    pub name: String,
    exchanges_by_name: HashMap<String, ExchangeId>,
    exchanges: HashMap<ExchangeId, Exchange>,
    queues_by_name: HashMap<String, QueueId>,
    queues: HashMap<QueueId, Queue>,
    routes: RoutingTable,
    channels: HashMap<ChannelKey, ChannelState>,
    next_exchange: u32,
    next_queue: u32,
    free_exchange_ids: Vec<ExchangeId>,
    free_queue_ids: Vec<QueueId>,
    scratch: Vec<QueueId>,
    /// Exchanges by the alternate-exchange name they carry, so the routing table's alternate
    /// ids follow the names as exchanges come and go (RabbitMQ resolves the name per publish).
    alternate_wanted_by: HashMap<String, Vec<ExchangeId>>,
    /// Direct reply-to tokens and the channel each one answers to.
    reply_tokens: HashMap<Bytes, ChannelKey>,
    /// Changes to durable topology not yet handed to the metadata journal.
    meta: Vec<MetaRecord>,
    /// Stored-message work not yet handed to the storage engine, in order.
    store_ops: Vec<StoreOp>,
    /// Unix time in ms at the broker's epoch: stored expiries are wall-clock, so that a TTL
    /// survives a restart.
    pub unix_ms_at_epoch: u64,
}

/// A message leaving a queue for its dead-letter exchange.
struct DeadLetter {
    queue: String,
    config: QueueConfig,
    message: QueuedMessage,
    reason: &'static str,
}

impl VHost {
    pub fn new(name: &str) -> Self {
        let mut v = VHost {
            name: name.to_string(),
            exchanges_by_name: HashMap::new(),
            exchanges: HashMap::new(),
            queues_by_name: HashMap::new(),
            queues: HashMap::new(),
            routes: RoutingTable::new(),
            channels: HashMap::new(),
            next_exchange: 1,
            next_queue: 1,
            free_exchange_ids: Vec::new(),
            free_queue_ids: Vec::new(),
            scratch: Vec::new(),
            alternate_wanted_by: HashMap::new(),
            reply_tokens: HashMap::new(),
            meta: Vec::new(),
            store_ops: Vec::new(),
            unix_ms_at_epoch: 0,
        };
        for (n, kind, internal) in STANDARD_EXCHANGES {
            v.create_exchange(n, *kind, true, false, *internal, FieldTable::default());
        }
        v
    }

    // ---- exchanges -------------------------------------------------------------------------

    fn create_exchange(
        &mut self,
        name: &str,
        kind: ExchangeKind,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    ) -> ExchangeId {
        let id = self.free_exchange_ids.pop().unwrap_or_else(|| {
            self.next_exchange += 1;
            ExchangeId(self.next_exchange - 1)
        });
        let alternate = arguments
            .inner()
            .get("alternate-exchange")
            .and_then(args::string);
        self.routes
            .declare_exchange(id, kind)
            .expect("exchange ids are allocated once");
        self.exchanges.insert(
            id,
            Exchange {
                id,
                name: name.to_string(),
                kind,
                durable,
                auto_delete,
                internal,
                arguments,
                alternate,
            },
        );
        self.exchanges_by_name.insert(name.to_string(), id);
        self.link_alternates(id, name);
        id
    }

    /// Points the routing table at the alternates named by and naming a new exchange.
    fn link_alternates(&mut self, id: ExchangeId, name: &str) {
        if let Some(alt) = self.exchanges[&id].alternate.clone() {
            self.alternate_wanted_by
                .entry(alt.clone())
                .or_default()
                .push(id);
            let alt_id = self.exchanges_by_name.get(&alt).copied();
            let _ = self.routes.set_alternate_exchange(id, alt_id);
        }
        for &wanting in self.alternate_wanted_by.get(name).into_iter().flatten() {
            let _ = self.routes.set_alternate_exchange(wanting, Some(id));
        }
    }

    fn exchange_id(&self, name: &str) -> Result<ExchangeId> {
        self.exchanges_by_name
            .get(name)
            .copied()
            .ok_or_else(|| AmqpError::no_exchange(name, &self.name))
    }

    fn refuse_default(name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn exchange_declare(
        &mut self,
        name: &str,
        kind: &str,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    ) -> Result<()> {
        if passive {
            Self::refuse_default(name)?;
            self.exchange_id(name)?;
            return Ok(());
        }
        let kind_parsed = kind_from_name(kind)
            .ok_or_else(|| AmqpError::command_invalid(format!("unknown exchange type '{kind}'")))?;
        Self::refuse_default(name)?;
        if let Some(id) = self.exchanges_by_name.get(name) {
            let x = &self.exchanges[id];
            let what = format!("for exchange '{}' in vhost '{}'", name, self.name);
            if x.kind != kind_parsed {
                return Err(AmqpError::precondition(format!(
                    "inequivalent arg 'type' {what}: received '{kind}' but current is '{}'",
                    kind_name(x.kind)
                )));
            }
            for (arg, got, cur) in [
                ("durable", durable, x.durable),
                ("auto_delete", auto_delete, x.auto_delete),
                ("internal", internal, x.internal),
            ] {
                if got != cur {
                    return Err(AmqpError::precondition(format!(
                        "inequivalent arg '{arg}' {what}: received '{got}' but current is '{cur}'"
                    )));
                }
            }
            // RabbitMQ compares this one argument of exchanges (rabbit_exchange).
            check_arg_equivalence("alternate-exchange", &arguments, &x.arguments, &what)?;
            return Ok(());
        }
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "exchange name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        if let Some(v) = arguments.inner().get("alternate-exchange") {
            if !matches!(v, AMQPValue::LongString(_)) {
                return Err(AmqpError::precondition(format!(
                    "invalid type '{}' for arg 'alternate-exchange' in exchange '{name}' in vhost '{}'",
                    args::type_name(v),
                    self.name
                )));
            }
        }
        if durable {
            self.meta.push(MetaRecord::DeclareExchange {
                vhost: self.name.clone(),
                name: name.to_string(),
                kind: kind.to_string(),
                auto_delete,
                internal,
                arguments: arguments.clone(),
            });
        }
        self.create_exchange(name, kind_parsed, durable, auto_delete, internal, arguments);
        Ok(())
    }

    pub fn exchange_delete(&mut self, name: &str, if_unused: bool) -> Result<()> {
        Self::refuse_default(name)?;
        // Refused by name before the lookup, as rabbit_channel's check_exchange_deletion does.
        if name.starts_with("amq.") {
            return Err(AmqpError::access_refused(format!(
                "deletion of system exchange '{name}' in vhost '{}' not allowed",
                self.name
            )));
        }
        let Some(&id) = self.exchanges_by_name.get(name) else {
            return Ok(());
        };
        if if_unused && self.routes.has_bindings_as_source(id) {
            return Err(AmqpError::precondition(format!(
                "exchange '{name}' in vhost '{}' in use",
                self.name
            )));
        }
        self.delete_exchange_by_id(id);
        Ok(())
    }

    fn delete_exchange_by_id(&mut self, id: ExchangeId) {
        let orphaned = self.routes.delete_exchange(id).unwrap_or_default();
        if let Some(x) = self.exchanges.remove(&id) {
            if x.durable {
                self.meta.push(MetaRecord::DeleteExchange {
                    vhost: self.name.clone(),
                    name: x.name.clone(),
                });
            }
            self.exchanges_by_name.remove(&x.name);
            self.free_exchange_ids.push(id);
            // Its id will be reused: exchanges naming it as alternate must not follow the id.
            for &wanting in self.alternate_wanted_by.get(&x.name).into_iter().flatten() {
                let _ = self.routes.set_alternate_exchange(wanting, None);
            }
            if let Some(alt) = &x.alternate {
                if let Some(list) = self.alternate_wanted_by.get_mut(alt) {
                    list.retain(|w| *w != id);
                    if list.is_empty() {
                        self.alternate_wanted_by.remove(alt);
                    }
                }
            }
        }
        self.delete_orphaned_auto_delete(orphaned);
    }

    fn delete_orphaned_auto_delete(&mut self, orphaned: Vec<ExchangeId>) {
        for src in orphaned {
            if self.exchanges.get(&src).is_some_and(|x| x.auto_delete) {
                self.delete_exchange_by_id(src);
            }
        }
    }

    pub fn exchange_bind(
        &mut self,
        destination: &str,
        source: &str,
        key: &str,
        arguments: &FieldTable,
    ) -> Result<()> {
        Self::refuse_default(destination)?;
        Self::refuse_default(source)?;
        // rabbit_binding reports a missing source before a missing destination.
        let src = self.exchange_id(source)?;
        let dst = self.exchange_id(destination)?;
        let new = self
            .routes
            .bind(src, Destination::Exchange(dst), key.as_bytes(), arguments)
            .map_err(routing_error)?;
        if new {
            self.record_binding(
                true,
                src,
                Destination::Exchange(dst),
                key.as_bytes(),
                arguments,
            );
        }
        Ok(())
    }

    pub fn exchange_unbind(
        &mut self,
        destination: &str,
        source: &str,
        key: &str,
        arguments: &FieldTable,
    ) -> Result<()> {
        Self::refuse_default(destination)?;
        Self::refuse_default(source)?;
        // RabbitMQ answers unbind-ok when either end is missing (rabbit_binding:remove).
        let (Ok(src), Ok(dst)) = (self.exchange_id(source), self.exchange_id(destination)) else {
            return Ok(());
        };
        let unbound = self
            .routes
            .unbind(src, Destination::Exchange(dst), key.as_bytes(), arguments)
            .map_err(routing_error)?;
        if unbound.existed {
            self.record_binding(
                false,
                src,
                Destination::Exchange(dst),
                key.as_bytes(),
                arguments,
            );
        }
        if unbound.source_unused {
            self.delete_orphaned_auto_delete(vec![src]);
        }
        Ok(())
    }

    // ---- queues ----------------------------------------------------------------------------

    fn queue_id(&self, name: &str) -> Result<QueueId> {
        self.queues_by_name
            .get(name)
            .copied()
            .ok_or_else(|| AmqpError::no_queue(name, &self.name))
    }

    /// The queue, if the connection may use it (exclusive queues belong to one connection).
    fn usable_queue(&mut self, name: &str, conn: ConnId) -> Result<&mut Queue> {
        let id = self.queue_id(name)?;
        let vhost = self.name.clone();
        let q = self.queues.get_mut(&id).expect("indexed queue exists");
        if q.exclusive_owner.is_some_and(|o| o != conn) {
            return Err(locked(name, &vhost));
        }
        Ok(q)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn queue_declare(
        &mut self,
        conn: ConnId,
        name: &str,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: FieldTable,
        now_ms: u64,
    ) -> Result<DeclareOk> {
        if passive && name == REPLY_TO_QUEUE {
            // RabbitMQ reports the pseudo queue with one consumer whoever asks.
            return Ok(DeclareOk {
                queue: name.to_string(),
                message_count: 0,
                consumer_count: 1,
            });
        }
        if passive {
            let q = self.usable_queue(name, conn)?;
            q.last_used_ms = now_ms;
            return Ok(DeclareOk {
                queue: q.name.clone(),
                message_count: q.message_count() as u32,
                consumer_count: q.consumers.len() as u32,
            });
        }
        // rabbit_channel: exclusive queues are never durable, whatever the client asked.
        let durable = durable && !exclusive;
        let name = if name.is_empty() {
            let quorum = arguments
                .inner()
                .get("x-queue-type")
                .and_then(args::string)
                .is_some_and(|t| t == "quorum");
            if quorum {
                // Only classic queues may be server-named (queue type capability server_named).
                return Err(AmqpError::precondition(
                    "Cannot declare a server-named queue for type rabbit_quorum_queue",
                ));
            }
            generate_name("amq.gen-")
        } else if name.starts_with("amq.") {
            // rabbit_channel's check_name runs before the lookup: a client may not name an
            // amq.* queue, not even to redeclare a server-named one (passive declare may).
            return Err(AmqpError::access_refused(format!(
                "queue name '{name}' contains reserved prefix 'amq.*'"
            )));
        } else {
            name.to_string()
        };
        if let Some(&id) = self.queues_by_name.get(&name) {
            let vhost = self.name.clone();
            let q = self.queues.get_mut(&id).expect("indexed queue exists");
            if q.exclusive_owner.is_some_and(|o| o != conn)
                || (q.exclusive_owner.is_some() != exclusive)
            {
                return Err(locked(&name, &vhost));
            }
            check_queue_equivalence(q, durable, auto_delete, &arguments, &vhost)?;
            q.last_used_ms = now_ms;
            return Ok(DeclareOk {
                queue: name,
                message_count: q.message_count() as u32,
                consumer_count: q.consumers.len() as u32,
            });
        }
        let config = QueueConfig::parse(&arguments, &name, &self.name)?;
        if config.queue_type == QueueType::Quorum {
            let bad = |p: &str| {
                AmqpError::precondition(format!(
                    "invalid property '{p}' for queue '{name}' in vhost '{}'",
                    self.name
                ))
            };
            // rabbit_queue_type_util's checks, in rabbit_quorum_queue:declare's order.
            if auto_delete {
                return Err(bad("auto-delete"));
            }
            if exclusive {
                return Err(bad("exclusive-owner"));
            }
            if !durable {
                return Err(bad("non-durable"));
            }
        }
        let id = self.free_queue_ids.pop().unwrap_or_else(|| {
            self.next_queue += 1;
            QueueId(self.next_queue - 1)
        });
        let owner = exclusive.then_some(conn);
        let mut q = Queue::new(
            id,
            name.clone(),
            durable,
            owner,
            auto_delete,
            arguments,
            config,
            now_ms,
        );
        if q.durable {
            // A random log id: unique with overwhelming odds, and never reused after a delete.
            q.log_id = Some(rand::random::<u64>() | 1);
            self.meta.push(MetaRecord::DeclareQueue {
                vhost: self.name.clone(),
                name: name.clone(),
                auto_delete: q.auto_delete,
                arguments: q.arguments.clone(),
                log_id: q.log_id.unwrap_or(0),
            });
        }
        self.queues.insert(id, q);
        self.queues_by_name.insert(name.clone(), id);
        Ok(DeclareOk {
            queue: name,
            message_count: 0,
            consumer_count: 0,
        })
    }

    pub fn queue_bind(
        &mut self,
        conn: ConnId,
        queue: &str,
        exchange: &str,
        key: &str,
        arguments: &FieldTable,
    ) -> Result<()> {
        Self::refuse_default(exchange)?;
        // rabbit_binding reports a missing exchange (the source) before a missing queue.
        let xid = self.exchange_id(exchange)?;
        let qid = self.usable_queue(queue, conn)?.id;
        let new = self
            .routes
            .bind(xid, Destination::Queue(qid), key.as_bytes(), arguments)
            .map_err(routing_error)?;
        if new {
            self.record_binding(
                true,
                xid,
                Destination::Queue(qid),
                key.as_bytes(),
                arguments,
            );
        }
        Ok(())
    }

    pub fn queue_unbind(
        &mut self,
        conn: ConnId,
        queue: &str,
        exchange: &str,
        key: &str,
        arguments: &FieldTable,
    ) -> Result<()> {
        Self::refuse_default(exchange)?;
        // RabbitMQ answers unbind-ok when the exchange, the queue or the binding is missing
        // (rabbit_binding:remove), and checks exclusivity only for a binding it removes.
        let (Some(&xid), Some(&qid)) = (
            self.exchanges_by_name.get(exchange),
            self.queues_by_name.get(queue),
        ) else {
            return Ok(());
        };
        if !self
            .routes
            .binding_exists(xid, Destination::Queue(qid), key.as_bytes(), arguments)
        {
            return Ok(());
        }
        self.usable_queue(queue, conn)?;
        let unbound = self
            .routes
            .unbind(xid, Destination::Queue(qid), key.as_bytes(), arguments)
            .map_err(routing_error)?;
        if unbound.existed {
            self.record_binding(
                false,
                xid,
                Destination::Queue(qid),
                key.as_bytes(),
                arguments,
            );
        }
        if unbound.source_unused {
            self.delete_orphaned_auto_delete(vec![xid]);
        }
        Ok(())
    }

    pub fn queue_purge(&mut self, conn: ConnId, queue: &str) -> Result<u32> {
        let q = self.usable_queue(queue, conn)?;
        let purged = q.backlog.clear();
        let mut ops = Vec::new();
        for index in purged.iter().filter_map(|m| m.store_index) {
            q.release_stored(index, &mut ops);
        }
        self.store_ops.extend(ops);
        Ok(purged.len() as u32)
    }

    pub fn queue_delete(
        &mut self,
        conn: ConnId,
        queue: &str,
        if_unused: bool,
        if_empty: bool,
    ) -> Result<u32> {
        let vhost = self.name.clone();
        let q = match self.usable_queue(queue, conn) {
            Ok(q) => q,
            Err(e) if e.code == warren_protocol::constants::NOT_FOUND => return Ok(0),
            Err(e) => return Err(e),
        };
        if if_unused && !q.consumers.is_empty() {
            return Err(AmqpError::precondition(format!(
                "queue '{queue}' in vhost '{vhost}' in use"
            )));
        }
        if if_empty && !q.backlog.is_empty() {
            return Err(AmqpError::precondition(format!(
                "queue '{queue}' in vhost '{vhost}' not empty"
            )));
        }
        let id = q.id;
        Ok(self.delete_queue_by_id(id))
    }

    /// Removes a queue with its bindings and tells its consumers (basic.cancel); returns how
    /// many ready messages it held.
    fn delete_queue_by_id(&mut self, id: QueueId) -> u32 {
        let Some(mut q) = self.queues.remove(&id) else {
            return 0;
        };
        if let Some(log) = q.log_id {
            self.store_ops.push(StoreOp::DeleteLog { log });
        }
        if q.durable {
            self.meta.push(MetaRecord::DeleteQueue {
                vhost: self.name.clone(),
                name: q.name.clone(),
            });
        }
        self.queues_by_name.remove(&q.name);
        let orphaned = self
            .routes
            .remove_destination(Destination::Queue(id))
            .unwrap_or_default();
        // The id will be reused: deliveries still unacked elsewhere must not settle into the
        // next queue that gets it. Acking them stays legal, as in RabbitMQ.
        for ch in self.channels.values_mut() {
            for u in ch.unacked.iter_mut().filter(|u| u.queue == id) {
                u.queue = GONE;
            }
        }
        self.free_queue_ids.push(id);
        for c in q.consumers.drain(..) {
            if let Some(ch) = self.channels.get_mut(&c.channel) {
                ch.consumers.remove(&c.tag);
                let cancel =
                    Method::Other(AMQPClass::Basic(basic::AMQPMethod::Cancel(basic::Cancel {
                        consumer_tag: String::from_utf8_lossy(&c.tag).as_ref().into(),
                        nowait: true,
                    })));
                let number = ch.number;
                ch.outbox.push(|buf| cancel.encode(number, buf));
            }
        }
        self.delete_orphaned_auto_delete(orphaned);
        q.backlog.len() as u32
    }

    /// Exclusive queues die with their connection.
    pub fn connection_closed(&mut self, conn: ConnId) {
        let owned: Vec<QueueId> = self
            .queues
            .values()
            .filter(|q| q.exclusive_owner == Some(conn))
            .map(|q| q.id)
            .collect();
        for id in owned {
            self.delete_queue_by_id(id);
        }
    }

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
    fn stamp_reply_to(
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

    /// A reply to a direct reply-to address goes straight to the requester's channel, or
    /// nowhere if it has gone.
    fn deliver_reply(&mut self, message: Message) -> PublishOutcome {
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
        deliver(ch, &tag, delivery_tag, &m, false);
        PublishOutcome {
            routed: true,
            rejected: false,
        }
    }

    fn route(
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

    fn route_from(
        &mut self,
        id: ExchangeId,
        keys: &[Bytes],
        headers: Option<&FieldTable>,
        out: &mut Vec<QueueId>,
    ) {
        let _ = self.routes.route_keys(id, keys, headers, out);
    }

    fn exchange_kind(&self, name: &str) -> Option<ExchangeKind> {
        self.exchanges_by_name
            .get(name)
            .map(|id| self.exchanges[id].kind)
    }

    /// BCC recipients must not see the BCC header, as RabbitMQ strips it before delivery.
    fn strip_bcc(&self, message: Message, props: &Properties) -> Message {
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

    fn enqueue_all(&mut self, targets: &[QueueId], msg: MessageRef, now_ms: u64) -> PublishOutcome {
        let mut outcome = PublishOutcome::default();
        let mut dead = Vec::new();
        for &qid in targets {
            let Some(q) = self.queues.get_mut(&qid) else {
                continue;
            };
            if q.over_limit(msg.size_bytes()) && q.config.overflow != Overflow::DropHead {
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
        self.dead_letter(dead, now_ms);
        outcome
    }

    /// Puts a routed message in one queue and hands it to a consumer if one can take it, then
    /// applies what RabbitMQ's deliver_or_enqueue applies to a message nobody took: an
    /// x-message-ttl / expiration of 0 expires it at once, and drop-head trims the queue.
    fn enqueue(&mut self, qid: QueueId, msg: &MessageRef, now_ms: u64, dead: &mut Vec<DeadLetter>) {
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
        self.dispatch(qid, now_ms);
        let Some(q) = self.queues.get_mut(&qid) else {
            return;
        };
        if ttl_ms == Some(0) {
            if let Some(m) = q.backlog.pop_back_if(seq) {
                dead.push(DeadLetter {
                    queue: q.name.clone(),
                    config: q.config.clone(),
                    message: m,
                    reason: "expired",
                });
            }
        }
        drop_head_over_limit(q, dead);
    }

    // ---- dispatch --------------------------------------------------------------------------

    /// Hands ready messages of one queue to consumers with credit.
    fn dispatch(&mut self, qid: QueueId, now_ms: u64) {
        let mut dead = Vec::new();
        {
            let VHost {
                queues,
                channels,
                store_ops,
                ..
            } = self;
            let Some(q) = queues.get_mut(&qid) else {
                return;
            };
            loop {
                while let Some(head) = q.backlog.peek() {
                    if head.expires_at_ms.is_some_and(|t| t < now_ms) {
                        let m = q.backlog.pop_front().expect("peeked");
                        dead.push(DeadLetter {
                            queue: q.name.clone(),
                            config: q.config.clone(),
                            message: m,
                            reason: "expired",
                        });
                    } else {
                        break;
                    }
                }
                if q.backlog.is_empty() || q.consumers.is_empty() {
                    break;
                }
                let pick = q.pick_consumer(|c| {
                    channels.get(&c.channel).is_some_and(|ch| {
                        // channel.flow pauses every consumer; prefetch spares no-ack ones.
                        ch.flow_active && (c.no_ack || ch.can_take()) && !ch.outbox.is_congested()
                    })
                });
                let Some(ci) = pick else { break };
                let m = q.backlog.pop_front().expect("backlog not empty");
                let consumer = &mut q.consumers[ci];
                let ch = channels
                    .get_mut(&consumer.channel)
                    .expect("consumer's channel exists");
                let tag = ch.next_delivery_tag();
                deliver(
                    ch,
                    &consumer.tag,
                    tag,
                    &m,
                    q.config.queue_type == QueueType::Quorum,
                );
                if !consumer.no_ack {
                    consumer.unacked += 1;
                    q.unacked += 1;
                    ch.record(Unacked {
                        tag,
                        queue: qid,
                        consumer_tag: Some(consumer.tag.clone()),
                        message: m,
                        settled: false,
                    });
                } else if let Some(index) = m.store_index {
                    // Settled on delivery: a no-ack consumer took it for good.
                    q.release_stored(index, store_ops);
                }
            }
        }
        self.dead_letter(dead, now_ms);
    }

    // ---- consumers -------------------------------------------------------------------------

    pub fn channel_open(
        &mut self,
        key: ChannelKey,
        conn: ConnId,
        number: u16,
        outbox: Arc<Outbox>,
        user: &str,
    ) {
        self.channels.insert(
            key,
            ChannelState::new(conn, number, outbox, user.to_string()),
        );
    }

    /// Cancels the channel's consumers and requeues everything it had not acknowledged.
    pub fn channel_close(&mut self, key: ChannelKey, now_ms: u64) {
        let Some(mut ch) = self.channels.remove(&key) else {
            return;
        };
        if let Some((token, _)) = ch.reply_to.take() {
            self.reply_tokens.remove(&token);
        }
        let consumers: Vec<(Bytes, QueueId)> = ch.consumers.drain().collect();
        let unacked = ch.drain_unacked();
        let mut touched: Vec<QueueId> = Vec::new();
        for (tag, qid) in consumers {
            self.remove_consumer(qid, key, &tag);
            touched.push(qid);
        }
        let mut dead = Vec::new();
        for u in unacked {
            if let Some(q) = self.queues.get_mut(&u.queue) {
                q.unacked = q.unacked.saturating_sub(1);
                return_to_queue(q, u.message, false, &mut dead);
                if !touched.contains(&u.queue) {
                    touched.push(u.queue);
                }
            }
        }
        for qid in touched {
            self.after_consumer_change(qid, now_ms);
        }
        self.dead_letter(dead, now_ms);
    }

    fn remove_consumer(&mut self, qid: QueueId, channel: ChannelKey, tag: &[u8]) {
        if let Some(q) = self.queues.get_mut(&qid) {
            q.consumers
                .retain(|c| !(c.channel == channel && c.tag == tag));
            if q.next_consumer >= q.consumers.len() {
                q.next_consumer = 0;
            }
        }
    }

    /// Auto-delete queues go once their last consumer is gone; others get a dispatch pass.
    fn after_consumer_change(&mut self, qid: QueueId, now_ms: u64) {
        let Some(q) = self.queues.get(&qid) else {
            return;
        };
        if q.auto_delete && q.had_consumer && q.consumers.is_empty() {
            self.delete_queue_by_id(qid);
        } else {
            // RabbitMQ restarts the x-expires timer when a queue becomes unused.
            if let Some(q) = self.queues.get_mut(&qid).filter(|q| q.consumers.is_empty()) {
                q.last_used_ms = now_ms;
            }
            self.dispatch(qid, now_ms);
        }
    }

    pub fn basic_qos(&mut self, key: ChannelKey, prefetch_count: u16, global: bool, now_ms: u64) {
        let Some(ch) = self.channels.get_mut(&key) else {
            return;
        };
        if global {
            ch.channel_prefetch = prefetch_count as u32;
        } else {
            ch.consumer_prefetch = prefetch_count as u32;
            // RabbitMQ 3.10's basic.qos global=false also lifts the channel-wide limit
            // (rabbit_limiter:unlimit_prefetch): set it after, not before, to have both.
            ch.channel_prefetch = 0;
        }
        let queues: Vec<QueueId> = ch.consumers.values().copied().collect();
        for q in queues {
            self.dispatch(q, now_ms);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn basic_consume(
        &mut self,
        key: ChannelKey,
        queue: &str,
        tag: &str,
        no_ack: bool,
        exclusive: bool,
        arguments: FieldTable,
        now_ms: u64,
    ) -> Result<String> {
        let ch = self.channels.get(&key).expect("consume on an open channel");
        let conn = ch.conn;
        let prefetch = ch.consumer_prefetch;
        let global_qos = ch.channel_prefetch > 0;
        let tag = if tag.is_empty() {
            generate_name("amq.ctag-")
        } else {
            tag.to_string()
        };
        if ch.consumers.contains_key(tag.as_bytes())
            || ch
                .reply_to
                .as_ref()
                .is_some_and(|(_, t)| t == tag.as_bytes())
        {
            return Err(AmqpError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        if queue == REPLY_TO_QUEUE {
            if !no_ack {
                return Err(AmqpError::precondition("reply consumer cannot acknowledge"));
            }
            if ch.reply_to.is_some() {
                return Err(AmqpError::precondition("reply consumer already set"));
            }
            let token = Bytes::from(generate_name(""));
            self.reply_tokens.insert(token.clone(), key);
            self.channels.get_mut(&key).expect("checked above").reply_to =
                Some((token, Bytes::from(tag.clone())));
            return Ok(tag);
        }
        let vhost = self.name.clone();
        let q = self.usable_queue(queue, conn)?;
        // Checked after the queue, as RabbitMQ does (404/405 win), and worded like its
        // check_consume_arguments.
        let priority = match arguments.inner().get("x-priority") {
            None => 0,
            Some(v) => args::integer(v).ok_or_else(|| {
                AmqpError::precondition(format!(
                    "invalid arg 'x-priority' for queue '{queue}' in vhost '{vhost}': \"expected integer, got {}\"",
                    args::type_name(v)
                ))
            })? as i32,
        };
        // rabbit_quorum_queue:consume refuses a channel whose global limiter is active.
        if global_qos && q.is_quorum() {
            return Err(AmqpError::not_implemented(format!(
                "queue '{queue}' in vhost '{vhost}' does not support global qos"
            )));
        }
        if q.consumers.iter().any(|c| c.exclusive) || (exclusive && !q.consumers.is_empty()) {
            return Err(AmqpError::access_refused(format!(
                "queue '{queue}' in vhost '{vhost}' in exclusive use"
            )));
        }
        let tag_bytes = Bytes::from(tag.clone());
        q.consumers.push(Consumer {
            channel: key,
            tag: tag_bytes.clone(),
            no_ack,
            exclusive,
            priority,
            prefetch,
            unacked: 0,
            arguments,
        });
        q.had_consumer = true;
        q.last_used_ms = now_ms;
        let qid = q.id;
        self.channels
            .get_mut(&key)
            .expect("checked above")
            .consumers
            .insert(tag_bytes, qid);
        Ok(tag)
    }

    /// Dispatch after the consume-ok went out, so deliveries never precede it.
    pub fn kick(&mut self, queue: &str, now_ms: u64) {
        if let Some(&qid) = self.queues_by_name.get(queue) {
            self.dispatch(qid, now_ms);
        }
    }

    pub fn basic_cancel(&mut self, key: ChannelKey, tag: &str, now_ms: u64) -> bool {
        let Some(ch) = self.channels.get_mut(&key) else {
            return false;
        };
        if ch
            .reply_to
            .as_ref()
            .is_some_and(|(_, t)| t == tag.as_bytes())
        {
            let (token, _) = ch.reply_to.take().expect("checked");
            self.reply_tokens.remove(&token);
            return true;
        }
        let Some(qid) = ch.consumers.remove(tag.as_bytes()) else {
            return false;
        };
        self.remove_consumer(qid, key, tag.as_bytes());
        self.after_consumer_change(qid, now_ms);
        true
    }

    pub fn basic_get(
        &mut self,
        key: ChannelKey,
        queue: &str,
        no_ack: bool,
        now_ms: u64,
    ) -> Result<GetResult> {
        let conn = self
            .channels
            .get(&key)
            .expect("get on an open channel")
            .conn;
        let qid = self.usable_queue(queue, conn)?.id;
        // Expire heads first so get never returns a dead message.
        self.dispatch(qid, now_ms);
        let VHost {
            queues,
            channels,
            store_ops,
            ..
        } = self;
        let q = queues.get_mut(&qid).expect("queue exists");
        q.last_used_ms = now_ms;
        while q
            .backlog
            .peek()
            .is_some_and(|h| h.expires_at_ms.is_some_and(|t| t < now_ms))
        {
            q.backlog.pop_front();
        }
        let Some(m) = q.backlog.pop_front() else {
            return Ok(GetResult::Empty);
        };
        let ch = channels.get_mut(&key).expect("checked above");
        let tag = ch.next_delivery_tag();
        let remaining = q.backlog.len() as u32;
        let number = ch.number;
        let frame_max = ch.outbox.frame_max();
        let props = delivery_properties(&m, q.config.queue_type == QueueType::Quorum);
        let get_ok = Method::GetOk(warren_protocol::method::GetOk {
            delivery_tag: tag,
            redelivered: m.redelivered,
            exchange: m.msg.exchange.clone(),
            routing_key: m.msg.routing_key.clone(),
            message_count: remaining,
        });
        ch.outbox.push(|buf| {
            get_ok.encode(number, buf);
            encode_header(buf, number, 60, m.msg.body.len() as u64, &props);
            encode_body(buf, number, &m.msg.body, frame_max);
        });
        if !no_ack {
            q.unacked += 1;
            ch.record(Unacked {
                tag,
                queue: qid,
                consumer_tag: None,
                message: m,
                settled: false,
            });
        } else if let Some(index) = m.store_index {
            q.release_stored(index, store_ops);
        }
        Ok(GetResult::Delivered)
    }

    /// basic.ack; an unknown tag is 406 PRECONDITION_FAILED as in RabbitMQ.
    pub fn basic_ack(
        &mut self,
        key: ChannelKey,
        tag: u64,
        multiple: bool,
        now_ms: u64,
    ) -> Result<()> {
        let settled = self.settle(key, tag, multiple)?;
        let mut touched = Vec::new();
        for u in &settled {
            if let (Some(index), Some(q)) = (u.message.store_index, self.queues.get_mut(&u.queue)) {
                q.release_stored(index, &mut self.store_ops);
            }
            if !touched.contains(&u.queue) {
                touched.push(u.queue);
            }
        }
        for q in touched {
            self.dispatch(q, now_ms);
        }
        Ok(())
    }

    /// basic.nack and basic.reject: requeue at the head, or dead-letter.
    pub fn basic_nack(
        &mut self,
        key: ChannelKey,
        tag: u64,
        multiple: bool,
        requeue: bool,
        now_ms: u64,
    ) -> Result<()> {
        let settled = self.settle(key, tag, multiple)?;
        let mut touched = Vec::new();
        let mut dead = Vec::new();
        for u in settled {
            let Some(q) = self.queues.get_mut(&u.queue) else {
                continue;
            };
            if requeue {
                return_to_queue(q, u.message, true, &mut dead);
            } else {
                dead.push(DeadLetter {
                    queue: q.name.clone(),
                    config: q.config.clone(),
                    message: u.message,
                    reason: "rejected",
                });
            }
            if !touched.contains(&u.queue) {
                touched.push(u.queue);
            }
        }
        for q in touched {
            self.dispatch(q, now_ms);
        }
        self.dead_letter(dead, now_ms);
        Ok(())
    }

    fn settle(&mut self, key: ChannelKey, tag: u64, multiple: bool) -> Result<Vec<Unacked>> {
        let ch = self.channels.get_mut(&key).expect("ack on an open channel");
        let settled = ch
            .settle(tag, multiple)
            .ok_or_else(|| AmqpError::precondition(format!("unknown delivery tag {tag}")))?;
        for u in &settled {
            if let Some(q) = self.queues.get_mut(&u.queue) {
                q.unacked = q.unacked.saturating_sub(1);
                if let Some(ct) = &u.consumer_tag {
                    if let Some(c) = q
                        .consumers
                        .iter_mut()
                        .find(|c| c.channel == key && c.tag == ct)
                    {
                        c.unacked = c.unacked.saturating_sub(1);
                    }
                }
            }
        }
        Ok(settled)
    }

    /// basic.recover: RabbitMQ requeues every unacked message whatever `requeue` says.
    pub fn basic_recover(&mut self, key: ChannelKey, now_ms: u64) {
        let Some(ch) = self.channels.get_mut(&key) else {
            return;
        };
        let unacked = ch.drain_unacked();
        let mut touched = Vec::new();
        let mut dead = Vec::new();
        for u in unacked {
            let Some(q) = self.queues.get_mut(&u.queue) else {
                continue;
            };
            q.unacked = q.unacked.saturating_sub(1);
            if let Some(ct) = &u.consumer_tag {
                if let Some(c) = q
                    .consumers
                    .iter_mut()
                    .find(|c| c.channel == key && c.tag == ct)
                {
                    c.unacked = c.unacked.saturating_sub(1);
                }
            }
            return_to_queue(q, u.message, false, &mut dead);
            if !touched.contains(&u.queue) {
                touched.push(u.queue);
            }
        }
        for q in touched {
            self.dispatch(q, now_ms);
        }
        self.dead_letter(dead, now_ms);
    }

    pub fn channel_flow(&mut self, key: ChannelKey, active: bool, now_ms: u64) {
        let Some(ch) = self.channels.get_mut(&key) else {
            return;
        };
        ch.flow_active = active;
        if active {
            let queues: Vec<QueueId> = ch.consumers.values().copied().collect();
            for q in queues {
                self.dispatch(q, now_ms);
            }
        }
    }

    /// Resumes deliveries to a connection whose outbox had filled up.
    pub fn resume_connection(&mut self, conn: ConnId, now_ms: u64) {
        let queues: Vec<QueueId> = self
            .channels
            .values()
            .filter(|c| c.conn == conn)
            .flat_map(|c| c.consumers.values().copied())
            .collect();
        for q in queues {
            self.dispatch(q, now_ms);
        }
    }

    // ---- time ------------------------------------------------------------------------------

    /// Expires messages at queue heads and queues unused past x-expires.
    pub fn tick(&mut self, now_ms: u64) {
        let ids: Vec<QueueId> = self.queues.keys().copied().collect();
        for id in ids {
            let Some(q) = self.queues.get(&id) else {
                continue;
            };
            if let Some(expires) = q.config.expires_ms {
                if q.consumers.is_empty() && now_ms.saturating_sub(q.last_used_ms) >= expires {
                    self.delete_queue_by_id(id);
                    continue;
                }
            }
            if q.backlog
                .peek()
                .is_some_and(|h| h.expires_at_ms.is_some_and(|t| t < now_ms))
            {
                self.dispatch(id, now_ms);
            }
        }
    }

    // ---- dead-lettering --------------------------------------------------------------------

    fn dead_letter(&mut self, mut work: Vec<DeadLetter>, now_ms: u64) {
        let mut hops = 0;
        while !work.is_empty() && hops < DEAD_LETTER_HOPS_MAX {
            hops += 1;
            let batch = std::mem::take(&mut work);
            for d in batch {
                // It left its queue for good, whether or not it goes on to a DLX.
                if let Some(index) = d.message.store_index {
                    let q = self
                        .queues_by_name
                        .get(&d.queue)
                        .and_then(|id| self.queues.get_mut(id));
                    if let Some(q) = q {
                        q.release_stored(index, &mut self.store_ops);
                    }
                }
                let Some(dlx) = d.config.dead_letter_exchange.clone() else {
                    continue;
                };
                let Ok(props) = Properties::decode(&d.message.msg.properties) else {
                    continue;
                };
                let (msg, props) = dead_lettered_message(&d, &props, now_ms);
                let mut targets = Vec::new();
                if self.route(&dlx, &msg, &props, &mut targets).is_err() {
                    continue;
                }
                let deaths = props.headers_table().ok().flatten();
                targets.retain(|t| {
                    !self
                        .queues
                        .get(t)
                        .is_some_and(|q| is_cycle(deaths.as_ref(), &q.name))
                });
                let msg = Arc::new(msg);
                for qid in targets {
                    let Some(q) = self.queues.get_mut(&qid) else {
                        continue;
                    };
                    if q.over_limit(msg.size_bytes()) && q.config.overflow != Overflow::DropHead {
                        // A full reject-publish-dlx queue dead-letters whatever it refuses,
                        // dead letters included (maybe_deliver_or_enqueue).
                        if q.config.overflow == Overflow::RejectPublishDlx {
                            work.push(DeadLetter {
                                queue: q.name.clone(),
                                config: q.config.clone(),
                                message: QueuedMessage {
                                    msg: msg.clone(),
                                    redelivered: false,
                                    delivery_count: 0,
                                    expires_at_ms: None,
                                    seq: 0,
                                    store_index: None,
                                },
                                reason: "maxlen",
                            });
                        }
                        continue;
                    }
                    self.enqueue(qid, &msg, now_ms, &mut work);
                }
            }
        }
    }

    // ---- introspection ---------------------------------------------------------------------

    // ---- metadata --------------------------------------------------------------------------

    pub fn has_meta(&self) -> bool {
        !self.meta.is_empty()
    }

    /// Storage work since the last call, in order: carry it out before replying.
    pub fn take_store_ops(&mut self) -> Vec<StoreOp> {
        std::mem::take(&mut self.store_ops)
    }

    pub fn has_store_ops(&self) -> bool {
        !self.store_ops.is_empty()
    }

    /// Gives a recovered durable queue its log (the id the journal recorded).
    pub fn set_queue_log(&mut self, queue: &str, log_id: u64) {
        if let Some(q) = self
            .queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get_mut(id))
        {
            q.log_id = Some(log_id);
        }
    }

    /// Durable queues and their logs, for recovery.
    pub fn queue_logs(&self) -> Vec<(String, u64)> {
        self.queues
            .values()
            .filter_map(|q| Some((q.name.clone(), q.log_id?)))
            .collect()
    }

    /// Puts a recovered queue's stored messages back, oldest first: redelivered, since a
    /// consumer may have seen them before the restart (RabbitMQ marks them so too).
    /// `messages` holds (log index, message, wall-clock expiry in Unix ms or 0).
    pub fn restore_messages(
        &mut self,
        queue: &str,
        next_index: u64,
        messages: Vec<(u64, Message, u64)>,
    ) {
        let Some(q) = self
            .queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get_mut(id))
        else {
            return;
        };
        q.next_index = q.next_index.max(next_index);
        let live: Vec<u64> = messages.iter().map(|(i, _, _)| *i).collect();
        q.released = crate::queue::ReleaseTracker::recovered(&live, q.next_index);
        for (index, msg, expires_unix) in messages {
            let expires_at_ms =
                (expires_unix != 0).then(|| expires_unix.saturating_sub(self.unix_ms_at_epoch));
            q.backlog.push_back(QueuedMessage {
                msg: Arc::new(msg),
                redelivered: true,
                delivery_count: 0,
                expires_at_ms,
                seq: 0,
                store_index: Some(index),
            });
        }
    }

    /// Durable-topology changes since the last call, in the order they happened.
    pub fn take_meta(&mut self) -> Vec<MetaRecord> {
        std::mem::take(&mut self.meta)
    }

    /// The records that rebuild this vhost's durable topology (for journal compaction).
    pub fn export_meta(&self, out: &mut Vec<MetaRecord>) {
        let vhost = &self.name;
        let standard = |n: &str| STANDARD_EXCHANGES.iter().any(|(s, _, _)| *s == n);
        for x in self
            .exchanges
            .values()
            .filter(|x| x.durable && !standard(&x.name))
        {
            out.push(MetaRecord::DeclareExchange {
                vhost: vhost.clone(),
                name: x.name.clone(),
                kind: kind_name(x.kind).to_string(),
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
            });
        }
        for q in self.queues.values().filter(|q| q.durable) {
            out.push(MetaRecord::DeclareQueue {
                vhost: vhost.clone(),
                name: q.name.clone(),
                auto_delete: q.auto_delete,
                arguments: q.arguments.clone(),
                log_id: q.log_id.unwrap_or(0),
            });
        }
        for b in self.routes.bindings() {
            out.extend(self.binding_record(true, b.source, b.destination, b.key, &b.args_table()));
        }
    }

    /// The journal record of a binding change, when both ends are durable: RabbitMQ keeps
    /// only those across a restart.
    fn binding_record(
        &self,
        bind: bool,
        source: ExchangeId,
        destination: Destination,
        key: &[u8],
        arguments: &FieldTable,
    ) -> Option<MetaRecord> {
        let source = self
            .exchanges
            .get(&source)
            .filter(|x| x.durable)?
            .name
            .clone();
        let (destination, to_queue) = match destination {
            Destination::Queue(q) => (
                self.queues.get(&q).filter(|q| q.durable)?.name.clone(),
                true,
            ),
            Destination::Exchange(x) => (
                self.exchanges.get(&x).filter(|x| x.durable)?.name.clone(),
                false,
            ),
        };
        let (vhost, key, arguments) = (
            self.name.clone(),
            String::from_utf8_lossy(key).into_owned(),
            arguments.clone(),
        );
        Some(if bind {
            MetaRecord::Bind {
                vhost,
                source,
                destination,
                to_queue,
                key,
                arguments,
            }
        } else {
            MetaRecord::Unbind {
                vhost,
                source,
                destination,
                to_queue,
                key,
                arguments,
            }
        })
    }

    fn record_binding(
        &mut self,
        bind: bool,
        source: ExchangeId,
        destination: Destination,
        key: &[u8],
        arguments: &FieldTable,
    ) {
        if let Some(record) = self.binding_record(bind, source, destination, key, arguments) {
            self.meta.push(record);
        }
    }

    // ---- introspection ---------------------------------------------------------------------

    /// Every queue with its counters, for the management API and metrics.
    pub fn queue_infos(&self) -> Vec<QueueInfo> {
        let mut v: Vec<QueueInfo> = self
            .queues
            .values()
            .map(|q| QueueInfo {
                name: q.name.clone(),
                durable: q.durable,
                auto_delete: q.auto_delete,
                exclusive: q.exclusive_owner.is_some(),
                queue_type: if q.is_quorum() { "quorum" } else { "classic" },
                arguments: q.arguments.clone(),
                messages_ready: q.backlog.len() as u64,
                messages_unacknowledged: q.unacked as u64,
                message_bytes_ready: q.backlog.bytes() as u64,
                consumers: q.consumers.len() as u64,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn exchange_infos(&self) -> Vec<ExchangeInfo> {
        let mut v: Vec<ExchangeInfo> = self
            .exchanges
            .values()
            .map(|x| ExchangeInfo {
                name: x.name.clone(),
                kind: kind_name(x.kind),
                durable: x.durable,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
            })
            .collect();
        v.push(ExchangeInfo {
            name: String::new(),
            kind: "direct",
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::default(),
        });
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn binding_count(&self) -> usize {
        self.routes.binding_count()
    }

    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }

    pub fn queue_names(&self) -> Vec<String> {
        self.queues.values().map(|q| q.name.clone()).collect()
    }

    pub fn exchange_names(&self) -> Vec<String> {
        self.exchanges.values().map(|x| x.name.clone()).collect()
    }

    pub fn queue_stats(&self, name: &str) -> Option<(usize, usize, usize)> {
        let q = self.queues.get(self.queues_by_name.get(name)?)?;
        Some((q.backlog.len(), q.unacked, q.consumers.len()))
    }

    pub fn total_ready_bytes(&self) -> usize {
        self.queues.values().map(|q| q.backlog.bytes()).sum()
    }
}

/// Puts a delivered message back in its queue (nack/reject with requeue, recover, channel
/// close): at its original position in a classic queue, behind earlier returns in a quorum
/// queue, or to the dead-letter exchange once it has exceeded the quorum queue's
/// x-delivery-limit (rabbit_fifo's return_one counts every return alike).
/// `rejected`: the client nacked or rejected the message (rather than its channel closing or
/// it calling recover). A quorum queue then puts it at the back, as RabbitMQ 3.10 does.
fn return_to_queue(
    q: &mut Queue,
    mut m: QueuedMessage,
    rejected: bool,
    dead: &mut Vec<DeadLetter>,
) {
    m.redelivered = true;
    m.delivery_count += 1;
    if q.config
        .delivery_limit
        .is_some_and(|l| m.delivery_count as u64 > l)
    {
        dead.push(DeadLetter {
            queue: q.name.clone(),
            config: q.config.clone(),
            message: m,
            reason: "delivery_limit",
        });
    } else {
        if q.is_quorum() && rejected {
            m.redelivered = true;
            q.backlog.push_back(m);
        } else if q.is_quorum() {
            q.backlog.requeue_after_returns(m);
        } else {
            q.backlog.requeue(m);
        }
        // rabbit_amqqueue_process:requeue_and_run applies drop-head after a requeue too.
        drop_head_over_limit(q, dead);
    }
}

/// Drops (dead-letters with reason maxlen) from the head while a drop-head queue is over its
/// x-max-length or x-max-length-bytes.
fn drop_head_over_limit(q: &mut Queue, dead: &mut Vec<DeadLetter>) {
    if q.config.overflow != Overflow::DropHead {
        return;
    }
    while q.exceeds_limit() {
        let Some(m) = q.backlog.pop_front() else {
            break;
        };
        dead.push(DeadLetter {
            queue: q.name.clone(),
            config: q.config.clone(),
            message: m,
            reason: "maxlen",
        });
    }
}

fn routing_error(e: crate::routing::RoutingError) -> AmqpError {
    AmqpError::new(e.reply_code(), e)
}

fn locked(name: &str, vhost: &str) -> AmqpError {
    AmqpError::resource_locked(format!(
        "cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration."
    ))
}

fn check_queue_equivalence(
    q: &Queue,
    durable: bool,
    auto_delete: bool,
    arguments: &FieldTable,
    vhost: &str,
) -> Result<()> {
    let what = format!("for queue '{}' in vhost '{vhost}'", q.name);
    if q.durable != durable {
        return Err(AmqpError::precondition(format!(
            "inequivalent arg 'durable' {what}: received '{durable}' but current is '{}'",
            q.durable
        )));
    }
    if q.auto_delete != auto_delete {
        return Err(AmqpError::precondition(format!(
            "inequivalent arg 'auto_delete' {what}: received '{auto_delete}' but current is '{}'",
            q.auto_delete
        )));
    }
    for key in args::equivalence_keys(q.config.queue_type) {
        check_arg_equivalence(key, arguments, &q.arguments, &what)?;
    }
    Ok(())
}

/// rabbit_misc:assert_args_equivalence for one key: `what` names the entity ("for queue 'q' in
/// vhost '/'").
fn check_arg_equivalence(
    key: &str,
    arguments: &FieldTable,
    current: &FieldTable,
    what: &str,
) -> Result<()> {
    let new = arguments.inner().get(key);
    let cur = current.inner().get(key);
    let same = match (new, cur) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a == b
                || (args::integer(a).is_some() && args::integer(a) == args::integer(b))
                || (args::string(a).is_some() && args::string(a) == args::string(b))
        }
        // RabbitMQ treats a missing x-queue-type as equal to the current type.
        (None, Some(_)) | (Some(_), None) => {
            key == "x-queue-type"
                && args::string(new.or(cur).expect("one is set")).as_deref() == Some("classic")
        }
    };
    if same {
        return Ok(());
    }
    // rabbit_misc:val/1: with both values present RabbitMQ compares (and prints) the bare
    // values; only when one side is missing does it print the other with its type.
    let both = new.is_some() && cur.is_some();
    let render = |v: Option<&AMQPValue>| match v {
        Some(v) if both => format!("'{}'", args::render(v)),
        Some(v) => format!(
            "the value '{}' of type '{}'",
            args::render(v),
            args::type_name(v)
        ),
        None => "none".to_string(),
    };
    Err(AmqpError::precondition(format!(
        "inequivalent arg '{key}' {what}: received {} but current is {}",
        render(new),
        render(cur)
    )))
}

/// Whether a headers table might carry CC/BCC, checked on the raw bytes before parsing it.
fn needs_headers(raw: &[u8]) -> bool {
    raw.windows(3).any(|w| w == b"\x02CC") || raw.windows(4).any(|w| w == b"\x03BCC")
}

/// The properties a consumer sees: the publisher's bytes, plus x-delivery-count on every
/// quorum queue delivery (0 the first time, as RabbitMQ 3.10.8 sends it: measured by the
/// interop suite).
fn delivery_properties(m: &QueuedMessage, quorum: bool) -> Bytes {
    if !quorum {
        return m.msg.properties.clone();
    }
    let Ok(mut p) = Properties::decode(&m.msg.properties) else {
        return m.msg.properties.clone();
    };
    let mut table = p.headers_table().ok().flatten().unwrap_or_default();
    table.insert(
        "x-delivery-count".into(),
        AMQPValue::LongLongInt(m.delivery_count as i64),
    );
    p.set_headers_table(Some(&table));
    p.encode()
}

fn deliver(ch: &ChannelState, consumer_tag: &[u8], tag: u64, m: &QueuedMessage, quorum: bool) {
    let number = ch.number;
    let frame_max = ch.outbox.frame_max();
    let props = delivery_properties(m, quorum);
    ch.outbox.push(|buf| {
        encode_deliver(
            buf,
            number,
            consumer_tag,
            tag,
            m.redelivered,
            &m.msg.exchange,
            &m.msg.routing_key,
        );
        encode_header(buf, number, 60, m.msg.body.len() as u64, &props);
        encode_body(buf, number, &m.msg.body, frame_max);
    });
}

/// The message as it leaves for the dead-letter exchange, with RabbitMQ's x-death bookkeeping.
fn dead_lettered_message(d: &DeadLetter, props: &Properties, now_ms: u64) -> (Message, Properties) {
    let orig = &d.message.msg;
    let mut table = props.headers_table().ok().flatten().unwrap_or_default();
    let mut routing_keys = vec![AMQPValue::LongString(LongString::from(
        orig.routing_key.to_vec(),
    ))];
    if let Some(AMQPValue::FieldArray(cc)) = table.inner().get("CC") {
        routing_keys.extend(cc.as_slice().iter().cloned());
    }
    let mut deaths: Vec<AMQPValue> = match table.inner().get("x-death") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let same = |t: &FieldTable| {
        t.inner().get("queue").and_then(args::string).as_deref() == Some(d.queue.as_str())
            && t.inner().get("reason").and_then(args::string).as_deref() == Some(d.reason)
    };
    let existing = deaths
        .iter()
        .position(|v| matches!(v, AMQPValue::FieldTable(t) if same(t)));
    let entry = match existing {
        Some(i) => {
            let AMQPValue::FieldTable(mut t) = deaths.remove(i) else {
                unreachable!("matched a table")
            };
            let count = t.inner().get("count").and_then(args::integer).unwrap_or(0) + 1;
            t.insert("count".into(), AMQPValue::LongLongInt(count));
            t
        }
        None => {
            let mut t = FieldTable::default();
            t.insert("count".into(), AMQPValue::LongLongInt(1));
            t.insert(
                "reason".into(),
                AMQPValue::LongString(LongString::from(d.reason)),
            );
            t.insert(
                "queue".into(),
                AMQPValue::LongString(LongString::from(d.queue.as_str())),
            );
            t.insert("time".into(), AMQPValue::Timestamp(now_ms / 1000));
            t.insert(
                "exchange".into(),
                AMQPValue::LongString(LongString::from(orig.exchange.to_vec())),
            );
            t.insert(
                "routing-keys".into(),
                AMQPValue::FieldArray(FieldArray::from(routing_keys.clone())),
            );
            if let Some(e) = &props.expiration {
                t.insert(
                    "original-expiration".into(),
                    AMQPValue::LongString(LongString::from(e.to_vec())),
                );
            }
            t
        }
    };
    deaths.insert(0, AMQPValue::FieldTable(entry));
    table.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(deaths)),
    );
    if !table.inner().contains_key("x-first-death-reason") {
        table.insert(
            "x-first-death-reason".into(),
            AMQPValue::LongString(LongString::from(d.reason)),
        );
        table.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString(LongString::from(d.queue.as_str())),
        );
        table.insert(
            "x-first-death-exchange".into(),
            AMQPValue::LongString(LongString::from(orig.exchange.to_vec())),
        );
    }
    if d.config.dead_letter_routing_key.is_some() {
        // RabbitMQ's make_msg: a replaced routing key also drops CC, so the dead letter is
        // routed by that key alone (x-death's routing-keys still record the CC keys).
        let mut inner = table.inner().clone();
        inner.remove("CC");
        table = FieldTable::from(inner);
    }
    let mut p = props.clone();
    p.expiration = None;
    p.set_headers_table(Some(&table));
    let routing_key = match &d.config.dead_letter_routing_key {
        Some(k) => Bytes::from(k.clone()),
        None => orig.routing_key.clone(),
    };
    let exchange = Bytes::from(d.config.dead_letter_exchange.clone().unwrap_or_default());
    let msg = Message {
        exchange,
        routing_key,
        properties: p.encode(),
        body: orig.body.clone(),
        persistent: orig.persistent,
        priority: orig.priority,
        expiration_ms: None,
        // RabbitMQ routes the dead letter by all the original keys unless the queue set one.
        bcc: match &d.config.dead_letter_routing_key {
            Some(_) => Vec::new(),
            None => orig.bcc.clone(),
        },
    };
    (msg, p)
}

/// RabbitMQ drops a dead letter that would return to a queue it already died in, unless a
/// rejection (a client's decision, so no endless automatic loop) happened since it last died
/// there: rabbit_dead_letter:is_cycle looks at the deaths newest first, up to and including
/// the target queue's entry. `headers` are the dead letter's, its newest death first.
fn is_cycle(headers: Option<&FieldTable>, target: &str) -> bool {
    let Some(AMQPValue::FieldArray(deaths)) = headers.and_then(|h| h.inner().get("x-death")) else {
        return false;
    };
    let mut rejected_since = false;
    for v in deaths.as_slice() {
        let AMQPValue::FieldTable(t) = v else {
            // RabbitMQ counts an entry that is not a table as breaking the cycle.
            rejected_since = true;
            continue;
        };
        let field = |k: &str| t.inner().get(k).and_then(args::string);
        rejected_since |= field("reason").as_deref() == Some("rejected");
        if field("queue").as_deref() == Some(target) {
            return !rejected_since;
        }
    }
    false
}

fn generate_name(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut rng = rand::thread_rng();
    let suffix: String = (0..22)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{suffix}")
}
