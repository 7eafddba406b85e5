//! What a channel does with a queue, warren's `rabbit_queue_type`: one interface, one
//! implementation per place a queue can be, chosen in one place ([`Connection::queue_backend`])
//! so that `amqp::channel` decodes, checks permissions and makes one call per method.
//!
//! The map:
//! - [`QueueBackend`]: the interface: a passive queue.declare, queue.purge, queue.delete,
//!   basic.consume, basic.cancel and basic.get. Publish and settlement still choose their way
//!   in the broker's vhost, by the effects it records for each kind of queue, until they move
//!   here too.
//! - [`effects`]: the one place the vhost's recorded work is carried out: the storage
//!   engine's appends and releases, and the work for queues elsewhere (forwards, quorum
//!   proposals and settlements, stream appends).
//! - `local`: a queue this node's vhost holds itself: every queue of a single node (its
//!   quorum queues included) and a cluster's classic queues placed here.
//! - `remote`: a queue another node of the cluster hosts, reached by asking that node through
//!   [`crate::peers`] (a quorum queue of which this node is no member is reached this way,
//!   through its home).
//! - [`quorum`]: a quorum queue of a cluster this node is a member of: requests to its Raft
//!   group through this node's member, answered by this node's replica.
//! - [`stream`]: a stream of a single node: its log, written by the stream's writer, read by
//!   a reader per consumer.
//!
//! A method flows: `amqp::channel` -> [`Connection::queue_backend`] (a cancel:
//! [`Connection::consumer_backend`]) -> one implementation, which answers at once (local: under
//! the vhost's lock) or leaves the connection a request to wait on, whose answer writes the
//! reply (remote: the peer's answer; quorum: the applied entry).
//!
//! The choice is made again at each method, not cached on the connection: a queue can be
//! deleted and declared again on another node, or its node go down, between two methods, and
//! the lookup is one vhost lock, which every method takes anyway.

pub mod effects;
mod local;
pub mod quorum;
mod remote;
pub mod stream;

use crate::amqp::connection::Connection;
use crate::peers;
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_cluster::replicas::group_id;
use warren_protocol::amqp::basic;

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

    /// A passive queue.declare: declare-ok with the queue's messages and consumers, or 404 (405
    /// for another connection's exclusive queue). The queue becomes the channel's last one.
    fn declare_passive(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        nowait: bool,
        now: u64,
    ) -> Result<(), AmqpError>;

    /// basic.consume: consume-ok (unless nowait) before the consumer's first delivery. The
    /// consumer is registered in the channel first, so deliveries that follow the consume at
    /// once find it.
    fn consume(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        consume: basic::Consume,
        now: u64,
    ) -> Result<(), AmqpError>;

    /// basic.cancel of a consumer of this queue (chosen by [`Connection::consumer_backend`]):
    /// cancel-ok (unless nowait) once the queue stopped it, so the deliveries it sent before
    /// still reach the client.
    fn cancel(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        cancel: basic::Cancel,
        now: u64,
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
        if self
            .vhost
            .lock()
            .expect("vhost lock")
            .stream_of(queue)
            .is_some()
        {
            return Box::new(stream::StreamQueue);
        }
        match self.remote_queue(queue) {
            Ok(None) => Box::new(local::LocalQueue),
            Ok(Some(peer)) => Box::new(remote::RemoteQueue::Reachable(peer)),
            Err(down) => Box::new(remote::RemoteQueue::Down(down)),
        }
    }

    /// The peer hosting `queue` when that is another node (`None`: this node hosts it, or
    /// there is no such queue, which the local path reports); 404 when its node is down.
    fn remote_queue(&self, queue: &str) -> Result<Option<u64>, AmqpError> {
        if self.shared.cluster.is_none() {
            return Ok(None);
        }
        let home = self.vhost.lock().expect("vhost lock").remote_home(queue);
        match home {
            None => Ok(None),
            Some(node) => {
                peers::reachable_home(&self.shared, &node, queue, &self.vhost_name).map(Some)
            }
        }
    }

    /// The implementation that serves the consumer `tag` of channel `key`: the one of the queue
    /// it consumes from, as the channel registered it. A tag the channel does not know is local:
    /// the vhost ignores its cancel, as RabbitMQ answers cancel-ok for it.
    pub(crate) fn consumer_backend(&self, key: ChannelKey, tag: &str) -> Box<dyn QueueBackend> {
        let (log, home, stream) = {
            let v = self.vhost.lock().expect("vhost lock");
            (
                v.quorum_consumer_log(key, tag),
                v.remote_consumer_home(key, tag),
                v.stream_consumer_log(key, tag),
            )
        };
        if stream.is_some() {
            return Box::new(stream::StreamQueue);
        }
        if let Some(log) = log {
            return Box::new(quorum::QuorumMember {
                group: group_id(log),
            });
        }
        let Some(home) = home else {
            return Box::new(local::LocalQueue);
        };
        // A node still in the cluster is asked even while down: the failed request ends the
        // consumer here all the same.
        match self
            .shared
            .cluster
            .as_ref()
            .and_then(|c| c.member_id(&home))
        {
            Some(peer) => Box::new(remote::RemoteQueue::Reachable(peer)),
            None => Box::new(remote::RemoteQueue::Down(AmqpError::not_found(format!(
                "node {home} is no member of the cluster"
            )))),
        }
    }
}
