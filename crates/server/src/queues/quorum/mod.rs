//! A quorum queue of a cluster this node is a member of: each method is a request to the
//! queue's Raft group through this node's member ([`crate::queues::quorum::client`]). The connection
//! waits for its entry to be applied here before it reads the channel's next method; get-ok is
//! written by this node's replica, in order with the deliveries it writes.

mod bodies;
mod channel;
pub mod client;
mod dead_letters;
pub mod peers;
pub mod replica;

use super::{Delete, QueueBackend};
use crate::amqp::connection::Connection;
use crate::replicated::{Proposal, Reply};
use client::Wait;
use warren_broker::command::{Command, Outcome};
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_protocol::amqp::{queue, AMQPClass};
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
        let (messages, consumers) = conn.quorum_counts(&name).unwrap_or((0, 0));
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
        let cluster = conn
            .shared
            .cluster
            .clone()
            .expect("quorum queues are clustered");
        let command = Command::QueueDelete {
            vhost: vhost.clone(),
            conn: conn.id,
            name,
        };
        conn.proposal = Some(Proposal {
            number,
            nowait: delete.nowait,
            reply: Reply::QueueDelete,
            answer: Box::pin(async move {
                match crate::peers::execute_everywhere(&cluster, command).await? {
                    Outcome::QueueDeleted(_) => Ok(Outcome::QueueDeleted(messages)),
                    other => Ok(other),
                }
            }),
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
