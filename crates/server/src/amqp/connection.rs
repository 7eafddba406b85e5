//! One client connection: the handshake, the frame loop, content assembly and closing.
//!
//! The reader side runs here; frames it produces (replies, confirms) and deliveries the broker
//! produces for this connection's consumers all go through the connection's outbox, drained
//! by the [`crate::amqp::writer::Writer`] task, so that everything leaves in order and in batches.

use crate::amqp::channel::Channel;
use crate::amqp::handshake::{handshake, handshake_timed_out};
use crate::Shared;
use warren_store::IdHashMap;

use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use warren_broker::broker::SharedVHost;
use warren_broker::error::{erlang_binary, AmqpError};
use warren_broker::outbox::{Outbox, WriteNow};
use warren_broker::queue::ConnId;
use warren_broker::users::Permissions;
use warren_protocol::amqp::{connection, AMQPClass};
use warren_protocol::constants::*;
use warren_protocol::frame::{self, FrameError};
use warren_protocol::method::Method;
use warren_protocol::PROTOCOL_HEADER;

/// How long a failed handshake, or a node shutting down, waits for close-ok after sending
/// connection.close.
const CLOSE_OK_TIMEOUT: Duration = Duration::from_secs(3);
/// How long an open connection's socket outlives its close handshake at most, with the
/// heartbeat interval when that is shorter (`closing_timeout`): RabbitMQ's CLOSING_TIMEOUT.
/// After the client's close-ok-answered close, the socket stays open (reading and discarding)
/// until the client closes it; after the broker's connection.close, until close-ok. Closing a
/// socket with unread bytes in it makes the kernel send a reset, which a client still writing
/// sees as an error instead of its close-ok; shutting its write side at once shows a client
/// that reads on a half-closed socket.
const CLOSED_LINGER_TIMEOUT: Duration = Duration::from_secs(30);
/// What one read takes while lingering: the bytes are thrown away.
const LINGER_READ_BYTES: usize = 16 * 1024;
const READ_BUFFER_BYTES: usize = 128 * 1024;

/// Why the frame loop stops processing a frame.
pub enum Fault {
    /// Close this channel with the error (the connection goes on).
    Channel(u16, AmqpError, u16, u16),
    /// Close the whole connection with the error.
    Connection(AmqpError, u16, u16),
    /// The peer closed or the socket failed: nothing more to say.
    Gone,
}

