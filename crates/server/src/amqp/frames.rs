//! A connection's frames once it is open: each frame checked against what the connection and
//! the channel expect next (a method, a content header, body frames), methods decoded and
//! handed to channel 0 or to an open channel, content assembled into a publish. RabbitMQ's
//! reply codes and texts for frames out of place (505 UNEXPECTED_FRAME, 501 FRAME_ERROR,
//! 502 SYNTAX_ERROR) are given here, before any method runs.

use super::channel::{Channel, Pending};
use super::connection::{control, Connection, Fault};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;
use warren_broker::error::{erlang_binary, AmqpError};
use warren_protocol::amqp::{connection, AMQPClass};
use warren_protocol::constants::*;
use warren_protocol::content::ContentHeader;
use warren_protocol::frame::{self, Frame};
use warren_protocol::method::{Method, MethodError};

impl Connection {
    pub(super) fn handle_frame(&mut self, f: Frame) -> Result<(), Fault> {
        let octets = || erlang_binary(&f.payload);
        match f.kind {
            frame::FRAME_METHOD | frame::FRAME_HEADER | frame::FRAME_BODY => {}
            frame::FRAME_HEARTBEAT if f.payload.is_empty() => {
                if f.channel != 0 {
                    return Err(Fault::conn(
                        UNEXPECTED_FRAME,
                        format!("type 8, all octets = {}", octets()),
                    ));
                }
                return Ok(());
            }
            kind => {
                return Err(Fault::conn(
                    FRAME_ERROR,
                    format!("type {kind}, all octets = {}: unknown_frame", octets()),
                ))
            }
        }
        if f.channel == 0 {
            if f.kind == frame::FRAME_METHOD {
                return self.handle_channel0_method(f.payload);
            }
            return Err(Fault::conn(
                UNEXPECTED_FRAME,
                format!("type {}, all octets = {}", f.kind, octets()),
            ));
        }
        if self.closing {
            return Ok(());
        }
        let state = self
            .channels
            .get(&f.channel)
            .map(|c| (c.closing, c.pending.as_ref().map(|p| p.header.is_some())));
        let expected_method = || {
            Fault::conn(
                UNEXPECTED_FRAME,
                "expected method frame, got non method frame instead",
            )
        };
        let expected_header = || {
            Fault::Connection(
                AmqpError::new(
                    UNEXPECTED_FRAME,
                    "expected content header for class 60, got non content header frame instead",
                ),
                60,
                40,
            )
        };
        let expected_body = || {
            Fault::Connection(
                AmqpError::new(
                    UNEXPECTED_FRAME,
                    "expected content body, got non content body frame instead",
                ),
                60,
                40,
            )
        };
        match (state, f.kind) {
            // A channel we closed ignores everything but close/close-ok, as in RabbitMQ.
            (Some((true, _)), frame::FRAME_METHOD) => {
                if let Ok(Method::Other(AMQPClass::Channel(m))) = Method::decode(f.payload) {
                    use warren_protocol::amqp::channel::AMQPMethod as C;
                    match m {
                        C::CloseOk(_) => {
                            self.channels.remove(&f.channel);
                        }
                        C::Close(_) => {
                            control(
                                &self.outbox,
                                f.channel,
                                AMQPClass::Channel(C::CloseOk(
                                    warren_protocol::amqp::channel::CloseOk {},
                                )),
                            );
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            (Some((true, _)), _) => Ok(()),
            (None, frame::FRAME_METHOD) => self.handle_unopened_channel(f.channel, f.payload),
            (None, _) => Err(expected_method()),
            (Some((false, Some(false))), _) if f.kind != frame::FRAME_HEADER => {
                Err(expected_header())
            }
            (Some((false, Some(true))), _) if f.kind != frame::FRAME_BODY => Err(expected_body()),
            (Some((false, None)), frame::FRAME_METHOD) => {
                let ids = method_ids(&f.payload);
                if ids == (60, 10) && f.payload.len() >= 8 {
                    // amq-protocol drops basic.qos's prefetch-size; RabbitMQ refuses non-zero.
                    let size = u32::from_be_bytes([
                        f.payload[4],
                        f.payload[5],
                        f.payload[6],
                        f.payload[7],
                    ]);
                    if size != 0 {
                        return Err(Fault::Connection(
                            AmqpError::not_implemented(format!("prefetch_size!=0 ({size})")),
                            60,
                            10,
                        ));
                    }
                }
                let method = self.decode_method(f.payload)?;
                self.handle_method(f.channel, method, ids)
            }
            (Some((false, None)), _) => Err(expected_method()),
            (Some((false, Some(false))), _) => self.handle_content_header(f.channel, f.payload),
            (Some((false, Some(true))), _) => self.handle_content_body(f.channel, f.payload),
        }
    }

    fn decode_method(&self, payload: Bytes) -> Result<Method, Fault> {
        Method::decode(payload.clone()).map_err(|e| match e {
            MethodError::Syntax {
                class_id,
                method_id,
            } => {
                if payload.len() >= 4 && is_utf8_failure(&payload) {
                    return Fault::conn(FRAME_ERROR, "Malformed UTF-8 in shortstr");
                }
                let args = payload.get(4..).unwrap_or_default();
                Fault::Connection(
                    AmqpError::new(
                        FRAME_ERROR,
                        format!("cannot decode {}", erlang_binary(args)),
                    ),
                    class_id,
                    method_id,
                )
            }
            MethodError::Unknown {
                class_id,
                method_id,
            } => Fault::Connection(
                AmqpError::command_invalid("unimplemented method"),
                class_id,
                method_id,
            ),
        })
    }

    fn handle_channel0_method(&mut self, payload: Bytes) -> Result<(), Fault> {
        let ids = method_ids(&payload);
        let method = self.decode_method(payload)?;
        let unexpected = || {
            Fault::Connection(
                AmqpError::new(
                    CHANNEL_ERROR,
                    "unexpected method in connection state running",
                ),
                ids.0,
                ids.1,
            )
        };
        let Method::Other(AMQPClass::Connection(m)) = method else {
            if self.closing {
                return Ok(());
            }
            return Err(unexpected());
        };
        use connection::AMQPMethod as M;
        match m {
            M::Close(_) => {
                // Acks released stored messages; once close-ok is out they must stay released.
                // A failed engine is reported by the storage alarm; the close goes on.
                let _ = self.sync_store();
                control(
                    &self.outbox,
                    0,
                    AMQPClass::Connection(M::CloseOk(connection::CloseOk {})),
                );
                self.finished = true;
                self.closed_by_client = true;
                Ok(())
            }
            M::CloseOk(_) => {
                self.finished = true;
                Ok(())
            }
            _ if self.closing => Ok(()),
            M::UpdateSecret(_) => {
                control(
                    &self.outbox,
                    0,
                    AMQPClass::Connection(M::UpdateSecretOk(connection::UpdateSecretOk {})),
                );
                Ok(())
            }
            M::Blocked(_) | M::Unblocked(_) => Ok(()),
            _ => Err(unexpected()),
        }
    }

    /// channel.open admitted: the channel exists from now on, and its open-ok goes out.
    pub(crate) fn open_channel(&mut self, number: u16) {
        let key = self.shared.next_channel.fetch_add(1, Ordering::Relaxed);
        let mut vhost = self.meta_vhost();
        vhost.channel_open(key, self.id, number, self.outbox.clone(), &self.user);
        vhost.channel_cancel_notify(key, self.caps.consumer_cancel_notify);
        drop(vhost);
        self.channels.insert(number, Channel::new(key));
        self.shared.counters.channel_opened();
        control(
            &self.outbox,
            number,
            AMQPClass::Channel(warren_protocol::amqp::channel::AMQPMethod::OpenOk(
                warren_protocol::amqp::channel::OpenOk {},
            )),
        );
    }

    fn handle_unopened_channel(&mut self, number: u16, payload: Bytes) -> Result<(), Fault> {
        let ids = method_ids(&payload);
        let method = self.decode_method(payload)?;
        match method {
            Method::Other(AMQPClass::Channel(
                warren_protocol::amqp::channel::AMQPMethod::Open(_),
            )) => {
                // RabbitMQ 3.10 enforces channel_max as a count of open channels.
                if self.channels.len() >= self.channel_max as usize {
                    return Err(Fault::conn(
                        NOT_ALLOWED,
                        format!("number of channels opened ({}) has reached the negotiated channel_max ({})", self.channels.len(), self.channel_max),
                    ));
                }
                if let Some(limit) = crate::amqp::access::channel_limit(&self.shared, &self.user) {
                    // Counted over the cluster: opened once the answer is in, before the
                    // connection reads its next frame.
                    let shared = self.shared.clone();
                    let user = self.user.clone();
                    self.proposal = Some(crate::topology::proposal::Proposal {
                        number,
                        nowait: false,
                        reply: crate::topology::proposal::Reply::ChannelOpen,
                        answer: Box::pin(async move {
                            crate::amqp::access::admit_channel(&shared, &user, limit).await?;
                            Ok(warren_broker::command::Outcome::Done)
                        }),
                    });
                    return Ok(());
                }
                self.open_channel(number);
                Ok(())
            }
            _ => Err(Fault::Connection(
                AmqpError::new(CHANNEL_ERROR, "expected 'channel.open'"),
                ids.0,
                ids.1,
            )),
        }
    }

    fn handle_content_header(&mut self, number: u16, payload: Bytes) -> Result<(), Fault> {
        let max = self.shared.config.message_bytes_max;
        let ch = self.channels.get_mut(&number).expect("checked open");
        let p = ch.pending.as_mut().expect("checked pending");
        let header = ContentHeader::decode(payload.clone()).map_err(|_| {
            Fault::Connection(
                AmqpError::new(
                    FRAME_ERROR,
                    format!("cannot decode {}", erlang_binary(&payload)),
                ),
                60,
                40,
            )
        })?;
        if header.class_id != 60 {
            return Err(Fault::Connection(
                AmqpError::new(
                    UNEXPECTED_FRAME,
                    format!(
                        "expected content header for class 60, got one for class {} instead",
                        header.class_id
                    ),
                ),
                60,
                40,
            ));
        }
        if header.body_size > max {
            ch.pending = None;
            return Err(Fault::Channel(
                number,
                AmqpError::precondition(format!(
                    "message size {} is larger than configured max size {max}",
                    header.body_size
                )),
                60,
                40,
            ));
        }
        let complete = header.body_size == 0;
        p.body = BytesMut::new();
        p.header = Some(header);
        if complete {
            return self.complete_publish(number);
        }
        Ok(())
    }

    fn handle_content_body(&mut self, number: u16, payload: Bytes) -> Result<(), Fault> {
        let ch = self.channels.get_mut(&number).expect("checked open");
        let p = ch.pending.as_mut().expect("checked pending");
        let expected = p.header.as_ref().expect("checked header").body_size;
        let have = p.body.len() as u64 + p.single.as_ref().map_or(0, |b| b.len() as u64);
        if p.overflowed || have + payload.len() as u64 > expected {
            // RabbitMQ counts down the remaining size and never completes a body that went
            // past it; the next method frame then fails with "expected content body".
            p.overflowed = true;
            return Ok(());
        }
        if have == 0 && payload.len() as u64 == expected {
            // The common case: the whole body in one frame, kept without a copy.
            p.single = Some(payload);
        } else {
            if let Some(first) = p.single.take() {
                p.body.extend_from_slice(&first);
            }
            p.body.extend_from_slice(&payload);
        }
        let have = p.body.len() as u64 + p.single.as_ref().map_or(0, |b| b.len() as u64);
        if have == expected {
            return self.complete_publish(number);
        }
        Ok(())
    }

    fn complete_publish(&mut self, number: u16) -> Result<(), Fault> {
        let ch = self.channels.get_mut(&number).expect("checked open");
        let Pending {
            publish,
            header,
            body,
            single,
            ..
        } = ch.pending.take().expect("pending publish");
        let header = header.expect("header arrived");
        let body = match single {
            Some(b) => b,
            None => body.freeze(),
        };
        self.publish(number, publish, header, body)
    }
}

fn method_ids(payload: &[u8]) -> (u16, u16) {
    if payload.len() < 4 {
        return (0, 0);
    }
    (
        u16::from_be_bytes([payload[0], payload[1]]),
        u16::from_be_bytes([payload[2], payload[3]]),
    )
}

/// Whether a method failed to parse only because a short string is not UTF-8: the same bytes
/// with invalid sequences replaced (length kept) then parse, and RabbitMQ says so explicitly.
fn is_utf8_failure(payload: &[u8]) -> bool {
    let mut fixed = payload.to_vec();
    let mut at = 0;
    let mut changed = false;
    while at < fixed.len() {
        match std::str::from_utf8(&fixed[at..]) {
            Ok(_) => break,
            Err(e) => {
                let bad = at + e.valid_up_to();
                let len = e.error_len().unwrap_or(fixed.len() - bad);
                for b in &mut fixed[bad..bad + len] {
                    *b = b'?';
                }
                changed = true;
                at = bad + len;
            }
        }
    }
    changed && Method::decode(Bytes::from(fixed)).is_ok()
}

/// Whether the next frame in the buffer is a basic.publish method frame.
pub(super) fn starts_with_publish(buf: &[u8]) -> bool {
    buf.len() >= 11 && buf[0] == frame::FRAME_METHOD && buf[7..11] == [0, 60, 0, 40]
}
