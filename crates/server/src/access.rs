//! Where the server enforces limits and topic permissions (their rules are the broker's
//! [`warren_broker::limits`] and [`warren_broker::topic_permissions`]):
//! - connection.open: the vhost's and the user's `max-connections`, counted by the node's
//!   [`crate::registry::Registry`] ([`admit_connection`]);
//! - channel.open: the user's `max-channels`, counted over the vhosts' open channels
//!   ([`admit_channel`]);
//! - basic.publish and the bind methods on a topic exchange: the user's topic permission on
//!   it ([`Connection::check_topic`]), read live so a change applies to open connections.
//!
//! Limits count this node's connections and channels; a vhost's queues are counted by the
//! vhost itself, cluster-wide.

use crate::connection::Connection;
use crate::registry::Admission;
use crate::Shared;
use warren_broker::broker::SharedVHost;
use warren_broker::error::AmqpError;
use warren_broker::limits::{self, MAX_CHANNELS, MAX_CONNECTIONS};
use warren_broker::users::Access;

/// Admits a connection of `user` to `vhost` at connection.open, or RabbitMQ's 530 refusal.
pub(crate) fn admit_connection(
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
    shared
        .connections
        .admit(vhost_name, user, vhost_max, user_max)
}

/// Whether `user` may open one more channel: RabbitMQ closes the connection (530) when not.
/// Costs a walk over the node's channels only for a user who has a `max-channels`.
pub(crate) fn admit_channel(shared: &Shared, user: &str) -> Result<(), AmqpError> {
    let limit = shared
        .broker
        .users
        .read()
        .expect("users lock")
        .limit(user, MAX_CHANNELS);
    let Some(limit) = limit else {
        return Ok(());
    };
    let open: usize = shared
        .broker
        .vhosts()
        .iter()
        .map(|(_, v)| v.lock().expect("vhost lock").channel_count_of(user))
        .sum();
    if limits::reached(Some(limit), open) {
        return Err(limits::user_channels_refused(user, limit));
    }
    Ok(())
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
