//! TLS at the edges: AMQP over TLS (amqps), the management API over HTTPS, certificate logins
//! (SASL EXTERNAL), and certificates reloaded without a restart.
//!
//! The map:
//! - [`Tls`]: the `[tls]` settings made into rustls server configurations, one for AMQP and
//!   one for HTTPS. Each accepted connection reads the current one; a reload (SIGHUP,
//!   `warren ctl reload_certificates`) builds new ones from the files and swaps them in whole,
//!   or keeps the old ones and says why if the new files are bad. Connections already open
//!   keep the configuration they were accepted with.
//! - `loading`: the certificate, key and CA files read and checked into those configurations
//!   (a bad file named with what is wrong in it), at start and at every reload.
//! - [`serve_amqps`]: one socket accepted on the TLS listener: the TLS handshake, then the
//!   ordinary AMQP connection ([`crate::amqp::connection`]) over the encrypted stream.
//! - [`certificate`]: the subject of a client certificate as a user name, RabbitMQ's way.
//! - [`https`]: the management API's HTTPS listener.
//!
//! Every refused handshake is one log line saying why (a plain AMQP client on the TLS port, a
//! certificate no trusted CA signed, an expired one, none at all, a client that refused ours,
//! a timeout) and one count in `/metrics` (`warren_tls_handshake_failures_total{reason}`).
//!
//! Costs: the plain listener does not go through here at all. A TLS connection costs one
//! handshake (one signature with the server key, plus one verification per client
//! certificate) and then an AES-GCM or ChaCha20 pass over every byte each way; the frame loop
//! and the writer's batching are the same code, monomorphised over the stream type.

pub mod certificate;
pub mod https;
mod loading;

use crate::node::config::TlsConfig;
use crate::Shared;
use loading::build;
use rustls::pki_types::CertificateDer;
use rustls::CertificateError;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The first byte of a TLS record carrying a handshake message (a ClientHello).
const TLS_RECORD_HANDSHAKE: u8 = 0x16;
/// Bytes looked at to tell a plain AMQP (or HTTP) client from a TLS one.
const PEEK_BYTES: usize = 8;

/// The node's TLS state, shared by the listeners, the management API and the reload signal.
pub struct Tls {
    config: TlsConfig,
    /// The AMQP listener's configuration, when there is a TLS listener.
    amqp: RwLock<Option<Arc<rustls::ServerConfig>>>,
    /// The HTTPS listener's configuration, when there is one.
    management: RwLock<Option<Arc<rustls::ServerConfig>>>,
    failures: [AtomicU64; HandshakeFailure::COUNT],
    reloads: AtomicU64,
    reload_failures: AtomicU64,
}

/// Why certificates could not be loaded: the message names the file and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError(pub String);

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

/// What the AMQP handshake needs to know of a TLS connection: the client's certificate.
#[derive(Debug, Clone, Default)]
pub struct TlsPeer {
    /// The end-entity certificate the client presented (already verified by rustls).
    pub certificate: Option<CertificateDer<'static>>,
}

/// Handshakes refused by reason, and certificate reloads, for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct TlsCounts {
    pub failures: Vec<(&'static str, u64)>,
    pub reloads: u64,
    pub reload_failures: u64,
}

/// The two TLS listeners, each with a configuration of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Amqps,
    Https,
}

impl Listener {
    pub fn name(self) -> &'static str {
        match self {
            Listener::Amqps => "amqps",
            Listener::Https => "https",
        }
    }
}

/// The reasons a TLS handshake is refused, each counted apart in `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The client spoke something else first: plain AMQP, HTTP, garbage.
    NotTls,
    /// No trusted CA signed the client's certificate.
    UntrustedCertificate,
    /// The client's certificate has expired, or is not valid yet.
    ExpiredCertificate,
    /// The client sent no certificate and `fail_if_no_peer_cert` is set.
    NoCertificate,
    /// Another fault in the client's certificate (bad signature, wrong key usage, ...).
    BadCertificate,
    /// The client refused the handshake with an alert: usually it does not trust our
    /// certificate, or wants a TLS version or cipher suite we do not offer.
    ClientAlert,
    /// No TLS version or cipher suite in common, or a protocol error.
    Protocol,
    /// The client closed the connection during the handshake.
    Closed,
    /// The handshake did not finish within `handshake_timeout`.
    Timeout,
}

