//! What a node is told at start: where to listen, where its data lives, and its limits.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use warren_cluster::address::HostPort;

/// RabbitMQ's `loopback_users` default: the well-known guest/guest only from this machine.
pub const LOOPBACK_USER_DEFAULT: &str = "guest";
/// RabbitMQ's `handshake_timeout` default.
pub const HANDSHAKE_TIMEOUT_DEFAULT_MS: u64 = 10_000;
/// RabbitMQ's `auth_mechanisms` default.
pub const AUTH_MECHANISMS_DEFAULT: [&str; 2] = ["PLAIN", "AMQPLAIN"];
/// The SASL mechanisms warren implements.
pub const AUTH_MECHANISMS_KNOWN: [&str; 3] = ["PLAIN", "AMQPLAIN", "EXTERNAL"];
/// RabbitMQ's defaults, so that clients negotiate the same limits with either broker.
pub const HEARTBEAT_DEFAULT_S: u16 = 60;
pub const CHANNEL_MAX_DEFAULT: u16 = 2047;
pub const FRAME_MAX_DEFAULT_BYTES: u32 = warren_protocol::frame::FRAME_MAX_DEFAULT_BYTES;
/// RabbitMQ 3.10's max_message_size default: 128 MiB.
pub const MESSAGE_BYTES_MAX_DEFAULT: u64 = 128 * 1024 * 1024;
/// RabbitMQ's default disk_free_limit.
pub const DISK_FREE_LIMIT_DEFAULT_BYTES: u64 = 50_000_000;
/// RabbitMQ's default `net_ticktime`.
pub const NODE_DOWN_AFTER_DEFAULT_S: u64 = 60;
/// Bodies of stored messages kept in memory across the node before long backlogs page out:
/// enough that queues whose consumers keep up never read from disk, small beside the 1 GiB a
/// 10 million message backlog may cost in all.
pub const MESSAGE_MEMORY_DEFAULT_BYTES: u64 = 128 * 1024 * 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Where plain AMQP is accepted: one address or several (RabbitMQ's `listeners.tcp.*`,
    /// e.g. `["127.0.0.1:5672", "[::1]:5672"]`); empty (`listen = "none"`) leaves only the TLS
    /// listener. The default stays loopback only, unlike RabbitMQ's every interface: a node
    /// with the guest user should not be reachable from elsewhere until someone says so.
    #[serde(deserialize_with = "addresses_or_none")]
    pub listen: Vec<SocketAddr>,
    /// AMQP over TLS and the management API over HTTPS (the `[tls]` table): see [`TlsConfig`].
    pub tls: TlsConfig,
    /// SASL mechanisms offered to clients, RabbitMQ's `auth_mechanisms` (PLAIN and AMQPLAIN by
    /// default); EXTERNAL is offered on TLS connections only.
    pub auth_mechanisms: Vec<String>,
    /// A connection that has not finished its handshake (TLS and AMQP, up to connection.open-ok)
    /// this long after it was accepted is closed: RabbitMQ's `handshake_timeout`.
    pub handshake_timeout_ms: u64,
    /// Client sockets (AMQP and AMQPS, handshaking or open) the node holds at most; one
    /// accepted beyond it is closed at once, and `below-node-connection-limit` fails while it
    /// is reached: RabbitMQ's `connection_max`. None: no limit (RabbitMQ's infinity).
    pub connection_max: Option<u64>,
    pub data_dir: PathBuf,
    /// The write-ahead log's directory [default: DATA_DIR/wal]: best on its own disk.
    pub wal_dir: Option<PathBuf>,
    /// Per-queue segment files [default: DATA_DIR/segments].
    pub segment_dir: Option<PathBuf>,
    /// Metadata: the durable topology journal [default: DATA_DIR/meta].
    pub meta_dir: Option<PathBuf>,
    /// Size at which the WAL rolls over to a new file and the old one is settled (its backlog
    /// adopted in place or copied into segments, or the file deleted). Smaller files settle a
    /// backlog sooner and bound recovery's replay; larger ones write fewer sidecars. RabbitMQ's
    /// `raft.wal_max_size_bytes` plays the same part.
    pub wal_file_bytes_max: u64,
    /// A rolled WAL file at least this percent live is kept in place as the backlog's data
    /// file (written once, but it stays on the WAL's disk); above 100 every backlog is copied
    /// into segments instead (written twice, moved to the segment disk).
    pub adopt_live_percent_min: u64,
    /// While publishes stream in, the WAL syncs no more often than this (microseconds): fewer
    /// bytes written per message at the cost of up to this much confirm latency; 0 syncs at once.
    pub wal_commit_window_us: u64,
    /// Threads of the runtime that runs the connections: see [`worker_threads_default`].
    pub worker_threads: usize,
    pub heartbeat_s: u16,
    pub channel_max: u16,
    pub frame_max_bytes: u32,
    pub message_bytes_max: u64,
    /// Publishers are blocked (connection.blocked) while the broker's RSS is above this.
    pub memory_high_watermark_bytes: u64,
    /// Publishers are blocked while the fullest of the WAL's, segments' and metadata's file
    /// systems has less free space than this (RabbitMQ's disk_free_limit, 50 MB by default).
    pub disk_free_limit_bytes: u64,
    /// Message bodies durable queues may hold in memory, node-wide; beyond it each keeps only
    /// the head of its backlog in memory and reads the rest from disk as consumers reach it.
    pub message_memory_bytes: u64,
    /// Where the HTTP management API and /metrics listen; none disables them.
    #[serde(deserialize_with = "address_or_none")]
    pub management_listen: Option<SocketAddr>,
    /// This node's name in a cluster (RabbitMQ's node name); shown in `/api/nodes` and as each
    /// queue's `node`. Defaults to `warren@<cluster port>` in a cluster.
    pub node_name: Option<String>,
    /// Where other nodes of the cluster connect to this one, `HOST:PORT` with a name or an
    /// address; none: a single node.
    pub cluster_listen: Option<HostPort>,
    /// The address other nodes reach this one at, when it is not the listen address (a node
    /// listening on every interface, behind NAT, in a pod).
    pub cluster_advertise: Option<HostPort>,
    /// The founding nodes' cluster addresses at a first start (this node's may be among them);
    /// at later starts, where to look for members whose addresses changed.
    pub cluster_seeds: Vec<HostPort>,
    /// Seconds a first start waits for every seed's name to resolve.
    pub cluster_seed_resolve_timeout_s: u64,
    /// Which node hosts a queue declared without `x-queue-leader-locator`: RabbitMQ's
    /// `queue_leader_locator`.
    pub queue_leader_locator: QueueLocator,
    /// Seconds a node of the cluster may stay unreachable before the others delete its
    /// transient and exclusive queues, which lived in its memory only (RabbitMQ deletes them
    /// when its `net_ticktime` finds the node down). Shorter pauses and cuts keep them.
    pub node_down_after_s: u64,
    /// A definitions file (RabbitMQ's JSON format) imported at boot, before clients are
    /// served: RabbitMQ's `load_definitions`. Importing is idempotent, so it may stay set.
    pub load_definitions: Option<PathBuf>,
    /// The administrator a node keeps in guest's place: RabbitMQ's `default_user` and
    /// `default_pass` (`RABBITMQ_DEFAULT_USER`/`_PASS` in its container image), so that an
    /// image or a chart is given its login by environment. Put at every start, with
    /// `--load-definitions`' idempotence; guest is removed while it is set, as RabbitMQ never
    /// creates guest beside a default user.
    pub default_user: Option<String>,
    pub default_pass: Option<String>,
    /// Users who may log in from loopback addresses only: RabbitMQ's `loopback_users`, guest by
    /// default. A container is reached from outside its loopback, so its image empties it, as
    /// RabbitMQ's image sets `loopback_users.guest = false`.
    #[serde(deserialize_with = "names_or_none")]
    pub loopback_users: Vec<String>,
    /// Where RabbitMQ's stream protocol is accepted (its `stream.listeners.tcp`, port 5552 by
    /// convention); none (the default) leaves it off.
    #[serde(deserialize_with = "address_or_none")]
    pub stream_listen: Option<SocketAddr>,
    /// The stream protocol over TLS (`stream.listeners.ssl`, 5551), with the `[tls]` table's
    /// certificate and peer verification.
    #[serde(deserialize_with = "address_or_none")]
    pub stream_tls_listen: Option<SocketAddr>,
    /// The host and port a stream client is told to connect to (metadata, the open response):
    /// RabbitMQ's `stream.advertised_host`/`advertised_port`, for a node behind NAT or in a
    /// pod. Default: the listener's own address.
    pub stream_advertised_host: Option<String>,
    pub stream_advertised_port: Option<u16>,
    /// Test-only fault injection (see [`crate::node::fault_injection`]): set from the hidden
    /// `--fault-injection` flag only, never from a config file.
    #[serde(skip)]
    pub fault_injection: Option<crate::node::fault_injection::FaultInjection>,
}

