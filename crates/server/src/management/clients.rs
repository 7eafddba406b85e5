//! The cluster's AMQP clients for [`super::connections`]: a node knows only its own
//! connections, channels and consumers (they live in its registry and vhost states), so a
//! listing asked of one node asks every other running node for its own over the cluster's
//! messaging ([`Request::Clients`], as `/api/queues` asks queue figures with
//! `Request::QueueStats`) and shows them all, each item naming its `node`, as RabbitMQ's
//! management plugin shows every node's. Closing a connection of another node is asked of that
//! node the same way.
//!
//! A node that does not answer within [`PEER_TIMEOUT`] is left out of the listing (its
//! clients are unreachable anyway, as in RabbitMQ when a node is down); the listing waits for
//! the slowest node, not their sum. Every item of a node travels, the asking node keeps those
//! its caller may see: the filters stay in one place, with the rest of the access rules.

use super::connections::local_items;
use super::{error, not_found, Shared};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::cmp::Ordering;
use std::time::Duration;
use warren_cluster::messaging::{self, ClientListing, ClientsAsk, Request};
use warren_protocol::constants::NOT_FOUND;

/// How long a listing waits for another node's clients: a management page should not hang on
/// a node that is slow to answer (the same bound as for queue figures).
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// At most this many items in one node's answer. An answer is one frame between nodes
/// (bounded at 256 MiB) and an item is 0.5-1.5 KB of JSON, so 50,000 keeps the frame under
/// 80 MiB; a node with more clients lists its first 50,000 (in its order) and logs that the
/// rest were left out.
const PEER_ITEMS_MAX: usize = 50_000;

/// What another node asks of this one: its own clients, or closing one of its connections.
pub(crate) fn answer_clients(
    s: &Shared,
    ask: &ClientsAsk,
) -> Result<messaging::Response, (u16, String)> {
    match ask {
        ClientsAsk::List { listing } => {
            let mut items = local_items(s, *listing);
            if items.len() > PEER_ITEMS_MAX {
                tracing::warn!(
                    "a {listing:?} listing asked by another node holds {} items: sending the \
                     first {PEER_ITEMS_MAX}",
                    items.len()
                );
                items.truncate(PEER_ITEMS_MAX);
            }
            Ok(messaging::Response::Clients { items })
        }
        ClientsAsk::Close { name, reason } => match s.connections.by_name(name) {
            Some(e) => {
                e.close(reason);
                Ok(messaging::Response::Done)
            }
            None => Err((NOT_FOUND, format!("no connection '{name}' on this node"))),
        },
        ClientsAsk::Counts { vhost, user } => Ok(messaging::Response::ClientCounts {
            counts: crate::amqp::access::local_counts(s, vhost, user),
        }),
    }
}

/// Every node's clients of one kind, in RabbitMQ's order: this node's, and each running other
/// node's as it answers.
pub(super) async fn cluster_wide(s: &Shared, listing: ClientListing) -> Vec<Value> {
    let mut items = local_items(s, listing);
    if let Some(cluster) = &s.cluster {
        let request = Request::Clients {
            ask: ClientsAsk::List { listing },
        };
        for answer in crate::peers::ask_running_peers(cluster, request, PEER_TIMEOUT).await {
            if let messaging::Response::Clients { items: theirs } = answer {
                items.extend(theirs);
            }
        }
    }
    items.sort_by(|a, b| order(listing, a, b));
    items
}

/// RabbitMQ's order: by vhost and name; a connection's channels by number, a queue's consumers
/// by channel and tag.
fn order(listing: ClientListing, a: &Value, b: &Value) -> Ordering {
    let text = |v: &Value, path: &[&str]| -> String {
        path.iter()
            .fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let key = |v: &Value| -> (String, String, String, u64) {
        match listing {
            ClientListing::Connections => (text(v, &["vhost"]), text(v, &["name"]), "".into(), 0),
            ClientListing::Channels => (
                text(v, &["vhost"]),
                text(v, &["connection_details", "name"]),
                "".into(),
                v["number"].as_u64().unwrap_or(0),
            ),
            ClientListing::Consumers => (
                text(v, &["queue", "vhost"]),
                text(v, &["queue", "name"]),
                text(v, &["channel_details", "name"]) + " " + &text(v, &["consumer_tag"]),
                0,
            ),
        }
    };
    key(a).cmp(&key(b))
}

/// Closes connection `name` of `node` (another node than this one): what the client gets is
/// the same connection.close 320 as for one of this node's.
pub(super) async fn close_on(s: &Shared, node: &str, name: &str, reason: &str) -> Response {
    let peer = s.cluster.as_ref().and_then(|c| {
        c.member_id(node)
            .filter(|_| c.is_node_running(node) == Some(true))
            .map(|id| (c.messaging().clone(), id))
    });
    let Some((messaging, peer)) = peer else {
        return not_found();
    };
    let request = Request::Clients {
        ask: ClientsAsk::Close {
            name: name.to_string(),
            reason: reason.to_string(),
        },
    };
    match tokio::time::timeout(PEER_TIMEOUT, crate::peers::call(&messaging, peer, request)).await {
        Ok(Ok(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) if e.code == NOT_FOUND => not_found(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.text),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "node '{node}' did not answer in {} s",
                PEER_TIMEOUT.as_secs()
            ),
        ),
    }
}
