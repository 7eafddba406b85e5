//! Links between nodes: one outbound TCP connection to each peer carries everything this node
//! sends it, batched; what peers send arrives on the connections they opened to us.
//!
//! Batching: senders append encoded frames to the peer's buffer and wake its link task, which
//! writes the whole buffer with one `write_all`. While a write is in flight, frames pile up and
//! go out together in the next one, so a busy link makes few large writes and an idle one costs
//! nothing but its pings.
//!
//! Flow control: a peer's buffer is bounded ([`PEER_BUFFER_BYTES_MAX`]); past it, frames are
//! dropped and counted (Raft retransmits what a peer did not acknowledge), and inbound frames are
//! read only as fast as the node takes them, so TCP pushes back on a peer that sends too much.
//!
//! Failure detection is per node, not per queue or group: each link pings every
//! [`PING_INTERVAL`]; a peer that answered nothing for [`DOWN_AFTER`] is down.

use crate::frame::{self, Frame, NodeInfo};
use bytes::BytesMut;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// How often each link pings its peer.
pub const PING_INTERVAL: Duration = Duration::from_millis(100);
/// A peer silent this long (no pong) is down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1_000);
/// How long a link waits before dialling again after a failure.
const RECONNECT_DELAY: Duration = Duration::from_millis(200);
/// Frames waiting for one peer, in bytes, beyond which new ones are dropped.
pub const PEER_BUFFER_BYTES_MAX: usize = 64 << 20;
const READ_BUFFER_BYTES: usize = 64 << 10;

/// What arrives from peers, for the node's loop.
#[derive(Debug)]
pub enum Inbound {
    Hello(NodeInfo),
    Raft {
        from: u64,
        group: u64,
        messages: Vec<raft::eraftpb::Message>,
    },
}

/// One peer's link: its send buffer and its counters.
struct Peer {
    addr: Mutex<Option<SocketAddr>>,
    buffer: Mutex<BytesMut>,
    wake: Notify,
    connected: AtomicBool,
    /// Microseconds since the transport's epoch of the last pong; 0 if none.
    last_pong_us: AtomicU64,
    rtt_us: AtomicU64,
    bytes_out: AtomicU64,
    batches_out: AtomicU64,
    bytes_in: AtomicU64,
    frames_in: AtomicU64,
    dropped: AtomicU64,
    started: AtomicBool,
}

impl Peer {
    fn new() -> Peer {
        Peer {
            addr: Mutex::new(None),
            buffer: Mutex::new(BytesMut::new()),
            wake: Notify::new(),
            connected: AtomicBool::new(false),
            last_pong_us: AtomicU64::new(0),
            rtt_us: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            batches_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            frames_in: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            started: AtomicBool::new(false),
        }
    }
}

/// A link's counters, for `/metrics`, `/api/nodes` and `warren ctl cluster_status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkStats {
    pub peer: u64,
    pub connected: bool,
    pub up: bool,
    pub rtt_us: u64,
    pub bytes_out: u64,
    pub batches_out: u64,
    pub bytes_in: u64,
    pub frames_in: u64,
    pub dropped: u64,
}

struct Inner {
    me: NodeInfo,
    epoch: Instant,
    peers: Mutex<HashMap<u64, Arc<Peer>>>,
    deliver: Arc<dyn Fn(Inbound) + Send + Sync>,
}

/// The node's links to its peers.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

