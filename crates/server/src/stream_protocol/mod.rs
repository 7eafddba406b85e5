//! RabbitMQ's stream protocol (`rabbitmq_stream`, 3.10-3.13) on `--stream-listen` and
//! `--stream-tls-listen`: a stream client (the official Java, Rust, Go, .NET clients,
//! stream-perf-test) creates streams, publishes with confirms and deduplication, subscribes
//! from any offset with chunk credit, stores its offsets on the server, and uses super streams
//! and single active consumers, over the very streams AMQP 0-9-1 clients use.
//!
//! The map:
//! - [`connection`]: one connection as a state machine: phases (peer properties, SASL, tune,
//!   open), then every command; answers go out as `Command`s on a channel. No socket.
//! - [`subscription`]: a subscription's reader task: committed chunks sent as stored, one per
//!   credit.
//! - [`groups`]: single active consumer groups across the node's connections.
//! - [`super_stream`]: route, partitions, and creating and deleting super streams.
//! - [`registry`]: the node's stream connections, publishers and consumers with their
//!   counters, for listings (`warren ctl`, the management API).
//! - this file: the listener's accept loop and each connection's socket loop.
//!
//! A frame flows: socket -> `frame::decode` (bounded by the negotiated frame max) ->
//! [`connection::Connection::handle`] -> the stream's writer (`queues::stream`), whose round
//! syncs and moves the committed offset -> the durability watch wakes the socket loop, which
//! sends the confirms; subscriptions' readers wake on the committed offset and send chunks.

pub mod connection;
pub mod groups;
pub mod registry;
pub mod subscription;
pub mod super_stream;

#[cfg(test)]
mod tests;

pub use groups::Groups;
pub use registry::Registry;

use crate::Shared;
use bytes::BytesMut;
use connection::{Connection, Flow, Peer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use warren_protocol::stream::{frame, Command};

/// Most bytes of frames written with one syscall.
const WRITE_BATCH_BYTES_MAX: usize = 1 << 20;
/// How long a closing connection waits for its client's answer to Close.
const CLOSE_GRACE: Duration = Duration::from_millis(1_000);
/// Read buffer kept between reads.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Accepts stream connections on `listener` (plain, or TLS with `tls`) until the node stops.
pub async fn accept(listener: TcpListener, tls: bool, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let _ = socket.set_nodelay(true);
                        let Ok(local) = socket.local_addr() else { return };
                        let who = Peer { peer, local, tls };
                        if !tls {
                            let (rd, wr) = socket.into_split();
                            return serve(rd, wr, who, shared).await;
                        }
                        let Some(certificates) = shared.tls.clone() else { return };
                        let deadline = Instant::now() + shared.config.handshake_timeout();
                        let handshake = crate::tls::handshake(
                            &certificates, socket, crate::tls::Listener::Amqps);
                        match tokio::time::timeout_at(deadline.into(), handshake).await {
                            Ok(Ok(stream)) => {
                                let (rd, wr) = tokio::io::split(stream);
                                serve(rd, wr, who, shared).await;
                            }
                            Ok(Err((_, why))) => {
                                tracing::warn!(%peer, why, "stream TLS handshake failed");
                            }
                            Err(_) => tracing::warn!(%peer, "stream TLS handshake timed out"),
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "stream accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

/// Writes the connection's outgoing commands, many per syscall, until every sender is gone.
async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::UnboundedReceiver<Command>) {
    let mut buf = BytesMut::with_capacity(64 << 10);
    while let Some(first) = rx.recv().await {
        frame::encode(&mut buf, &first);
        while buf.len() < WRITE_BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(c) => frame::encode(&mut buf, &c),
                Err(_) => break,
            }
        }
        if wr.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
    }
    let _ = wr.flush().await;
    let _ = wr.shutdown().await;
}

