//! `warren ctl`'s limits and topic permissions, with rabbitmqctl's names, arguments and
//! semantics: `set_vhost_limits` replaces the vhost's whole set, `set_user_limits` merges into
//! the user's, negative values mean no limit. Spoken to RabbitMQ's own management routes
//! (`/api/vhost-limits`, `/api/user-limits`, `/api/topic-permissions`), so these commands work
//! against a RabbitMQ node's management API too.

use super::{encode_segment as seg, expect_ok, request, Endpoint};
use clap::Subcommand;
use serde_json::{json, Value};
use warren_broker::limits::{self, Scope};

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum AccessCommand {
    /// Replace the vhost's limits with a JSON object: max-connections, max-queues (negative:
    /// no limit).
    SetVhostLimits {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        definition: String,
    },
    ClearVhostLimits {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
    },
    /// The vhost's limits as JSON, or every vhost's with --global.
    ListVhostLimits {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        #[arg(long)]
        global: bool,
    },
    /// Set some of the user's limits from a JSON object: max-connections, max-channels
    /// (negative: no limit); the others stay.
    SetUserLimits {
        user: String,
        definition: String,
    },
    /// Clear one of the user's limits, or `all`.
    ClearUserLimits {
        user: String,
        limit: String,
    },
    /// One user's limits as JSON (--user), or every user's.
    ListUserLimits {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        global: bool,
    },
    /// Restrict USER's routing keys on the topic exchange EXCHANGE in the vhost: WRITE for
    /// publishing, READ for binding ({username} and {vhost} are expanded).
    SetTopicPermissions {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        user: String,
        exchange: String,
        write: String,
        read: String,
    },
    /// Clear USER's topic permissions in the vhost, or only the one on EXCHANGE.
    ClearTopicPermissions {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        user: String,
        exchange: Option<String>,
    },
    ListTopicPermissions {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
    },
    ListUserTopicPermissions {
        user: String,
    },
}

fn get_json(ep: &Endpoint, path: &str) -> Result<Value, String> {
    let body = expect_ok(request(ep, "GET", path, None)?)?;
    serde_json::from_str(&body).map_err(|e| format!("unreadable answer from {path}: {e}"))
}

/// The `value` of the first entry of a limits list (`[{"vhost"|"user", "value"}]`).
fn limits_of(list: &Value) -> serde_json::Map<String, Value> {
    list.get(0)
        .and_then(|e| e["value"].as_object().cloned())
        .unwrap_or_default()
}