impl Transport {
    /// Accepts peers' links on `listener`; what they send is handed to `deliver`.
    pub fn start(
        me: NodeInfo,
        listener: TcpListener,
        deliver: Arc<dyn Fn(Inbound) + Send + Sync>,
    ) -> Transport {
        let t = Transport {
            inner: Arc::new(Inner {
                me,
                epoch: Instant::now(),
                peers: Mutex::new(HashMap::new()),
                deliver,
            }),
        };
        let accepting = t.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let t = accepting.clone();
                        tokio::spawn(async move { t.serve_inbound(stream).await });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cluster accept failed");
                        tokio::time::sleep(RECONNECT_DELAY).await;
                    }
                }
            }
        });
        t
    }

    fn clock_us(&self) -> u64 {
        self.inner.epoch.elapsed().as_micros() as u64 + 1
    }

    fn peer(&self, id: u64) -> Arc<Peer> {
        self.inner
            .peers
            .lock()
            .expect("peers lock")
            .entry(id)
            .or_insert_with(|| Arc::new(Peer::new()))
            .clone()
    }

    /// Makes sure a link to peer `id` at `addr` is being kept up (dialling again after
    /// failures); a new address replaces the old one at the next dial.
    pub fn connect(&self, id: u64, addr: SocketAddr) {
        if id == self.inner.me.id {
            return;
        }
        let peer = self.peer(id);
        *peer.addr.lock().expect("addr lock") = Some(addr);
        if peer.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let t = self.clone();
        tokio::spawn(async move { t.run_link(id, peer).await });
    }

    /// Queues Raft messages of `group` for peer `to`, as one frame; false if the link is down
    /// or its buffer full: they are dropped, and Raft sends again what is not acknowledged
    /// (stale messages piled up for a dead peer would only be replayed to it when it returns).
    pub fn send_raft(&self, to: u64, group: u64, messages: &[raft::eraftpb::Message]) -> bool {
        let peer = self.peer(to);
        let mut buffer = peer.buffer.lock().expect("buffer lock");
        if !peer.connected.load(Ordering::Relaxed) || buffer.len() > PEER_BUFFER_BYTES_MAX {
            peer.dropped
                .fetch_add(messages.len() as u64, Ordering::Relaxed);
            return false;
        }
        frame::encode_raft(&mut buffer, group, messages);
        drop(buffer);
        peer.wake.notify_one();
        true
    }

    /// Whether peer `id` answered a ping within [`DOWN_AFTER`].
    pub fn is_up(&self, id: u64) -> bool {
        if id == self.inner.me.id {
            return true;
        }
        let Some(peer) = self
            .inner
            .peers
            .lock()
            .expect("peers lock")
            .get(&id)
            .cloned()
        else {
            return false;
        };
        let last = peer.last_pong_us.load(Ordering::Relaxed);
        peer.connected.load(Ordering::Relaxed)
            && last != 0
            && self.clock_us().saturating_sub(last) < DOWN_AFTER.as_micros() as u64
    }

    pub fn links(&self) -> Vec<LinkStats> {
        let peers: Vec<(u64, Arc<Peer>)> = self
            .inner
            .peers
            .lock()
            .expect("peers lock")
            .iter()
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        let mut out: Vec<LinkStats> = peers
            .into_iter()
            .map(|(id, p)| LinkStats {
                peer: id,
                connected: p.connected.load(Ordering::Relaxed),
                up: self.is_up(id),
                rtt_us: p.rtt_us.load(Ordering::Relaxed),
                bytes_out: p.bytes_out.load(Ordering::Relaxed),
                batches_out: p.batches_out.load(Ordering::Relaxed),
                bytes_in: p.bytes_in.load(Ordering::Relaxed),
                frames_in: p.frames_in.load(Ordering::Relaxed),
                dropped: p.dropped.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by_key(|l| l.peer);
        out
    }

    /// Keeps the outbound link to one peer up: dial, hello, then write batches and pings until
    /// the connection fails; then dial again.
    async fn run_link(self, id: u64, peer: Arc<Peer>) {
        loop {
            let addr = *peer.addr.lock().expect("addr lock");
            let Some(addr) = addr else {
                tokio::time::sleep(RECONNECT_DELAY).await;
                continue;
            };
            if let Ok(Ok(stream)) = tokio::time::timeout(DOWN_AFTER, TcpStream::connect(addr)).await
            {
                let _ = stream.set_nodelay(true);
                tracing::info!(peer = id, %addr, "cluster link up");
                self.drive_link(stream, &peer).await;
                peer.connected.store(false, Ordering::Relaxed);
                peer.buffer.lock().expect("buffer lock").clear();
                tracing::info!(peer = id, %addr, "cluster link down");
            }
            tokio::time::sleep(RECONNECT_DELAY).await;
        }
    }

    async fn drive_link(&self, stream: TcpStream, peer: &Arc<Peer>) {
        let (mut rd, mut wr) = stream.into_split();
        let mut hello = BytesMut::new();
        frame::encode_hello(&mut hello, &self.inner.me);
        if wr.write_all(&hello).await.is_err() {
            return;
        }
        peer.connected.store(true, Ordering::Relaxed);
        // Pongs come back on this connection; the reader ends with it.
        let reading = {
            let peer = peer.clone();
            let t = self.clone();
            tokio::spawn(async move {
                let mut buf = BytesMut::with_capacity(4096);
                loop {
                    match rd.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    loop {
                        match frame::decode(&mut buf) {
                            Ok(Some(Frame::Pong(sent))) => {
                                let now = t.clock_us();
                                peer.rtt_us
                                    .store(now.saturating_sub(sent), Ordering::Relaxed);
                                peer.last_pong_us.store(now, Ordering::Relaxed);
                            }
                            Ok(Some(_)) => {}
                            Ok(None) => break,
                            Err(_) => return,
                        }
                    }
                }
            })
        };
        let mut next_ping = Instant::now();
        let mut out = BytesMut::new();
        loop {
            if reading.is_finished() {
                break;
            }
            if Instant::now() >= next_ping {
                frame::encode_ping(&mut out, frame::KIND_PING, self.clock_us());
                next_ping = Instant::now() + PING_INTERVAL;
            }
            {
                let mut buffer = peer.buffer.lock().expect("buffer lock");
                if !buffer.is_empty() {
                    peer.batches_out.fetch_add(1, Ordering::Relaxed);
                    out.extend_from_slice(&buffer);
                    buffer.clear();
                }
            }
            if !out.is_empty() {
                if wr.write_all(&out).await.is_err() {
                    break;
                }
                peer.bytes_out
                    .fetch_add(out.len() as u64, Ordering::Relaxed);
                out.clear();
            }
            tokio::select! {
                _ = peer.wake.notified() => {}
                _ = tokio::time::sleep_until(next_ping.into()) => {}
            }
        }
        reading.abort();
    }

    /// Reads one peer's inbound link: hello first, then frames for the node; pings are answered
    /// on the same connection.
    async fn serve_inbound(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        let mut from: Option<(u64, Arc<Peer>)> = None;
        let mut reply = BytesMut::new();
        loop {
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if let Some((_, p)) = &from {
                        p.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
            loop {
                let f = match frame::decode(&mut buf) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "bad frame from a cluster peer, dropping link");
                        return;
                    }
                };
                match (f, &from) {
                    (Frame::Hello(info), _) => {
                        let peer = self.peer(info.id);
                        // A peer that dialled us is one we want to reach back.
                        self.connect(info.id, info.cluster);
                        from = Some((info.id, peer));
                        (self.inner.deliver)(Inbound::Hello(info));
                    }
                    (_, None) => {
                        tracing::warn!("cluster peer sent frames before hello, dropping link");
                        return;
                    }
                    (Frame::Ping(t), Some(_)) => {
                        frame::encode_ping(&mut reply, frame::KIND_PONG, t);
                    }
                    (Frame::Pong(_), Some(_)) => {}
                    (Frame::Raft { group, messages }, Some((id, p))) => {
                        p.frames_in.fetch_add(1, Ordering::Relaxed);
                        (self.inner.deliver)(Inbound::Raft {
                            from: *id,
                            group,
                            messages,
                        });
                    }
                }
            }
            if !reply.is_empty() {
                if wr.write_all(&reply).await.is_err() {
                    return;
                }
                reply.clear();
            }
        }
    }
}
