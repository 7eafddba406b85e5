//! Cluster links over mutually authenticated TLS, between real transports on loopback sockets:
//! nodes whose certificates the cluster's CA signed exchange frames; a node with a certificate
//! from another CA, and a process that speaks plain TCP with a forged hello, never get a frame
//! to the node, and each refusal is counted.

mod common;

use bytes::{Bytes, BytesMut};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_cluster::frame::{self, Hello, NodeInfo};
use warren_cluster::link_tls::{LinkTls, LinkTlsFiles};
use warren_cluster::transport::{Callbacks, Inbound, Transport};

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

fn node_cert(issuer: &Issued, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>) -> Issued {
    let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = usages;
    let key = KeyPair::generate().unwrap();
    Issued {
        cert: p.signed_by(&key, &issuer.cert, &issuer.key).unwrap(),
        key,
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warren-link-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn files(dir: &Path, stem: &str, node: &Issued, ca: &Issued) -> LinkTlsFiles {
    let f = LinkTlsFiles {
        cert: dir.join(format!("{stem}.pem")),
        key: dir.join(format!("{stem}.key")),
        ca: dir.join(format!("{stem}-ca.pem")),
    };
    std::fs::write(&f.cert, node.cert.pem()).unwrap();
    std::fs::write(&f.key, node.key.serialize_pem()).unwrap();
    std::fs::write(&f.ca, ca.cert.pem()).unwrap();
    f
}

/// What one node's transport received.
#[derive(Default)]
struct Received {
    hellos: Vec<u64>,
    raft_from: Vec<u64>,
    data: Vec<(u64, Bytes)>,
}

async fn node(id: u64, tls: Option<Arc<LinkTls>>) -> (Transport, SocketAddr, Arc<Mutex<Received>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Received::default()));
    let (r1, r2) = (received.clone(), received.clone());
    let me = common::node_info(id, addr);
    let transport = Transport::start_with_tls(
        me,
        id * 1000,
        listener,
        Callbacks {
            inbound: Arc::new(move |inbound| {
                let mut r = r1.lock().unwrap();
                match inbound {
                    Inbound::Hello(info) => r.hellos.push(info.id),
                    Inbound::Raft { from, .. } => r.raft_from.push(from),
                    Inbound::CatchUp { .. } => {}
                }
            }),
            data: Arc::new(move |from, payload| {
                r2.lock().unwrap().data.push((from, payload));
                Ok(())
            }),
            link_up: Arc::new(|_, _| {}),
            link_broken: Arc::new(|_| {}),
            raft_link: None,
        },
        tls,
    );
    (transport, addr, received)
}

fn refused(tls: &LinkTls, reason: &str) -> u64 {
    tls.refused()
        .into_iter()
        .find(|(r, _)| *r == reason)
        .map(|(_, n)| n)
        .unwrap()
}