impl Fault {
    pub fn conn(code: u16, text: impl std::fmt::Display) -> Fault {
        Fault::Connection(AmqpError::new(code, text), 0, 0)
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct ClientCaps {
    pub consumer_cancel_notify: bool,
    pub connection_blocked: bool,
    pub authentication_failure_close: bool,
}

pub struct Connection {
    pub id: ConnId,
    pub shared: Arc<Shared>,
    pub outbox: Arc<Outbox>,
    pub user: String,
    pub vhost_name: String,
    pub vhost: SharedVHost,
    pub permissions: Permissions,
    pub frame_max: u32,
    pub channel_max: u16,
    pub heartbeat_s: u16,
    pub channels: IdHashMap<u16, Channel>,
    pub caps: ClientCaps,
    pub closing: bool,
    pub finished: bool,
    /// The client closed the connection and was sent close-ok: the socket then stays open,
    /// both ways, until the client closes it (`linger_after_close`). (When the broker closes,
    /// RabbitMQ discards frames until close-ok and then closes the socket at once; so does
    /// warren.)
    pub closed_by_client: bool,
    /// A topology change proposed to the cluster: answered before the next frame is read.
    pub proposal: Option<crate::topology::proposal::Proposal>,
    /// A cluster peer with too much waiting for it, to which this connection forwarded
    /// publishes: reading waits until it drains.
    pub held_by_peer: Option<u64>,
    /// While a transaction commits: what its publishes to queues on other nodes and to quorum
    /// queues wait for (forwards answered, entries applied) before tx.commit-ok.
    pub tx_waits: Option<Vec<crate::durability::Wait>>,
    /// This connection in the node's registry (`None` for the management API's own).
    pub registered: Option<Arc<crate::amqp::registry::Entry>>,
    /// What this connection handed its queues' storage that it has not synced yet.
    pub flow: crate::amqp::flow::Flow,
}

/// Serves one socket accepted on the plain listener until it closes.
pub async fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let deadline = Instant::now() + shared.config.handshake_timeout();
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    let write_now = write_now_for(&stream);
    let (rd, wr) = stream.into_split();
    serve_stream(
        rd,
        wr,
        peer,
        local,
        StreamKind::Plain(write_now),
        deadline,
        shared,
    )
    .await
}

/// How an [`Outbox`] writes through to this socket (see `warren_broker::outbox`): with a
/// descriptor of its own, so that a write after the connection closed can never land on
/// another socket that reused the number.
fn write_now_for(stream: &TcpStream) -> Option<WriteNow> {
    use std::os::fd::{AsFd, AsRawFd};
    let fd = stream.as_fd().try_clone_to_owned().ok()?;
    Some(Box::new(move |bytes: &[u8]| {
        // SAFETY: a non-blocking send on a descriptor this closure owns, from a live buffer.
        let sent = unsafe {
            libc::send(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(sent).unwrap_or(0)
    }))
}

/// What a connection's stream is beyond its halves.
pub enum StreamKind {
    /// Plain TCP, with how its outbox may write to the socket itself.
    Plain(Option<WriteNow>),
    /// TLS, with the client's certificate.
    Tls(crate::tls::TlsPeer),
}

/// Serves one connection over any stream (plain TCP halves, or TLS ones) until it closes;
/// the AMQP handshake must be over by `deadline`. `local` is the address the client reached,
/// which of several listeners it was.
pub async fn serve_stream<R, W>(
    mut rd: R,
    wr: W,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    kind: StreamKind,
    deadline: Instant,
    shared: Arc<Shared>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tls, write_now) = match kind {
        StreamKind::Plain(write_now) => (None, write_now),
        StreamKind::Tls(peer) => (Some(peer), None),
    };
    let mut header = [0u8; 8];
    let got = tokio::time::timeout_at(deadline, rd.read_exact(&mut header)).await;
    let notify = Arc::new(Notify::new());
    let wake_notify = notify.clone();
    let outbox = Outbox::new(
        shared.config.frame_max_bytes,
        Box::new(move || wake_notify.notify_one()),
    );
    if let Some(write_now) = write_now {
        outbox.set_write_now(write_now);
    }
    let heartbeat = Arc::new(AtomicU32::new(0));
    let vhost_slot: Arc<OnceLock<(SharedVHost, ConnId)>> = Arc::new(OnceLock::new());
    let resume_slot = vhost_slot.clone();
    let broker = shared.broker.clone();
    let writer = crate::amqp::writer::Writer {
        socket: wr,
        flush_each_batch: tls.is_some(),
        outbox: outbox.clone(),
        notify,
        heartbeat_s: heartbeat.clone(),
        resume: Arc::new(move || {
            if let Some((v, conn)) = resume_slot.get() {
                v.lock()
                    .expect("vhost lock")
                    .resume_connection(*conn, broker.now_ms());
            }
        }),
    };
    let writer = tokio::spawn(writer.run());
    match got {
        Ok(Ok(_)) if &header == PROTOCOL_HEADER => {}
        Err(_) => {
            handshake_timed_out(&shared, peer, "before the protocol header");
            outbox.close();
            shut(writer).await;
            return;
        }
        _ => {
            // RabbitMQ answers any other header with the one it speaks, then closes.
            outbox.push(|b| b.extend_from_slice(PROTOCOL_HEADER));
            outbox.close();
            shut(writer).await;
            return;
        }
    }
    let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let handshake = tokio::time::timeout_at(
        deadline,
        handshake(&mut rd, &mut buf, &outbox, &shared, peer, tls.as_ref()),
    )
    .await;
    let conn = match handshake {
        Ok(Ok(h)) => h,
        Ok(Err(Some(e))) => {
            send_connection_close(&outbox, &e.0, e.1, e.2);
            wait_close_ok(&mut rd, &mut buf, CLOSE_OK_TIMEOUT).await;
            outbox.close();
            shut(writer).await;
            return;
        }
        Err(_) => {
            handshake_timed_out(&shared, peer, "during the AMQP handshake");
            outbox.close();
            shut(writer).await;
            return;
        }
        Ok(Err(None)) => {
            outbox.close();
            shut(writer).await;
            return;
        }
    };
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    // Counted against the vhost's and user's max-connections until this function returns.
    let _admission = conn.admission;
    heartbeat.store(conn.heartbeat_s as u32, Ordering::Relaxed);
    let entry = Arc::new(crate::amqp::registry::Entry::new(
        id,
        peer,
        local,
        conn.user.clone(),
        conn.vhost_name.clone(),
        conn.client_properties,
        conn.mechanism,
        conn.frame_max,
        conn.channel_max,
        conn.heartbeat_s,
        tls.is_some(),
    ));
    let _ = vhost_slot.set((conn.vhost.clone(), id));
    outbox.set_frame_max(conn.frame_max);
    let mut c = Connection {
        id,
        shared: shared.clone(),
        outbox: outbox.clone(),
        user: conn.user,
        vhost_name: conn.vhost_name,
        vhost: conn.vhost,
        permissions: conn.permissions,
        frame_max: conn.frame_max,
        channel_max: conn.channel_max,
        heartbeat_s: conn.heartbeat_s,
        channels: IdHashMap::default(),
        caps: conn.caps,
        closing: false,
        finished: false,
        closed_by_client: false,
        proposal: None,
        held_by_peer: None,
        tx_waits: None,
        registered: Some(entry.clone()),
        flow: Default::default(),
    };
    tracing::debug!(conn = id, %peer, user = %c.user, vhost = %c.vhost_name, "connection opened");
    shared.connections_open.fetch_add(1, Ordering::Relaxed);
    shared
        .counters
        .connections_opened
        .fetch_add(1, Ordering::Relaxed);
    shared.connections.insert(entry.clone());
    if shared.maintenance.is_draining() {
        // Its handshake ended after a drain closed the others.
        entry.close(crate::node::maintenance::CLOSE_REASON);
    }
    c.run(&mut rd, &mut buf).await;
    shared.connections.remove(id);
    c.cleanup();
    shared.connections_open.fetch_sub(1, Ordering::Relaxed);
    shared
        .counters
        .connections_closed
        .fetch_add(1, Ordering::Relaxed);
    outbox.close();
    let socket = writer.await.ok().flatten();
    if c.closed_by_client {
        let timeout = closing_timeout(c.heartbeat_s);
        linger_after_close(&mut rd, timeout, shared.shutdown.clone()).await;
    }
    if let Some(mut socket) = socket {
        let _ = socket.shutdown().await;
    }
    tracing::debug!(conn = id, "connection closed");
}

/// Waits for the writer to drain the closed outbox, then shuts the socket's write side.
async fn shut<W: AsyncWrite + Unpin>(writer: tokio::task::JoinHandle<Option<W>>) {
    if let Ok(Some(mut socket)) = writer.await {
        let _ = socket.shutdown().await;
    }
}

/// RabbitMQ's bound on a connection's close (`rabbit_reader:close_connection`): the
/// negotiated heartbeat interval when it is shorter than CLOSING_TIMEOUT.
fn closing_timeout(heartbeat_s: u16) -> Duration {
    let heartbeat = Duration::from_secs(heartbeat_s as u64);
    if heartbeat.is_zero() {
        CLOSED_LINGER_TIMEOUT
    } else {
        heartbeat.min(CLOSED_LINGER_TIMEOUT)
    }
}

impl Connection {
    /// A connection without a socket, for the management API: the methods it is given run
    /// through the same channel code as a client's (permissions, cluster proposals, queues on
    /// other nodes) and their replies land in `outbox` for the caller to read.
    pub fn internal(
        shared: Arc<Shared>,
        user: String,
        vhost_name: String,
        vhost: SharedVHost,
        permissions: Permissions,
        outbox: Arc<Outbox>,
    ) -> Connection {
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        Connection {
            id,
            frame_max: shared.config.frame_max_bytes,
            channel_max: shared.config.channel_max,
            shared,
            outbox,
            user,
            vhost_name,
            vhost,
            permissions,
            heartbeat_s: 0,
            channels: IdHashMap::default(),
            caps: ClientCaps::default(),
            closing: false,
            finished: false,
            closed_by_client: false,
            proposal: None,
            held_by_peer: None,
            tx_waits: None,
            registered: None,
            flow: Default::default(),
        }
    }
}

pub(crate) fn control(outbox: &Outbox, channel: u16, class: AMQPClass) {
    let m = Method::Other(class);
    outbox.push(|b| m.encode(channel, b));
}

pub fn send_connection_close(outbox: &Outbox, e: &AmqpError, class_id: u16, method_id: u16) {
    let text = truncate_text(&e.text);
    control(
        outbox,
        0,
        AMQPClass::Connection(connection::AMQPMethod::Close(connection::Close {
            reply_code: e.code,
            reply_text: text.as_str().into(),
            class_id,
            method_id,
        })),
    );
}

/// Reply texts are short strings: RabbitMQ cuts a longer one to 252 bytes and adds "...".
pub fn truncate_text(s: &str) -> String {
    if s.len() <= 255 {
        return s.to_string();
    }
    let mut end = 252;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// After sending connection.close, RabbitMQ discards everything until close-ok (or a timeout).
async fn wait_close_ok<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut, timeout: Duration) {
    let _ = tokio::time::timeout(timeout, async {
        loop {
            match frame::decode(buf, 0) {
                Ok(Some(f)) => {
                    if f.kind == frame::FRAME_METHOD
                        && matches!(
                            Method::decode(f.payload),
                            Ok(Method::Other(AMQPClass::Connection(
                                connection::AMQPMethod::CloseOk(_)
                            )))
                        )
                    {
                        return;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(_) => return,
            }
            match rd.read_buf(buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// Once close-ok answered the client's connection.close, reads and discards whatever the
/// client still sends until it closes its side, `timeout` passes or the node shuts down, as
/// RabbitMQ's reader does in its closed state: the client reads close-ok, not a reset, however many frames it had
/// in flight. The connection's state is already gone; only the socket waits.
async fn linger_after_close<R: AsyncRead + Unpin>(
    rd: &mut R,
    timeout: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    if *shutdown.borrow() {
        return;
    }
    let mut discard = vec![0u8; LINGER_READ_BYTES];
    let _ = tokio::time::timeout(timeout, async {
        loop {
            tokio::select! {
                r = rd.read(&mut discard) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                },
                _ = shutdown.changed() => return,
            }
        }
    })
    .await;
}

impl Connection {
    async fn run<R: AsyncRead + Unpin>(&mut self, rd: &mut R, buf: &mut BytesMut) {
        let mut shutdown = self.shared.shutdown.clone();
        let mut alarm = self.shared.alarms.subscribe();
        let mut durable = self.shared.durability.subscribe();
        // A watch that never changes outside a cluster.
        let (_never, unchanged) = tokio::sync::watch::channel(0u64);
        let mut installs = match &self.shared.cluster {
            Some(c) => c.snapshot_installs(),
            None => unchanged,
        };
        let heartbeat_timeout =
            (self.heartbeat_s != 0).then(|| Duration::from_secs(self.heartbeat_s as u64 * 2));
        let registered = self.registered.clone();
        let close_requested = async {
            match &registered {
                Some(entry) => entry.close_requested().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(close_requested);
        let mut last_read = Instant::now();
        loop {
            let mut held = false;
            let mut throttled = false;
            loop {
                if self.flow.over() && !self.closing {
                    throttled = true;
                    break;
                }
                // Under the memory alarm a publish is not even read, as RabbitMQ blocks the
                // connection at its first publish; other methods (declares, acks) go on.
                if alarm.borrow().any() && !self.closing && super::frames::starts_with_publish(buf)
                {
                    held = true;
                    break;
                }
                match frame::decode(buf, self.frame_max) {
                    Ok(Some(f)) => {
                        if let Err(fault) = self.handle_frame(f) {
                            self.fault(fault);
                        }
                        if let Some(p) = self.proposal.take() {
                            let outcome = p.answer.await;
                            if let Err(fault) =
                                self.finish_proposal(p.number, p.reply, p.nowait, outcome)
                            {
                                self.fault(fault);
                            }
                        }
                        if self.finished {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let text = match e {
                            FrameError::TooLarge {
                                kind, size, max, ..
                            } => {
                                format!("type {kind}, all octets = <<>>: {{frame_too_large,{size},{max}}}")
                            }
                            FrameError::BadFrameEnd {
                                kind,
                                payload,
                                found,
                                ..
                            } => {
                                format!("type {kind}, all octets = {}: {{invalid_frame_end_marker,{found}}}", erlang_binary(&payload))
                            }
                        };
                        self.fault(Fault::conn(FRAME_ERROR, text));
                        break;
                    }
                }
            }
            self.flush_confirms();
            crate::queues::quorum::client::flush_settles(&self.shared);
            if self.closing {
                // A node shutting down does not wait a client's full closing timeout.
                let timeout = if *self.shared.shutdown.borrow() {
                    CLOSE_OK_TIMEOUT
                } else {
                    closing_timeout(self.heartbeat_s)
                };
                wait_close_ok(rd, buf, timeout).await;
                return;
            }
            if throttled {
                if !self.wait_for_queues(&mut durable, &mut shutdown).await {
                    return;
                }
                last_read = Instant::now();
                continue;
            }
            if let Some(peer) = self.held_by_peer.take() {
                self.wait_for_peer(peer, &shutdown).await;
            }
            if held {
                let state = *alarm.borrow();
                let reason = self.shared.alarms.reason(&state);
                if self.caps.connection_blocked {
                    control(
                        &self.outbox,
                        0,
                        AMQPClass::Connection(connection::AMQPMethod::Blocked(
                            connection::Blocked {
                                reason: reason.into(),
                            },
                        )),
                    );
                }
                while alarm.borrow().any() {
                    tokio::select! {
                        r = alarm.changed() => if r.is_err() { return },
                        _ = shutdown.changed() => {
                            self.shutdown();
                            return;
                        }
                    }
                }
                if self.caps.connection_blocked {
                    control(
                        &self.outbox,
                        0,
                        AMQPClass::Connection(connection::AMQPMethod::Unblocked(
                            connection::Unblocked {},
                        )),
                    );
                }
                last_read = Instant::now();
                continue;
            }
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(READ_BUFFER_BYTES);
            }
            let deadline = heartbeat_timeout
                .map(|t| last_read + t)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
            tokio::select! {
                r = rd.read_buf(buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(_) => last_read = Instant::now(),
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(conn = self.id, "missed heartbeats from client, closing");
                    return;
                }
                // The WAL synced something: publisher confirms may be due (sent at the loop's top).
                r = durable.changed(), if self.has_pending_confirms() => if r.is_err() { return },
                _ = shutdown.changed() => {
                    self.shutdown();
                }
                // DELETE /api/connections/{name}: RabbitMQ's 320 with the operator's reason.
                reason = &mut close_requested, if !self.closing => {
                    self.fault(Fault::conn(CONNECTION_FORCED, reason));
                }
                r = installs.changed() => {
                    if r.is_ok() && !self.closing {
                        // The node's topology was replaced from a snapshot: this connection's
                        // vhost is a stale copy; the client reconnects to the current one.
                        self.fault(Fault::Connection(
                            AmqpError::new(
                                CONNECTION_FORCED,
                                "the node caught up with the cluster from a snapshot; reconnect",
                            ),
                            0,
                            0,
                        ));
                    }
                }
            }
        }
    }

    /// Waits until everything this connection asked of the storage engine is synced (a few
    /// milliseconds at most: the WAL writer syncs continuously), so that a close handshake
    /// means its acks survive a crash.
    /// Err when the engine has stopped: what was asked of it will never be durable.
    pub fn sync_store(&self) -> Result<(), warren_store::Error> {
        match &self.shared.store {
            Some(store) => store.sync(),
            None => Ok(()),
        }
    }

    pub(crate) fn shutdown(&mut self) {
        if !self.closing {
            self.fault(Fault::Connection(
                AmqpError::new(
                    CONNECTION_FORCED,
                    "broker forced connection closure with reason 'shutdown'",
                ),
                0,
                0,
            ));
        }
    }

    fn fault(&mut self, fault: Fault) {
        match fault {
            Fault::Gone => self.finished = true,
            Fault::Channel(number, e, class_id, method_id) => {
                if e.is_hard() {
                    return self.fault(Fault::Connection(e, class_id, method_id));
                }
                tracing::debug!(conn = self.id, channel = number, error = %e.text, "closing channel");
                self.flush_confirms();
                self.close_channel_state(number);
                if let Some(ch) = self.channels.get_mut(&number) {
                    ch.closing = true;
                }
                let text = truncate_text(&e.text);
                control(
                    &self.outbox,
                    number,
                    AMQPClass::Channel(warren_protocol::amqp::channel::AMQPMethod::Close(
                        warren_protocol::amqp::channel::Close {
                            reply_code: e.code,
                            reply_text: text.as_str().into(),
                            class_id,
                            method_id,
                        },
                    )),
                );
            }
            Fault::Connection(e, class_id, method_id) => {
                if self.closing {
                    return;
                }
                tracing::debug!(conn = self.id, error = %e.text, "closing connection");
                self.flush_confirms();
                send_connection_close(&self.outbox, &e, class_id, method_id);
                self.closing = true;
                self.cleanup();
            }
        }
    }

    /// Releases the broker-side state of every channel and the connection's exclusive queues.
    pub fn cleanup(&mut self) {
        let numbers: Vec<u16> = self.channels.keys().copied().collect();
        for n in numbers {
            self.close_channel_state(n);
        }
        // In a cluster the guard's drop has the exclusive queues deleted on every node.
        self.meta_vhost().connection_closed(self.id);
    }

    /// Forgets a channel in the broker (requeueing its unacked messages); the number stays
    /// reserved while a close handshake is in flight.
    pub fn close_channel_state(&mut self, number: u16) {
        let Some(ch) = self.channels.get_mut(&number) else {
            return;
        };
        if !ch.registered {
            return;
        }
        ch.registered = false;
        self.shared.counters.channel_closed(ch.publisher);
        let key = ch.key;
        let now = self.shared.broker.now_ms();
        self.meta_vhost().channel_close(key, now);
        // Its confirm streams to quorum queues: nothing waits on them any more.
        let groups = self.shared.durability.forget_quorum_channel(key);
        crate::queues::quorum::client::publisher_closed(&self.shared, key, &groups);
    }
}
