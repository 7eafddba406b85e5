//! The `warren` binary: wires the server (and later the perf toolkit and the cluster CLI)
//! into one command line.

mod ctl;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use warren_cluster::address::HostPort;
use warren_server::node::config::ServerConfig;

#[derive(Parser)]
#[command(
    name = "warren",
    version,
    about = "An AMQP 0-9-1 message broker that RabbitMQ clients use unchanged"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a broker node. Settings come from flags, then WARREN_* environment variables, then
    /// the TOML file given by --config, then built-in defaults, in that order of precedence.
    Server(Box<ServerArgs>),
    /// Administer a running node (users, vhosts, permissions, queues) through its management
    /// API, with rabbitmqctl's command names and argument order.
    Ctl(ctl::CtlArgs),
    /// PerfTest-compatible load generator and the studies (sweep, scale, persister,
    /// leaderboard), against warren or any AMQP 0-9-1 broker. `warren perf -?` for flags.
    Perf(warren_perf::PerfArgs),
}

#[derive(Args, Debug)]
struct ServerArgs {
    /// TOML file with server settings (keys: listen, data_dir, wal_dir, segment_dir, meta_dir,
    /// wal_file_bytes_max, adopt_live_percent_min, wal_commit_window_us, worker_threads,
    /// heartbeat_s, channel_max, frame_max_bytes, message_bytes_max,
    /// memory_high_watermark_bytes, disk_free_limit_bytes, message_memory_bytes, management_listen, auth_mechanisms, handshake_timeout_ms,
    /// connection_max, load_definitions, default_user, default_pass, loopback_users,
    /// stream_listen, stream_tls_listen, stream_advertised_host, stream_advertised_port, and a
    /// [tls] table: listen, cert, key, ca, verify_peer, fail_if_no_peer_cert, versions,
    /// cert_login_from, management_listen, management_cert, management_key, cluster,
    /// cluster_cert, cluster_key, cluster_ca; see docs/tls.md).
    #[arg(long, env = "WARREN_CONFIG")]
    config: Option<PathBuf>,
    /// Address to accept plain AMQP connections on, repeated for several (IPv6 as
    /// [::1]:5672; WARREN_LISTEN takes them comma-separated), or "none" to accept TLS ones only
    /// [default: 127.0.0.1:5672].
    #[arg(long, env = "WARREN_LISTEN", value_delimiter = ',')]
    listen: Vec<String>,
    /// Address to accept AMQP over TLS on (amqps://; 5671 by convention) [default: none].
    #[arg(long, env = "WARREN_TLS_LISTEN")]
    tls_listen: Option<String>,
    /// The server's certificate chain, PEM, leaf first (RabbitMQ's ssl_options.certfile).
    #[arg(long, env = "WARREN_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key, PEM (ssl_options.keyfile).
    #[arg(long, env = "WARREN_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// CA certificates, PEM, that client certificates must chain to (ssl_options.cacertfile).
    #[arg(long, env = "WARREN_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Ask TLS clients for a certificate and refuse one no --tls-ca CA signed (verify_peer).
    #[arg(long, env = "WARREN_TLS_VERIFY_PEER")]
    tls_verify_peer: bool,
    /// With --tls-verify-peer, refuse TLS clients that present no certificate.
    #[arg(long, env = "WARREN_TLS_FAIL_IF_NO_PEER_CERT")]
    tls_fail_if_no_peer_cert: bool,
    /// TLS versions accepted, comma-separated [default: tlsv1.2,tlsv1.3].
    #[arg(long, env = "WARREN_TLS_VERSIONS", value_delimiter = ',')]
    tls_versions: Option<Vec<String>>,
    /// What a client certificate's user name is for SASL EXTERNAL: distinguished_name (the
    /// whole subject, RFC 4514) or common_name (RabbitMQ's ssl_cert_login_from)
    /// [default: distinguished_name].
    #[arg(long, env = "WARREN_TLS_CERT_LOGIN_FROM")]
    tls_cert_login_from: Option<warren_server::node::config::CertLoginFrom>,
    /// SASL mechanisms offered, comma-separated, from PLAIN, AMQPLAIN and EXTERNAL (the last
    /// on TLS connections only) [default: PLAIN,AMQPLAIN].
    #[arg(long, env = "WARREN_AUTH_MECHANISMS", value_delimiter = ',')]
    auth_mechanisms: Option<Vec<String>>,
    /// Connections not through their TLS and AMQP handshakes this long after they were
    /// accepted are closed: milliseconds, or a number with s or ms [default: 10s].
    #[arg(long, env = "WARREN_HANDSHAKE_TIMEOUT")]
    handshake_timeout: Option<String>,
    /// Client connections (AMQP and AMQPS) the node holds at most; more are closed as they
    /// are accepted (RabbitMQ's connection_max) [default: no limit].
    #[arg(long, env = "WARREN_CONNECTION_MAX")]
    connection_max: Option<u64>,
    /// Address to accept RabbitMQ's stream protocol on (5552 by convention), or "none"
    /// [default: none]: see docs/streams.md.
    #[arg(long, env = "WARREN_STREAM_LISTEN")]
    stream_listen: Option<String>,
    /// Address to accept the stream protocol over TLS on (5551 by convention), with the
    /// --tls-* certificate and peer verification [default: none].
    #[arg(long, env = "WARREN_STREAM_TLS_LISTEN")]
    stream_tls_listen: Option<String>,
    /// The host stream clients are told to connect to, in metadata and the open response
    /// (RabbitMQ's stream.advertised_host) [default: the stream listener's address].
    #[arg(long, env = "WARREN_STREAM_ADVERTISED_HOST")]
    stream_advertised_host: Option<String>,
    /// The port stream clients are told to connect to (stream.advertised_port) [default: the
    /// stream listener's port].
    #[arg(long, env = "WARREN_STREAM_ADVERTISED_PORT")]
    stream_advertised_port: Option<u16>,
    /// Where the management API is served over HTTPS [default: none].
    #[arg(long, env = "WARREN_MANAGEMENT_TLS_LISTEN")]
    management_tls_listen: Option<String>,
    /// The HTTPS listener's certificate chain, PEM [default: --tls-cert].
    #[arg(long, env = "WARREN_MANAGEMENT_TLS_CERT")]
    management_tls_cert: Option<PathBuf>,
    /// The HTTPS listener's private key, PEM [default: --tls-key].
    #[arg(long, env = "WARREN_MANAGEMENT_TLS_KEY")]
    management_tls_key: Option<PathBuf>,
    /// Links between cluster nodes over TLS 1.3, each node presenting a certificate the CA
    /// signed (mutual authentication), with --tls-cert, --tls-key and --tls-ca unless the
    /// --cluster-tls-* files are given (any of which turns this on too). All nodes of a
    /// cluster need it, or none.
    #[arg(long, env = "WARREN_CLUSTER_TLS")]
    cluster_tls: bool,
    /// This node's certificate for cluster links, PEM; it must allow both TLS server and client
    /// authentication [default: --tls-cert].
    #[arg(long, env = "WARREN_CLUSTER_TLS_CERT")]
    cluster_tls_cert: Option<PathBuf>,
    /// Its private key, PEM [default: --tls-key].
    #[arg(long, env = "WARREN_CLUSTER_TLS_KEY")]
    cluster_tls_key: Option<PathBuf>,
    /// The CA, PEM, every node's certificate must chain to: any certificate it signed is
    /// trusted as a node [default: --tls-ca].
    #[arg(long, env = "WARREN_CLUSTER_TLS_CA")]
    cluster_tls_ca: Option<PathBuf>,
    /// Directory holding the node's data [default: ./warren-data].
    #[arg(long, env = "WARREN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Write-ahead log directory, best on a disk of its own [default: DATA_DIR/wal].
    #[arg(long, env = "WARREN_WAL_DIR")]
    wal_dir: Option<PathBuf>,
    /// Queue segment files [default: DATA_DIR/segments].
    #[arg(long, env = "WARREN_SEGMENT_DIR")]
    segment_dir: Option<PathBuf>,
    /// Metadata (durable exchanges, queues, bindings, users, vhosts) [default: DATA_DIR/meta].
    #[arg(long, env = "WARREN_META_DIR")]
    meta_dir: Option<PathBuf>,
    /// A definitions file (RabbitMQ's JSON: users, vhosts, permissions, policies, queues,
    /// exchanges, bindings) imported at boot, before clients are served; idempotent.
    #[arg(long, env = "WARREN_LOAD_DEFINITIONS")]
    load_definitions: Option<PathBuf>,
    /// An administrator with all permissions on vhost /, put at every start in guest's place
    /// (guest is removed while it is set), with --default-pass: RabbitMQ's default_user
    #[arg(long, env = "WARREN_DEFAULT_USER")]
    default_user: Option<String>,
    /// The default user's password (RabbitMQ's default_pass)
    #[arg(long, env = "WARREN_DEFAULT_PASS", hide_env_values = true)]
    default_pass: Option<String>,
    /// Users who may log in from loopback addresses only, comma-separated, or none
    /// (RabbitMQ's loopback_users) [default: guest]
    #[arg(long, env = "WARREN_LOOPBACK_USERS")]
    loopback_users: Option<String>,
    /// Size at which the WAL rolls over to a new file, 4096 to 1073741824 [default: 268435456].
    #[arg(long, env = "WARREN_WAL_FILE_BYTES_MAX")]
    wal_file_bytes_max: Option<u64>,
    /// A rolled WAL file whose entries are at least this percent still queued is kept in place
    /// (a backlog written once, but left on the WAL's disk); 101 copies every backlog into the
    /// segment directory instead (written twice) [default: 50].
    #[arg(long, env = "WARREN_ADOPT_LIVE_PERCENT_MIN")]
    adopt_live_percent_min: Option<u64>,
    /// While publishes stream in, the WAL syncs at most once per this many microseconds, so
    /// that each sync carries more messages (fewer bytes written per message, up to this much
    /// more confirm latency); 0 syncs as soon as anything waits [default: 2000].
    #[arg(long, env = "WARREN_WAL_COMMIT_WINDOW_US")]
    wal_commit_window_us: Option<u64>,
    /// Threads that run the client connections (1 to 256) [default: half the cores, at least
    /// 1: the WAL writer and the queue groups' loop need the others].
    #[arg(long, env = "WARREN_WORKER_THREADS")]
    worker_threads: Option<usize>,
    /// Heartbeat interval offered to clients, in seconds; 0 disables [default: 60].
    #[arg(long, env = "WARREN_HEARTBEAT")]
    heartbeat: Option<u16>,
    /// Highest channel number a client may open [default: 2047].
    #[arg(long, env = "WARREN_CHANNEL_MAX")]
    channel_max: Option<u16>,
    /// Largest frame, in bytes, offered to clients [default: 131072].
    #[arg(long, env = "WARREN_FRAME_MAX")]
    frame_max: Option<u32>,
    /// Largest message body accepted, in bytes [default: 134217728].
    #[arg(long, env = "WARREN_MESSAGE_MAX_BYTES")]
    message_max_bytes: Option<u64>,
    /// Publishers are blocked while the broker's resident memory is above this many bytes
    /// [default: 40% of physical memory].
    #[arg(long, env = "WARREN_MEMORY_HIGH_WATERMARK_BYTES")]
    memory_high_watermark_bytes: Option<u64>,
    /// Publishers are blocked while the fullest of the WAL's, segments' and metadata's file
    /// systems has less free space than this many bytes [default: 50000000, as RabbitMQ's disk_free_limit].
    #[arg(long, env = "WARREN_DISK_FREE_LIMIT_BYTES")]
    disk_free_limit_bytes: Option<u64>,
    /// Message bodies durable queues may keep in memory across the node; beyond it, long
    /// backlogs keep their heads in memory and the rest on disk only [default: 134217728].
    #[arg(long, env = "WARREN_MESSAGE_MEMORY_BYTES")]
    message_memory_bytes: Option<u64>,
    /// Where the HTTP management API and /metrics listen, or "none" [default: 127.0.0.1:15672].
    #[arg(long, env = "WARREN_MANAGEMENT_LISTEN")]
    management_listen: Option<String>,
    /// This node's name in a cluster [default: warren@<cluster port>].
    #[arg(long, env = "WARREN_NODE_NAME")]
    node_name: Option<String>,
    /// Where the other nodes of a cluster connect to this one (all traffic between nodes), as
    /// HOST:PORT (a name or an address; 0.0.0.0:25672 for every interface); without it the node
    /// is a single node. Alone (no --cluster-seeds), the node waits to be told `warren ctl
    /// join_cluster`.
    #[arg(long, env = "WARREN_CLUSTER_LISTEN")]
    cluster_listen: Option<HostPort>,
    /// The address the other nodes reach this one at, HOST:PORT, when it is not the listen
    /// address: a node listening on every interface, behind NAT, in a pod [default: the listen
    /// address; listening on every interface, the seed that resolves to this node, else this
    /// machine's host name].
    #[arg(long, env = "WARREN_CLUSTER_ADVERTISE")]
    cluster_advertise: Option<HostPort>,
    /// The founding nodes' cluster addresses, HOST:PORT, comma separated (this node's may be
    /// listed): the cluster forms once a majority of them run. A node not listed joins the
    /// running cluster of the nodes listed. At later starts, where to look for the other
    /// members if their addresses changed [default: those of the first start].
    #[arg(long, env = "WARREN_CLUSTER_SEEDS", value_delimiter = ',')]
    cluster_seeds: Vec<HostPort>,
    /// Seconds a node's first start waits for every seed's name to resolve before it gives up
    /// [default: 60].
    #[arg(long, env = "WARREN_CLUSTER_SEED_RESOLVE_TIMEOUT_S")]
    cluster_seed_resolve_timeout_s: Option<u64>,
    /// Which node hosts a queue declared without x-queue-leader-locator in a cluster:
    /// client-local (the declaring client's node) or balanced (spread over running nodes).
    #[arg(long, env = "WARREN_QUEUE_LEADER_LOCATOR")]
    queue_leader_locator: Option<String>,
    /// Seconds a node of the cluster may stay unreachable before the others delete its
    /// transient and exclusive queues, as RabbitMQ's nodes do after net_ticktime [default: 60].
    #[arg(long, env = "WARREN_NODE_DOWN_AFTER_S")]
    node_down_after_s: Option<u64>,
    /// Metadata entries applied between snapshots of the replicated topology (tests use a few to
    /// exercise snapshots).
    #[arg(long, env = "WARREN_CLUSTER_SNAPSHOT_ENTRIES", hide = true)]
    cluster_snapshot_entries: Option<u64>,
    /// Log filter, e.g. info or warren_server=debug.
    #[arg(long, env = "WARREN_LOG", default_value = "info")]
    log: String,
    /// TESTS ONLY: lets administrators make the next fsync fail over the management API
    /// (POST /api/warren/faults/fail-next-fsync), which stops the node's writes until a
    /// restart. Hidden, and deliberately without an environment variable or a config-file
    /// key, so that only a command line written for a test turns it on.
    #[arg(long, hide = true)]
    fault_injection: bool,
}

