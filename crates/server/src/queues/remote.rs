//! A queue another node of the cluster hosts: that node alone knows its messages and
//! consumers, so each method is asked of it and the reply written when its answer arrives
//! (see [`Connection::ask_remote`]). A queue whose node is down gets RabbitMQ's 404 "home node
//! ... is down or inaccessible", except an unconditional delete, which goes ahead without it,
//! and a consumer's cancel, which ends the consumer here all the same.

use super::{local, Delete, QueueBackend};
use crate::amqp::connection::Connection;
use crate::peers;
use crate::topology::proposal::{Proposal, Reply};
use std::sync::Arc;
use warren_broker::command::{Command, Outcome};
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_cluster::messaging::{Request, Response};
use warren_protocol::amqp::{basic, queue, AMQPClass};
use warren_protocol::method::Method;

pub(crate) enum RemoteQueue {
    /// Hosted by the member with this id, which is asked: a queue's methods choose it while
    /// that node runs, a consumer's cancel whenever the node is still a member.
    Reachable(u64),
    /// Its node is down (or gone): the 404 to answer.
    Down(AmqpError),
}

impl QueueBackend for RemoteQueue {
    fn purge(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        nowait: bool,
    ) -> Result<(), AmqpError> {
        let peer = self.peer()?;
        let request = Request::Purge {
            vhost: conn.vhost_name.clone(),
            conn: conn.id,
            queue,
        };
        let outbox = conn.outbox.clone();
        let answered = move |r| {
            if let (Response::Purged { count }, false) = (r, nowait) {
                let m = Method::Other(AMQPClass::Queue(queue::AMQPMethod::PurgeOk(
                    queue::PurgeOk {
                        message_count: count,
                    },
                )));
                outbox.push(|b| m.encode(number, b));
            }
            Ok(())
        };
        conn.ask_remote(number, (50, 30), peer, request, answered, || {});
        Ok(())
    }

    /// Its node knows its consumers and messages (if-unused, if-empty, the count in
    /// delete-ok), so it is asked before the deletion is replicated.
    fn delete(
        &self,
        conn: &mut Connection,
        number: u16,
        name: String,
        delete: Delete,
    ) -> Result<(), AmqpError> {
        let peer = match self {
            RemoteQueue::Reachable(peer) => *peer,
            RemoteQueue::Down(e) if delete.if_unused || delete.if_empty => return Err(e.clone()),
            RemoteQueue::Down(_) => return local::delete_checked_here(conn, number, name, delete),
        };
        let Delete {
            if_unused,
            if_empty,
            nowait,
        } = delete;
        let cluster = conn
            .shared
            .cluster
            .clone()
            .expect("remote queues are clustered");
        let request = Request::Declare {
            vhost: conn.vhost_name.clone(),
            conn: conn.id,
            queue: name.clone(),
        };
        let command = Command::QueueDelete {
            vhost: conn.vhost_name.clone(),
            conn: conn.id,
            name: name.clone(),
        };
        let vhost = conn.vhost_name.clone();
        let topology = crate::topology::of(&conn.shared);
        conn.proposal = Some(Proposal {
            number,
            nowait,
            reply: Reply::QueueDelete,
            answer: Box::pin(async move {
                let counts = match peers::call(cluster.messaging(), peer, request).await {
                    Ok(counts) => counts,
                    Err(_) if !if_unused && !if_empty => Response::Done,
                    Err(e) => return Err(e),
                };
                if let Response::Declared {
                    messages,
                    consumers,
                } = counts
                {
                    if if_unused && consumers > 0 {
                        return Err(AmqpError::precondition(format!(
                            "queue '{name}' in vhost '{vhost}' in use"
                        )));
                    }
                    if if_empty && messages > 0 {
                        return Err(AmqpError::precondition(format!(
                            "queue '{name}' in vhost '{vhost}' not empty"
                        )));
                    }
                }
                match topology.change(command).await? {
                    Outcome::QueueDeleted { existed, .. } => Ok(Outcome::QueueDeleted {
                        messages: match counts {
                            Response::Declared { messages, .. } => messages,
                            _ => 0,
                        },
                        existed,
                    }),
                    other => Ok(other),
                }
            }),
        });
        Ok(())
    }

    /// Its node alone knows the queue's counts: asked, with a passive declare request.
    fn declare_passive(
        &self,
        conn: &mut Connection,
        number: u16,
        name: String,
        nowait: bool,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let peer = self.peer()?;
        if let Some(ch) = conn.channels.get_mut(&number) {
            ch.last_queue = Some(name.clone());
        }
        let request = Request::Declare {
            vhost: conn.vhost_name.clone(),
            conn: conn.id,
            queue: name.clone(),
        };
        let outbox = conn.outbox.clone();
        let answered = move |r| {
            if let (
                Response::Declared {
                    messages,
                    consumers,
                },
                false,
            ) = (r, nowait)
            {
                let m = Method::Other(AMQPClass::Queue(queue::AMQPMethod::DeclareOk(
                    queue::DeclareOk {
                        queue: name.as_str().into(),
                        message_count: messages,
                        consumer_count: consumers,
                    },
                )));
                outbox.push(|b| m.encode(number, b));
            }
            Ok(())
        };
        conn.ask_remote(number, (50, 10), peer, request, answered, || {});
        Ok(())
    }

