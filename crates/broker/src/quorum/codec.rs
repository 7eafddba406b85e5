//! Commands as log entries. An enqueue is most of a queue's log, and its payload is the
//! message itself: it gets a compact binary form whose payload is the entry's tail, read back
//! without copying or re-encoding the body. Acks, requeues and discards come next (one entry
//! per consumer per round, every member applies them), so they are binary too: their message
//! ids are varint deltas, a byte or two each, where JSON spent a decimal number and a comma
//! and every member parsed them back. Every other command is rare and small, so it is JSON
//! behind a kind byte (readable in a hex dump, and new fields cost nothing).
//!
//! Every kind byte is below 0x08: the cluster stores such an entry bare in the WAL (see the
//! cluster crate's `stored_entry`), and a new kind must stay in that range.

use super::command::{Command, ConsumerId, EnqueueHeader, MsgId, Op, PublisherId};
use super::snapshot::{get_varint, put_varint};
use bytes::{Buf, BufMut, Bytes};

const KIND_JSON: u8 = 0;
const KIND_ENQUEUE: u8 = 1;
const KIND_SETTLE: u8 = 2;
const KIND_RETURN: u8 = 3;
const KIND_DISCARD: u8 = 4;

/// An enqueue's flags byte (before high priorities, 0 or 1: whether a TTL follows).
const FLAG_TTL: u8 = 1;
const FLAG_HIGH_PRIORITY: u8 = 2;

impl Command {
    /// The entry's bytes.
    pub fn encode(&self) -> Vec<u8> {
        match &self.op {
            Op::Enqueue {
                publisher,
                seq,
                header,
                payload,
            } => Command::encode_enqueue(
                self.now_ms,
                publisher.as_ref(),
                *seq,
                *header,
                payload.len(),
                |out| out.put_slice(payload),
            ),
            Op::Settle { consumer, msg_ids } if fits(consumer) => {
                encode_settlement(KIND_SETTLE, self.now_ms, consumer, None, msg_ids)
            }
            Op::Return {
                consumer,
                msg_ids,
                rejected,
            } if fits(consumer) => {
                encode_settlement(KIND_RETURN, self.now_ms, consumer, Some(*rejected), msg_ids)
            }
            Op::Discard { consumer, msg_ids } if fits(consumer) => {
                encode_settlement(KIND_DISCARD, self.now_ms, consumer, None, msg_ids)
            }
            _ => {
                let mut out = vec![KIND_JSON];
                serde_json::to_writer(&mut out, self).expect("commands are plain data");
                out
            }
        }
    }

    /// An enqueue's bytes, its payload written by `write_payload` (at most about
    /// `payload_len` bytes): a publish writes the message straight into the entry, where
    /// building the payload first and the entry around it copied the body twice.
    pub fn encode_enqueue(
        now_ms: u64,
        publisher: Option<&PublisherId>,
        seq: u64,
        header: EnqueueHeader,
        payload_len: usize,
        write_payload: impl FnOnce(&mut Vec<u8>),
    ) -> Vec<u8> {
        let node = publisher.map_or("", |p| p.node.as_str());
        let mut out = Vec::with_capacity(48 + node.len() + payload_len);
        out.put_u8(KIND_ENQUEUE);
        out.put_u64_le(now_ms);
        match publisher {
            Some(p) => {
                out.put_u8(1);
                out.put_u16_le(p.node.len() as u16);
                out.put_slice(p.node.as_bytes());
                out.put_u64_le(p.channel);
            }
            None => out.put_u8(0),
        }
        out.put_u64_le(seq);
        out.put_u32_le(header.size_bytes);
        let flags = (header.ttl_ms.is_some() as u8 * FLAG_TTL)
            | (header.high_priority as u8 * FLAG_HIGH_PRIORITY);
        out.put_u8(flags);
        if let Some(ttl) = header.ttl_ms {
            out.put_u64_le(ttl);
        }
        write_payload(&mut out);
        out
    }

