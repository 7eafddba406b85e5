//! A channel's methods on a queue hosted by another node of the cluster that have not moved to
//! `queues::remote` yet: consume, cancel and a passive declare are asked of the queue's node; the reply
//! is written when its answer arrives (see [`Connection::ask_remote`]). A queue whose node is
//! down gets RabbitMQ's 404 "home node ... is down or inaccessible".

use crate::amqp::connection::Connection;
use crate::peers;
use std::sync::Arc;
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_cluster::messaging::{Request, Response};
use warren_protocol::amqp::{basic, queue, AMQPClass};
use warren_protocol::method::Method;

impl Connection {
    /// The peer hosting `queue` when that is another node (`None`: this node hosts it, or
    /// there is no such queue, which the local path reports); 404 when its node is down.
    pub fn remote_queue(&self, queue: &str) -> Result<Option<u64>, AmqpError> {
        if self.shared.cluster.is_none() {
            return Ok(None);
        }
        let home = self.vhost.lock().expect("vhost lock").remote_home(queue);
        match home {
            None => Ok(None),
            Some(node) => {
                peers::reachable_home(&self.shared, &node, queue, &self.vhost_name).map(Some)
            }
        }
    }

    pub fn declare_remote(
        &mut self,
        number: u16,
        name: String,
        nowait: bool,
    ) -> Result<(), AmqpError> {
        let Some(peer) = self.remote_queue(&name)? else {
            return Ok(());
        };
        if let Some(ch) = self.channels.get_mut(&number) {
            ch.last_queue = Some(name.clone());
        }
        let request = Request::Declare {
            vhost: self.vhost_name.clone(),
            conn: self.id,
            queue: name.clone(),
        };
        let outbox = self.outbox.clone();
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
        self.ask_remote(number, (50, 10), peer, request, answered, || {});
        Ok(())
    }

    /// basic.consume of a remote queue: registered in the channel first (deliveries may follow
    /// the consume-ok at once), then asked of the queue's node.
    pub fn consume_remote(
        &mut self,
        number: u16,
        key: ChannelKey,
        queue: String,
        c: basic::Consume,
        peer: u64,
    ) -> Result<(), AmqpError> {
        let (tag, (prefetch, global_prefetch)) = {
            let mut v = self.vhost.lock().expect("vhost lock");
            let (tag, _) = v.consume_remote(key, &queue, c.consumer_tag.as_str())?;
            (tag, v.channel_prefetch(key))
        };
        let request = Request::Consume {
            vhost: self.vhost_name.clone(),
            channel: key,
            conn: self.id,
            number,
            user: self.user.clone(),
            queue,
            tag: tag.clone(),
            no_ack: c.no_ack,
            exclusive: c.exclusive,
            arguments: c.arguments,
            prefetch: prefetch.min(u16::MAX as u32) as u16,
            global_prefetch: global_prefetch.min(u16::MAX as u32) as u16,
        };
        let (outbox, nowait) = (self.outbox.clone(), c.nowait);
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
        let vhost = self.vhost.clone();
        let failed = move || {
            vhost
                .lock()
                .expect("vhost lock")
                .forget_remote_consumer(key, &tag)
        };
        self.ask_remote(number, (60, 20), peer, request, answered, failed);
        Ok(())
    }

    /// basic.cancel of a consumer of a remote queue: it is forgotten once its node has
    /// stopped it, so the deliveries it sent before still reach the client.
    pub fn cancel_remote(&mut self, number: u16, key: ChannelKey, c: basic::Cancel, home: &str) {
        let tag = c.consumer_tag.as_str().to_string();
        let forget = {
            let vhost = self.vhost.clone();
            let tag = tag.clone();
            move || {
                vhost
                    .lock()
                    .expect("vhost lock")
                    .forget_remote_consumer(key, &tag)
            }
        };
        let Some(peer) = self.shared.cluster.as_ref().and_then(|c| c.member_id(home)) else {
            forget();
            return;
        };
        let request = Request::Cancel {
            vhost: self.vhost_name.clone(),
            channel: key,
            tag: tag.clone(),
        };
        let (outbox, nowait) = (self.outbox.clone(), c.nowait);
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
        self.ask_remote(number, (60, 30), peer, request, answered, failed);
    }
}
