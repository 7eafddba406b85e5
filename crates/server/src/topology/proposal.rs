//! A connection waiting on an answer before it reads its next frame (AMQP's synchronous
//! methods keep their order): a topology change ([`Connection::change`]), a request to the
//! node hosting a queue (consume, get, purge, ...), a channel.open counted over the cluster.
//! The answer's `-ok` is written from the outcome, so the reply (declare-ok's counts, a 406 for
//! inequivalent arguments) comes from the change's application, never from a guess made
//! before it.
//!
//! A request to a queue's node is answered by the answer's handler on the cluster link's
//! reader, so its reply is ordered with the deliveries that follow it on that link.

use crate::amqp::connection::{Connection, Fault};
use std::future::Future;
use std::pin::Pin;
use warren_broker::command::{Command, Outcome};
use warren_broker::error::AmqpError;
use warren_protocol::amqp::{exchange, queue, AMQPClass};
use warren_protocol::method::Method;

/// Which method a proposal answers, so the right `-ok` goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeBind,
    ExchangeUnbind,
    QueueDeclare,
    QueueBind,
    QueueUnbind,
    QueueDelete,
    /// A request to another node, for the method with these ids; its handler replied.
    Remote(u16, u16),
    /// channel.open under the user's `max-channels`, counted over the cluster: a refusal
    /// closes the connection, as RabbitMQ's does.
    ChannelOpen,
}

impl Reply {
    /// The class and method ids of the request, for a channel.close that names it.
    fn ids(self) -> (u16, u16) {
        match self {
            Reply::ExchangeDeclare => (40, 10),
            Reply::ExchangeDelete => (40, 20),
            Reply::ExchangeBind => (40, 30),
            Reply::ExchangeUnbind => (40, 40),
            Reply::QueueDeclare => (50, 10),
            Reply::QueueBind => (50, 20),
            Reply::QueueDelete => (50, 40),
            Reply::QueueUnbind => (50, 50),
            Reply::Remote(class, method) => (class, method),
            Reply::ChannelOpen => (20, 10),
        }
    }
}

pub type Answer = Pin<Box<dyn Future<Output = Result<Outcome, AmqpError>> + Send>>;

/// A proposal the connection waits on.
pub struct Proposal {
    pub number: u16,
    pub nowait: bool,
    pub reply: Reply,
    pub answer: Answer,
}

