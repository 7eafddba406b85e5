//! The certificate, key and CA files the `[tls]` settings name, made into rustls server
//! configurations: read at start and again on every reload, so that a bad file is named
//! (which file, what is wrong) before anything is swapped in.

use super::{certificate, Listener, TlsError};
use crate::node::config::TlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use std::path::Path;
use std::sync::Arc;

/// Certificates in a chain or CA file, at most: far above any real chain or CA bundle.
const PEM_CERTIFICATES_MAX: usize = 1024;

pub(super) type Configs = (
    Option<Arc<rustls::ServerConfig>>,
    Option<Arc<rustls::ServerConfig>>,
);

pub(super) fn build(c: &TlsConfig) -> Result<Configs, TlsError> {
    let amqp = match (&c.listen, &c.cert, &c.key) {
        (Some(_), Some(cert), Some(key)) => Some(Arc::new(server_config(
            c,
            Listener::Amqps,
            cert,
            key,
            c.verify_peer,
            &[],
        )?)),
        (Some(_), _, _) => {
            return Err(TlsError(
                "--tls-listen needs --tls-cert and --tls-key".into(),
            ))
        }
        (None, _, _) => None,
    };
    let management = match c.management_listen {
        Some(_) => {
            let cert = c.management_cert.as_ref().or(c.cert.as_ref());
            let key = c.management_key.as_ref().or(c.key.as_ref());
            let (Some(cert), Some(key)) = (cert, key) else {
                return Err(TlsError(
                    "--management-tls-listen needs a certificate and a key".into(),
                ));
            };
            // Browsers and scripts log in with basic auth: no client certificate is asked.
            Some(Arc::new(server_config(
                c,
                Listener::Https,
                cert,
                key,
                false,
                &[b"http/1.1".to_vec()],
            )?))
        }
        None => None,
    };
    Ok((amqp, management))
}

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(
    c: &TlsConfig,
    listener: Listener,
    cert_path: &Path,
    key_path: &Path,
    verify_peer: bool,
    alpn: &[Vec<u8>],
) -> Result<rustls::ServerConfig, TlsError> {
    let chain = read_certificates(cert_path)?;
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
        TlsError(format!(
            "cannot read a private key from {}: {}",
            key_path.display(),
            pem_error(e)
        ))
    })?;
    log_validity(listener, cert_path, &chain[0]);
    let mut versions = Vec::new();
    if c.versions.iter().any(|v| v == "tlsv1.2") {
        versions.push(&rustls::version::TLS12);
    }
    if c.versions.iter().any(|v| v == "tlsv1.3") {
        versions.push(&rustls::version::TLS13);
    }
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions)
        .map_err(|e| TlsError(format!("TLS versions {:?}: {e}", c.versions)))?;
    let builder = if verify_peer {
        let ca_path = c.ca.as_ref().ok_or_else(|| {
            TlsError(
                "--tls-verify-peer needs --tls-ca (the CA client certificates chain to)".into(),
            )
        })?;
        let mut roots = RootCertStore::empty();
        for ca in read_certificates(ca_path)? {
            roots.add(ca).map_err(|e| {
                TlsError(format!(
                    "a CA certificate in {} is not usable: {e}",
                    ca_path.display()
                ))
            })?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
        let verifier = if c.fail_if_no_peer_cert {
            verifier
        } else {
            verifier.allow_unauthenticated()
        };
        let verifier = verifier.build().map_err(|e| {
            TlsError(format!(
                "cannot verify clients with the CAs in {}: {e}",
                ca_path.display()
            ))
        })?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError(format!(
            "the private key in {} does not match the certificate in {}",
            key_path.display(),
            cert_path.display()
        )),
        e => TlsError(format!(
            "cannot use the certificate in {} with the key in {}: {e}",
            cert_path.display(),
            key_path.display()
        )),
    })?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let fail = |e: rustls::pki_types::pem::Error| {
        TlsError(format!(
            "cannot read certificates from {}: {}",
            path.display(),
            pem_error(e)
        ))
    };
    let mut out = Vec::new();
    for cert in CertificateDer::pem_file_iter(path).map_err(fail)? {
        out.push(cert.map_err(fail)?);
        if out.len() > PEM_CERTIFICATES_MAX {
            return Err(TlsError(format!(
                "{} holds more than {PEM_CERTIFICATES_MAX} certificates",
                path.display()
            )));
        }
    }
    if out.is_empty() {
        return Err(TlsError(format!(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in {}",
            path.display()
        )));
    }
    Ok(out)
}

fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of that kind in it".into(),
        e => e.to_string(),
    }
}

/// Logs the server certificate's subject and expiry at load; warns if it is not valid now,
/// since every client would then refuse it.
fn log_validity(listener: Listener, path: &Path, der: &CertificateDer<'_>) {
    let listener = listener.name();
    let Ok(info) = certificate::CertificateInfo::parse(der) else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let subject = info.subject_dn();
    let expires = certificate::utc_text(info.not_after_s);
    if now > info.not_after_s {
        tracing::warn!(listener, file = %path.display(), %subject, "the server certificate expired at {expires}: clients will refuse it");
    } else if now < info.not_before_s {
        tracing::warn!(listener, file = %path.display(), %subject, "the server certificate is not valid before {}: clients will refuse it", certificate::utc_text(info.not_before_s));
    } else {
        tracing::info!(listener, file = %path.display(), %subject, %expires, "TLS certificate loaded");
    }
}