/// Where a new queue lives in a cluster (RabbitMQ's queue leader locators).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueLocator {
    /// On the node the declaring client is connected to.
    ClientLocal,
    /// Spread over the running nodes: one picked at random (RabbitMQ's `balanced` does so
    /// beyond 1,000 queues, and counts queues per node below that).
    Balanced,
}

impl QueueLocator {
    /// RabbitMQ's names, and the classic queue's older `x-queue-master-locator` ones.
    pub fn parse(name: &str) -> Option<QueueLocator> {
        match name {
            "client-local" => Some(QueueLocator::ClientLocal),
            "balanced" | "random" | "min-masters" => Some(QueueLocator::Balanced),
            _ => None,
        }
    }
}

/// Most threads `--worker-threads` accepts.
pub const WORKER_THREADS_MAX: usize = 256;

/// Half the cores, at least one: the connections' runtime shares the node with threads that
/// are as hot as it (the WAL writer, the queue groups' loop), and a connection's tasks spread
/// over more workers than the cores left to them hand each round to another thread, which
/// wakes, steals and parks, instead of batching it. On 2 cores, one worker against two, each
/// node in a session of its own (issue 37; docs/benchmarks/2026-11-29-fair-scheduling.md):
/// 0.4-0.6x the CPU and 0.3-0.5x the context switches per message for a quorum queue on 3
/// nodes, 0.6-0.8x the CPU for one node's persistent 1p1c.
pub fn worker_threads_default() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: vec!["127.0.0.1:5672".parse().expect("valid address")],
            tls: TlsConfig::default(),
            auth_mechanisms: AUTH_MECHANISMS_DEFAULT
                .iter()
                .map(|m| m.to_string())
                .collect(),
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_DEFAULT_MS,
            connection_max: None,
            data_dir: PathBuf::from("./warren-data"),
            wal_dir: None,
            segment_dir: None,
            meta_dir: None,
            load_definitions: None,
            default_user: None,
            default_pass: None,
            loopback_users: vec![LOOPBACK_USER_DEFAULT.to_string()],
            wal_file_bytes_max: warren_store::config::WAL_FILE_BYTES_DEFAULT,
            adopt_live_percent_min: warren_store::config::ADOPT_LIVE_PERCENT_MIN,
            wal_commit_window_us: warren_store::config::COMMIT_WINDOW_US_DEFAULT,
            worker_threads: worker_threads_default(),
            heartbeat_s: HEARTBEAT_DEFAULT_S,
            channel_max: CHANNEL_MAX_DEFAULT,
            frame_max_bytes: FRAME_MAX_DEFAULT_BYTES,
            message_bytes_max: MESSAGE_BYTES_MAX_DEFAULT,
            memory_high_watermark_bytes: default_memory_watermark(),
            disk_free_limit_bytes: DISK_FREE_LIMIT_DEFAULT_BYTES,
            message_memory_bytes: MESSAGE_MEMORY_DEFAULT_BYTES,
            management_listen: Some("127.0.0.1:15672".parse().expect("valid address")),
            node_name: None,
            cluster_listen: None,
            cluster_advertise: None,
            cluster_seeds: Vec::new(),
            cluster_seed_resolve_timeout_s: 60,
            queue_leader_locator: QueueLocator::ClientLocal,
            node_down_after_s: NODE_DOWN_AFTER_DEFAULT_S,
            stream_listen: None,
            stream_tls_listen: None,
            stream_advertised_host: None,
            stream_advertised_port: None,
            fault_injection: None,
        }
    }
}

