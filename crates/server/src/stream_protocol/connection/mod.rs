//! One stream protocol connection as a state machine: [`Connection::handle`] takes a decoded
//! command and sends its answers (and anything it starts: deliveries, confirms) as
//! [`Command`]s on the connection's outgoing channel; [`Flow`] says whether to go on. No
//! socket here: the listener's loop feeds it frames, durability changes and [`Control`]s, and
//! tests feed it commands and read the channel.
//!
//! The phases are RabbitMQ's: peer properties, SASL handshake and authenticate, tune (the
//! server proposes, the client answers), open (the vhost), then the stream commands. A
//! command out of its phase closes the connection, as `rabbit_stream_reader` does.
//!
//! The map: this file holds the state, the phases and the dispatch of every command;
//! [`handshake`] authenticates and opens the vhost, [`streams`] creates, deletes and describes
//! streams, [`publishing`] declares publishers and hands their publishes to the writer, and
//! [`subscriptions`] runs readers, credit and single active consumer groups.

mod handshake;
mod publishing;
mod streams;
mod subscriptions;

pub use streams::declare_arguments;

use super::registry::{
    ConnectionInfo, ConsumerCounters, ConsumerInfo, Control, PublisherCounters, PublisherInfo,
};
use super::subscription::{self, SubscriptionControl};
use super::super_stream;
use crate::durability::Wait;
use crate::queues::stream::writer::{StreamWriter, TRACKING_REFERENCE_BYTES_MAX};
use crate::Shared;
use amq_protocol_types::{AMQPValue, FieldTable};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc;
use warren_broker::broker::SharedVHost;
use warren_broker::command::{Command as Topo, Outcome};
use warren_broker::error::AmqpError;
use warren_broker::users::Permissions;
use warren_protocol::stream::constants::*;
use warren_protocol::stream::{Broker, Command, CommandVersion, OffsetSpec, StreamMetadata};

/// The heartbeat the server proposes in Tune, RabbitMQ's `stream.heartbeat` default.
pub const HEARTBEAT_DEFAULT_S: u32 = 60;
/// The server's product properties, as RabbitMQ's stream plugin sends them. The version is
/// 3.11's: clients gate single active consumer, super streams and ExchangeCommandVersions on
/// it, and warren serves them.
pub const SERVER_VERSION: &str = "3.11.28";

/// Whether the connection goes on after a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Close the socket once what was sent is written.
    Close,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    PeerProperties,
    Sasl,
    Tune,
    Open,
    Opened,
    /// The server sent Close and waits for the answer.
    Closing,
}

struct Publisher {
    stream: String,
    reference: Option<String>,
    writer: Arc<StreamWriter>,
    counters: Arc<PublisherCounters>,
}

/// A single active consumer group: (stream, name).
type GroupKey = (String, String);

struct Subscription {
    stream: String,
    writer: Arc<StreamWriter>,
    offset: OffsetSpec,
    control: Arc<SubscriptionControl>,
    counters: Arc<ConsumerCounters>,
    group: Option<GroupKey>,
    /// Its reader runs (it is no group's inactive member).
    started: bool,
}

/// A Publish frame's confirm (or error) waiting for its messages' sync.
struct PendingConfirm {
    publisher_id: u8,
    ids: Vec<u64>,
    wait: Wait,
    counters: Arc<PublisherCounters>,
}

/// Who a connection is: fixed at accept.
#[derive(Debug, Clone)]
pub struct Peer {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub tls: bool,
}

pub struct Connection {
    shared: Arc<Shared>,
    out: mpsc::UnboundedSender<Command>,
    control: mpsc::UnboundedSender<Control>,
    pub id: u64,
    who: Peer,
    phase: Phase,
    /// The largest frame accepted, size prefix included: the server's offer until tuned.
    frame_max: u32,
    heartbeat_s: u32,
    user: String,
    mechanism_offered: Vec<String>,
    vhost_name: String,
    vhost: Option<SharedVHost>,
    permissions: Option<Permissions>,
    client_properties: Vec<(String, String)>,
    publishers: BTreeMap<u8, Publisher>,
    subscriptions: BTreeMap<u8, Subscription>,
    confirms: Vec<PendingConfirm>,
    /// ConsumerUpdate requests sent, by correlation id: the subscription they activate.
    consumer_updates: HashMap<u32, u8>,
    next_correlation: u32,
    registered: bool,
    /// The server sent Close.
    close_sent: bool,
}

