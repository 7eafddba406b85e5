//! `warren ctl`'s maintenance commands, with rabbitmq-upgrade's and rabbitmq-queues' names,
//! for upgrades, preStop hooks and startup probes: `drain` and `revive` (maintenance mode),
//! `await_online_quorum_plus_one` and `check_if_node_is_quorum_critical` (whether stopping the
//! node would leave a Raft group without a majority), `await_online_nodes`, `await_startup`,
//! and warren's `check_metadata_leader`. The checks exit with 69 (EX_UNAVAILABLE) when they
//! fail or time out, as RabbitMQ's CLI does, so scripts tell "not yet" from a broken command.

use super::{expect_ok, request, Endpoint, Exit};
use clap::Subcommand;
use serde_json::Value;
use std::time::{Duration, Instant};

/// RabbitMQ CLI's exit code for a check that did not pass (EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;

/// How often the await_* commands ask again.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum UpgradeCommand {
    /// rabbitmq-upgrade drain: maintenance mode. The node stops its AMQP listeners, closes
    /// its client connections, hands its quorum queue and metadata leaderships to other nodes
    /// and takes no new ones nor new queues, until `revive` (also across restarts).
    Drain,
    /// rabbitmq-upgrade revive: out of maintenance mode (`rebalance` moves leaders back).
    Revive,
    /// rabbitmq-queues check_if_node_is_quorum_critical: exits 69 when stopping the node
    /// would leave a quorum queue, or the cluster's metadata, without a majority of its
    /// members running; lists those queues.
    CheckIfNodeIsQuorumCritical,
    /// rabbitmq-upgrade await_online_quorum_plus_one: waits until stopping the node would
    /// leave every quorum queue and the metadata with a majority; exits 69 at the timeout.
    AwaitOnlineQuorumPlusOne {
        /// Seconds to wait.
        #[arg(short = 't', long = "timeout", default_value_t = 120)]
        timeout: u64,
    },
    /// rabbitmqctl await_online_nodes: waits until COUNT nodes of the cluster run (as this
    /// node sees them); exits 69 at the timeout.
    AwaitOnlineNodes {
        count: usize,
        #[arg(short = 't', long = "timeout", default_value_t = 300)]
        timeout: u64,
    },
    /// rabbitmqctl await_startup: waits until the node answers and, in a cluster, has a
    /// metadata leader it can reach (it can change topology); exits 69 at the timeout.
    AwaitStartup {
        #[arg(short = 't', long = "timeout", default_value_t = 300)]
        timeout: u64,
    },
    /// Fails (69) while the node has no metadata leader it can reach: it is cut off from a
    /// majority of the cluster, or the cluster has not formed (warren's; RabbitMQ has none).
    CheckMetadataLeader,
}

