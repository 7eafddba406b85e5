//! A virtual host: its exchanges, queues, bindings and the consumer side of its channels,
//! driven by commands from connections and by the clock.
//!
//! Everything a message touches between publish and delivery lives here, under one lock held
//! by the server for the duration of a command, so that routing, enqueueing and dispatching
//! to consumers is plain sequential code with no message passing on the hot path. Outbound
//! frames go to the target connection's [`Outbox`].
//!
//! This file holds the vhost's state, exchanges and queues; the rest is by concept:
//! `publish` (routing and enqueueing), `delivery` (dispatch, consumers, acks, the clock),
//! `dead_letter` (x-death and DLX routing), `metadata` (journal records, storage effects,
//! recovery and counters).

use crate::args::{self, Overflow, QueueConfig};
use crate::backlog::Paging;
use crate::channel::{ChannelState, Unacked};
use crate::definitions::MetaRecord;
use crate::error::{AmqpError, Result};
use crate::exchange::{kind_from_name, kind_name, Exchange, STANDARD_EXCHANGES};
use crate::message::{Message, MessageRef};
use crate::outbox::Outbox;
use crate::persistence::StoreOp;
use crate::queue::{ChannelKey, ConnId, Consumer, Queue, QueuedMessage};
use crate::queue_type::{QueueType, ReturnPosition};
use crate::relay::{Delivery, QuorumTarget, Relay, RemoteEffect, SettleOp};
use crate::routing::{Destination, ExchangeId, ExchangeKind, QueueId, RoutingTable};
use amq_protocol_types::{AMQPValue, FieldArray, FieldTable, LongString};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use warren_protocol::amqp::{basic, AMQPClass};
use warren_protocol::content::{encode_header, with_sole_long_long_header, Properties};
use warren_protocol::frame::encode_body;
use warren_protocol::method::{encode_deliver, Method};
use warren_store::IdHashMap;

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
    /// The declare made the queue (it did not exist): RabbitMQ's `queues_created` churn.
    pub created: bool,
}

