//! What the cluster crate's integration tests share.

// Each test file uses some of these.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;
use warren_cluster::frame::NodeInfo;

/// Node `id`, named `n<id>`, reached for links and AMQP alike at `addr` (the tests' listener).
pub fn node_info(id: u64, addr: SocketAddr) -> NodeInfo {
    NodeInfo {
        id,
        name: format!("n{id}"),
        cluster: addr.into(),
        amqp: addr,
        management: None,
        draining: false,
    }
}

/// Waits (10 s at most) until `check` holds; panics naming `what` otherwise.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}