#[tokio::test]
async fn trusted_nodes_exchange_frames_and_strangers_are_refused() {
    let dir = scratch("exchange");
    let cluster_ca = ca("cluster CA");
    let other_ca = ca("another CA");
    let tls_a = LinkTls::load(files(
        &dir,
        "a",
        &node_cert(&cluster_ca, "a", vec![]),
        &cluster_ca,
    ))
    .unwrap();
    let tls_b = LinkTls::load(files(
        &dir,
        "b",
        &node_cert(&cluster_ca, "b", vec![]),
        &cluster_ca,
    ))
    .unwrap();
    // A node certificate from another CA does not chain to the cluster's: refused at load,
    // naming the files, rather than by every peer later.
    let err = LinkTls::load(files(
        &dir,
        "c",
        &node_cert(&other_ca, "c", vec![]),
        &cluster_ca,
    ))
    .unwrap_err();
    assert!(err.contains("not one its peers would accept"), "{err}");
    assert!(err.contains("no CA in"), "{err}");

    let (a, a_addr, a_got) = node(1, Some(tls_a.clone())).await;
    let (b, b_addr, b_got) = node(2, Some(tls_b.clone())).await;
    a.connect(2, b_addr.into());
    b.connect(1, a_addr.into());
    common::eventually("the TLS links both ways", || a.is_up(2) && b.is_up(1)).await;
    assert!(a.send_data(2, |buf| frame::encode_data(buf, |b| b
        .extend_from_slice(b"over tls"))));
    assert!(a.send_raft(2, 7, &[raft::eraftpb::Message::default()]));
    common::eventually("B receives A's data and Raft frames", || {
        let r = b_got.lock().unwrap();
        r.data
            .iter()
            .any(|(from, p)| *from == 1 && &p[..] == b"over tls")
            && r.raft_from == [1]
    })
    .await;
    assert!(a_got.lock().unwrap().hellos.contains(&2));
    assert!(b_got.lock().unwrap().hellos.contains(&1));
    assert_eq!(refused(&tls_b, "untrusted_certificate"), 0);

    // A node whose certificate another CA signed (trusting ours, to get as far as it can).
    let stranger_tls = stranger_tls(&dir, &other_ca, &cluster_ca);
    let (c, _, c_got) = node(3, Some(stranger_tls)).await;
    c.connect(2, b_addr.into());
    common::eventually("B refuses the stranger's certificate", || {
        refused(&tls_b, "untrusted_certificate") >= 2
    })
    .await;
    assert!(!c.is_up(2), "the stranger's link never answers pings");
    assert!(
        !b_got.lock().unwrap().hellos.contains(&3),
        "the stranger's hello reached the node"
    );
    assert!(c_got.lock().unwrap().data.is_empty());

    // A process that speaks plain TCP and forges a hello and a Raft message.
    let mut forged = BytesMut::new();
    frame::encode_hello(
        &mut forged,
        &Hello {
            info: NodeInfo {
                id: 4,
                name: "forger".into(),
                cluster: "127.0.0.1:1".parse().unwrap(),
                amqp: "127.0.0.1:1".parse().unwrap(),
                management: None,
                draining: false,
            },
            boot: 1,
            to: None,
            protocol: frame::PROTOCOL,
            protocol_min: frame::PROTOCOL_MIN,
        },
    );
    frame::encode_raft(&mut forged, 0, &[raft::eraftpb::Message::default()]);
    let mut plain = tokio::net::TcpStream::connect(b_addr).await.unwrap();
    plain.write_all(&forged).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut rest)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the node closed on the plain client: {read:?}"
    );
    assert_eq!(refused(&tls_b, "not_tls"), 1);
    let r = b_got.lock().unwrap();
    assert!(
        !r.hellos.contains(&4) && !r.raft_from.contains(&4),
        "a forged frame got through"
    );
    // The trusted link is unaffected.
    assert!(a.is_up(2) && b.is_up(1));
}

/// A node certificate from `own_ca`, with `trusted_ca` as the CA it checks others against: it
/// cannot be loaded through [`LinkTls::load`] (which checks the node's own certificate), so it is
/// built from a CA bundle holding both.
fn stranger_tls(dir: &Path, own_ca: &Issued, trusted_ca: &Issued) -> Arc<LinkTls> {
    let f = files(
        dir,
        "stranger",
        &node_cert(own_ca, "stranger", vec![]),
        own_ca,
    );
    std::fs::write(
        &f.ca,
        format!("{}{}", own_ca.cert.pem(), trusted_ca.cert.pem()),
    )
    .unwrap();
    LinkTls::load(f).unwrap()
}

#[test]
fn a_certificate_that_cannot_authenticate_a_client_is_refused_at_load() {
    let dir = scratch("purpose");
    let cluster_ca = ca("cluster CA");
    let server_only = node_cert(&cluster_ca, "n", vec![ExtendedKeyUsagePurpose::ServerAuth]);
    let err = LinkTls::load(files(&dir, "n", &server_only, &cluster_ca)).unwrap_err();
    assert!(
        err.contains("does not allow TLS client authentication") && err.contains("clientAuth"),
        "{err}"
    );
    let both = node_cert(
        &cluster_ca,
        "n",
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    LinkTls::load(files(&dir, "n", &both, &cluster_ca)).unwrap();
}
