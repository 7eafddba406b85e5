//! What the groups loop waits on: its input channel and the peers' raft links, in one epoll.
//!
//! A peer's Raft frames for quorum queues arrive on a link of their own
//! ([`crate::transport::RaftLinkSocket`]), which this loop reads itself: a frame read by a task
//! of the runtime and handed over on the channel costs two wake-ups where this costs one, and
//! a publish to a quorum queue crosses a link three times (append, answer, commit).
//!
//! Senders to the channel ring a doorbell ([`InputSender`]) only while the loop is parked in
//! the epoll, so a burst of inputs to a busy loop costs no system call.

use super::Input;
use bytes::BytesMut;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use crate::frame::{self, Frame};
use raft::eraftpb::Message;

const DOORBELL: Token = Token(0);
/// Read from one link per wait at most: a peer sending without pause cannot hold the loop.
const READ_BYTES_PER_WAIT: usize = 4 << 20;
const READ_CHUNK_BYTES: usize = 64 << 10;

struct Doorbell {
    waker: Waker,
    /// The loop is in (or about to enter) the epoll: the next sender must ring.
    parked: AtomicBool,
}

/// The loop's input channel: sends, and wakes the loop if it is parked.
#[derive(Clone)]
pub struct InputSender {
    tx: Sender<Input>,
    bell: Arc<Doorbell>,
}

impl InputSender {
    /// False once the loop has stopped.
    pub fn send(&self, input: Input) -> bool {
        if self.tx.send(input).is_err() {
            return false;
        }
        if self.bell.parked.swap(false, Ordering::SeqCst) {
            let _ = self.bell.waker.wake();
        }
        true
    }
}

struct InboundLink {
    from: u64,
    socket: TcpStream,
    buf: BytesMut,
    count_in: Box<dyn Fn(u64, u64) + Send>,
}

/// The peers' inbound raft links, and the epoll the loop waits in.
pub(super) struct RaftLinks {
    poll: Poll,
    events: Events,
    bell: Arc<Doorbell>,
    links: HashMap<Token, InboundLink>,
    /// Links with bytes left unread at the last wait (its read budget ran out).
    unread: Vec<Token>,
    next_token: usize,
}

impl RaftLinks {
    pub(super) fn new(tx: Sender<Input>) -> std::io::Result<(RaftLinks, InputSender)> {
        let poll = Poll::new()?;
        let bell = Arc::new(Doorbell {
            waker: Waker::new(poll.registry(), DOORBELL)?,
            parked: AtomicBool::new(false),
        });
        let links = RaftLinks {
            poll,
            events: Events::with_capacity(64),
            bell: bell.clone(),
            links: HashMap::new(),
            unread: Vec::new(),
            next_token: 1,
        };
        Ok((links, InputSender { tx, bell }))
    }

    /// From now on, senders ring: the caller looks at its channel once more, then waits.
    pub(super) fn park(&self) {
        self.bell.parked.store(true, Ordering::SeqCst);
    }

    /// Waits up to `wait` (after [`RaftLinks::park`]; zero to only look) for a doorbell or
    /// frames, and hands every Raft frame read to `frames`, as (group, messages).
    pub(super) fn wait(&mut self, wait: Duration, mut frames: impl FnMut(u64, Vec<Message>)) {
        let wait = if self.unread.is_empty() {
            wait
        } else {
            Duration::ZERO
        };
        if let Err(e) = self.poll.poll(&mut self.events, Some(wait)) {
            if e.kind() != ErrorKind::Interrupted {
                tracing::warn!(error = %e, "the queue groups' epoll failed");
            }
        }
        self.bell.parked.store(false, Ordering::SeqCst);
        let mut ready: Vec<Token> = std::mem::take(&mut self.unread);
        ready.extend(
            self.events
                .iter()
                .map(|e| e.token())
                .filter(|t| *t != DOORBELL),
        );
        ready.dedup();
        for token in ready {
            self.read(token, &mut frames);
        }
    }

