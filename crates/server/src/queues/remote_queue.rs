//! Where a queue another node hosts lives, and the one method on it not on
//! [`super::QueueBackend`] yet: a passive declare, asked of the queue's node; the reply is
//! written when its answer arrives (see [`Connection::ask_remote`]). A queue whose node is down
//! gets RabbitMQ's 404 "home node ... is down or inaccessible".

use crate::amqp::connection::Connection;
use crate::peers;
use warren_broker::error::AmqpError;
use warren_cluster::messaging::{Request, Response};
use warren_protocol::amqp::{queue, AMQPClass};
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
}