/// Serves one stream connection over `rd`/`wr` until it closes.
pub async fn serve<R, W>(mut rd: R, wr: W, who: Peer, shared: Arc<Shared>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let peer = who.peer;
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (control_tx, mut control_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_loop(wr, out_rx));
    let mut conn = Connection::new(shared.clone(), who, out_tx.clone(), control_tx);
    let mut durability = shared.durability.subscribe();
    let mut shutdown = shared.shutdown.clone();
    let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let started = Instant::now();
    let mut last_read = Instant::now();
    let mut last_heartbeat_sent = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let handshake_timeout = shared.config.handshake_timeout();
    let mut closing: Option<Instant> = None;
    'conn: loop {
        if closing.is_some_and(|at| at.elapsed() >= CLOSE_GRACE) {
            break;
        }
        tokio::select! {
            read = rd.read_buf(&mut buf) => {
                match read {
                    Ok(0) | Err(_) => break 'conn,
                    Ok(_) => last_read = Instant::now(),
                }
                loop {
                    match frame::decode(&mut buf, conn.frame_max()) {
                        Ok(Some(command)) => {
                            if conn.handle(command).await == Flow::Close {
                                if !conn.is_open() || closing.is_some() {
                                    break 'conn;
                                }
                                // Wait for the client's answer to our Close, or for its own
                                // Close's answer to go out.
                                closing.get_or_insert_with(Instant::now);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            conn.bad_frame(&e);
                            // The stream is out of step: nothing more is read from it.
                            break 'conn;
                        }
                    }
                }
                if buf.capacity() - buf.len() < 4096 && buf.is_empty() {
                    buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
                }
            }
            changed = durability.changed(), if conn.confirms_pending() > 0 => {
                if changed.is_err() {
                    break;
                }
                conn.settle_confirms();
            }
            Some(control) = control_rx.recv() => {
                if conn.control(control) == Flow::Close {
                    closing.get_or_insert_with(Instant::now);
                }
            }
            _ = tick.tick() => {
                if !conn.is_open() && started.elapsed() >= handshake_timeout {
                    tracing::warn!(%peer, "stream connection closed: handshake not finished in time");
                    break;
                }
                let heartbeat = Duration::from_secs(u64::from(conn.heartbeat_s()));
                if conn.is_open() && !heartbeat.is_zero() {
                    if last_read.elapsed() >= heartbeat * 2 {
                        tracing::warn!(%peer, "stream connection closed: missed heartbeats");
                        break;
                    }
                    if last_heartbeat_sent.elapsed() >= heartbeat {
                        let _ = out_tx.send(Command::Heartbeat);
                        last_heartbeat_sent = Instant::now();
                    }
                }
            }
            _ = shutdown.changed(), if closing.is_none() => {
                conn.close_with(
                    warren_protocol::stream::constants::RESPONSE_CODE_OK,
                    "the node is shutting down",
                );
                closing = Some(Instant::now());
            }
        }
    }
    conn.end();
    drop(conn);
    drop(out_tx);
    // The readers' senders go as they see their stop; what was sent is written first.
    let _ = tokio::time::timeout(CLOSE_GRACE, writer).await;
    tracing::debug!(%peer, "stream connection ended");
}

/// Binds the stream listeners the config asks for.
pub fn bind(
    config: &crate::node::config::ServerConfig,
) -> Result<(Option<TcpListener>, Option<TcpListener>), String> {
    let plain = config
        .stream_listen
        .map(|a| crate::bind_listener(a).map_err(|e| format!("{e}: the stream protocol listener")))
        .transpose()?;
    let tls = config
        .stream_tls_listen
        .map(|a| {
            crate::bind_listener(a).map_err(|e| format!("{e}: the stream protocol TLS listener"))
        })
        .transpose()?;
    Ok((plain, tls))
}

/// The address a stream listener was bound to, for logs.
pub fn describe(l: &TcpListener) -> Option<SocketAddr> {
    l.local_addr().ok()
}
