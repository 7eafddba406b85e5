//! A subscription's reader: a task that sends the stream's committed chunks to its client as
//! Deliver frames, one per credit, each chunk's bytes exactly as the log holds them (the
//! client skips the records before its offset, as RabbitMQ's clients do). It holds one
//! chunk at a time, whatever the stream's length or the subscription's offset.

use super::registry::ConsumerCounters;
use crate::queues::stream::writer::StreamWriter;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, Notify};
use warren_protocol::stream::constants::RESPONSE_CODE_STREAM_NOT_AVAILABLE;
use warren_protocol::stream::{Command, OffsetSpec};
use warren_store::stream::OffsetSpec as StoreOffsetSpec;

/// What the connection tells its subscription's reader: credit and stop.
pub struct SubscriptionControl {
    credit: AtomicU32,
    stopped: AtomicBool,
    wake: Notify,
}

impl SubscriptionControl {
    pub fn new(credit: u16) -> SubscriptionControl {
        SubscriptionControl {
            credit: AtomicU32::new(u32::from(credit)),
            stopped: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// The client's Credit: more chunks it may be sent. Credit adds up, bounded by the
    /// protocol's 16 bits per command; a total past `u32::MAX` saturates.
    pub fn add_credit(&self, credit: u16) {
        let _ = self
            .credit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_add(u32::from(credit)))
            });
        self.wake.notify_one();
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

fn store_spec(offset: OffsetSpec) -> StoreOffsetSpec {
    match offset {
        OffsetSpec::First => StoreOffsetSpec::First,
        OffsetSpec::Last => StoreOffsetSpec::Last,
        OffsetSpec::Next => StoreOffsetSpec::Next,
        OffsetSpec::Offset(o) => StoreOffsetSpec::Offset(o),
        OffsetSpec::Timestamp(t) => StoreOffsetSpec::Timestamp(t),
    }
}

/// Starts the reader of a subscription. Its offset is resolved now (`next` is the end as it
/// is at the subscription, not at the first chunk sent).
pub fn start(
    writer: Arc<StreamWriter>,
    stream: String,
    subscription_id: u8,
    offset: OffsetSpec,
    control: Arc<SubscriptionControl>,
    counters: Arc<ConsumerCounters>,
    out: mpsc::UnboundedSender<Command>,
) {
    let reader = match writer.handle.reader(store_spec(offset)) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(stream, error = %e, "stream reader not opened: the subscription gets nothing");
            return;
        }
    };
    let committed = writer.committed();
    drop(writer);
    tokio::spawn(async move {
        if let Err(e) = run(
            reader,
            committed,
            subscription_id,
            &control,
            &counters,
            &out,
        )
        .await
        {
            tracing::error!(stream, error = %e, "stream subscription's reader stopped");
            return;
        }
        if !control.stopped() {
            // The writer ended under a live subscription: the stream was deleted (or the node
            // stops). The client learns it as RabbitMQ tells it.
            let _ = out.send(Command::MetadataUpdate {
                code: RESPONSE_CODE_STREAM_NOT_AVAILABLE,
                stream,
            });
        }
    });
}

async fn run(
    mut reader: warren_store::stream::Reader,
    mut committed: tokio::sync::watch::Receiver<u64>,
    subscription_id: u8,
    control: &SubscriptionControl,
    counters: &ConsumerCounters,
    out: &mpsc::UnboundedSender<Command>,
) -> Result<(), String> {
    loop {
        if control.stopped() {
            return Ok(());
        }
        if control.credit.load(Ordering::Acquire) == 0 {
            control.wake.notified().await;
            continue;
        }
        committed.borrow_and_update();
        match reader.next_chunk().map_err(|e| e.to_string())? {
            Some(slice) => {
                let bytes = slice.read().map_err(|e| e.to_string())?;
                control.credit.fetch_sub(1, Ordering::AcqRel);
                counters.credit.fetch_sub(1, Ordering::Relaxed);
                counters.chunks.fetch_add(1, Ordering::Relaxed);
                counters
                    .consumed
                    .fetch_add(u64::from(slice.record.records), Ordering::Relaxed);
                counters
                    .offset
                    .store(slice.record.chunk_id, Ordering::Relaxed);
                let deliver = Command::Deliver {
                    subscription_id,
                    committed_offset: None,
                    chunk: Bytes::from(bytes),
                };
                if out.send(deliver).is_err() {
                    return Ok(()); // the connection is gone
                }
            }
            None => {
                tokio::select! {
                    changed = committed.changed() => {
                        if changed.is_err() {
                            return Ok(());
                        }
                    }
                    _ = control.wake.notified() => {}
                }
            }
        }
    }
}
