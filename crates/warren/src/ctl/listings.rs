//! `warren ctl`'s listings (rabbitmqctl's `list_queues`, `list_exchanges`, `list_bindings`,
//! `list_connections`, `list_channels`, `list_consumers`, `list_permissions`,
//! `list_user_permissions`) and the queue and connection operations beside them
//! (`purge_queue`, `delete_queue`, `close_connection`).
//!
//! A listing takes rabbitmqctl's info items as its trailing arguments (`list_queues name
//! messages consumers`) and prints them tab-separated under a header line (none when there
//! is no row), as rabbitmqctl does; without any it prints rabbitmqctl's default columns. Items are the management API's
//! field names, plus rabbitmqctl's own names where they differ (`queue_name`, `channel_pid`,
//! `source_name`, ...). In a cluster the node answers for every node's clients.

use super::{encode_segment as seg, expect_ok, request, request_with_headers, Endpoint};
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand, Debug)]
#[command(rename_all = "snake_case")]
pub enum ListingsCommand {
    /// Queues of the vhost, with the info items given [default: name messages_ready
    /// messages_unacknowledged consumers].
    ListQueues {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        items: Vec<String>,
    },
    /// Exchanges of the vhost [default items: name type].
    ListExchanges {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        items: Vec<String>,
    },
    /// Bindings of the vhost [default items: source_name source_kind destination_name
    /// destination_kind routing_key arguments].
    ListBindings {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        items: Vec<String>,
    },
    /// Client connections of every node [default items: user peer_host peer_port state].
    ListConnections { items: Vec<String> },
    /// Channels of every node [default items: pid user consumer_count
    /// messages_unacknowledged].
    ListChannels { items: Vec<String> },
    /// Consumers in the vhost [default items: queue_name channel_pid consumer_tag
    /// ack_required prefetch_count active arguments].
    ListConsumers {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        items: Vec<String>,
    },
    /// The stream protocol's connections of the node, as rabbitmq-streams lists them
    /// [default item: conn_name].
    ListStreamConnections { items: Vec<String> },
    /// Stream protocol publishers in the vhost [default items: publisher_id stream reference
    /// messages_published messages_confirmed messages_errored].
    ListStreamPublishers {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        items: Vec<String>,
    },
    /// Stream protocol consumers in the vhost [default items: subscription_id stream
    /// messages_consumed offset offset_lag credits properties].
    ListStreamConsumers {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        items: Vec<String>,
    },
    /// Users' permissions in the vhost: user, configure, write, read.
    ListPermissions {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
    },
    /// One user's permissions in every vhost: vhost, configure, write, read.
    ListUserPermissions { user: String },
    /// Close the connection named CONNECTION (as list_connections name shows it) with
    /// connection.close 320 and EXPLANATION.
    CloseConnection {
        connection: String,
        explanation: String,
    },
    /// Remove every ready message of the queue.
    PurgeQueue {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        queue: String,
    },
    /// Delete the queue; with --if-empty or --if-unused only when it has no messages or no
    /// consumers.
    DeleteQueue {
        #[arg(short = 'p', long = "vhost", default_value = "/")]
        vhost: String,
        queue: String,
        #[arg(short = 'e', long = "if-empty")]
        if_empty: bool,
        #[arg(short = 'u', long = "if-unused")]
        if_unused: bool,
    },
}

