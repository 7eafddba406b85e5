//! What the cluster crate's integration tests share.

use std::net::SocketAddr;
use warren_cluster::frame::NodeInfo;

/// Node `id`, named `n<id>`, reached for links and AMQP alike at `addr` (the tests' listener).
pub fn node_info(id: u64, addr: SocketAddr) -> NodeInfo {
    NodeInfo {
        id,
        name: format!("n{id}"),
        cluster: addr,
        amqp: addr,
        management: None,
    }
}