/// 40% of physical memory, RabbitMQ's default vm_memory_high_watermark.
fn default_memory_watermark() -> u64 {
    crate::node::memory::total_memory_bytes() * 2 / 5
}

/// TLS settings, after RabbitMQ's `listeners.ssl` and `ssl_options`: PEM files, the peer
/// verification switches, the TLS versions. The management API's HTTPS listener uses the same
/// certificate, key and CA unless given its own; it never asks browsers for a certificate.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Where AMQP over TLS (amqps://) is accepted; none by default, 5671 by convention.
    #[serde(deserialize_with = "address_or_none")]
    pub listen: Option<SocketAddr>,
    /// The server's certificate chain, PEM, leaf first (`ssl_options.certfile`).
    pub cert: Option<PathBuf>,
    /// The certificate's private key, PEM: PKCS#8, PKCS#1 or SEC1 (`ssl_options.keyfile`).
    pub key: Option<PathBuf>,
    /// CA certificates, PEM, that client certificates must chain to (`ssl_options.cacertfile`).
    pub ca: Option<PathBuf>,
    /// Ask clients for a certificate and refuse one the CA did not sign (`verify_peer`).
    pub verify_peer: bool,
    /// With verify_peer, refuse clients that send no certificate at all.
    pub fail_if_no_peer_cert: bool,
    /// TLS versions accepted, RabbitMQ's names: "tlsv1.2", "tlsv1.3" (both by default).
    pub versions: Vec<String>,
    /// Which part of a client certificate's subject is the user name for SASL EXTERNAL:
    /// RabbitMQ's `ssl_cert_login_from`.
    pub cert_login_from: CertLoginFrom,
    /// Where the management API is served over HTTPS; none by default.
    #[serde(deserialize_with = "address_or_none")]
    pub management_listen: Option<SocketAddr>,
    /// The HTTPS listener's own certificate chain [default: cert].
    pub management_cert: Option<PathBuf>,
    /// The HTTPS listener's own private key [default: key].
    pub management_key: Option<PathBuf>,
    /// Links between cluster nodes over TLS 1.3 with mutual authentication, using the
    /// `cluster_*` files or, for those not given, `cert`, `key` and `ca` (RabbitMQ's
    /// inter-node TLS reuses `ssl_options` the same way). Any `cluster_*` file turns it on too.
    /// Never implied by the AMQP settings alone: a node with TLS links and one without cannot
    /// talk, so a cluster switches on all its nodes together.
    pub cluster: bool,
    /// The node's certificate for its cluster links [default: cert]. It must allow both TLS
    /// server and client authentication: every node accepts links and opens them.
    pub cluster_cert: Option<PathBuf>,
    /// Its private key [default: key].
    pub cluster_key: Option<PathBuf>,
    /// The CA every node's certificate must chain to [default: ca]: any certificate it signed
    /// is a node, so it is best a CA that signs nodes only.
    pub cluster_ca: Option<PathBuf>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            listen: None,
            cert: None,
            key: None,
            ca: None,
            verify_peer: false,
            fail_if_no_peer_cert: false,
            versions: TLS_VERSIONS_KNOWN.iter().map(|v| v.to_string()).collect(),
            cert_login_from: CertLoginFrom::DistinguishedName,
            management_listen: None,
            management_cert: None,
            management_key: None,
            cluster: false,
            cluster_cert: None,
            cluster_key: None,
            cluster_ca: None,
        }
    }
}

