//! The node-to-node wire format: length-prefixed frames on a TCP link.
//!
//! ```text
//! 0  4  length of what follows (kind + payload), little endian, <= FRAME_BYTES_MAX
//! 4  1  kind: 1 hello, 2 ping, 3 pong, 4 raft, 5 data, 6 catch-up, 7 raft-link hello,
//!          8 identify
//! 5  .  payload
//! ```
//!
//! - hello: JSON [`Hello`] (who the node is, and its boot id), the first frame of a link.
//! - raft-link hello: the same, as the first frame of a link that carries only quorum queues'
//!   Raft frames, read by the groups loop itself ([`crate::transport`] says why).
//! - ping / pong: 8 bytes, the sender's clock in microseconds, echoed: round trip and liveness.
//! - raft: 8 group id, then per message 4 length + the protobuf-encoded Raft message. All of a
//!   round's messages for one peer and group travel in one frame.
//! - data: one [`crate::messaging::Data`] message (forwarded publishes, deliveries, acks).
//! - catch-up: one [`crate::catch_up::CatchUpMessage`] (a snapshot's entries, fetched).
//! - identify: no payload, after a one-off connection's hello: the node answers with its own
//!   hello and closes. A node asks its seeds who they are when it knows them only by address
//!   (a cluster restarted under new addresses: [`crate::transport::Transport::identify`]).
//!   Nodes of older builds drop the connection instead, which the asker takes as no answer.

use crate::address::HostPort;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use protobuf::Message as _;
use raft::eraftpb::Message;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// The largest frame accepted: a Raft snapshot of a large topology fits; anything larger is a
/// corrupt or hostile peer and the link is dropped.
pub const FRAME_BYTES_MAX: usize = 256 << 20;

pub const KIND_HELLO: u8 = 1;
pub const KIND_PING: u8 = 2;
pub const KIND_PONG: u8 = 3;
pub const KIND_RAFT: u8 = 4;
pub const KIND_DATA: u8 = 5;
pub const KIND_CATCH_UP: u8 = 6;
pub const KIND_RAFT_LINK_HELLO: u8 = 7;
pub const KIND_IDENTIFY: u8 = 8;

/// The first frame on a link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    #[serde(flatten)]
    pub info: NodeInfo,
    /// Changes each time the node starts: a peer that sees a new one knows the node lost
    /// everything it held for the peer's clients.
    #[serde(default)]
    pub boot: u64,
    /// The node the dialler meant to reach, by id: an address can change hands (a pod's IP
    /// given to another pod), and a node that is not the one meant refuses the link rather
    /// than take another node's traffic. Nodes of older builds ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<u64>,
    /// The cluster protocol the node speaks ([`PROTOCOL`]; absent: an older build, 1).
    #[serde(default = "first_protocol")]
    pub protocol: u32,
    /// The oldest protocol it works beside ([`PROTOCOL_MIN`]).
    #[serde(default = "first_protocol")]
    pub protocol_min: u32,
}

/// The cluster protocol of this build. Nodes of adjacent builds run side by side during a
/// rolling upgrade, so a change of what travels between nodes either keeps older nodes working
/// (new JSON fields they ignore, new frames they are never sent) or raises this number, and a
/// node asks of a peer only what the peer's protocol has: 2 added the identify frame, a
/// hello's `to` and the `node` request (`/api/nodes`).
pub const PROTOCOL: u32 = 2;
/// The oldest protocol this build works beside: a peer below it (or one that needs a newer
/// one than [`PROTOCOL`]) has its links refused with a line that says which to upgrade.
pub const PROTOCOL_MIN: u32 = 1;

fn first_protocol() -> u32 {
    1
}

impl Hello {
    /// This build's hello: `boot` 0 for a one-off connection, `to` the node meant.
    pub fn new(info: NodeInfo, boot: u64, to: Option<u64>) -> Hello {
        Hello {
            info,
            boot,
            to,
            protocol: PROTOCOL,
            protocol_min: PROTOCOL_MIN,
        }
    }

    /// Why this node cannot work beside the peer that sent this hello, if it cannot.
    pub fn incompatibility(&self) -> Option<String> {
        if self.protocol < PROTOCOL_MIN {
            return Some(format!(
                "node {} speaks cluster protocol {}, and this build needs at least {PROTOCOL_MIN}: \
                 upgrade {} first (nodes of adjacent releases work side by side)",
                self.info.name, self.protocol, self.info.name
            ));
        }
        if self.protocol_min > PROTOCOL {
            return Some(format!(
                "node {} needs cluster protocol {} or newer, and this build speaks {PROTOCOL}: \
                 upgrade this node (nodes of adjacent releases work side by side)",
                self.info.name, self.protocol_min
            ));
        }
        None
    }
}

