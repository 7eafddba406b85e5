//! Where the server enforces limits and topic permissions (their rules are the broker's
//! [`warren_broker::limits`] and [`warren_broker::topic_permissions`]):
//! - connection.open: the vhost's and the user's `max-connections`, counted by the node's
//!   [`crate::amqp::registry::Registry`] ([`admit_connection`]);
//! - channel.open: the user's `max-channels`, counted over the vhosts' open channels
//!   ([`admit_channel`]);
//! - basic.publish and the bind methods on a topic exchange: the user's topic permission on
//!   it ([`Connection::check_topic`]), read live so a change applies to open connections.
//!
//! In a cluster, limits count every node's connections and channels, as RabbitMQ's do: a
//! connection or channel opened under a limit asks each running node for its own counts
//! ([`elsewhere`]); one that does not answer within [`PEER_TIMEOUT`] counts none. Opening
//! with no limit set asks nothing. A vhost's queues are counted by the vhost itself, whose
//! metadata every node holds.

use crate::amqp::connection::Connection;
use crate::amqp::registry::Admission;
use crate::Shared;
use std::time::Duration;
use warren_broker::broker::SharedVHost;
use warren_broker::error::AmqpError;
use warren_broker::limits::{self, MAX_CHANNELS, MAX_CONNECTIONS};
use warren_broker::users::Access;
use warren_cluster::messaging::{ClientCounts, ClientsAsk, Request, Response};

/// How long an admission under a limit waits for another node's counts: a node slow to answer
/// (paused, being cut off) should not hold every connection open of a limited user.
const PEER_TIMEOUT: Duration = Duration::from_secs(1);

/// Admits a connection of `user` to `vhost` at connection.open, or RabbitMQ's 530 refusal.
pub(crate) async fn admit_connection(
    shared: &Shared,
    vhost: &SharedVHost,
    vhost_name: &str,
    user: &str,
) -> Result<Admission, AmqpError> {
    let vhost_max = limits::effective(vhost.lock().expect("vhost lock").limits(), MAX_CONNECTIONS);
    let user_max = shared
        .broker
        .users
        .read()
        .expect("users lock")
        .limit(user, MAX_CONNECTIONS);
    let others = if vhost_max.is_some() || user_max.is_some() {
        elsewhere(shared, vhost_name, user).await
    } else {
        ClientCounts::default()
    };
    shared.connections.admit(
        vhost_name,
        user,
        vhost_max,
        user_max,
        (
            others.vhost_connections as usize,
            others.user_connections as usize,
        ),
    )
}

/// The user's `max-channels`, if they have one: a channel.open then goes through
/// [`admit_channel`].
pub(crate) fn channel_limit(shared: &Shared, user: &str) -> Option<u64> {
    shared
        .broker
        .users
        .read()
        .expect("users lock")
        .limit(user, MAX_CHANNELS)
}

/// Whether `user` may open one more channel under `limit`: RabbitMQ closes the connection
/// (530) when not. Costs a walk over the node's channels, and a question to each other node.
pub(crate) async fn admit_channel(
    shared: &Shared,
    user: &str,
    limit: u64,
) -> Result<(), AmqpError> {
    let others = elsewhere(shared, "", user).await.user_channels as usize;
    if limits::reached(Some(limit), local_channels(shared, user) + others) {
        return Err(limits::user_channels_refused(user, limit));
    }
    Ok(())
}

fn local_channels(shared: &Shared, user: &str) -> usize {
    shared
        .broker
        .vhosts()
        .iter()
        .map(|(_, v)| v.lock().expect("vhost lock").channel_count_of(user))
        .sum()
}

/// This node's own counts, for another node's admission ([`ClientsAsk::Counts`]).
pub(crate) fn local_counts(shared: &Shared, vhost: &str, user: &str) -> ClientCounts {
    let (vhost_connections, user_connections) = shared.connections.counts(vhost, user);
    ClientCounts {
        vhost_connections: vhost_connections as u64,
        user_connections: user_connections as u64,
        user_channels: local_channels(shared, user) as u64,
    }
}

/// The other running nodes' counts, summed; nothing on a single node.
async fn elsewhere(shared: &Shared, vhost: &str, user: &str) -> ClientCounts {
    let mut sum = ClientCounts::default();
    let Some(cluster) = &shared.cluster else {
        return sum;
    };
    let request = Request::Clients {
        ask: ClientsAsk::Counts {
            vhost: vhost.to_string(),
            user: user.to_string(),
        },
    };
    for answer in crate::peers::ask_running_peers(cluster, request, PEER_TIMEOUT).await {
        if let Response::ClientCounts { counts } = answer {
            sum += counts;
        }
    }
    sum
}

impl Connection {
    /// The user's topic permission for `access` with `routing_key` on `exchange`, when that
    /// is a topic exchange they have one for (RabbitMQ's check_topic_authorisation); 403
    /// ACCESS_REFUSED otherwise. One hash lookup when the user has none.
    pub fn check_topic(
        &self,
        access: Access,
        exchange: &str,
        routing_key: impl AsRef<[u8]>,
    ) -> Result<(), AmqpError> {
        let permission = self
            .shared
            .broker
            .users
            .read()
            .expect("users lock")
            .topic_permissions
            .get(&self.user, &self.vhost_name, exchange);
        let Some(permission) = permission else {
            return Ok(());
        };
        if !self
            .vhost
            .lock()
            .expect("vhost lock")
            .is_topic_exchange(exchange)
        {
            return Ok(());
        }
        let routing_key = String::from_utf8_lossy(routing_key.as_ref());
        permission.check(access, &routing_key, &self.user, &self.vhost_name)
    }
}
