//! A fresh cluster of three nodes in one process, each with its own store, broker and
//! listener: what it takes for them to form one cluster.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use warren_broker::broker::Broker;
use warren_cluster::messaging::{Data, Handler};
use warren_cluster::metadata::Timing;
use warren_cluster::{Cluster, ClusterConfig};
use warren_store::{Config, NoopListener, Store};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warren-formation-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A node that serves other nodes (the server's handler answers their clients' requests;
/// these nodes have none), so that their links stay up.
struct NoClients;

impl Handler for NoClients {
    fn data(&self, _from: u64, _data: Data) {}
    fn client_side_broken(&self, _peer: u64, _ended_epoch: u64) {}
    fn server_side_broken(&self, _peer: u64) {}
}

/// Addresses nothing listens on yet, one per node (the nodes bind them).
fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let held: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter().map(|l| l.local_addr().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cluster_elects_a_leader_without_waiting_out_an_election_timeout() {
    // An election timeout of 6,000 s (60,000 ticks of 100 ms): a leader within the test's
    // deadline is one that stood without waiting for it.
    let timing = Timing {
        election_ticks: 60_000,
        ..Timing::default()
    };
    let seeds = free_addrs(3);
    let mut nodes = Vec::new();
    for (i, listen) in seeds.iter().enumerate() {
        let dir = temp_dir(&format!("n{}", i + 1));
        let (store, _) =
            Store::open(Config::new(dir.join("store")), Arc::new(NoopListener)).unwrap();
        let config = ClusterConfig {
            node_name: format!("n{}", i + 1),
            listen: (*listen).into(),
            advertise: None,
            seeds: seeds.iter().map(|s| (*s).into()).collect(),
            seed_resolve_timeout: std::time::Duration::from_secs(1),
            amqp: *listen,
            management: None,
            dir: dir.join("cluster"),
            timing: timing.clone(),
            tls: None,
            draining: false,
        };
        let cluster = Cluster::start(config, Arc::new(store), Arc::new(Broker::new()))
            .await
            .unwrap();
        cluster.messaging().set_handler(Arc::new(NoClients));
        nodes.push((cluster, dir));
    }
    common::eventually("every node to know one leader", || {
        let leaders: Vec<u64> = nodes
            .iter()
            .map(|(c, _)| c.status().metadata.leader)
            .collect();
        leaders[0] != 0 && leaders.iter().all(|l| *l == leaders[0])
    })
    .await;
    let status = nodes[0].0.status();
    assert_eq!(status.metadata.leader, 1, "the first founder stands first");
    assert_eq!(status.metadata.term, 1, "one election, no split vote");
    for (cluster, dir) in nodes {
        cluster.stop();
        let _ = std::fs::remove_dir_all(dir);
    }
}