impl ServerArgs {
    fn resolve(&self) -> Result<ServerConfig, String> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
                toml::from_str::<ServerConfig>(&text)
                    .map_err(|e| format!("invalid config file {}: {e}", path.display()))?
            }
            None => ServerConfig::default(),
        };
        use warren_server::node::config::{parse_address_or_none, parse_addresses_or_none};
        if !self.listen.is_empty() {
            c.listen =
                parse_addresses_or_none(&self.listen).map_err(|e| format!("--listen {e}"))?;
        }
        if let Some(v) = &self.tls_listen {
            c.tls.listen = parse_address_or_none(v).map_err(|e| format!("--tls-listen {e}"))?;
        }
        if let Some(v) = &self.stream_listen {
            c.stream_listen =
                parse_address_or_none(v).map_err(|e| format!("--stream-listen {e}"))?;
        }
        if let Some(v) = &self.stream_tls_listen {
            c.stream_tls_listen =
                parse_address_or_none(v).map_err(|e| format!("--stream-tls-listen {e}"))?;
        }
        if let Some(v) = &self.stream_advertised_host {
            c.stream_advertised_host = Some(v.clone());
        }
        if let Some(v) = self.stream_advertised_port {
            c.stream_advertised_port = Some(v);
        }
        if let Some(v) = &self.tls_cert {
            c.tls.cert = Some(v.clone());
        }
        if let Some(v) = &self.tls_key {
            c.tls.key = Some(v.clone());
        }
        if let Some(v) = &self.tls_ca {
            c.tls.ca = Some(v.clone());
        }
        if self.tls_verify_peer {
            c.tls.verify_peer = true;
        }
        if self.tls_fail_if_no_peer_cert {
            c.tls.fail_if_no_peer_cert = true;
        }
        if let Some(v) = &self.tls_versions {
            c.tls.versions = v.iter().map(|s| s.trim().to_ascii_lowercase()).collect();
        }
        if let Some(v) = self.tls_cert_login_from {
            c.tls.cert_login_from = v;
        }
        if let Some(v) = &self.auth_mechanisms {
            c.auth_mechanisms = v.iter().map(|s| s.trim().to_ascii_uppercase()).collect();
        }
        if let Some(v) = self.connection_max {
            c.connection_max = Some(v);
        }
        if let Some(v) = &self.handshake_timeout {
            c.handshake_timeout_ms = parse_duration_ms(v).ok_or_else(|| {
                format!("--handshake-timeout '{v}': expected e.g. 10s, 500ms or 10000")
            })?;
        }
        if let Some(v) = &self.management_tls_listen {
            c.tls.management_listen =
                parse_address_or_none(v).map_err(|e| format!("--management-tls-listen {e}"))?;
        }
        if let Some(v) = &self.management_tls_cert {
            c.tls.management_cert = Some(v.clone());
        }
        if let Some(v) = &self.management_tls_key {
            c.tls.management_key = Some(v.clone());
        }
        if self.cluster_tls {
            c.tls.cluster = true;
        }
        if let Some(v) = &self.cluster_tls_cert {
            c.tls.cluster_cert = Some(v.clone());
        }
        if let Some(v) = &self.cluster_tls_key {
            c.tls.cluster_key = Some(v.clone());
        }
        if let Some(v) = &self.cluster_tls_ca {
            c.tls.cluster_ca = Some(v.clone());
        }
        if let Some(v) = &self.data_dir {
            c.data_dir = v.clone();
        }
        if let Some(v) = &self.wal_dir {
            c.wal_dir = Some(v.clone());
        }
        if let Some(v) = &self.segment_dir {
            c.segment_dir = Some(v.clone());
        }
        if let Some(v) = &self.meta_dir {
            c.meta_dir = Some(v.clone());
        }
        if let Some(v) = &self.load_definitions {
            c.load_definitions = Some(v.clone());
        }
        if let Some(v) = &self.default_user {
            c.default_user = Some(v.clone());
        }
        if let Some(v) = &self.default_pass {
            c.default_pass = Some(v.clone());
        }
        if let Some(v) = &self.loopback_users {
            c.loopback_users = warren_server::node::config::parse_names_or_none(v);
        }
        if let Some(v) = self.wal_file_bytes_max {
            c.wal_file_bytes_max = v;
        }
        use warren_store::config::{WAL_FILE_BYTES_MAX, WAL_FILE_BYTES_MIN};
        if !(WAL_FILE_BYTES_MIN..=WAL_FILE_BYTES_MAX).contains(&c.wal_file_bytes_max) {
            return Err(format!(
                "wal file bytes max must be between {WAL_FILE_BYTES_MIN} and {WAL_FILE_BYTES_MAX}, got {}",
                c.wal_file_bytes_max
            ));
        }
        if let Some(v) = self.adopt_live_percent_min {
            c.adopt_live_percent_min = v;
        }
        if let Some(v) = self.wal_commit_window_us {
            if v > 1_000_000 {
                return Err(format!(
                    "--wal-commit-window-us must be at most 1000000, got {v}"
                ));
            }
            c.wal_commit_window_us = v;
        }
        if let Some(v) = self.worker_threads {
            c.worker_threads = v;
        }
        let max = warren_server::node::config::WORKER_THREADS_MAX;
        if !(1..=max).contains(&c.worker_threads) {
            return Err(format!(
                "worker threads must be between 1 and {max}, got {}",
                c.worker_threads
            ));
        }
        if let Some(v) = self.heartbeat {
            c.heartbeat_s = v;
        }
        if let Some(v) = self.channel_max {
            c.channel_max = v;
        }
        if let Some(v) = self.frame_max {
            if v < 4096 {
                return Err(format!("--frame-max must be at least 4096, got {v}"));
            }
            c.frame_max_bytes = v;
        }
        if let Some(v) = self.message_max_bytes {
            c.message_bytes_max = v;
        }
        // A persistent message is one engine entry: body, properties (at most a frame) and a
        // few bytes of envelope.
        let stored_max = (warren_store::config::PAYLOAD_BYTES_MAX as u64)
            .saturating_sub(u64::from(c.frame_max_bytes) + 1024);
        if c.message_bytes_max > stored_max {
            return Err(format!(
                "message max bytes must be at most {stored_max} with a frame max of {}, got {}",
                c.frame_max_bytes, c.message_bytes_max
            ));
        }
        if let Some(v) = &self.management_listen {
            c.management_listen =
                parse_address_or_none(v).map_err(|e| format!("--management-listen {e}"))?;
        }
        if let Some(v) = self.disk_free_limit_bytes {
            c.disk_free_limit_bytes = v;
        }
        if let Some(v) = self.memory_high_watermark_bytes {
            c.memory_high_watermark_bytes = v;
        }
        if let Some(v) = self.message_memory_bytes {
            c.message_memory_bytes = v;
        }
        if let Some(v) = &self.node_name {
            c.node_name = Some(v.clone());
        }
        if let Some(v) = &self.cluster_listen {
            c.cluster_listen = Some(v.clone());
        }
        if let Some(v) = &self.cluster_advertise {
            c.cluster_advertise = Some(v.clone());
        }
        if !self.cluster_seeds.is_empty() {
            c.cluster_seeds = self.cluster_seeds.clone();
        }
        if let Some(v) = self.cluster_seed_resolve_timeout_s {
            c.cluster_seed_resolve_timeout_s = v;
        }
        if let Some(v) = &self.queue_leader_locator {
            c.queue_leader_locator = warren_server::node::config::QueueLocator::parse(v)
                .ok_or_else(|| {
                    format!("--queue-leader-locator {v}: expected client-local or balanced")
                })?;
        }
        if let Some(v) = self.node_down_after_s {
            c.node_down_after_s = v;
        }
        // --cluster-listen alone: a node that waits to be told `warren ctl join_cluster`.
        if c.cluster_listen.is_none() && !c.cluster_seeds.is_empty() {
            return Err(
                "--cluster-seeds needs --cluster-listen: where the other nodes reach this one"
                    .into(),
            );
        }
        if self.fault_injection {
            c.fault_injection = Some(Default::default());
        }
        c.validate()?;
        Ok(c)
    }
}