impl HandshakeFailure {
    const COUNT: usize = 9;
    const ALL: [HandshakeFailure; Self::COUNT] = [
        HandshakeFailure::NotTls,
        HandshakeFailure::UntrustedCertificate,
        HandshakeFailure::ExpiredCertificate,
        HandshakeFailure::NoCertificate,
        HandshakeFailure::BadCertificate,
        HandshakeFailure::ClientAlert,
        HandshakeFailure::Protocol,
        HandshakeFailure::Closed,
        HandshakeFailure::Timeout,
    ];

    /// The label in `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::NotTls => "not_tls",
            HandshakeFailure::UntrustedCertificate => "untrusted_certificate",
            HandshakeFailure::ExpiredCertificate => "expired_certificate",
            HandshakeFailure::NoCertificate => "no_certificate",
            HandshakeFailure::BadCertificate => "bad_certificate",
            HandshakeFailure::ClientAlert => "client_alert",
            HandshakeFailure::Protocol => "protocol",
            HandshakeFailure::Closed => "closed",
            HandshakeFailure::Timeout => "timeout",
        }
    }

    fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|f| *f == self)
            .expect("every failure is listed")
    }
}

impl Tls {
    /// Loads the certificates the settings name; None when no TLS listener is configured.
    /// Errors name the file and the fault, so that a bad file stops the node at start.
    pub fn load(config: &TlsConfig) -> Result<Option<Arc<Tls>>, TlsError> {
        if config.listen.is_none() && config.management_listen.is_none() {
            return Ok(None);
        }
        let (amqp, management) = build(config)?;
        Ok(Some(Arc::new(Tls {
            config: config.clone(),
            amqp: RwLock::new(amqp),
            management: RwLock::new(management),
            failures: Default::default(),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        })))
    }

    /// Reads the certificate, key and CA files again and swaps the new configurations in;
    /// on any fault the old ones stay and the error says which file is wrong.
    pub fn reload(&self) -> Result<(), TlsError> {
        match build(&self.config) {
            Ok((amqp, management)) => {
                *self.amqp.write().expect("tls lock") = amqp;
                *self.management.write().expect("tls lock") = management;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!("TLS certificates reloaded");
                Ok(())
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "TLS certificates not reloaded, still using the old ones");
                Err(e)
            }
        }
    }

    /// The configuration a connection accepted now on the AMQP TLS listener gets.
    pub fn amqp_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.amqp.read().expect("tls lock").clone()
    }

    /// The configuration a connection accepted now on the HTTPS listener gets.
    pub fn management_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.management.read().expect("tls lock").clone()
    }

    /// Counts a refused handshake and logs why, with the peer's address.
    pub fn refused(
        &self,
        peer: SocketAddr,
        listener: Listener,
        failure: HandshakeFailure,
        why: &str,
    ) {
        self.failures[failure.index()].fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%peer, listener = listener.name(), reason = failure.label(), "TLS handshake refused: {why}");
    }

    /// The user name SASL EXTERNAL logs in as, or why there is none (RabbitMQ's texts).
    pub fn external_user(&self, peer: Option<&TlsPeer>) -> Result<String, String> {
        let Some(peer) = peer else {
            return Err("not SSL connection".into());
        };
        if !self.config.verify_peer {
            return Err(
                "TLS configuration is unsafe: EXTERNAL needs --tls-verify-peer, or anyone could name themselves"
                    .into(),
            );
        }
        let Some(der) = &peer.certificate else {
            return Err("connection peer presented no TLS (x.509) certificate".into());
        };
        let info = certificate::CertificateInfo::parse(der).map_err(|e| e.to_string())?;
        info.login_name(self.config.cert_login_from)
            .ok_or_else(|| "no name found".into())
    }

    /// The TLS lines of `/metrics`.
    /// The counters `/metrics` shows as `warren_tls_*`.
    pub fn counts(&self) -> TlsCounts {
        TlsCounts {
            failures: HandshakeFailure::ALL
                .iter()
                .map(|f| (f.label(), self.failures[f.index()].load(Ordering::Relaxed)))
                .collect(),
            reloads: self.reloads.load(Ordering::Relaxed),
            reload_failures: self.reload_failures.load(Ordering::Relaxed),
        }
    }
}

