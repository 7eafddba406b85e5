//! A connection's outbound byte buffer, shared between the broker logic that produces frames
//! (deliveries to consumers, confirms) and the connection's writer task that sends them.
//!
//! Frames from many messages accumulate here and leave in one write syscall: the broker never
//! waits on a socket, and a busy consumer connection gets large batched writes.
//!
//! Write-through: a thread that produces a batch of frames for many connections at once (the
//! quorum queues' groups loop carrying out a round's deliveries) opens a [`WriteThrough`]
//! scope. Outboxes pushed to inside it are not woken; when the scope ends, each is written to
//! its socket at once by that thread, with one non-blocking write, if its writer task has
//! nothing in flight. Waking the writer task instead costs a thread wake-up (and, with the
//! runtime's workers parked, often a second one) on every delivery's path. What the socket
//! does not take, an outbox whose writer is busy, and more than [`WRITE_THROUGH_BYTES_MAX`]
//! go to the writer task as before. Bytes keep their order: the direct write happens only
//! when the writer task holds none.

use bytes::{Buf, BytesMut};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Above this many buffered bytes a connection stops receiving new deliveries until its writer
/// drains it, so that a slow consumer cannot make the broker buffer without bound.
pub const OUTBOX_BYTES_SOFT_MAX: usize = 4 * 1024 * 1024;

/// Most bytes a [`WriteThrough`] scope writes to a socket itself: a few deliveries, at a low
/// rate, where the writer task's wake-up is most of a delivery's cost. More is left to the
/// writer task, which batches it with what follows: under load the scope's thread (the
/// quorum queues' groups loop) is the busiest of the node, and a loopback write also costs
/// it the receiving side's work.
pub const WRITE_THROUGH_BYTES_MAX: usize = 4096;

/// Writes as much of the bytes as the socket takes now without blocking; returns how many.
pub type WriteNow = Box<dyn Fn(&[u8]) -> usize + Send + Sync>;

pub struct Outbox {
    state: Mutex<State>,
    wake: Box<dyn Fn() + Send + Sync>,
    /// Set by the server for plain TCP connections (a TLS stream's records are the writer's).
    write_now: OnceLock<WriteNow>,
    frame_max: AtomicU32,
    closed: AtomicBool,
    /// Bytes left by a direct write since the writer last looked: the connection was not idle.
    wrote_through: AtomicBool,
    me: Weak<Outbox>,
}

#[derive(Default)]
struct State {
    buf: BytesMut,
    /// The writer task took bytes and has not come back for more: they may be unwritten.
    in_flight: bool,
    /// Pushed to inside a [`WriteThrough`] scope that has not ended yet.
    held: bool,
}

thread_local! {
    /// Outboxes pushed to inside this thread's open [`WriteThrough`] scope.
    static HELD: RefCell<Option<Vec<Arc<Outbox>>>> = const { RefCell::new(None) };
}

/// While alive, outboxes pushed to on this thread wait; at its end each is written through
/// to its socket, or its writer woken (see the module doc). Not to be held across an await.
pub struct WriteThrough {
    outermost: bool,
}

impl WriteThrough {
    pub fn begin() -> WriteThrough {
        let outermost = HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.is_none() && h.replace(Vec::new()).is_none()
        });
        WriteThrough { outermost }
    }
}

impl Drop for WriteThrough {
    fn drop(&mut self) {
        if !self.outermost {
            return;
        }
        let held = HELD.with(|h| h.borrow_mut().take()).unwrap_or_default();
        for outbox in held {
            outbox.write_through();
        }
    }
}

