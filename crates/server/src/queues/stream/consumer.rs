//! A stream consumer over AMQP 0-9-1: a task with a [`Reader`] of the stream's log, positioned
//! by its `x-stream-offset`, that hands each committed message to its channel as long as it
//! has credit. Credit is the consumer's prefetch; each ack gives one back
//! ([`Consumers::credit`]). A message is read from the log when it is delivered, never before:
//! what a consumer holds in memory is the one chunk it is in, whatever the stream's length or
//! the consumer's offset.

use super::writer::StreamWriter;
use crate::Shared;
use amq_protocol_types::AMQPValue;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use warren_broker::broker::SharedVHost;
use warren_broker::message::Message;
use warren_broker::queue::ChannelKey;
use warren_broker::stream_args::StartOffset;
use warren_protocol::amqp10::amqp091::{to_amqp091, ANNOTATION_EXCHANGE, ANNOTATION_ROUTING_KEY};
use warren_protocol::amqp10::{Message as Amqp10Message, Value};
use warren_store::stream::{Chunk, Entry, OffsetSpec, Reader};

/// Most deliveries written under one lock of the vhost.
const DELIVERIES_PER_LOCK_MAX: usize = 256;
/// The header every delivery carries: the message's offset in the stream.
pub const OFFSET_HEADER: &str = "x-stream-offset";

/// What the connection side tells a consumer's task.
pub struct Control {
    credit: AtomicU32,
    stopped: AtomicBool,
    wake: Notify,
}

impl Control {
    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
    }
}

/// A consumer: its channel and tag.
type ConsumerKey = (ChannelKey, Bytes);

/// The node's stream consumers, by channel and consumer tag, for acks and cancels to find,
/// each with its stream's log id.
#[derive(Default)]
pub struct Consumers {
    by_tag: Mutex<HashMap<ConsumerKey, (u64, Arc<Control>)>>,
}

impl Consumers {
    /// `count` deliveries of the consumer were acknowledged.
    pub fn credit(&self, channel: ChannelKey, tag: &Bytes, count: u32) {
        let map = self.by_tag.lock().expect("stream consumers");
        if let Some((_, c)) = map.get(&(channel, tag.clone())) {
            c.credit.fetch_add(count, Ordering::AcqRel);
            c.wake.notify_one();
        }
    }

    /// The consumer was cancelled or its channel closed.
    pub fn stop(&self, channel: ChannelKey, tag: &[u8]) {
        let c = self
            .by_tag
            .lock()
            .expect("stream consumers")
            .remove(&(channel, Bytes::copy_from_slice(tag)));
        if let Some((_, c)) = c {
            c.stop();
        }
    }

    /// The stream `log` was deleted: all its consumers stop.
    pub fn stop_stream(&self, log: u64) {
        self.by_tag
            .lock()
            .expect("stream consumers")
            .retain(|_, (l, c)| {
                if *l == log {
                    c.stop();
                }
                *l != log
            });
    }
}

/// Starts the reader of a consumer registered in its channel (after its consume-ok is out).
/// A reader that cannot be opened is logged and the consumer stays idle, as one past the end.
pub fn start(
    shared: &Arc<Shared>,
    vhost: SharedVHost,
    channel: ChannelKey,
    tag: Bytes,
    writer: Arc<StreamWriter>,
    start: StartOffset,
    prefetch: u32,
) {
    let spec = match start {
        StartOffset::First => OffsetSpec::First,
        StartOffset::Last => OffsetSpec::Last,
        StartOffset::Next => OffsetSpec::Next,
        StartOffset::Offset(o) => OffsetSpec::Offset(o),
        StartOffset::Timestamp(t) => OffsetSpec::Timestamp(t),
    };
    let reader = match writer.handle.reader(spec) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "stream reader not opened: the consumer gets nothing");
            return;
        }
    };
    let control = Arc::new(Control {
        credit: AtomicU32::new(prefetch),
        stopped: AtomicBool::new(false),
        wake: Notify::new(),
    });
    shared
        .streams_consumers
        .by_tag
        .lock()
        .expect("stream consumers")
        .insert((channel, tag.clone()), (writer.log, control.clone()));
    let committed = writer.committed();
    let shared = shared.clone();
    tokio::spawn(async move {
        let ended = run(reader, committed, &control, &vhost, channel, &tag).await;
        if let Err(e) = ended {
            tracing::error!(error = %e, "stream consumer stopped");
        }
        let mut map = shared
            .streams_consumers
            .by_tag
            .lock()
            .expect("stream consumers");
        if map
            .get(&(channel, tag.clone()))
            .is_some_and(|(_, c)| Arc::ptr_eq(c, &control))
        {
            map.remove(&(channel, tag));
        }
    });
}

