//! Commands as log entries. An enqueue is most of a queue's log, and its payload is the
//! message itself: it gets a compact binary form whose payload is the entry's tail, read back
//! without copying or re-encoding the body. Every other command is rare and small, so it is
//! JSON behind a kind byte (readable in a hex dump, and new fields cost nothing).

use super::command::{Command, EnqueueHeader, Op, PublisherId};
use bytes::{Buf, BufMut, Bytes};

const KIND_JSON: u8 = 0;
const KIND_ENQUEUE: u8 = 1;

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
        match header.ttl_ms {
            Some(ttl) => {
                out.put_u8(1);
                out.put_u64_le(ttl);
            }
            None => out.put_u8(0),
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
                let ttl_ms = match b.get_u8() {
                    0 => None,
                    _ => {
                        if b.remaining() < 8 {
                            return Err(short());
                        }
                        Some(b.get_u64_le())
                    }
                };
                Ok(Command {
                    now_ms,
                    op: Op::Enqueue {
                        publisher,
                        seq,
                        header: EnqueueHeader { size_bytes, ttl_ms },
                        payload: b,
                    },
                })
            }
            other => Err(format!("unknown quorum queue entry kind {other}")),
        }
    }
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
            for ttl_ms in [None, Some(0), Some(60_000)] {
                round_trip(Command::new(
                    1_700_000_000_123,
                    Op::Enqueue {
                        publisher: publisher.clone(),
                        seq: 42,
                        header: EnqueueHeader {
                            size_bytes: 5,
                            ttl_ms,
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