/// The TLS versions rustls speaks, by RabbitMQ's names.
pub const TLS_VERSIONS_KNOWN: [&str; 2] = ["tlsv1.2", "tlsv1.3"];

/// RabbitMQ's `ssl_cert_login_from`: the subject's full distinguished name (its default) or its
/// common name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertLoginFrom {
    DistinguishedName,
    CommonName,
}

impl std::str::FromStr for CertLoginFrom {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "distinguished_name" => Ok(CertLoginFrom::DistinguishedName),
            "common_name" => Ok(CertLoginFrom::CommonName),
            _ => Err(format!(
                "expected distinguished_name or common_name, got '{s}'"
            )),
        }
    }
}

/// An address, or "none" to turn a listener off: `listen = "none"` in the TOML file.
fn address_or_none<'de, D>(d: D) -> Result<Option<SocketAddr>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let s = String::deserialize(d)?;
    parse_address_or_none(&s).map_err(serde::de::Error::custom)
}

/// One address, several (a TOML array), or "none": `listen` in the TOML file.
fn addresses_or_none<'de, D>(d: D) -> Result<Vec<SocketAddr>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let values = match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    };
    parse_addresses_or_none(&values).map_err(serde::de::Error::custom)
}

/// `loopback_users` in the TOML file: a list of names, one name, or "none".
fn names_or_none<'de, D>(d: D) -> Result<Vec<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => parse_names_or_none(&s),
        OneOrMany::Many(v) => v,
    })
}

