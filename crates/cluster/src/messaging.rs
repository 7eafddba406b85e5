//! Messages between nodes: forwarded publishes, deliveries to consumers on other nodes, their
//! acks, and the few requests a client's node makes of a queue's node (consume, cancel, get,
//! purge, passive declare). Encoded here, carried by the [`crate::transport`] in the same
//! batched writes as the Raft traffic, and carried out by the node's [`Handler`] (the server).
//!
//! ## Keeping two nodes' views of each other consistent
//! A delivery, an ack or a forwarded publish may be lost when a link breaks. Rather than make
//! each of them reliable, a break voids everything one node's clients had on the other, and
//! both sides start again from nothing, as RabbitMQ does when a queue's node goes down:
//! - Node N's relationship with peer P *as a client* (its clients' consumers and deliveries on
//!   P's queues, its forwarded publishes and requests to P) has an **epoch**, owned by N.
//!   Everything N asks of P carries it. When N sees the link to P break (its outbound link
//!   died, its inbound link from P ended or fell silent, P came back from a restart), it bumps
//!   the epoch, cancels its clients' consumers of P's queues, drops their deliveries from P,
//!   fails its pending requests and nacks unconfirmed forwards, then tells P with
//!   `Reset{epoch}` (at once, or first thing on the next link).
//! - P, seeing an epoch from N newer than the last, closes the stand-ins of N's clients
//!   (requeueing what they had out). Deliveries P sends carry the epoch their stand-in was made
//!   in, and N drops any that are not of its current epoch (P requeues them once it learns).
//! - When P sees the break first, it closes those stand-ins on its own (so their messages go to
//!   other consumers at once) and tells N with `Broken{epoch}`, which makes N bump its epoch as
//!   if it had seen the break itself. A `Broken` for an epoch N has already left is ignored, so
//!   the two notices never chase each other.

use crate::frame;
use crate::transport::Transport;
use amq_protocol_types::FieldTable;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warren_broker::error::AmqpError;
use warren_broker::message::Message;
use warren_broker::relay::SettleOp;
use warren_protocol::constants::INTERNAL_ERROR;
use warren_protocol::content::Properties;

/// How long a request to another node waits for its answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Above this many bytes waiting for a peer, deliveries to it hold off and publishers to its
/// queues wait: a slow node back-pressures instead of growing memory.
pub const CONGESTED_BYTES: usize = 8 << 20;

/// What a client's node asks of a queue's node.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Consume {
        vhost: String,
        channel: u64,
        conn: u64,
        number: u16,
        user: String,
        queue: String,
        tag: String,
        no_ack: bool,
        exclusive: bool,
        arguments: FieldTable,
        prefetch: u16,
        global_prefetch: u16,
    },
    Cancel {
        vhost: String,
        channel: u64,
        tag: String,
    },
    Get {
        vhost: String,
        channel: u64,
        conn: u64,
        number: u16,
        user: String,
        queue: String,
        no_ack: bool,
    },
    Purge {
        vhost: String,
        conn: u64,
        queue: String,
    },
    /// A passive queue.declare: the queue's counts where they are known.
    Declare {
        vhost: String,
        conn: u64,
        queue: String,
    },
    /// The figures of every queue the asked node hosts (in one vhost, or all), for the
    /// management API: only a queue's node counts its messages and consumers.
    QueueStats { vhost: Option<String> },
    /// The asked node's own AMQP clients, for the management API: in a cluster its listings
    /// of connections, channels and consumers show every node's, and close a connection on
    /// the node that has it, as RabbitMQ's do.
    Clients { ask: ClientsAsk },
    /// The asked node's own figures (memory, disk, alarms, uptime, descriptors, listeners),
    /// as the management API's `/api/nodes` shows them: every node lists every node's, as
    /// RabbitMQ's does.
    Node,
    /// Answered once the asked node has applied the metadata log up to `index`: a queue
    /// declared through another node is there before its declare-ok goes out, as in RabbitMQ,
    /// where the queue's node creates it.
    Applied { index: u64 },
}

