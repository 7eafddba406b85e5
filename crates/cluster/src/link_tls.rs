//! TLS with mutual authentication on the links between nodes (`--cluster-tls-*`).
//!
//! Without it, any process that reaches the cluster port can say it is a node: send a hello,
//! Raft messages, data frames, and stop or mislead the node that reads them. With it, every
//! link (a peer's link, a join request) is TLS 1.3 and both ends present a certificate the
//! cluster's CA signed; the transport's framing and batching run unchanged over the encrypted
//! stream ([`crate::transport`] only wraps the socket).
//!
//! Trust is the CA: any certificate it signed is a node. Names in the certificates are not
//! checked, because nodes reach each other by the addresses in `--cluster-seeds` and in the
//! members' hellos, which certificates often do not list (Erlang's inter-node TLS, with
//! `verify_peer` and no `server_name_indication`, trusts the same way). So the cluster's CA
//! should sign only nodes: where client certificates come from the same CA as the AMQP
//! listener's, give the cluster a CA of its own (`--cluster-tls-ca`).
//!
//! A node's certificate is used both ways (it accepts links and dials them), so it must allow
//! both TLS server and client authentication (both extended key usages, or none): [`LinkTls::load`]
//! checks its own certificate against its CA both ways and refuses to start otherwise, rather
//! than have every peer refuse it later.
//!
//! Every refused peer is one log line saying why (at most one per peer address and reason per
//! [`REFUSAL_LOG_INTERVAL`], as a refused node dials again every few hundred milliseconds) and
//! one count in `/metrics` (`warren_cluster_tls_refused_total{reason}`).
//!
//! Certificates are read again on SIGHUP and `warren ctl reload_certificates`, like the AMQP
//! listener's: links opened afterwards use the new ones, open links keep theirs.
//!
//! Costs: one handshake per link (links live for hours), then AES-GCM or ChaCha20 over every
//! byte, a few GB/s per core against the cluster's tens of MB/s.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// A TLS handshake on a cluster link not done within this is abandoned: on loopback or a LAN
/// it takes a few milliseconds; a peer that stalls longer is not a node in working order.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// One refusal log line per peer address and reason per this interval.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Peer addresses remembered for [`REFUSAL_LOG_INTERVAL`]; past it the memory is cleared (a
/// flood from many addresses logs more lines, never more memory).
const REFUSAL_LOG_PEERS_MAX: usize = 1024;
/// Certificates in a chain or CA file, at most.
const PEM_CERTIFICATES_MAX: usize = 1024;
/// The first byte of a TLS record carrying a handshake message (a ClientHello).
const TLS_RECORD_HANDSHAKE: u8 = 0x16;

/// The PEM files of a node's cluster identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkTlsFiles {
    /// The node's certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA(s) every node's certificate must chain to.
    pub ca: PathBuf,
}

/// Why a peer's link was refused, each counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The peer spoke something else than TLS: a node without cluster TLS, or a stranger.
    NotTls,
    /// No certificate, or one the cluster's CA did not sign.
    UntrustedCertificate,
    /// Expired, or not valid yet.
    ExpiredCertificate,
    /// Another fault: wrong key usage, bad signature, ...
    BadCertificate,
    /// The peer aborted the handshake: usually it does not trust our certificate.
    PeerAlert,
    /// No TLS 1.3 in common, or a protocol error.
    Protocol,
    /// The peer closed the connection or stalled during the handshake.
    Closed,
}

impl Refusal {
    const COUNT: usize = 7;
    const ALL: [Refusal; Self::COUNT] = [
        Refusal::NotTls,
        Refusal::UntrustedCertificate,
        Refusal::ExpiredCertificate,
        Refusal::BadCertificate,
        Refusal::PeerAlert,
        Refusal::Protocol,
        Refusal::Closed,
    ];

    /// The label in `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NotTls => "not_tls",
            Refusal::UntrustedCertificate => "untrusted_certificate",
            Refusal::ExpiredCertificate => "expired_certificate",
            Refusal::BadCertificate => "bad_certificate",
            Refusal::PeerAlert => "peer_alert",
            Refusal::Protocol => "protocol",
            Refusal::Closed => "closed",
        }
    }

    fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|r| *r == self)
            .expect("every refusal is listed")
    }
}

