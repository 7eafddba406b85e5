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
    /// Ends once the outbox is closed and drained, handing back the socket unshut (`None`
    /// after a failed write): when the client closed, RabbitMQ leaves the socket open until the
    /// client closes its side, so only the connection knows when to shut it.
    pub async fn run(mut self) -> Option<W> {
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
            // Read before the drain: what was pushed before the close (the close-ok, often)
            // is then in this drain. Read after it, a push and close landing between the last
            // take and the check were shut down unwritten, and the client saw EOF where it
            // waited for close-ok. A close after this read wakes the next pass.
            let closing = self.outbox.is_closed();
            loop {
                let buf = self.outbox.take();
                if buf.is_empty() {
                    break;
                }
                let congested = buf.len() > OUTBOX_BYTES_SOFT_MAX;
                if self.socket.write_all(&buf).await.is_err() {
                    return None;
                }
                last_write = Instant::now();
                if congested {
                    (self.resume)();
                }
            }
            if self.flush_each_batch && self.socket.flush().await.is_err() {
                return None;
            }
            if closing {
                let _ = self.socket.flush().await;
                return Some(self.socket);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::AsyncReadExt;

    /// A socket that runs `hook` at its first flush: the connection's task acting while the
    /// writer is between its drain and its look at whether the outbox was closed.
    struct FlushHook<W> {
        inner: W,
        hook: Option<Box<dyn FnOnce() + Send>>,
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for FlushHook<W> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            if let Some(hook) = self.hook.take() {
                hook();
            }
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// The connection pushes its last frame (close-ok) and closes the outbox at once, wherever
    /// the writer is in its pass: the frame is written before the writer hands the socket
    /// back, so the client reads it before end of stream, never end of stream alone.
    #[tokio::test]
    async fn what_was_pushed_before_the_close_is_written_before_the_socket_is_shut() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let notify = Arc::new(Notify::new());
        let wake = notify.clone();
        let outbox = Outbox::new(4096, Box::new(move || wake.notify_one()));
        let closing = outbox.clone();
        let writer = Writer {
            socket: FlushHook {
                inner: server,
                hook: Some(Box::new(move || {
                    closing.push(|b| b.extend_from_slice(b"close-ok"));
                    closing.close();
                })),
            },
            // TLS's writer flushes after each pass's drain.
            flush_each_batch: true,
            outbox: outbox.clone(),
            notify,
            heartbeat_s: Arc::new(std::sync::atomic::AtomicU32::new(0)),
            resume: Arc::new(|| {}),
        };
        let task = tokio::spawn(writer.run());
        outbox.push(|b| b.extend_from_slice(b"frames;"));
        let mut socket = task.await.unwrap().expect("the socket handed back");
        socket.shutdown().await.unwrap();
        drop(socket);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"frames;close-ok");
    }
}