    /// Registered in the channel first (deliveries may follow the consume-ok at once), then
    /// asked of the queue's node.
    fn consume(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        c: basic::Consume,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let peer = self.peer()?;
        let (tag, (prefetch, global_prefetch)) = {
            let mut v = conn.vhost.lock().expect("vhost lock");
            let (tag, _) = v.consume_remote(key, &queue, c.consumer_tag.as_str())?;
            (tag, v.channel_prefetch(key))
        };
        let request = Request::Consume {
            vhost: conn.vhost_name.clone(),
            channel: key,
            conn: conn.id,
            number,
            user: conn.user.clone(),
            queue,
            tag: tag.clone(),
            no_ack: c.no_ack,
            exclusive: c.exclusive,
            arguments: c.arguments,
            prefetch: prefetch.min(u16::MAX as u32) as u16,
            global_prefetch: global_prefetch.min(u16::MAX as u32) as u16,
        };
        let (outbox, nowait) = (conn.outbox.clone(), c.nowait);
        let ok_tag = tag.clone();
        let answered = move |_| {
            if !nowait {
                let m = Method::Other(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(
                    basic::ConsumeOk {
                        consumer_tag: ok_tag.as_str().into(),
                    },
                )));
                outbox.push(|b| m.encode(number, b));
            }
            Ok(())
        };
        let vhost = conn.vhost.clone();
        let failed = move || {
            vhost
                .lock()
                .expect("vhost lock")
                .forget_remote_consumer(key, &tag)
        };
        conn.ask_remote(number, (60, 20), peer, request, answered, failed);
        Ok(())
    }

    /// The consumer is forgotten once its node has stopped it, so the deliveries it sent
    /// before still reach the client; at once, and without cancel-ok, when its node is no
    /// member of the cluster any more.
    fn cancel(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        c: basic::Cancel,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let tag = c.consumer_tag.as_str().to_string();
        let forget = {
            let vhost = conn.vhost.clone();
            let tag = tag.clone();
            move || {
                vhost
                    .lock()
                    .expect("vhost lock")
                    .forget_remote_consumer(key, &tag)
            }
        };
        let RemoteQueue::Reachable(peer) = *self else {
            forget();
            return Ok(());
        };
        let request = Request::Cancel {
            vhost: conn.vhost_name.clone(),
            channel: key,
            tag: tag.clone(),
        };
        let (outbox, nowait) = (conn.outbox.clone(), c.nowait);
        let forget = Arc::new(std::sync::Mutex::new(Some(forget)));
        let forget_too = forget.clone();
        let answered = move |_| {
            if let Some(f) = forget.lock().expect("forget lock").take() {
                f();
            }
            if !nowait {
                let m = Method::Other(AMQPClass::Basic(basic::AMQPMethod::CancelOk(
                    basic::CancelOk {
                        consumer_tag: tag.as_str().into(),
                    },
                )));
                outbox.push(|b| m.encode(number, b));
            }
            Ok(())
        };
        // A cancel that cannot reach the queue's node still ends the consumer here.
        let failed = move || {
            if let Some(f) = forget_too.lock().expect("forget lock").take() {
                f();
            }
        };
        conn.ask_remote(number, (60, 30), peer, request, answered, failed);
        Ok(())
    }

    /// The message gets a tag of this channel when it arrives.
    fn get(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        no_ack: bool,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let peer = self.peer()?;
        let request = Request::Get {
            vhost: conn.vhost_name.clone(),
            channel: key,
            conn: conn.id,
            number,
            user: conn.user.clone(),
            queue: queue.clone(),
            no_ack,
        };
        let node: Option<Arc<str>> = conn
            .shared
            .cluster
            .as_ref()
            .and_then(|c| c.member_name(peer))
            .map(Into::into);
        let (vhost, outbox, shared) =
            (conn.vhost.clone(), conn.outbox.clone(), conn.shared.clone());
        let answered = move |r| {
            match (r, node) {
                (Response::Got { got: Some(g) }, Some(node)) => {
                    let mut v = vhost.lock().expect("vhost lock");
                    v.note_remote_node(key, &node);
                    v.accept_delivery(&node, peers::got(key, g), Some(&queue));
                    super::effects::carry_out(&shared, &mut v, None);
                }
                _ => {
                    let m = Method::Other(AMQPClass::Basic(basic::AMQPMethod::GetEmpty(
                        basic::GetEmpty {},
                    )));
                    outbox.push(|b| m.encode(number, b));
                }
            }
            Ok(())
        };
        conn.ask_remote(number, (60, 70), peer, request, answered, || {});
        Ok(())
    }
}

impl RemoteQueue {
    /// The queue's node, or the 404 that says it is down.
    fn peer(&self) -> Result<u64, AmqpError> {
        match self {
            RemoteQueue::Reachable(peer) => Ok(*peer),
            RemoteQueue::Down(e) => Err(e.clone()),
        }
    }
}
