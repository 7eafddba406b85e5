//! Dead-lettering: messages that expire, overflow, are rejected or hit their delivery limit
//! go to the queue's dead-letter exchange with RabbitMQ's x-death bookkeeping.

use super::*;
use crate::held_dead_letters::{HeldDeadLetter, RETRY_AFTER_MS, RETRY_BATCH_MAX};

impl VHost {
    // ---- dead-lettering --------------------------------------------------------------------

    /// Dead-letters a message a quorum queue's group let go (expired, rejected, over its
    /// limits or past its delivery limit), as the queue's leader is told to.
    pub fn dead_letter_quorum(
        &mut self,
        queue: &str,
        message: MessageRef,
        reason: &'static str,
        delivery_count: u32,
        now_ms: u64,
    ) -> DeadLettered {
        let Some(q) = self
            .queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get(id))
        else {
            return DeadLettered::default();
        };
        let d = DeadLetter {
            queue: queue.to_string(),
            config: q.config.clone(),
            message: QueuedMessage {
                msg: message,
                redelivered: false,
                delivery_count,
                expires_at_ms: None,
                seq: 0,
                store_index: None,
            },
            reason,
        };
        self.dead_letter(vec![d], now_ms)
    }

    /// Dead-letters `work` and what its targets dead-letter in turn; says where the first
    /// hop's messages went.
    pub(super) fn dead_letter(&mut self, mut work: Vec<DeadLetter>, now_ms: u64) -> DeadLettered {
        let mut first = DeadLettered::default();
        let mut hops = 0;
        while !work.is_empty() && hops < DEAD_LETTER_HOPS_MAX {
            hops += 1;
            let outcome = if hops == 1 {
                &mut first
            } else {
                &mut DeadLettered::default()
            };
            let batch = std::mem::take(&mut work);
            for d in batch {
                let holds = d.message.store_index.is_some()
                    && self
                        .queues_by_name
                        .get(&d.queue)
                        .and_then(|id| self.queues.get(id))
                        .is_some_and(|q| q.holds_dead_letters());
                if holds {
                    let route = self.route_dead_letter(&d, &[], outcome, &mut work, now_ms);
                    self.release_or_hold(d, route, now_ms);
                    continue;
                }
                // It left its queue for good, whether or not it goes on to a DLX.
                if let Some(index) = d.message.store_index {
                    let q = self
                        .queues_by_name
                        .get(&d.queue)
                        .and_then(|id| self.queues.get_mut(id));
                    if let Some(q) = q {
                        q.release_stored(index, &mut self.store_ops);
                    }
                }
                self.route_dead_letter(&d, &[], outcome, &mut work, now_ms);
            }
        }
        first
    }

    /// Routes one dead letter to its exchange's queues (leaving out those in `skip`, which
    /// took it before, and those it would cycle back to) and enqueues it in the local ones
    /// that take it; what they dead-letter in turn goes to `work`. Says whether it is
    /// delivered, as far as an at-least-once source is concerned.
    fn route_dead_letter(
        &mut self,
        d: &DeadLetter,
        skip: &[QueueId],
        outcome: &mut DeadLettered,
        work: &mut Vec<DeadLetter>,
        now_ms: u64,
    ) -> Route {
        let mut result = Route {
            delivered: true,
            taken_by: Vec::new(),
        };
        let Some(dlx) = d.config.dead_letter_exchange.clone() else {
            return result;
        };
        let Ok(props) = Properties::decode(&d.message.msg.properties) else {
            return result;
        };
        let (msg, props) = dead_lettered_message(d, &props, now_ms);
        let mut targets = Vec::new();
        if self.route(&dlx, &msg, &props, &mut targets).is_err() {
            // No such exchange (yet): an at-least-once source waits for it, as RabbitMQ's
            // worker does.
            result.delivered = false;
            return result;
        }
        let deaths = props.headers_table().ok().flatten();
        let routed = targets.len();
        targets.retain(|t| {
            !self
                .queues
                .get(t)
                .is_some_and(|q| is_cycle(deaths.as_ref(), &q.name))
        });
        let cycles = routed - targets.len();
        outcome.cycles += cycles;
        targets.retain(|t| !skip.contains(t));
        if targets.is_empty() && skip.is_empty() && cycles == 0 {
            // Unroutable: waits for a binding.
            result.delivered = false;
        }
        outcome.targets += targets.len();
        let msg = Arc::new(msg);
        let mut elsewhere = Vec::new();
        let mut replicated = Vec::new();
        let mut streams = Vec::new();
        for qid in targets {
            let Some(q) = self.queues.get_mut(&qid) else {
                continue;
            };
            if q.config.queue_type == QueueType::Stream {
                // Its writer appends it, as a publish routed to it.
                streams.extend(q.log_id);
                continue;
            }
            if let Some(target) = super::publish::quorum_target(&self.local_node, q) {
                replicated.push(target);
                continue;
            }
            if !super::hosts(&self.local_node, q) {
                let node = q.home_node.clone().expect("hosted elsewhere has a home");
                elsewhere.push((node, q.name.clone()));
                continue;
            }
            if q.refuses_publish(msg.size_bytes()) && q.config.overflow != Overflow::DropHead {
                outcome.refused += 1;
                result.delivered = false;
                // A full reject-publish-dlx queue dead-letters whatever it refuses,
                // dead letters included (maybe_deliver_or_enqueue).
                if q.config.overflow == Overflow::RejectPublishDlx {
                    work.push(DeadLetter {
                        queue: q.name.clone(),
                        config: q.config.clone(),
                        message: QueuedMessage {
                            msg: msg.clone(),
                            redelivered: false,
                            delivery_count: 0,
                            expires_at_ms: None,
                            seq: 0,
                            store_index: None,
                        },
                        reason: "maxlen",
                    });
                }
                continue;
            }
            self.enqueue(qid, &msg, now_ms, work);
            result.taken_by.push(qid);
        }
        if !elsewhere.is_empty() {
            self.forward(elsewhere, &msg);
        }
        if !streams.is_empty() {
            self.remote.push(RemoteEffect::StreamAppend {
                logs: streams,
                message: msg.clone(),
            });
        }
        if !replicated.is_empty() {
            self.remote.push(RemoteEffect::Propose {
                queues: replicated,
                message: msg.clone(),
            });
        }
        result
    }

    /// An at-least-once source's dead letter after routing: released once delivered (its
    /// release appended after the targets' appends, so durable only once they are), else
    /// held, flagged in the source's log so that a restart holds it again.
    fn release_or_hold(&mut self, d: DeadLetter, route: Route, now_ms: u64) {
        let Some(q) = self
            .queues_by_name
            .get(&d.queue)
            .and_then(|id| self.queues.get_mut(id))
        else {
            return;
        };
        let index = d
            .message
            .store_index
            .expect("an at-least-once source stores");
        if route.delivered {
            q.release_stored(index, &mut self.store_ops);
            return;
        }
        let log = q.log_id.expect("an at-least-once source stores");
        let held_at = q.next_index;
        q.next_index += 1;
        q.released.appended(held_at);
        let death = crate::message::StoredDeath {
            reason: d.reason,
            delivery_count: d.message.delivery_count,
        };
        self.store_ops.push(StoreOp::Append {
            log,
            index: held_at,
            payload: crate::message::encode_stored_dead_letter(&d.message.msg, death),
        });
        // After the flagged copy: a crash between the two leaves the message twice (ready
        // and held), never lost.
        q.release_stored(index, &mut self.store_ops);
        let mut message = d.message;
        message.store_index = Some(held_at);
        message.expires_at_ms = None;
        q.dead_letters.hold(
            HeldDeadLetter {
                message,
                reason: d.reason,
                taken_by: route.taken_by,
            },
            now_ms,
        );
    }

    /// Routes a queue's held dead letters again (the oldest [`RETRY_BATCH_MAX`]); those
    /// every target took are released, the others wait [`RETRY_AFTER_MS`] more.
    pub(super) fn retry_dead_letters(&mut self, qid: QueueId, now_ms: u64) {
        let Some(q) = self.queues.get_mut(&qid) else {
            return;
        };
        q.dead_letters.retry_at_ms = now_ms + RETRY_AFTER_MS;
        let letters = q.dead_letters.take_oldest(RETRY_BATCH_MAX);
        let (queue, config) = (q.name.clone(), q.config.clone());
        let mut work = Vec::new();
        let mut outcome = DeadLettered::default();
        for mut letter in letters {
            let d = DeadLetter {
                queue: queue.clone(),
                config: config.clone(),
                message: letter.message.clone(),
                reason: letter.reason,
            };
            let route =
                self.route_dead_letter(&d, &letter.taken_by, &mut outcome, &mut work, now_ms);
            let Some(q) = self.queues.get_mut(&qid) else {
                break;
            };
            let index = letter
                .message
                .store_index
                .expect("a held dead letter is stored");
            if route.delivered {
                q.release_stored(index, &mut self.store_ops);
            } else {
                letter.taken_by.extend(route.taken_by);
                q.dead_letters.put_back(letter);
            }
        }
        self.dead_letter(work, now_ms);
    }

    /// Whether `queue` keeps its dead letters on this node until they are delivered
    /// (recovery reads its log for the ones it held).
    pub fn holds_dead_letters(&self, queue: &str) -> bool {
        self.queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get(id))
            .is_some_and(|q| q.holds_dead_letters())
    }

    /// Puts back a dead letter `queue` held before a restart: `payload` is its flagged entry
    /// at `index`. False when it is not one (or the queue is gone).
    pub fn restore_dead_letter(&mut self, queue: &str, index: u64, payload: &Bytes) -> bool {
        let Some(q) = self
            .queues_by_name
            .get(queue)
            .and_then(|id| self.queues.get_mut(id))
        else {
            return false;
        };
        let Some((msg, _, Some(death))) = crate::message::decode_stored_with_death(payload) else {
            return false;
        };
        q.dead_letters.hold(
            HeldDeadLetter {
                message: QueuedMessage {
                    msg: Arc::new(msg),
                    redelivered: false,
                    delivery_count: death.delivery_count,
                    expires_at_ms: None,
                    seq: 0,
                    store_index: Some(index),
                },
                reason: death.reason,
                taken_by: Vec::new(),
            },
            // Due at once: its targets may have been there all along.
            0,
        );
        true
    }
}

