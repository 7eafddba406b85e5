//! What a node is told at start: where to listen, where its data lives, and its limits.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// RabbitMQ's defaults, so that clients negotiate the same limits with either broker.
pub const HEARTBEAT_DEFAULT_S: u16 = 60;
pub const CHANNEL_MAX_DEFAULT: u16 = 2047;
pub const FRAME_MAX_DEFAULT_BYTES: u32 = warren_protocol::frame::FRAME_MAX_DEFAULT_BYTES;
/// RabbitMQ 3.10's max_message_size default: 128 MiB.
pub const MESSAGE_BYTES_MAX_DEFAULT: u64 = 128 * 1024 * 1024;
/// RabbitMQ's default disk_free_limit.
pub const DISK_FREE_LIMIT_DEFAULT_BYTES: u64 = 50_000_000;
/// Bodies of stored messages kept in memory across the node before long backlogs page out:
/// enough that queues whose consumers keep up never read from disk, small beside the 1 GiB a
/// 10 million message backlog may cost in all.
pub const MESSAGE_MEMORY_DEFAULT_BYTES: u64 = 128 * 1024 * 1024;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
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
    pub management_listen: Option<SocketAddr>,
    /// This node's name in a cluster (RabbitMQ's node name); shown in `/api/nodes` and as each
    /// queue's `node`. Defaults to `warren@<cluster port>` in a cluster.
    pub node_name: Option<String>,
    /// Where other nodes of the cluster connect to this one; none: a single node.
    pub cluster_listen: Option<SocketAddr>,
    /// The founding nodes' cluster addresses (this node's may be among them).
    pub cluster_seeds: Vec<SocketAddr>,
    /// Test-only fault injection (see [`crate::fault_injection`]): set from the hidden
    /// `--fault-injection` flag only, never from a config file.
    #[serde(skip)]
    pub fault_injection: Option<crate::fault_injection::FaultInjection>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:5672".parse().expect("valid address"),
            data_dir: PathBuf::from("./warren-data"),
            wal_dir: None,
            segment_dir: None,
            meta_dir: None,
            wal_file_bytes_max: warren_store::config::WAL_FILE_BYTES_DEFAULT,
            adopt_live_percent_min: warren_store::config::ADOPT_LIVE_PERCENT_MIN,
            wal_commit_window_us: warren_store::config::COMMIT_WINDOW_US_DEFAULT,
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
            cluster_seeds: Vec::new(),
            fault_injection: None,
        }
    }
}

/// 40% of physical memory, RabbitMQ's default vm_memory_high_watermark.
fn default_memory_watermark() -> u64 {
    crate::memory::total_memory_bytes() * 2 / 5
}

impl ServerConfig {
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
}
