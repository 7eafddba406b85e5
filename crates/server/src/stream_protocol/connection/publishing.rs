//! Publishers: declared on a stream under a reference (deduplication), their publishes handed
//! to the stream's writer, their confirms sent once the writer's round is durable.

use super::*;

impl Connection {
    pub(super) fn declare_publisher(
        &mut self,
        publisher_id: u8,
        reference: String,
        stream: String,
    ) -> u16 {
        if self.publishers.contains_key(&publisher_id) {
            return RESPONSE_CODE_PRECONDITION_FAILED;
        }
        if reference.len() > TRACKING_REFERENCE_BYTES_MAX {
            return RESPONSE_CODE_PRECONDITION_FAILED;
        }
        let writer = match self.writer_of(&stream) {
            Ok(w) => w,
            Err(code) => return code,
        };
        if !self.allowed(Access::Write, &stream) {
            return RESPONSE_CODE_ACCESS_REFUSED;
        }
        let reference = (!reference.is_empty()).then_some(reference);
        // RabbitMQ refuses a second publisher of the same reference on a stream.
        if reference.is_some()
            && self
                .publishers
                .values()
                .any(|p| p.stream == stream && p.reference == reference)
        {
            return RESPONSE_CODE_PRECONDITION_FAILED;
        }
        let counters = Arc::new(PublisherCounters::default());
        let info = PublisherInfo {
            publisher_id,
            stream: stream.clone(),
            reference: reference.clone().unwrap_or_default(),
            counters: counters.clone(),
        };
        self.shared.stream_connections.update(self.id, |c| {
            c.publishers.insert(publisher_id, info);
        });
        self.publishers.insert(
            publisher_id,
            Publisher {
                stream,
                reference,
                writer,
                counters,
            },
        );
        RESPONSE_CODE_OK
    }

    pub(super) fn publish(
        &mut self,
        publisher_id: u8,
        messages: Vec<warren_protocol::stream::PublishedMessage>,
    ) {
        let Some(p) = self.publishers.get(&publisher_id) else {
            self.send(Command::PublishError {
                publisher_id,
                errors: messages
                    .iter()
                    .map(|m| (m.publishing_id, RESPONSE_CODE_PUBLISHER_DOES_NOT_EXIST))
                    .collect(),
            });
            return;
        };
        let ids: Vec<u64> = messages.iter().map(|m| m.publishing_id).collect();
        p.counters.published.fetch_add(ids.len() as u64, Relaxed);
        self.shared
            .counters
            .published
            .fetch_add(ids.len() as u64, Relaxed);
        let appended = p.writer.append_published(
            p.reference.as_deref(),
            messages
                .into_iter()
                .map(|m| (m.publishing_id, m.message, m.sub_batch)),
        );
        match appended {
            None => {
                p.counters.errored.fetch_add(ids.len() as u64, Relaxed);
                self.send(Command::PublishError {
                    publisher_id,
                    errors: ids
                        .iter()
                        .map(|id| (*id, RESPONSE_CODE_STREAM_NOT_AVAILABLE))
                        .collect(),
                });
            }
            Some(a) => match a.wait {
                None => {
                    p.counters.confirmed.fetch_add(ids.len() as u64, Relaxed);
                    self.send(Command::PublishConfirm {
                        publisher_id,
                        publishing_ids: ids,
                    });
                }
                Some(wait) => {
                    let counters = p.counters.clone();
                    self.confirms.push(PendingConfirm {
                        publisher_id,
                        ids,
                        wait,
                        counters,
                    });
                    // It may be synced already.
                    self.settle_confirms();
                }
            },
        }
    }

    /// Sends the confirms (and errors) of the publishes whose messages were synced (or
    /// whose stream stopped taking them) since the last look.
    pub fn settle_confirms(&mut self) {
        if self.confirms.is_empty() {
            return;
        }
        let durability = self.shared.durability.clone();
        let mut confirmed: BTreeMap<u8, Vec<u64>> = BTreeMap::new();
        let mut failed: BTreeMap<u8, Vec<(u64, u16)>> = BTreeMap::new();
        self.confirms.retain_mut(|c| {
            let w = [c.wait];
            if durability.all_durable(&w) {
                c.counters.confirmed.fetch_add(c.ids.len() as u64, Relaxed);
                confirmed
                    .entry(c.publisher_id)
                    .or_default()
                    .append(&mut c.ids);
                false
            } else if durability.any_refused(&w) {
                c.counters.errored.fetch_add(c.ids.len() as u64, Relaxed);
                failed.entry(c.publisher_id).or_default().extend(
                    c.ids
                        .iter()
                        .map(|id| (*id, RESPONSE_CODE_STREAM_NOT_AVAILABLE)),
                );
                false
            } else {
                true
            }
        });
        for (publisher_id, publishing_ids) in confirmed {
            self.shared
                .counters
                .confirmed
                .fetch_add(publishing_ids.len() as u64, Relaxed);
            self.send(Command::PublishConfirm {
                publisher_id,
                publishing_ids,
            });
        }
        for (publisher_id, errors) in failed {
            self.send(Command::PublishError {
                publisher_id,
                errors,
            });
        }
    }

    /// Publishes waiting for their confirms.
    pub fn confirms_pending(&self) -> usize {
        self.confirms.len()
    }
}
