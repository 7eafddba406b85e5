//! The management API's own AMQP connection, as RabbitMQ's management plugin opens a direct
//! connection as the calling user: each change the API makes (declare, delete, bind, unbind,
//! purge, publish, get) is the AMQP method a client would send, run through the very channel
//! code of `channel.rs` on a [`Connection`] without a socket. So the caller's AMQP permissions
//! apply, a cluster replicates the change through Raft, a queue on another node is asked of
//! that node (or refused with the same 404 "home node ... is down" as AMQP), and every error is
//! the one an AMQP client would get.
//!
//! The connection's replies land in a private [`Outbox`] and are read back here as frames. A
//! session lives for one HTTP request; dropping it closes its channel, which requeues whatever
//! a get left unsettled.
//!
//! Cost: a session is a channel open and close on the vhost (one map insert and remove under
//! the vhost lock) per request, on the control plane only.

use crate::amqp::channel::Channel;
use crate::amqp::connection::{Connection, Fault};
use crate::Shared;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use std::time::Duration;
use warren_broker::error::AmqpError;
use warren_broker::outbox::Outbox;
use warren_protocol::amqp::{basic, AMQPClass};
use warren_protocol::constants::{INTERNAL_ERROR, PRECONDITION_FAILED};
use warren_protocol::content::{ContentHeader, Properties};
use warren_protocol::frame;
use warren_protocol::method::{self, Method};

/// The channel number every session uses: a session has one channel.
const NUMBER: u16 = 1;
/// How long a publish waits for its confirm (the queue's node to have it durably).
const PUBLISH_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// Most messages one `POST .../get` takes, whatever `count` asks: each is held in memory
/// until the answer is written.
pub const GET_COUNT_MAX: u32 = 10_000;

/// A method the session's connection answered with, with its content if it carries one.
pub struct Reply {
    pub method: Method,
    /// The raw properties and the body of a get-ok or a basic.return.
    pub content: Option<(Bytes, Bytes)>,
}

/// A message taken by [`Session::get`].
pub struct Got {
    pub get_ok: method::GetOk,
    pub properties: Properties,
    pub body: Bytes,
}

/// What `POST /api/queues/{vhost}/{queue}/get` does with the messages it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// `ack_requeue_true`: put back (redelivered), as RabbitMQ's "Nack message requeue true".
    Requeue,
    /// `ack_requeue_false`: acknowledged, gone.
    Ack,
    /// `reject_requeue_true`.
    RejectRequeue,
    /// `reject_requeue_false`: dead-lettered where the queue says so, else gone.
    Reject,
}

impl AckMode {
    pub fn parse(s: &str) -> Option<AckMode> {
        Some(match s {
            "ack_requeue_true" => AckMode::Requeue,
            "ack_requeue_false" => AckMode::Ack,
            "reject_requeue_true" => AckMode::RejectRequeue,
            "reject_requeue_false" => AckMode::Reject,
            _ => return None,
        })
    }
}

pub struct Session {
    conn: Connection,
    outbox: Arc<Outbox>,
}

impl Session {
    /// Opens a session on `vhost` as `user`, with the user's AMQP permissions there; `None`
    /// when the vhost is gone or the user has none (RabbitMQ refuses its direct connection:
    /// "Access refused.").
    pub fn open(s: &Arc<Shared>, user: &str, vhost_name: &str) -> Option<Session> {
        let permissions = s
            .broker
            .users
            .read()
            .expect("users lock")
            .permissions(user, vhost_name)
            .cloned()?;
        Session::open_with(s, user, vhost_name, permissions)
    }

    /// [`Session::open`] with the given permissions rather than the user's: a definitions
    /// import by an administrator declares in vhosts it has no grant in, as RabbitMQ's does.
    pub fn open_with(
        s: &Arc<Shared>,
        user: &str,
        vhost_name: &str,
        permissions: warren_broker::users::Permissions,
    ) -> Option<Session> {
        let vhost = s.broker.vhost(vhost_name)?;
        let outbox = Outbox::new(
            s.config.frame_max_bytes,
            // Nobody writes this outbox to a socket: the session reads it after each method.
            Box::new(|| {}),
        );
        let mut conn = Connection::internal(
            s.clone(),
            user.to_string(),
            vhost_name.to_string(),
            vhost,
            permissions,
            outbox.clone(),
        );
        let key = s
            .next_channel
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = conn.id;
        conn.meta_vhost()
            .channel_open(key, id, NUMBER, outbox.clone(), user);
        conn.channels.insert(NUMBER, Channel::new(key));
        s.counters.channel_opened();
        Some(Session { conn, outbox })
    }

    /// Runs `method` on the session's channel as a client's would run, waits for its cluster
    /// proposal or its request to another node if it made one, and returns what it answered.
    pub async fn call(&mut self, method: Method) -> Result<Vec<Reply>, AmqpError> {
        self.conn
            .handle_method(NUMBER, method, (0, 0))
            .map_err(fault_error)?;
        if let Some(p) = self.conn.proposal.take() {
            let outcome = p.answer.await;
            self.conn
                .finish_proposal(p.number, p.reply, p.nowait, outcome)
                .map_err(fault_error)?;
        }
        Ok(self.replies())
    }

    /// A control method (`queue.declare`, `exchange.bind`, ...).
    pub async fn control(&mut self, class: AMQPClass) -> Result<Vec<Reply>, AmqpError> {
        self.call(Method::Other(class)).await
    }