    /// Reads an entry; `entry` is shared, so an enqueue's payload is a slice of it.
    pub fn decode(entry: Bytes) -> Result<Command, String> {
        let mut b = entry;
        let short = || "a quorum queue entry cut short".to_string();
        if !b.has_remaining() {
            return Err(short());
        }
        match b.get_u8() {
            KIND_JSON => serde_json::from_slice(&b).map_err(|e| e.to_string()),
            KIND_ENQUEUE => {
                if b.remaining() < 9 {
                    return Err(short());
                }
                let now_ms = b.get_u64_le();
                let publisher = match b.get_u8() {
                    0 => None,
                    _ => {
                        if b.remaining() < 2 {
                            return Err(short());
                        }
                        let len = b.get_u16_le() as usize;
                        if b.remaining() < len + 8 {
                            return Err(short());
                        }
                        let node = String::from_utf8(b.split_to(len).to_vec())
                            .map_err(|e| e.to_string())?;
                        let channel = b.get_u64_le();
                        Some(PublisherId { node, channel })
                    }
                };
                if b.remaining() < 13 {
                    return Err(short());
                }
                let seq = b.get_u64_le();
                let size_bytes = b.get_u32_le();
                let flags = b.get_u8();
                if flags & !(FLAG_TTL | FLAG_HIGH_PRIORITY) != 0 {
                    return Err(format!("unknown enqueue flags {flags:#x}"));
                }
                let ttl_ms = if flags & FLAG_TTL != 0 {
                    if b.remaining() < 8 {
                        return Err(short());
                    }
                    Some(b.get_u64_le())
                } else {
                    None
                };
                let high_priority = flags & FLAG_HIGH_PRIORITY != 0;
                Ok(Command {
                    now_ms,
                    op: Op::Enqueue {
                        publisher,
                        seq,
                        header: EnqueueHeader {
                            size_bytes,
                            ttl_ms,
                            high_priority,
                        },
                        payload: b,
                    },
                })
            }
            kind @ (KIND_SETTLE | KIND_RETURN | KIND_DISCARD) => {
                decode_settlement(kind, b).ok_or_else(short)
            }
            other => Err(format!("unknown quorum queue entry kind {other}")),
        }
    }
}

/// Whether the consumer's names fit the settlement form's 16-bit lengths (a node name and an
/// AMQP short string always do; anything else goes as JSON rather than be cut).
fn fits(consumer: &ConsumerId) -> bool {
    consumer.node.len() <= u16::MAX as usize && consumer.tag.len() <= u16::MAX as usize
}

/// kind, now_ms, the consumer (node, channel, tag), a return's `rejected`, then the ids: a
/// count and each id's difference from the one before it (zigzag, so an ack out of order
/// costs a byte or two more, nothing breaks), as LEB128 varints.
fn encode_settlement(
    kind: u8,
    now_ms: u64,
    consumer: &ConsumerId,
    rejected: Option<bool>,
    msg_ids: &[MsgId],
) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(32 + consumer.node.len() + consumer.tag.len() + msg_ids.len() * 2);
    out.put_u8(kind);
    out.put_u64_le(now_ms);
    out.put_u16_le(consumer.node.len() as u16);
    out.put_slice(consumer.node.as_bytes());
    out.put_u64_le(consumer.channel);
    out.put_u16_le(consumer.tag.len() as u16);
    out.put_slice(consumer.tag.as_bytes());
    if let Some(rejected) = rejected {
        out.put_u8(rejected as u8);
    }
    out.put_u32_le(msg_ids.len() as u32);
    let mut previous = 0u64;
    for &id in msg_ids {
        let delta = id.wrapping_sub(previous) as i64;
        put_varint(&mut out, ((delta << 1) ^ (delta >> 63)) as u64);
        previous = id;
    }
    out
}