/// The rustls configurations of both ends of a link, built together from the same files.
struct Configs {
    accept: Arc<rustls::ServerConfig>,
    dial: Arc<rustls::ClientConfig>,
}

/// A node's TLS state for its cluster links.
pub struct LinkTls {
    files: LinkTlsFiles,
    configs: RwLock<Configs>,
    refused: [AtomicU64; Refusal::COUNT],
    /// When each (peer address, reason) was last logged.
    logged: Mutex<HashMap<(IpAddr, Refusal), Instant>>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTls")
            .field("files", &self.files)
            .finish()
    }
}

impl LinkTls {
    /// Reads the files and checks the node's own certificate against the CA both ways; the
    /// error names the file and the fault, so that a bad file stops the node at start.
    pub fn load(files: LinkTlsFiles) -> Result<Arc<LinkTls>, String> {
        let configs = build(&files)?;
        tracing::info!(cert = %files.cert.display(), ca = %files.ca.display(), "cluster links use TLS with mutual authentication");
        Ok(Arc::new(LinkTls {
            files,
            configs: RwLock::new(configs),
            refused: Default::default(),
            logged: Mutex::new(HashMap::new()),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        }))
    }

    /// Reads the files again; links opened from now on use them. On any fault the old ones
    /// stay and the error says which file is wrong.
    pub fn reload(&self) -> Result<(), String> {
        match build(&self.files) {
            Ok(configs) => {
                *self.configs.write().expect("tls lock") = configs;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!("cluster TLS certificates reloaded");
                Ok(())
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "cluster TLS certificates not reloaded, still using the old ones");
                Err(e)
            }
        }
    }

    /// The handshake on a link a peer opened to us; `None` if it was refused (logged and
    /// counted here).
    pub async fn accept(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
        let config = self.configs.read().expect("tls lock").accept.clone();
        let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            let mut first = [0u8; 8];
            let n = stream
                .peek(&mut first)
                .await
                .map_err(|e| (Refusal::Closed, format!("socket error: {e}")))?;
            if n == 0 {
                return Err((
                    Refusal::Closed,
                    "closed the connection before the handshake".to_string(),
                ));
            }
            if first[0] != TLS_RECORD_HANDSHAKE {
                return Err((
                    Refusal::NotTls,
                    "did not start a TLS handshake: a node without cluster TLS, or not a node"
                        .to_string(),
                ));
            }
            tokio_rustls::TlsAcceptor::from(config)
                .accept(stream)
                .await
                .map_err(|e| classify(&e))
        })
        .await;
        match outcome {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err((refusal, why))) => {
                self.refuse(peer, refusal, &why);
                None
            }
            Err(_) => {
                self.refuse(
                    peer,
                    Refusal::Closed,
                    &format!(
                        "did not finish the TLS handshake within {} s",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ),
                );
                None
            }
        }
    }

    /// The handshake on a link we opened to `addr`. In TLS 1.3 the peer checks our
    /// certificate after we finished: its refusal shows on the first read, which
    /// [`LinkTls::describe`] words.
    pub async fn dial(
        &self,
        stream: TcpStream,
        addr: SocketAddr,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let config = self.configs.read().expect("tls lock").dial.clone();
        // Names are not checked (see the module's doc); the address stands in for one.
        let name = ServerName::IpAddress(addr.ip().into());
        match tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            tokio_rustls::TlsConnector::from(config).connect(name, stream),
        )
        .await
        {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(format!(
                "TLS handshake with {addr} failed: {}",
                classify(&e).1
            )),
            Err(_) => Err(format!(
                "TLS handshake with {addr} not done within {} s",
                HANDSHAKE_TIMEOUT.as_secs()
            )),
        }
    }

    /// Words an I/O error on a TLS link, if TLS caused it (the peer refused our certificate,
    /// most often).
    pub fn describe(e: &std::io::Error) -> Option<String> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(|_| classify(e).1)
    }

    /// Counts a refused peer, and logs it unless the same peer was logged for the same reason
    /// within [`REFUSAL_LOG_INTERVAL`].
    fn refuse(&self, peer: SocketAddr, refusal: Refusal, why: &str) {
        let total = self.refused[refusal.index()].fetch_add(1, Ordering::Relaxed) + 1;
        let now = Instant::now();
        let mut logged = self.logged.lock().expect("log lock");
        if logged.len() >= REFUSAL_LOG_PEERS_MAX {
            logged.retain(|_, at| now.duration_since(*at) < REFUSAL_LOG_INTERVAL);
            if logged.len() >= REFUSAL_LOG_PEERS_MAX {
                logged.clear();
            }
        }
        let key = (peer.ip(), refusal);
        if logged
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < REFUSAL_LOG_INTERVAL)
        {
            return;
        }
        logged.insert(key, now);
        drop(logged);
        tracing::warn!(%peer, reason = refusal.label(), refused_total = total, "cluster link refused: the peer {why}");
    }

    /// Refused links by reason.
    pub fn refused(&self) -> Vec<(&'static str, u64)> {
        Refusal::ALL
            .iter()
            .map(|r| (r.label(), self.refused[r.index()].load(Ordering::Relaxed)))
            .collect()
    }

    /// Appends `warren_cluster_tls_*` to a Prometheus text exposition.
    pub fn write_prometheus(&self, out: &mut String) {
        let _ = writeln!(out, "# TYPE warren_cluster_tls_refused_total counter");
        for (reason, n) in self.refused() {
            let _ = writeln!(
                out,
                "warren_cluster_tls_refused_total{{reason=\"{reason}\"}} {n}"
            );
        }
        for (name, v) in [
            ("reloads", &self.reloads),
            ("reload_failures", &self.reload_failures),
        ] {
            let _ = writeln!(
                out,
                "# TYPE warren_cluster_tls_{name}_total counter\nwarren_cluster_tls_{name}_total {}",
                v.load(Ordering::Relaxed)
            );
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(files: &LinkTlsFiles) -> Result<Configs, String> {
    let chain = read_certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        format!(
            "cannot read a private key from {}: {e}",
            files.key.display()
        )
    })?;
    let mut roots = RootCertStore::empty();
    for ca in read_certificates(&files.ca)? {
        roots.add(ca).map_err(|e| {
            format!(
                "a CA certificate in {} is not usable: {e}",
                files.ca.display()
            )
        })?;
    }
    let roots = Arc::new(roots);
    let with_ca = |e: rustls::Error| {
        format!(
            "cannot verify nodes with the CAs in {}: {e}",
            files.ca.display()
        )
    };
    let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| with_ca(rustls::Error::General(e.to_string())))?;
    let servers = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| with_ca(rustls::Error::General(e.to_string())))?;
    let servers = Arc::new(NodeVerifier(servers));
    check_own_certificate(files, &chain, clients.as_ref(), servers.as_ref())?;
    let mismatch = |e: rustls::Error| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "the private key in {} does not match the certificate in {}",
            files.key.display(),
            files.cert.display()
        ),
        e => format!(
            "cannot use the certificate in {} with the key in {}: {e}",
            files.cert.display(),
            files.key.display()
        ),
    };
    let accept = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3: {e}"))?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(mismatch)?;
    let dial = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(servers)
        .with_client_auth_cert(chain, key)
        .map_err(mismatch)?;
    Ok(Configs {
        accept: Arc::new(accept),
        dial: Arc::new(dial),
    })
}