pub fn run(ep: &Endpoint, command: ListingsCommand) -> Result<(), String> {
    match command {
        ListingsCommand::ListQueues { vhost, items } => {
            println!("Listing queues for vhost {vhost} ...");
            let rows = get(ep, &format!("/api/queues/{}", seg(&vhost)))?;
            let default = [
                "name",
                "messages_ready",
                "messages_unacknowledged",
                "consumers",
            ];
            print_table(&rows, &items, &default, &[])
        }
        ListingsCommand::ListStreamConnections { items } => {
            let aliases: &[(&str, Alias)] = &[
                ("conn_name", Alias::Field(&["name"])),
                ("connection_state", Alias::Field(&["state"])),
                ("subscriptions", Alias::Field(&["consumers"])),
            ];
            let known = [
                "client_properties",
                "conn_name",
                "connected_at",
                "connection_state",
                "frame_max",
                "heartbeat",
                "host",
                "peer_host",
                "peer_port",
                "port",
                "ssl",
                "subscriptions",
                "user",
                "vhost",
            ];
            known_items(&items, &known)?;
            println!("Listing stream connections ...");
            let rows = get(ep, "/api/stream/connections")?;
            print_table(&rows, &items, &["conn_name"], aliases)
        }
        ListingsCommand::ListStreamPublishers { vhost, items } => {
            let aliases: &[(&str, Alias)] = &[
                (
                    "connection_pid",
                    Alias::Field(&["connection_details", "name"]),
                ),
                ("messages_confirmed", Alias::Field(&["confirmed"])),
                ("messages_errored", Alias::Field(&["errored"])),
                ("messages_published", Alias::Field(&["published"])),
                ("stream", Alias::Field(&["queue", "name"])),
            ];
            let default = [
                "publisher_id",
                "stream",
                "reference",
                "messages_published",
                "messages_confirmed",
                "messages_errored",
            ];
            let mut known = default.to_vec();
            known.push("connection_pid");
            known_items(&items, &known)?;
            println!("Listing stream publishers ...");
            let rows = get(ep, &format!("/api/stream/publishers/{}", seg(&vhost)))?;
            print_table(&rows, &items, &default, aliases)
        }
        ListingsCommand::ListStreamConsumers { vhost, items } => {
            let aliases: &[(&str, Alias)] = &[
                (
                    "connection_pid",
                    Alias::Field(&["connection_details", "name"]),
                ),
                ("messages_consumed", Alias::Field(&["consumed"])),
                ("stream", Alias::Field(&["queue", "name"])),
            ];
            let default = [
                "subscription_id",
                "stream",
                "messages_consumed",
                "offset",
                "offset_lag",
                "credits",
                "properties",
            ];
            let mut known = default.to_vec();
            known.extend(["connection_pid", "active", "activity_status"]);
            known_items(&items, &known)?;
            println!("Listing stream consumers ...");
            let rows = get(ep, &format!("/api/stream/consumers/{}", seg(&vhost)))?;
            print_table(&rows, &items, &default, aliases)
        }
        ListingsCommand::ListExchanges { vhost, items } => {
            println!("Listing exchanges for vhost {vhost} ...");
            let rows = get(ep, &format!("/api/exchanges/{}", seg(&vhost)))?;
            print_table(&rows, &items, &["name", "type"], &[])
        }
        ListingsCommand::ListBindings { vhost, items } => {
            println!("Listing bindings for vhost {vhost}...");
            let rows = get(ep, &format!("/api/bindings/{}", seg(&vhost)))?;
            let default = [
                "source_name",
                "source_kind",
                "destination_name",
                "destination_kind",
                "routing_key",
                "arguments",
            ];
            let aliases: &[(&str, Alias)] = &[
                ("source_name", Alias::Field(&["source"])),
                ("source_kind", Alias::Constant("exchange")),
                ("destination_name", Alias::Field(&["destination"])),
                ("destination_kind", Alias::Field(&["destination_type"])),
            ];
            print_table(&rows, &items, &default, aliases)
        }
        ListingsCommand::ListConnections { items } => {
            println!("Listing connections ...");
            let rows = get(ep, "/api/connections")?;
            let default = ["user", "peer_host", "peer_port", "state"];
            print_table(&rows, &items, &default, &[("pid", Alias::Field(&["name"]))])
        }
        ListingsCommand::ListChannels { items } => {
            println!("Listing channels ...");
            let rows = get(ep, "/api/channels")?;
            let default = ["pid", "user", "consumer_count", "messages_unacknowledged"];
            let aliases: &[(&str, Alias)] = &[
                ("pid", Alias::Field(&["name"])),
                ("connection", Alias::Field(&["connection_details", "name"])),
            ];
            print_table(&rows, &items, &default, aliases)
        }
        ListingsCommand::ListConsumers { vhost, items } => {
            println!("Listing consumers in vhost {vhost} ...");
            let rows = get(ep, &format!("/api/consumers/{}", seg(&vhost)))?;
            let default = [
                "queue_name",
                "channel_pid",
                "consumer_tag",
                "ack_required",
                "prefetch_count",
                "active",
                "arguments",
            ];
            let aliases: &[(&str, Alias)] = &[
                ("queue_name", Alias::Field(&["queue", "name"])),
                ("channel_pid", Alias::Field(&["channel_details", "name"])),
            ];
            print_table(&rows, &items, &default, aliases)
        }
        ListingsCommand::ListPermissions { vhost } => {
            println!("Listing permissions for vhost \"{vhost}\" ...");
            let rows: Vec<Value> = get(ep, "/api/permissions")?
                .into_iter()
                .filter(|p| p["vhost"] == vhost.as_str())
                .collect();
            print_table(&rows, &[], &["user", "configure", "write", "read"], &[])
        }
        ListingsCommand::ListUserPermissions { user } => {
            println!("Listing permissions for user \"{user}\" ...");
            let (code, body) = request(ep, "GET", &format!("/api/users/{}", seg(&user)), None)?;
            if code == 404 {
                return Err(format!("user '{user}' does not exist"));
            }
            expect_ok((code, body))?;
            let rows: Vec<Value> = get(ep, "/api/permissions")?
                .into_iter()
                .filter(|p| p["user"] == user.as_str())
                .collect();
            print_table(&rows, &[], &["vhost", "configure", "write", "read"], &[])
        }
        ListingsCommand::CloseConnection {
            connection,
            explanation,
        } => {
            println!("Closing connection {connection}, reason: {explanation}...");
            let path = format!("/api/connections/{}", seg(&connection));
            let (code, body) =
                request_with_headers(ep, "DELETE", &path, None, &[("X-Reason", &explanation)])?;
            if code == 404 {
                return Err(format!("no connection '{connection}'"));
            }
            expect_ok((code, body))?;
            Ok(())
        }
        ListingsCommand::PurgeQueue { vhost, queue } => {
            println!("Purging queue '{queue}' in vhost '{vhost}' ...");
            let path = format!("/api/queues/{}/{}/contents", seg(&vhost), seg(&queue));
            expect_ok(request(ep, "DELETE", &path, None)?)?;
            Ok(())
        }
        ListingsCommand::DeleteQueue {
            vhost,
            queue,
            if_empty,
            if_unused,
        } => {
            println!("Deleting queue '{queue}' on vhost '{vhost}' ...");
            let mut path = format!("/api/queues/{}/{}", seg(&vhost), seg(&queue));
            let conditions: Vec<&str> =
                [(if_empty, "if-empty=true"), (if_unused, "if-unused=true")]
                    .iter()
                    .filter(|(set, _)| *set)
                    .map(|(_, q)| *q)
                    .collect();
            if !conditions.is_empty() {
                path = format!("{path}?{}", conditions.join("&"));
            }
            expect_ok(request(ep, "DELETE", &path, None)?)?;
            Ok(())
        }
    }
}

