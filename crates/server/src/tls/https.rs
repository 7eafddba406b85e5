//! The management API over HTTPS: an axum listener whose connections arrive already through
//! their TLS handshake.
//!
//! Handshakes run in tasks of their own, each bounded by the handshake timeout, so one slow
//! or silent client never holds up the others; finished ones queue for axum (at most
//! [`HANDSHAKES_READY_MAX`], then the acceptor waits).

use super::{HandshakeFailure, Listener, Tls};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// Handshaken connections waiting for axum to take them.
const HANDSHAKES_READY_MAX: usize = 64;

pub struct HttpsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl HttpsListener {
    /// Starts accepting on `listener`; TLS handshakes use the node's current HTTPS config.
    pub fn new(listener: TcpListener, tls: Arc<Tls>, handshake_timeout: Duration) -> Self {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let (tx, ready) = mpsc::channel(HANDSHAKES_READY_MAX);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "management HTTPS accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let tls = tls.clone();
                let ready = tx.clone();
                tokio::spawn(async move {
                    let done = tokio::time::timeout(
                        handshake_timeout,
                        super::handshake(&tls, stream, Listener::Https),
                    )
                    .await;
                    match done {
                        Ok(Ok(stream)) => {
                            let _ = ready.send((stream, peer)).await;
                        }
                        Ok(Err((failure, why))) => {
                            tls.refused(peer, Listener::Https, failure, &why)
                        }
                        Err(_) => tls.refused(
                            peer,
                            Listener::Https,
                            HandshakeFailure::Timeout,
                            &format!(
                                "not finished within the handshake timeout ({} ms)",
                                handshake_timeout.as_millis()
                            ),
                        ),
                    }
                });
            }
        });
        HttpsListener { local, ready }
    }
}

impl axum::serve::Listener for HttpsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The acceptor task only ends once this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Serves the management API over HTTPS on `l`, bound at start by [`crate::bind`] (a port
/// that cannot be bound stops the node there, as RabbitMQ refuses to boot).
pub fn start(l: TcpListener, tls: Arc<Tls>, shared: Arc<crate::Shared>) {
    if let Ok(addr) = l.local_addr() {
        tracing::info!(listen = %addr, "management API over HTTPS started");
    }
    let listener = HttpsListener::new(l, tls, shared.config.handshake_timeout());
    let app = crate::management::router(shared);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
}