/// Verifies the node's own certificate as its peers will, both as a server's and as a
/// client's: a certificate from another CA, expired, or without the client or server key
/// usage would have every peer refuse the node; better to say so at start.
fn check_own_certificate(
    files: &LinkTlsFiles,
    chain: &[CertificateDer<'static>],
    clients: &dyn ClientCertVerifier,
    servers: &NodeVerifier,
) -> Result<(), String> {
    let now = UnixTime::now();
    let (leaf, intermediates) = chain.split_first().expect("read_certificates: not empty");
    let name = ServerName::try_from("warren-node").expect("a valid name");
    let fault = |role: &str, e: rustls::Error| {
        let why = match &e {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                format!("no CA in {} signed it", files.ca.display())
            }
            rustls::Error::InvalidCertificate(
                CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
            ) => format!(
                "it does not allow TLS {role} authentication: a node's certificate needs both \
                 the serverAuth and clientAuth extended key usages (or none), as every node \
                 both accepts and opens links"
            ),
            _ => format!("{e}"),
        };
        format!(
            "the cluster certificate in {} is not one its peers would accept: {why}",
            files.cert.display()
        )
    };
    servers
        .verify_server_cert(leaf, intermediates, &name, &[], now)
        .map_err(|e| fault("server", e))?;
    clients
        .verify_client_cert(leaf, intermediates, now)
        .map_err(|e| fault("client", e))?;
    Ok(())
}

