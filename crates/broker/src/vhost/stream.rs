//! A vhost's side of streams (`x-queue-type=stream`). A stream is a queue of the vhost for
//! declaring, binding, routing and deleting; its messages live in its log, which the server's
//! stream writer and readers own. So the vhost only hands routed messages on
//! ([`RemoteEffect::StreamAppend`]), registers consumers in their channels, gives each
//! delivery a tag of its channel, and turns acks of those tags into credit for the consumer
//! ([`RemoteEffect::StreamSettle`]).

use super::*;
use crate::stream_args::{StartOffset, StreamConfig};

/// A stream consumer registered in its channel, for the server to start its reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConsume {
    pub tag: String,
    /// The stream's storage log id.
    pub log: u64,
    /// Deliveries the consumer may have unacknowledged: its credit.
    pub prefetch: u32,
    pub start: StartOffset,
}

/// Marks a stream delivery in its channel's ledger (any tag other than 0 is settled through
/// [`VHost::settle_remote`]); a stream has no message ids to settle.
const STREAM_HOME_TAG: u64 = 1;

impl VHost {
    /// The storage log id and configuration of `queue`, when it is a stream.
    pub fn stream_of(&self, queue: &str) -> Option<(u64, StreamConfig)> {
        let q = self.queues.get(self.queues_by_name.get(queue)?)?;
        stream_config(q)
    }

    /// Every stream of the vhost, for their logs to be opened at start.
    pub fn streams(&self) -> Vec<(String, u64, StreamConfig)> {
        self.queues
            .values()
            .filter_map(|q| stream_config(q).map(|(log, c)| (q.name.clone(), log, c)))
            .collect()
    }

    /// Consumers of each stream: they are known to their channels only (a stream has no
    /// dispatch of its own), so they are counted there, one pass over the vhost's consumers.
    pub(super) fn stream_consumer_counts(&self) -> HashMap<QueueId, u64> {
        let mut counts = HashMap::new();
        for ch in self.channels.values() {
            for qid in ch.consumers.values() {
                if self
                    .queues
                    .get(qid)
                    .is_some_and(|q| q.config.queue_type == QueueType::Stream)
                {
                    *counts.entry(*qid).or_insert(0) += 1;
                }
            }
        }
        counts
    }

    /// The consumers of stream `queue` (0 when there is none of that name), for a passive
    /// declare's answer.
    pub fn stream_consumer_count(&self, queue: &str) -> u64 {
        let Some(qid) = self.queues_by_name.get(queue) else {
            return 0;
        };
        self.channels
            .values()
            .flat_map(|ch| ch.consumers.values())
            .filter(|q| *q == qid)
            .count() as u64
    }

    /// The stream log a channel's consumer reads, when it is a stream consumer.
    pub fn stream_consumer_log(&self, key: ChannelKey, tag: &str) -> Option<u64> {
        let qid = self.channels.get(&key)?.consumers.get(tag.as_bytes())?;
        stream_config(self.queues.get(qid)?).map(|(log, _)| log)
    }

    /// Registers a consumer of a stream in its channel after the checks
    /// rabbit_stream_queue:consume makes, in its order: a prefetch, acknowledgements, a
    /// valid `x-stream-offset` (resolved against `now_unix_ms` when it is an interval).
    pub fn consume_stream(
        &mut self,
        key: ChannelKey,
        queue: &str,
        tag: &str,
        no_ack: bool,
        arguments: &FieldTable,
        now_unix_ms: i64,
    ) -> Result<StreamConsume> {
        let ch = self.channels.get(&key).expect("consume on an open channel");
        let (conn, prefetch) = (ch.conn, ch.consumer_prefetch);
        let vhost = self.name.clone();
        let q = self.usable_queue(queue, conn)?;
        let Some((log, _)) = stream_config(q) else {
            return Err(AmqpError::not_found(format!("no stream '{queue}'")));
        };
        let qid = q.id;
        if prefetch == 0 {
            return Err(AmqpError::precondition(format!(
                "consumer prefetch count is not set for 'queue '{queue}' in vhost '{vhost}''"
            )));
        }
        if no_ack {
            return Err(AmqpError::not_implemented(format!(
                "automatic acknowledgement not supported by stream queues queue '{queue}' in \
                 vhost '{vhost}'"
            )));
        }
        // A channel-wide prefetch (basic.qos global=true) cannot be a stream consumer's
        // credit: RabbitMQ 3.10 closes the connection, after the two checks above.
        if self.channels[&key].channel_prefetch > 0 {
            return Err(AmqpError::not_implemented(format!(
                "queue '{queue}' in vhost '{vhost}' does not support global qos"
            )));
        }
        let start = StartOffset::from_argument(
            arguments.inner().get("x-stream-offset"),
            queue,
            &vhost,
            now_unix_ms,
        )?;
        let ch = self.channels.get_mut(&key).expect("checked above");
        let tag = super::delivery::new_consumer_tag(ch, tag)?;
        ch.consumers.insert(Bytes::from(tag.clone()), qid);
        Ok(StreamConsume {
            tag,
            log,
            prefetch,
            start,
        })
    }

