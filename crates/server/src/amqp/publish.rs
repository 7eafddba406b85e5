//! The publish path of a channel: a basic.publish whose content is complete, checked
//! (user_id, expiration, headers), held in a transaction or routed through the vhost, then
//! returned if mandatory and unroutable, and confirmed or nacked in sequence order.

use crate::amqp::connection::{Connection, Fault};
use crate::amqp::transactions::TxOp;
use bytes::Bytes;
use warren_broker::error::AmqpError;
use warren_broker::message::{parse_expiration, Message};
use warren_protocol::constants::*;
use warren_protocol::content::{encode_header, ContentHeader, Properties};
use warren_protocol::frame::encode_body;
use warren_protocol::method::{self, Method, Publish};

impl Connection {
    /// A publish whose content is complete: validate, route, confirm.
    pub fn publish(
        &mut self,
        number: u16,
        publish: Publish,
        header: ContentHeader,
        body: Bytes,
    ) -> Result<(), Fault> {
        let fail = |e: AmqpError| Fault::Channel(number, e, 60, 40);
        let props = Properties::decode(&header.properties).map_err(|_| {
            Fault::Connection(
                AmqpError::new(SYNTAX_ERROR, "malformed content properties"),
                60,
                40,
            )
        })?;
        if let Some(uid) = &props.user_id {
            if uid.as_ref() != self.user.as_bytes() {
                return Err(fail(AmqpError::precondition(format!(
                    "user_id property set to '{}' but authenticated user was '{}'",
                    String::from_utf8_lossy(uid),
                    self.user
                ))));
            }
        }
        if let Some(e) = &props.expiration {
            if let Err(why) = parse_expiration(e) {
                return Err(fail(AmqpError::precondition(format!(
                    "invalid expiration '{}': {}",
                    String::from_utf8_lossy(e),
                    why
                ))));
            }
        }
        if props.headers.is_some() && props.headers_table().is_err() {
            return Err(Fault::Connection(
                AmqpError::new(SYNTAX_ERROR, "malformed headers table"),
                60,
                40,
            ));
        }
        // Borrowed unless it is not UTF-8: no allocation per publish.
        let exchange = String::from_utf8_lossy(&publish.exchange);
        let message = Message::new(
            publish.exchange.clone(),
            publish.routing_key.clone(),
            header.properties,
            &props,
            body,
        );
        let ch = self.channels.get_mut(&number).expect("open channel");
        if let Some(tx) = ch.tx.as_mut() {
            tx.push(TxOp::Publish {
                exchange: exchange.into_owned(),
                message: Box::new(message),
                props: Box::new(props),
                mandatory: publish.mandatory,
            });
            return Ok(());
        }
        self.route_one(number, &exchange, message, &props, publish.mandatory)
            .map_err(fail)
    }

    pub(crate) fn route_one(
        &mut self,
        number: u16,
        exchange: &str,
        message: Message,
        props: &Properties,
        mandatory: bool,
    ) -> Result<(), AmqpError> {
        let now = self.shared.broker.now_ms();
        let key = self.channels[&number].key;
        let returned = mandatory.then(|| {
            (
                message.routing_key.clone(),
                message.properties.clone(),
                message.body.clone(),
            )
        });
        let message_bytes = (message.body.len() + message.properties.len()) as u64;
        let (outcome, stored) = {
            let mut v = self.vhost.lock().expect("vhost lock");
            let outcome = v.publish(key, exchange, message, props, now);
            // Appends go to the engine under the vhost lock, so each log gets them in order.
            // Publishes to quorum queues are numbered even without confirms, so that flow
            // control bounds what the channel has in the groups' pipelines.
            let carried = crate::queues::effects::carry_out(&self.shared, &mut v, Some(key));
            // Bound for queues elsewhere: confirmed (and a transaction committed) once they
            // have it.
            if let Some(tx) = &mut self.tx_waits {
                tx.extend(carried.sent.waits.iter().copied());
            }
            self.held_by_peer = self.held_by_peer.or(carried.sent.congested);
            (outcome, carried.waits())
        };
        if let Ok(appended) = &stored {
            self.flow.handed(appended, message_bytes);
        }
        let outcome = outcome?;
        let counters = &self.shared.counters;
        counters
            .published
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !outcome.routed {
            counters
                .unroutable
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if !outcome.routed && !outcome.rejected {
            if let Some((routing_key, properties, body)) = returned {
                counters
                    .returned
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let frame_max = self.frame_max;
                let ret = Method::Return(method::Return {
                    reply_code: NO_ROUTE,
                    reply_text: Bytes::from_static(b"NO_ROUTE"),
                    exchange: Bytes::copy_from_slice(exchange.as_bytes()),
                    routing_key,
                });
                self.outbox.push(|b| {
                    ret.encode(number, b);
                    encode_header(b, number, 60, body.len() as u64, &properties);
                    encode_body(b, number, &body, frame_max);
                });
            }
        }
        let ch = self.channels.get_mut(&number).expect("open channel");
        if !ch.publisher {
            ch.publisher = true;
            counters
                .publishers
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if ch.confirm {
            let seq = ch.next_publish_seq;
            ch.next_publish_seq += 1;
            let (failed, waits) = match stored {
                Ok(waits) => (false, waits),
                Err(crate::storage::NotStored) => (true, Vec::new()),
            };
            if !outcome.rejected
                && !failed
                && (!waits.is_empty() || !ch.pending_confirms.is_empty())
            {
                // Confirmed once the WAL has synced it, and in order: an ack(multiple) must
                // never cover an earlier message that is not durable yet.
                ch.pending_confirms.push_back((seq, waits));
            } else if outcome.rejected || failed {
                if let Some(upto) = ch.ack_upto.take() {
                    let multiple = upto > ch.confirmed_upto + 1;
                    self.outbox
                        .push(|b| method::encode_ack(b, number, upto, multiple));
                }
                let nack = Method::Nack(method::Nack {
                    delivery_tag: seq,
                    multiple: false,
                    requeue: false,
                });
                self.outbox.push(|b| nack.encode(number, b));
            } else {
                ch.ack_upto = Some(seq);
            }
        }
        Ok(())
    }
}