/// What basic.get found.
#[derive(Debug, Clone)]
pub enum GetResult {
    Empty,
    /// The get-ok and content were written to the channel's outbox.
    Delivered,
    /// For a stand-in channel (its client is on another node): the message, to relay.
    Relayed(Delivery),
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
    /// Ready messages whose bodies are on disk only (RabbitMQ's messages_paged_out).
    pub messages_paged_out: u64,
    pub consumers: u64,
    /// The node hosting the queue in a cluster (`None` on a single node).
    pub node: Option<std::sync::Arc<str>>,
    pub stats: crate::queue::QueueStats,
    /// A quorum queue's members in a cluster.
    pub members: Vec<std::sync::Arc<str>>,
    /// The queue's storage log (durable queues).
    pub log_id: Option<u64>,
    /// The policy and operator policy that apply to it, and their merged definition.
    pub policy: Option<String>,
    pub operator_policy: Option<String>,
    pub effective_policy_definition: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct ExchangeInfo {
    pub name: String,
    pub kind: &'static str,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    /// The policy that applies to it, if any.
    pub policy: Option<String>,
}

/// A channel as the management API lists it (`/api/channels`).
#[derive(Debug, Clone)]
pub struct ChannelInfo {
    pub key: ChannelKey,
    pub conn: ConnId,
    pub number: u16,
    pub user: String,
    /// basic.qos global=false: applied to consumers created from now on.
    pub prefetch_count: u32,
    /// basic.qos global=true: shared by the whole channel.
    pub global_prefetch_count: u32,
    pub consumer_count: u32,
    pub messages_unacknowledged: u32,
}

/// A consumer of a client channel as the management API lists it (`/api/consumers`). The
/// details of a consumer of a queue on another node stay on that node: defaults here.
#[derive(Debug, Clone)]
pub struct ConsumerInfo {
    pub channel: ChannelKey,
    pub conn: ConnId,
    pub number: u16,
    pub queue: String,
    pub tag: String,
    pub ack_required: bool,
    pub exclusive: bool,
    pub prefetch_count: u32,
    pub arguments: FieldTable,
}

/// A binding as the management API lists it (`/api/bindings`), by names.
#[derive(Debug, Clone)]
pub struct BindingInfo {
    pub source: String,
    pub destination: String,
    /// Whether the destination is a queue (else an exchange).
    pub to_queue: bool,
    pub routing_key: String,
    pub arguments: FieldTable,
}

pub struct VHost {
    pub name: String,
    exchanges_by_name: HashMap<String, ExchangeId>,
    exchanges: IdHashMap<ExchangeId, Exchange>,
    queues_by_name: HashMap<String, QueueId>,
    queues: IdHashMap<QueueId, Queue>,
    routes: RoutingTable,
    channels: IdHashMap<ChannelKey, ChannelState>,
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
    /// Where paged-out bodies are read back from, once the node has a store.
    paging: Option<Paging>,
    /// Queues that took stored messages since the last [`VHost::page_out`].
    page_out_due: Vec<QueueId>,
    /// Why durable changes are refused, once the node's storage has failed: a command that
    /// would change durable state fails before it changes anything, so no client is told of
    /// a change that the next restart would silently undo. Shared by every vhost of a node,
    /// so that refusing takes no vhost lock (the failure may be found under one).
    durable_changes_refused: Arc<OnceLock<String>>,
    /// In a cluster, this node's name: queues hosted elsewhere are copies here (their clock
    /// runs on their own node), and queues this vhost deletes on its own are reported.
    local_node: Option<Arc<str>>,
    /// Queues this vhost deleted on its own (auto-delete, x-expires, an exclusive owner gone),
    /// with the connection that owned them, for the cluster to delete everywhere.
    self_deleted: Vec<(String, ConnId)>,
    /// The node's churn counters, where those deletes are counted.
    queue_churn: Arc<crate::broker::QueueChurn>,
    /// Work for other nodes (forwarded publishes, settled remote deliveries), in order.
    remote: Vec<RemoteEffect>,
    /// Open stand-ins for channels of clients on other nodes.
    stand_ins: usize,
    /// The vhost's policies and operator policies (see `policies`).
    policies: crate::policy::Policies,
    /// Queues a policy change may have left over a length limit, to trim.
    limits_due: Vec<QueueId>,
    /// Streams whose effective retention or segment size a policy change moved, for the
    /// server to hand their writers ([`VHost::take_reconfigured_streams`]).
    streams_reconfigured: Vec<(u64, crate::stream_args::StreamConfig)>,
    /// The vhost's limits (`max-connections`, `max-queues`); see [`crate::limits`].
    limits: crate::limits::LimitMap,
}

/// A message leaving a queue for its dead-letter exchange.
struct DeadLetter {
    queue: String,
    config: QueueConfig,
    message: QueuedMessage,
    reason: &'static str,
}

mod dead_letter;
mod delivery;
mod metadata;
mod policies;
mod publish;
mod remote;
mod stream;
pub use dead_letter::DeadLettered;
pub use remote::{Accepted, QuorumConsume};
pub use stream::StreamConsume;

impl VHost {
    pub fn new(name: &str) -> Self {
        let mut v = VHost {
            name: name.to_string(),
            exchanges_by_name: HashMap::new(),
            exchanges: IdHashMap::default(),
            queues_by_name: HashMap::new(),
            queues: IdHashMap::default(),
            routes: RoutingTable::new(),
            channels: IdHashMap::default(),
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
            paging: None,
            page_out_due: Vec::new(),
            durable_changes_refused: Arc::default(),
            local_node: None,
            self_deleted: Vec::new(),
            queue_churn: Arc::default(),
            remote: Vec::new(),
            stand_ins: 0,
            policies: crate::policy::Policies::default(),
            limits_due: Vec::new(),
            streams_reconfigured: Vec::new(),
            limits: Default::default(),
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
        let (alternate, policy, operator_policy) = self.exchange_policy(name, &arguments);
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
                policy,
                operator_policy,
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
            self.durable_change_allowed()?;
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
        if self.exchanges[&id].durable {
            self.durable_change_allowed()?;
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
        self.binding_change_allowed(true, src, Destination::Exchange(dst), key, arguments)?;
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
        self.binding_change_allowed(false, src, Destination::Exchange(dst), key, arguments)?;
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
                created: false,
            });
        }
        if passive {
            let q = self.usable_queue(name, conn)?;
            q.last_used_ms = now_ms;
            return Ok(DeclareOk {
                queue: q.name.clone(),
                message_count: q.message_count() as u32,
                consumer_count: q.consumers.len() as u32,
                created: false,
            });
        }
        self.queue_declare_as(
            conn,
            name,
            NewQueue {
                durable,
                exclusive,
                auto_delete,
                server_named: false,
                log_id: None,
            },
            arguments,
            now_ms,
        )
    }

