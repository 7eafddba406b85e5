//! One stream protocol connection as a state machine: [`Connection::handle`] takes a decoded
//! command and sends its answers (and anything it starts: deliveries, confirms) as
//! [`Command`]s on the connection's outgoing channel; [`Flow`] says whether to go on. No
//! socket here: the listener's loop feeds it frames, durability changes and [`Control`]s, and
//! tests feed it commands and read the channel.
//!
//! The phases are RabbitMQ's: peer properties, SASL handshake and authenticate, tune (the
//! server proposes, the client answers), open (the vhost), then the stream commands. A
//! command out of its phase closes the connection, as `rabbit_stream_reader` does.

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
        matches!(self.phase, Phase::Opened | Phase::Closing)
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

    fn authenticate(&mut self, correlation_id: u32, mechanism: &str, data: &[u8]) -> Flow {
        let refuse = |me: &mut Connection, code: u16, why: &str| {
            me.shared.counters.auth_failures.fetch_add(1, Relaxed);
            tracing::warn!(peer = %me.who.peer, mechanism, "stream login refused: {why}");
            me.send(Command::SaslAuthenticateResponse {
                correlation_id,
                code,
                challenge: Default::default(),
            });
            // RabbitMQ closes the socket after a failed login.
            me.phase = Phase::Closing;
            Flow::Close
        };
        if !self.mechanism_offered.iter().any(|m| m == mechanism) {
            return refuse(
                self,
                RESPONSE_CODE_SASL_MECHANISM_NOT_SUPPORTED,
                &format!("mechanism {mechanism} not offered"),
            );
        }
        let (user, password) = match crate::amqp::handshake::credentials(mechanism, data) {
            Ok(c) => c,
            Err(e) => return refuse(self, RESPONSE_CODE_SASL_ERROR, &e.text),
        };
        let authenticated = self
            .shared
            .broker
            .users
            .read()
            .expect("users lock")
            .authenticate(&user, &password);
        if !authenticated {
            return refuse(
                self,
                RESPONSE_CODE_AUTHENTICATION_FAILURE,
                &format!("invalid credentials for user '{user}'"),
            );
        }
        if crate::amqp::handshake::loopback_refused(
            &self.shared.config.loopback_users,
            &user,
            self.who.peer.ip(),
        ) {
            return refuse(
                self,
                RESPONSE_CODE_SASL_AUTHENTICATION_FAILURE_LOOPBACK,
                &format!("user '{user}' may only connect via localhost"),
            );
        }
        self.user = user;
        self.send(Command::SaslAuthenticateResponse {
            correlation_id,
            code: RESPONSE_CODE_OK,
            challenge: Default::default(),
        });
        self.send(Command::Tune {
            frame_max: frame_max_offered(),
            heartbeat_s: HEARTBEAT_DEFAULT_S,
        });
        self.phase = Phase::Tune;
        Flow::Continue
    }

    fn open(&mut self, correlation_id: u32, vhost_name: String) -> Flow {
        let vhost = self.shared.broker.vhost(&vhost_name);
        let permissions = self
            .shared
            .broker
            .users
            .read()
            .expect("users lock")
            .permissions(&self.user, &vhost_name)
            .cloned();
        let (Some(vhost), Some(permissions)) = (vhost, permissions) else {
            tracing::warn!(peer = %self.who.peer, user = %self.user, vhost = %vhost_name,
                "stream connection refused access to the vhost");
            self.send(Command::OpenResponse {
                correlation_id,
                code: RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE,
                properties: Vec::new(),
            });
            self.phase = Phase::Closing;
            return Flow::Close;
        };
        self.vhost = Some(vhost);
        self.permissions = Some(permissions);
        self.vhost_name = vhost_name;
        let (host, port) = self.advertised();
        self.send(Command::OpenResponse {
            correlation_id,
            code: RESPONSE_CODE_OK,
            properties: vec![
                ("advertised_host".into(), host),
                ("advertised_port".into(), port.to_string()),
            ],
        });
        self.phase = Phase::Opened;
        self.shared.stream_connections.register(
            ConnectionInfo {
                id: self.id,
                peer: self.who.peer,
                local: self.who.local,
                user: self.user.clone(),
                vhost: self.vhost_name.clone(),
                tls: self.who.tls,
                frame_max: self.frame_max,
                heartbeat_s: self.heartbeat_s,
                client_properties: self.client_properties.clone(),
                connected_at_ms: now_ms(),
                publishers: BTreeMap::new(),
                consumers: BTreeMap::new(),
            },
            self.control.clone(),
        );
        self.registered = true;
        Flow::Continue
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
                Some(s) => s.control.add_credit(credit),
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

    fn declare_publisher(&mut self, publisher_id: u8, reference: String, stream: String) -> u16 {
        if self.publishers.contains_key(&publisher_id) {
            return RESPONSE_CODE_PRECONDITION_FAILED;
        }
        if reference.len() > TRACKING_REFERENCE_BYTES_MAX {
            return RESPONSE_CODE_PRECONDITION_FAILED;
        }
        let writer = match self.writer_of(&stream) {
            Ok(w) => w,
            Err(code) => return code,
        };
        if !self.allowed(Access::Write, &stream) {
            return RESPONSE_CODE_ACCESS_REFUSED;
        }
        let reference = (!reference.is_empty()).then_some(reference);
        // RabbitMQ refuses a second publisher of the same reference on a stream.
        if reference.is_some()
            && self
                .publishers
                .values()
                .any(|p| p.stream == stream && p.reference == reference)
        {
            return RESPONSE_CODE_PRECONDITION_FAILED;
        }
        let counters = Arc::new(PublisherCounters::default());
        let info = PublisherInfo {
            publisher_id,
            stream: stream.clone(),
            reference: reference.clone().unwrap_or_default(),
            counters: counters.clone(),
        };
        self.shared.stream_connections.update(self.id, |c| {
            c.publishers.insert(publisher_id, info);
        });
        self.publishers.insert(
            publisher_id,
            Publisher {
                stream,
                reference,
                writer,
                counters,
            },
        );
        RESPONSE_CODE_OK
    }

    fn publish(
        &mut self,
        publisher_id: u8,
        messages: Vec<warren_protocol::stream::PublishedMessage>,
    ) {
        let Some(p) = self.publishers.get(&publisher_id) else {
            self.send(Command::PublishError {
                publisher_id,
                errors: messages
                    .iter()
                    .map(|m| (m.publishing_id, RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST))
                    .collect(),
            });
            return;
        };
        let ids: Vec<u64> = messages.iter().map(|m| m.publishing_id).collect();
        p.counters.published.fetch_add(ids.len() as u64, Relaxed);
        self.shared
            .counters
            .published
            .fetch_add(ids.len() as u64, Relaxed);
        let appended = p.writer.append_published(
            p.reference.as_deref(),
            messages.into_iter().map(|m| (m.publishing_id, m.message)),
        );
        match appended {
            None => {
                p.counters.errored.fetch_add(ids.len() as u64, Relaxed);
                self.send(Command::PublishError {
                    publisher_id,
                    errors: ids
                        .iter()
                        .map(|id| (*id, RESPONSE_CODE_STREAM_NOT_AVAILABLE))
                        .collect(),
                });
            }
            Some(a) => match a.wait {
                None => {
                    p.counters.confirmed.fetch_add(ids.len() as u64, Relaxed);
                    self.send(Command::PublishConfirm {
                        publisher_id,
                        publishing_ids: ids,
                    });
                }
                Some(wait) => {
                    let counters = p.counters.clone();
                    self.confirms.push(PendingConfirm {
                        publisher_id,
                        ids,
                        wait,
                        counters,
                    });
                    // It may be synced already.
                    self.settle_confirms();
                }
            },
        }
    }

    /// Sends the confirms (and errors) of the publishes whose messages were synced (or
    /// whose stream stopped taking them) since the last look.
    pub fn settle_confirms(&mut self) {
        if self.confirms.is_empty() {
            return;
        }
        let durability = self.shared.durability.clone();
        let mut confirmed: BTreeMap<u8, Vec<u64>> = BTreeMap::new();
        let mut failed: BTreeMap<u8, Vec<(u64, u16)>> = BTreeMap::new();
        self.confirms.retain_mut(|c| {
            let w = [c.wait];
            if durability.all_durable(&w) {
                c.counters.confirmed.fetch_add(c.ids.len() as u64, Relaxed);
                confirmed
                    .entry(c.publisher_id)
                    .or_default()
                    .append(&mut c.ids);
                false
            } else if durability.any_refused(&w) {
                c.counters.errored.fetch_add(c.ids.len() as u64, Relaxed);
                failed.entry(c.publisher_id).or_default().extend(
                    c.ids
                        .iter()
                        .map(|id| (*id, RESPONSE_CODE_STREAM_NOT_AVAILABLE)),
                );
                false
            } else {
                true
            }
        });
        for (publisher_id, publishing_ids) in confirmed {
            self.shared
                .counters
                .confirmed
                .fetch_add(publishing_ids.len() as u64, Relaxed);
            self.send(Command::PublishConfirm {
                publisher_id,
                publishing_ids,
            });
        }
        for (publisher_id, errors) in failed {
            self.send(Command::PublishError {
                publisher_id,
                errors,
            });
        }
    }

    /// Publishes waiting for their confirms.
    pub fn confirms_pending(&self) -> usize {
        self.confirms.len()
    }

    fn subscribe(
        &mut self,
        correlation_id: u32,
        subscription_id: u8,
        stream: String,
        offset: OffsetSpec,
        credit: u16,
        properties: Vec<(String, String)>,
    ) {
        let respond = |me: &Connection, code| me.respond(KEY_SUBSCRIBE, correlation_id, code);
        if self.subscriptions.contains_key(&subscription_id) {
            return respond(self, RESPONSE_CODE_SUBSCRIPTION_ID_ALREADY_EXISTS);
        }
        let writer = match self.writer_of(&stream) {
            Ok(w) => w,
            Err(code) => return respond(self, code),
        };
        if !self.allowed(Access::Read, &stream) {
            return respond(self, RESPONSE_CODE_ACCESS_REFUSED);
        }
        let property = |k: &str| {
            properties
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let single_active = property("single-active-consumer") == Some("true");
        let group = match (single_active, property("name")) {
            (false, _) => None,
            (true, Some(name)) if !name.is_empty() => Some((stream.clone(), name.to_string())),
            // A single active consumer needs a name to be grouped by.
            (true, _) => return respond(self, RESPONSE_CODE_PRECONDITION_FAILED),
        };
        let control = Arc::new(SubscriptionControl::new(credit));
        let counters = Arc::new(ConsumerCounters::default());
        counters.credit.store(u64::from(credit), Relaxed);
        let active = match &group {
            None => true,
            Some(key) => {
                self.shared
                    .stream_groups
                    .join(&self.vhost_name, key, self.id, subscription_id)
            }
        };
        self.shared.stream_connections.update(self.id, |c| {
            c.consumers.insert(
                subscription_id,
                ConsumerInfo {
                    subscription_id,
                    stream: stream.clone(),
                    properties: properties.clone(),
                    active,
                    counters: counters.clone(),
                },
            );
        });
        self.subscriptions.insert(
            subscription_id,
            Subscription {
                stream,
                writer,
                offset,
                control,
                counters,
                group: group.clone(),
                started: false,
            },
        );
        respond(self, RESPONSE_CODE_OK);
        match (group, active) {
            (None, _) => self.start_reader(subscription_id, offset),
            // The active member of a group asks its client where to start.
            (Some(_), true) => self.ask_activation(subscription_id),
            (Some(_), false) => {}
        }
    }

    fn start_reader(&mut self, subscription_id: u8, offset: OffsetSpec) {
        let Some(s) = self.subscriptions.get_mut(&subscription_id) else {
            return;
        };
        if s.started {
            return;
        }
        s.started = true;
        subscription::start(
            s.writer.clone(),
            s.stream.clone(),
            subscription_id,
            offset,
            s.control.clone(),
            s.counters.clone(),
            self.out.clone(),
        );
    }

    fn ask_activation(&mut self, subscription_id: u8) {
        self.next_correlation += 1;
        let correlation_id = self.next_correlation;
        self.consumer_updates
            .insert(correlation_id, subscription_id);
        self.shared.stream_connections.update(self.id, |c| {
            if let Some(consumer) = c.consumers.get_mut(&subscription_id) {
                consumer.active = true;
            }
        });
        self.send(Command::ConsumerUpdate {
            correlation_id,
            subscription_id,
            active: true,
        });
    }

    fn consumer_update_answered(&mut self, correlation_id: u32, offset: Option<OffsetSpec>) {
        let Some(subscription_id) = self.consumer_updates.remove(&correlation_id) else {
            return;
        };
        let Some(s) = self.subscriptions.get(&subscription_id) else {
            return;
        };
        let offset = offset.unwrap_or(s.offset);
        self.start_reader(subscription_id, offset);
    }

    /// Ends a subscription; false when there was none. Its group, if any, hands over.
    fn unsubscribe(&mut self, subscription_id: u8) -> bool {
        let Some(s) = self.subscriptions.remove(&subscription_id) else {
            return false;
        };
        s.control.stop();
        self.shared.stream_connections.update(self.id, |c| {
            c.consumers.remove(&subscription_id);
        });
        if let Some(key) = s.group {
            if let Some((conn, sub)) =
                self.shared
                    .stream_groups
                    .leave(&self.vhost_name, &key, self.id, subscription_id)
            {
                if conn == self.id {
                    self.ask_activation(sub);
                } else {
                    self.shared.stream_connections.tell(
                        conn,
                        Control::Activate {
                            subscription_id: sub,
                        },
                    );
                }
            }
        }
        true
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

    async fn create(&mut self, stream: String, arguments: Vec<(String, String)>) -> u16 {
        if !self.allowed(Access::Configure, &stream) {
            return RESPONSE_CODE_ACCESS_REFUSED;
        }
        let table = match declare_arguments(&arguments) {
            Ok(t) => t,
            Err(why) => {
                tracing::info!(stream, why, "stream create refused");
                return RESPONSE_CODE_PRECONDITION_FAILED;
            }
        };
        let existed = self
            .vhost()
            .lock()
            .expect("vhost lock")
            .stream_of(&stream)
            .is_some();
        let command = Topo::QueueDeclare {
            vhost: self.vhost_name.clone(),
            conn: self.id,
            name: stream.clone(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            server_named: false,
            arguments: table,
            log_id: crate::topology::placement::rand_log_id(),
            node: String::new(),
            members: Vec::new(),
            at_unix_ms: now_ms(),
        };
        match crate::topology::of(&self.shared).change(command).await {
            Ok(_) if existed => RESPONSE_CODE_STREAM_ALREADY_EXISTS,
            Ok(_) => RESPONSE_CODE_OK,
            Err(e) => {
                tracing::info!(stream, error = %e.text, "stream create refused");
                code_of(&e)
            }
        }
    }

    async fn delete(&mut self, stream: String) -> u16 {
        let exists = self
            .vhost()
            .lock()
            .expect("vhost lock")
            .stream_of(&stream)
            .is_some();
        if !exists {
            return RESPONSE_CODE_STREAM_DOES_NOT_EXIST;
        }
        if !self.allowed(Access::Configure, &stream) {
            return RESPONSE_CODE_ACCESS_REFUSED;
        }
        let command = Topo::QueueDelete {
            vhost: self.vhost_name.clone(),
            conn: self.id,
            name: stream.clone(),
        };
        match crate::topology::of(&self.shared).change(command).await {
            Ok(Outcome::QueueDeleted { existed: false, .. }) => RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
            Ok(_) => {
                self.shared
                    .stream_connections
                    .stream_deleted(&self.vhost_name, &stream);
                RESPONSE_CODE_OK
            }
            Err(e) => code_of(&e),
        }
    }

    fn metadata(&mut self, correlation_id: u32, streams: Vec<String>) {
        let v = self.vhost().lock().expect("vhost lock");
        let mut out = Vec::with_capacity(streams.len());
        let mut any = false;
        for stream in streams {
            let exists = v.stream_of(&stream).is_some();
            any |= exists;
            out.push(if exists {
                StreamMetadata {
                    stream,
                    code: RESPONSE_CODE_OK,
                    leader: 0,
                    replicas: Vec::new(),
                }
            } else {
                StreamMetadata {
                    stream,
                    code: RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
                    leader: u16::MAX,
                    replicas: Vec::new(),
                }
            });
        }
        drop(v);
        let (host, port) = self.advertised();
        let brokers = if any {
            vec![Broker {
                reference: 0,
                host,
                port: u32::from(port),
            }]
        } else {
            Vec::new()
        };
        self.send(Command::MetadataResponse {
            correlation_id,
            brokers,
            streams: out,
        });
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

/// A Create's arguments as the queue declare arguments RabbitMQ's stream manager makes of
/// them (`x-` prefixed, numbers as numbers), so a stream created either way is the same
/// queue record and a redeclare compares alike. Unreadable values are refused here (RabbitMQ
/// 3.10 crashes on them and never answers); unknown keys are ignored, as RabbitMQ does.
pub fn declare_arguments(arguments: &[(String, String)]) -> Result<FieldTable, String> {
    let mut table = FieldTable::default();
    table.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    for (key, value) in arguments {
        let number = || {
            value
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .map(AMQPValue::LongLongInt)
                .ok_or_else(|| format!("{key} must be a number, got '{value}'"))
        };
        match key.as_str() {
            "max-length-bytes" => {
                table.insert("x-max-length-bytes".into(), number()?);
            }
            "stream-max-segment-size-bytes" => {
                table.insert("x-stream-max-segment-size-bytes".into(), number()?);
            }
            "initial-cluster-size" => {
                table.insert("x-initial-cluster-size".into(), number()?);
            }
            "max-age" => {
                if warren_broker::stream_args::parse_duration_ms(value).is_none() {
                    return Err(format!(
                        "max-age must be a duration such as 7D, got '{value}'"
                    ));
                }
                table.insert(
                    "x-max-age".into(),
                    AMQPValue::LongString(value.as_str().into()),
                );
            }
            "queue-leader-locator" => {
                table.insert(
                    "x-queue-leader-locator".into(),
                    AMQPValue::LongString(value.as_str().into()),
                );
            }
            _ => {}
        }
    }
    Ok(table)
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