/// `--loopback-users` (`WARREN_LOOPBACK_USERS`): names, comma-separated, or "none" (or
/// nothing) for no user held to loopback.
pub fn parse_names_or_none(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty() && *n != "none")
        .map(String::from)
        .collect()
}

/// The AMQP listeners as `--listen` (repeated, or comma-separated in `WARREN_LISTEN`) and the
/// TOML file give them: addresses, or "none" alone for no plain listener. A repeated address
/// is refused rather than bound twice (the second bind would fail with a less clear error).
pub fn parse_addresses_or_none(values: &[String]) -> Result<Vec<SocketAddr>, String> {
    if values.iter().any(|v| v == "none") {
        return match values.len() {
            1 => Ok(Vec::new()),
            _ => Err("'none' cannot be combined with addresses".into()),
        };
    }
    let mut out: Vec<SocketAddr> = Vec::with_capacity(values.len());
    for v in values {
        // A name stands for every address it resolves to: `localhost:5672` listens on
        // 127.0.0.1 and ::1 where both are configured.
        for a in resolve_listen_address(v)? {
            if out.contains(&a) {
                return Err(format!("'{a}' is given twice"));
            }
            out.push(a);
        }
    }
    if out.is_empty() {
        return Err("no address given: name one or more, or none".into());
    }
    Ok(out)
}

/// Parses a listener address as the flags and the TOML file give it; "none" is no listener.
pub fn parse_address_or_none(s: &str) -> Result<Option<SocketAddr>, String> {
    match s {
        "none" => Ok(None),
        addr => Ok(resolve_listen_address(addr)?.first().copied()),
    }
}