/// The rest of a settlement after its kind byte; `None` if it is cut short, malformed or
/// followed by anything.
fn decode_settlement(kind: u8, mut b: Bytes) -> Option<Command> {
    let now_ms = get_u64(&mut b)?;
    let node = get_string(&mut b)?;
    let channel = get_u64(&mut b)?;
    let tag = get_string(&mut b)?;
    let rejected = match kind {
        KIND_RETURN => Some(get_u8(&mut b)? != 0),
        _ => None,
    };
    if b.remaining() < 4 {
        return None;
    }
    let count = b.get_u32_le() as usize;
    // Every id takes at least a byte: a count beyond the bytes left is a lie, not a reason
    // to allocate.
    if count > b.remaining() {
        return None;
    }
    let mut msg_ids = Vec::with_capacity(count);
    let mut previous = 0u64;
    let mut ids: &[u8] = &b;
    for _ in 0..count {
        let zigzag = get_varint(&mut ids).ok()?;
        let delta = ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64);
        previous = previous.wrapping_add(delta as u64);
        msg_ids.push(previous);
    }
    if !ids.is_empty() {
        return None;
    }
    let consumer = ConsumerId { node, channel, tag };
    let op = match kind {
        KIND_SETTLE => Op::Settle { consumer, msg_ids },
        KIND_RETURN => Op::Return {
            consumer,
            msg_ids,
            rejected: rejected?,
        },
        _ => Op::Discard { consumer, msg_ids },
    };
    Some(Command { now_ms, op })
}

fn get_u8(b: &mut Bytes) -> Option<u8> {
    b.has_remaining().then(|| b.get_u8())
}

fn get_u64(b: &mut Bytes) -> Option<u64> {
    (b.remaining() >= 8).then(|| b.get_u64_le())
}