    /// Takes a peer's new raft link (replacing any older one from that peer).
    pub(super) fn add(&mut self, link: crate::transport::RaftLinkSocket) {
        let older: Vec<Token> = self
            .links
            .iter()
            .filter(|(_, l)| l.from == link.from)
            .map(|(t, _)| *t)
            .collect();
        for token in older {
            self.remove(token);
        }
        let token = Token(self.next_token);
        self.next_token += 1;
        let mut socket = TcpStream::from_std(link.socket);
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut socket, token, Interest::READABLE)
        {
            tracing::warn!(peer = link.from, error = %e, "cannot watch a raft link");
            return;
        }
        tracing::debug!(
            peer = link.from,
            "raft link from a peer taken by the queue groups"
        );
        self.links.insert(
            token,
            InboundLink {
                from: link.from,
                socket,
                buf: link.buffered,
                count_in: link.count_in,
            },
        );
        // Bytes may have arrived before it was watched: an edge-triggered epoll would not say.
        self.unread.push(token);
    }

    fn remove(&mut self, token: Token) {
        if let Some(mut link) = self.links.remove(&token) {
            let _ = self.poll.registry().deregister(&mut link.socket);
        }
    }

    /// Reads what the link has (up to the budget) and decodes its frames; a link that ends or
    /// sends what a raft link never carries is closed (the peer dials again).
    fn read(&mut self, token: Token, frames: &mut impl FnMut(u64, Vec<Message>)) {
        let Some(link) = self.links.get_mut(&token) else {
            return;
        };
        let mut budget = READ_BYTES_PER_WAIT;
        let mut open = true;
        let mut read = 0;
        loop {
            if budget == 0 {
                self.unread.push(token);
                break;
            }
            match read_into(&link.socket, &mut link.buf) {
                Ok(0) => {
                    open = false;
                    break;
                }
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    read += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    open = false;
                    break;
                }
            }
        }
        let mut decoded = 0;
        loop {
            match frame::decode(&mut link.buf) {
                Ok(Some(Frame::Raft { group, messages })) => {
                    decoded += 1;
                    frames(group, messages);
                }
                Ok(None) => break,
                Ok(Some(_)) | Err(_) => {
                    tracing::warn!(
                        peer = link.from,
                        "a raft link carried something else: closed"
                    );
                    open = false;
                    break;
                }
            }
        }
        (link.count_in)(read as u64, decoded);
        if !open {
            tracing::debug!(peer = link.from, "raft link from a peer ended");
            self.remove(token);
        }
    }
}

/// Reads from `socket` straight into the spare room of `buf`: no copy through a scratch
/// buffer (every byte a follower receives, bodies included), and no zeroing of the room first,
/// which a safe `Read::read` into it would need.
fn read_into(socket: &TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    buf.reserve(READ_CHUNK_BYTES);
    let room = buf.spare_capacity_mut();
    // SAFETY: read(2) writes at most `room.len()` bytes into `room`, which is valid for
    // writes; only the bytes it reports written are then counted in the buffer's length.
    let n = unsafe { libc::read(socket.as_raw_fd(), room.as_mut_ptr().cast(), room.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the `n` bytes after the current length were just written by read(2).
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream as StdStream};
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    fn raft_frame(group: u64, entries: usize) -> BytesMut {
        let mut m = Message::default();
        m.set_entries(vec![raft::eraftpb::Entry::default(); entries].into());
        let mut out = BytesMut::new();
        frame::encode_raft(&mut out, group, &[m]);
        out
    }

    fn pair() -> (StdStream, StdStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let dialled = StdStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        (dialled, accepted)
    }

    #[test]
    fn frames_split_across_the_hand_over_and_reads_arrive_whole_and_a_closed_link_goes() {
        let (tx, _rx) = std::sync::mpsc::channel();
        let (mut links, _sender) = RaftLinks::new(tx).unwrap();
        let (mut peer, accepted) = pair();
        let first = raft_frame(7, 3);
        let second = raft_frame(8, 1);
        let counted = Arc::new(AtomicU64::new(0));
        let c = counted.clone();
        links.add(crate::transport::RaftLinkSocket {
            from: 2,
            socket: accepted,
            // The transport read past the hello into the first frame.
            buffered: BytesMut::from(&first[..5]),
            count_in: Box::new(move |bytes, _| {
                c.fetch_add(bytes, Ordering::Relaxed);
            }),
        });
        peer.write_all(&first[5..9]).unwrap();
        peer.flush().unwrap();
        let mut got = Vec::new();
        let mut rest = Some([&first[9..], &second[..]].concat());
        for _ in 0..100 {
            links.wait(Duration::from_millis(100), |group, messages| {
                got.push((group, messages[0].get_entries().len()))
            });
            if let Some(rest) = rest.take() {
                peer.write_all(&rest).unwrap();
            }
            if got.len() == 2 {
                break;
            }
        }
        assert_eq!(got, vec![(7, 3), (8, 1)]);
        assert_eq!(
            counted.load(Ordering::Relaxed) as usize,
            first.len() - 5 + second.len()
        );
        drop(peer);
        for _ in 0..100 {
            links.wait(Duration::from_millis(100), |_, _| {
                panic!("nothing more was sent")
            });
            if links.links.is_empty() {
                break;
            }
        }
        assert!(
            links.links.is_empty(),
            "the closed link is no longer watched"
        );
    }

    #[test]
    fn a_parked_loop_is_woken_by_an_input_and_a_busy_one_is_not_rung() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (mut links, sender) = RaftLinks::new(tx).unwrap();
        // Not parked: the send only queues.
        assert!(sender.send(Input::Stop));
        assert!(!links.bell.parked.load(Ordering::SeqCst));
        assert!(matches!(rx.try_recv(), Ok(Input::Stop)));
        links.park();
        let s = sender.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            s.send(Input::Stop)
        });
        let started = Instant::now();
        links.wait(Duration::from_secs(60), |_, _| {});
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "woken by the doorbell, not the timeout"
        );
        assert!(t.join().unwrap());
        assert!(matches!(rx.try_recv(), Ok(Input::Stop)));
        drop(rx);
        assert!(!sender.send(Input::Stop), "a stopped loop takes nothing");
    }
}