/// Which of a node's client listings a [`Request::Clients`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientListing {
    Connections,
    Channels,
    Consumers,
}

/// What a [`Request::Clients`] asks of the node that has the clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientsAsk {
    /// Every item of one listing, in the management API's JSON (each names its node); the
    /// asking node filters them by what its caller may see.
    List { listing: ClientListing },
    /// Close the named connection with connection.close 320 and `reason`: `Done`, or 404
    /// when the node has no such connection (it closed meanwhile).
    Close { name: String, reason: String },
    /// How many connections to `vhost` and of `user`, and channels of `user`, the node has
    /// open: connection and channel limits count the whole cluster's, as RabbitMQ's do.
    Counts { vhost: String, user: String },
}

/// A node's answer to [`ClientsAsk::Counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientCounts {
    pub vhost_connections: u64,
    pub user_connections: u64,
    pub user_channels: u64,
}

impl std::ops::AddAssign for ClientCounts {
    fn add_assign(&mut self, other: ClientCounts) {
        self.vhost_connections += other.vhost_connections;
        self.user_connections += other.user_connections;
        self.user_channels += other.user_channels;
    }
}

/// One queue's figures, as its node counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueCounts {
    pub vhost: String,
    pub name: String,
    pub messages_ready: u64,
    pub messages_unacknowledged: u64,
    pub message_bytes_ready: u64,
    pub messages_paged_out: u64,
    pub consumers: u64,
    /// Its `message_stats` counters: publish, deliver_get, redeliver, ack.
    #[serde(default)]
    pub message_stats: [u64; 4],
    /// A quorum queue's leader as the answering member sees it, for nodes that hold no
    /// replica of it and so cannot see its group.
    #[serde(default)]
    pub leader: Option<String>,
}

/// A basic.get's message, as the queue's node took it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Got {
    pub tag: u64,
    pub redelivered: bool,
    pub no_ack: bool,
    pub message_count: u32,
    pub exchange: Vec<u8>,
    pub routing_key: Vec<u8>,
    pub properties: Vec<u8>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Response {
    Done,
    Got {
        got: Option<Got>,
    },
    Purged {
        count: u32,
    },
    Declared {
        messages: u32,
        consumers: u32,
    },
    QueueStats {
        queues: Vec<QueueCounts>,
    },
    /// The items of a [`ClientsAsk::List`], as the management API shows them.
    Clients {
        items: Vec<serde_json::Value>,
    },
    ClientCounts {
        counts: ClientCounts,
    },
    /// A [`Request::Node`]'s answer, in the management API's JSON.
    Node {
        node: serde_json::Value,
    },
}

/// A message relayed to a consumer on another node.
#[derive(Debug, Clone)]
pub struct Deliver {
    pub epoch: u64,
    pub vhost: String,
    pub channel: u64,
    pub consumer_tag: Bytes,
    pub tag: u64,
    pub redelivered: bool,
    pub no_ack: bool,
    pub exchange: Bytes,
    pub routing_key: Bytes,
    pub properties: Bytes,
    pub body: Bytes,
}

/// One data-plane message between nodes.
#[derive(Debug, Clone)]
pub enum Data {
    Reset {
        epoch: u64,
    },
    Broken {
        epoch: u64,
    },
    Publish {
        epoch: u64,
        seq: u64,
        vhost: String,
        queues: Vec<String>,
        exchange: Bytes,
        routing_key: Bytes,
        properties: Bytes,
        body: Bytes,
    },
    /// Every forward of `epoch` up to `upto` is in its queues (durably where it must be), and
    /// those in `rejected` were refused (x-overflow=reject-publish).
    Published {
        epoch: u64,
        upto: u64,
        rejected: Vec<u64>,
    },
    Call {
        epoch: u64,
        id: u64,
        request: Request,
    },
    Answer {
        id: u64,
        result: Result<Response, (u16, String)>,
    },
    Deliver(Deliver),
    Cancelled {
        epoch: u64,
        vhost: String,
        channel: u64,
        consumer_tag: Bytes,
    },
    Settle {
        epoch: u64,
        vhost: String,
        channel: u64,
        op: SettleOp,
        tags: Vec<u64>,
    },
    Close {
        epoch: u64,
        vhost: String,
        channel: u64,
    },
    /// A client channel's channel-wide prefetch changed: its stand-in takes it.
    Qos {
        epoch: u64,
        vhost: String,
        channel: u64,
        channel_prefetch: u32,
    },
    /// A client channel's socket is (or no longer is) behind what was relayed to it: its
    /// stand-in holds deliveries meanwhile, as a local consumer's full outbox holds them.
    Congested {
        epoch: u64,
        vhost: String,
        channel: u64,
        congested: bool,
    },
}

