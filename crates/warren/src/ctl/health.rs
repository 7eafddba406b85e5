//! `warren ctl`'s health checks, with rabbitmq-diagnostics' names and exit codes (0 passed,
//! 1 failed): `ping`, `check_running`, `check_alarms`, `check_local_alarms`,
//! `check_virtual_hosts`, `check_port_listener`, `check_protocol_listener`. Each is the
//! management API's `/api/health/checks/...` (or `/api/overview` for the first two), as
//! container probes call them.

use super::{encode_segment as seg, expect_ok, request, Endpoint};
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum HealthCommand {
    /// rabbitmq-diagnostics ping: the node answers.
    Ping,
    /// rabbitmq-diagnostics check_running: the node has booted and serves clients; fails
    /// while it has no metadata leader it can reach (a minority partition).
    CheckRunning,
    /// rabbitmq-diagnostics check_alarms: fails (exit code 1) while any alarm is in effect in
    /// the cluster, naming each.
    CheckAlarms,
    /// rabbitmq-diagnostics check_local_alarms: fails (exit code 1) while any alarm is in
    /// effect on the node, naming each.
    CheckLocalAlarms,
    /// rabbitmq-diagnostics check_virtual_hosts: every vhost is running.
    CheckVirtualHosts,
    /// rabbitmq-diagnostics check_port_listener: the node listens on PORT.
    CheckPortListener { port: u16 },
    /// rabbitmq-diagnostics check_protocol_listener: the node listens for PROTOCOL (amqp,
    /// amqp/ssl, http, https, clustering).
    CheckProtocolListener { protocol: String },
}

pub fn run(ep: &Endpoint, command: HealthCommand) -> Result<(), String> {
    match command {
        HealthCommand::Ping => {
            let node = node_name(ep)?;
            println!("Ping succeeded if the node answered: {node} did");
            Ok(())
        }
        HealthCommand::CheckRunning => {
            let node = node_name(ep)?;
            // A node cut off from the cluster's majority can change nothing: it fails, as a
            // paused-minority RabbitMQ node does (a broker without the check passes).
            let (code, body) = request(ep, "GET", "/api/health/checks/metadata-leader", None)?;
            if code == 503 {
                let v: Value = serde_json::from_str(&body).unwrap_or_default();
                return Err(format!(
                    "node {node} is not running: {}",
                    v["reason"].as_str().unwrap_or("it has no metadata leader")
                ));
            }
            println!("RabbitMQ on node {node} is fully booted and running");
            Ok(())
        }
        HealthCommand::CheckAlarms => {
            check(ep, "alarms")?;
            println!("Node reported no alarms, local or clusterwide");
            Ok(())
        }
        HealthCommand::CheckLocalAlarms => {
            check(ep, "local-alarms")?;
            println!("Node reported no local alarms");
            Ok(())
        }
        HealthCommand::CheckVirtualHosts => {
            check(ep, "virtual-hosts")?;
            println!("Node reported all vhosts as running");
            Ok(())
        }
        HealthCommand::CheckPortListener { port } => {
            check(ep, &format!("port-listener/{port}"))?;
            println!("A listener for port {port} is running");
            Ok(())
        }
        HealthCommand::CheckProtocolListener { protocol } => {
            check(ep, &format!("protocol-listener/{}", seg(&protocol)))?;
            println!("A listener for protocol {protocol} is running");
            Ok(())
        }
    }
}

fn node_name(ep: &Endpoint) -> Result<String, String> {
    let body = expect_ok(request(ep, "GET", "/api/overview", None)?)?;
    let overview: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    Ok(overview["node"].as_str().unwrap_or("?").to_string())
}

/// One `/api/health/checks/{check}`: `Err` with its reason, and each alarm or what is
/// missing, when it answers 503.
fn check(ep: &Endpoint, check: &str) -> Result<(), String> {
    let (code, body) = request(ep, "GET", &format!("/api/health/checks/{check}"), None)?;
    if code != 503 {
        expect_ok((code, body))?;
        return Ok(());
    }
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    let mut lines = vec![v["reason"]
        .as_str()
        .unwrap_or("health check failed")
        .to_string()];
    for a in v["alarms"].as_array().into_iter().flatten() {
        lines.push(format!(
            "{} alarm on node {}: {}",
            a["resource"].as_str().unwrap_or_default(),
            a["node"].as_str().unwrap_or_default(),
            a["reason"].as_str().unwrap_or_default()
        ));
    }
    for key in ["missing", "ports", "protocols"] {
        if !v[key].is_null() {
            lines.push(format!("{key}: {}", v[key]));
        }
    }
    Err(lines.join("\n"))
}