/// The node's offered frame max (size prefix included).
pub fn frame_max_offered() -> u32 {
    FRAME_MAX_DEFAULT_BYTES
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Connection {
    pub fn new(
        shared: Arc<Shared>,
        who: Peer,
        out: mpsc::UnboundedSender<Command>,
        control: mpsc::UnboundedSender<Control>,
    ) -> Connection {
        let mechanism_offered = shared
            .config
            .auth_mechanisms
            .iter()
            .filter(|m| matches!(m.as_str(), "PLAIN" | "AMQPLAIN"))
            .cloned()
            .collect();
        Connection {
            id: shared.next_conn.fetch_add(1, Relaxed),
            shared,
            out,
            control,
            who,
            phase: Phase::PeerProperties,
            frame_max: frame_max_offered(),
            heartbeat_s: HEARTBEAT_DEFAULT_S,
            user: String::new(),
            mechanism_offered,
            vhost_name: String::new(),
            vhost: None,
            permissions: None,
            client_properties: Vec::new(),
            publishers: BTreeMap::new(),
            subscriptions: BTreeMap::new(),
            confirms: Vec::new(),
            consumer_updates: HashMap::new(),
            next_correlation: 0,
            registered: false,
            close_sent: false,
        }
    }

    /// The largest frame to accept now, size prefix included.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// The negotiated heartbeat in seconds (0: none); the server's proposal until tuned.
    pub fn heartbeat_s(&self) -> u32 {
        self.heartbeat_s
    }

    /// Whether the client finished its handshake (open).
    pub fn is_open(&self) -> bool {
        self.registered
    }

    /// Whether the server sent Close and waits for the client's answer before it closes the
    /// socket (a failed login or a refused vhost closes at once, as RabbitMQ does).
    pub fn awaits_close_answer(&self) -> bool {
        self.phase == Phase::Closing && self.close_sent
    }

    fn send(&self, c: Command) {
        let _ = self.out.send(c);
    }

    fn respond(&self, key: u16, correlation_id: u32, code: u16) {
        self.send(Command::Response {
            key,
            correlation_id,
            code,
        });
    }

    /// Closes the connection with `code`: the client is told why (Close), and the socket
    /// closes once it answered or after a grace period.
    pub fn close_with(&mut self, code: u16, reason: &str) -> Flow {
        tracing::info!(peer = %self.who.peer, code, reason, "stream connection closed by the server");
        self.next_correlation += 1;
        self.send(Command::Close {
            correlation_id: self.next_correlation,
            code,
            reason: reason.to_string(),
        });
        self.phase = Phase::Closing;
        self.close_sent = true;
        Flow::Close
    }

    /// A frame the decoder refused: closed with the response code it maps to.
    pub fn bad_frame(&mut self, e: &warren_protocol::stream::DecodeError) -> Flow {
        tracing::warn!(peer = %self.who.peer, error = %e, "bad stream protocol frame");
        self.close_with(e.response_code(), &e.to_string())
    }

    pub async fn handle(&mut self, command: Command) -> Flow {
        use Command as C;
        match (self.phase, command) {
            (_, C::Heartbeat) => Flow::Continue,
            (
                _,
                C::Close {
                    correlation_id,
                    code,
                    reason,
                },
            ) => {
                tracing::debug!(peer = %self.who.peer, code, reason, "stream client closes");
                self.respond(KEY_CLOSE, correlation_id, RESPONSE_CODE_OK);
                Flow::Close
            }
            // The client's answer to the server's Close.
            (Phase::Closing, C::Response { key: KEY_CLOSE, .. }) => Flow::Close,
            (Phase::Closing, _) => Flow::Continue,
            (
                Phase::PeerProperties,
                C::PeerProperties {
                    correlation_id,
                    properties,
                },
            ) => {
                self.client_properties = properties;
                self.send(C::PeerPropertiesResponse {
                    correlation_id,
                    code: RESPONSE_CODE_OK,
                    properties: server_properties(),
                });
                self.phase = Phase::Sasl;
                Flow::Continue
            }
            (Phase::Sasl, C::SaslHandshake { correlation_id }) => {
                self.send(C::SaslHandshakeResponse {
                    correlation_id,
                    code: RESPONSE_CODE_OK,
                    mechanisms: self.mechanism_offered.clone(),
                });
                Flow::Continue
            }
            (
                Phase::Sasl,
                C::SaslAuthenticate {
                    correlation_id,
                    mechanism,
                    data,
                },
            ) => self.authenticate(correlation_id, &mechanism, &data),
            (
                Phase::Tune,
                C::Tune {
                    frame_max,
                    heartbeat_s,
                },
            ) => {
                // The lower of the two, 0 being "no limit" on either side; the server's own
                // limit stays, since a frame is buffered whole.
                let offered = frame_max_offered();
                self.frame_max = if frame_max == 0 {
                    offered
                } else {
                    frame_max.min(offered)
                };
                self.heartbeat_s = match (heartbeat_s, HEARTBEAT_DEFAULT_S) {
                    (0, s) | (s, 0) => s,
                    (a, b) => a.min(b),
                };
                self.phase = Phase::Open;
                Flow::Continue
            }
            (
                Phase::Open,
                C::Open {
                    correlation_id,
                    virtual_host,
                },
            ) => self.open(correlation_id, virtual_host),
            (Phase::Opened, command) => self.opened(command).await,
            (phase, command) => {
                let why = format!(
                    "command 0x{:04x} not expected {}",
                    command.wire_key(),
                    match phase {
                        Phase::PeerProperties => "before peer properties",
                        Phase::Sasl => "before authentication",
                        Phase::Tune => "before tune",
                        Phase::Open => "before open",
                        Phase::Opened | Phase::Closing => "once open",
                    }
                );
                self.close_with(RESPONSE_CODE_UNKNOWN_FRAME, &why)
            }
        }
    }

    /// The host and port clients are told to connect to: the configured ones, else the
    /// address the client reached.
    fn advertised(&self) -> (String, u16) {
        let c = &self.shared.config;
        (
            c.stream_advertised_host
                .clone()
                .unwrap_or_else(|| self.who.local.ip().to_string()),
            c.stream_advertised_port.unwrap_or(self.who.local.port()),
        )
    }

    fn vhost(&self) -> &SharedVHost {
        self.vhost.as_ref().expect("an open connection has a vhost")
    }

    /// Whether the user may `access` the stream (queue) `name`, as AMQP 0-9-1 checks it.
    fn allowed(&self, access: Access, name: &str) -> bool {
        let Some(p) = &self.permissions else {
            return false;
        };
        match access {
            Access::Configure => p.configure.matches(name),
            Access::Write => p.write.matches(name),
            Access::Read => p.read.matches(name),
        }
    }

    /// The writer of stream `name` of the connection's vhost, or the response code why not.
    fn writer_of(&self, name: &str) -> Result<Arc<StreamWriter>, u16> {
        let found = self.vhost().lock().expect("vhost lock").stream_of(name);
        let Some((log, config)) = found else {
            return Err(RESPONSE_CODE_STREAM_DOES_NOT_EXIST);
        };
        self.shared
            .streams
            .get(log, &config, &self.shared.durability)
            .map_err(|e| {
                tracing::error!(stream = name, error = %e, "stream not opened");
                RESPONSE_CODE_STREAM_NOT_AVAILABLE
            })
    }

    async fn opened(&mut self, command: Command) -> Flow {
        use Command as C;
        match command {
            C::DeclarePublisher {
                correlation_id,
                publisher_id,
                reference,
                stream,
            } => {
                let code = self.declare_publisher(publisher_id, reference, stream);
                self.respond(KEY_DECLARE_PUBLISHER, correlation_id, code);
            }
            C::Publish {
                publisher_id,
                messages,
            } => self.publish(publisher_id, messages),
            C::QueryPublisherSequence {
                correlation_id,
                reference,
                stream,
            } => {
                let (code, sequence) = match self.writer_of(&stream) {
                    Ok(w) => (
                        RESPONSE_CODE_OK,
                        w.publisher_sequence(&reference).unwrap_or(0),
                    ),
                    Err(code) => (code, 0),
                };
                self.send(C::QueryPublisherSequenceResponse {
                    correlation_id,
                    code,
                    sequence,
                });
            }
            C::DeletePublisher {
                correlation_id,
                publisher_id,
            } => {
                let code = match self.publishers.remove(&publisher_id) {
                    Some(_) => {
                        self.shared.stream_connections.update(self.id, |c| {
                            c.publishers.remove(&publisher_id);
                        });
                        RESPONSE_CODE_OK
                    }
                    None => RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST,
                };
                self.respond(KEY_DELETE_PUBLISHER, correlation_id, code);
            }
            C::Subscribe {
                correlation_id,
                subscription_id,
                stream,
                offset,
                credit,
                properties,
            } => self.subscribe(
                correlation_id,
                subscription_id,
                stream,
                offset,
                credit,
                properties,
            ),
            C::Credit {
                subscription_id,
                credit,
            } => match self.subscriptions.get(&subscription_id) {
                Some(s) => {
                    s.counters.credit.fetch_add(u64::from(credit), Relaxed);
                    s.control.add_credit(credit);
                }
                None => self.send(C::CreditResponse {
                    code: RESPONSE_CODE_SUBSCRIPTION_ID_DOES_NOT_EXIST,
                    subscription_id,
                }),
            },
            C::Unsubscribe {
                correlation_id,
                subscription_id,
            } => {
                let code = if self.unsubscribe(subscription_id) {
                    RESPONSE_CODE_OK
                } else {
                    RESPONSE_CODE_SUBSCRIPTION_ID_DOES_NOT_EXIST
                };
                self.respond(KEY_UNSUBSCRIBE, correlation_id, code);
            }
            C::StoreOffset {
                reference,
                stream,
                offset,
            } => {
                // No response in the protocol: a bad one is logged and dropped, as RabbitMQ.
                if reference.is_empty() || reference.len() > TRACKING_REFERENCE_BYTES_MAX {
                    tracing::warn!(stream, "store offset with an empty or too long reference");
                } else if !self.allowed(Access::Read, &stream) {
                    tracing::warn!(stream, user = %self.user, "store offset refused: no read access");
                } else if let Ok(w) = self.writer_of(&stream) {
                    w.store_offset(&reference, offset);
                }
            }
            C::QueryOffset {
                correlation_id,
                reference,
                stream,
            } => {
                let (code, offset) = match self.writer_of(&stream) {
                    Ok(w) => match w.stored_offset(&reference) {
                        Some(o) => (RESPONSE_CODE_OK, o),
                        None => (RESPONSE_CODE_NO_OFFSET, 0),
                    },
                    Err(code) => (code, 0),
                };
                self.send(C::QueryOffsetResponse {
                    correlation_id,
                    code,
                    offset,
                });
            }
            C::Create {
                correlation_id,
                stream,
                arguments,
            } => {
                let code = self.create(stream, arguments).await;
                self.respond(KEY_CREATE, correlation_id, code);
            }
            C::Delete {
                correlation_id,
                stream,
            } => {
                let code = self.delete(stream).await;
                self.respond(KEY_DELETE, correlation_id, code);
            }
            C::Metadata {
                correlation_id,
                streams,
            } => self.metadata(correlation_id, streams),
            C::Route {
                correlation_id,
                routing_key,
                super_stream,
            } => {
                let (code, streams) = super_stream::route(
                    &self.vhost().lock().expect("vhost lock"),
                    &super_stream,
                    &routing_key,
                );
                self.send(C::RouteResponse {
                    correlation_id,
                    code,
                    streams,
                });
            }
            C::Partitions {
                correlation_id,
                super_stream,
            } => {
                let (code, streams) = super_stream::partitions(
                    &self.vhost().lock().expect("vhost lock"),
                    &super_stream,
                );
                self.send(C::PartitionsResponse {
                    correlation_id,
                    code,
                    streams,
                });
            }
            C::ConsumerUpdateResponse {
                correlation_id,
                offset,
                ..
            } => self.consumer_update_answered(correlation_id, offset),
            C::ExchangeCommandVersions { correlation_id, .. } => {
                self.send(C::ExchangeCommandVersionsResponse {
                    correlation_id,
                    code: RESPONSE_CODE_OK,
                    versions: served_versions(),
                })
            }
            C::StreamStats {
                correlation_id,
                stream,
            } => {
                let (code, stats) = match self.writer_of(&stream) {
                    Ok(w) => (RESPONSE_CODE_OK, stream_stats(&w)),
                    Err(code) => (code, Vec::new()),
                };
                self.send(C::StreamStatsResponse {
                    correlation_id,
                    code,
                    stats,
                });
            }
            C::CreateSuperStream {
                correlation_id,
                name,
                partitions,
                binding_keys,
                arguments,
            } => {
                let code = if !self.allowed(Access::Configure, &name) {
                    RESPONSE_CODE_ACCESS_REFUSED
                } else {
                    super_stream::create(
                        &self.shared,
                        &self.vhost_name,
                        &name,
                        &partitions,
                        &binding_keys,
                        &arguments,
                    )
                    .await
                };
                self.respond(KEY_CREATE_SUPER_STREAM, correlation_id, code);
            }
            C::DeleteSuperStream {
                correlation_id,
                name,
            } => {
                let code = if !self.allowed(Access::Configure, &name) {
                    RESPONSE_CODE_ACCESS_REFUSED
                } else {
                    super_stream::delete(&self.shared, &self.vhost_name, &name).await
                };
                self.respond(KEY_DELETE_SUPER_STREAM, correlation_id, code);
            }
            // The answer to a Close the server sent, or any other response: nothing to do.
            C::Response { .. } => {}
            other => {
                return self.close_with(
                    RESPONSE_CODE_UNKNOWN_FRAME,
                    &format!(
                        "command 0x{:04x} is not one a client sends",
                        other.wire_key()
                    ),
                )
            }
        }
        Flow::Continue
    }

    /// What another part of the node tells this connection.
    pub fn control(&mut self, control: Control) -> Flow {
        match control {
            Control::StreamDeleted { vhost, stream } => {
                if vhost != self.vhost_name {
                    return Flow::Continue;
                }
                let publishers: Vec<u8> = self
                    .publishers
                    .iter()
                    .filter(|(_, p)| p.stream == stream)
                    .map(|(id, _)| *id)
                    .collect();
                let subscriptions: Vec<u8> = self
                    .subscriptions
                    .iter()
                    .filter(|(_, s)| s.stream == stream)
                    .map(|(id, _)| *id)
                    .collect();
                if publishers.is_empty() && subscriptions.is_empty() {
                    return Flow::Continue;
                }
                for id in publishers {
                    self.publishers.remove(&id);
                    self.shared.stream_connections.update(self.id, |c| {
                        c.publishers.remove(&id);
                    });
                }
                for id in subscriptions {
                    self.unsubscribe(id);
                }
                self.send(Command::MetadataUpdate {
                    code: RESPONSE_CODE_STREAM_NOT_AVAILABLE,
                    stream,
                });
                Flow::Continue
            }
            Control::Activate { subscription_id } => {
                if self.subscriptions.contains_key(&subscription_id) {
                    self.ask_activation(subscription_id);
                }
                Flow::Continue
            }
            Control::Close { reason } => {
                self.close_with(RESPONSE_CODE_OK, &reason);
                Flow::Close
            }
        }
    }

    /// The connection ends: its subscriptions stop (their groups hand over), it leaves the
    /// registry. Confirms not sent are lost with the connection, as in RabbitMQ (the
    /// messages are stored all the same).
    pub fn end(&mut self) {
        let ids: Vec<u8> = self.subscriptions.keys().copied().collect();
        for id in ids {
            self.unsubscribe(id);
        }
        self.publishers.clear();
        if self.registered {
            self.shared.stream_connections.unregister(self.id);
            self.registered = false;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.end();
    }
}

#[derive(Debug, Clone, Copy)]
enum Access {
    Configure,
    Write,
    Read,
}

/// The stream protocol's answer for a refused topology change.
fn code_of(e: &AmqpError) -> u16 {
    match e.code {
        warren_protocol::constants::ACCESS_REFUSED => RESPONSE_CODE_ACCESS_REFUSED,
        warren_protocol::constants::PRECONDITION_FAILED => RESPONSE_CODE_PRECONDITION_FAILED,
        warren_protocol::constants::NOT_FOUND => RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
        _ => RESPONSE_CODE_INTERNAL_ERROR,
    }
}

fn server_properties() -> Vec<(String, String)> {
    vec![
        ("product".into(), "RabbitMQ".into()),
        ("version".into(), SERVER_VERSION.into()),
        ("platform".into(), "Rust".into()),
        ("warren_version".into(), env!("CARGO_PKG_VERSION").into()),
        (
            "copyright".into(),
            "warren, speaking RabbitMQ's stream protocol".into(),
        ),
        (
            "information".into(),
            "Licensed under the MPL 2.0. Website: https://rabbitmq.com".into(),
        ),
    ]
}

/// The commands this server serves and their versions, for ExchangeCommandVersions. Deliver
/// stays at version 1: a chunk is sent as stored, with no committed offset ahead of it.
fn served_versions() -> Vec<CommandVersion> {
    (KEY_DECLARE_PUBLISHER..=KEY_DELETE_SUPER_STREAM)
        .filter(|k| *k != KEY_DELIVER)
        .filter_map(|key| version_max(key).map(|max| CommandVersion { key, min: 1, max }))
        .chain([CommandVersion {
            key: KEY_DELIVER,
            min: 1,
            max: 1,
        }])
        .collect()
}

/// StreamStats' figures: the first chunk still held and the last committed one (-1 for an
/// empty stream).
fn stream_stats(writer: &StreamWriter) -> Vec<(String, i64)> {
    let o = writer.handle.overview();
    let last = o
        .next_seq
        .checked_sub(1)
        .filter(|s| *s >= o.first_seq)
        .and_then(|s| writer.handle.chunk_by_seq(s).ok().flatten())
        .map_or(-1, |c| c.record.chunk_id as i64);
    let first = if o.next_offset > o.first_offset {
        o.first_offset as i64
    } else {
        -1
    };
    vec![
        ("first_chunk_id".into(), first),
        ("committed_chunk_id".into(), last),
    ]
}