/// One message read from the stream, ready to deliver.
struct Ready {
    offset: u64,
    raw: Bytes,
}

async fn run(
    mut reader: Reader,
    mut committed: tokio::sync::watch::Receiver<u64>,
    control: &Control,
    vhost: &SharedVHost,
    channel: ChannelKey,
    tag: &Bytes,
) -> Result<(), String> {
    let mut ready: VecDeque<Ready> = VecDeque::new();
    loop {
        if control.stopped.load(Ordering::Acquire) {
            return Ok(());
        }
        if ready.is_empty() {
            committed.borrow_and_update();
            match reader.next_read().map_err(|e| e.to_string())? {
                Some(read) => {
                    let bytes = Bytes::from(read.bytes);
                    let chunk = Chunk::parse(&bytes).map_err(|e| e.to_string())?;
                    for (offset, entry) in chunk.entries() {
                        if offset + u64::from(entry.records()) <= read.skip_below {
                            continue;
                        }
                        match entry {
                            Entry::Simple(b) => ready.push_back(Ready {
                                offset,
                                raw: bytes.slice_ref(b),
                            }),
                            // Only the stream protocol writes sub-batches; not over 0-9-1 yet.
                            Entry::SubBatch { .. } => {}
                        }
                    }
                }
                None => {
                    tokio::select! {
                        changed = committed.changed() => {
                            if changed.is_err() {
                                return Ok(()); // the writer stopped: the stream is gone
                            }
                        }
                        _ = control.wake.notified() => {}
                    }
                }
            }
            continue;
        }
        let credit = control.credit.load(Ordering::Acquire) as usize;
        if credit == 0 {
            control.wake.notified().await;
            continue;
        }
        let n = credit.min(ready.len()).min(DELIVERIES_PER_LOCK_MAX);
        let batch: Vec<(Arc<Message>, Bytes)> = ready.drain(..n).map(decode).collect();
        let mut v = vhost.lock().expect("vhost lock");
        for (message, properties) in batch {
            if !v.accept_stream_delivery(channel, tag, message, properties) {
                return Ok(());
            }
        }
        drop(v);
        control.credit.fetch_sub(n as u32, Ordering::AcqRel);
    }
}

/// A stream entry as the 0-9-1 delivery RabbitMQ 3.10 makes of it: exchange and routing key
/// as published, properties mapped back, the offset in `x-stream-offset`. An entry that is
/// no AMQP 1.0 message (none written over 0-9-1 is) is delivered as its raw bytes.
fn decode(r: Ready) -> (Arc<Message>, Bytes) {
    let (mut props, body, exchange, routing_key) = match Amqp10Message::decode(r.raw.clone()) {
        Ok(m) => {
            let (props, body) = to_amqp091(&m);
            let exchange = annotation(&m, ANNOTATION_EXCHANGE);
            let routing_key = annotation(&m, ANNOTATION_ROUTING_KEY);
            (props, body, exchange, routing_key)
        }
        Err(_) => (Default::default(), r.raw, Bytes::new(), Bytes::new()),
    };
    let mut headers = props.headers_table().ok().flatten().unwrap_or_default();
    headers.insert(
        OFFSET_HEADER.into(),
        AMQPValue::LongLongInt(i64::try_from(r.offset).unwrap_or(i64::MAX)),
    );
    props.set_headers_table(Some(&headers));
    let encoded = props.encode();
    let message = Message::new(exchange, routing_key, encoded.clone(), &props, body);
    (Arc::new(message), encoded)
}

fn annotation(m: &Amqp10Message, key: &str) -> Bytes {
    m.message_annotations
        .iter()
        .flatten()
        .find_map(|(k, v)| match (k, v) {
            (Value::Symbol(k), Value::String(s) | Value::Symbol(s)) if k == key => {
                Some(Bytes::copy_from_slice(s.as_bytes()))
            }
            _ => None,
        })
        .unwrap_or_default()
}
