//! A queue this node's vhost holds: its messages and consumers are here, so each method is
//! answered at once, under the vhost's lock.

use super::{Delete, QueueBackend};
use crate::amqp::channel::ctl;
use crate::amqp::connection::Connection;
use crate::replicated::Reply;
use warren_broker::command::Command;
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_broker::vhost::GetResult;
use warren_protocol::amqp::{basic, queue, AMQPClass};

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
        if conn.shared.cluster.is_some() {
            return propose_delete(conn, number, queue, delete);
        }
        let mut v = conn.meta_vhost();
        let existed = v.queue_stats(&queue).is_some();
        let n = v.queue_delete(conn.id, &queue, delete.if_unused, delete.if_empty)?;
        v.persist()?;
        if existed {
            conn.shared.broker.queue_churn.deleted();
        }
        if !delete.nowait {
            ctl(
                conn,
                number,
                AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
                    message_count: n,
                })),
            );
        }
        conn.release_cancels(number);
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

/// queue.delete in a cluster of a queue whose messages and consumers are not asked of another
/// node: checked against this node's copy (which alone knows them for a queue it hosts), then
/// the deletion is replicated and delete-ok written once it is applied here.
pub(super) fn propose_delete(
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
    conn.propose(number, Reply::QueueDelete, delete.nowait, command);
    Ok(())
}