/// Serves one socket accepted on the AMQP TLS listener: the TLS handshake, then AMQP.
pub async fn serve_amqps(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let deadline = Instant::now() + shared.config.handshake_timeout();
    let Some(tls) = shared.tls.clone() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    match tokio::time::timeout_at(deadline, handshake(&tls, stream, Listener::Amqps)).await {
        Err(_) => tls.refused(
            peer,
            Listener::Amqps,
            HandshakeFailure::Timeout,
            &format!(
                "not finished within the handshake timeout ({} ms)",
                shared.config.handshake_timeout_ms
            ),
        ),
        Ok(Err((failure, why))) => tls.refused(peer, Listener::Amqps, failure, &why),
        Ok(Ok(stream)) => {
            let (_, session) = stream.get_ref();
            tracing::debug!(%peer, version = ?session.protocol_version(), suite = ?session.negotiated_cipher_suite().map(|s| s.suite()), "TLS handshake done");
            let tls_peer = TlsPeer {
                certificate: session
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.clone().into_owned()),
            };
            let (rd, wr) = tokio::io::split(stream);
            crate::amqp::connection::serve_stream(
                rd,
                wr,
                peer,
                local,
                crate::amqp::connection::StreamKind::Tls(tls_peer),
                deadline,
                shared,
            )
            .await;
        }
    }
}

/// The TLS handshake on an accepted socket, or why it failed. The listener's current
/// configuration is read here, so a reload applies from the next connection on.
pub(crate) async fn handshake(
    tls: &Tls,
    stream: TcpStream,
    listener: Listener,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, (HandshakeFailure, String)> {
    let config = match listener {
        Listener::Amqps => tls.amqp_config(),
        Listener::Https => tls.management_config(),
    };
    let Some(config) = config else {
        return Err((HandshakeFailure::Protocol, "TLS is not configured".into()));
    };
    let mut first = [0u8; PEEK_BYTES];
    let n = stream
        .peek(&mut first)
        .await
        .map_err(|e| (HandshakeFailure::Closed, format!("socket error: {e}")))?;
    if n == 0 {
        return Err((
            HandshakeFailure::Closed,
            "the client closed the connection before the handshake".into(),
        ));
    }
    if first[0] != TLS_RECORD_HANDSHAKE {
        return Err((HandshakeFailure::NotTls, not_tls(&first[..n])));
    }
    tokio_rustls::TlsAcceptor::from(config)
        .accept(stream)
        .await
        .map_err(|e| classify(&e))
}

/// Says what a client that does not speak TLS sent instead.
fn not_tls(first: &[u8]) -> String {
    if first.starts_with(b"AMQP") {
        return "a plain AMQP client on the TLS port (it sent the AMQP protocol header, not a TLS ClientHello): connect with amqps:// and TLS, or to the plain listener".into();
    }
    if first.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return format!(
            "not a TLS ClientHello: the client sent plain text ({:?}...)",
            String::from_utf8_lossy(first)
        );
    }
    format!("not a TLS ClientHello: the client sent {first:02x?}")
}