    /// basic.cancel of a stream consumer: it leaves its channel, so a delivery its reader has
    /// not handed over yet is refused ([`VHost::accept_stream_delivery`]).
    pub fn cancel_stream_consumer(&mut self, key: ChannelKey, tag: &str) -> bool {
        self.channels
            .get_mut(&key)
            .is_some_and(|ch| ch.consumers.remove(tag.as_bytes()).is_some())
    }

    /// Writes a stream's delivery to its consumer with the next tag of the channel, recorded
    /// so that its ack gives the consumer credit back. `false` when the consumer is gone (its
    /// channel closed or it was cancelled): its reader stops.
    pub fn accept_stream_delivery(
        &mut self,
        key: ChannelKey,
        consumer_tag: &[u8],
        message: MessageRef,
        properties: Bytes,
    ) -> bool {
        let Some(ch) = self.channels.get_mut(&key) else {
            return false;
        };
        let Some(&qid) = ch.consumers.get(consumer_tag) else {
            return false;
        };
        let tag = ch.next_delivery_tag();
        let number = ch.number;
        let frame_max = ch.outbox.frame_max();
        let m = &message;
        ch.outbox.push(|buf| {
            encode_deliver(
                buf,
                number,
                consumer_tag,
                tag,
                false,
                &m.exchange,
                &m.routing_key,
            );
            encode_header(buf, number, 60, m.body.len() as u64, &properties);
            encode_body(buf, number, &m.body, frame_max);
        });
        ch.record(Unacked {
            tag,
            queue: qid,
            consumer_tag: Some(Bytes::copy_from_slice(consumer_tag)),
            message: QueuedMessage {
                msg: message,
                redelivered: false,
                delivery_count: 0,
                expires_at_ms: None,
                seq: 0,
                store_index: None,
            },
            settled: false,
            home_tag: STREAM_HOME_TAG,
        });
        if let Some(q) = self.queues.get_mut(&qid) {
            q.stats.deliver_get += 1;
        }
        true
    }

    /// basic.nack and basic.reject of a stream's delivery: RabbitMQ 3.10 closes the connection
    /// (540), since a stream cannot take a message back. `None` when `tag` (and, with
    /// `multiple`, the tags below it) holds no stream delivery.
    pub(super) fn refuse_stream_settle(
        &self,
        key: ChannelKey,
        tag: u64,
        multiple: bool,
    ) -> Option<AmqpError> {
        let ch = self.channels.get(&key)?;
        let u = ch.unacked.iter().find(|u| {
            !u.settled
                && u.home_tag == STREAM_HOME_TAG
                && (u.tag == tag || (multiple && (tag == 0 || u.tag < tag)))
        })?;
        let q = self.queues.get(&u.queue)?;
        (q.config.queue_type == QueueType::Stream).then(|| {
            AmqpError::not_implemented(format!(
                "basic.nack and basic.reject not supported by stream queues queue '{}' in \
                 vhost '{}'",
                q.name, self.name
            ))
        })
    }

    /// Acked deliveries of a stream, as credit for their consumer: one effect per consumer.
    pub(super) fn settle_stream(&mut self, key: ChannelKey, log: u64, u: &Unacked) {
        let consumer_tag = u.consumer_tag.clone().unwrap_or_default();
        match self.remote.last_mut() {
            Some(RemoteEffect::StreamSettle {
                log: l,
                channel,
                consumer_tag: t,
                count,
            }) if *l == log && *channel == key && *t == consumer_tag => *count += 1,
            _ => self.remote.push(RemoteEffect::StreamSettle {
                log,
                channel: key,
                consumer_tag,
                count: 1,
            }),
        }
    }
}

/// A queue's stream log id and configuration, when it is a stream.
pub(super) fn stream_config(q: &Queue) -> Option<(u64, StreamConfig)> {
    if q.config.queue_type != QueueType::Stream {
        return None;
    }
    Some((q.log_id?, q.config.stream.clone().unwrap_or_default()))
}