fn get_string(b: &mut Bytes) -> Option<String> {
    if b.remaining() < 2 {
        return None;
    }
    let len = b.get_u16_le() as usize;
    if b.remaining() < len {
        return None;
    }
    String::from_utf8(b.split_to(len).to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::super::command::{ConsumerId, ConsumerSpec};
    use super::*;

    fn round_trip(c: Command) {
        let bytes = Bytes::from(c.encode());
        assert_eq!(Command::decode(bytes.clone()).unwrap(), c);
        // Every prefix is refused, never misread.
        for cut in 0..bytes.len() {
            if let Ok(d) = Command::decode(bytes.slice(..cut)) {
                // Only an enqueue's payload may be cut without the header noticing.
                assert!(matches!(d.op, Op::Enqueue { .. }), "{d:?} from {cut} bytes");
            }
        }
    }

    #[test]
    fn enqueues_and_other_commands_round_trip() {
        for publisher in [None, Some(PublisherId::new("n2", 7 << 40))] {
            for (ttl_ms, high_priority) in [None, Some(0), Some(60_000)]
                .into_iter()
                .flat_map(|t| [(t, false), (t, true)])
            {
                round_trip(Command::new(
                    1_700_000_000_123,
                    Op::Enqueue {
                        publisher: publisher.clone(),
                        seq: 42,
                        header: EnqueueHeader {
                            size_bytes: 5,
                            ttl_ms,
                            high_priority,
                        },
                        payload: Bytes::from_static(b"hello"),
                    },
                ));
            }
        }
        round_trip(Command::new(
            5,
            Op::Checkout {
                consumer: ConsumerId::new("n1", 3, "ctag"),
                spec: ConsumerSpec {
                    credit: 10,
                    priority: -1,
                    no_ack: false,
                    exclusive: true,
                },
            },
        ));
        round_trip(Command::new(
            6,
            Op::Settle {
                consumer: ConsumerId::new("n1", 3, "ctag"),
                msg_ids: vec![1, 2, 3],
            },
        ));
    }

    fn settlements(consumer: ConsumerId, msg_ids: Vec<MsgId>) -> [Command; 4] {
        [
            Command::new(
                9,
                Op::Settle {
                    consumer: consumer.clone(),
                    msg_ids: msg_ids.clone(),
                },
            ),
            Command::new(
                9,
                Op::Return {
                    consumer: consumer.clone(),
                    msg_ids: msg_ids.clone(),
                    rejected: true,
                },
            ),
            Command::new(
                9,
                Op::Return {
                    consumer: consumer.clone(),
                    msg_ids: msg_ids.clone(),
                    rejected: false,
                },
            ),
            Command::new(9, Op::Discard { consumer, msg_ids }),
        ]
    }

    #[test]
    fn settlements_round_trip_in_any_order_and_range() {
        let id_lists = [
            vec![],
            vec![0],
            vec![1, 2, 3, 4],
            vec![500, 3, 9_000_000_000, 2],
            vec![u64::MAX, 0, u64::MAX, 1 << 63],
        ];
        for msg_ids in id_lists {
            for consumer in [
                ConsumerId::new("n1", 3, "amq.ctag-abc"),
                ConsumerId::get("warren@host-2", u64::MAX),
            ] {
                for c in settlements(consumer, msg_ids.clone()) {
                    let bytes = c.encode();
                    assert!((KIND_SETTLE..=KIND_DISCARD).contains(&bytes[0]), "{c:?}");
                    round_trip(c);
                }
            }
        }
    }

    #[test]
    fn an_ack_of_consecutive_ids_costs_a_byte_per_id() {
        let consumer = ConsumerId::new("n1", 3, "amq.ctag-0123456789");
        let msg_ids: Vec<MsgId> = (1_000_000..1_001_000).collect();
        let [ack, ..] = settlements(consumer, msg_ids);
        let mut json = vec![KIND_JSON];
        serde_json::to_writer(&mut json, &ack).unwrap();
        let binary = ack.encode();
        assert!(binary.len() < 1000 + 64, "{} bytes", binary.len());
        assert!(
            binary.len() * 6 < json.len(),
            "{} against {}",
            binary.len(),
            json.len()
        );
        assert_eq!(
            Command::decode(json.into()).unwrap(),
            ack,
            "JSON entries still read"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_ids_round_trip(msg_ids in proptest::collection::vec(proptest::num::u64::ANY, 0..64)) {
            for c in settlements(ConsumerId::new("n2", 7, "t"), msg_ids.clone()) {
                proptest::prop_assert_eq!(Command::decode(c.encode().into()).unwrap(), c);
            }
        }

        #[test]
        fn garbage_settlements_are_refused_not_panicked_on(
            kind in KIND_SETTLE..=KIND_DISCARD,
            rest in proptest::collection::vec(proptest::num::u8::ANY, 0..96),
        ) {
            let mut entry = vec![kind];
            entry.extend(rest);
            let _ = Command::decode(entry.into());
        }
    }

    #[test]
    fn an_enqueue_payload_is_the_entrys_tail_not_a_copy() {
        let c = Command::new(
            1,
            Op::Enqueue {
                publisher: None,
                seq: 1,
                header: EnqueueHeader::default(),
                payload: Bytes::from(vec![7u8; 1024]),
            },
        );
        let entry = Bytes::from(c.encode());
        let Op::Enqueue { payload, .. } = Command::decode(entry.clone()).unwrap().op else {
            panic!("an enqueue");
        };
        assert_eq!(payload.as_ptr(), entry[entry.len() - 1024..].as_ptr());
    }

    #[test]
    fn an_enqueue_written_in_place_is_the_command_around_the_stored_message() {
        use crate::message::{encode_stored, encode_stored_into, stored_len, Message};
        use warren_protocol::content::Properties;
        let props = Properties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        let m = Message::new(
            Bytes::from_static(b"ex"),
            Bytes::from_static(b"rk"),
            props.encode(),
            &props,
            Bytes::from(vec![9u8; 3000]),
        );
        let publisher = PublisherId::new("n1", 5);
        let header = EnqueueHeader {
            size_bytes: 3000,
            ttl_ms: Some(10),
            high_priority: true,
        };
        let in_place =
            Command::encode_enqueue(7, Some(&publisher), 3, header, stored_len(&m), |out| {
                encode_stored_into(out, &m, 0, None)
            });
        let built = Command::new(
            7,
            Op::Enqueue {
                publisher: Some(publisher),
                seq: 3,
                header,
                payload: encode_stored(&m, 0),
            },
        );
        assert_eq!(in_place, built.encode());
        assert!(
            in_place.capacity() < in_place.len() + 64,
            "one allocation of the right size"
        );
    }
}