/// Who a node is and where to reach it: sent in hello, kept in the replicated member table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's Raft id.
    pub id: u64,
    /// The node's name (`--node-name`).
    pub name: String,
    /// Where other nodes reach it (`--cluster-advertise`, by default `--cluster-listen`).
    pub cluster: HostPort,
    /// Where AMQP clients reach it (`--listen`).
    pub amqp: SocketAddr,
    /// Its HTTP management API, if any.
    pub management: Option<SocketAddr>,
    /// The node is in maintenance mode (`warren ctl drain`): it takes no leaderships and no
    /// new queues. Carried here, in the member table every node replicates, so that every
    /// node's `/api/nodes` and placement see it and it outlives the node's restarts, as
    /// RabbitMQ's replicated maintenance table does. Why a field with a default rather than
    /// an entry of its own: a node of an older build parses a member entry or a hello that
    /// has it, ignoring the unknown field (none of these structs denies unknown fields), where
    /// a new kind of metadata entry would be unreadable to it. Left out when false, so a node
    /// that never drained sends what older builds sent, byte for byte.
    #[serde(default, skip_serializing_if = "is_false")]
    pub draining: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A decoded frame.
#[derive(Debug)]
pub enum Frame {
    Hello(Hello),
    RaftLinkHello(Hello),
    Ping(u64),
    Pong(u64),
    Raft { group: u64, messages: Vec<Message> },
    Data(Bytes),
    CatchUp(crate::catch_up::CatchUpMessage),
    Identify,
}

fn begin(out: &mut BytesMut, kind: u8) -> usize {
    let at = out.len();
    out.put_u32_le(0);
    out.put_u8(kind);
    at
}