impl Connection {
    /// Asks the queue's node `peer`; `answered` runs with its answer on the cluster link's
    /// reader (writing the reply to the client), `failed` if there is none. The connection reads
    /// no further frame until then; an error closes the channel, naming method `ids`.
    pub fn ask_remote(
        &mut self,
        number: u16,
        ids: (u16, u16),
        peer: u64,
        request: warren_cluster::messaging::Request,
        answered: impl FnOnce(warren_cluster::messaging::Response) -> Result<(), AmqpError>
            + Send
            + 'static,
        failed: impl FnOnce() + Send + 'static,
    ) {
        let cluster = self
            .shared
            .cluster
            .clone()
            .expect("remote queues exist in clusters only");
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<(), AmqpError>>();
        cluster.messaging().call(
            peer,
            request,
            Box::new(move |r| {
                let r = r.and_then(answered);
                if r.is_err() {
                    failed();
                }
                let _ = tx.send(r);
            }),
        );
        self.proposal = Some(Proposal {
            number,
            nowait: true,
            reply: Reply::Remote(ids.0, ids.1),
            answer: Box::pin(async move {
                match rx.await {
                    Ok(Ok(())) => Ok(Outcome::Done),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(AmqpError::new(
                        warren_protocol::constants::INTERNAL_ERROR,
                        "the request to the queue's node was dropped",
                    )),
                }
            }),
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

    /// Changes the topology by `command` ([`crate::topology`]); the connection answers with
    /// its outcome before it reads its next frame.
    pub fn change(&mut self, number: u16, reply: Reply, nowait: bool, command: Command) {
        let answer = crate::topology::of(&self.shared).change(command);
        self.proposal = Some(Proposal {
            number,
            nowait,
            reply,
            answer,
        });
    }

    /// Answers a proposal with its outcome: the method's `-ok`, or the channel (or
    /// connection) error every node's broker found.
    pub fn finish_proposal(
        &mut self,
        proposal_number: u16,
        reply: Reply,
        nowait: bool,
        outcome: Result<Outcome, AmqpError>,
    ) -> Result<(), Fault> {
        let number = proposal_number;
        if reply == Reply::ChannelOpen {
            return match outcome {
                Ok(_) => {
                    self.open_channel(number);
                    Ok(())
                }
                Err(e) => Err(Fault::Connection(e, 0, 0)),
            };
        }
        let (class_id, method_id) = reply.ids();
        let outcome = outcome.map_err(|e| Fault::Channel(number, e, class_id, method_id))?;
        if !self.channels.contains_key(&number) {
            return Ok(());
        }
        let class = match (reply, outcome) {
            // A remote request's handler replied; a channel.open was answered above.
            (Reply::Remote(..) | Reply::ChannelOpen, _) => return Ok(()),
            (Reply::QueueDeclare, Outcome::QueueDeclared(ok)) => {
                self.shared.broker.queue_churn.declared(ok.created);
                if let Some(ch) = self.channels.get_mut(&number) {
                    ch.last_queue = Some(ok.queue.clone());
                }
                AMQPClass::Queue(queue::AMQPMethod::DeclareOk(queue::DeclareOk {
                    queue: ok.queue.as_str().into(),
                    message_count: ok.message_count,
                    consumer_count: ok.consumer_count,
                }))
            }
            (Reply::QueueDelete, Outcome::QueueDeleted { messages, existed }) => {
                if existed {
                    self.shared.broker.queue_churn.deleted();
                }
                AMQPClass::Queue(queue::AMQPMethod::DeleteOk(queue::DeleteOk {
                    message_count: messages,
                }))
            }
            (Reply::QueueBind, _) => AMQPClass::Queue(queue::AMQPMethod::BindOk(queue::BindOk {})),
            // queue.unbind has no nowait: its -ok always goes out.
            (Reply::QueueUnbind, _) => {
                let m = Method::Other(AMQPClass::Queue(queue::AMQPMethod::UnbindOk(
                    queue::UnbindOk {},
                )));
                self.outbox.push(|b| m.encode(number, b));
                return Ok(());
            }
            (Reply::ExchangeDeclare, _) => {
                AMQPClass::Exchange(exchange::AMQPMethod::DeclareOk(exchange::DeclareOk {}))
            }
            (Reply::ExchangeDelete, _) => {
                AMQPClass::Exchange(exchange::AMQPMethod::DeleteOk(exchange::DeleteOk {}))
            }
            (Reply::ExchangeBind, _) => {
                AMQPClass::Exchange(exchange::AMQPMethod::BindOk(exchange::BindOk {}))
            }
            (Reply::ExchangeUnbind, _) => {
                AMQPClass::Exchange(exchange::AMQPMethod::UnbindOk(exchange::UnbindOk {}))
            }
            (Reply::QueueDeclare | Reply::QueueDelete, other) => {
                tracing::error!(?other, ?reply, "unexpected outcome of a replicated command");
                return Err(Fault::Channel(
                    number,
                    AmqpError::new(
                        warren_protocol::constants::INTERNAL_ERROR,
                        "unexpected outcome",
                    ),
                    class_id,
                    method_id,
                ));
            }
        };
        if !nowait {
            let m = Method::Other(class);
            self.outbox.push(|b| m.encode(number, b));
        }
        if reply == Reply::QueueDelete {
            self.release_cancels(number);
        }
        Ok(())
    }

    /// Holds basic.cancel to channel `number`'s consumers while it deletes a queue, whatever
    /// path the delete takes (this node, a proposal, the queue's node), so that delete-ok goes
    /// first as in RabbitMQ (see `ChannelState::held_cancels`).
    pub(crate) fn hold_cancels(&self, number: u16) {
        if let Some(ch) = self.channels.get(&number) {
            self.vhost.lock().expect("vhost lock").hold_cancels(ch.key);
        }
    }

    /// Sends what [`Self::hold_cancels`] held, after the delete-ok.
    pub(crate) fn release_cancels(&self, number: u16) {
        if let Some(ch) = self.channels.get(&number) {
            self.vhost
                .lock()
                .expect("vhost lock")
                .release_cancels(ch.key);
        }
    }
}
