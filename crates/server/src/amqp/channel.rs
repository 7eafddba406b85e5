//! Channel commands: what each AMQP method on an open channel does, with RabbitMQ's
//! permission checks and reply codes. Publishing state (confirms, transactions, content being
//! assembled) lives here; consumer state lives in the broker's vhost.

use crate::amqp::connection::{Connection, Fault};
use crate::amqp::transactions::TxOp;
use crate::queues::Delete;
use crate::topology::proposal::Reply;
use amq_protocol_types::ShortString;
use bytes::{Bytes, BytesMut};
use warren_broker::command::Command;
use warren_broker::error::AmqpError;
use warren_broker::users::Access;
use warren_protocol::amqp::{access, basic, channel, confirm, exchange, queue, AMQPClass};
use warren_protocol::constants::*;
use warren_protocol::content::ContentHeader;
use warren_protocol::method::{Method, Publish};

/// A publish whose content is still arriving.
pub struct Pending {
    pub publish: Publish,
    pub header: Option<ContentHeader>,
    pub body: BytesMut,
    /// The body when it arrived in exactly one frame: kept as a slice of the read buffer.
    pub single: Option<Bytes>,
    /// A body frame went past the declared size: the content never completes.
    pub overflowed: bool,
}

pub struct Channel {
    pub key: u64,
    /// Whether the vhost knows this channel (false once it was closed on the broker side).
    pub registered: bool,
    /// We sent channel.close and wait for close-ok.
    pub closing: bool,
    pub pending: Option<Pending>,
    pub confirm: bool,
    pub next_publish_seq: u64,
    /// Highest sequence number ready to be confirmed with one ack(multiple=true).
    pub ack_upto: Option<u64>,
    /// Highest sequence number already confirmed, to count confirms for metrics.
    pub confirmed_upto: u64,
    /// Publishes waiting for their stored copies to be synced, in sequence order.
    pub pending_confirms: std::collections::VecDeque<(u64, Vec<crate::durability::Wait>)>,
    pub tx: Option<Vec<TxOp>>,
    /// The queue most recently declared on this channel: an empty queue name means it.
    pub last_queue: Option<String>,
    /// Whether it has published: RabbitMQ's publishers are the channels that have
    /// (`rabbitmq_global_publishers`), counted in [`crate::Counters::publishers`].
    pub publisher: bool,
}

impl Channel {
    pub fn new(key: u64) -> Self {
        Channel {
            key,
            registered: true,
            closing: false,
            pending: None,
            confirm: false,
            next_publish_seq: 1,
            ack_upto: None,
            confirmed_upto: 0,
            pending_confirms: std::collections::VecDeque::new(),
            tx: None,
            last_queue: None,
            publisher: false,
        }
    }
}

/// RabbitMQ's answer to any method a channel does not accept from a client.
fn unimplemented(ids: (u16, u16)) -> Fault {
    Fault::Connection(
        AmqpError::command_invalid("unimplemented method"),
        ids.0,
        ids.1,
    )
}

/// RabbitMQ drops CR and LF from exchange and queue names in declare, delete, bind and unbind
/// (rabbit_channel:strip_cr_lf): a name declared with them is known by the stripped name.
fn strip_cr_lf(name: &mut ShortString) {
    if name.as_str().contains(['\r', '\n']) {
        *name = name.as_str().replace(['\r', '\n'], "").into();
    }
}

fn strip_names(class: &mut AMQPClass) {
    use exchange::AMQPMethod as E;
    use queue::AMQPMethod as Q;
    match class {
        AMQPClass::Exchange(E::Declare(d)) => strip_cr_lf(&mut d.exchange),
        AMQPClass::Exchange(E::Delete(d)) => strip_cr_lf(&mut d.exchange),
        AMQPClass::Exchange(E::Bind(b)) => {
            strip_cr_lf(&mut b.destination);
            strip_cr_lf(&mut b.source);
        }
        AMQPClass::Exchange(E::Unbind(b)) => {
            strip_cr_lf(&mut b.destination);
            strip_cr_lf(&mut b.source);
        }
        AMQPClass::Queue(Q::Declare(d)) => strip_cr_lf(&mut d.queue),
        AMQPClass::Queue(Q::Delete(d)) => strip_cr_lf(&mut d.queue),
        AMQPClass::Queue(Q::Bind(b)) => {
            strip_cr_lf(&mut b.queue);
            strip_cr_lf(&mut b.exchange);
        }
        AMQPClass::Queue(Q::Unbind(b)) => {
            strip_cr_lf(&mut b.queue);
            strip_cr_lf(&mut b.exchange);
        }
        _ => {}
    }
}

