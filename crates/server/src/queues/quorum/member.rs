//! A quorum queue of a cluster this node is a member of: each method is a request to the
//! queue's Raft group through this node's member ([`super::client`]). The connection waits for
//! its entry to be applied here before it reads the channel's next method; get-ok is written by
//! this node's replica, in order with the deliveries it writes.

use super::client;
use crate::amqp::connection::Connection;
use crate::queues::{local, Delete, QueueBackend};
use crate::topology::proposal::{Proposal, Reply};
use crate::Shared;
use client::Wait;
use std::sync::atomic::Ordering;
use warren_broker::command::{Command, Outcome};
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_broker::quorum::ConsumerSpec;
use warren_cluster::replicas::group_id;
use warren_protocol::amqp::{basic, queue, AMQPClass};
use warren_protocol::method::Method;

pub(crate) struct QuorumMember {
    /// The queue's Raft group.
    pub group: u64,
}

impl QueueBackend for QuorumMember {
    fn purge(
        &self,
        conn: &mut Connection,
        number: u16,
        _queue: String,
        nowait: bool,
    ) -> Result<(), AmqpError> {
        let (shared, outbox, group) = (conn.shared.clone(), conn.outbox.clone(), self.group);
        conn.await_request(number, (50, 30), async move {
            let count = client::purge(shared, group).await?;
            if !nowait {
                let m = Method::Other(AMQPClass::Queue(queue::AMQPMethod::PurgeOk(
                    queue::PurgeOk {
                        message_count: count,
                    },
                )));
                outbox.push(|b| m.encode(number, b));
            }
            Ok(())
        });
        Ok(())
    }

    /// If-unused and if-empty, and delete-ok's count, as this node's replica has them; then
    /// the deletion is replicated.
    fn delete(
        &self,
        conn: &mut Connection,
        number: u16,
        name: String,
        delete: Delete,
    ) -> Result<(), AmqpError> {
        let (messages, consumers) = replica_counts(&conn.shared, self.group).unwrap_or((0, 0));
        let vhost = &conn.vhost_name;
        if delete.if_unused && consumers > 0 {
            return Err(AmqpError::precondition(format!(
                "queue '{name}' in vhost '{vhost}' in use"
            )));
        }
        if delete.if_empty && messages > 0 {
            return Err(AmqpError::precondition(format!(
                "queue '{name}' in vhost '{vhost}' not empty"
            )));
        }
        let command = Command::QueueDelete {
            vhost: vhost.clone(),
            conn: conn.id,
            name,
        };
        let deleted = crate::topology::of(&conn.shared).change(command);
        conn.proposal = Some(Proposal {
            number,
            nowait: delete.nowait,
            reply: Reply::QueueDelete,
            answer: Box::pin(async move {
                match deleted.await? {
                    Outcome::QueueDeleted { existed, .. } => {
                        Ok(Outcome::QueueDeleted { messages, existed })
                    }
                    other => Ok(other),
                }
            }),
        });
        Ok(())
    }

    /// This node's vhost knows whether the queue may be used; its counts are the replica's.
    fn declare_passive(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        nowait: bool,
        now: u64,
    ) -> Result<(), AmqpError> {
        let counts = replica_counts(&conn.shared, self.group);
        local::declare_passive_here(conn, number, queue, nowait, now, counts)
    }

    /// Registered in the channel first (deliveries follow the checkout at once), after the
    /// checks RabbitMQ makes of the consume itself; then the group is asked (`Checkout`) and
    /// consume-ok is written by this node's replica when it applies the entry.
    fn consume(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        c: basic::Consume,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let consume = conn.vhost.lock().expect("vhost lock").consume_quorum(
            key,
            &queue,
            c.consumer_tag.as_str(),
            &c.arguments,
        )?;
        let group = group_id(consume.log);
        let spec = ConsumerSpec {
            credit: consume.prefetch,
            priority: consume.priority,
            no_ack: c.no_ack,
            exclusive: c.exclusive,
        };
        let command = client::checkout(&conn.shared, key, &consume.tag, spec);
        let reply = (!c.nowait).then(|| {
            client::write_reply(
                key,
                Method::Other(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(
                    basic::ConsumeOk {
                        consumer_tag: consume.tag.as_str().into(),
                    },
                ))),
            )
        });
        let wait = Wait::Checkout {
            group,
            channel: key,
            tag: consume.tag.clone(),
        };
        let (shared, vhost, tag) = (conn.shared.clone(), conn.vhost.clone(), consume.tag);
        conn.await_request(number, (60, 20), async move {
            let r = client::request(shared, group, wait, reply, command).await;
            if r.is_err() {
                vhost
                    .lock()
                    .expect("vhost lock")
                    .forget_remote_consumer(key, &tag);
            }
            r
        });
        Ok(())
    }

    /// cancel-ok is written by this node's replica when it applies the entry; a group out of
    /// reach ends the consumer here all the same (its channel closing, or the node-down
    /// sweep, returns what it holds).
    fn cancel(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        c: basic::Cancel,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let tag = c.consumer_tag.as_str().to_string();
        let group = self.group;
        let command = client::cancel(&conn.shared, key, &tag);
        let cancel_ok = Method::Other(AMQPClass::Basic(basic::AMQPMethod::CancelOk(
            basic::CancelOk {
                consumer_tag: tag.as_str().into(),
            },
        )));
        let reply = (!c.nowait).then(|| client::write_reply(key, cancel_ok.clone()));
        let wait = Wait::Cancel {
            group,
            channel: key,
            tag: tag.clone(),
        };
        let (shared, vhost, outbox) =
            (conn.shared.clone(), conn.vhost.clone(), conn.outbox.clone());
        let nowait = c.nowait;
        conn.await_request(number, (60, 30), async move {
            if client::request(shared, group, wait, reply, command)
                .await
                .is_err()
            {
                vhost
                    .lock()
                    .expect("vhost lock")
                    .forget_remote_consumer(key, &tag);
                if !nowait {
                    outbox.push(|b| cancel_ok.encode(number, b));
                }
            }
            Ok(())
        });
        Ok(())
    }

    fn get(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        _queue: String,
        no_ack: bool,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let group = self.group;
        let command = client::dequeue(&conn.shared, key, no_ack);
        let wait = Wait::Get {
            group,
            channel: key,
        };
        let shared = conn.shared.clone();
        conn.vhost
            .lock()
            .expect("vhost lock")
            .note_quorum_get(key, group - 1);
        conn.await_request(number, (60, 70), async move {
            client::request(shared, group, wait, None, command).await
        });
        Ok(())
    }
}

impl Connection {
    /// The Raft group of `queue` when it is a quorum queue of this node's cluster.
    pub fn quorum_group(&self, queue: &str) -> Option<u64> {
        self.shared.cluster.as_ref()?;
        let log = self.vhost.lock().expect("vhost lock").quorum_log(queue)?;
        Some(group_id(log))
    }
}

/// A quorum queue's ready messages and consumers, as this node's replica of `group` has them.
fn replica_counts(shared: &Shared, group: u64) -> Option<(u32, u32)> {
    let info = shared.quorum.replica(group)?;
    Some((
        info.ready.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
        info.consumers.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
    ))
}