const T_RESET: u8 = 1;
const T_BROKEN: u8 = 2;
const T_PUBLISH: u8 = 3;
const T_PUBLISHED: u8 = 4;
const T_CALL: u8 = 5;
const T_ANSWER: u8 = 6;
const T_DELIVER: u8 = 7;
const T_CANCELLED: u8 = 8;
const T_SETTLE: u8 = 9;
const T_CLOSE: u8 = 10;
const T_QOS: u8 = 11;
const T_CONGESTED: u8 = 12;

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u32_le(b.len() as u32);
    out.extend_from_slice(b);
}

fn put_json<T: Serialize>(out: &mut BytesMut, v: &T) {
    put_bytes(
        out,
        &serde_json::to_vec(v).expect("data-plane values serialise"),
    );
}

impl Data {
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Data::Reset { epoch } => {
                out.put_u8(T_RESET);
                out.put_u64_le(*epoch);
            }
            Data::Broken { epoch } => {
                out.put_u8(T_BROKEN);
                out.put_u64_le(*epoch);
            }
            Data::Publish {
                epoch,
                seq,
                vhost,
                queues,
                exchange,
                routing_key,
                properties,
                body,
            } => {
                out.put_u8(T_PUBLISH);
                out.put_u64_le(*epoch);
                out.put_u64_le(*seq);
                put_bytes(out, vhost.as_bytes());
                out.put_u32_le(queues.len() as u32);
                for q in queues {
                    put_bytes(out, q.as_bytes());
                }
                put_bytes(out, exchange);
                put_bytes(out, routing_key);
                put_bytes(out, properties);
                put_bytes(out, body);
            }
            Data::Published {
                epoch,
                upto,
                rejected,
            } => {
                out.put_u8(T_PUBLISHED);
                out.put_u64_le(*epoch);
                out.put_u64_le(*upto);
                out.put_u32_le(rejected.len() as u32);
                for r in rejected {
                    out.put_u64_le(*r);
                }
            }
            Data::Call { epoch, id, request } => {
                out.put_u8(T_CALL);
                out.put_u64_le(*epoch);
                out.put_u64_le(*id);
                put_json(out, request);
            }
            Data::Answer { id, result } => {
                out.put_u8(T_ANSWER);
                out.put_u64_le(*id);
                put_json(out, result);
            }
            Data::Deliver(d) => {
                out.put_u8(T_DELIVER);
                out.put_u64_le(d.epoch);
                put_bytes(out, d.vhost.as_bytes());
                out.put_u64_le(d.channel);
                out.put_u64_le(d.tag);
                out.put_u8(d.redelivered as u8 | (d.no_ack as u8) << 1);
                put_bytes(out, &d.consumer_tag);
                put_bytes(out, &d.exchange);
                put_bytes(out, &d.routing_key);
                put_bytes(out, &d.properties);
                put_bytes(out, &d.body);
            }
            Data::Cancelled {
                epoch,
                vhost,
                channel,
                consumer_tag,
            } => {
                out.put_u8(T_CANCELLED);
                out.put_u64_le(*epoch);
                put_bytes(out, vhost.as_bytes());
                out.put_u64_le(*channel);
                put_bytes(out, consumer_tag);
            }
            Data::Settle {
                epoch,
                vhost,
                channel,
                op,
                tags,
            } => {
                out.put_u8(T_SETTLE);
                out.put_u64_le(*epoch);
                put_bytes(out, vhost.as_bytes());
                out.put_u64_le(*channel);
                out.put_u8(match op {
                    SettleOp::Ack => 0,
                    SettleOp::Requeue => 1,
                    SettleOp::Discard => 2,
                });
                out.put_u32_le(tags.len() as u32);
                for t in tags {
                    out.put_u64_le(*t);
                }
            }
            Data::Close {
                epoch,
                vhost,
                channel,
            } => {
                out.put_u8(T_CLOSE);
                out.put_u64_le(*epoch);
                put_bytes(out, vhost.as_bytes());
                out.put_u64_le(*channel);
            }
            Data::Qos {
                epoch,
                vhost,
                channel,
                channel_prefetch,
            } => {
                out.put_u8(T_QOS);
                out.put_u64_le(*epoch);
                put_bytes(out, vhost.as_bytes());
                out.put_u64_le(*channel);
                out.put_u32_le(*channel_prefetch);
            }
            Data::Congested {
                epoch,
                vhost,
                channel,
                congested,
            } => {
                out.put_u8(T_CONGESTED);
                out.put_u64_le(*epoch);
                put_bytes(out, vhost.as_bytes());
                out.put_u64_le(*channel);
                out.put_u8(*congested as u8);
            }
        }
    }

    /// Decodes one message; `Err` for anything a warren node does not send (the link drops).
    pub fn decode(mut p: Bytes) -> Result<Data, String> {
        let mut r = Reader(&mut p);
        let kind = r.u8()?;
        let data = match kind {
            T_RESET => Data::Reset { epoch: r.u64()? },
            T_BROKEN => Data::Broken { epoch: r.u64()? },
            T_PUBLISH => {
                let epoch = r.u64()?;
                let seq = r.u64()?;
                let vhost = r.string()?;
                let n = r.u32()? as usize;
                let mut queues = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    queues.push(r.string()?);
                }
                Data::Publish {
                    epoch,
                    seq,
                    vhost,
                    queues,
                    exchange: r.bytes()?,
                    routing_key: r.bytes()?,
                    properties: r.bytes()?,
                    body: r.bytes()?,
                }
            }
            T_PUBLISHED => {
                let epoch = r.u64()?;
                let upto = r.u64()?;
                let n = r.u32()? as usize;
                let mut rejected = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    rejected.push(r.u64()?);
                }
                Data::Published {
                    epoch,
                    upto,
                    rejected,
                }
            }
            T_CALL => Data::Call {
                epoch: r.u64()?,
                id: r.u64()?,
                request: r.json()?,
            },
            T_ANSWER => Data::Answer {
                id: r.u64()?,
                result: r.json()?,
            },
            T_DELIVER => {
                let epoch = r.u64()?;
                let vhost = r.string()?;
                let channel = r.u64()?;
                let tag = r.u64()?;
                let flags = r.u8()?;
                Data::Deliver(Deliver {
                    epoch,
                    vhost,
                    channel,
                    tag,
                    redelivered: flags & 1 != 0,
                    no_ack: flags & 2 != 0,
                    consumer_tag: r.bytes()?,
                    exchange: r.bytes()?,
                    routing_key: r.bytes()?,
                    properties: r.bytes()?,
                    body: r.bytes()?,
                })
            }
            T_CANCELLED => Data::Cancelled {
                epoch: r.u64()?,
                vhost: r.string()?,
                channel: r.u64()?,
                consumer_tag: r.bytes()?,
            },
            T_SETTLE => {
                let epoch = r.u64()?;
                let vhost = r.string()?;
                let channel = r.u64()?;
                let op = match r.u8()? {
                    0 => SettleOp::Ack,
                    1 => SettleOp::Requeue,
                    2 => SettleOp::Discard,
                    other => return Err(format!("settle op {other}")),
                };
                let n = r.u32()? as usize;
                let mut tags = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    tags.push(r.u64()?);
                }
                Data::Settle {
                    epoch,
                    vhost,
                    channel,
                    op,
                    tags,
                }
            }
            T_CLOSE => Data::Close {
                epoch: r.u64()?,
                vhost: r.string()?,
                channel: r.u64()?,
            },
            T_QOS => Data::Qos {
                epoch: r.u64()?,
                vhost: r.string()?,
                channel: r.u64()?,
                channel_prefetch: r.u32()?,
            },
            T_CONGESTED => Data::Congested {
                epoch: r.u64()?,
                vhost: r.string()?,
                channel: r.u64()?,
                congested: r.u8()? != 0,
            },
            other => return Err(format!("data message kind {other}")),
        };
        if r.0.has_remaining() {
            return Err("trailing bytes in a data message".into());
        }
        Ok(data)
    }
}

