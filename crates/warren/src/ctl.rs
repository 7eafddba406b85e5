//! `warren ctl`: rabbitmqctl's everyday commands, with its argument order, spoken to a node
//! over its HTTP management API.

mod access;
mod health;
mod listings;
mod queues;
mod streams;
mod upgrade;

use base64::Engine;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
const RESPONSE_BYTES_MAX: u64 = 64 * 1024 * 1024;

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The node's management API, with credentials of an administrator; without any, the
    /// node's own --default-user and --default-pass (WARREN_DEFAULT_USER, WARREN_DEFAULT_PASS)
    /// when both are in the environment, as in a container started with them, else guest:guest.
    #[arg(long, env = "WARREN_CTL_URI", default_value = "http://127.0.0.1:15672")]
    uri: String,
    /// CA certificates (PEM) to trust for an https:// --uri: the management API's HTTPS
    /// listener (--management-tls-listen).
    #[arg(long, env = "WARREN_CTL_CACERT")]
    cacert: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
enum CtlCommand {
    /// Create a user.
    AddUser {
        user: String,
        password: String,
    },
    DeleteUser {
        user: String,
    },
    ChangePassword {
        user: String,
        password: String,
    },
    /// Set a user's tags (e.g. administrator), replacing the old ones.
    SetUserTags {
        user: String,
        tags: Vec<String>,
    },
    ListUsers,
    AddVhost {
        vhost: String,
    },
    DeleteVhost {
        vhost: String,
    },
    ListVhosts,
    /// Grant USER the regular expressions CONF, WRITE and READ in the vhost given by -p.
    SetPermissions {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        user: String,
        configure: String,
        write: String,
        read: String,
    },
    ClearPermissions {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        user: String,
    },
    /// Node overview: totals of connections, channels, queues and messages, then the alarms
    /// in effect (memory, disk, storage failure).
    Status,
    /// The cluster's members as the node sees them, its metadata group and its links.
    ClusterStatus,
    /// Make the node (started with --cluster-listen) a member of the cluster that NODE, a
    /// member's cluster address (host:port), belongs to; waits until it is one.
    JoinCluster {
        node: String,
    },
    /// Remove a stopped member from the cluster (run it on a live member): a majority is then
    /// counted over the remaining members.
    ForgetClusterNode {
        node: String,
    },
    /// Run against a STOPPED node's data: at its next start the node boots without the
    /// peers it waits for, making itself the cluster's only voter (every other member is
    /// removed). Only for a cluster that lost its majority for good, when the other
    /// nodes will not come back: if they do, they are refused and must be reset (their data
    /// directories deleted) and join again; what they changed on their own side is lost.
    /// A leader found at start (a majority back after all) cancels it.
    ForceBoot {
        /// The stopped node's --data-dir (its cluster state is in DATA_DIR/meta/cluster).
        #[arg(long = "data-dir", required_unless_present = "meta_dir")]
        data_dir: Option<std::path::PathBuf>,
        /// The stopped node's --meta-dir, if it was started with one.
        #[arg(long = "meta-dir")]
        meta_dir: Option<std::path::PathBuf>,
    },
    /// Return the node to its virgin state, as rabbitmqctl reset: it leaves its cluster (which
    /// needs a majority of the members: refused otherwise, and nothing is deleted), then stops
    /// and deletes all its data: users, vhosts, queues and their messages. Started again, it is
    /// a new node, which can join a cluster. Unlike rabbitmqctl there is no stop_app first:
    /// the node stops itself.
    Reset,
    /// Set the memory alarm threshold: a fraction of RAM (0.4), or `absolute BYTES`.
    SetVmMemoryHighWatermark {
        args: Vec<String>,
    },
    /// Set the disk alarm threshold in bytes of free space (RabbitMQ's disk_free_limit).
    SetDiskFreeLimit {
        bytes: u64,
    },
    /// Set policy NAME in the vhost given by -p: queues and exchanges whose names match the
    /// regular expression PATTERN get the keys of DEFINITION (a JSON object).
    SetPolicy {
        #[command(flatten)]
        policy: PolicyArgs,
    },
    ClearPolicy {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        name: String,
    },
    ListPolicies {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
    },
    /// Set operator policy NAME: limits (max-length, message-ttl, expires, ...) that cap what
    /// users' policies and queue arguments ask for.
    SetOperatorPolicy {
        #[command(flatten)]
        policy: PolicyArgs,
    },
    ClearOperatorPolicy {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        name: String,
    },
    ListOperatorPolicies {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
    },
    /// Write the node's definitions (RabbitMQ's JSON) to FILE, `-` for standard output.
    ExportDefinitions {
        file: String,
    },
    /// Import a definitions file (RabbitMQ's JSON; `-` for standard input).
    ImportDefinitions {
        file: String,
    },
    /// Read the TLS certificate, key and CA files again (as SIGHUP does): new connections get
    /// them, open ones keep theirs; if a file is bad the old ones stay and this fails naming it.
    ReloadCertificates,
    /// Vhost and user limits, topic permissions.
    #[command(flatten)]
    Access(access::AccessCommand),
    /// rabbitmq-queues' quorum queue commands.
    #[command(flatten)]
    Queues(queues::QueuesCommand),
    /// rabbitmq-streams' super stream commands.
    #[command(flatten)]
    Streams(streams::StreamsCommand),
    /// Listings with info items, and queue and connection operations.
    #[command(flatten)]
    Listings(listings::ListingsCommand),
    /// rabbitmq-diagnostics' health checks.
    #[command(flatten)]
    Health(health::HealthCommand),
    /// rabbitmq-upgrade's maintenance mode and the checks around it.
    #[command(flatten)]
    Upgrade(upgrade::UpgradeCommand),
}