/// Whether a dead letter reached every queue it was routed to, and which local ones took it.
struct Route {
    delivered: bool,
    taken_by: Vec<QueueId>,
}

/// Where dead letters went: what an at-least-once quorum queue needs to know before it lets
/// one go (the confirms of the queues it reached are waited for by the caller).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeadLettered {
    /// Queues it was routed to, cycles left out (a local queue that refused it included).
    pub targets: usize,
    /// Local queues that refused it (full, reject-publish).
    pub refused: usize,
    /// Queues left out because the message died there already with no rejection since
    /// (RabbitMQ drops it for them rather than loop).
    pub cycles: usize,
}

/// The message as it leaves for the dead-letter exchange, with RabbitMQ's x-death bookkeeping.
pub(super) fn dead_lettered_message(
    d: &DeadLetter,
    props: &Properties,
    now_ms: u64,
) -> (Message, Properties) {
    let orig = &d.message.msg;
    let mut table = props.headers_table().ok().flatten().unwrap_or_default();
    let mut routing_keys = vec![AMQPValue::LongString(LongString::from(
        orig.routing_key.to_vec(),
    ))];
    if let Some(AMQPValue::FieldArray(cc)) = table.inner().get("CC") {
        routing_keys.extend(cc.as_slice().iter().cloned());
    }
    let mut deaths: Vec<AMQPValue> = match table.inner().get("x-death") {
        Some(AMQPValue::FieldArray(a)) => group_by_queue_and_reason(a.as_slice()),
        _ => Vec::new(),
    };
    let same = |t: &FieldTable| {
        t.inner().get("queue").and_then(args::string).as_deref() == Some(d.queue.as_str())
            && t.inner().get("reason").and_then(args::string).as_deref() == Some(d.reason)
    };
    let existing = deaths
        .iter()
        .position(|v| matches!(v, AMQPValue::FieldTable(t) if same(t)));
    let entry = match existing {
        Some(i) => {
            let AMQPValue::FieldTable(mut t) = deaths.remove(i) else {
                unreachable!("matched a table")
            };
            let count = t.inner().get("count").and_then(args::integer).unwrap_or(0) + 1;
            t.insert("count".into(), AMQPValue::LongLongInt(count));
            t
        }
        None => {
            let mut t = FieldTable::default();
            t.insert("count".into(), AMQPValue::LongLongInt(1));
            t.insert(
                "reason".into(),
                AMQPValue::LongString(LongString::from(d.reason)),
            );
            t.insert(
                "queue".into(),
                AMQPValue::LongString(LongString::from(d.queue.as_str())),
            );
            t.insert("time".into(), AMQPValue::Timestamp(now_ms / 1000));
            t.insert(
                "exchange".into(),
                AMQPValue::LongString(LongString::from(orig.exchange.to_vec())),
            );
            t.insert(
                "routing-keys".into(),
                AMQPValue::FieldArray(FieldArray::from(routing_keys.clone())),
            );
            if let Some(e) = &props.expiration {
                t.insert(
                    "original-expiration".into(),
                    AMQPValue::LongString(LongString::from(e.to_vec())),
                );
            }
            t
        }
    };
    deaths.insert(0, AMQPValue::FieldTable(entry));
    table.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(deaths)),
    );
    if !table.inner().contains_key("x-first-death-reason") {
        table.insert(
            "x-first-death-reason".into(),
            AMQPValue::LongString(LongString::from(d.reason)),
        );
        table.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString(LongString::from(d.queue.as_str())),
        );
        table.insert(
            "x-first-death-exchange".into(),
            AMQPValue::LongString(LongString::from(orig.exchange.to_vec())),
        );
    }
    if d.config.dead_letter_routing_key.is_some() {
        // RabbitMQ's make_msg: a replaced routing key also drops CC, so the dead letter is
        // routed by that key alone (x-death's routing-keys still record the CC keys).
        let mut inner = table.inner().clone();
        inner.remove("CC");
        table = FieldTable::from(inner);
    }
    let mut p = props.clone();
    p.expiration = None;
    p.set_headers_table(Some(&table));
    let routing_key = match &d.config.dead_letter_routing_key {
        Some(k) => Bytes::from(k.clone()),
        None => orig.routing_key.clone(),
    };
    let exchange = Bytes::from(d.config.dead_letter_exchange.clone().unwrap_or_default());
    let msg = Message {
        exchange,
        routing_key,
        properties: p.encode(),
        body: orig.body.clone(),
        persistent: orig.persistent,
        priority: orig.priority,
        expiration_ms: None,
        // RabbitMQ routes the dead letter by all the original keys unless the queue set one.
        bcc: match &d.config.dead_letter_routing_key {
            Some(_) => Vec::new(),
            None => orig.bcc.clone(),
        },
    };
    (msg, p)
}