fn finish(out: &mut BytesMut, at: usize) {
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

pub fn encode_hello(out: &mut BytesMut, hello: &Hello) {
    encode_hello_of_kind(out, KIND_HELLO, hello)
}

/// The hello of a link for quorum queues' Raft frames only.
pub fn encode_raft_link_hello(out: &mut BytesMut, hello: &Hello) {
    encode_hello_of_kind(out, KIND_RAFT_LINK_HELLO, hello)
}

fn encode_hello_of_kind(out: &mut BytesMut, kind: u8, hello: &Hello) {
    let at = begin(out, kind);
    out.extend_from_slice(&serde_json::to_vec(hello).expect("node info serialises"));
    finish(out, at);
}

/// One data message, written by `f`.
pub fn encode_data(out: &mut BytesMut, f: impl FnOnce(&mut BytesMut)) {
    let at = begin(out, KIND_DATA);
    f(out);
    finish(out, at);
}

pub fn encode_identify(out: &mut BytesMut) {
    let at = begin(out, KIND_IDENTIFY);
    finish(out, at);
}

pub fn encode_catch_up(out: &mut BytesMut, message: &crate::catch_up::CatchUpMessage) {
    let at = begin(out, KIND_CATCH_UP);
    message.encode(out);
    finish(out, at);
}

pub fn encode_ping(out: &mut BytesMut, kind: u8, clock_us: u64) {
    let at = begin(out, kind);
    out.put_u64_le(clock_us);
    finish(out, at);
}

pub fn encode_raft(out: &mut BytesMut, group: u64, messages: &[Message]) {
    let at = begin(out, KIND_RAFT);
    out.put_u64_le(group);
    for m in messages {
        // Straight into the link's buffer: an append carries every entry's body, and a copy
        // through a Vec of its own cost as much as the protobuf encoding itself.
        let len = m.compute_size() as usize;
        out.put_u32_le(len as u32);
        let start = out.len();
        out.resize(start + len, 0);
        let mut stream = protobuf::CodedOutputStream::bytes(&mut out[start..]);
        m.write_to_with_cached_sizes(&mut stream)
            .and_then(|()| stream.flush())
            .expect("a raft message fits the size it computed");
    }
    finish(out, at);
}

/// Takes one frame off the front of `buf`: `Ok(None)` when it is not all there yet, `Err` when
/// the peer sent something no warren node sends (the link is dropped).
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, String> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    if !(1..=FRAME_BYTES_MAX).contains(&len) {
        return Err(format!("frame length {len}"));
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    buf.advance(4);
    let kind = buf.get_u8();
    let mut payload: Bytes = buf.split_to(len - 1).freeze();
    let clock = |p: &mut Bytes| {
        if p.len() == 8 {
            Ok(p.get_u64_le())
        } else {
            Err("ping of the wrong size".to_string())
        }
    };
    Ok(Some(match kind {
        KIND_HELLO => {
            Frame::Hello(serde_json::from_slice(&payload).map_err(|e| format!("bad hello: {e}"))?)
        }
        KIND_RAFT_LINK_HELLO => Frame::RaftLinkHello(
            serde_json::from_slice(&payload).map_err(|e| format!("bad hello: {e}"))?,
        ),
        KIND_PING => Frame::Ping(clock(&mut payload)?),
        KIND_PONG => Frame::Pong(clock(&mut payload)?),
        KIND_RAFT => {
            if payload.len() < 8 {
                return Err("short raft frame".into());
            }
            let group = payload.get_u64_le();
            let mut messages = Vec::new();
            while payload.has_remaining() {
                if payload.len() < 4 {
                    return Err("torn raft message length".into());
                }
                let n = payload.get_u32_le() as usize;
                if payload.len() < n {
                    return Err("torn raft message".into());
                }
                // Entries' data come out as slices of the frame, not copies: they are
                // re-encoded into the log and applied within the round, and whatever keeps a
                // body longer copies it (`quorum_bodies`), so no frame stays pinned.
                let m = Message::parse_from_carllerche_bytes(&payload.slice(..n))
                    .map_err(|e| format!("bad raft message: {e}"))?;
                payload.advance(n);
                messages.push(m);
            }
            Frame::Raft { group, messages }
        }
        KIND_DATA => Frame::Data(payload),
        KIND_CATCH_UP => Frame::CatchUp(crate::catch_up::CatchUpMessage::decode(payload)?),
        KIND_IDENTIFY => Frame::Identify,
        other => return Err(format!("unknown frame kind {other}")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_partial_frame_waits_for_the_rest() {
        let info = NodeInfo {
            id: 2,
            name: "n2".into(),
            cluster: "127.0.0.1:25673".parse().unwrap(),
            amqp: "127.0.0.1:5673".parse().unwrap(),
            management: None,
            draining: false,
        };
        let m = Message {
            to: 3,
            from: 2,
            term: 7,
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        let hello = Hello::new(info.clone(), 9, Some(3));
        encode_hello(&mut buf, &hello);
        encode_ping(&mut buf, KIND_PING, 42);
        encode_raft(&mut buf, 0, &[m.clone(), m.clone()]);
        let whole = buf.clone();
        let mut partial = BytesMut::from(&whole[..whole.len() - 1]);
        let mut seen = 0;
        while decode(&mut partial).unwrap().is_some() {
            seen += 1;
        }
        assert_eq!(seen, 2, "the raft frame is incomplete");
        match decode(&mut buf).unwrap() {
            Some(Frame::Hello(h)) => assert_eq!(h, hello),
            other => panic!("{other:?}"),
        }
        assert!(matches!(decode(&mut buf).unwrap(), Some(Frame::Ping(42))));
        match decode(&mut buf).unwrap() {
            Some(Frame::Raft { group, messages }) => {
                assert_eq!(group, 0);
                assert_eq!(messages, vec![m.clone(), m]);
            }
            other => panic!("{other:?}"),
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn an_older_builds_hello_reads_as_protocol_1_and_ours_reads_there_too() {
        // What a node of the build before protocol 2 sends.
        let old = r#"{"id":2,"name":"n2","cluster":"10.0.0.2:25672","amqp":"127.0.0.1:5672","management":null,"boot":7}"#;
        let hello: Hello = serde_json::from_str(old).unwrap();
        assert_eq!((hello.protocol, hello.protocol_min, hello.to), (1, 1, None));
        assert_eq!(hello.incompatibility(), None);
        // An older build reads ours with serde's defaults: unknown fields are ignored, and
        // addresses written as IP literals are SocketAddr strings.
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct OldNodeInfo {
            id: u64,
            name: String,
            cluster: SocketAddr,
            amqp: SocketAddr,
            management: Option<SocketAddr>,
        }
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct OldHello {
            #[serde(flatten)]
            info: OldNodeInfo,
            boot: u64,
        }
        let mut ours = serde_json::to_value(Hello::new(hello.info.clone(), 8, Some(1))).unwrap();
        let parsed: OldHello = serde_json::from_value(ours.clone()).unwrap();
        assert_eq!(parsed.boot, 8);
        ours["protocol_min"] = 3.into();
        let newer: Hello = serde_json::from_value(ours).unwrap();
        assert!(newer
            .incompatibility()
            .unwrap()
            .contains("upgrade this node"));
        let mut ancient = hello;
        ancient.protocol = 0;
        assert!(ancient
            .incompatibility()
            .unwrap()
            .contains("upgrade n2 first"));
    }

    #[test]
    fn an_impossible_length_or_kind_drops_the_link() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 1][..]);
        assert!(decode(&mut buf).is_err());
        let mut buf = BytesMut::from(&[1, 0, 0, 0, 99][..]);
        assert!(decode(&mut buf).is_err());
    }
}
