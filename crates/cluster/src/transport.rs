//! Links between nodes: one outbound TCP connection to each peer carries everything this node
//! sends it, batched; what peers send arrives on the connections they opened to us.
//!
//! Batching: senders append encoded frames to the peer's buffer and wake its link task, which
//! writes the whole buffer with one `write_all`. While a write is in flight, frames pile up and
//! go out together in the next one, so a busy link makes few large writes and an idle one costs
//! nothing but its pings.
//!
//! Writing through: the queue groups' loop queues a round's frames for every peer
//! ([`Transport::queue_raft`]) and then flushes ([`Transport::flush_queued`]). A plain TCP link
//! whose task is not writing gets them from the loop's own thread, with one non-blocking write
//! of the socket; only what does not fit (or a TLS link, or one busy writing) wakes the link's
//! task. A quiet message crosses several links, and at each of them the task's wake-up was a
//! context switch on its path.
//!
//! The raft link ([`RaftLinkOut`]): quorum queues' Raft frames take a second plain TCP
//! connection to the peer, which the peer's groups loop reads itself
//! ([`RaftLinkSocket`]), so a frame costs the peer one wake-up rather than two.
//!
//! Flow control: a peer's buffer is bounded ([`PEER_BUFFER_BYTES_MAX`]); past it, frames are
//! dropped and counted (Raft retransmits what a peer did not acknowledge), and inbound frames are
//! read only as fast as the node takes them, so TCP pushes back on a peer that sends too much.
//!
//! Failure detection is per node, not per queue or group: each link pings every
//! [`PING_INTERVAL`]; a peer that answered nothing for [`DOWN_AFTER`] is down, and a link
//! silent that long in either direction is dropped and dialled again. Raft frames may be lost
//! with it (Raft resends); data frames may too, so each drop is reported to the
//! [`crate::messaging`] layer, which voids what the two nodes' clients had on each other.
//!
//! Data frames are never dropped while a link is up: their senders hold off instead when a
//! peer's buffer is past [`crate::messaging::CONGESTED_BYTES`].
//!
//! With `--cluster-tls-*` ([`crate::link_tls`]), each link is a TLS 1.3 stream with both
//! nodes' certificates checked before the first frame: the framing, batching and pings above
//! run unchanged over it (the reader and writer are generic over the stream's halves).

use crate::address::HostPort;
use crate::frame::{self, Frame, Hello, NodeInfo};
use crate::link_tls::LinkTls;
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
/// The generation of an inbound connection that is not a peer's link (hello with boot 0).
const NOT_A_LINK: u64 = u64::MAX;
/// How long a node asked who it is may take to answer (name resolution included).
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(3);

/// Resolves `addr` and connects to the first of its addresses that answers, each within
/// [`DOWN_AFTER`]: the stream and the address it reached.
async fn dial(addr: &HostPort) -> Result<(TcpStream, SocketAddr), String> {
    let resolved = tokio::time::timeout(DOWN_AFTER * 3, addr.resolve())
        .await
        .map_err(|_| {
            format!(
                "{addr} did not resolve within {} s",
                (DOWN_AFTER * 3).as_secs()
            )
        })??;
    let mut last = String::new();
    for a in resolved {
        match tokio::time::timeout(DOWN_AFTER, TcpStream::connect(a)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, a));
            }
            Ok(Err(e)) => last = format!("cannot reach {addr} ({a}): {e}"),
            Err(_) => last = format!("no answer from {addr} ({a})"),
        }
    }
    Err(last)
}

/// What the transport tells the rest of the node.
pub struct Callbacks {
    /// Hellos and Raft frames, for the metadata group's loop.
    pub inbound: Arc<dyn Fn(Inbound) + Send + Sync>,
    /// A data frame from a peer, handled on the link's reader, in order; `Err` drops the link.
    pub data: Arc<dyn Fn(u64, Bytes) -> Result<(), String> + Send + Sync>,
    /// A link to the peer came up: our outbound one (`None`), or its inbound one with the
    /// peer's boot id.
    pub link_up: Arc<dyn Fn(u64, Option<u64>) + Send + Sync>,
    /// A link with the peer (either direction) ended after it was up.
    pub link_broken: Arc<dyn Fn(u64) + Send + Sync>,
    /// Takes a peer's raft link (see [`RaftLinkSocket`]); `None`: the node opens none, and
    /// quorum queues' Raft frames travel on the main links.
    pub raft_link: Option<Arc<dyn Fn(RaftLinkSocket) + Send + Sync>>,
}

