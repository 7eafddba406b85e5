//! A stream (`x-queue-type=stream`) over AMQP 0-9-1: its log under the node's data dir,
//! written by one writer per stream, read by one reader per consumer; in a cluster, replicated
//! by a Raft group per stream.
//!
//! The map:
//! - [`writer`]: [`Streams`], the node's open streams, and each one's writer thread: publishes
//!   appended in chunks by the round, one fsync per round before their confirms; in a
//!   cluster, the round proposed to the stream's group instead.
//! - [`replicated`]: a stream in a cluster: the round entries its writers propose and the
//!   member (the group's state machine) that appends each committed one to this node's files.
//! - [`consumer`]: a consumer's reader task: credit from the prefetch, renewed by acks;
//!   deliveries decoded back to 0-9-1 with `x-stream-offset`.
//! - [`StreamQueue`]: the [`QueueBackend`]: consume and cancel here; declare and delete as
//!   any queue of the vhost (the log follows its queue); get and purge refused as RabbitMQ
//!   3.10 refuses them.
//!
//! A publish flows: the vhost routes it to the stream and emits `StreamAppend` ->
//! [`carry_out`] hands it to the stream's writer (its confirm waits on the round's sync) ->
//! the writer's round appends, syncs, commits -> consumers' readers wake and deliver.

pub mod consumer;
pub mod replicated;
pub mod writer;

pub use consumer::Consumers;
pub use writer::Streams;

use super::{local, Delete, QueueBackend};
use crate::amqp::connection::Connection;
use crate::durability::Wait;
use crate::Shared;
use bytes::Bytes;
use std::sync::Arc;
use warren_broker::error::AmqpError;
use warren_broker::queue::ChannelKey;
use warren_broker::relay::RemoteEffect;
use warren_protocol::amqp::{basic, AMQPClass};
use warren_protocol::method::Method;

/// A stream of this node's vhost.
pub(crate) struct StreamQueue;

impl QueueBackend for StreamQueue {
    fn purge(
        &self,
        conn: &mut Connection,
        _number: u16,
        queue: String,
        _nowait: bool,
    ) -> Result<(), AmqpError> {
        Err(AmqpError::not_implemented(format!(
            "queue.purge not supported by stream queues queue '{queue}' in vhost '{}'",
            conn.vhost_name
        )))
    }

    fn delete(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        delete: Delete,
    ) -> Result<(), AmqpError> {
        local::LocalQueue.delete(conn, number, queue, delete)
    }

    fn declare_passive(
        &self,
        conn: &mut Connection,
        number: u16,
        queue: String,
        nowait: bool,
        now: u64,
    ) -> Result<(), AmqpError> {
        // The vhost's queue has neither the messages (they are in the log) nor the
        // consumers (they are in their channels): both asked of their owners.
        let counts = {
            let v = conn.vhost.lock().expect("vhost lock");
            v.stream_of(&queue).map(|(log, _)| {
                let messages = conn
                    .shared
                    .streams
                    .opened(log)
                    .map_or(0, |w| figures(&w.handle.overview()).messages);
                let consumers = v.stream_consumer_count(&queue);
                (clamp_u32(messages), clamp_u32(consumers))
            })
        };
        local::declare_passive_here(conn, number, queue, nowait, now, counts)
    }

    fn consume(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        queue: String,
        c: basic::Consume,
        _now: u64,
    ) -> Result<(), AmqpError> {
        let (consume, config) = {
            let mut v = conn.vhost.lock().expect("vhost lock");
            let consume = v.consume_stream(
                key,
                &queue,
                c.consumer_tag.as_str(),
                c.no_ack,
                &c.arguments,
                unix_ms(),
            )?;
            let config = v.stream_of(&queue).map(|(_, c)| c).unwrap_or_default();
            (consume, config)
        };
        let writer = match conn
            .shared
            .streams
            .get(consume.log, &config, &conn.shared.durability)
        {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "stream not opened for a consumer");
                let mut v = conn.vhost.lock().expect("vhost lock");
                v.cancel_stream_consumer(key, &consume.tag);
                return Err(AmqpError::new(
                    warren_protocol::constants::INTERNAL_ERROR,
                    format!("cannot open stream '{queue}': {e}"),
                ));
            }
        };
        if !c.nowait {
            let ok = Method::Other(AMQPClass::Basic(basic::AMQPMethod::ConsumeOk(
                basic::ConsumeOk {
                    consumer_tag: consume.tag.as_str().into(),
                },
            )));
            conn.outbox.push(|b| ok.encode(number, b));
        }
        consumer::start(
            &conn.shared,
            conn.vhost.clone(),
            key,
            Bytes::from(consume.tag),
            writer,
            consume.start,
            consume.prefetch,
        );
        Ok(())
    }

    fn cancel(
        &self,
        conn: &mut Connection,
        number: u16,
        key: ChannelKey,
        c: basic::Cancel,
        _now: u64,
    ) -> Result<(), AmqpError> {
        // Out of the channel first, under the vhost lock: a delivery the reader hands over
        // after this is refused, so none follows the cancel-ok.
        conn.vhost
            .lock()
            .expect("vhost lock")
            .cancel_stream_consumer(key, c.consumer_tag.as_str());
        conn.shared
            .streams_consumers
            .stop(key, c.consumer_tag.as_str().as_bytes());
        if !c.nowait {
            crate::amqp::channel::ctl(
                conn,
                number,
                AMQPClass::Basic(basic::AMQPMethod::CancelOk(basic::CancelOk {
                    consumer_tag: c.consumer_tag,
                })),
            );
        }
        Ok(())
    }

    fn get(
        &self,
        conn: &mut Connection,
        _number: u16,
        _key: ChannelKey,
        queue: String,
        _no_ack: bool,
        _now: u64,
    ) -> Result<(), AmqpError> {
        Err(AmqpError::not_implemented(format!(
            "basic.get not supported by stream queues queue '{queue}' in vhost '{}'",
            conn.vhost_name
        )))
    }
}