struct Reader<'a>(&'a mut Bytes);

impl Reader<'_> {
    fn need(&self, n: usize) -> Result<(), String> {
        if self.0.len() < n {
            Err("truncated data message".into())
        } else {
            Ok(())
        }
    }
    fn u8(&mut self) -> Result<u8, String> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.need(4)?;
        Ok(self.0.get_u32_le())
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.need(8)?;
        Ok(self.0.get_u64_le())
    }
    fn bytes(&mut self) -> Result<Bytes, String> {
        let n = self.u32()? as usize;
        self.need(n)?;
        Ok(self.0.split_to(n))
    }
    fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "a name that is not UTF-8".into())
    }
    fn json<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, String> {
        serde_json::from_slice(&self.bytes()?).map_err(|e| format!("bad data message: {e}"))
    }
}

/// Builds the message a forwarded publish or a relayed delivery carries.
pub fn message(exchange: Bytes, routing_key: Bytes, properties: Bytes, body: Bytes) -> Message {
    let props = Properties::decode(&properties).unwrap_or_default();
    Message::new(exchange, routing_key, properties, &props, body)
}

/// What the node does with what peers send (the server implements it).
pub trait Handler: Send + Sync {
    /// A data message from peer `from` (already checked against the epochs).
    fn data(&self, from: u64, data: Data);
    /// The link to `peer` broke and this node's clients lost what they had there (their
    /// consumers are to be cancelled, their deliveries forgotten). `epoch` is the one that ended.
    fn client_side_broken(&self, peer: u64, ended_epoch: u64);
    /// The stand-ins of `peer`'s clients are to be closed (requeueing their deliveries).
    fn server_side_broken(&self, peer: u64);
}