    /// basic.publish with mandatory set, in confirm mode: `Ok(routed)` once the message is
    /// confirmed (stored durably where it is persistent), an error if it was refused.
    pub async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        properties: &Properties,
        body: Bytes,
    ) -> Result<bool, AmqpError> {
        let max = self.conn.shared.config.message_bytes_max;
        if body.len() as u64 > max {
            return Err(AmqpError::new(
                PRECONDITION_FAILED,
                format!(
                    "message size {} is larger than configured max size {max}",
                    body.len()
                ),
            ));
        }
        let publish = method::Publish {
            exchange: Bytes::copy_from_slice(exchange.as_bytes()),
            routing_key: Bytes::copy_from_slice(routing_key.as_bytes()),
            mandatory: true,
            immediate: false,
        };
        if let Some(ch) = self.conn.channels.get_mut(&NUMBER) {
            ch.confirm = true;
        }
        // The method alone checks write permission on the exchange, as for a client.
        self.call(Method::Publish(publish.clone())).await?;
        if let Some(ch) = self.conn.channels.get_mut(&NUMBER) {
            ch.pending = None;
        }
        let header = ContentHeader {
            class_id: 60,
            body_size: body.len() as u64,
            properties: properties.encode(),
        };
        self.conn
            .publish(NUMBER, publish, header, body)
            .map_err(fault_error)?;
        let mut durable = self.conn.shared.durability.subscribe();
        let confirmed = tokio::time::timeout(PUBLISH_CONFIRM_TIMEOUT, async {
            loop {
                self.conn.flush_confirms();
                if !self.conn.has_pending_confirms() {
                    return;
                }
                if durable.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if confirmed.is_err() {
            return Err(AmqpError::new(
                INTERNAL_ERROR,
                "the message was not confirmed in time",
            ));
        }
        let mut routed = true;
        for r in self.replies() {
            match r.method {
                Method::Return(_) => routed = false,
                Method::Nack(_) => {
                    return Err(AmqpError::new(
                        INTERNAL_ERROR,
                        "the message was refused (nack): it could not be stored",
                    ))
                }
                _ => {}
            }
        }
        Ok(routed)
    }

    /// Takes up to `count` messages from `queue` (acknowledgement required, so none is lost if
    /// the request fails), then settles them all as `mode` says: all are taken before any is
    /// requeued, so a requeueing get shows `count` different messages, as RabbitMQ's does.
    pub async fn get(
        &mut self,
        queue: &str,
        count: u32,
        mode: AckMode,
    ) -> Result<Vec<Got>, AmqpError> {
        let mut got = Vec::new();
        for _ in 0..count.min(GET_COUNT_MAX) {
            let get = basic::Get {
                queue: queue.into(),
                no_ack: false,
            };
            let replies = self
                .control(AMQPClass::Basic(basic::AMQPMethod::Get(get)))
                .await?;
            let Some((get_ok, (properties, body))) = replies.into_iter().find_map(|r| match r {
                Reply {
                    method: Method::GetOk(ok),
                    content: Some(c),
                } => Some((ok, c)),
                _ => None,
            }) else {
                break;
            };
            let properties = Properties::decode(&properties).unwrap_or_default();
            got.push(Got {
                get_ok,
                properties,
                body,
            });
        }
        if let Some(last) = got.last().map(|g| g.get_ok.delivery_tag) {
            let settle = match mode {
                AckMode::Ack => Method::Ack(method::Ack {
                    delivery_tag: last,
                    multiple: true,
                }),
                AckMode::Requeue | AckMode::RejectRequeue => Method::Nack(method::Nack {
                    delivery_tag: last,
                    multiple: true,
                    requeue: true,
                }),
                AckMode::Reject => Method::Nack(method::Nack {
                    delivery_tag: last,
                    multiple: true,
                    requeue: false,
                }),
            };
            self.call(settle).await?;
        }
        Ok(got)
    }

    /// The frames the connection wrote since the last call, as methods with their content.
    fn replies(&self) -> Vec<Reply> {
        let mut buf: BytesMut = self.outbox.take();
        let mut out: Vec<Reply> = Vec::new();
        let mut header: Option<(Bytes, u64)> = None;
        let mut body = BytesMut::new();
        while let Ok(Some(f)) = frame::decode(&mut buf, 0) {
            match f.kind {
                frame::FRAME_METHOD => {
                    if let Ok(method) = Method::decode(f.payload) {
                        out.push(Reply {
                            method,
                            content: None,
                        });
                    }
                }
                frame::FRAME_HEADER => {
                    if let Ok(h) = ContentHeader::decode(f.payload) {
                        body.clear();
                        header = Some((h.properties, h.body_size));
                        if h.body_size == 0 {
                            attach(&mut out, &mut header, &mut body);
                        }
                    }
                }
                frame::FRAME_BODY => {
                    body.extend_from_slice(&f.payload);
                    if header
                        .as_ref()
                        .is_some_and(|(_, size)| body.len() as u64 >= *size)
                    {
                        attach(&mut out, &mut header, &mut body);
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// Gives the last method its completed content.
fn attach(out: &mut [Reply], header: &mut Option<(Bytes, u64)>, body: &mut BytesMut) {
    if let (Some(last), Some((properties, _))) = (out.last_mut(), header.take()) {
        last.content = Some((properties, body.split().freeze()));
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Requeues what a get left unsettled and forgets the channel, as a client's close does.
        self.conn.cleanup();
    }
}

/// The AMQP error a method failed with, whether the channel code made it a channel error or
/// a connection error.
fn fault_error(f: Fault) -> AmqpError {
    match f {
        Fault::Channel(_, e, _, _) | Fault::Connection(e, _, _) => e,
        Fault::Gone => AmqpError::new(INTERNAL_ERROR, "the connection went away"),
    }
}
