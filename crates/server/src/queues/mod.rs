//! What a channel does with a queue, warren's `rabbit_queue_type`: one interface, one
//! implementation per place a queue can be, chosen in one place ([`Connection::queue_backend`])
//! so that `channel.rs` decodes, checks permissions and makes one call per method.
//!
//! The map:
//! - [`QueueBackend`]: the interface. So far queue.purge, queue.delete and basic.get; consume,
//!   cancel, a passive declare and publish still choose their own way (`channel.rs`,
//!   `remote_queue.rs`, `quorum_channel.rs`) until they move here too.
//! - [`local`]: a queue this node's vhost holds itself: every queue of a single node (its
//!   quorum queues included) and a cluster's classic queues placed here.
//! - [`remote`]: a queue another node of the cluster hosts, reached by asking that node (a
//!   quorum queue of which this node is no member is reached this way, through its home).
//! - [`quorum`]: a quorum queue of a cluster this node is a member of: requests to its Raft
//!   group through this node's member, answered by this node's replica.

mod local;
pub mod quorum;
mod remote;
mod remote_queue;

use crate::amqp::connection::Connection;
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;

/// queue.delete's conditions and whether it is answered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delete {
    pub if_unused: bool,
    pub if_empty: bool,
    pub nowait: bool,
}

/// A channel's methods on one queue, wherever the queue is. Each writes its reply to the
/// client itself or leaves the connection a request to wait on (`Connection::proposal`),
/// whose answer writes it; an error closes the channel.
pub(crate) trait QueueBackend {
    /// queue.purge: purge-ok counts the messages removed.
    fn purge(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        nowait: bool,
    ) -> Result<(), AmqpError>;

    /// queue.delete, with basic.cancel to the deleting channel's own consumers held by the
    /// caller until delete-ok is out (RabbitMQ's order).
    fn delete(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        delete: Delete,
    ) -> Result<(), AmqpError>;

    /// basic.get: get-ok with the message under a delivery tag of channel `key`, or get-empty.
    fn get(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        no_ack: bool,
        now: u64,
    ) -> Result<(), AmqpError>;
}

impl Connection {
    /// The implementation that serves `queue` from this node. A queue that does not exist is
    /// local: the vhost answers 404 for it. A quorum queue's members are never its remote
    /// home, so the two lookups cannot both claim it.
    pub(crate) fn queue_backend(&self, queue: &str) -> Box<dyn QueueBackend> {
        if let Some(group) = self.quorum_group(queue) {
            return Box::new(quorum::QuorumMember { group });
        }
        match self.remote_queue(queue) {
            Ok(None) => Box::new(local::LocalQueue),
            Ok(Some(peer)) => Box::new(remote::RemoteQueue::Reachable(peer)),
            Err(down) => Box::new(remote::RemoteQueue::Down(down)),
        }
    }
}