pub fn run(ep: &Endpoint, command: UpgradeCommand) -> Result<(), Exit> {
    match command {
        UpgradeCommand::Drain => {
            println!("Will put the node into maintenance mode. The node will no longer serve any client traffic!");
            let body = expect_ok(request(ep, "POST", "/api/warren/drain", None)?)?;
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            println!(
                "Closed {} client connection(s)",
                v["connections_closed"].as_u64().unwrap_or(0)
            );
            let queues = v["quorum_queue_leaders"].as_u64().unwrap_or(0);
            if queues > 0 || v["metadata_leader"].as_bool() == Some(true) {
                eprintln!(
                    "warning: the node still leads {queues} quorum queue(s){}: no other member \
                     was up to take over yet; it hands them on as soon as one is",
                    if v["metadata_leader"].as_bool() == Some(true) {
                        " and the metadata"
                    } else {
                        ""
                    }
                );
            }
            Ok(())
        }
        UpgradeCommand::Revive => {
            println!("Will put the node back into regular operating mode");
            expect_ok(request(ep, "POST", "/api/warren/revive", None)?)?;
            Ok(())
        }
        UpgradeCommand::CheckIfNodeIsQuorumCritical => {
            let node = node_name(ep)?;
            match quorum_critical(ep, &node)? {
                None => {
                    println!("Node {node} reported no quorum queues with minimum quorum");
                    Ok(())
                }
                Some(lines) => Err(Exit(EXIT_UNAVAILABLE, lines)),
            }
        }
        UpgradeCommand::AwaitOnlineQuorumPlusOne { timeout } => {
            let node = node_name(ep)?;
            println!(
                "Will wait for a quorum + 1 of nodes to be online for all quorum queues for {timeout} seconds..."
            );
            let deadline = Instant::now() + Duration::from_secs(timeout);
            loop {
                let Some(lines) = quorum_critical(ep, &node)? else {
                    return Ok(());
                };
                if Instant::now() >= deadline {
                    return Err(Exit(
                        EXIT_UNAVAILABLE,
                        format!("timed out after {timeout} s waiting for a quorum + 1:\n{lines}"),
                    ));
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        UpgradeCommand::AwaitOnlineNodes { count, timeout } => {
            println!("Will wait for at least {count} nodes to join the cluster. Timeout: {timeout} seconds.");
            let deadline = Instant::now() + Duration::from_secs(timeout);
            loop {
                let nodes: Value =
                    serde_json::from_str(&expect_ok(request(ep, "GET", "/api/nodes", None)?)?)
                        .map_err(|e| format!("unreadable answer from /api/nodes: {e}"))?;
                let running = nodes
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|n| n["running"].as_bool() == Some(true))
                    .count();
                if running >= count {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err(Exit(
                        EXIT_UNAVAILABLE,
                        format!("timed out after {timeout} s: {running} of {count} nodes online"),
                    ));
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        UpgradeCommand::AwaitStartup { timeout } => {
            let deadline = Instant::now() + Duration::from_secs(timeout);
            loop {
                // Not answering yet (still starting) or without a leader: wait.
                let why = match request(ep, "GET", "/api/health/checks/metadata-leader", None) {
                    Ok((200, _)) => return Ok(()),
                    // A broker without the check (RabbitMQ): answering is started.
                    Ok((404, _)) => return Ok(()),
                    Ok((401, _)) => {
                        return Err(Exit(
                            1,
                            "not authorised: the --uri credentials must be an administrator's"
                                .into(),
                        ))
                    }
                    Ok((_, body)) => reason(&body),
                    Err(e) => e,
                };
                if Instant::now() >= deadline {
                    return Err(Exit(
                        EXIT_UNAVAILABLE,
                        format!("timed out after {timeout} s waiting for the node to start: {why}"),
                    ));
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        UpgradeCommand::CheckMetadataLeader => {
            match request(ep, "GET", "/api/health/checks/metadata-leader", None)? {
                (200, body) => {
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    println!(
                        "The node reaches metadata leader {}",
                        v["leader"].as_str().unwrap_or("?")
                    );
                    Ok(())
                }
                (503, body) => Err(Exit(EXIT_UNAVAILABLE, reason(&body))),
                other => expect_ok(other).map(|_| ()).map_err(Exit::from),
            }
        }
    }
}

fn reason(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["reason"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.to_string())
}

fn node_name(ep: &Endpoint) -> Result<String, String> {
    let body = expect_ok(request(ep, "GET", "/api/overview", None)?)?;
    let overview: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    Ok(overview["node"].as_str().unwrap_or("?").to_string())
}

/// `None` when the node is not quorum critical; else what rabbitmq-queues prints: the reason
/// and each queue that would lose its quorum.
fn quorum_critical(ep: &Endpoint, node: &str) -> Result<Option<String>, String> {
    let path = "/api/health/checks/node-is-quorum-critical";
    let (code, body) = request(ep, "GET", path, None)?;
    if code != 503 {
        expect_ok((code, body))?;
        return Ok(None);
    }
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    let mut lines = vec![v["reason"]
        .as_str()
        .unwrap_or("the node is quorum critical")
        .to_string()];
    for q in v["queues"].as_array().into_iter().flatten() {
        let name = q["readable_name"].as_str().map_or_else(
            || {
                format!(
                    "queue '{}' in vhost '{}'",
                    q["name"].as_str().unwrap_or("?"),
                    q["virtual_host"].as_str().unwrap_or("?")
                )
            },
            str::to_string,
        );
        lines.push(format!(
            "{name} would lose quorum if node {node} is stopped"
        ));
    }
    Ok(Some(lines.join("\n")))
}
