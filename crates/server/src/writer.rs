//! A connection's writer task: drains the outbox into the socket, one write per batch, and
//! sends heartbeats when the connection has been quiet for half the negotiated interval.

use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::time::Instant;
use warren_broker::outbox::{Outbox, OUTBOX_BYTES_SOFT_MAX};

/// Generic over the socket (a plain TCP write half, or a TLS one) so that the plain path
/// costs nothing more than before.
pub struct Writer<W> {
    pub socket: W,
    /// TLS holds the end of a batch in its record buffer until flushed; plain TCP has nothing
    /// to flush, so its writer skips the call altogether.
    pub flush_each_batch: bool,
    pub outbox: Arc<Outbox>,
    pub notify: Arc<Notify>,
    /// Negotiated heartbeat in seconds (0: none); set once tune-ok arrives.
    pub heartbeat_s: Arc<std::sync::atomic::AtomicU32>,
    /// Called after a congested outbox was drained, so the broker resumes deliveries.
    pub resume: Arc<dyn Fn() + Send + Sync>,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub async fn run(mut self) {
        let mut last_write = Instant::now();
        loop {
            let hb = self.heartbeat_s.load(std::sync::atomic::Ordering::Relaxed);
            let idle_limit = if hb == 0 {
                Duration::from_secs(3600)
            } else {
                Duration::from_millis(hb as u64 * 500)
            };
            tokio::select! {
                _ = self.notify.notified() => {}
                _ = tokio::time::sleep_until(last_write + idle_limit) => {
                    // Frames written through by another thread (see `Outbox`) broke the
                    // silence a heartbeat is for.
                    if self.outbox.take_wrote_through() {
                        last_write = Instant::now();
                    } else if hb != 0 {
                        self.outbox.push(warren_protocol::frame::encode_heartbeat);
                    }
                }
            }
            loop {
                let buf = self.outbox.take();
                if buf.is_empty() {
                    break;
                }
                let congested = buf.len() > OUTBOX_BYTES_SOFT_MAX;
                if self.socket.write_all(&buf).await.is_err() {
                    return;
                }
                last_write = Instant::now();
                if congested {
                    (self.resume)();
                }
            }
            if self.flush_each_batch && self.socket.flush().await.is_err() {
                return;
            }
            if self.outbox.is_closed() {
                let _ = self.socket.flush().await;
                let _ = self.socket.shutdown().await;
                return;
            }
        }
    }
}
