//! What the vhost reports: durable-topology records for the journal, storage effects,
//! recovery of stored messages, and counters for the management API.

use super::*;
use crate::command::Command;

impl VHost {
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

    /// Puts a recovered queue's stored messages back, oldest first, bodies left on disk:
    /// `entries` holds (log index, stored size) of every live entry of its log. They are
    /// marked redelivered, since a consumer may have seen them before the restart (RabbitMQ
    /// marks them so too). Needs [`VHost::set_paging`] first; false when the queue is gone.
    pub fn restore_stored(&mut self, queue: &str, next_index: u64, entries: &[(u64, u32)]) -> bool {
        let Some(q) = self
            .queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get_mut(id))
        else {
            return false;
        };
        debug_assert!(self.paging.is_some(), "restore needs a store to read from");
        q.next_index = q.next_index.max(next_index);
        // Dead letters it held (restored first, from their flagged entries) are live too.
        let mut live: Vec<u64> = entries.iter().map(|(i, _)| *i).collect();
        if !q.dead_letters.is_empty() {
            live.extend(q.dead_letters.indexes());
            live.sort_unstable();
        }
        q.released = crate::queue::ReleaseTracker::recovered(&live, q.next_index);
        q.backlog.restore(entries);
        true
    }

    /// Lets every durable queue keep the bodies of a long backlog on disk only, reading them
    /// back through `paging` (the node's store) as consumers reach them.
    pub fn set_paging(&mut self, paging: Paging) {
        for q in self.queues.values_mut() {
            q.enable_paging(paging.clone());
        }
        self.paging = Some(paging);
    }

    /// Pages out the bodies of queues that took stored messages, now that the server has
    /// handed their appends to the engine (so they can be read back). Does nothing while
    /// storage work is still waiting to be taken.
    pub fn page_out(&mut self) {
        if !self.store_ops.is_empty() {
            return;
        }
        for qid in std::mem::take(&mut self.page_out_due) {
            let Some(q) = self.queues.get_mut(&qid) else {
                continue;
            };
            q.page_out_due = false;
            q.backlog.page_out();
            for index in q.backlog.take_lost() {
                q.release_stored(index, &mut self.store_ops);
            }
        }
    }

    /// Durable-topology changes since the last call, in the order they happened.
    pub fn take_meta(&mut self) -> Vec<MetaRecord> {
        std::mem::take(&mut self.meta)
    }

    /// The records that rebuild this vhost's durable topology (for journal compaction).
    pub fn export_meta(&self, out: &mut Vec<MetaRecord>) {
        let vhost = &self.name;
        out.extend(self.policy_records());
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

    /// Records the node hosting `queue`'s messages (clusters: every node knows every queue).
    pub fn set_queue_home(&mut self, queue: &str, node: &str) {
        if let Some(q) = self
            .queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get_mut(id))
        {
            q.home_node = Some(node.into());
        }
    }

    /// Records a quorum queue's members.
    pub fn set_queue_members(&mut self, queue: &str, members: &[String]) {
        if let Some(q) = self
            .queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get_mut(id))
        {
            q.members = members.iter().map(|m| m.as_str().into()).collect();
        }
    }

    /// A queue's settings, as its declare parsed them.
    pub fn queue_config(&self, queue: &str) -> Option<crate::args::QueueConfig> {
        let id = self.queues_by_name.get(queue)?;
        Some(self.queues.get(id)?.config.clone())
    }

    /// A quorum queue's log id and members, when it has members (in a cluster).
    pub fn replicated_queue(&self, queue: &str) -> Option<(u64, Vec<std::sync::Arc<str>>)> {
        let q = self.queues.get(self.queues_by_name.get(queue)?)?;
        (!q.members.is_empty()).then(|| Some((q.log_id?, q.members.clone())))?
    }

    /// Every quorum queue with members (a cluster's): name, log id and members.
    pub fn replicated_queues(&self) -> Vec<(String, u64, Vec<std::sync::Arc<str>>)> {
        self.queues
            .values()
            .filter(|q| !q.members.is_empty())
            .filter_map(|q| Some((q.name.clone(), q.log_id?, q.members.clone())))
            .collect()
    }

    /// How many of this vhost's queues each node hosts (leads), for balanced placement.
    pub fn count_queues_by_home(&self, counts: &mut std::collections::HashMap<String, usize>) {
        for q in self.queues.values() {
            if let Some(home) = &q.home_node {
                *counts.entry(home.to_string()).or_default() += 1;
            }
        }
    }

    /// The node hosting `queue`'s messages, when the queue exists and one was recorded.
    pub fn queue_home(&self, queue: &str) -> Option<std::sync::Arc<str>> {
        let id = self.queues_by_name.get(queue)?;
        self.queues.get(id)?.home_node.clone()
    }

    /// The commands that rebuild this vhost's whole topology, durable or not, with each
    /// queue's owner, log and node: a replicated snapshot, which must reproduce exactly what
    /// applying the log did.
    pub fn export_commands(&self, out: &mut Vec<Command>) {
        let vhost = &self.name;
        out.extend(
            self.policy_records()
                .into_iter()
                .map(|record| Command::Meta { record }),
        );
        let standard = |n: &str| STANDARD_EXCHANGES.iter().any(|(s, _, _)| *s == n);
        let mut exchanges: Vec<_> = self
            .exchanges
            .values()
            .filter(|x| !standard(&x.name))
            .collect();
        exchanges.sort_by_key(|x| x.id.0);
        for x in exchanges {
            out.push(Command::ExchangeDeclare {
                vhost: vhost.clone(),
                name: x.name.clone(),
                kind: kind_name(x.kind).to_string(),
                durable: x.durable,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
            });
        }
        let mut queues: Vec<_> = self.queues.values().collect();
        queues.sort_by_key(|q| q.id.0);
        for q in queues {
            out.push(Command::QueueDeclare {
                vhost: vhost.clone(),
                conn: q.exclusive_owner.unwrap_or(0),
                name: q.name.clone(),
                durable: q.durable,
                exclusive: q.exclusive_owner.is_some(),
                auto_delete: q.auto_delete,
                // Only a name the server made may be amq.*: declared as the client's own, a
                // quorum queue would be refused as server-named, and a node catching up from
                // the snapshot would lack it.
                server_named: q.name.starts_with("amq."),
                arguments: q.arguments.clone(),
                log_id: q.log_id.unwrap_or(0),
                node: q.home_node.as_deref().unwrap_or_default().to_string(),
                members: q.members.iter().map(|m| m.to_string()).collect(),
                at_unix_ms: 0,
            });
        }
        for b in self.routes.bindings() {
            let Some(source) = self.exchanges.get(&b.source) else {
                continue;
            };
            let (key, arguments) = (String::from_utf8_lossy(b.key).into_owned(), b.args_table());
            match b.destination {
                Destination::Queue(q) => {
                    let Some(q) = self.queues.get(&q) else {
                        continue;
                    };
                    out.push(Command::QueueBind {
                        vhost: vhost.clone(),
                        conn: q.exclusive_owner.unwrap_or(0),
                        queue: q.name.clone(),
                        exchange: source.name.clone(),
                        key,
                        arguments,
                    });
                }
                Destination::Exchange(x) => {
                    let Some(x) = self.exchanges.get(&x) else {
                        continue;
                    };
                    out.push(Command::ExchangeBind {
                        vhost: vhost.clone(),
                        destination: x.name.clone(),
                        source: source.name.clone(),
                        key,
                        arguments,
                    });
                }
            }
        }
    }

    /// The journal record of a binding change, when both ends are durable: RabbitMQ keeps
    /// only those across a restart.
    pub(super) fn binding_record(
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

    /// Refuses, from now on, every command that would change durable state (the node's
    /// storage failed and nothing more can be written). Not undone: only a restart clears it.
    pub fn refuse_durable_changes(&self, why: &str) {
        let _ = self.durable_changes_refused.set(why.to_string());
    }

    /// Makes this vhost refuse durable changes whenever `refusal` is set: the node's one
    /// switch, shared by all its vhosts.
    pub fn share_durable_refusal(&mut self, refusal: Arc<OnceLock<String>>) {
        self.durable_changes_refused = refusal;
    }

    /// Counts the queues this vhost deletes on its own into the node's churn counters.
    pub fn share_queue_churn(&mut self, churn: Arc<crate::broker::QueueChurn>) {
        self.queue_churn = churn;
    }

    /// Checked before a command changes durable state, never after: the refusal must leave
    /// memory as it was, since what memory says is what clients are told.
    pub(super) fn durable_change_allowed(&self) -> Result<()> {
        match self.durable_changes_refused.get() {
            None => Ok(()),
            // 541: an AMQP connection exception that, in the spec's words, "may require
            // intervention by an operator in order to resume normal operations" (a restart).
            Some(why) => Err(AmqpError::new(
                warren_protocol::constants::INTERNAL_ERROR,
                format!("{why}; durable changes are refused until the node is restarted"),
            )),
        }
    }

    /// [`VHost::durable_change_allowed`] for a bind (`bind`) or unbind that would be
    /// journalled: both ends durable, and the binding new (bind) or present (unbind). A client
    /// re-declaring the bindings it already has is not refused.
    pub(super) fn binding_change_allowed(
        &self,
        bind: bool,
        source: ExchangeId,
        destination: Destination,
        key: &str,
        arguments: &FieldTable,
    ) -> Result<()> {
        if self.durable_changes_refused.get().is_none()
            || self
                .binding_record(bind, source, destination, key.as_bytes(), arguments)
                .is_none()
        {
            return Ok(());
        }
        let exists = self
            .routes
            .binding_exists(source, destination, key.as_bytes(), arguments);
        if exists == bind {
            return Ok(());
        }
        self.durable_change_allowed()
    }

    pub(super) fn record_binding(
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
        let stream_consumers = self.stream_consumer_counts();
        let mut v: Vec<QueueInfo> = self
            .queues
            .values()
            .map(|q| QueueInfo {
                name: q.name.clone(),
                durable: q.durable,
                auto_delete: q.auto_delete,
                exclusive: q.exclusive_owner.is_some(),
                queue_type: q.config.queue_type.name(),
                arguments: q.arguments.clone(),
                messages_ready: q.backlog.len() as u64,
                messages_unacknowledged: q.unacked as u64,
                message_bytes_ready: q.backlog.bytes() as u64,
                messages_paged_out: q.backlog.paged_out() as u64,
                consumers: q.consumers.len() as u64
                    + stream_consumers.get(&q.id).copied().unwrap_or(0),
                node: q.home_node.clone(),
                stats: q.stats,
                members: q.members.clone(),
                log_id: q.log_id,
                policy: q.policy.clone(),
                operator_policy: q.operator_policy.clone(),
                effective_policy_definition: self
                    .effective_definition(q.policy.as_deref(), q.operator_policy.as_deref()),
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
                policy: x.policy.clone(),
            })
            .collect();
        v.push(ExchangeInfo {
            name: String::new(),
            kind: "direct",
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::default(),
            policy: None,
        });
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// The channels of this node's clients (stand-ins for other nodes' clients left out),
    /// ordered by connection and number.
    pub fn channel_infos(&self) -> Vec<ChannelInfo> {
        let mut v: Vec<ChannelInfo> = self
            .channels
            .values()
            .filter(|ch| ch.relay.is_none())
            .map(|ch| ChannelInfo {
                key: ch.key,
                conn: ch.conn,
                number: ch.number,
                user: ch.user.clone(),
                prefetch_count: ch.consumer_prefetch,
                global_prefetch_count: ch.channel_prefetch,
                consumer_count: ch.consumers.len() as u32,
                messages_unacknowledged: ch.unacked_live,
            })
            .collect();
        v.sort_by_key(|c| (c.conn, c.number));
        v
    }

    /// The consumers of this node's clients' channels, on local and remote queues alike.
    pub fn consumer_infos(&self) -> Vec<ConsumerInfo> {
        let mut out = Vec::new();
        for ch in self.channels.values().filter(|ch| ch.relay.is_none()) {
            for (tag, qid) in &ch.consumers {
                let Some(q) = self.queues.get(qid) else {
                    continue;
                };
                let local = q
                    .consumers
                    .iter()
                    .find(|c| c.channel == ch.key && c.tag == *tag);
                out.push(ConsumerInfo {
                    channel: ch.key,
                    conn: ch.conn,
                    number: ch.number,
                    queue: q.name.clone(),
                    tag: String::from_utf8_lossy(tag).into_owned(),
                    ack_required: local.is_none_or(|c| !c.no_ack),
                    exclusive: local.is_some_and(|c| c.exclusive),
                    prefetch_count: local.map_or(ch.consumer_prefetch, |c| c.prefetch),
                    arguments: local.map(|c| c.arguments.clone()).unwrap_or_default(),
                });
            }
        }
        out.sort_by(|a, b| (a.conn, a.number, &a.tag).cmp(&(b.conn, b.number, &b.tag)));
        out
    }

    /// Every explicit binding (the default exchange's implicit ones left out), by names,
    /// sorted by source, destination, key.
    pub fn binding_infos(&self) -> Vec<BindingInfo> {
        let mut out: Vec<BindingInfo> = self
            .routes
            .bindings()
            .filter_map(|b| {
                let source = self.exchanges.get(&b.source)?.name.clone();
                let (destination, to_queue) = match b.destination {
                    Destination::Queue(q) => (self.queues.get(&q)?.name.clone(), true),
                    Destination::Exchange(x) => (self.exchanges.get(&x)?.name.clone(), false),
                };
                Some(BindingInfo {
                    source,
                    destination,
                    to_queue,
                    routing_key: String::from_utf8_lossy(b.key).into_owned(),
                    arguments: b.args_table(),
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.source, !a.to_queue, &a.destination, &a.routing_key).cmp(&(
                &b.source,
                !b.to_queue,
                &b.destination,
                &b.routing_key,
            ))
        });
        out
    }

    /// Every queue's message counters, cheaply (no arguments cloned): for sampling rates.
    pub fn queue_stats_all(&self) -> Vec<(String, crate::queue::QueueStats)> {
        self.queues
            .values()
            .map(|q| (q.name.clone(), q.stats))
            .collect()
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

    // ---- limits and access -----------------------------------------------------------------

    /// The vhost's limits (`max-connections`, `max-queues`).
    pub fn limits(&self) -> &crate::limits::LimitMap {
        &self.limits
    }

    /// Replaces the vhost's limits; queues already over a lowered `max-queues` stay.
    pub fn set_limits(&mut self, limits: crate::limits::LimitMap) {
        self.limits = limits;
    }

    /// The channels `user` has open here (this node's clients; stand-ins left out): what
    /// `max-channels` counts.
    pub fn channel_count_of(&self, user: &str) -> usize {
        self.channels
            .values()
            .filter(|ch| ch.relay.is_none() && ch.user == user)
            .count()
    }

    /// Whether `name` is a topic exchange: only those have topic permissions.
    pub fn is_topic_exchange(&self, name: &str) -> bool {
        self.exchanges_by_name
            .get(name)
            .is_some_and(|id| self.exchanges[id].kind == ExchangeKind::Topic)
    }
}