/// A failed rustls handshake as one of the counted reasons, with words for the log.
fn classify(e: &std::io::Error) -> (HandshakeFailure, String) {
    use HandshakeFailure as F;
    let Some(err) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return match e.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe => (
                F::Closed,
                "the client closed the connection during the handshake".into(),
            ),
            _ => (F::Closed, format!("socket error: {e}")),
        };
    };
    match err {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::Expired => (
                F::ExpiredCertificate,
                "the client certificate has expired".into(),
            ),
            CertificateError::ExpiredContext { time, not_after } => (
                F::ExpiredCertificate,
                format!(
                    "the client certificate expired at {} (now {})",
                    certificate::utc_text(not_after.as_secs() as i64),
                    certificate::utc_text(time.as_secs() as i64)
                ),
            ),
            CertificateError::NotValidYet => (
                F::ExpiredCertificate,
                "the client certificate is not valid yet".into(),
            ),
            CertificateError::NotValidYetContext { time, not_before } => (
                F::ExpiredCertificate,
                format!(
                    "the client certificate is not valid before {} (now {})",
                    certificate::utc_text(not_before.as_secs() as i64),
                    certificate::utc_text(time.as_secs() as i64)
                ),
            ),
            CertificateError::UnknownIssuer => (
                F::UntrustedCertificate,
                "the client certificate is not signed by a trusted CA (--tls-ca)".into(),
            ),
            other => (
                F::BadCertificate,
                format!("the client certificate is refused: {other:?}"),
            ),
        },
        rustls::Error::NoCertificatesPresented => (
            F::NoCertificate,
            "the client presented no certificate, and --tls-fail-if-no-peer-cert requires one"
                .into(),
        ),
        rustls::Error::AlertReceived(alert) => {
            use rustls::AlertDescription as A;
            let hint = match alert {
                A::UnknownCA | A::BadCertificate | A::CertificateUnknown | A::UnsupportedCertificate | A::AccessDenied => {
                    ": it does not trust the server's certificate (check its CA file and the certificate's names)"
                }
                A::CertificateExpired => ": it says the server's certificate has expired",
                A::ProtocolVersion | A::HandshakeFailure | A::InsufficientSecurity => {
                    ": no TLS version or cipher suite in common (--tls-versions)"
                }
                _ => "",
            };
            (
                F::ClientAlert,
                format!("the client aborted the handshake with alert {alert:?}{hint}"),
            )
        }
        rustls::Error::PeerIncompatible(why) => (
            F::Protocol,
            format!("the client is incompatible: {why:?} (warren speaks TLS 1.2 and 1.3)"),
        ),
        other => (F::Protocol, format!("{other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::loading::provider;
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    use rustls::pki_types::PrivateKeyDer;
    use rustls::RootCertStore;
    use std::path::Path;
    use std::path::PathBuf;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Issued {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    fn ca(name: &str) -> Issued {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        Issued {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    fn leaf(issuer: &Issued, cn: &str, expired: bool) -> Issued {
        let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        Issued {
            cert: p.signed_by(&key, &issuer.cert, &issuer.key).unwrap(),
            key,
        }
    }

    fn write(dir: &Path, stem: &str, i: &Issued) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, i.cert.pem()).unwrap();
        std::fs::write(&key, i.key.serialize_pem()).unwrap();
        (cert, key)
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("warren-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn settings(cert: PathBuf, key: PathBuf, ca: Option<PathBuf>) -> TlsConfig {
        TlsConfig {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            cert: Some(cert),
            key: Some(key),
            verify_peer: ca.is_some(),
            fail_if_no_peer_cert: ca.is_some(),
            ca,
            ..TlsConfig::default()
        }
    }

    #[test]
    fn a_key_that_does_not_match_the_certificate_is_named() {
        let dir = scratch("mismatch");
        let root = ca("root");
        let (cert, _) = write(&dir, "server", &leaf(&root, "localhost", false));
        let (_, other_key) = write(&dir, "other", &leaf(&root, "other", false));
        let err = Tls::load(&settings(cert.clone(), other_key.clone(), None))
            .err()
            .expect("refused");
        assert_eq!(
            err.0,
            format!(
                "the private key in {} does not match the certificate in {}",
                other_key.display(),
                cert.display()
            )
        );
    }

    #[test]
    fn a_failed_reload_keeps_the_working_configuration() {
        let dir = scratch("reload");
        let root = ca("root");
        let (cert, key) = write(&dir, "server", &leaf(&root, "localhost", false));
        let tls = Tls::load(&settings(cert.clone(), key.clone(), None))
            .unwrap()
            .unwrap();
        let first = tls.amqp_config().unwrap();
        std::fs::write(&cert, "garbage").unwrap();
        let err = tls.reload().unwrap_err();
        assert!(err.0.contains("no PEM certificate"), "{err}");
        assert!(Arc::ptr_eq(&first, &tls.amqp_config().unwrap()));
        write(&dir, "server", &leaf(&root, "localhost", false));
        tls.reload().unwrap();
        assert!(!Arc::ptr_eq(&first, &tls.amqp_config().unwrap()));
    }

    #[test]
    fn external_needs_verified_peers_and_a_certificate() {
        let dir = scratch("external");
        let root = ca("root");
        let (cert, key) = write(&dir, "server", &leaf(&root, "localhost", false));
        let (ca_path, _) = write(&dir, "ca", &root);
        let client = leaf(&root, "app-1", false);
        let peer = TlsPeer {
            certificate: Some(client.cert.der().clone()),
        };
        let verified = Tls::load(&settings(cert.clone(), key.clone(), Some(ca_path)))
            .unwrap()
            .unwrap();
        assert_eq!(verified.external_user(Some(&peer)), Ok("CN=app-1".into()));
        assert_eq!(
            verified.external_user(None),
            Err("not SSL connection".into())
        );
        assert_eq!(
            verified.external_user(Some(&TlsPeer::default())),
            Err("connection peer presented no TLS (x.509) certificate".into())
        );
        let unverified = Tls::load(&settings(cert, key, None)).unwrap().unwrap();
        assert!(unverified
            .external_user(Some(&peer))
            .unwrap_err()
            .starts_with("TLS configuration is unsafe"));
    }

    /// Runs the server side of one handshake against `client` and returns its outcome.
    async fn server_outcome<F, Fut>(tls: Arc<Tls>, client: F) -> Result<(), HandshakeFailure>
    where
        F: FnOnce(SocketAddr) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(client(addr));
        let (stream, _) = listener.accept().await.unwrap();
        let outcome = match handshake(&tls, stream, Listener::Amqps).await {
            Ok(mut s) => {
                // TLS 1.3 verifies the client's certificate after the client's Finished.
                let mut b = [0u8; 1];
                let _ = s.read(&mut b).await;
                Ok(())
            }
            Err((f, _)) => Err(f),
        };
        let _ = client.await;
        outcome
    }

    fn client_config(root: &Issued, cert: Option<&Issued>) -> Arc<rustls::ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(root.cert.der().clone()).unwrap();
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match cert {
            Some(c) => b
                .with_client_auth_cert(
                    vec![c.cert.der().clone()],
                    PrivateKeyDer::try_from(c.key.serialize_der()).unwrap(),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        })
    }

    async fn tls_client(addr: SocketAddr, config: Arc<rustls::ClientConfig>) {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        if let Ok(mut s) = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
        {
            let _ = s.write_all(b"AMQP\x00\x00\x09\x01").await;
            let mut b = [0u8; 1];
            let _ = s.read(&mut b).await;
        }
    }

    #[tokio::test]
    async fn each_refused_handshake_says_why() {
        let dir = scratch("refusals");
        let root = ca("root");
        let stranger_ca = ca("stranger");
        let (cert, key) = write(&dir, "server", &leaf(&root, "localhost", false));
        let (ca_path, _) = write(&dir, "ca", &root);
        let tls = Tls::load(&settings(cert, key, Some(ca_path)))
            .unwrap()
            .unwrap();
        let good = leaf(&root, "client", false);
        let expired = leaf(&root, "client", true);
        let untrusted = leaf(&stranger_ca, "client", false);
        let cases: Vec<(Option<&Issued>, Result<(), HandshakeFailure>)> = vec![
            (Some(&good), Ok(())),
            (Some(&expired), Err(HandshakeFailure::ExpiredCertificate)),
            (
                Some(&untrusted),
                Err(HandshakeFailure::UntrustedCertificate),
            ),
            (None, Err(HandshakeFailure::NoCertificate)),
        ];
        for (client_cert, expected) in cases {
            let config = client_config(&root, client_cert);
            let got = server_outcome(tls.clone(), move |addr| tls_client(addr, config)).await;
            assert_eq!(got, expected);
        }
        let got = server_outcome(tls.clone(), |addr| async move {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            let _ = tcp.write_all(b"AMQP\x00\x00\x09\x01").await;
            let mut b = [0u8; 16];
            let _ = tcp.read(&mut b).await;
        })
        .await;
        assert_eq!(got, Err(HandshakeFailure::NotTls));
        let untrusting = client_config(&stranger_ca, Some(&good));
        let got = server_outcome(tls.clone(), move |addr| tls_client(addr, untrusting)).await;
        assert_eq!(got, Err(HandshakeFailure::ClientAlert));
    }
}