/// Carries out the vhost's stream effects among `effects` and returns the others. Appends
/// give the waits their publishers' confirms need; `failed` when a stream took nothing (its
/// log failed): the publisher gets a nack.
pub fn carry_out(
    shared: &Shared,
    vhost: &str,
    effects: Vec<RemoteEffect>,
    waits: &mut Vec<Wait>,
    failed: &mut bool,
) -> Vec<RemoteEffect> {
    let is_stream = |e: &RemoteEffect| {
        matches!(
            e,
            RemoteEffect::StreamAppend { .. }
                | RemoteEffect::StreamSettle { .. }
                | RemoteEffect::StreamCancel { .. }
        )
    };
    // The other queues' effects (a quorum publish in a cluster: one per publish) pass as
    // they came, with no copy.
    if !effects.iter().any(is_stream) {
        return effects;
    }
    let mut rest = Vec::new();
    for effect in effects {
        match effect {
            RemoteEffect::StreamAppend { logs, message } => {
                for log in logs {
                    match writer_of(shared, vhost, log) {
                        Some(w) => match w.append(&message) {
                            Some(wait) => waits.push(wait),
                            None => *failed = true,
                        },
                        None => *failed = true,
                    }
                }
            }
            RemoteEffect::StreamSettle {
                channel,
                consumer_tag,
                count,
                ..
            } => shared
                .streams_consumers
                .credit(channel, &consumer_tag, count),
            RemoteEffect::StreamCancel {
                channel,
                consumer_tag,
                ..
            } => shared.streams_consumers.stop(channel, &consumer_tag),
            other => rest.push(other),
        }
    }
    rest
}

/// The writer of stream `log`, opened now if this is its first use since the start. The
/// vhost is locked by the caller, so its configuration is not asked of it: a stream opened at
/// declare or at start is always found, and only a failed open leaves one closed.
fn writer_of(shared: &Shared, vhost: &str, log: u64) -> Option<Arc<writer::StreamWriter>> {
    if let Some(w) = shared.streams.opened(log) {
        return Some(w);
    }
    tracing::error!(vhost, log, "publish to a stream whose log is not open");
    None
}

/// Opens the log of a stream declared just now (`DeclareQueue` of a stream journaled).
pub fn opened_at_declare(shared: &Shared, vhost: &warren_broker::vhost::VHost, queue: &str) {
    if let Some((log, config)) = vhost.stream_of(queue) {
        if let Err(e) = shared.streams.get(log, &config, &shared.durability) {
            tracing::error!(error = %e, "stream log not opened at declare");
        }
    }
}

/// Hands the streams a policy change reconfigured (see `VHost::take_reconfigured_streams`)
/// their new retention and segment size, in every vhost: a policy change made outside a
/// [`crate::storage::MetaGuard`] (whose drop does the same) calls this once applied.
pub fn reconfigure_changed(shared: &Shared) {
    for (_, v) in shared.broker.vhosts() {
        let changed = v.lock().expect("vhost lock").take_reconfigured_streams();
        for (log, config) in changed {
            shared.streams.reconfigure(log, &config);
        }
    }
}

/// Opens every stream's log at start, after the topology was recovered: each reopens where
/// it was, its torn tail (a chunk written but not synced before a crash) cut.
pub fn open_all(shared: &Shared) {
    if shared.cluster.is_some() {
        // Each member opens with its stream's group (`replicated::member`).
        return;
    }
    for (name, v) in shared.broker.vhosts() {
        let streams = v.lock().expect("vhost lock").streams();
        for (queue, log, config) in streams {
            if let Err(e) = shared.streams.get(log, &config, &shared.durability) {
                tracing::error!(vhost = %name, queue, error = %e, "stream not recovered");
            }
        }
    }
}

/// What the management API, the metrics and a passive declare show of a stream's log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// Messages held: from the first offset kept to the committed end, as RabbitMQ counts
    /// them (offsets, so every message of every chunk).
    pub messages: u64,
    pub first_offset: u64,
    /// One past the last committed message.
    pub committed_offset: u64,
    pub segments: u64,
    /// Bytes of the segment files.
    pub bytes: u64,
}

pub fn figures(o: &warren_store::stream::Overview) -> Figures {
    let committed = o.commit_end.min(o.next_offset);
    Figures {
        messages: committed.saturating_sub(o.first_offset),
        first_offset: o.first_offset,
        committed_offset: committed,
        segments: o.segments as u64,
        bytes: o.bytes,
    }
}

/// The figures of stream `log` if its log is open on this node.
pub fn figures_of(shared: &Shared, log: u64) -> Option<Figures> {
    shared
        .streams
        .opened(log)
        .map(|w| figures(&w.handle.overview()))
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