impl Outbox {
    /// `wake` is called when bytes are added so the writer task sends them.
    pub fn new(frame_max: u32, wake: Box<dyn Fn() + Send + Sync>) -> Arc<Self> {
        Arc::new_cyclic(|me| Outbox {
            state: Mutex::new(State {
                buf: BytesMut::with_capacity(64 * 1024),
                ..State::default()
            }),
            wake,
            write_now: OnceLock::new(),
            frame_max: AtomicU32::new(frame_max),
            closed: AtomicBool::new(false),
            wrote_through: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    /// Lets [`WriteThrough`] scopes write to the socket themselves (once; later calls are
    /// ignored).
    pub fn set_write_now(&self, write_now: WriteNow) {
        let _ = self.write_now.set(write_now);
    }

    pub fn frame_max(&self) -> u32 {
        self.frame_max.load(Ordering::Relaxed)
    }

    /// Bodies are split at the frame-max the client negotiated, known only after tune-ok.
    pub fn set_frame_max(&self, frame_max: u32) {
        self.frame_max.store(frame_max, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("outbox lock poisoned")
    }

    /// Appends frames built by `f` and wakes the writer, or, inside a [`WriteThrough`] scope,
    /// leaves them for its end.
    pub fn push(&self, f: impl FnOnce(&mut BytesMut)) {
        let mut st = self.lock();
        f(&mut st.buf);
        if st.held {
            return;
        }
        if self.write_now.get().is_some() && self.hold() {
            st.held = true;
            return;
        }
        drop(st);
        (self.wake)();
    }

    /// Adds this outbox to the thread's open scope, if there is one (every push asks: no
    /// reference is taken unless a scope is open).
    fn hold(&self) -> bool {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            let Some(held) = h.as_mut() else {
                return false;
            };
            match self.me.upgrade() {
                Some(me) => {
                    held.push(me);
                    true
                }
                None => false,
            }
        })
    }

    /// Writes what is buffered to the socket now if the writer task has nothing in flight;
    /// what the socket does not take (or all of it, if the writer is busy) is the writer's.
    fn write_through(&self) {
        let mut st = self.lock();
        st.held = false;
        if st.buf.is_empty() {
            return;
        }
        if let Some(write_now) = self.write_now.get() {
            if !st.in_flight && st.buf.len() <= WRITE_THROUGH_BYTES_MAX && !self.is_closed() {
                let n = write_now(&st.buf);
                st.buf.advance(n);
                if n > 0 {
                    self.wrote_through.store(true, Ordering::Relaxed);
                }
                if st.buf.is_empty() {
                    return;
                }
            }
        }
        drop(st);
        (self.wake)();
    }

    /// Takes everything buffered, leaving an empty buffer that keeps its capacity hint. The
    /// writer task calls it again once it has written what it took.
    pub fn take(&self) -> BytesMut {
        let mut st = self.lock();
        let cap = st.buf.capacity().clamp(64 * 1024, OUTBOX_BYTES_SOFT_MAX);
        let buf = std::mem::replace(&mut st.buf, BytesMut::with_capacity(cap));
        st.in_flight = !buf.is_empty();
        buf
    }

    /// Whether bytes were written through since the last call: the connection was not quiet
    /// (a heartbeat is due only after silence).
    pub fn take_wrote_through(&self) -> bool {
        self.wrote_through.swap(false, Ordering::Relaxed)
    }

    pub fn buffered_bytes(&self) -> usize {
        self.lock().buf.len()
    }

    pub fn is_congested(&self) -> bool {
        self.buffered_bytes() > OUTBOX_BYTES_SOFT_MAX
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        (self.wake)();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("frame_max", &self.frame_max())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// An outbox whose socket takes at most `room` bytes per write, recording what it took and
    /// how often the writer task was woken.
    fn outbox(room: usize) -> (Arc<Outbox>, Arc<Mutex<Vec<u8>>>, Arc<AtomicUsize>) {
        let (sent, wakes) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicUsize::new(0)),
        );
        let w = wakes.clone();
        let outbox = Outbox::new(
            4096,
            Box::new(move || {
                w.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let s = sent.clone();
        outbox.set_write_now(Box::new(move |bytes: &[u8]| {
            let n = bytes.len().min(room);
            s.lock().unwrap().extend_from_slice(&bytes[..n]);
            n
        }));
        (outbox, sent, wakes)
    }

    #[test]
    fn outside_a_scope_the_writer_is_woken() {
        let (outbox, sent, wakes) = outbox(1 << 20);
        outbox.push(|b| b.extend_from_slice(b"abc"));
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert!(sent.lock().unwrap().is_empty());
        assert_eq!(&outbox.take()[..], b"abc");
    }

    #[test]
    fn a_scope_writes_each_outbox_once_at_its_end() {
        let (outbox, sent, wakes) = outbox(1 << 20);
        {
            let _scope = WriteThrough::begin();
            outbox.push(|b| b.extend_from_slice(b"one "));
            {
                let _inner = WriteThrough::begin();
                outbox.push(|b| b.extend_from_slice(b"two "));
            }
            assert!(
                sent.lock().unwrap().is_empty(),
                "an inner scope's end writes nothing"
            );
            outbox.push(|b| b.extend_from_slice(b"three"));
            assert!(sent.lock().unwrap().is_empty());
        }
        assert_eq!(&sent.lock().unwrap()[..], b"one two three");
        assert_eq!(wakes.load(Ordering::SeqCst), 0);
        assert_eq!(outbox.buffered_bytes(), 0);
        assert!(outbox.take_wrote_through());
        assert!(!outbox.take_wrote_through());
    }

    #[test]
    fn what_the_socket_does_not_take_is_left_to_the_writer() {
        let (outbox, sent, wakes) = outbox(4);
        {
            let _scope = WriteThrough::begin();
            outbox.push(|b| b.extend_from_slice(b"abcdefgh"));
        }
        assert_eq!(&sent.lock().unwrap()[..], b"abcd");
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert_eq!(&outbox.take()[..], b"efgh");
    }

    #[test]
    fn bytes_in_the_writers_hands_keep_the_rest_behind_them() {
        let (outbox, sent, wakes) = outbox(1 << 20);
        outbox.push(|b| b.extend_from_slice(b"first "));
        let in_flight = outbox.take();
        {
            let _scope = WriteThrough::begin();
            outbox.push(|b| b.extend_from_slice(b"second"));
        }
        assert!(
            sent.lock().unwrap().is_empty(),
            "written around the writer's batch"
        );
        assert_eq!(wakes.load(Ordering::SeqCst), 2);
        assert_eq!(&in_flight[..], b"first ");
        assert_eq!(&outbox.take()[..], b"second");
        // The writer came back and found nothing: it is idle, so the next scope writes.
        assert!(outbox.take().is_empty());
        {
            let _scope = WriteThrough::begin();
            outbox.push(|b| b.extend_from_slice(b"third"));
        }
        assert_eq!(&sent.lock().unwrap()[..], b"third");
    }

    #[test]
    fn a_large_batch_is_left_to_the_writer() {
        let (outbox, sent, wakes) = outbox(1 << 20);
        {
            let _scope = WriteThrough::begin();
            outbox.push(|b| b.resize(WRITE_THROUGH_BYTES_MAX + 1, b'x'));
        }
        assert!(sent.lock().unwrap().is_empty());
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert_eq!(outbox.take().len(), WRITE_THROUGH_BYTES_MAX + 1);
    }

    #[test]
    fn a_closed_outbox_is_not_written_through() {
        let (outbox, sent, _) = outbox(1 << 20);
        outbox.close();
        {
            let _scope = WriteThrough::begin();
            outbox.push(|b| b.extend_from_slice(b"late"));
        }
        assert!(sent.lock().unwrap().is_empty());
    }

    #[test]
    fn another_threads_push_to_a_held_outbox_goes_out_with_the_scope() {
        let (outbox, sent, wakes) = outbox(1 << 20);
        let scope = WriteThrough::begin();
        outbox.push(|b| b.extend_from_slice(b"held "));
        let other = outbox.clone();
        std::thread::spawn(move || other.push(|b| b.extend_from_slice(b"other")))
            .join()
            .unwrap();
        drop(scope);
        assert_eq!(&sent.lock().unwrap()[..], b"held other");
        assert_eq!(wakes.load(Ordering::SeqCst), 0);
    }
}