/// Milliseconds from "10000" (RabbitMQ's unit), "500ms" or "10s".
fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.trim().parse().ok();
    }
    if let Some(s) = text.strip_suffix('s') {
        return s.trim().parse::<u64>().ok()?.checked_mul(1000);
    }
    text.parse().ok()
}

/// `warren ctl`: its output ends quietly when the reader goes (`warren ctl list_queues | head`),
/// as other command-line tools do, rather than panic on a write to a closed pipe (Rust ignores
/// SIGPIPE by default).
fn run_ctl(args: ctl::CtlArgs) -> Result<(), ctl::Exit> {
    // SAFETY: setting a signal's disposition to its default has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    ctl::run(args)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Server(args) => run_server(*args),
        Command::Perf(args) => match warren_perf::run(args) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("warren perf: {e:#}");
                std::process::ExitCode::from(1)
            }
        },
        Command::Ctl(args) => match run_ctl(args) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(ctl::Exit(code, message)) => {
                eprintln!("warren ctl: {message}");
                std::process::ExitCode::from(code)
            }
        },
    }
}

fn run_server(args: ServerArgs) -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: a log file is grepped for `peer=...`.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warren: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // `warren ctl reset` left the cluster but the node stopped before its data was deleted.
    if let Err(e) = warren_server::cluster_admin::reset_data_if_asked(&config) {
        eprintln!("warren: {e}");
        return std::process::ExitCode::from(1);
    }
    if let Err(e) = std::fs::create_dir_all(&config.data_dir) {
        eprintln!(
            "warren: cannot create data dir {}: {e}",
            config.data_dir.display()
        );
        return std::process::ExitCode::from(1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.worker_threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        if let Err(e) = warren_server::node::data_format::check(&config.meta_dir()) {
            eprintln!("warren: {e}");
            return std::process::ExitCode::from(1);
        }
        let listeners = match warren_server::bind(&config).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("warren: {e}");
                return std::process::ExitCode::from(1);
            }
        };
        let show = |a: Option<SocketAddr>| a.map_or_else(|| "none".to_string(), |a| a.to_string());
        let listen = match config.listen.as_slice() {
            [] => "none".to_string(),
            addrs => addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(","),
        };
        tracing::info!(listen = %listen, tls_listen = %show(config.tls.listen), data_dir = %config.data_dir.display(), "warren started");
        // SIGHUP reloads the TLS certificates, as people rotate short-lived ones.
        let reloading = listeners.tls.clone();
        let cluster_reloading: Arc<std::sync::OnceLock<Arc<warren_cluster::Cluster>>> = Arc::default();
        let cluster_reload = cluster_reloading.clone();
        tokio::spawn(async move {
            let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).expect("SIGHUP handler");
            while hup.recv().await.is_some() {
                let cluster_tls = cluster_reload.get().and_then(|c| c.link_tls());
                if let Some(tls) = cluster_tls {
                    let _ = tls.reload();
                }
                match &reloading {
                    Some(tls) => {
                        let _ = tls.reload();
                    }
                    None if cluster_tls.is_some() => {}
                    None => tracing::info!("SIGHUP: no TLS listener, no certificates to reload"),
                }
            }
        });
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        });
        let broker = Arc::new(warren_broker::broker::Broker::new());
        if config.fault_injection.is_some() {
            tracing::warn!("fault injection is on (--fault-injection): for tests only, never in production");
        }
        // A cluster node's topology is the replicated metadata's, not a journal of its own.
        let journal = if config.cluster_listen.is_some() {
            None
        } else {
            match warren_server::storage::recover(&config.meta_dir().join("topology"), &broker) {
                Ok(mut j) => {
                    if let Some(faults) = &config.fault_injection {
                        j.set_faults(faults.metadata.clone());
                    }
                    Some(j)
                }
                Err(e) => {
                    eprintln!("warren: {e}");
                    return std::process::ExitCode::from(1);
                }
            }
        };
        let durability = Arc::new(warren_server::durability::Durability::default());
        let mut store_config = warren_store::Config::new(&config.data_dir);
        store_config.wal_dir = config.wal_dir();
        store_config.segment_dir = config.segment_dir();
        store_config.meta_dir = config.meta_dir().join("store");
        store_config.wal_file_bytes_max = config.wal_file_bytes_max;
        store_config.adopt_live_percent_min = config.adopt_live_percent_min;
        store_config.commit_window_us = config.wal_commit_window_us;
        if let Some(faults) = &config.fault_injection {
            store_config.faults = faults.wal.clone();
        }
        let store = match warren_store::Store::open(store_config, durability.clone()) {
            Ok((store, _logs)) => Arc::new(store),
            Err(e) => {
                eprintln!("warren: cannot open the message store: {e}");
                return std::process::ExitCode::from(1);
            }
        };
        // Left in maintenance mode (`warren ctl drain`) when it stopped: it stays so.
        let draining = match warren_server::node::maintenance::stored(&config.meta_dir()) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("warren: {e}");
                return std::process::ExitCode::from(1);
            }
        };
        let cluster = match config.cluster_listen.clone() {
            None => None,
            Some(listen) => {
                let cluster_config = warren_cluster::ClusterConfig {
                    node_name: config
                        .node_name
                        .clone()
                        .unwrap_or_else(|| format!("warren@{}", listen.port())),
                    listen,
                    advertise: config.cluster_advertise.clone(),
                    seeds: config.cluster_seeds.clone(),
                    seed_resolve_timeout: std::time::Duration::from_secs(
                        config.cluster_seed_resolve_timeout_s,
                    ),
                    amqp: config
                        .listen
                        .first()
                        .copied()
                        .or(config.tls.listen)
                        .expect("validate() requires an AMQP listener"),
                    management: config.management_listen,
                    dir: config.meta_dir().join("cluster"),
                    timing: warren_cluster::metadata::Timing {
                        snapshot_entries: args.cluster_snapshot_entries.unwrap_or(
                            warren_cluster::metadata::Timing::default().snapshot_entries,
                        ),
                        ..Default::default()
                    },
                    tls: config.cluster_tls().expect("validate() checked the cluster TLS files"),
                    draining,
                };
                broker.set_local_node(&cluster_config.node_name);
                match warren_cluster::Cluster::start(cluster_config, store.clone(), broker.clone()).await {
                    Ok(c) => {
                        // Queues must exist again before their stored messages are put back.
                        c.wait_replayed().await;
                        warren_server::lost_queues::forget_previous_life(&c, &broker);
                        let _ = cluster_reloading.set(c.clone());
                        Some(c)
                    }
                    Err(e) => {
                        eprintln!("warren: cannot start the cluster node: {e}");
                        return std::process::ExitCode::from(1);
                    }
                }
            }
        };
        broker.enable_paging(
            Arc::new(warren_server::storage::StorePayloads(store.clone())),
            Arc::new(warren_broker::backlog::MemoryBudget::new(config.message_memory_bytes as usize)),
        );
        if let Err(e) = warren_server::storage::recover_messages(&store, &broker) {
            eprintln!("warren: cannot recover stored messages: {e}");
            return std::process::ExitCode::from(1);
        }
        let stopped_config = config.clone();
        warren_server::serve(listeners, config, broker, stop_rx, journal, Some((store, durability)), cluster.clone()).await;
        if let Some(c) = cluster {
            c.stop();
        }
        if let Err(e) = warren_server::cluster_admin::reset_data_if_asked(&stopped_config) {
            tracing::error!("{e}");
            return std::process::ExitCode::from(1);
        }
        tracing::info!("stopped");
        std::process::ExitCode::SUCCESS
    })
}
