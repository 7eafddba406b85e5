//! A channel's methods on a quorum queue of a cluster that have not moved to `queues::quorum`
//! yet (consume, cancel): each is a request to the queue's Raft
//! group through this node's member ([`crate::queues::quorum::client`]). The connection waits for its
//! entry to be applied here before it reads the channel's next method, as for other requests
//! that cross nodes; the reply (consume-ok, cancel-ok) is written by this node's
//! replica, in order with the deliveries it writes.

use crate::amqp::connection::Connection;
use crate::queues::quorum::client::{self, Wait};
use crate::replicated::{Proposal, Reply};
use std::sync::atomic::Ordering;
use warren_broker::command::Outcome;
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_broker::quorum::ConsumerSpec;
use warren_cluster::replicas::group_id;
use warren_protocol::amqp::{basic, AMQPClass};
use warren_protocol::method::Method;

impl Connection {
    /// The Raft group of `queue` when it is a quorum queue of this node's cluster.
    pub fn quorum_group(&self, queue: &str) -> Option<u64> {
        self.shared.cluster.as_ref()?;
        let log = self.vhost.lock().expect("vhost lock").quorum_log(queue)?;
        Some(group_id(log))
    }

    /// A quorum queue's ready messages and consumers, as this node's replica has them.
    pub fn quorum_counts(&self, queue: &str) -> Option<(u32, u32)> {
        let info = self.shared.quorum.replica(self.quorum_group(queue)?)?;
        Some((
            info.ready.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
            info.consumers.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
        ))
    }

    pub fn consume_quorum(
        &mut self,
        number: u16,
        key: ChannelKey,
        queue: String,
        c: basic::Consume,
    ) -> Result<(), AmqpError> {
        let consume = self.vhost.lock().expect("vhost lock").consume_quorum(
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
        let command = client::checkout(&self.shared, key, &consume.tag, spec);
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
        let (shared, vhost, tag) = (self.shared.clone(), self.vhost.clone(), consume.tag);
        self.await_request(number, (60, 20), async move {
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

    pub fn cancel_quorum(&mut self, number: u16, key: ChannelKey, c: basic::Cancel, log: u64) {
        let tag = c.consumer_tag.as_str().to_string();
        let group = group_id(log);
        let command = client::cancel(&self.shared, key, &tag);
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
            (self.shared.clone(), self.vhost.clone(), self.outbox.clone());
        let nowait = c.nowait;
        self.await_request(number, (60, 30), async move {
            if client::request(shared, group, wait, reply, command)
                .await
                .is_err()
            {
                // The group is out of reach: the consumer ends here all the same (its channel
                // closing, or the node-down sweep, returns what it holds).
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
    }

    /// Waits for `answer` before the channel's next method; its reply was written by whoever
    /// resolved it, an error closes the channel naming the method `ids`.
    pub(crate) fn await_request(
        &mut self,
        number: u16,
        ids: (u16, u16),
        answer: impl std::future::Future<Output = Result<(), AmqpError>> + Send + 'static,
    ) {
        self.proposal = Some(Proposal {
            number,
            nowait: true,
            reply: Reply::Remote(ids.0, ids.1),
            answer: Box::pin(async move { answer.await.map(|_| Outcome::Done) }),
        });
    }
}
