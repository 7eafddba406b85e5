//! A connection's outbound byte buffer, shared between the broker logic that produces frames
//! (deliveries to consumers, confirms) and the connection's writer task that sends them.
//!
//! Frames from many messages accumulate here and leave in one write syscall: the broker never
//! waits on a socket, and a busy consumer connection gets large batched writes.

use bytes::BytesMut;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

/// Above this many buffered bytes a connection stops receiving new deliveries until its writer
/// drains it, so that a slow consumer cannot make the broker buffer without bound.
pub const OUTBOX_BYTES_SOFT_MAX: usize = 4 * 1024 * 1024;

pub struct Outbox {
    buf: Mutex<BytesMut>,
    wake: Box<dyn Fn() + Send + Sync>,
    frame_max: AtomicU32,
    closed: AtomicBool,
}

impl Outbox {
    /// `wake` is called when bytes are added so the writer task sends them.
    pub fn new(frame_max: u32, wake: Box<dyn Fn() + Send + Sync>) -> Self {
        Outbox {
            buf: Mutex::new(BytesMut::with_capacity(64 * 1024)),
            wake,
            frame_max: AtomicU32::new(frame_max),
            closed: AtomicBool::new(false),
        }
    }

    pub fn frame_max(&self) -> u32 {
        self.frame_max.load(Ordering::Relaxed)
    }

    /// Bodies are split at the frame-max the client negotiated, known only after tune-ok.
    pub fn set_frame_max(&self, frame_max: u32) {
        self.frame_max.store(frame_max, Ordering::Relaxed);
    }

    /// Appends frames built by `f` and wakes the writer.
    pub fn push(&self, f: impl FnOnce(&mut BytesMut)) {
        {
            let mut buf = self.buf.lock().expect("outbox lock poisoned");
            f(&mut buf);
        }
        (self.wake)();
    }

    /// Takes everything buffered, leaving an empty buffer that keeps its capacity hint.
    pub fn take(&self) -> BytesMut {
        let mut buf = self.buf.lock().expect("outbox lock poisoned");
        let cap = buf.capacity().clamp(64 * 1024, OUTBOX_BYTES_SOFT_MAX);
        std::mem::replace(&mut *buf, BytesMut::with_capacity(cap))
    }

    pub fn buffered_bytes(&self) -> usize {
        self.buf.lock().expect("outbox lock poisoned").len()
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