pub fn run(ep: &Endpoint, command: AccessCommand) -> Result<(), String> {
    match command {
        AccessCommand::SetVhostLimits { vhost, definition } => {
            let wanted = limits::parse(Scope::Vhost, &definition)?;
            println!("Setting vhost limits to \"{definition}\" for vhost \"{vhost}\" ...");
            let base = format!("/api/vhost-limits/{}", seg(&vhost));
            for name in limits_of(&get_json(ep, &base)?).keys() {
                if !wanted.contains_key(name) {
                    expect_ok(request(
                        ep,
                        "DELETE",
                        &format!("{base}/{}", seg(name)),
                        None,
                    )?)?;
                }
            }
            for (name, value) in &wanted {
                let body = json!({ "value": value });
                let path = format!("{base}/{}", seg(name));
                expect_ok(request(ep, "PUT", &path, Some(&body))?)?;
            }
        }
        AccessCommand::ClearVhostLimits { vhost } => {
            println!("Clearing vhost \"{vhost}\" limits ...");
            let base = format!("/api/vhost-limits/{}", seg(&vhost));
            for name in limits_of(&get_json(ep, &base)?).keys() {
                expect_ok(request(
                    ep,
                    "DELETE",
                    &format!("{base}/{}", seg(name)),
                    None,
                )?)?;
            }
        }
        AccessCommand::ListVhostLimits { vhost, global } => {
            if global {
                println!("vhost\tlimits");
                for e in get_json(ep, "/api/vhost-limits")?
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    println!(
                        "{}\t{}",
                        e["vhost"].as_str().unwrap_or_default(),
                        e["value"]
                    );
                }
            } else {
                let path = format!("/api/vhost-limits/{}", seg(&vhost));
                println!("{}", Value::Object(limits_of(&get_json(ep, &path)?)));
            }
        }
        AccessCommand::SetUserLimits { user, definition } => {
            let wanted = limits::parse(Scope::User, &definition)?;
            println!("Setting user limits to \"{definition}\" for user \"{user}\" ...");
            for (name, value) in &wanted {
                let body = json!({ "value": value });
                let path = format!("/api/user-limits/{}/{}", seg(&user), seg(name));
                expect_ok(request(ep, "PUT", &path, Some(&body))?)?;
            }
        }
        AccessCommand::ClearUserLimits { user, limit } => {
            let names: Vec<String> = if limit == "all" {
                println!("Clearing all limits for user \"{user}\" ...");
                let path = format!("/api/user-limits/{}", seg(&user));
                limits_of(&get_json(ep, &path)?).keys().cloned().collect()
            } else {
                println!("Clearing \"{limit}\" limit for user \"{user}\" ...");
                vec![limit]
            };
            for name in names {
                let path = format!("/api/user-limits/{}/{}", seg(&user), seg(&name));
                expect_ok(request(ep, "DELETE", &path, None)?)?;
            }
        }
        AccessCommand::ListUserLimits { user, global } => match user.filter(|_| !global) {
            Some(user) => {
                let path = format!("/api/user-limits/{}", seg(&user));
                println!("{}", Value::Object(limits_of(&get_json(ep, &path)?)));
            }
            None => {
                println!("user\tlimits");
                for e in get_json(ep, "/api/user-limits")?
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    println!("{}\t{}", e["user"].as_str().unwrap_or_default(), e["value"]);
                }
            }
        },
        AccessCommand::SetTopicPermissions {
            vhost,
            user,
            exchange,
            write,
            read,
        } => {
            println!(
                "Setting topic permissions on \"{exchange}\" for user \"{user}\" in vhost \"{vhost}\" ..."
            );
            let path = format!("/api/topic-permissions/{}/{}", seg(&vhost), seg(&user));
            let body = json!({ "exchange": exchange, "write": write, "read": read });
            expect_ok(request(ep, "PUT", &path, Some(&body))?)?;
        }
        AccessCommand::ClearTopicPermissions {
            vhost,
            user,
            exchange,
        } => {
            println!("Clearing topic permissions for user \"{user}\" in vhost \"{vhost}\" ...");
            let mut path = format!("/api/topic-permissions/{}/{}", seg(&vhost), seg(&user));
            if let Some(x) = &exchange {
                path.push_str(&format!("?exchange={}", seg(x)));
            }
            let (code, body) = request(ep, "DELETE", &path, None)?;
            // rabbitmqctl succeeds when there was nothing to clear.
            if code != 404 {
                expect_ok((code, body))?;
            }
        }
        AccessCommand::ListTopicPermissions { vhost } => {
            let path = format!("/api/vhosts/{}/topic-permissions", seg(&vhost));
            println!("user\texchange\twrite\tread");
            for p in get_json(ep, &path)?.as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}",
                    p["user"].as_str().unwrap_or_default(),
                    p["exchange"].as_str().unwrap_or_default(),
                    p["write"].as_str().unwrap_or_default(),
                    p["read"].as_str().unwrap_or_default()
                );
            }
        }
        AccessCommand::ListUserTopicPermissions { user } => {
            let path = format!("/api/users/{}/topic-permissions", seg(&user));
            println!("vhost\texchange\twrite\tread");
            for p in get_json(ep, &path)?.as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}",
                    p["vhost"].as_str().unwrap_or_default(),
                    p["exchange"].as_str().unwrap_or_default(),
                    p["write"].as_str().unwrap_or_default(),
                    p["read"].as_str().unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}