type Completion = Box<dyn FnOnce(Result<Response, AmqpError>) + Send>;

/// This node's state with one peer.
#[derive(Default)]
struct PeerState {
    /// Our epoch as the peer's client.
    epoch: u64,
    /// The newest epoch the peer has used with us as its client.
    peer_epoch: u64,
    /// We closed the stand-ins of the peer's clients on our own and have not told it yet.
    broken_pending: bool,
    /// The peer's boot id, from its hello.
    boot: Option<u64>,
    next_seq: u64,
    calls: HashMap<u64, Completion>,
}

/// The node's data plane: epochs per peer, requests in flight, forwarded publish numbering.
pub struct Messaging {
    transport: Transport,
    handler: std::sync::OnceLock<Arc<dyn Handler>>,
    peers: Mutex<HashMap<u64, PeerState>>,
    /// Epochs start at this boot's clock (ms since 1970, shifted), so a restarted node's
    /// epochs are newer than any it used before.
    epoch_base: u64,
    next_call: AtomicU64,
}

/// A forwarded publish's place in its peer's numbering: what a publisher confirm waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    pub peer: u64,
    pub epoch: u64,
    pub seq: u64,
}

impl Messaging {
    pub fn new(transport: Transport, boot_ms: u64) -> Messaging {
        Messaging {
            transport,
            handler: std::sync::OnceLock::new(),
            peers: Mutex::new(HashMap::new()),
            epoch_base: boot_ms << 16,
            next_call: AtomicU64::new(1),
        }
    }