/// x-death entries a publisher set (or an older broker left) may repeat a (queue, reason):
/// RabbitMQ 3.10-3.12 (rabbit_dead_letter:group_by_queue_and_reason) keep the first entry of
/// each pair and drop the others; a kept entry without a count gets the number of entries it
/// stood for. A lone entry is left as it is; entries that are not tables are kept.
///
/// The kept entries stay in their order, newest death first, where 3.10's fold reverses them
/// on every death: that reversal can put an old rejection in front of the target queue's entry,
/// which excuses an automatic cycle in `is_cycle` (measured on 3.10.8: a message rejected once,
/// then expiring b -> c -> b, goes round for ever). With the order kept, each (queue, reason)
/// sits where its latest death puts it, so the entries in front of a queue's first entry are
/// exactly the deaths since the message last died there (docs/dead-lettering.md).
fn group_by_queue_and_reason(deaths: &[AMQPValue]) -> Vec<AMQPValue> {
    // Keys once, counts in a map: a publisher's array may hold thousands of entries (as many
    // as a frame carries), so no quadratic scan.
    let keys: Vec<Option<(Option<String>, Option<String>)>> = deaths
        .iter()
        .map(|v| match v {
            AMQPValue::FieldTable(t) => {
                let field = |k: &str| t.inner().get(k).and_then(args::string);
                Some((field("queue"), field("reason")))
            }
            _ => None,
        })
        .collect();
    let mut counts = std::collections::HashMap::new();
    for k in keys.iter().flatten() {
        *counts.entry(k).or_insert(0i64) += 1;
    }
    if counts.values().sum::<i64>() <= 1 {
        return deaths.to_vec();
    }
    let mut seen = std::collections::HashSet::new();
    let mut grouped = Vec::with_capacity(deaths.len());
    for (v, k) in deaths.iter().zip(&keys) {
        let (Some(k), AMQPValue::FieldTable(t)) = (k, v) else {
            grouped.push(v.clone());
            continue;
        };
        if !seen.insert(k) {
            continue;
        }
        let mut t = t.clone();
        if !t.inner().contains_key("count") {
            t.insert("count".into(), AMQPValue::LongLongInt(counts[k]));
        }
        grouped.push(AMQPValue::FieldTable(t));
    }
    grouped
}

/// RabbitMQ drops a dead letter that would return to a queue it already died in, unless a
/// rejection (a client's decision, so no endless automatic loop) happened since it last died
/// there: rabbit_dead_letter:is_cycle looks at the deaths newest first, up to and including
/// the target queue's entry. `headers` are the dead letter's, its newest death first.
pub(super) fn is_cycle(headers: Option<&FieldTable>, target: &str) -> bool {
    let Some(AMQPValue::FieldArray(deaths)) = headers.and_then(|h| h.inner().get("x-death")) else {
        return false;
    };
    let mut rejected_since = false;
    for v in deaths.as_slice() {
        let AMQPValue::FieldTable(t) = v else {
            // RabbitMQ counts an entry that is not a table as breaking the cycle.
            rejected_since = true;
            continue;
        };
        let field = |k: &str| t.inner().get(k).and_then(args::string);
        rejected_since |= field("reason").as_deref() == Some("rejected");
        if field("queue").as_deref() == Some(target) {
            return !rejected_since;
        }
    }
    false
}