/// A peer's inbound raft link, handed over to the queue groups' loop, which reads it itself:
/// its socket (non-blocking) and what was read past the hello.
pub struct RaftLinkSocket {
    pub from: u64,
    pub socket: std::net::TcpStream,
    pub buffered: BytesMut,
    /// Counts what the reader took from it (bytes, frames) in the peer's link statistics.
    pub count_in: Box<dyn Fn(u64, u64) + Send>,
}

/// What arrives from peers, for the node's loop.
#[derive(Debug)]
pub enum Inbound {
    Hello(NodeInfo),
    Raft {
        from: u64,
        group: u64,
        messages: Vec<raft::eraftpb::Message>,
    },
    CatchUp {
        from: u64,
        message: crate::catch_up::CatchUpMessage,
    },
}

/// What waits to be written to one peer, and who may write it. The bytes are always the
/// unwritten tail of the link's stream: whoever writes takes from their head, under the lock,
/// and never while the link task has a batch in flight.
#[derive(Default)]
struct Outbox {
    bytes: BytesMut,
    /// The link task is writing a batch taken from `bytes`: nobody else writes until it is done.
    writing: bool,
    /// The plain TCP link's socket (a duplicate of the task's, non-blocking like it) while the
    /// link is up: a flush finding the task idle writes to it itself.
    socket: Option<std::net::TcpStream>,
}

/// One peer's link: its send buffer and its counters.
struct Peer {
    addr: Mutex<Option<HostPort>>,
    buffer: Mutex<Outbox>,
    wake: Notify,
    /// Cuts the pause before the next dial short: the peer just dialled us, so it is up, and
    /// what we send it (such as the answer to the request it sent on that link) has no link
    /// to go on until ours is up too.
    redial: Notify,
    connected: AtomicBool,
    /// Microseconds since the transport's epoch of the last pong; 0 if none.
    last_pong_us: AtomicU64,
    rtt_us: AtomicU64,
    bytes_out: AtomicU64,
    batches_out: AtomicU64,
    bytes_in: AtomicU64,
    frames_in: AtomicU64,
    dropped: AtomicU64,
    /// Dials that reached nobody (refused, unreachable, timed out).
    dials_failed: AtomicU64,
    /// The cluster protocol its last hello said it speaks (0: none seen yet).
    protocol: std::sync::atomic::AtomicU32,
    started: AtomicBool,
    /// Counts the peer's inbound links: only the newest one ending is a broken link.
    inbound: AtomicU64,
    /// Counts the outbound link's connections: the raft link lives and dies with one of them.
    generation: AtomicU64,
    raft_link: RaftLinkOut,
}

/// The outbound raft link to a peer: a second plain TCP connection that carries only quorum
/// queues' Raft frames, from the groups loop to the peer's groups loop, which reads it
/// itself. A frame on the main link is read by a task of the peer's runtime and handed to
/// its loop: two wake-ups, where the raft link costs one. A publish to a quorum queue crosses
/// links three times (append, answer, commit), each a context switch on its path.
#[derive(Default)]
struct RaftLinkOut {
    buffer: Mutex<Outbox>,
    wake: Notify,
    connected: AtomicBool,
    started: AtomicBool,
}