/// How `warren ctl` fails: the exit code and what it prints.
#[derive(Debug)]
pub struct Exit(pub u8, pub String);

impl From<String> for Exit {
    fn from(message: String) -> Exit {
        Exit(1, message)
    }
}

/// rabbitmqctl set_policy's arguments, shared by set_operator_policy.
#[derive(Args, Debug)]
struct PolicyArgs {
    #[arg(short = 'p', long = "vhost", default_value = "/")]
    vhost: String,
    /// Of the policies matching a name, the one with the highest priority applies.
    #[arg(long, default_value_t = 0)]
    priority: i64,
    /// queues, exchanges, all, classic_queues or quorum_queues.
    #[arg(long = "apply-to", default_value = "all")]
    apply_to: String,
    name: String,
    pattern: String,
    definition: String,
}

struct Endpoint {
    host_port: String,
    auth: String,
    /// Set for https://: how to check the server's certificate.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// The login `warren ctl` uses when its URI names none: the default user the node was
/// started with, read from the same environment variables, so that `warren ctl` inside a
/// container (or a Kubernetes hook) works as rabbitmqctl does there.
fn default_credentials() -> String {
    match (
        std::env::var("WARREN_DEFAULT_USER"),
        std::env::var("WARREN_DEFAULT_PASS"),
    ) {
        (Ok(user), Ok(pass)) if !user.is_empty() => format!("{user}:{pass}"),
        _ => "guest:guest".to_string(),
    }
}

fn parse_uri(uri: &str, cacert: Option<&std::path::Path>) -> Result<Endpoint, String> {
    let (rest, tls) = if let Some(rest) = uri.strip_prefix("https://") {
        let cacert = cacert.ok_or(
            "an https:// --uri needs --cacert (the CA that signed the management certificate)",
        )?;
        (rest, Some(client_tls(cacert)?))
    } else if let Some(rest) = uri.strip_prefix("http://") {
        (rest, None)
    } else {
        return Err(format!(
            "--uri must start with http:// or https://, got '{uri}'"
        ));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (creds, host_port) = match authority.rsplit_once('@') {
        Some((c, h)) => (c.to_string(), h.to_string()),
        None => (default_credentials(), authority.to_string()),
    };
    if host_port.is_empty() {
        return Err(format!("--uri has no host: '{uri}'"));
    }
    Ok(Endpoint {
        host_port,
        auth: base64::engine::general_purpose::STANDARD.encode(creds),
        tls,
    })
}

fn client_tls(cacert: &std::path::Path) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(cacert)
        .map_err(|e| format!("cannot read {}: {e}", cacert.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("cannot read {}: {e}", cacert.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("a certificate in {} is not usable: {e}", cacert.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("no PEM certificate in {}", cacert.display()));
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// One HTTP/1.1 request; returns the status code and body. Enough for a local admin API.
fn request(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    request_with_headers(ep, method, path, body, &[])
}

/// [`request`] with more header lines (`X-Reason` of a connection's close).
fn request_with_headers(
    ep: &Endpoint,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let addr = ep.host_port.clone();
    let tcp = TcpStream::connect(&addr).map_err(|e| format!("cannot reach {addr}: {e}"))?;
    tcp.set_read_timeout(Some(HTTP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut stream: Box<dyn ReadWrite> = match &ep.tls {
        None => Box::new(tcp),
        Some(config) => {
            let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| format!("'{host}' is not a server name: {e}"))?;
            let conn = rustls::ClientConnection::new(config.clone(), name)
                .map_err(|e| format!("TLS to {addr}: {e}"))?;
            Box::new(rustls::StreamOwned::new(conn, tcp))
        }
    };
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {}\r\n", value.replace(['\r', '\n'], " ")))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{payload}",
        ep.auth,
        payload.len()
    );
    stream
        .write_all(req.as_bytes())
        .map_err(|e| format!("request to {addr} failed: {e}"))?;
    let mut raw = Vec::new();
    let read = (&mut stream).take(RESPONSE_BYTES_MAX).read_to_end(&mut raw);
    // Servers often close without TLS close_notify after Connection: close; the body is whole.
    if let Err(e) = read {
        if e.kind() != std::io::ErrorKind::UnexpectedEof || raw.is_empty() {
            return Err(format!("reading from {addr} failed: {e}"));
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("malformed HTTP response")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The alarms one /api/nodes entry reports, one line each.
fn node_alarms(node: &Value) -> Vec<String> {
    let name = node["name"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    if node["mem_alarm"] == true {
        out.push(format!("Memory alarm on node {name}"));
    }
    if node["disk_free_alarm"] == true {
        out.push(format!("Free disk space alarm on node {name}"));
    }
    if node["storage_failed"] == true {
        out.push(format!(
            "Storage failure alarm on node {name}: {} (writes stopped until the node is restarted)",
            node["storage_failure"].as_str().unwrap_or_default()
        ));
    }
    out
}

/// The metadata group's progress and each link's counters, peers by name: for `status` and
/// `cluster_status`.
fn print_metadata_and_links(status: &Value) {
    let meta = &status["metadata"];
    if meta.is_null() {
        return;
    }
    let members = status["members"].as_array().cloned().unwrap_or_default();
    let name_of = |id: &Value| {
        members
            .iter()
            .find(|m| m["id"] == *id)
            .and_then(|m| m["name"].as_str().map(String::from))
            .unwrap_or_else(|| format!("node-{id}"))
    };
    println!(
        "\nMetadata store: {} (leader {}), term {}, commit {}, applied {}",
        meta["role"].as_str().unwrap_or("?"),
        if meta["leader"] == 0 {
            "none".to_string()
        } else {
            name_of(&meta["leader"])
        },
        meta["term"],
        meta["commit"],
        meta["applied"]
    );
    println!("\nLinks (peer, up, rtt ms, bytes out, batches out, bytes in, frames in, dropped)");
    for l in status["links"].as_array().into_iter().flatten() {
        println!(
            "{}\t{}\t{:.3}\t{}\t{}\t{}\t{}\t{}",
            name_of(&l["peer"]),
            l["up"],
            l["rtt_us"].as_f64().unwrap_or(0.0) / 1000.0,
            l["bytes_out"],
            l["batches_out"],
            l["bytes_in"],
            l["frames_in"],
            l["dropped"]
        );
    }
}

fn expect_ok(r: (u16, String)) -> Result<String, String> {
    match r.0 {
        200..=299 => Ok(r.1),
        401 => Err("not authorised: the credentials (the --uri's, else WARREN_DEFAULT_USER and WARREN_DEFAULT_PASS, else guest:guest) must be an administrator's".into()),
        code => {
            let reason = serde_json::from_str::<Value>(&r.1)
                .ok()
                .and_then(|v| v["reason"].as_str().map(String::from))
                .unwrap_or(r.1);
            Err(format!("HTTP {code}: {reason}"))
        }
    }
}

pub fn run(args: CtlArgs) -> Result<(), Exit> {
    let ep = parse_uri(&args.uri, args.cacert.as_deref())?;
    match args.command {
        CtlCommand::Upgrade(command) => upgrade::run(&ep, command),
        CtlCommand::ForceBoot { data_dir, meta_dir } => {
            let meta = meta_dir
                .or_else(|| data_dir.map(|d| d.join("meta")))
                .expect("clap requires one of them");
            warren_cluster::force_boot::request(&meta.join("cluster"))?;
            println!(
                "Forcing boot for node in {}: at its next start it makes itself the cluster's \
                 only voter. The other members must not come back with their data: reset them \
                 before they join again.",
                meta.display()
            );
            Ok(())
        }
        command => run_command(ep, command).map_err(Exit::from),
    }
}

fn run_command(ep: Endpoint, command: CtlCommand) -> Result<(), String> {
    let seg = encode_segment;
    match command {
        CtlCommand::Access(command) => access::run(&ep, command)?,
        CtlCommand::Queues(command) => queues::run(&ep, command)?,
        CtlCommand::Streams(command) => streams::run(&ep, command)?,
        CtlCommand::Listings(command) => listings::run(&ep, command)?,
        CtlCommand::Health(command) => health::run(&ep, command)?,
        CtlCommand::Upgrade(_) | CtlCommand::ForceBoot { .. } => {
            unreachable!("run() handles it")
        }
        CtlCommand::AddUser { user, password } => {
            let (code, body) = request(&ep, "GET", "/api/users", None)?;
            let existing: Value =
                serde_json::from_str(&expect_ok((code, body))?).unwrap_or_default();
            if existing
                .as_array()
                .is_some_and(|a| a.iter().any(|u| u["name"] == user.as_str()))
            {
                return Err(format!("user '{user}' already exists"));
            }
            expect_ok(request(
                &ep,
                "PUT",
                &format!("/api/users/{}", seg(&user)),
                Some(&json!({ "password": password, "tags": "" })),
            )?)?;
            println!("Adding user \"{user}\" ...");
        }
        CtlCommand::DeleteUser { user } => {
            expect_ok(request(
                &ep,
                "DELETE",
                &format!("/api/users/{}", seg(&user)),
                None,
            )?)?;
        }
        CtlCommand::ChangePassword { user, password } => {
            let users: Value =
                serde_json::from_str(&expect_ok(request(&ep, "GET", "/api/users", None)?)?)
                    .unwrap_or_default();
            let tags = users.as_array().and_then(|a| {
                a.iter()
                    .find(|u| u["name"] == user.as_str())
                    .map(|u| u["tags"].clone())
            });
            let Some(tags) = tags else {
                return Err(format!("user '{user}' does not exist"));
            };
            expect_ok(request(
                &ep,
                "PUT",
                &format!("/api/users/{}", seg(&user)),
                Some(&json!({ "password": password, "tags": tags })),
            )?)?;
        }
        CtlCommand::SetUserTags { user, tags } => {
            expect_ok(request(
                &ep,
                "PUT",
                &format!("/api/users/{}", seg(&user)),
                Some(&json!({ "tags": tags.join(",") })),
            )?)?;
        }
        CtlCommand::ListUsers => {
            let users: Value =
                serde_json::from_str(&expect_ok(request(&ep, "GET", "/api/users", None)?)?)
                    .unwrap_or_default();
            println!("user\ttags");
            for u in users.as_array().into_iter().flatten() {
                println!("{}\t{}", u["name"].as_str().unwrap_or_default(), u["tags"]);
            }
        }
        CtlCommand::Reset => {
            let (code, body) = request(&ep, "POST", "/api/warren/reset", None)?;
            expect_ok((code, body))?;
            println!(
                "Resetting node: it left its cluster and stops; its data is deleted. Started \
                 again it is a new node."
            );
        }
        CtlCommand::ClusterStatus => {
            let body = expect_ok(request(&ep, "GET", "/api/warren/cluster", None)?)?;
            let status: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            println!(
                "Cluster status of node {}",
                status["node"].as_str().unwrap_or("?")
            );
            println!("\nMembers (name, running, voter, cluster address)");
            for m in status["members"].as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}",
                    m["name"].as_str().unwrap_or("?"),
                    m["running"],
                    m["voter"],
                    m["cluster"].as_str().unwrap_or("")
                );
            }
            print_metadata_and_links(&status);
        }
        CtlCommand::JoinCluster { node } => {
            println!("Clustering node with {node} ...");
            expect_ok(request(
                &ep,
                "POST",
                "/api/warren/cluster/join",
                Some(&json!({ "node": node })),
            )?)?;
        }
        CtlCommand::ForgetClusterNode { node } => {
            println!("Removing node {node} from the cluster ...");
            expect_ok(request(
                &ep,
                "DELETE",
                &format!("/api/nodes/{}", seg(&node)),
                None,
            )?)?;
        }
        CtlCommand::AddVhost { vhost } => {
            expect_ok(request(
                &ep,
                "PUT",
                &format!("/api/vhosts/{}", seg(&vhost)),
                None,
            )?)?;
        }
        CtlCommand::DeleteVhost { vhost } => {
            expect_ok(request(
                &ep,
                "DELETE",
                &format!("/api/vhosts/{}", seg(&vhost)),
                None,
            )?)?;
        }
        CtlCommand::ListVhosts => {
            let v: Value =
                serde_json::from_str(&expect_ok(request(&ep, "GET", "/api/vhosts", None)?)?)
                    .unwrap_or_default();
            println!("name");
            for x in v.as_array().into_iter().flatten() {
                println!("{}", x["name"].as_str().unwrap_or_default());
            }
        }
        CtlCommand::SetPermissions {
            vhost,
            user,
            configure,
            write,
            read,
        } => {
            expect_ok(request(
                &ep,
                "PUT",
                &format!("/api/permissions/{}/{}", seg(&vhost), seg(&user)),
                Some(&json!({ "configure": configure, "write": write, "read": read })),
            )?)?;
        }
        CtlCommand::ClearPermissions { vhost, user } => {
            expect_ok(request(
                &ep,
                "DELETE",
                &format!("/api/permissions/{}/{}", seg(&vhost), seg(&user)),
                None,
            )?)?;
        }
        CtlCommand::SetVmMemoryHighWatermark { args } => {
            let body = match args.as_slice() {
                [f] => {
                    json!({ "fraction": f.parse::<f64>().map_err(|_| format!("not a fraction: '{f}'"))? })
                }
                [a, b] if a == "absolute" => {
                    json!({ "bytes": b.parse::<u64>().map_err(|_| format!("not a byte count: '{b}'"))? })
                }
                _ => {
                    return Err(
                        "usage: set_vm_memory_high_watermark FRACTION | absolute BYTES".into(),
                    )
                }
            };
            expect_ok(request(
                &ep,
                "PUT",
                "/api/warren/vm-memory-high-watermark",
                Some(&body),
            )?)?;
        }
        CtlCommand::SetDiskFreeLimit { bytes } => {
            expect_ok(request(
                &ep,
                "PUT",
                "/api/warren/disk-free-limit",
                Some(&json!({ "bytes": bytes })),
            )?)?;
        }
        CtlCommand::SetPolicy { policy } => set_policy(&ep, "policies", "policy", policy)?,
        CtlCommand::SetOperatorPolicy { policy } => {
            set_policy(&ep, "operator-policies", "operator policy", policy)?
        }
        CtlCommand::ClearPolicy { vhost, name } => {
            println!("Clearing policy \"{name}\" on vhost \"{vhost}\" ...");
            expect_ok(request(
                &ep,
                "DELETE",
                &format!("/api/policies/{}/{}", seg(&vhost), seg(&name)),
                None,
            )?)?;
        }
        CtlCommand::ClearOperatorPolicy { vhost, name } => {
            println!("Clearing operator policy \"{name}\" on vhost \"{vhost}\" ...");
            expect_ok(request(
                &ep,
                "DELETE",
                &format!("/api/operator-policies/{}/{}", seg(&vhost), seg(&name)),
                None,
            )?)?;
        }
        CtlCommand::ListPolicies { vhost } => list_policies(&ep, "policies", &vhost)?,
        CtlCommand::ListOperatorPolicies { vhost } => {
            list_policies(&ep, "operator-policies", &vhost)?
        }
        CtlCommand::ExportDefinitions { file } => {
            let body = expect_ok(request(&ep, "GET", "/api/definitions", None)?)?;
            let doc: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
            if file == "-" {
                println!("{text}");
            } else {
                std::fs::write(&file, text + "\n")
                    .map_err(|e| format!("cannot write {file}: {e}"))?;
                println!("Exported definitions for localhost to \"{file}\"");
            }
        }
        CtlCommand::ImportDefinitions { file } => {
            let text = if file == "-" {
                let mut t = String::new();
                std::io::stdin()
                    .read_to_string(&mut t)
                    .map_err(|e| format!("cannot read standard input: {e}"))?;
                t
            } else {
                std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?
            };
            let doc: Value = serde_json::from_str(&text)
                .map_err(|e| format!("{file} is not a JSON document: {e}"))?;
            println!("Importing definitions in JSON from a file at \"{file}\" ...");
            expect_ok(request(&ep, "POST", "/api/definitions", Some(&doc))?)?;
            println!("Successfully started definition import. This process is asynchronous and can take some time.");
        }
        CtlCommand::ReloadCertificates => {
            expect_ok(request(
                &ep,
                "POST",
                "/api/warren/reload-certificates",
                None,
            )?)?;
            println!("Reloaded TLS certificates");
        }
        CtlCommand::Status => {
            let v: Value =
                serde_json::from_str(&expect_ok(request(&ep, "GET", "/api/overview", None)?)?)
                    .unwrap_or_default();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            let nodes: Value =
                serde_json::from_str(&expect_ok(request(&ep, "GET", "/api/nodes", None)?)?)
                    .unwrap_or_default();
            println!("\nAlarms\n");
            let alarms: Vec<String> = nodes
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(node_alarms)
                .collect();
            if alarms.is_empty() {
                println!("(none)");
            }
            for a in alarms {
                println!("{a}");
            }
            let me = v["node"].as_str().unwrap_or_default();
            let drained = nodes.as_array().into_iter().flatten().any(|n| {
                n["name"].as_str() == Some(me) && n["being_drained"].as_bool() == Some(true)
            });
            println!("\nMaintenance status\n");
            println!(
                "Status: {}",
                if drained {
                    "being drained (warren ctl revive ends it)"
                } else {
                    "not under maintenance"
                }
            );
            let cluster: Value = serde_json::from_str(&expect_ok(request(
                &ep,
                "GET",
                "/api/warren/cluster",
                None,
            )?)?)
            .unwrap_or_default();
            if !cluster["metadata"].is_null() {
                println!("\nCluster");
                print_metadata_and_links(&cluster);
            }
        }
    }
    Ok(())
}

/// set_policy and set_operator_policy: `path` is the API's collection, `what` the word
/// rabbitmqctl prints.
fn set_policy(ep: &Endpoint, path: &str, what: &str, p: PolicyArgs) -> Result<(), String> {
    let definition: Value = serde_json::from_str(&p.definition)
        .map_err(|e| format!("Could not parse JSON document: {e}"))?;
    println!(
        "Setting {what} \"{}\" for pattern \"{}\" to \"{}\" with priority \"{}\" for vhost \"{}\" ...",
        p.name, p.pattern, p.definition, p.priority, p.vhost
    );
    expect_ok(request(
        ep,
        "PUT",
        &format!(
            "/api/{path}/{}/{}",
            encode_segment(&p.vhost),
            encode_segment(&p.name)
        ),
        Some(&json!({
            "pattern": p.pattern,
            "definition": definition,
            "priority": p.priority,
            "apply-to": p.apply_to,
        })),
    )?)?;
    Ok(())
}

/// list_policies and list_operator_policies, in rabbitmqctl's columns.
fn list_policies(ep: &Endpoint, path: &str, vhost: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(&expect_ok(request(
        ep,
        "GET",
        &format!("/api/{path}/{}", encode_segment(vhost)),
        None,
    )?)?)
    .unwrap_or_default();
    println!("Listing policies for vhost \"{vhost}\" ...");
    println!("vhost\tname\tpattern\tapply-to\tdefinition\tpriority");
    for p in v.as_array().into_iter().flatten() {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            p["vhost"].as_str().unwrap_or_default(),
            p["name"].as_str().unwrap_or_default(),
            p["pattern"].as_str().unwrap_or_default(),
            p["apply-to"].as_str().unwrap_or_default(),
            p["definition"],
            p["priority"]
        );
    }
    Ok(())
}