    /// A non-passive queue.declare whose server-generated name and storage log id, if any, the
    /// caller chose: how a replicated declare is applied alike on every node.
    pub fn queue_declare_as(
        &mut self,
        conn: ConnId,
        name: &str,
        new: NewQueue,
        arguments: FieldTable,
        now_ms: u64,
    ) -> Result<DeclareOk> {
        let NewQueue {
            durable,
            exclusive,
            auto_delete,
            server_named,
            log_id,
        } = new;
        // rabbit_channel: exclusive queues are never durable, whatever the client asked.
        let durable = durable && !exclusive;
        if server_named || name.is_empty() {
            let queue_type = arguments
                .inner()
                .get("x-queue-type")
                .and_then(args::string)
                .and_then(|t| QueueType::from_name(&t));
            if let Some(t) = queue_type.filter(|t| !t.may_be_server_named()) {
                // Whether the name is made here or was made for a replicated declare.
                return Err(AmqpError::precondition(format!(
                    "Cannot declare a server-named queue for type {}",
                    t.module()
                )));
            }
        }
        let name = if server_named {
            name.to_string()
        } else if name.is_empty() {
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
                created: false,
            });
        }
        let config = QueueConfig::parse(&arguments, &name, &self.name)?;
        if let Some(p) = config
            .queue_type
            .refused_property(durable, exclusive, auto_delete)
        {
            return Err(AmqpError::precondition(format!(
                "invalid property '{p}' for queue '{name}' in vhost '{}'",
                self.name
            )));
        }
        if durable {
            self.durable_change_allowed()?;
        }
        // Counted here, where a replicated declare is applied, so that every node refuses it
        // alike: each holds every queue of the vhost, whichever node hosts it.
        let max_queues = crate::limits::effective(&self.limits, crate::limits::MAX_QUEUES);
        if crate::limits::reached(max_queues, self.queues.len()) {
            let limit = max_queues.unwrap_or_default();
            return Err(crate::limits::queues_refused(&name, &self.name, limit));
        }
        let id = self.free_queue_ids.pop().unwrap_or_else(|| {
            self.next_queue += 1;
            QueueId(self.next_queue - 1)
        });
        let (config, policy, operator_policy) = self.queue_policy(&name, &config, &arguments);
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
        (q.policy, q.operator_policy) = (policy, operator_policy);
        if q.durable {
            // A random log id: unique with overwhelming odds, and never reused after a delete.
            q.log_id = Some(log_id.unwrap_or_else(|| rand::random::<u64>() | 1));
            if let Some(paging) = &self.paging {
                q.enable_paging(paging.clone());
            }
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
            created: true,
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
        self.binding_change_allowed(true, xid, Destination::Queue(qid), key, arguments)?;
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
        self.binding_change_allowed(false, xid, Destination::Queue(qid), key, arguments)?;
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
        if q.log_id.is_some() && !q.backlog.is_empty() {
            // The releases could not be written: the purged messages would be back after a
            // restart.
            self.durable_change_allowed()?;
        }
        let q = self.usable_queue(queue, conn)?;
        let purged = q.backlog.clear();
        let mut ops = Vec::new();
        for index in purged.stored {
            q.release_stored(index, &mut ops);
        }
        self.store_ops.extend(ops);
        Ok(purged.count as u32)
    }

    /// queue.delete's if-unused and if-empty checks alone: in a cluster, the node hosting the
    /// queue (which alone knows its consumers and messages) makes them before the deletion is
    /// replicated.
    pub fn queue_delete_check(
        &mut self,
        conn: ConnId,
        queue: &str,
        if_unused: bool,
        if_empty: bool,
    ) -> Result<()> {
        let vhost = self.name.clone();
        let q = match self.usable_queue(queue, conn) {
            Ok(q) => q,
            Err(e) if e.code == warren_protocol::constants::NOT_FOUND => return Ok(()),
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
        Ok(())
    }

    pub fn queue_delete(
        &mut self,
        conn: ConnId,
        queue: &str,
        if_unused: bool,
        if_empty: bool,
    ) -> Result<u32> {
        self.queue_delete_check(conn, queue, if_unused, if_empty)?;
        let q = match self.usable_queue(queue, conn) {
            Ok(q) => q,
            Err(e) if e.code == warren_protocol::constants::NOT_FOUND => return Ok(0),
            Err(e) => return Err(e),
        };
        let (id, durable) = (q.id, q.durable);
        if durable {
            self.durable_change_allowed()?;
        }
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
        if member_here(&self.local_node, &q) || q.config.queue_type == QueueType::Stream {
            // Its consumers on this node are known to their channels only (a stream's
            // readers stop with its log).
            for ch in self.channels.values_mut() {
                let tags: Vec<Bytes> = ch
                    .consumers
                    .iter()
                    .filter(|(_, qid)| **qid == id)
                    .map(|(t, _)| t.clone())
                    .collect();
                for tag in tags {
                    ch.consumers.remove(&tag);
                    remote::notify_cancel(ch, &tag);
                }
            }
        }
        for c in q.consumers.drain(..) {
            if let Some(ch) = self.channels.get_mut(&c.channel) {
                ch.consumers.remove(&c.tag);
                if let Some(relay) = &ch.relay {
                    relay.cancelled(ch.key, &c.tag);
                    continue;
                }
                remote::notify_cancel(ch, &c.tag);
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
            self.delete_queue_on_its_own(id);
        }
    }

    /// Makes this vhost part of a cluster node named `node` (see `local_node`).
    pub fn set_local_node(&mut self, node: Arc<str>) {
        self.local_node = Some(node);
    }

    /// Deletes a queue on this node's own initiative; in a cluster it is reported so that
    /// every node deletes its copy.
    pub(super) fn delete_queue_on_its_own(&mut self, id: QueueId) {
        if self.local_node.is_some() {
            if let Some(q) = self.queues.get(&id) {
                let owner = q.exclusive_owner.unwrap_or(0);
                self.self_deleted.push((q.name.clone(), owner));
            }
        }
        if self.queues.contains_key(&id) {
            self.queue_churn.deleted();
        }
        self.delete_queue_by_id(id);
    }

    /// Queues deleted on this node's own initiative since the last call (clusters only).
    pub fn take_self_deleted(&mut self) -> Vec<(String, ConnId)> {
        std::mem::take(&mut self.self_deleted)
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
    for key in q.config.queue_type.arguments() {
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

/// Whether `q` is a quorum queue with a member on the node named `local`: this node's replica
/// takes its publishes, consumers and acks to its group. A node that is not a member reaches
/// it as a classic queue hosted by its first member (its home).
fn member_here(local: &Option<Arc<str>>, q: &Queue) -> bool {
    // A stream's members replicate its log, not a quorum queue's state: its publishes and
    // consumers take the stream's own path (`RemoteEffect::StreamAppend`, its readers).
    q.is_replicated()
        && q.config.queue_type != QueueType::Stream
        && local.as_ref().is_some_and(|me| q.members.contains(me))
}

/// Whether `q`'s messages live on the node named `local` (always, outside a cluster).
fn hosts(local: &Option<Arc<str>>, q: &Queue) -> bool {
    if q.is_replicated() {
        return false;
    }
    match (local, &q.home_node) {
        (Some(me), Some(home)) => me == home,
        _ => true,
    }
}

/// What a non-passive queue.declare asks for beyond the name and arguments.
#[derive(Debug, Clone, Copy, Default)]
pub struct NewQueue {
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    /// The name was generated for the client (`amq.gen-...`): the `amq.` prefix is allowed.
    pub server_named: bool,
    /// The storage log of a durable queue; a random one when `None`.
    pub log_id: Option<u64>,
}

/// A name for a server-named queue (`amq.gen-` and 22 random characters, as RabbitMQ).
pub fn generate_queue_name() -> String {
    generate_name("amq.gen-")
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