impl Peer {
    fn new() -> Peer {
        Peer {
            addr: Mutex::new(None),
            buffer: Mutex::new(Outbox::default()),
            wake: Notify::new(),
            redial: Notify::new(),
            connected: AtomicBool::new(false),
            last_pong_us: AtomicU64::new(0),
            rtt_us: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            batches_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            frames_in: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            dials_failed: AtomicU64::new(0),
            protocol: std::sync::atomic::AtomicU32::new(0),
            started: AtomicBool::new(false),
            inbound: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            raft_link: RaftLinkOut::default(),
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
    pub dials_failed: u64,
    /// Quorum queues' Raft frames to the peer take its raft link ([`RaftLinkOut`]).
    pub raft_link: bool,
}

struct Inner {
    me: NodeInfo,
    boot: u64,
    epoch: Instant,
    peers: Mutex<HashMap<u64, Arc<Peer>>>,
    callbacks: Callbacks,
    /// Mutual TLS on every link, when the node has cluster certificates.
    tls: Option<Arc<LinkTls>>,
    /// [`RECONNECT_DELAY`] in ms, unless a test stretched it.
    reconnect_delay_ms: AtomicU64,
    /// Peers the cluster forgot (`forget_cluster_node`): never dialled again, even when one
    /// of them, restarted with its old data, dials this node.
    forgotten: Mutex<std::collections::HashSet<u64>>,
}

/// A stream a one-off connection to a peer (a join request) is written to: plain TCP, or TLS.
pub trait LinkStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> LinkStream for T {}

/// The node's links to its peers.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

impl Transport {
    /// Accepts peers' links on `listener`; what they send goes to `callbacks`. Links are plain
    /// TCP: see [`Transport::start_with_tls`].
    pub fn start(
        me: NodeInfo,
        boot: u64,
        listener: TcpListener,
        callbacks: Callbacks,
    ) -> Transport {
        Transport::start_with_tls(me, boot, listener, callbacks, None)
    }

    /// As [`Transport::start`], with every link (both ways) over mutually authenticated TLS
    /// when `tls` is given: a peer without a certificate the cluster's CA signed is refused.
    pub fn start_with_tls(
        me: NodeInfo,
        boot: u64,
        listener: TcpListener,
        callbacks: Callbacks,
        tls: Option<Arc<LinkTls>>,
    ) -> Transport {
        let t = Transport {
            inner: Arc::new(Inner {
                me,
                boot,
                epoch: Instant::now(),
                peers: Mutex::new(HashMap::new()),
                callbacks,
                tls,
                reconnect_delay_ms: AtomicU64::new(RECONNECT_DELAY.as_millis() as u64),
                forgotten: Mutex::new(Default::default()),
            }),
        };
        let accepting = t.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, addr)) => {
                        let t = accepting.clone();
                        tokio::spawn(async move { t.accept_link(stream, addr).await });
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

    /// The node's cluster TLS, if its links use it.
    /// Stretches the pause between dials to a peer: tests set it past their deadline to show
    /// what does not wait for it.
    pub fn set_reconnect_delay(&self, delay: Duration) {
        self.inner
            .reconnect_delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn tls(&self) -> Option<&Arc<LinkTls>> {
        self.inner.tls.as_ref()
    }

    /// Opens a one-off connection to the node at `addr` (TLS when the links are), for a
    /// request to a node whose id is not known yet.
    pub async fn open(&self, addr: &HostPort) -> Result<Box<dyn LinkStream>, String> {
        let (stream, resolved) = dial(addr).await?;
        match &self.inner.tls {
            None => Ok(Box::new(stream)),
            Some(tls) => Ok(Box::new(tls.dial(stream, resolved).await?)),
        }
    }

    /// Asks the node at `addr` who it is (its hello), on a one-off connection: how a node that
    /// knows its seeds only by address finds which member each one is. `Err` when nobody
    /// answers or the node is of a build that does not answer (it drops the connection).
    pub async fn identify(&self, addr: &HostPort) -> Result<Hello, String> {
        let ask = async {
            let mut stream = self.open(addr).await?;
            let mut out = BytesMut::new();
            frame::encode_hello(&mut out, &Hello::new(self.inner.me.clone(), 0, None));
            frame::encode_identify(&mut out);
            stream
                .write_all(&out)
                .await
                .map_err(|e| format!("{addr}: {e}"))?;
            let mut buf = BytesMut::with_capacity(4096);
            loop {
                match frame::decode(&mut buf).map_err(|e| format!("{addr}: {e}"))? {
                    Some(Frame::Hello(hello)) => return Ok(hello),
                    Some(_) => return Err(format!("{addr} answered with another frame")),
                    None => {}
                }
                match stream.read_buf(&mut buf).await {
                    Ok(0) => {
                        return Err(format!(
                            "{addr} closed the connection without saying who it is"
                        ))
                    }
                    Ok(_) => {}
                    Err(e) => return Err(format!("{addr}: {e}")),
                }
            }
        };
        tokio::time::timeout(IDENTIFY_TIMEOUT, ask)
            .await
            .map_err(|_| {
                format!(
                    "no answer from {addr} within {} s",
                    IDENTIFY_TIMEOUT.as_secs()
                )
            })?
    }

    /// A link a peer opened: its TLS handshake if the links use TLS, then its frames.
    async fn accept_link(self, stream: TcpStream, addr: SocketAddr) {
        let _ = stream.set_nodelay(true);
        match self.inner.tls.clone() {
            None => {
                let (mut rd, mut wr) = stream.into_split();
                let raft_link = self.clone().serve_inbound(&mut rd, &mut wr).await;
                if let (Some((from, buffered)), Some(take)) =
                    (raft_link, &self.inner.callbacks.raft_link)
                {
                    if let Ok(socket) = rd
                        .reunite(wr)
                        .map_err(drop)
                        .and_then(|s| s.into_std().map_err(drop))
                    {
                        let peer = self.peer(from);
                        take(RaftLinkSocket {
                            from,
                            socket,
                            buffered,
                            count_in: Box::new(move |bytes, frames| {
                                peer.bytes_in.fetch_add(bytes, Ordering::Relaxed);
                                peer.frames_in.fetch_add(frames, Ordering::Relaxed);
                            }),
                        });
                    }
                }
            }
            Some(tls) => {
                if let Some(stream) = tls.accept(stream, addr).await {
                    let (mut rd, mut wr) = tokio::io::split(stream);
                    // Raft links are plain TCP only: a TLS one is dropped.
                    let _ = self.serve_inbound(&mut rd, &mut wr).await;
                }
            }
        }
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

    /// Stops dialling peer `id` for good: the cluster forgot it. Its link, down already (only a
    /// stopped node is forgotten), is not dialled again.
    pub fn forget(&self, id: u64) {
        self.inner
            .forgotten
            .lock()
            .expect("forgotten lock")
            .insert(id);
        if let Some(peer) = self.inner.peers.lock().expect("peers lock").get(&id) {
            *peer.addr.lock().expect("addr lock") = None;
        }
    }

    /// Why a link whose hello names another node than this one is refused: its dialler reached
    /// this node at an address that belonged to that node (an IP given to another pod, two
    /// nodes with one advertised address). The dialler resolves and dials again.
    fn misdialled(&self, hello: &Hello) -> Option<String> {
        if let Some(why) = hello.incompatibility() {
            return Some(format!("cluster link refused: {why}"));
        }
        let me = &self.inner.me;
        let meant = hello.to?;
        (meant != me.id).then(|| {
            format!(
                "cluster link from {} ({}) refused: it meant to reach node id {meant}, but this is \
                 {} (id {}); the address it dialled is no longer that node's",
                hello.info.name, hello.info.cluster, me.name, me.id
            )
        })
    }

    /// The cluster protocol peer `id` speaks, as its last link's hello said (0: no hello yet):
    /// what may be asked of it ([`frame::PROTOCOL`]).
    pub fn peer_protocol(&self, id: u64) -> u32 {
        self.inner
            .peers
            .lock()
            .expect("peers lock")
            .get(&id)
            .map_or(0, |p| p.protocol.load(Ordering::Relaxed))
    }

    fn is_forgotten(&self, id: u64) -> bool {
        self.inner
            .forgotten
            .lock()
            .expect("forgotten lock")
            .contains(&id)
    }

    /// Makes sure a link to peer `id` at `addr` is being kept up (dialling again after
    /// failures); a new address replaces the old one at the next dial.
    pub fn connect(&self, id: u64, addr: HostPort) {
        if id == self.inner.me.id || self.is_forgotten(id) {
            return;
        }
        let peer = self.peer(id);
        *peer.addr.lock().expect("addr lock") = Some(addr);
        if peer.started.swap(true, Ordering::AcqRel) {
            if !peer.connected.load(Ordering::Relaxed) {
                peer.redial.notify_one();
            }
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
        let queued = queue_raft(&peer, group, messages);
        if queued {
            peer.wake.notify_one();
        }
        queued
    }

    /// As [`Transport::send_raft`], but the frame waits for [`Transport::flush_queued`]: a loop
    /// sending many groups' messages in a round writes them together at its end.
    /// They take the peer's raft link when it is up, the main link otherwise.
    pub fn queue_raft(&self, to: u64, group: u64, messages: &[raft::eraftpb::Message]) -> bool {
        let peer = self.peer(to);
        let link = &peer.raft_link;
        if link.connected.load(Ordering::Relaxed) {
            let mut outbox = link.buffer.lock().expect("buffer lock");
            if outbox.bytes.len() > PEER_BUFFER_BYTES_MAX {
                peer.dropped
                    .fetch_add(messages.len() as u64, Ordering::Relaxed);
                return false;
            }
            frame::encode_raft(&mut outbox.bytes, group, messages);
            return true;
        }
        queue_raft(&peer, group, messages)
    }

    /// Sends what waits for each peer: from this thread when the link is plain TCP and its task
    /// is not writing, with one non-blocking write; what does not fit, and every other link's
    /// frames, by waking the link's task.
    pub fn flush_queued(&self) {
        let peers: Vec<Arc<Peer>> = self
            .inner
            .peers
            .lock()
            .expect("peers lock")
            .values()
            .cloned()
            .collect();
        for peer in peers {
            if flush_outbox(&peer.raft_link.buffer, &peer) {
                peer.raft_link.wake.notify_one();
            }
            if flush_outbox(&peer.buffer, &peer) {
                peer.wake.notify_one();
            }
        }
    }

    /// Queues a catch-up message for peer `to`; false if the link is down or its buffer full
    /// (the fetch asks again, or asks another member).
    pub fn send_catch_up(&self, to: u64, message: &crate::catch_up::CatchUpMessage) -> bool {
        let peer = self.peer(to);
        let mut outbox = peer.buffer.lock().expect("buffer lock");
        if !peer.connected.load(Ordering::Relaxed) || outbox.bytes.len() > PEER_BUFFER_BYTES_MAX {
            peer.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        frame::encode_catch_up(&mut outbox.bytes, message);
        drop(outbox);
        peer.wake.notify_one();
        true
    }

    /// Queues one data frame (written by `f`) for peer `to`; false if the link is down, when
    /// nothing is queued. Never dropped while the link is up: callers hold off on
    /// [`Transport::buffered`] instead.
    pub fn send_data(&self, to: u64, f: impl FnOnce(&mut BytesMut)) -> bool {
        let peer = self.peer(to);
        let mut outbox = peer.buffer.lock().expect("buffer lock");
        if !peer.connected.load(Ordering::Relaxed) {
            return false;
        }
        f(&mut outbox.bytes);
        drop(outbox);
        peer.wake.notify_one();
        true
    }

    /// Bytes waiting to be written to peer `to`.
    pub fn buffered(&self, to: u64) -> usize {
        let peer = self
            .inner
            .peers
            .lock()
            .expect("peers lock")
            .get(&to)
            .cloned();
        peer.map_or(0, |p| p.buffer.lock().expect("buffer lock").bytes.len())
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
                dials_failed: p.dials_failed.load(Ordering::Relaxed),
                raft_link: p.raft_link.connected.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by_key(|l| l.peer);
        out
    }

    /// Keeps the outbound link to one peer up: dial, hello, then write batches and pings until
    /// the connection fails; then dial again.
    async fn run_link(self, id: u64, peer: Arc<Peer>) {
        // The last TLS failure logged, so that a peer refusing us is said once, not per dial.
        let mut last_failure: Option<String> = None;
        // The last dial failure logged, so that a peer that stays away is said once.
        let mut last_dial_failure: Option<String> = None;
        loop {
            let addr = peer.addr.lock().expect("addr lock").clone();
            let Some(addr) = addr else {
                self.pause_before_dial(&peer).await;
                continue;
            };
            // Resolved again at every dial: a peer back under its name on another IP is found.
            let dialled = dial(&addr).await;
            if let Err(e) = &dialled {
                if last_dial_failure.as_ref() != Some(e) {
                    tracing::info!(peer = id, "cluster link not opened: {e}");
                    last_dial_failure = Some(e.clone());
                }
            }
            if let Ok((stream, resolved)) = dialled {
                last_dial_failure = None;
                let (was_up, refusal) = match self.inner.tls.clone() {
                    None => {
                        tracing::info!(peer = id, %addr, "cluster link up");
                        // A second handle on the socket for writing through (see Outbox).
                        let direct = std::os::fd::AsFd::as_fd(&stream)
                            .try_clone_to_owned()
                            .ok()
                            .map(std::net::TcpStream::from);
                        let (rd, wr) = stream.into_split();
                        self.drive_link(rd, wr, id, &peer, direct).await
                    }
                    Some(tls) => match tls.dial(stream, resolved).await {
                        Ok(stream) => {
                            if last_failure.is_none() {
                                tracing::info!(peer = id, %addr, "cluster link up (TLS)");
                            }
                            let (rd, wr) = tokio::io::split(stream);
                            self.drive_link(rd, wr, id, &peer, None).await
                        }
                        Err(e) => {
                            if last_failure.as_ref() != Some(&e) {
                                tracing::warn!(peer = id, %addr, "cluster link not opened: {e}");
                                last_failure = Some(e);
                            }
                            self.pause_before_dial(&peer).await;
                            continue;
                        }
                    },
                };
                {
                    let mut outbox = peer.buffer.lock().expect("buffer lock");
                    peer.connected.store(false, Ordering::Relaxed);
                    *outbox = Outbox::default();
                }
                match refusal {
                    Some(why) => {
                        if last_failure.as_ref() != Some(&why) {
                            tracing::warn!(peer = id, %addr, "cluster link refused: the peer {why}");
                            last_failure = Some(why);
                        }
                    }
                    None => {
                        last_failure = None;
                        tracing::info!(peer = id, %addr, "cluster link down")
                    }
                }
                if was_up {
                    (self.inner.callbacks.link_broken)(id);
                }
            } else {
                peer.dials_failed.fetch_add(1, Ordering::Relaxed);
            }
            self.pause_before_dial(&peer).await;
        }
    }

    /// Waits [`RECONNECT_DELAY`] before the next dial to `peer`, or less if it dialled us
    /// meanwhile.
    async fn pause_before_dial(&self, peer: &Peer) {
        let delay = self.inner.reconnect_delay_ms.load(Ordering::Relaxed);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
            _ = peer.redial.notified() => {}
        }
    }

    /// Runs one outbound connection: whether it got as far as being used, and why the peer
    /// refused it if it did (a TLS alert).
    async fn drive_link<R, W>(
        &self,
        mut rd: R,
        mut wr: W,
        id: u64,
        peer: &Arc<Peer>,
        direct: Option<std::net::TcpStream>,
    ) -> (bool, Option<String>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin,
    {
        let mut hello = BytesMut::new();
        frame::encode_hello(
            &mut hello,
            &Hello::new(self.inner.me.clone(), self.inner.boot, Some(id)),
        );
        if wr.write_all(&hello).await.is_err() {
            return (false, None);
        }
        let plain = direct.is_some();
        {
            let mut outbox = peer.buffer.lock().expect("buffer lock");
            peer.connected.store(true, Ordering::Relaxed);
            peer.generation.fetch_add(1, Ordering::AcqRel);
            outbox.socket = direct;
        }
        if plain
            && self.inner.callbacks.raft_link.is_some()
            && !peer.raft_link.started.swap(true, Ordering::AcqRel)
        {
            let t = self.clone();
            let peer = peer.clone();
            tokio::spawn(async move { t.run_raft_link(id, peer).await });
        }
        // A link that answers no ping for DOWN_AFTER is dropped (counted from now).
        let connected_at = self.clock_us();
        (self.inner.callbacks.link_up)(id, None);
        // Pongs come back on this connection; the reader ends with it.
        let reading = {
            let peer = peer.clone();
            let t = self.clone();
            tokio::spawn(async move {
                let mut buf = BytesMut::with_capacity(4096);
                loop {
                    match rd.read_buf(&mut buf).await {
                        Ok(0) => return None,
                        // TLS 1.3: a peer that refuses our certificate says so here.
                        Err(e) => return LinkTls::describe(&e),
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
                            Err(_) => return None,
                        }
                    }
                }
            })
        };
        let mut next_ping = Instant::now();
        let mut out = BytesMut::new();
        let down_after = DOWN_AFTER.as_micros() as u64;
        loop {
            if reading.is_finished() {
                break;
            }
            let last = peer.last_pong_us.load(Ordering::Relaxed).max(connected_at);
            if self.clock_us().saturating_sub(last) > down_after {
                tracing::warn!(peer = id, "no answer to pings; dropping the cluster link");
                break;
            }
            if Instant::now() >= next_ping {
                frame::encode_ping(&mut out, frame::KIND_PING, self.clock_us());
                next_ping = Instant::now() + PING_INTERVAL;
            }
            if !write_pending(&mut wr, &mut out, &peer.buffer, peer, || true).await {
                break;
            }
            tokio::select! {
                _ = peer.wake.notified() => {}
                _ = tokio::time::sleep_until(next_ping.into()) => {}
            }
        }
        peer.buffer.lock().expect("buffer lock").socket = None;
        let refusal = if reading.is_finished() {
            reading.await.ok().flatten()
        } else {
            reading.abort();
            None
        };
        (true, refusal)
    }

    /// Keeps the raft link to a peer up beside its main link (see [`RaftLinkOut`]): dialled
    /// once the main link is up, dropped when that one drops or is replaced, so a peer that
    /// went away and came back gets a fresh raft link with its fresh main link rather than
    /// one stuck in TCP's retransmission backoff. The peer never writes to it: a read that
    /// ends means the peer closed it.
    async fn run_raft_link(self, id: u64, peer: Arc<Peer>) {
        let link = &peer.raft_link;
        loop {
            tokio::time::sleep(RECONNECT_DELAY).await;
            let generation = peer.generation.load(Ordering::Acquire);
            let addr = peer.addr.lock().expect("addr lock").clone();
            let Some(addr) = addr.filter(|_| peer.connected.load(Ordering::Relaxed)) else {
                continue;
            };
            let Ok((stream, _)) = dial(&addr).await else {
                continue;
            };
            let direct = std::os::fd::AsFd::as_fd(&stream)
                .try_clone_to_owned()
                .ok()
                .map(std::net::TcpStream::from);
            let (mut rd, mut wr) = stream.into_split();
            let mut out = BytesMut::new();
            frame::encode_raft_link_hello(
                &mut out,
                &Hello::new(self.inner.me.clone(), self.inner.boot, Some(id)),
            );
            if wr.write_all(&out).await.is_err() || direct.is_none() {
                continue;
            }
            out.clear();
            {
                let mut outbox = link.buffer.lock().expect("buffer lock");
                outbox.socket = direct;
                link.connected.store(true, Ordering::Relaxed);
            }
            tracing::debug!(peer = id, %addr, "raft link up");
            let mut closed = tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(1..) = rd.read(&mut buf).await {}
            });
            loop {
                if closed.is_finished()
                    || !peer.connected.load(Ordering::Relaxed)
                    || peer.generation.load(Ordering::Acquire) != generation
                {
                    break;
                }
                let wanted = || {
                    peer.connected.load(Ordering::Relaxed)
                        && peer.generation.load(Ordering::Acquire) == generation
                };
                // A peer cut off stops reading: the write is given up once the main link drops.
                if !write_pending(&mut wr, &mut out, &link.buffer, &peer, wanted).await {
                    break;
                }
                tokio::select! {
                    _ = link.wake.notified() => {}
                    _ = &mut closed => {}
                    _ = tokio::time::sleep(PING_INTERVAL) => {}
                }
            }
            closed.abort();
            let mut outbox = link.buffer.lock().expect("buffer lock");
            link.connected.store(false, Ordering::Relaxed);
            // Dropped with the link: Raft sends again what was not acknowledged.
            *outbox = Outbox::default();
        }
    }

    /// Reads one peer's inbound link: hello first, then frames for the node; pings are answered
    /// on the same connection. A raft link's hello ends it here: the peer's id and what was
    /// read past the hello, for the caller to hand the connection over.
    async fn serve_inbound<R, W>(self, rd: &mut R, wr: &mut W) -> Option<(u64, BytesMut)>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        let mut from: Option<(u64, Arc<Peer>)> = None;
        let mut generation = 0;
        let mut reply = BytesMut::new();
        let ended = |from: &Option<(u64, Arc<Peer>)>, generation: u64| {
            if let Some((id, p)) = from {
                // Only the peer's newest inbound link ending breaks anything.
                if generation != NOT_A_LINK && p.inbound.load(Ordering::Relaxed) == generation {
                    tracing::info!(peer = id, "inbound cluster link ended");
                    (self.inner.callbacks.link_broken)(*id);
                }
            }
            None
        };
        loop {
            // Peers ping every PING_INTERVAL: silence this long means the link is dead.
            match tokio::time::timeout(DOWN_AFTER, rd.read_buf(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return ended(&from, generation),
                Ok(Ok(n)) => {
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
                        return ended(&from, generation);
                    }
                };
                match (f, &from) {
                    (Frame::Hello(hello), None) => {
                        if let Some(refusal) = self.misdialled(&hello) {
                            tracing::warn!("{refusal}");
                            return None;
                        }
                        let info = hello.info;
                        let peer = self.peer(info.id);
                        if hello.boot != 0 {
                            peer.protocol.store(hello.protocol, Ordering::Relaxed);
                        }
                        if hello.boot == 0 {
                            // A one-off connection (a join request), not the peer's link:
                            // it neither replaces nor breaks the link.
                            generation = NOT_A_LINK;
                        } else {
                            generation = peer.inbound.fetch_add(1, Ordering::Relaxed) + 1;
                            // A peer that dialled us is one we want to reach back.
                            self.connect(info.id, info.cluster.clone());
                            (self.inner.callbacks.link_up)(info.id, Some(hello.boot));
                        }
                        from = Some((info.id, peer));
                        (self.inner.callbacks.inbound)(Inbound::Hello(info));
                    }
                    (Frame::RaftLinkHello(hello), None) => {
                        if let Some(refusal) = self.misdialled(&hello) {
                            tracing::warn!("{refusal}");
                            return None;
                        }
                        return Some((hello.info.id, buf));
                    }
                    (Frame::Identify, Some(_)) => {
                        // Who we are, then the end of this one-off connection.
                        let mut out = BytesMut::new();
                        frame::encode_hello(
                            &mut out,
                            &Hello::new(self.inner.me.clone(), self.inner.boot, None),
                        );
                        let _ = wr.write_all(&out).await;
                        let _ = wr.flush().await;
                        return ended(&from, generation);
                    }
                    (Frame::Hello(_) | Frame::RaftLinkHello(_), Some(_)) => {
                        tracing::warn!("cluster peer sent a second hello, dropping link");
                        return ended(&from, generation);
                    }
                    (_, None) => {
                        tracing::warn!("cluster peer sent frames before hello, dropping link");
                        return None;
                    }
                    (Frame::Data(payload), Some((id, p))) => {
                        p.frames_in.fetch_add(1, Ordering::Relaxed);
                        if generation == NOT_A_LINK
                            || p.inbound.load(Ordering::Relaxed) != generation
                        {
                            // A newer link from the peer replaced this one.
                            return None;
                        }
                        if let Err(e) = (self.inner.callbacks.data)(*id, payload) {
                            tracing::warn!(error = %e, "bad data frame from a cluster peer, dropping link");
                            return ended(&from, generation);
                        }
                    }
                    (Frame::Ping(t), Some(_)) => {
                        frame::encode_ping(&mut reply, frame::KIND_PONG, t);
                    }
                    (Frame::Pong(_), Some(_)) => {}
                    (Frame::CatchUp(message), Some((id, p))) => {
                        p.frames_in.fetch_add(1, Ordering::Relaxed);
                        (self.inner.callbacks.inbound)(Inbound::CatchUp { from: *id, message });
                    }
                    (Frame::Raft { group, messages }, Some((id, p))) => {
                        p.frames_in.fetch_add(1, Ordering::Relaxed);
                        (self.inner.callbacks.inbound)(Inbound::Raft {
                            from: *id,
                            group,
                            messages,
                        });
                    }
                }
            }
            if !reply.is_empty() {
                if wr.write_all(&reply).await.is_err() {
                    return ended(&from, generation);
                }
                reply.clear();
            }
        }
    }
}

/// Writes what waits in `outbox` (after what `out` holds already, such as a ping) from the
/// link's task, flushes from other threads holding off meanwhile; false if the write failed,
/// or if `wanted` says no more while it is pending (checked every [`PING_INTERVAL`]).
async fn write_pending<W: AsyncWrite + Unpin>(
    wr: &mut W,
    out: &mut BytesMut,
    outbox: &Mutex<Outbox>,
    peer: &Peer,
    wanted: impl Fn() -> bool,
) -> bool {
    {
        let mut outbox = outbox.lock().expect("buffer lock");
        if !outbox.bytes.is_empty() {
            peer.batches_out.fetch_add(1, Ordering::Relaxed);
            if out.is_empty() {
                // The usual case: take the batch whole rather than copying it.
                std::mem::swap(out, &mut outbox.bytes);
            } else {
                out.extend_from_slice(&outbox.bytes);
                outbox.bytes.clear();
            }
        }
        outbox.writing = !out.is_empty();
    }
    if out.is_empty() {
        return true;
    }
    let written = {
        let mut write = std::pin::pin!(wr.write_all(out));
        loop {
            match tokio::time::timeout(PING_INTERVAL, &mut write).await {
                Ok(result) => break result.is_ok(),
                Err(_) if wanted() => {}
                Err(_) => break false,
            }
        }
    };
    outbox.lock().expect("buffer lock").writing = false;
    if written {
        peer.bytes_out
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        out.clear();
    }
    written
}

/// Queues one Raft frame for `peer`; false (dropped and counted) if the link is down or its
/// buffer full.
fn queue_raft(peer: &Peer, group: u64, messages: &[raft::eraftpb::Message]) -> bool {
    let mut outbox = peer.buffer.lock().expect("buffer lock");
    if !peer.connected.load(Ordering::Relaxed) || outbox.bytes.len() > PEER_BUFFER_BYTES_MAX {
        peer.dropped
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        return false;
    }
    frame::encode_raft(&mut outbox.bytes, group, messages);
    true
}

/// Writes what waits in `outbox` from this thread if its task is not writing; whether the
/// task must be woken for the rest.
fn flush_outbox(outbox: &Mutex<Outbox>, peer: &Peer) -> bool {
    let mut outbox = outbox.lock().expect("buffer lock");
    if outbox.bytes.is_empty() {
        return false;
    }
    if !outbox.writing {
        if let Some(written) = write_through(&mut outbox) {
            peer.bytes_out.fetch_add(written as u64, Ordering::Relaxed);
            if outbox.bytes.is_empty() {
                peer.batches_out.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
    }
    true
}

/// Writes what it can of the outbox's bytes to its socket without blocking (the socket is
/// non-blocking, as its link task's), dropping what went out; how many bytes that was, or
/// `None` when there is no socket to write to or it took nothing. An error is left to the
/// link task, which meets it on its own next write.
fn write_through(outbox: &mut Outbox) -> Option<usize> {
    use bytes::Buf;
    use std::io::Write;
    let socket = outbox.socket.as_ref()?;
    match (&*socket).write(&outbox.bytes) {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            outbox.bytes.advance(n);
            Some(n)
        }
    }
}
