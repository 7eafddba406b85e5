//! `warren ctl`'s quorum queue commands, with rabbitmq-queues' names: `quorum_status` (each
//! member of a queue's Raft group and its role) and `check_if_node_is_quorum_critical` (whether
//! stopping the node would leave a quorum queue, or the cluster's metadata, without a majority),
//! spoken to the management API as the rest of ctl is.

use super::{encode_segment as seg, expect_ok, request, Endpoint};
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum QueuesCommand {
    /// Each member of the quorum queue's Raft group: leader, follower, or down.
    QuorumStatus {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        queue: String,
    },
    /// Fails (non-zero) when stopping the node would leave a quorum queue, or the cluster's
    /// metadata, without a majority of its members running; lists those queues.
    CheckIfNodeIsQuorumCritical,
}

pub fn run(ep: &Endpoint, command: QueuesCommand) -> Result<(), String> {
    match command {
        QueuesCommand::QuorumStatus { vhost, queue } => {
            let path = format!("/api/queues/{}/{}", seg(&vhost), seg(&queue));
            let (code, body) = request(ep, "GET", &path, None)?;
            if code == 404 {
                return Err(format!("queue '{queue}' in vhost '{vhost}' does not exist"));
            }
            let q: Value = serde_json::from_str(&expect_ok((code, body))?)
                .map_err(|e| format!("unreadable answer from {path}: {e}"))?;
            let Some(members) = q["members"].as_array() else {
                return Err(format!(
                    "queue '{queue}' in vhost '{vhost}' is not a quorum queue"
                ));
            };
            let nodes: Value =
                serde_json::from_str(&expect_ok(request(ep, "GET", "/api/nodes", None)?)?)
                    .map_err(|e| format!("unreadable answer from /api/nodes: {e}"))?;
            let running = |name: &str| {
                nodes.as_array().into_iter().flatten().any(|n| {
                    n["name"].as_str() == Some(name) && n["running"].as_bool() == Some(true)
                })
            };
            let leader = q["leader"].as_str().unwrap_or_default();
            println!(
                "Status of quorum queue {queue} on node {} ...",
                q["node"].as_str().unwrap_or(leader)
            );
            println!("Node Name\tRaft State");
            for m in members.iter().filter_map(Value::as_str) {
                let state = if !running(m) {
                    "noproc"
                } else if m == leader {
                    "leader"
                } else {
                    "follower"
                };
                println!("{m}\t{state}");
            }
        }
        QueuesCommand::CheckIfNodeIsQuorumCritical => {
            let path = "/api/health/checks/node-is-quorum-critical";
            let (code, body) = request(ep, "GET", path, None)?;
            if code == 503 {
                let v: Value = serde_json::from_str(&body).unwrap_or_default();
                let queues: Vec<String> = v["queues"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|q| q["readable_name"].as_str().map(str::to_string))
                    .collect();
                return Err(format!(
                    "{}:\n{}",
                    v["reason"]
                        .as_str()
                        .unwrap_or("the node is quorum critical"),
                    queues.join("\n")
                ));
            }
            expect_ok((code, body))?;
            println!("Node is not critical for the quorum of any quorum queue");
        }
    }
    Ok(())
}
