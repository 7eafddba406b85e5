//! A queue this node's vhost holds: its messages and consumers are here, so each method is
//! answered at once, under the vhost's lock.

use super::{Delete, QueueBackend};
use crate::amqp::channel::ctl;
use crate::amqp::connection::Connection;
use crate::topology::proposal::Reply;
use amq_protocol_types::FieldTable;
use warren_broker::command::Command;
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_broker::vhost::GetResult;
use warren_protocol::amqp::{basic, queue, AMQPClass};
use warren_protocol::method::Method;

pub(crate) struct LocalQueue;

impl QueueBackend for LocalQueue {
    fn purge(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        nowait: bool,
    ) -> Result<(), AmqpError> {
        let n = conn
            .vhost
            .lock()
            .expect("vhost lock")
            .queue_purge(conn.id, &queue)?;
        if !nowait {
            ctl(
                conn,
                number,
                AMQPClass::Queue(queue::AMQPMethod::PurgeOk(queue::PurgeOk {
                    message_count: n,
                })),
            );
        }
        Ok(())
    }

    fn delete(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        delete: Delete,
    ) -> Result<(), AmqpError> {
        delete_checked_here(conn, number, queue, delete)
    }

    fn declare_passive(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        nowait: bool,
        now: u64,
    ) -> Result<(), AmqpError> {
        declare_passive_here(conn, number, queue, nowait, now, None)
    }

    fn consume(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        c: basic::Consume,
        now: u64,
    ) -> Result<(), AmqpError> {
        let mut v = conn.meta_vhost();
        let tag = v.basic_consume(
            key,
            &queue,
            c.consumer_tag.as_str(),
            c.no_ack,
            c.exclusive,
            c.arguments,
            now,
        )?;
        if !c.nowait {
            let ok = Method::Other(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(
                basic::ConsumeOk {
                    consumer_tag: tag.as_str().into(),
                },
            )));
            conn.outbox.push(|b| ok.encode(number, b));
        }
        // Deliveries only after consume-ok: still under the vhost lock, so no publisher on
        // another connection can dispatch to this consumer first.
        v.kick(&queue, now);
        Ok(())
    }

    fn cancel(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        c: basic::Cancel,
        now: u64,
    ) -> Result<(), AmqpError> {
        conn.meta_vhost()
            .basic_cancel(key, c.consumer_tag.as_str(), now);
        if !c.nowait {
            ctl(
                conn,
                number,
                AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                    consumer_tag: c.consumer_tag,
                })),
            );
        }
        Ok(())
    }

    fn get(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        no_ack: bool,
        now: u64,
    ) -> Result<(), AmqpError> {
        let r = conn
            .vhost
            .lock()
            .expect("vhost lock")
            .basic_get(key, &queue, no_ack, now)?;
        if matches!(r, GetResult::Empty) {
            ctl(
                conn,
                number,
                AMQPClass::Basic(basic::AMQPMethod::GetEmpty(basic::GetEmpty {})),
            );
        }
        Ok(())
    }
}

/// A passive declare answered from this node's vhost, which knows whether the queue exists and
/// whether this connection may use it; `counts` (messages, consumers) replace the vhost's
/// figures when another part of the node keeps them (a quorum queue's replica).
pub(super) fn declare_passive_here(
    conn: &mut Connection,
    number: u16,
    queue: String,
    nowait: bool,
    now: u64,
    counts: Option<(u32, u32)>,
) -> Result<(), AmqpError> {
    let mut v = conn.meta_vhost();
    let ok = v.queue_declare(
        conn.id,
        &queue,
        true,
        false,
        false,
        false,
        FieldTable::default(),
        now,
    )?;
    v.persist()?;
    conn.channels
        .get_mut(&number)
        .expect("open channel")
        .last_queue = Some(ok.queue.clone());
    let (message_count, consumer_count) = counts.unwrap_or((ok.message_count, ok.consumer_count));
    if !nowait {
        ctl(
            conn,
            number,
            AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                queue: ok.queue.as_str().into(),
                message_count,
                consumer_count,
            })),
        );
    }
    Ok(())
}

/// queue.delete of a queue whose messages and consumers are not asked of another node:
/// `if-unused` and `if-empty` checked against this node's copy (which alone knows them for a
/// queue it hosts), then the deletion is a topology change, delete-ok written once it is
/// applied here.
pub(super) fn delete_checked_here(
    conn: &mut Connection,
    number: u16,
    queue: String,
    delete: Delete,
) -> Result<(), AmqpError> {
    conn.vhost.lock().expect("vhost lock").queue_delete_check(
        conn.id,
        &queue,
        delete.if_unused,
        delete.if_empty,
    )?;
    let command = Command::QueueDelete {
        vhost: conn.vhost_name.clone(),
        conn: conn.id,
        name: queue,
    };
    conn.change(number, Reply::QueueDelete, delete.nowait, command);
    Ok(())
}