    pub fn set_handler(&self, handler: Arc<dyn Handler>) {
        let _ = self.handler.set(handler);
    }

    fn with_peer<R>(&self, peer: u64, f: impl FnOnce(&mut PeerState) -> R) -> R {
        let mut peers = self.peers.lock().expect("peers lock");
        let state = peers.entry(peer).or_insert_with(|| PeerState {
            epoch: self.epoch_base,
            next_seq: 1,
            ..Default::default()
        });
        f(state)
    }

    /// Our current epoch with `peer`.
    pub fn epoch(&self, peer: u64) -> u64 {
        self.with_peer(peer, |p| p.epoch)
    }

    /// Sends `data` to `peer`; false when the link is down (nothing was sent).
    pub fn send(&self, peer: u64, data: &Data) -> bool {
        self.transport
            .send_data(peer, |out| frame::encode_data(out, |b| data.encode(b)))
    }

    pub fn is_congested(&self, peer: u64) -> bool {
        self.transport.buffered(peer) > CONGESTED_BYTES
    }

    /// Forwards a publish; `None` when the link to `peer` is down.
    #[allow(clippy::too_many_arguments)]
    pub fn publish(
        &self,
        peer: u64,
        vhost: &str,
        queues: Vec<String>,
        m: &Message,
    ) -> Option<Forwarded> {
        let (epoch, seq) = self.with_peer(peer, |p| {
            let seq = p.next_seq;
            p.next_seq += 1;
            (p.epoch, seq)
        });
        let data = Data::Publish {
            epoch,
            seq,
            vhost: vhost.to_string(),
            queues,
            exchange: m.exchange.clone(),
            routing_key: m.routing_key.clone(),
            properties: m.properties.clone(),
            body: m.body.clone(),
        };
        self.send(peer, &data)
            .then_some(Forwarded { peer, epoch, seq })
    }

    /// Sends `request`; `done` runs with the answer on the link's reader (so it is ordered
    /// with the deliveries that follow it), or with an error if the link breaks first.
    pub fn call(&self, peer: u64, request: Request, done: Completion) {
        let id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let epoch = self.with_peer(peer, |p| {
            p.calls.insert(id, done);
            p.epoch
        });
        if !self.send(peer, &Data::Call { epoch, id, request }) {
            if let Some(done) = self.with_peer(peer, |p| p.calls.remove(&id)) {
                done(Err(unreachable(peer)));
            }
        }
    }

    /// Fails the calls made before call id `older_than_id` that are still unanswered (the
    /// node's timer runs this; a peer that never answers costs its clients [`CALL_TIMEOUT`]).
    pub fn expire_calls(&self, older_than_id: u64) {
        let mut expired = Vec::new();
        {
            let mut peers = self.peers.lock().expect("peers lock");
            for (peer, state) in peers.iter_mut() {
                let ids: Vec<u64> = state
                    .calls
                    .keys()
                    .copied()
                    .filter(|id| *id < older_than_id)
                    .collect();
                for id in ids {
                    if let Some(done) = state.calls.remove(&id) {
                        expired.push((*peer, done));
                    }
                }
            }
        }
        for (peer, done) in expired {
            done(Err(AmqpError::new(
                INTERNAL_ERROR,
                format!(
                    "node {peer} did not answer within {} s",
                    CALL_TIMEOUT.as_secs()
                ),
            )));
        }
    }

    /// The id the next call will get: calls before it are the ones a timer may expire.
    pub fn call_watermark(&self) -> u64 {
        self.next_call.load(Ordering::Relaxed)
    }