pub(crate) fn ctl(conn: &Connection, number: u16, class: AMQPClass) {
    let m = Method::Other(class);
    conn.outbox.push(|b| m.encode(number, b));
}

impl Connection {
    /// The connection's vhost, locked; durable changes are journalled when the guard drops.
    pub fn meta_vhost(&self) -> crate::storage::MetaGuard<'_> {
        crate::storage::MetaGuard {
            vhost: self.vhost.lock().expect("vhost lock"),
            shared: &self.shared,
        }
    }

    fn check(&self, access: Access, kind: &str, name: &str) -> Result<(), AmqpError> {
        // RabbitMQ checks the default exchange under the name amq.default.
        let name = if kind == "exchange" && name.is_empty() {
            "amq.default"
        } else {
            name
        };
        let p = &self.permissions;
        let ok = match access {
            Access::Configure => p.configure.matches(name),
            Access::Write => p.write.matches(name),
            Access::Read => p.read.matches(name),
        };
        if ok {
            return Ok(());
        }
        Err(AmqpError::access_refused(format!(
            "access to {kind} '{name}' in vhost '{}' refused for user '{}'",
            self.vhost_name, self.user
        )))
    }

    fn queue_name(&self, number: u16, name: &str) -> Result<String, AmqpError> {
        if !name.is_empty() {
            return Ok(name.to_string());
        }
        self.channels[&number]
            .last_queue
            .clone()
            .ok_or_else(|| AmqpError::not_found("no previously declared queue"))
    }

    pub fn handle_method(
        &mut self,
        number: u16,
        method: Method,
        ids: (u16, u16),
    ) -> Result<(), Fault> {
        let now = self.shared.broker.now_ms();
        let fail = |e: AmqpError| Fault::Channel(number, e, ids.0, ids.1);
        match method {
            Method::Publish(p) => {
                if p.immediate {
                    return Err(Fault::Connection(
                        AmqpError::not_implemented("immediate=true"),
                        ids.0,
                        ids.1,
                    ));
                }
                let exchange = std::str::from_utf8(&p.exchange).unwrap_or_default();
                self.check(Access::Write, "exchange", exchange)
                    .map_err(fail)?;
                self.check_topic(Access::Write, exchange, &p.routing_key)
                    .map_err(fail)?;
                let ch = self.channels.get_mut(&number).expect("open channel");
                ch.pending = Some(Pending {
                    publish: p,
                    header: None,
                    body: BytesMut::new(),
                    single: None,
                    overflowed: false,
                });
                Ok(())
            }
            Method::Ack(a) => self
                .settle(
                    number,
                    TxOp::Ack {
                        tag: a.delivery_tag,
                        multiple: a.multiple,
                    },
                    now,
                )
                .map_err(fail),
            Method::Nack(n) => self
                .settle(
                    number,
                    TxOp::Nack {
                        tag: n.delivery_tag,
                        multiple: n.multiple,
                        requeue: n.requeue,
                    },
                    now,
                )
                .map_err(fail),
            Method::Reject(r) => self
                .settle(
                    number,
                    TxOp::Nack {
                        tag: r.delivery_tag,
                        multiple: false,
                        requeue: r.requeue,
                    },
                    now,
                )
                .map_err(fail),
            Method::Deliver(_) | Method::GetOk(_) | Method::Return(_) => Err(unimplemented(ids)),
            Method::Other(class) => self.handle_control(number, class, now, ids),
        }
    }

    fn handle_control(
        &mut self,
        number: u16,
        mut class: AMQPClass,
        now: u64,
        ids: (u16, u16),
    ) -> Result<(), Fault> {
        let fail = |e: AmqpError| Fault::Channel(number, e, ids.0, ids.1);
        strip_names(&mut class);
        match class {
            AMQPClass::Channel(m) => self.channel_method(number, m, now),
            AMQPClass::Exchange(m) => self.exchange_method(number, m).map_err(fail),
            AMQPClass::Queue(m) => self.queue_method(number, m, now).map_err(fail),
            AMQPClass::Basic(m) => self.basic_method(number, m, now, ids),
            AMQPClass::Confirm(confirm::AMQPMethod::Select(s)) => {
                let ch = self.channels.get_mut(&number).expect("open channel");
                if ch.tx.is_some() {
                    return Err(fail(AmqpError::precondition(
                        "cannot switch from tx to confirm mode",
                    )));
                }
                ch.confirm = true;
                if !s.nowait {
                    ctl(
                        self,
                        number,
                        AMQPClass::Confirm(confirm::AMQPMethod::SelectOk(confirm::SelectOk {})),
                    );
                }
                Ok(())
            }
            AMQPClass::Tx(m) => self.tx_method(number, m).map_err(fail),
            AMQPClass::Access(access::AMQPMethod::Request(_)) => {
                ctl(
                    self,
                    number,
                    AMQPClass::Access(access::AMQPMethod::RequestOk(access::RequestOk {})),
                );
                Ok(())
            }
            AMQPClass::Connection(_) => Err(unimplemented(ids)),
            _ => Err(Fault::Connection(
                AmqpError::command_invalid("unimplemented method"),
                ids.0,
                ids.1,
            )),
        }
    }

    fn channel_method(
        &mut self,
        number: u16,
        m: channel::AMQPMethod,
        now: u64,
    ) -> Result<(), Fault> {
        use channel::AMQPMethod as C;
        match m {
            C::Open(_) => Err(Fault::Connection(
                AmqpError::new(CHANNEL_ERROR, "second 'channel.open' seen"),
                20,
                10,
            )),
            C::Close(_) => {
                self.close_channel_state(number);
                // A failed engine is reported by the storage alarm; the close goes on.
                let _ = self.sync_store();
                self.flush_confirms();
                self.channels.remove(&number);
                ctl(
                    self,
                    number,
                    AMQPClass::Channel(C::CloseOk(channel::CloseOk {})),
                );
                Ok(())
            }
            C::CloseOk(_) => Err(unimplemented((20, 41))),
            C::Flow(f) => {
                if !f.active {
                    // RabbitMQ 3.10 no longer lets a client pause deliveries this way.
                    return Err(Fault::Connection(
                        AmqpError::not_implemented("active=false"),
                        20,
                        20,
                    ));
                }
                let key = self.channels[&number].key;
                self.meta_vhost().channel_flow(key, f.active, now);
                ctl(
                    self,
                    number,
                    AMQPClass::Channel(C::FlowOk(channel::FlowOk { active: f.active })),
                );
                Ok(())
            }
            C::FlowOk(_) => Ok(()),
            C::OpenOk(_) => Err(Fault::Connection(
                AmqpError::command_invalid("unimplemented method"),
                20,
                11,
            )),
        }
    }

    /// exchange.bind (`bind`) and exchange.unbind: the same permissions (write on the
    /// destination, read on the source and its topic), then the change.
    fn exchange_binding(
        &mut self,
        number: u16,
        bind: bool,
        b: exchange::Bind,
    ) -> Result<(), AmqpError> {
        let exchange::Bind {
            destination,
            source,
            routing_key,
            nowait,
            arguments,
        } = b;
        let (destination, source, key) =
            (destination.as_str(), source.as_str(), routing_key.as_str());
        self.check(Access::Write, "exchange", destination)?;
        self.check(Access::Read, "exchange", source)?;
        self.check_topic(Access::Read, source, key)?;
        let vhost = self.vhost_name.clone();
        let (destination, source, key) =
            (destination.to_string(), source.to_string(), key.to_string());
        let (reply, command) = if bind {
            let c = Command::ExchangeBind {
                vhost,
                destination,
                source,
                key,
                arguments,
            };
            (Reply::ExchangeBind, c)
        } else {
            let c = Command::ExchangeUnbind {
                vhost,
                destination,
                source,
                key,
                arguments,
            };
            (Reply::ExchangeUnbind, c)
        };
        self.change(number, reply, nowait, command);
        Ok(())
    }

    fn exchange_method(&mut self, number: u16, m: exchange::AMQPMethod) -> Result<(), AmqpError> {
        use exchange::AMQPMethod as E;
        match m {
            E::Declare(d) => {
                let name = d.exchange.as_str();
                if !d.passive {
                    self.check(Access::Configure, "exchange", name)?;
                    let command = Command::ExchangeDeclare {
                        vhost: self.vhost_name.clone(),
                        name: name.to_string(),
                        kind: d.kind.as_str().to_string(),
                        durable: d.durable,
                        auto_delete: d.auto_delete,
                        internal: d.internal,
                        arguments: d.arguments,
                    };
                    self.change(number, Reply::ExchangeDeclare, d.nowait, command);
                    return Ok(());
                }
                self.meta_vhost().exchange_declare(
                    name,
                    d.kind.as_str(),
                    true,
                    d.durable,
                    d.auto_delete,
                    d.internal,
                    d.arguments,
                )?;
                if !d.nowait {
                    ctl(
                        self,
                        number,
                        AMQPClass::Exchange(E::DeclareOk(exchange::DeclareOk {})),
                    );
                }
            }
            E::Delete(d) => {
                self.check(Access::Configure, "exchange", d.exchange.as_str())?;
                let command = Command::ExchangeDelete {
                    vhost: self.vhost_name.clone(),
                    name: d.exchange.as_str().to_string(),
                    if_unused: d.if_unused,
                };
                self.change(number, Reply::ExchangeDelete, d.nowait, command);
            }
            E::Bind(b) => self.exchange_binding(number, true, b)?,
            // The same fields: handled as one.
            E::Unbind(u) => {
                let b = exchange::Bind {
                    destination: u.destination,
                    source: u.source,
                    routing_key: u.routing_key,
                    nowait: u.nowait,
                    arguments: u.arguments,
                };
                self.exchange_binding(number, false, b)?
            }
            E::DeclareOk(_) | E::DeleteOk(_) | E::BindOk(_) | E::UnbindOk(_) => {
                return Err(AmqpError::command_invalid("unimplemented method"));
            }
        }
        Ok(())
    }

    fn queue_method(
        &mut self,
        number: u16,
        m: queue::AMQPMethod,
        now: u64,
    ) -> Result<(), AmqpError> {
        use queue::AMQPMethod as Q;
        match m {
            Q::Declare(d) => {
                let name = d.queue.as_str();
                if !d.passive {
                    if !name.is_empty() {
                        self.check(Access::Configure, "queue", name)?;
                    }
                    let server_named = name.is_empty();
                    let command = Command::QueueDeclare {
                        vhost: self.vhost_name.clone(),
                        conn: self.id,
                        name: if server_named {
                            warren_broker::vhost::generate_queue_name()
                        } else {
                            name.to_string()
                        },
                        durable: d.durable,
                        exclusive: d.exclusive,
                        auto_delete: d.auto_delete,
                        server_named,
                        arguments: d.arguments,
                        log_id: crate::topology::placement::rand_log_id(),
                        // Placed by a cluster's topology (a node here has every queue).
                        node: String::new(),
                        members: Vec::new(),
                        at_unix_ms: self.shared.broker.unix_ms_at(now),
                    };
                    self.change(number, Reply::QueueDeclare, d.nowait, command);
                    return Ok(());
                }
                let name = self.queue_name(number, name)?;
                let reply_to_live = self
                    .vhost
                    .lock()
                    .expect("vhost lock")
                    .reply_to_is_live(&name);
                if reply_to_live {
                    // As RabbitMQ: no messages wait there, and one consumer takes them.
                    if !d.nowait {
                        ctl(
                            self,
                            number,
                            AMQPClass::Queue(Q::DeclareOk(queue::DeclareOk {
                                queue: name.as_str().into(),
                                message_count: 0,
                                consumer_count: 1,
                            })),
                        );
                    }
                    return Ok(());
                }
                return self
                    .queue_backend(&name)
                    .declare_passive(self, number, name, d.nowait, now);
            }
            Q::Bind(mut b) => {
                let q = self.queue_name(number, b.queue.as_str())?;
                // RabbitMQ's expand_routing_key_shortcut: no queue and no key bind the last
                // declared queue by its own name.
                if b.queue.as_str().is_empty() && b.routing_key.as_str().is_empty() {
                    b.routing_key = q.as_str().into();
                }
                self.check(Access::Write, "queue", &q)?;
                self.check(Access::Read, "exchange", b.exchange.as_str())?;
                self.check_topic(Access::Read, b.exchange.as_str(), b.routing_key.as_str())?;
                let command = Command::QueueBind {
                    vhost: self.vhost_name.clone(),
                    conn: self.id,
                    queue: q,
                    exchange: b.exchange.as_str().to_string(),
                    key: b.routing_key.as_str().to_string(),
                    arguments: b.arguments,
                };
                self.change(number, Reply::QueueBind, b.nowait, command);
            }
            Q::Unbind(mut b) => {
                let q = self.queue_name(number, b.queue.as_str())?;
                if b.queue.as_str().is_empty() && b.routing_key.as_str().is_empty() {
                    b.routing_key = q.as_str().into();
                }
                self.check(Access::Write, "queue", &q)?;
                self.check(Access::Read, "exchange", b.exchange.as_str())?;
                self.check_topic(Access::Read, b.exchange.as_str(), b.routing_key.as_str())?;
                let command = Command::QueueUnbind {
                    vhost: self.vhost_name.clone(),
                    conn: self.id,
                    queue: q,
                    exchange: b.exchange.as_str().to_string(),
                    key: b.routing_key.as_str().to_string(),
                    arguments: b.arguments,
                };
                // queue.unbind has no nowait.
                self.change(number, Reply::QueueUnbind, false, command);
            }
            Q::Purge(p) => {
                let q = self.queue_name(number, p.queue.as_str())?;
                self.check(Access::Read, "queue", &q)?;
                return self.queue_backend(&q).purge(self, number, q, p.nowait);
            }
            Q::Delete(d) => {
                let q = self.queue_name(number, d.queue.as_str())?;
                self.check(Access::Configure, "queue", &q)?;
                // Released once delete-ok is out, here or when a proposal is answered.
                self.hold_cancels(number);
                let delete = Delete {
                    if_unused: d.if_unused,
                    if_empty: d.if_empty,
                    nowait: d.nowait,
                };
                return self.queue_backend(&q).delete(self, number, q, delete);
            }
            Q::DeclareOk(_) | Q::BindOk(_) | Q::UnbindOk(_) | Q::PurgeOk(_) | Q::DeleteOk(_) => {
                return Err(AmqpError::command_invalid("unimplemented method"));
            }
        }
        Ok(())
    }

    fn basic_method(
        &mut self,
        number: u16,
        m: basic::AMQPMethod,
        now: u64,
        ids: (u16, u16),
    ) -> Result<(), Fault> {
        use basic::AMQPMethod as B;
        let fail = |e: AmqpError| Fault::Channel(number, e, ids.0, ids.1);
        let key = self.channels[&number].key;
        match m {
            B::Qos(q) => {
                self.meta_vhost()
                    .basic_qos(key, q.prefetch_count, q.global, now);
                ctl(self, number, AMQPClass::Basic(B::QosOk(basic::QosOk {})));
            }
            B::Consume(c) => {
                let q = self.queue_name(number, c.queue.as_str()).map_err(fail)?;
                self.check(Access::Read, "queue", &q).map_err(fail)?;
                self.queue_backend(&q)
                    .consume(self, number, key, q, c, now)
                    .map_err(fail)?;
            }
            B::Cancel(c) => {
                self.consumer_backend(key, c.consumer_tag.as_str())
                    .cancel(self, number, key, c, now)
                    .map_err(fail)?;
            }
            B::Get(g) => {
                let q = self.queue_name(number, g.queue.as_str()).map_err(fail)?;
                self.check(Access::Read, "queue", &q).map_err(fail)?;
                self.queue_backend(&q)
                    .get(self, number, key, q, g.no_ack, now)
                    .map_err(fail)?;
            }
            B::Recover(r) => {
                if !r.requeue {
                    return Err(Fault::Connection(
                        AmqpError::not_implemented("requeue=false"),
                        ids.0,
                        ids.1,
                    ));
                }
                self.recover(number, now);
                ctl(
                    self,
                    number,
                    AMQPClass::Basic(B::RecoverOk(basic::RecoverOk {})),
                );
            }
            B::RecoverAsync(r) => {
                if !r.requeue {
                    return Err(Fault::Connection(
                        AmqpError::not_implemented("requeue=false"),
                        ids.0,
                        ids.1,
                    ));
                }
                // Deprecated, and answered with nothing: the redeliveries are the reply.
                self.recover(number, now);
            }
            _ => {
                return Err(Fault::Connection(
                    AmqpError::command_invalid("unimplemented method"),
                    ids.0,
                    ids.1,
                ))
            }
        }
        Ok(())
    }
}
