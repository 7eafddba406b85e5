//! Method frames: hand-coded data-plane methods, everything else through `amq-protocol`.

use crate::frame::{self, FRAME_METHOD};
use crate::wire::{put_short_str, Reader, Truncated};
use amq_protocol::protocol::{gen_class, parse_class, AMQPClass};
use bytes::{BufMut, Bytes, BytesMut};

/// basic.publish: exchange and routing key are slices of the frame, not copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub exchange: Bytes,
    pub routing_key: Bytes,
    pub mandatory: bool,
    pub immediate: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deliver {
    pub consumer_tag: Bytes,
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub exchange: Bytes,
    pub routing_key: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetOk {
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub exchange: Bytes,
    pub routing_key: Bytes,
    pub message_count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub delivery_tag: u64,
    pub multiple: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nack {
    pub delivery_tag: u64,
    pub multiple: bool,
    pub requeue: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reject {
    pub delivery_tag: u64,
    pub requeue: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    pub reply_code: u16,
    pub reply_text: Bytes,
    pub exchange: Bytes,
    pub routing_key: Bytes,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    Publish(Publish),
    Deliver(Deliver),
    GetOk(GetOk),
    Ack(Ack),
    Nack(Nack),
    Reject(Reject),
    Return(Return),
    /// Every control-plane method, decoded by `amq-protocol`.
    Other(AMQPClass),
}

/// Why a method frame could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodError {
    /// A known method whose fields do not parse: 502 SYNTAX_ERROR.
    Syntax { class_id: u16, method_id: u16 },
    /// A class or method id that AMQP 0-9-1 does not define.
    Unknown { class_id: u16, method_id: u16 },
}

const BASIC: u16 = 60;
const PUBLISH: u16 = 40;
const RETURN: u16 = 50;
const DELIVER: u16 = 60;
const GET_OK: u16 = 71;
const ACK: u16 = 80;
const REJECT: u16 = 90;
const NACK: u16 = 120;

/// Whether `(class, method)` is a method of AMQP 0-9-1 (RabbitMQ's dialect).
pub fn is_known(class_id: u16, method_id: u16) -> bool {
    let methods: &[u16] = match class_id {
        10 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51, 60, 61, 70, 71],
        20 => &[10, 11, 20, 21, 40, 41],
        30 => &[10, 11],
        40 => &[10, 11, 20, 21, 30, 31, 40, 51],
        50 => &[10, 11, 20, 21, 30, 31, 40, 41, 50, 51],
        60 => &[
            10, 11, 20, 21, 30, 31, 40, 50, 60, 70, 71, 72, 80, 90, 100, 110, 111, 120,
        ],
        85 => &[10, 11],
        90 => &[10, 11, 20, 21, 30, 31],
        _ => &[],
    };
    methods.contains(&method_id)
}

impl Method {
    /// Decodes a method frame's payload.
    pub fn decode(payload: Bytes) -> Result<Method, MethodError> {
        let mut r = Reader::new(payload.clone());
        let ids = (r.u16(), r.u16());
        let (Ok(class_id), Ok(method_id)) = ids else {
            return Err(MethodError::Syntax {
                class_id: 0,
                method_id: 0,
            });
        };
        if !is_known(class_id, method_id) {
            return Err(MethodError::Unknown {
                class_id,
                method_id,
            });
        }
        let syntax = |_: Truncated| MethodError::Syntax {
            class_id,
            method_id,
        };
        if class_id == BASIC {
            match method_id {
                PUBLISH => return decode_publish(&mut r).map(Method::Publish).map_err(syntax),
                ACK => {
                    let delivery_tag = r.u64().map_err(syntax)?;
                    let bits = r.u8().map_err(syntax)?;
                    return Ok(Method::Ack(Ack {
                        delivery_tag,
                        multiple: bits & 1 != 0,
                    }));
                }
                NACK => {
                    let delivery_tag = r.u64().map_err(syntax)?;
                    let bits = r.u8().map_err(syntax)?;
                    return Ok(Method::Nack(Nack {
                        delivery_tag,
                        multiple: bits & 1 != 0,
                        requeue: bits & 2 != 0,
                    }));
                }
                REJECT => {
                    let delivery_tag = r.u64().map_err(syntax)?;
                    let bits = r.u8().map_err(syntax)?;
                    return Ok(Method::Reject(Reject {
                        delivery_tag,
                        requeue: bits & 1 != 0,
                    }));
                }
                DELIVER => {
                    let consumer_tag = r.short_str().map_err(syntax)?;
                    let delivery_tag = r.u64().map_err(syntax)?;
                    let redelivered = r.u8().map_err(syntax)? & 1 != 0;
                    let exchange = r.short_str().map_err(syntax)?;
                    let routing_key = r.short_str().map_err(syntax)?;
                    return Ok(Method::Deliver(Deliver {
                        consumer_tag,
                        delivery_tag,
                        redelivered,
                        exchange,
                        routing_key,
                    }));
                }
                GET_OK => {
                    let delivery_tag = r.u64().map_err(syntax)?;
                    let redelivered = r.u8().map_err(syntax)? & 1 != 0;
                    let exchange = r.short_str().map_err(syntax)?;
                    let routing_key = r.short_str().map_err(syntax)?;
                    let message_count = r.u32().map_err(syntax)?;
                    return Ok(Method::GetOk(GetOk {
                        delivery_tag,
                        redelivered,
                        exchange,
                        routing_key,
                        message_count,
                    }));
                }
                RETURN => {
                    let reply_code = r.u16().map_err(syntax)?;
                    let reply_text = r.short_str().map_err(syntax)?;
                    let exchange = r.short_str().map_err(syntax)?;
                    let routing_key = r.short_str().map_err(syntax)?;
                    return Ok(Method::Return(Return {
                        reply_code,
                        reply_text,
                        exchange,
                        routing_key,
                    }));
                }
                _ => {}
            }
        }
        match parse_class(&payload[..]) {
            Ok((_, class)) => Ok(Method::Other(class)),
            Err(_) => Err(MethodError::Syntax {
                class_id,
                method_id,
            }),
        }
    }

    /// Appends this method as a complete method frame on `channel`.
    pub fn encode(&self, channel: u16, out: &mut BytesMut) {
        let start = frame::begin(out, FRAME_METHOD, channel);
        match self {
            Method::Publish(p) => {
                out.put_u16(BASIC);
                out.put_u16(PUBLISH);
                out.put_u16(0);
                put_short_str(out, &p.exchange);
                put_short_str(out, &p.routing_key);
                out.put_u8(p.mandatory as u8 | (p.immediate as u8) << 1);
            }
            Method::Deliver(d) => encode_deliver_fields(
                out,
                &d.consumer_tag,
                d.delivery_tag,
                d.redelivered,
                &d.exchange,
                &d.routing_key,
            ),
            Method::GetOk(g) => {
                out.put_u16(BASIC);
                out.put_u16(GET_OK);
                out.put_u64(g.delivery_tag);
                out.put_u8(g.redelivered as u8);
                put_short_str(out, &g.exchange);
                put_short_str(out, &g.routing_key);
                out.put_u32(g.message_count);
            }
            Method::Ack(a) => {
                out.put_u16(BASIC);
                out.put_u16(ACK);
                out.put_u64(a.delivery_tag);
                out.put_u8(a.multiple as u8);
            }
            Method::Nack(n) => {
                out.put_u16(BASIC);
                out.put_u16(NACK);
                out.put_u64(n.delivery_tag);
                out.put_u8(n.multiple as u8 | (n.requeue as u8) << 1);
            }
            Method::Reject(r) => {
                out.put_u16(BASIC);
                out.put_u16(REJECT);
                out.put_u64(r.delivery_tag);
                out.put_u8(r.requeue as u8);
            }
            Method::Return(r) => {
                out.put_u16(BASIC);
                out.put_u16(RETURN);
                out.put_u16(r.reply_code);
                put_short_str(out, &r.reply_text);
                put_short_str(out, &r.exchange);
                put_short_str(out, &r.routing_key);
            }
            Method::Other(class) => {
                let (bytes, _) = cookie_factory::gen(gen_class(class), Vec::with_capacity(64))
                    .expect("serialising into a Vec cannot fail");
                out.put_slice(&bytes);
            }
        }
        frame::finish(out, start);
    }
}

fn decode_publish(r: &mut Reader) -> Result<Publish, Truncated> {
    let _ticket = r.u16()?;
    let exchange = r.short_str()?;
    let routing_key = r.short_str()?;
    let bits = r.u8()?;
    Ok(Publish {
        exchange,
        routing_key,
        mandatory: bits & 1 != 0,
        immediate: bits & 2 != 0,
    })
}

fn encode_deliver_fields(
    out: &mut BytesMut,
    consumer_tag: &[u8],
    delivery_tag: u64,
    redelivered: bool,
    exchange: &[u8],
    routing_key: &[u8],
) {
    out.put_u16(BASIC);
    out.put_u16(DELIVER);
    put_short_str(out, consumer_tag);
    out.put_u64(delivery_tag);
    out.put_u8(redelivered as u8);
    put_short_str(out, exchange);
    put_short_str(out, routing_key);
}

/// Appends a basic.deliver method frame without building a `Method` first: the per-message path.
pub fn encode_deliver(
    out: &mut BytesMut,
    channel: u16,
    consumer_tag: &[u8],
    delivery_tag: u64,
    redelivered: bool,
    exchange: &[u8],
    routing_key: &[u8],
) {
    let start = frame::begin(out, FRAME_METHOD, channel);
    encode_deliver_fields(
        out,
        consumer_tag,
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
    );
    frame::finish(out, start);
}

/// Appends a basic.ack (publisher confirm or consumer ack) frame: the per-message path.
pub fn encode_ack(out: &mut BytesMut, channel: u16, delivery_tag: u64, multiple: bool) {
    let start = frame::begin(out, FRAME_METHOD, channel);
    out.put_u16(BASIC);
    out.put_u16(ACK);
    out.put_u64(delivery_tag);
    out.put_u8(multiple as u8);
    frame::finish(out, start);
}

/// Appends a basic.publish frame: the per-message path of a client.
pub fn encode_publish(
    out: &mut BytesMut,
    channel: u16,
    exchange: &[u8],
    routing_key: &[u8],
    mandatory: bool,
) {
    let start = frame::begin(out, FRAME_METHOD, channel);
    out.put_u16(BASIC);
    out.put_u16(PUBLISH);
    out.put_u16(0);
    put_short_str(out, exchange);
    put_short_str(out, routing_key);
    out.put_u8(mandatory as u8);
    frame::finish(out, start);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::decode;
    use amq_protocol::protocol::queue;

    fn roundtrip(m: Method) -> Method {
        let mut out = BytesMut::new();
        m.encode(5, &mut out);
        let f = decode(&mut out, 0).unwrap().unwrap();
        assert_eq!(f.channel, 5);
        Method::decode(f.payload).unwrap()
    }

    #[test]
    fn hot_methods_roundtrip() {
        let cases = vec![
            Method::Publish(Publish {
                exchange: Bytes::from_static(b"ex"),
                routing_key: Bytes::from_static(b"a.b"),
                mandatory: true,
                immediate: false,
            }),
            Method::Deliver(Deliver {
                consumer_tag: Bytes::from_static(b"ctag"),
                delivery_tag: 1 << 40,
                redelivered: true,
                exchange: Bytes::new(),
                routing_key: Bytes::from_static(b"q"),
            }),
            Method::GetOk(GetOk {
                delivery_tag: 9,
                redelivered: false,
                exchange: Bytes::from_static(b"x"),
                routing_key: Bytes::from_static(b"k"),
                message_count: 77,
            }),
            Method::Ack(Ack {
                delivery_tag: 3,
                multiple: true,
            }),
            Method::Nack(Nack {
                delivery_tag: 4,
                multiple: false,
                requeue: true,
            }),
            Method::Reject(Reject {
                delivery_tag: 5,
                requeue: true,
            }),
            Method::Return(Return {
                reply_code: 312,
                reply_text: Bytes::from_static(b"NO_ROUTE"),
                exchange: Bytes::from_static(b"x"),
                routing_key: Bytes::from_static(b"k"),
            }),
        ];
        for m in cases {
            assert_eq!(roundtrip(m.clone()), m);
        }
    }

    #[test]
    fn control_methods_roundtrip_through_amq_protocol() {
        let m = Method::Other(AMQPClass::Queue(queue::AMQPMethod::Declare(
            queue::Declare {
                queue: "q1".into(),
                passive: false,
                durable: true,
                exclusive: false,
                auto_delete: true,
                nowait: false,
                arguments: Default::default(),
            },
        )));
        assert_eq!(roundtrip(m.clone()), m);
    }

    #[test]
    fn unknown_method_is_reported_as_unknown() {
        let payload = Bytes::from_static(&[0, 60, 0, 99]);
        assert_eq!(
            Method::decode(payload),
            Err(MethodError::Unknown {
                class_id: 60,
                method_id: 99
            })
        );
    }

    #[test]
    fn truncated_publish_is_a_syntax_error() {
        let payload = Bytes::from_static(&[0, 60, 0, 40, 0, 0, 5, b'a']);
        assert_eq!(
            Method::decode(payload),
            Err(MethodError::Syntax {
                class_id: 60,
                method_id: 40
            })
        );
    }
}
