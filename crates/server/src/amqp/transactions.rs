//! AMQP transactions (tx.select, tx.commit, tx.rollback) and the settlement of deliveries
//! (basic.ack, basic.nack, basic.reject), which a transactional channel holds back until
//! commit.
//!
//! tx.commit-ok promises that the committed publishes and acks are done and durable, as in
//! RabbitMQ: the engine is synced first; the settlements of quorum queue deliveries are applied
//! by this node's replicas before commit-ok goes out, so a message acked in a committed
//! transaction is never delivered again; and publishes to quorum queues and to queues on other
//! nodes wait as a confirm would (applied by the group, taken by the queue's node).

use crate::amqp::channel::ctl;
use crate::amqp::connection::Connection;
use crate::Shared;
use warren_broker::error::AmqpError;
use warren_broker::message::Message;
use warren_broker::queue::ChannelKey;
use warren_broker::relay::RemoteEffect;
use warren_protocol::amqp::{tx, AMQPClass};
use warren_protocol::constants::INTERNAL_ERROR;
use warren_protocol::content::Properties;
use warren_protocol::method::Method;

/// Work a transaction holds back until tx.commit.
pub enum TxOp {
    Publish {
        exchange: String,
        message: Box<Message>,
        props: Box<Properties>,
        mandatory: bool,
    },
    Ack {
        tag: u64,
        multiple: bool,
    },
    Nack {
        tag: u64,
        multiple: bool,
        requeue: bool,
    },
}

impl Connection {
    pub(crate) fn settle(&mut self, number: u16, op: TxOp, now: u64) -> Result<(), AmqpError> {
        let ch = self.channels.get_mut(&number).expect("open channel");
        if let Some(tx) = ch.tx.as_ref() {
            // RabbitMQ closes the channel at once on an unknown or already settled tag, the
            // tag a multiple settlement names included (its collect_acks must find that tag
            // among the unacked ones); only multiple with tag 0, "all", names none.
            let named = match op {
                TxOp::Ack { tag, multiple } | TxOp::Nack { tag, multiple, .. }
                    if !(multiple && tag == 0) =>
                {
                    Some(tag)
                }
                _ => None,
            };
            if let Some(tag) = named {
                let key = ch.key;
                if settled_in(tx, tag)
                    || !self.vhost.lock().expect("vhost lock").has_unacked(key, tag)
                {
                    return Err(AmqpError::precondition(format!(
                        "unknown delivery tag {tag}"
                    )));
                }
            }
            let ch = self.channels.get_mut(&number).expect("open channel");
            ch.tx.as_mut().expect("transactional").push(op);
            return Ok(());
        }
        let key = ch.key;
        self.settle_now(key, op, now, None)
    }

    /// basic.recover: requeues the channel's unacked deliveries, except those its open
    /// transaction acked or nacked, as RabbitMQ (whose ack takes a delivery out of the channel's
    /// unacked ones at once, the transaction holding it until commit or rollback): recovered,
    /// they would be delivered again, and the commit would then settle a tag that was gone.
    pub(crate) fn recover(&self, number: u16, now: u64) {
        let ch = self.channels.get(&number).expect("open channel");
        let tx = ch.tx.as_deref().unwrap_or_default();
        self.meta_vhost()
            .basic_recover_keeping(ch.key, |tag| settled_in(tx, tag), now);
    }

    /// Settles at once; `quorum` takes the quorum queue settlements instead of proposing them
    /// unawaited (a transaction's commit waits for them).
    fn settle_now(
        &mut self,
        key: ChannelKey,
        op: TxOp,
        now: u64,
        quorum: Option<&mut Vec<RemoteEffect>>,
    ) -> Result<(), AmqpError> {
        let mut v = self.meta_vhost();
        let result = match op {
            TxOp::Ack { tag, multiple } => v.basic_ack(key, tag, multiple, now),
            TxOp::Nack {
                tag,
                multiple,
                requeue,
            } => v.basic_nack(key, tag, multiple, requeue, now),
            TxOp::Publish { .. } => unreachable!("settle takes acks only"),
        };
        if let Some(quorum) = quorum {
            quorum.extend(crate::queues::effects::take_quorum_settles(&mut v.vhost));
        }
        result
    }

