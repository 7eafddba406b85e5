//! Topology commands as values: what a client or an operator asked to change, carried out by
//! [`Broker::execute`] alike on every node of a cluster.
//!
//! A replicated change is proposed as a command, and every node applies the same commands in the
//! same order (RabbitMQ's Ra `apply/3` shape): so the command carries everything that would
//! otherwise be decided on the spot and differ between nodes (a server-generated queue name, a
//! queue's storage log id, the node that hosts it), and a refusal (406 inequivalent arguments,
//! 404 no exchange) is the same on every node, changing nothing anywhere. The node that took the
//! client's request answers it from its own application of the command.
//!
//! What depends on state that only one node has (a queue's messages and consumers, for
//! `if-empty` and `if-unused`) is checked there before proposing, never in [`Broker::execute`].

use crate::broker::Broker;
use crate::definitions::MetaRecord;
use crate::error::AmqpError;
use crate::queue::ConnId;
use crate::vhost::{DeclareOk, NewQueue, VHost};
use amq_protocol_types::FieldTable;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Users, vhosts and permissions, as the metadata journal records them.
    Meta { record: MetaRecord },
    ExchangeDeclare {
        vhost: String,
        name: String,
        kind: String,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    },
    ExchangeDelete {
        vhost: String,
        name: String,
        if_unused: bool,
    },
    QueueDeclare {
        vhost: String,
        /// The declaring connection: the owner of an exclusive queue. Connection ids are unique
        /// across the cluster (each node numbers its own from a range of its own).
        conn: ConnId,
        name: String,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        /// `name` was generated for the client, so it may start with `amq.`.
        server_named: bool,
        arguments: FieldTable,
        /// The queue's storage log (durable queues), chosen by the proposer.
        log_id: u64,
        /// The node hosting the queue's messages (a quorum queue's first leader).
        node: String,
        /// A quorum queue's members (nodes holding a replica), `node` first; none for others.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<String>,
        /// When it was declared, in ms since the Unix epoch by the proposer's clock: its unused
        /// time (`x-expires`) starts then on every node. 0 (a snapshot, a command written
        /// before this field) starts it when the node applies the command.
        #[serde(default, skip_serializing_if = "is_zero")]
        at_unix_ms: u64,
    },
    QueueDelete {
        vhost: String,
        conn: ConnId,
        name: String,
    },
    QueueBind {
        vhost: String,
        conn: ConnId,
        queue: String,
        exchange: String,
        key: String,
        arguments: FieldTable,
    },
    QueueUnbind {
        vhost: String,
        conn: ConnId,
        queue: String,
        exchange: String,
        key: String,
        arguments: FieldTable,
    },
    ExchangeBind {
        vhost: String,
        destination: String,
        source: String,
        key: String,
        arguments: FieldTable,
    },
    ExchangeUnbind {
        vhost: String,
        destination: String,
        source: String,
        key: String,
        arguments: FieldTable,
    },
    /// A quorum queue's members from now on (rabbitmq-queues add_member, delete_member, grow,
    /// shrink): nodes joining open a replica and catch up from the leader, nodes leaving close
    /// theirs, and the queue's leader changes the Raft group's voters to match.
    QueueMembers {
        vhost: String,
        name: String,
        members: Vec<String>,
    },
}

/// What a command did, for the reply to whoever asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    QueueDeclared(DeclareOk),
    /// queue.delete-ok's message count, and whether there was such a queue (RabbitMQ answers
    /// delete-ok for a missing one; only a real deletion counts as queue churn).
    QueueDeleted {
        messages: u32,
        existed: bool,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("commands always serialise")
    }

    pub fn decode(bytes: &[u8]) -> Result<Command, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("unreadable command: {e}"))
    }
}

impl Command {
    /// The vhost the command changes; none for users, vhosts and permissions.
    pub fn vhost(&self) -> Option<&str> {
        match self {
            Command::Meta { .. } => None,
            Command::ExchangeDeclare { vhost, .. }
            | Command::ExchangeDelete { vhost, .. }
            | Command::QueueDeclare { vhost, .. }
            | Command::QueueDelete { vhost, .. }
            | Command::QueueBind { vhost, .. }
            | Command::QueueUnbind { vhost, .. }
            | Command::ExchangeBind { vhost, .. }
            | Command::ExchangeUnbind { vhost, .. }
            | Command::QueueMembers { vhost, .. } => Some(vhost),
        }
    }
}

impl Broker {
    /// Carries out `command`; the same commands in the same order leave every node's broker in
    /// the same state and give the same outcomes.
    pub fn execute(&self, command: &Command) -> Result<Outcome, AmqpError> {
        self.execute_then(command, |_| Ok(()))
    }

    /// [`Self::execute`], then `settle` with the changed vhost still locked (also after a
    /// refusal): a single node journals what the change wrote there, so that the journal's order
    /// is the order of the changes. A refusal is answered before a failed `settle`.
    pub fn execute_then(
        &self,
        command: &Command,
        settle: impl FnOnce(&mut VHost) -> Result<(), AmqpError>,
    ) -> Result<Outcome, AmqpError> {
        let Some(name) = command.vhost() else {
            if let Command::Meta { record } = command {
                self.apply(record.clone())
                    .map_err(AmqpError::precondition)?;
            }
            return Ok(Outcome::Done);
        };
        let vhost = self
            .vhost(name)
            .ok_or_else(|| AmqpError::not_found(format!("no vhost '{name}'")))?;
        let mut vhost = vhost.lock().expect("vhost lock");
        let outcome = self.change(&mut vhost, command);
        let settled = settle(&mut vhost);
        let outcome = outcome?;
        settled.map(|()| outcome)
    }