fn get(ep: &Endpoint, path: &str) -> Result<Vec<Value>, String> {
    let body = expect_ok(request(ep, "GET", path, None)?)?;
    let v: Value =
        serde_json::from_str(&body).map_err(|e| format!("unreadable answer from {path}: {e}"))?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

/// Refuses items outside `known` before anything is asked, as rabbitmq-streams validates its
/// info keys (a listing with no rows could not tell an unknown item otherwise).
fn known_items(items: &[String], known: &[&str]) -> Result<(), String> {
    let unknown: Vec<&str> = items
        .iter()
        .map(String::as_str)
        .filter(|i| !known.contains(i))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut known = known.to_vec();
    known.sort_unstable();
    Err(format!(
        "Info key(s) {} are not known; known: {}",
        unknown.join(","),
        known.join(", ")
    ))
}

/// An info item rabbitmqctl names differently from the management API.
enum Alias {
    /// A field, or a path into nested objects.
    Field(&'static [&'static str]),
    /// The same for every row (bindings' source kind: always an exchange).
    Constant(&'static str),
}

/// Prints `items` (or `default`) of each row, tab-separated, under a header line. An item that
/// is neither an alias nor a field of the rows is refused, as rabbitmqctl refuses an unknown
/// info key, rather than printed as an empty column.
fn print_table(
    rows: &[Value],
    items: &[String],
    default: &[&str],
    aliases: &[(&str, Alias)],
) -> Result<(), String> {
    let items: Vec<&str> = if items.is_empty() {
        default.to_vec()
    } else {
        items.iter().map(String::as_str).collect()
    };
    let alias = |item: &str| aliases.iter().find(|(name, _)| *name == item).map(|a| &a.1);
    if let Some(first) = rows.first() {
        let unknown: Vec<&str> = items
            .iter()
            .copied()
            .filter(|item| alias(item).is_none() && first.get(item).is_none())
            .collect();
        if !unknown.is_empty() {
            let mut known: Vec<&str> = first
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            known.extend(aliases.iter().map(|(name, _)| *name));
            known.sort_unstable();
            return Err(format!(
                "Info key(s) {} are not known; known: {}",
                unknown.join(","),
                known.join(", ")
            ));
        }
    }
    // As rabbitmqctl: no header over no rows.
    if !rows.is_empty() {
        println!("{}", items.join("\t"));
    }
    for row in rows {
        let cells: Vec<String> = items
            .iter()
            .map(|item| match alias(item) {
                Some(Alias::Constant(c)) => c.to_string(),
                Some(Alias::Field(path)) => cell(path.iter().fold(row, |v, key| &v[*key])),
                None => cell(&row[*item]),
            })
            .collect();
        println!("{}", cells.join("\t"));
    }
    Ok(())
}

/// A string as it is; anything else as JSON (numbers, booleans, argument tables).
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
