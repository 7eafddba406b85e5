//! `warren ctl`'s quorum queue commands, with rabbitmq-queues' names: `quorum_status` (each
//! member of a queue's Raft group and its role), `add_member` and `delete_member` (one queue), `grow` and `shrink` (a node into or out of
//! every quorum queue that matches), `rebalance` (leaders spread over the nodes), spoken to the management API as the rest of ctl is.

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
    /// Adds NODE to the quorum queue's members: it gets a replica and catches up.
    AddMember {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        queue: String,
        node: String,
    },
    /// Removes NODE from the quorum queue's members (its replica is deleted).
    DeleteMember {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        queue: String,
        node: String,
    },
    /// Adds NODE to every quorum queue that matches and lacks it: `all` of them, or only
    /// those with an `even` number of members (as rabbitmq-queues grow).
    Grow {
        node: String,
        #[arg(value_parser = ["all", "even"])]
        selector: String,
        #[arg(long = "vhost-pattern", default_value = ".*")]
        vhost_pattern: String,
        #[arg(long = "queue-pattern", default_value = ".*")]
        queue_pattern: String,
    },
    /// Moves quorum queue leaders so that each node leads its share, as rabbitmq-queues
    /// rebalance (`quorum` or `all`: warren's classic queues have no leaders to move).
    Rebalance {
        #[arg(value_parser = ["quorum", "all"])]
        kind: String,
    },
    /// Removes NODE from every quorum queue it is a member of (but never a queue's last
    /// member), as rabbitmq-queues shrink.
    Shrink {
        node: String,
        /// Print only the queues where removing failed.
        #[arg(long = "errors-only")]
        errors_only: bool,
    },
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
            let Some(members) = q["members"].as_array().filter(|_| q["type"] == "quorum") else {
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
        QueuesCommand::AddMember { vhost, queue, node } => {
            add_member(ep, &vhost, &queue, &node)?;
            println!("Adding a replica for queue {queue} on node {node}...");
        }
        QueuesCommand::DeleteMember { vhost, queue, node } => {
            delete_member(ep, &vhost, &queue, &node)?;
            println!("Removing a replica for queue {queue} on node {node}...");
        }
        QueuesCommand::Grow {
            node,
            selector,
            vhost_pattern,
            queue_pattern,
        } => {
            let vhosts = regex(&vhost_pattern)?;
            let queues = regex(&queue_pattern)?;
            println!(
                "Growing quorum queues matching '{vhost_pattern}' / '{queue_pattern}' to {node}..."
            );
            println!("vhost\tname\tsize\tresult");
            for (vhost, name, members) in quorum_queues(ep)? {
                let wanted = selector == "all" || members.len() % 2 == 0;
                if !vhosts.is_match(&vhost)
                    || !queues.is_match(&name)
                    || !wanted
                    || members.contains(&node)
                {
                    continue;
                }
                let result =
                    add_member(ep, &vhost, &name, &node).map_or_else(|e| e, |()| "ok".into());
                println!("{vhost}\t{name}\t{}\t{result}", members.len() + 1);
            }
        }
        QueuesCommand::Rebalance { kind: _ } => {
            println!("Re-balancing leaders of quorum queues...");
            let v: Value = serde_json::from_str(&expect_ok(request(
                ep,
                "POST",
                "/api/warren/rebalance",
                None,
            )?)?)
            .map_err(|e| format!("unreadable answer from /api/warren/rebalance: {e}"))?;
            println!(
                "{} of {} quorum queues get a new leader",
                v["moved"], v["queues"]
            );
        }
        QueuesCommand::Shrink { node, errors_only } => {
            println!("Shrinking quorum queues on {node}...");
            println!("vhost\tname\tsize\tresult");
            for (vhost, name, members) in quorum_queues(ep)? {
                if !members.contains(&node) {
                    continue;
                }
                let result = if members.len() == 1 {
                    Err("the last member is never removed".to_string())
                } else {
                    delete_member(ep, &vhost, &name, &node)
                };
                match result {
                    Ok(()) if !errors_only => {
                        println!("{vhost}\t{name}\t{}\tok", members.len() - 1)
                    }
                    Ok(()) => {}
                    Err(e) => println!("{vhost}\t{name}\t{}\terror: {e}", members.len()),
                }
            }
        }
    }
    Ok(())
}

fn members_path(vhost: &str, queue: &str) -> String {
    format!("/api/warren/queues/{}/{}/members", seg(vhost), seg(queue))
}

fn add_member(ep: &Endpoint, vhost: &str, queue: &str, node: &str) -> Result<(), String> {
    let body = serde_json::json!({ "node": node });
    expect_ok(request(
        ep,
        "POST",
        &members_path(vhost, queue),
        Some(&body),
    )?)
    .map(drop)
}

fn delete_member(ep: &Endpoint, vhost: &str, queue: &str, node: &str) -> Result<(), String> {
    let path = format!("{}/{}", members_path(vhost, queue), seg(node));
    expect_ok(request(ep, "DELETE", &path, None)?).map(drop)
}

fn regex(pattern: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(pattern).map_err(|e| format!("bad pattern '{pattern}': {e}"))
}

/// Every quorum queue of the cluster: vhost, name and members.
fn quorum_queues(ep: &Endpoint) -> Result<Vec<(String, String, Vec<String>)>, String> {
    let all: Value = serde_json::from_str(&expect_ok(request(ep, "GET", "/api/queues", None)?)?)
        .map_err(|e| format!("unreadable answer from /api/queues: {e}"))?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| {
            // Streams have members too, not Raft groups.
            let members = q["members"].as_array().filter(|_| q["type"] == "quorum")?;
            Some((
                q["vhost"].as_str()?.to_string(),
                q["name"].as_str()?.to_string(),
                members
                    .iter()
                    .filter_map(|m| m.as_str().map(str::to_string))
                    .collect(),
            ))
        })
        .collect())
}