    /// Applies a command that changes `v`, its vhost.
    fn change(&self, v: &mut VHost, command: &Command) -> Result<Outcome, AmqpError> {
        match command {
            Command::Meta { .. } => unreachable!("a command on users and vhosts changes no vhost"),
            Command::ExchangeDeclare {
                vhost: _,
                name,
                kind,
                durable,
                auto_delete,
                internal,
                arguments,
            } => {
                v.exchange_declare(
                    name,
                    kind,
                    false,
                    *durable,
                    *auto_delete,
                    *internal,
                    arguments.clone(),
                )?;
            }
            Command::ExchangeDelete {
                vhost: _,
                name,
                if_unused,
            } => {
                v.exchange_delete(name, *if_unused)?;
            }
            Command::QueueDeclare {
                vhost: _,
                conn,
                name,
                durable,
                exclusive,
                auto_delete,
                server_named,
                arguments,
                log_id,
                node,
                members,
                at_unix_ms,
            } => {
                let now = match *at_unix_ms {
                    0 => self.now_ms(),
                    at => at.saturating_sub(self.unix_ms_at_epoch),
                };
                let new = NewQueue {
                    durable: *durable,
                    exclusive: *exclusive,
                    auto_delete: *auto_delete,
                    server_named: *server_named,
                    log_id: (*log_id != 0).then_some(*log_id),
                };
                let ok = v.queue_declare_as(*conn, name, new, arguments.clone(), now)?;
                if !node.is_empty() && v.queue_home(name).is_none() {
                    v.set_queue_home(name, node);
                    v.set_queue_members(name, members);
                }
                return Ok(Outcome::QueueDeclared(ok));
            }
            Command::QueueMembers {
                vhost: _,
                name,
                members,
            } => {
                if v.replicated_queue(name).is_none() {
                    return Err(AmqpError::not_found(format!(
                        "no quorum queue '{name}' in vhost '{}'",
                        v.name
                    )));
                }
                if members.is_empty() {
                    return Err(AmqpError::precondition(format!(
                        "quorum queue '{name}' would have no member left"
                    )));
                }
                v.set_queue_members(name, members);
                // Nodes that are not members reach the queue through its home: a member.
                if !v
                    .queue_home(name)
                    .is_some_and(|h| members.iter().any(|m| **m == *h))
                {
                    v.set_queue_home(name, &members[0]);
                }
            }
            Command::QueueDelete {
                vhost: _,
                conn,
                name,
            } => {
                let existed = v.queue_stats(name).is_some();
                let messages = v.queue_delete(*conn, name, false, false)?;
                return Ok(Outcome::QueueDeleted { messages, existed });
            }
            Command::QueueBind {
                vhost: _,
                conn,
                queue,
                exchange,
                key,
                arguments,
            } => {
                v.queue_bind(*conn, queue, exchange, key, arguments)?;
            }
            Command::QueueUnbind {
                vhost: _,
                conn,
                queue,
                exchange,
                key,
                arguments,
            } => {
                v.queue_unbind(*conn, queue, exchange, key, arguments)?;
            }
            Command::ExchangeBind {
                vhost: _,
                destination,
                source,
                key,
                arguments,
            } => {
                v.exchange_bind(destination, source, key, arguments)?;
            }
            Command::ExchangeUnbind {
                vhost: _,
                destination,
                source,
                key,
                arguments,
            } => {
                v.exchange_unbind(destination, source, key, arguments)?;
            }
        }
        Ok(Outcome::Done)
    }
}

impl Broker {
    /// The commands that rebuild the whole topology (users, vhosts, permissions, and every
    /// exchange, queue and binding, durable or not, then limits and topic permissions): a
    /// replicated snapshot.
    pub fn export_commands(&self) -> Vec<Command> {
        let mut out: Vec<Command> = Vec::new();
        let mut vhosts = self.vhosts();
        vhosts.sort_by(|a, b| a.0.cmp(&b.0));
        for record in self.export_meta() {
            // Only the node-wide records: each vhost's entities come with their full state below.
            if matches!(
                record,
                MetaRecord::AddVhost { .. }
                    | MetaRecord::PutUser { .. }
                    | MetaRecord::SetPermissions { .. }
            ) {
                out.push(Command::Meta { record });
            }
        }
        for (_, v) in &vhosts {
            v.lock().expect("vhost lock").export_commands(&mut out);
        }
        // Limits after the queues they count (see `Broker::export_access`).
        out.extend(
            self.export_access()
                .into_iter()
                .map(|record| Command::Meta { record }),
        );
        out
    }

    /// Forgets every vhost and user, before a snapshot is installed in their place.
    pub fn clear_topology(&self) {
        self.clear_vhosts();
        *self.users.write().expect("users lock") = crate::users::Users::default();
    }
}