    /// A data frame arrived from `from`.
    pub fn receive(&self, from: u64, payload: Bytes) -> Result<(), String> {
        let data = Data::decode(payload)?;
        // Until the node serves other nodes (it is still recovering), nothing it is sent may be
        // taken: a forward dropped here would be confirmed by the next one's Published{upto}.
        // Refused, the link drops, and the sender's epoch ends with its forwards nacked.
        let Some(handler) = self.handler.get().cloned() else {
            return Err("this node does not serve other nodes yet".into());
        };
        match data {
            Data::Reset { epoch } => {
                self.peer_epoch_seen(from, epoch, &handler);
            }
            Data::Broken { epoch } => {
                if self.epoch(from) == epoch {
                    self.break_client_side(from, &handler);
                }
            }
            Data::Answer { id, result } => {
                if let Some(done) = self.with_peer(from, |p| p.calls.remove(&id)) {
                    done(result.map_err(|(code, text)| AmqpError::with_text(code, text)));
                }
            }
            Data::Published { epoch, .. }
            | Data::Deliver(Deliver { epoch, .. })
            | Data::Cancelled { epoch, .. } => {
                // Of an epoch this node left: the peer requeues once it learns of the new one.
                if epoch == self.epoch(from) {
                    handler.data(from, data);
                }
            }
            Data::Publish { epoch, .. }
            | Data::Settle { epoch, .. }
            | Data::Close { epoch, .. }
            | Data::Qos { epoch, .. }
            | Data::Congested { epoch, .. } => {
                if self.peer_epoch_seen(from, epoch, &handler) {
                    handler.data(from, data);
                }
            }
            Data::Call { epoch, id, .. } => {
                if self.peer_epoch_seen(from, epoch, &handler) {
                    handler.data(from, data);
                } else {
                    self.send(
                        from,
                        &Data::Answer {
                            id,
                            result: Err((INTERNAL_ERROR, "request from a link that broke".into())),
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Notes the epoch a peer's request carried; a newer one voids the stand-ins of its
    /// clients first. False for a request of an epoch the peer has since left.
    fn peer_epoch_seen(&self, from: u64, epoch: u64, handler: &Arc<dyn Handler>) -> bool {
        let newer = self.with_peer(from, |p| {
            if epoch < p.peer_epoch {
                return None;
            }
            let newer = epoch > p.peer_epoch;
            p.peer_epoch = epoch;
            if newer {
                p.broken_pending = false;
            }
            Some(newer)
        });
        match newer {
            None => false,
            Some(true) => {
                handler.server_side_broken(from);
                true
            }
            Some(false) => true,
        }
    }

    /// Ends our epoch with `peer` as its client: pending calls fail, the handler forgets what
    /// our clients had there, and the peer is told.
    fn break_client_side(&self, peer: u64, handler: &Arc<dyn Handler>) {
        let (ended, epoch, calls) = self.with_peer(peer, |p| {
            let ended = p.epoch;
            p.epoch += 1;
            (ended, p.epoch, std::mem::take(&mut p.calls))
        });
        for (_, done) in calls {
            done(Err(unreachable(peer)));
        }
        handler.client_side_broken(peer, ended);
        self.send(peer, &Data::Reset { epoch });
    }

    /// The link to `peer` broke (either direction): both relationships end.
    pub fn link_broken(&self, peer: u64) {
        let Some(handler) = self.handler.get().cloned() else {
            return;
        };
        self.break_client_side(peer, &handler);
        let epoch = self.with_peer(peer, |p| {
            p.broken_pending = true;
            p.peer_epoch
        });
        handler.server_side_broken(peer);
        if self.send(peer, &Data::Broken { epoch }) {
            self.with_peer(peer, |p| p.broken_pending = false);
        }
    }

    /// A link to `peer` came up: it learns our epoch (and of stand-ins we closed) before
    /// anything else we send it. `boot` is the peer's boot id: a restarted peer lost
    /// everything of ours it held.
    pub fn link_up(&self, peer: u64, boot: Option<u64>) {
        let boot = boot.filter(|b| *b != 0);
        let restarted = boot.is_some()
            && self.with_peer(peer, |p| {
                let before = p.boot;
                p.boot = boot;
                before.is_some() && before != boot
            });
        if restarted {
            self.link_broken(peer);
        }
        let (epoch, broken) = self.with_peer(peer, |p| {
            (p.epoch, p.broken_pending.then_some(p.peer_epoch))
        });
        self.send(peer, &Data::Reset { epoch });
        if let Some(e) = broken {
            if self.send(peer, &Data::Broken { epoch: e }) {
                self.with_peer(peer, |p| p.broken_pending = false);
            }
        }
    }
}

fn unreachable(peer: u64) -> AmqpError {
    AmqpError::new(
        INTERNAL_ERROR,
        format!("the link to node {peer} broke before it answered"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn data_arriving_before_the_node_serves_other_nodes_breaks_the_link_not_a_confirm() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = crate::frame::NodeInfo {
            id: 1,
            name: "n1".into(),
            cluster: addr.into(),
            amqp: addr,
            management: None,
            draining: false,
        };
        let transport = Transport::start(
            me,
            1,
            listener,
            crate::transport::Callbacks {
                inbound: Arc::new(|_| {}),
                data: Arc::new(|_, _| Ok(())),
                link_up: Arc::new(|_, _| {}),
                link_broken: Arc::new(|_| {}),
                raft_link: None,
            },
        );
        let messaging = Messaging::new(transport, 1);
        let mut out = BytesMut::new();
        Data::Publish {
            epoch: 5,
            seq: 1,
            vhost: "/".into(),
            queues: vec!["q".into()],
            exchange: Bytes::new(),
            routing_key: Bytes::from_static(b"q"),
            properties: Bytes::new(),
            body: Bytes::from_static(b"m"),
        }
        .encode(&mut out);
        // Taken silently, it would be confirmed by the next forward's Published{upto}.
        assert!(messaging.receive(2, out.freeze()).is_err());
    }

    #[test]
    fn every_data_message_round_trips() {
        let all = vec![
            Data::Reset { epoch: 7 },
            Data::Broken { epoch: 8 },
            Data::Publish {
                epoch: 1,
                seq: 2,
                vhost: "/".into(),
                queues: vec!["a".into(), "b".into()],
                exchange: Bytes::from_static(b"x"),
                routing_key: Bytes::from_static(b"k"),
                properties: Bytes::from_static(b"\x00\x00"),
                body: Bytes::from_static(b"body"),
            },
            Data::Published {
                epoch: 1,
                upto: 9,
                rejected: vec![3, 4],
            },
            Data::Call {
                epoch: 1,
                id: 5,
                request: Request::Purge {
                    vhost: "/".into(),
                    conn: 1,
                    queue: "q".into(),
                },
            },
            Data::Answer {
                id: 5,
                result: Err((404, "no".into())),
            },
            Data::Deliver(Deliver {
                epoch: 1,
                vhost: "/".into(),
                channel: 2,
                consumer_tag: Bytes::from_static(b"ctag"),
                tag: 3,
                redelivered: true,
                no_ack: false,
                exchange: Bytes::new(),
                routing_key: Bytes::from_static(b"q"),
                properties: Bytes::new(),
                body: Bytes::from_static(b"m"),
            }),
            Data::Cancelled {
                epoch: 1,
                vhost: "/".into(),
                channel: 2,
                consumer_tag: Bytes::from_static(b"c"),
            },
            Data::Settle {
                epoch: 1,
                vhost: "v".into(),
                channel: 3,
                op: SettleOp::Requeue,
                tags: vec![1, 2, 3],
            },
            Data::Close {
                epoch: 1,
                vhost: "v".into(),
                channel: 3,
            },
            Data::Qos {
                epoch: 1,
                vhost: "v".into(),
                channel: 3,
                channel_prefetch: 10,
            },
            Data::Congested {
                epoch: 1,
                vhost: "v".into(),
                channel: 3,
                congested: true,
            },
        ];
        for d in all {
            let mut out = BytesMut::new();
            d.encode(&mut out);
            let back = Data::decode(out.clone().freeze()).unwrap();
            assert_eq!(format!("{d:?}"), format!("{back:?}"));
            for cut in 0..out.len() {
                assert!(Data::decode(out.clone().freeze().slice(..cut)).is_err());
            }
        }
    }
}