/// Checks a peer's certificate chain to the cluster's CA, its validity and key usage, but not
/// its names (see the module's doc).
#[derive(Debug)]
struct NodeVerifier(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for NodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The name is checked last, once the chain, validity and key usage passed.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let fail = |e: rustls::pki_types::pem::Error| {
        format!("cannot read certificates from {}: {e}", path.display())
    };
    let mut out = Vec::new();
    for cert in CertificateDer::pem_file_iter(path).map_err(fail)? {
        out.push(cert.map_err(fail)?);
        if out.len() > PEM_CERTIFICATES_MAX {
            return Err(format!(
                "{} holds more than {PEM_CERTIFICATES_MAX} certificates",
                path.display()
            ));
        }
    }
    if out.is_empty() {
        return Err(format!(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in {}",
            path.display()
        ));
    }
    Ok(out)
}

/// A failed handshake as one of the counted reasons, with words for the log (completing "the
/// peer ...").
fn classify(e: &std::io::Error) -> (Refusal, String) {
    let Some(err) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return (
            Refusal::Closed,
            format!("closed the connection during the TLS handshake ({e})"),
        );
    };
    match err {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => (
                Refusal::ExpiredCertificate,
                "presented an expired certificate".into(),
            ),
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => (
                Refusal::ExpiredCertificate,
                "presented a certificate not valid yet".into(),
            ),
            CertificateError::UnknownIssuer => (
                Refusal::UntrustedCertificate,
                "presented a certificate the cluster's CA did not sign (--cluster-tls-ca)".into(),
            ),
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => (
                Refusal::BadCertificate,
                "presented a certificate not allowed for this use: a node's needs both the \
                 serverAuth and clientAuth extended key usages"
                    .into(),
            ),
            other => (
                Refusal::BadCertificate,
                format!("presented a certificate that is refused: {other:?}"),
            ),
        },
        rustls::Error::NoCertificatesPresented => (
            Refusal::UntrustedCertificate,
            "presented no certificate: every node must (--cluster-tls-cert)".into(),
        ),
        rustls::Error::AlertReceived(alert) => {
            use rustls::AlertDescription as A;
            let hint = match alert {
                A::UnknownCA
                | A::BadCertificate
                | A::CertificateUnknown
                | A::UnsupportedCertificate
                | A::AccessDenied
                | A::CertificateRequired => {
                    ": it does not trust this node's certificate (are both nodes' certificates \
                     signed by the same cluster CA?)"
                }
                A::CertificateExpired => ": it says this node's certificate has expired",
                A::ProtocolVersion | A::HandshakeFailure => {
                    ": no TLS version in common (cluster links are TLS 1.3)"
                }
                _ => "",
            };
            (
                Refusal::PeerAlert,
                format!("aborted the TLS handshake with alert {alert:?}{hint}"),
            )
        }
        other => (
            Refusal::Protocol,
            format!("broke the TLS protocol: {other}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_has_a_distinct_label() {
        let mut labels: Vec<&str> = Refusal::ALL.iter().map(|r| r.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Refusal::COUNT);
    }
}