/// A listener's `HOST:PORT` as bound: an address as it is, a name resolved now (at start) to
/// those of its addresses that belong to this machine.
fn resolve_listen_address(s: &str) -> Result<Vec<SocketAddr>, String> {
    let addr: HostPort = s
        .parse()
        .map_err(|e| format!("'{s}' is neither an address nor none: {e}"))?;
    let found = addr.resolve_blocking()?;
    if addr.ip().is_some() {
        return Ok(found);
    }
    let local: Vec<SocketAddr> = found
        .iter()
        .copied()
        .filter(|a| warren_cluster::address::is_local_ip(a.ip()))
        .collect();
    if local.is_empty() {
        return Err(format!(
            "'{s}' resolves to {}, none of them an address of this machine",
            found
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(local)
}

impl ServerConfig {
    /// Checks what only makes sense together: a TLS listener needs a certificate and a key,
    /// peer verification needs a CA, and some AMQP listener must be on.
    pub fn validate(&self) -> Result<(), String> {
        match (&self.default_user, &self.default_pass) {
            (Some(u), Some(p)) if u.is_empty() || p.is_empty() => {
                return Err("--default-user and --default-pass cannot be empty".into())
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err("--default-user and --default-pass go together: give both".into())
            }
            _ => {}
        }
        let t = &self.tls;
        if self.listen.is_empty() && t.listen.is_none() {
            return Err("no AMQP listener: --listen is none and --tls-listen is not set".into());
        }
        if t.listen.is_some() && (t.cert.is_none() || t.key.is_none()) {
            return Err("--tls-listen needs --tls-cert and --tls-key".into());
        }
        if self.stream_tls_listen.is_some() && (t.cert.is_none() || t.key.is_none()) {
            return Err("--stream-tls-listen needs --tls-cert and --tls-key".into());
        }
        if t.management_listen.is_some()
            && (t.management_cert.as_ref().or(t.cert.as_ref()).is_none()
                || t.management_key.as_ref().or(t.key.as_ref()).is_none())
        {
            return Err(
                "--management-tls-listen needs a certificate and a key (--management-tls-cert and --management-tls-key, or --tls-cert and --tls-key)"
                    .into(),
            );
        }
        if t.verify_peer && t.ca.is_none() {
            return Err(
                "--tls-verify-peer needs --tls-ca (the CA client certificates chain to)".into(),
            );
        }
        if t.fail_if_no_peer_cert && !t.verify_peer {
            return Err("--tls-fail-if-no-peer-cert needs --tls-verify-peer".into());
        }
        if t.versions.is_empty() {
            return Err("no TLS version allowed: give tlsv1.2, tlsv1.3 or both".into());
        }
        for v in &t.versions {
            if !TLS_VERSIONS_KNOWN.contains(&v.as_str()) {
                return Err(format!(
                    "TLS version '{v}' is not supported: tlsv1.2 and tlsv1.3 only"
                ));
            }
        }
        if self.auth_mechanisms.is_empty() {
            return Err("no authentication mechanism: give PLAIN, AMQPLAIN, EXTERNAL".into());
        }
        for m in &self.auth_mechanisms {
            if !AUTH_MECHANISMS_KNOWN.contains(&m.as_str()) {
                return Err(format!(
                    "unknown authentication mechanism '{m}': PLAIN, AMQPLAIN and EXTERNAL are known"
                ));
            }
        }
        if self.handshake_timeout_ms == 0 {
            return Err("--handshake-timeout must be more than 0".into());
        }
        self.cluster_tls()?;
        Ok(())
    }

    /// The files of the cluster links' TLS, if it is on; an error names the missing ones.
    pub fn cluster_tls(&self) -> Result<Option<warren_cluster::link_tls::LinkTlsFiles>, String> {
        let t = &self.tls;
        let on = t.cluster
            || t.cluster_cert.is_some()
            || t.cluster_key.is_some()
            || t.cluster_ca.is_some();
        if !on {
            return Ok(None);
        }
        if self.cluster_listen.is_none() {
            return Err("cluster TLS (--cluster-tls*) needs --cluster-listen".into());
        }
        let cert = t.cluster_cert.as_ref().or(t.cert.as_ref());
        let key = t.cluster_key.as_ref().or(t.key.as_ref());
        let ca = t.cluster_ca.as_ref().or(t.ca.as_ref());
        let missing: Vec<&str> = [
            (
                cert.is_none(),
                "a certificate (--cluster-tls-cert or --tls-cert)",
            ),
            (key.is_none(), "a key (--cluster-tls-key or --tls-key)"),
            (ca.is_none(), "a CA (--cluster-tls-ca or --tls-ca)"),
        ]
        .into_iter()
        .filter_map(|(absent, what)| absent.then_some(what))
        .collect();
        match (cert, key, ca) {
            (Some(cert), Some(key), Some(ca)) => Ok(Some(warren_cluster::link_tls::LinkTlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            })),
            _ => Err(format!(
                "cluster TLS needs {}: every node presents a certificate its peers' CA signed",
                missing.join(", ")
            )),
        }
    }

    pub fn handshake_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.handshake_timeout_ms)
    }

    pub fn wal_dir(&self) -> PathBuf {
        self.wal_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("wal"))
    }

    pub fn segment_dir(&self) -> PathBuf {
        self.segment_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("segments"))
    }

    pub fn meta_dir(&self) -> PathBuf {
        self.meta_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("meta"))
    }

    /// Streams' logs, a directory per stream (see `queues::stream`).
    pub fn stream_dir(&self) -> PathBuf {
        self.data_dir.join("streams")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_user_and_loopback_users_come_from_the_toml_file_and_go_together() {
        let c = ServerConfig::default();
        assert_eq!(c.loopback_users, ["guest"]);
        let c: ServerConfig = toml::from_str(
            r#"
            default_user = "admin"
            default_pass = "s3cret"
            loopback_users = "none"
            "#,
        )
        .unwrap();
        assert_eq!(c.default_user.as_deref(), Some("admin"));
        assert_eq!(c.loopback_users, Vec::<String>::new());
        assert_eq!(c.validate(), Ok(()));
        let c: ServerConfig = toml::from_str(r#"loopback_users = ["guest", "monitor"]"#).unwrap();
        assert_eq!(c.loopback_users, ["guest", "monitor"]);
        assert_eq!(parse_names_or_none("guest, monitor"), ["guest", "monitor"]);
        assert_eq!(parse_names_or_none(""), Vec::<String>::new());
        let half: ServerConfig = toml::from_str(r#"default_user = "admin""#).unwrap();
        assert!(half.validate().unwrap_err().contains("give both"));
        let empty: ServerConfig =
            toml::from_str("default_user = \"admin\"\ndefault_pass = \"\"").unwrap();
        assert!(empty.validate().unwrap_err().contains("cannot be empty"));
    }

    #[test]
    fn tls_table_and_listen_none_come_from_the_toml_file() {
        let c: ServerConfig = toml::from_str(
            r#"
            listen = "none"
            auth_mechanisms = ["PLAIN", "EXTERNAL"]
            handshake_timeout_ms = 2500
            [tls]
            listen = "127.0.0.1:5671"
            cert = "/etc/warren/server.pem"
            key = "/etc/warren/server.key"
            ca = "/etc/warren/ca.pem"
            verify_peer = true
            fail_if_no_peer_cert = true
            versions = ["tlsv1.3"]
            cert_login_from = "common_name"
            management_listen = "127.0.0.1:15671"
            "#,
        )
        .unwrap();
        assert_eq!(c.listen, []);
        assert_eq!(c.tls.listen, Some("127.0.0.1:5671".parse().unwrap()));
        assert_eq!(c.tls.cert_login_from, CertLoginFrom::CommonName);
        assert_eq!(c.tls.versions, ["tlsv1.3"]);
        assert_eq!(c.handshake_timeout_ms, 2500);
        assert!(c.tls.verify_peer && c.tls.fail_if_no_peer_cert);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn cluster_tls_is_off_unless_asked_and_takes_the_amqp_files_it_is_not_given() {
        let parse = |text: &str| toml::from_str::<ServerConfig>(text).unwrap();
        let amqp = r#"
            cluster_listen = "127.0.0.1:25672"
            [tls]
            cert = "/etc/warren/server.pem"
            key = "/etc/warren/server.key"
            ca = "/etc/warren/ca.pem"
        "#;
        // The AMQP files alone do not turn it on: all nodes of a cluster switch together.
        assert_eq!(parse(amqp).cluster_tls(), Ok(None));
        let files = parse(&format!(
            "{amqp}\ncluster_ca = \"/etc/warren/nodes-ca.pem\""
        ))
        .cluster_tls()
        .unwrap()
        .unwrap();
        assert_eq!(files.cert, PathBuf::from("/etc/warren/server.pem"));
        assert_eq!(files.key, PathBuf::from("/etc/warren/server.key"));
        assert_eq!(files.ca, PathBuf::from("/etc/warren/nodes-ca.pem"));
        let err = parse(
            "cluster_listen = \"127.0.0.1:25672\"\n[tls]\ncluster = true\ncluster_cert = \"n.pem\"",
        )
        .validate()
        .unwrap_err();
        assert!(
            err.contains(
                "a key (--cluster-tls-key or --tls-key), a CA (--cluster-tls-ca or --tls-ca)"
            ),
            "{err}"
        );
        let err = parse("[tls]\ncluster = true").validate().unwrap_err();
        assert!(err.contains("needs --cluster-listen"), "{err}");
    }

    #[test]
    fn defaults_are_rabbitmqs_and_plain_only() {
        let c: ServerConfig = toml::from_str("").unwrap();
        let loopback: SocketAddr = "127.0.0.1:5672".parse().unwrap();
        assert_eq!(c.listen, [loopback]);
        assert_eq!(c.tls.listen, None);
        assert_eq!(c.auth_mechanisms, ["PLAIN", "AMQPLAIN"]);
        assert_eq!(c.handshake_timeout_ms, 10_000);
        assert_eq!(c.tls.cert_login_from, CertLoginFrom::DistinguishedName);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn settings_that_cannot_work_together_are_refused_at_start() {
        let with = |f: &dyn Fn(&mut ServerConfig)| {
            let mut c = ServerConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(with(&|c| c.listen.clear()).contains("no AMQP listener"));
        assert!(
            with(&|c| c.tls.listen = Some("127.0.0.1:5671".parse().unwrap()))
                .contains("--tls-listen needs --tls-cert and --tls-key")
        );
        assert!(with(&|c| c.tls.verify_peer = true).contains("--tls-verify-peer needs --tls-ca"));
        assert!(with(&|c| c.tls.fail_if_no_peer_cert = true).contains("needs --tls-verify-peer"));
        assert!(
            with(&|c| c.tls.versions = vec!["tlsv1.1".into()]).contains("tlsv1.2 and tlsv1.3 only")
        );
        assert!(with(&|c| c.auth_mechanisms = vec!["CRAM-MD5".into()])
            .contains("unknown authentication mechanism"));
        assert!(with(&|c| c.handshake_timeout_ms = 0).contains("more than 0"));
        let bad: Result<ServerConfig, _> = toml::from_str("listen = \"nowhere\"");
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("neither an address nor none"));
    }

    #[test]
    fn several_listeners_come_from_the_toml_file_ipv6_included() {
        let c: ServerConfig =
            toml::from_str(r#"listen = ["127.0.0.1:5672", "[::1]:5672"]"#).unwrap();
        let want: Vec<SocketAddr> = vec![
            "127.0.0.1:5672".parse().unwrap(),
            "[::1]:5672".parse().unwrap(),
        ];
        assert_eq!(c.listen, want);
        let one: ServerConfig = toml::from_str(r#"listen = "[::1]:5680""#).unwrap();
        assert_eq!(one.listen, ["[::1]:5680".parse::<SocketAddr>().unwrap()]);
    }

    #[test]
    fn listener_lists_that_cannot_be_meant_are_refused() {
        let parse = |v: &[&str]| {
            parse_addresses_or_none(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(parse(&["none"]), Ok(vec![]));
        assert!(parse(&["none", "127.0.0.1:1"])
            .unwrap_err()
            .contains("cannot be combined"));
        assert!(parse(&["127.0.0.1:1", "127.0.0.1:1"])
            .unwrap_err()
            .contains("given twice"));
        assert!(parse(&[]).unwrap_err().contains("no address given"));
        assert!(parse(&["::1:5672"])
            .unwrap_err()
            .contains("neither an address nor none"));
    }
}