    pub(crate) fn tx_method(&mut self, number: u16, m: tx::AMQPMethod) -> Result<(), AmqpError> {
        use tx::AMQPMethod as T;
        let ch = self.channels.get_mut(&number).expect("open channel");
        match m {
            T::Select(_) => {
                if ch.confirm {
                    return Err(AmqpError::precondition(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                if ch.tx.is_none() {
                    ch.tx = Some(Vec::new());
                }
                ctl(self, number, AMQPClass::Tx(T::SelectOk(tx::SelectOk {})));
            }
            T::Commit(_) => {
                let Some(ops) = ch.tx.replace(Vec::new()) else {
                    return Err(AmqpError::precondition("channel is not transactional"));
                };
                ch.tx = None;
                let mut quorum_settles = Vec::new();
                self.tx_waits = Some(Vec::new());
                let result = self.apply_tx(number, ops, &mut quorum_settles);
                let waits = self.tx_waits.take().unwrap_or_default();
                if let Some(ch) = self.channels.get_mut(&number) {
                    ch.tx = Some(Vec::new());
                }
                result?;
                // commit-ok promises the committed publishes and acks are durable, as in RabbitMQ;
                // once the engine has stopped it cannot, and 541 says so (a hard error: the
                // node needs a restart before it can promise anything again).
                self.sync_store()
                    .map_err(|e| AmqpError::new(INTERNAL_ERROR, format!("cannot commit: {e}")))?;
                if quorum_settles.is_empty() && waits.is_empty() {
                    ctl(self, number, AMQPClass::Tx(T::CommitOk(tx::CommitOk {})));
                } else {
                    self.commit_after(number, quorum_settles, waits);
                }
            }
            T::Rollback(_) => {
                let Some(ops) = ch.tx.as_mut() else {
                    return Err(AmqpError::precondition("channel is not transactional"));
                };
                ops.clear();
                ctl(
                    self,
                    number,
                    AMQPClass::Tx(T::RollbackOk(tx::RollbackOk {})),
                );
            }
            _ => return Err(AmqpError::command_invalid("unimplemented method")),
        }
        Ok(())
    }

    fn apply_tx(
        &mut self,
        number: u16,
        ops: Vec<TxOp>,
        quorum_settles: &mut Vec<RemoteEffect>,
    ) -> Result<(), AmqpError> {
        let now = self.shared.broker.now_ms();
        let key = self.channels.get(&number).expect("open channel").key;
        for op in ops {
            match op {
                TxOp::Publish {
                    exchange,
                    message,
                    props,
                    mandatory,
                } => self.route_one(number, &exchange, *message, &props, mandatory)?,
                other => self.settle_now(key, other, now, Some(quorum_settles))?,
            }
        }
        Ok(())
    }

    /// tx.commit-ok once this node's replicas applied the transaction's settlements of quorum
    /// queue deliveries (see [`crate::queues::quorum::client::settle_applied`]) and its
    /// publishes to quorum queues and to queues on other nodes are in them (`waits`, as a
    /// confirm waits).
    fn commit_after(
        &mut self,
        number: u16,
        settles: Vec<RemoteEffect>,
        waits: Vec<crate::durability::Wait>,
    ) {
        let (shared, outbox) = (self.shared.clone(), self.outbox.clone());
        self.await_request(number, (90, 20), async move {
            wait_published(&shared, &waits).await?;
            crate::queues::quorum::client::settle_applied(shared, settles).await?;
            let m = Method::Other(AMQPClass::Tx(tx::AMQPMethod::CommitOk(tx::CommitOk {})));
            outbox.push(|b| m.encode(number, b));
            Ok(())
        });
    }
}

/// Waits until every (pseudo log, index) in `waits` is durable where it went; an error when
/// one was refused, or after a confirm's patience.
async fn wait_published(
    shared: &Shared,
    waits: &[crate::durability::Wait],
) -> Result<(), AmqpError> {
    if waits.is_empty() {
        return Ok(());
    }
    let durability = &shared.durability;
    let mut changed = durability.subscribe();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if durability.any_refused(waits) || durability.has_failed() {
            return Err(AmqpError::new(
                INTERNAL_ERROR,
                "cannot commit: a queue refused a published message",
            ));
        }
        if durability.all_durable(waits) {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, changed.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(AmqpError::new(
                    INTERNAL_ERROR,
                    "cannot commit: shutting down",
                ))
            }
            Err(_) => {
                return Err(AmqpError::new(
                    INTERNAL_ERROR,
                    "cannot commit: a queue did not take a published message in time",
                ))
            }
        }
    }
}

/// Whether a settlement of `t` (with `multiple`) covers delivery `tag`: multiple covers every
/// tag up to `t`, and 0 with multiple covers all.
fn covers(t: u64, multiple: bool, tag: u64) -> bool {
    t == tag || (multiple && (t == 0 || t >= tag))
}

/// Whether the open transaction `tx` already acked or nacked delivery `tag`.
fn settled_in(tx: &[TxOp], tag: u64) -> bool {
    tx.iter().any(|o| match *o {
        TxOp::Ack { tag: t, multiple }
        | TxOp::Nack {
            tag: t, multiple, ..
        } => covers(t, multiple, tag),
        TxOp::Publish { .. } => false,
    })
}
