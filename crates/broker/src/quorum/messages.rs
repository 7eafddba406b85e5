//! What the queue keeps of a message, and the ready messages in the order they are served.
//!
//! A message is its log index and a 32-byte header; the body stays in the log entry at that
//! index. Ready messages sit in three queues, served in this order:
//!
//! - `returns`: messages given back by basic.recover or a closed channel, oldest return first,
//!   ahead of everything else (rabbit_fifo's `returns`);
//! - `enqueued` and `rejected`, merged: `enqueued` holds messages never delivered, in log
//!   order; `rejected` holds messages a client nacked or rejected with requeue, each behind
//!   every message that was ready when it came back (RabbitMQ 3.10 puts those at the back).
//!   Each rejected message remembers the last index enqueued before it came back; it is
//!   served once every enqueued message up to that index is gone, which is the order a single
//!   queue would give without moving a never-delivered message out of log order;
//! - `high`: never-delivered messages of high priority (a `priority` property above 4), in log
//!   order, as RabbitMQ 4's quorum queues keep two priorities. They are favoured two to one:
//!   of every three messages served from `high` and the merged queue, the third is the older
//!   of the two heads (rabbit_fifo_q's weighted out), so normal messages are never starved.
//!
//! Keeping never-delivered messages in log order makes the release cursor cheap: the lowest
//! live index is the front of `enqueued` or `high`, or the lowest of the (few) messages that
//! have been delivered, which [`super::QuorumQueue`] keeps in an ordered set.

use super::snapshot::{get_varint, put_varint};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A message as the queue holds it: 24 bytes, so ten million ready messages cost 240 MB of
/// the node's memory (rabbit_fifo documents at least 32 bytes each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Msg {
    /// Its log index: where its body is, and its identity within the queue.
    pub index: u64,
    /// When it dies (`now_ms >= expires_at_ms`, as RabbitMQ's `Now >= Expiry`), or 0 for
    /// never: an expiry is at least 1 ms after the publish, so 0 is free.
    expires_at_ms: u64,
    pub size_bytes: u32,
    /// Returns so far (x-delivery-count). Every return counts, so a message is redelivered
    /// exactly when this is above 0.
    pub delivery_count: u32,
}

impl Msg {
    pub fn new(index: u64, size_bytes: u32, expires_at_ms: Option<u64>) -> Self {
        debug_assert_ne!(expires_at_ms, Some(0), "0 means no expiry");
        Msg {
            index,
            expires_at_ms: expires_at_ms.unwrap_or(0),
            size_bytes,
            delivery_count: 0,
        }
    }

    pub fn expires_at_ms(&self) -> Option<u64> {
        (self.expires_at_ms != 0).then_some(self.expires_at_ms)
    }

    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && now_ms >= self.expires_at_ms
    }

    /// AMQP's redelivered flag: it was delivered before.
    pub fn redelivered(&self) -> bool {
        self.delivery_count > 0
    }
}

/// Which ready queue serves next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Returns,
    Enqueued,
    Rejected,
    High,
}

/// Of every `WEIGHT + 1` messages served while both priorities wait, `WEIGHT` are high
/// (rabbit_fifo_q's weight).
const WEIGHT: u8 = 2;

/// Not serde: a snapshot carries it in the compact form of [`Ready::encode`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ready {
    returns: VecDeque<Msg>,
    enqueued: VecDeque<Msg>,
    /// `(after, msg)`: served once no enqueued message with index <= `after` is left.
    /// `after` never decreases along the queue.
    rejected: VecDeque<(u64, Msg)>,
    /// Never-delivered messages of high priority, in log order.
    high: VecDeque<Msg>,
    /// Messages served from `high` and the merged queue, modulo `WEIGHT + 1`: at `WEIGHT`
    /// the older head goes, whatever its priority. Replicated state (a snapshot carries it),
    /// since it decides which message every member hands out next.
    served: u8,
    bytes: u64,
}

impl Ready {
    pub fn len(&self) -> usize {
        self.returns.len() + self.enqueued.len() + self.rejected.len() + self.high.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Body bytes of the ready messages (x-max-length-bytes counts these).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the message at `index` waits never delivered.
    pub fn has_enqueued(&self, index: u64) -> bool {
        [&self.enqueued, &self.high]
            .iter()
            .any(|q| q.binary_search_by_key(&index, |m| m.index).is_ok())
    }

    /// The lowest index among never-delivered messages.
    pub fn first_enqueued_index(&self) -> Option<u64> {
        let normal = self.enqueued.front().map(|m| m.index);
        let high = self.high.front().map(|m| m.index);
        normal.into_iter().chain(high).min()
    }

    fn source(&self) -> Option<Source> {
        if !self.returns.is_empty() {
            return Some(Source::Returns);
        }
        let normal = merged_source(&self.enqueued, &self.rejected);
        match (self.high.front(), normal) {
            (Some(h), Some(n)) if self.served == WEIGHT => {
                let head = match n {
                    Source::Rejected => self.rejected.front().map(|(_, m)| m),
                    _ => self.enqueued.front(),
                };
                if head.is_some_and(|m| m.index < h.index) {
                    Some(n)
                } else {
                    Some(Source::High)
                }
            }
            (Some(_), _) => Some(Source::High),
            (None, n) => n,
        }
    }

    /// The message served next.
    pub fn peek(&self) -> Option<&Msg> {
        match self.source()? {
            Source::Returns => self.returns.front(),
            Source::Enqueued => self.enqueued.front(),
            Source::Rejected => self.rejected.front().map(|(_, m)| m),
            Source::High => self.high.front(),
        }
    }

    /// Takes the message served next.
    pub fn pop(&mut self) -> Option<Msg> {
        let source = self.source()?;
        let m = match source {
            Source::Returns => self.returns.pop_front(),
            Source::Enqueued => self.enqueued.pop_front(),
            Source::Rejected => self.rejected.pop_front().map(|(_, m)| m),
            Source::High => self.high.pop_front(),
        }?;
        if source != Source::Returns {
            self.served = next_served(self.served);
        }
        self.bytes -= m.size_bytes as u64;
        Some(m)
    }

    /// A new message, at the back of its priority's queue. Enqueues come in log order.
    pub fn push_enqueued(&mut self, m: Msg, high: bool) {
        let lane = if high {
            &mut self.high
        } else {
            &mut self.enqueued
        };
        assert!(
            lane.back().is_none_or(|b| b.index < m.index),
            "enqueues arrive in log order"
        );
        self.bytes += m.size_bytes as u64;
        lane.push_back(m);
    }

    /// A recovered or orphaned message: behind earlier returns, ahead of the rest.
    pub fn push_return(&mut self, m: Msg) {
        self.bytes += m.size_bytes as u64;
        self.returns.push_back(m);
    }

    /// A rejected message: behind everything ready now. `last_enqueued` is the highest index
    /// enqueued so far, so every message enqueued later is served after it.
    pub fn push_rejected(&mut self, last_enqueued: u64, m: Msg) {
        debug_assert!(self
            .rejected
            .back()
            .is_none_or(|(a, _)| *a <= last_enqueued));
        self.bytes += m.size_bytes as u64;
        self.rejected.push_back((last_enqueued, m));
    }

    /// Takes back the message just enqueued at `index` if it is still ready (a TTL of 0 that
    /// no consumer could take at once).
    pub fn pop_enqueued_if(&mut self, index: u64) -> Option<Msg> {
        let lane = [&mut self.enqueued, &mut self.high]
            .into_iter()
            .find(|q| q.back().is_some_and(|m| m.index == index))?;
        let m = lane.pop_back()?;
        self.bytes -= m.size_bytes as u64;
        Some(m)
    }

    /// Every ready message, in the order they would be served (if none came or went
    /// meanwhile).
    pub fn iter(&self) -> impl Iterator<Item = &Msg> + '_ {
        let mut e = self.enqueued.iter().peekable();
        let mut r = self.rejected.iter().peekable();
        let mut h = self.high.iter().peekable();
        let mut served = self.served;
        self.returns.iter().chain(std::iter::from_fn(move || {
            let normal = match (e.peek(), r.peek()) {
                (Some(m), Some((after, _))) if *after < m.index => Some(r.peek()?.1.index),
                (Some(m), _) => Some(m.index),
                (None, Some((_, m))) => Some(m.index),
                (None, None) => None,
            };
            let take_high = match (h.peek(), normal) {
                (Some(hm), Some(n)) => served != WEIGHT || hm.index < n,
                (Some(_), None) => true,
                (None, _) => false,
            };
            served = next_served(served);
            if take_high {
                return h.next();
            }
            match (e.peek(), r.peek()) {
                (Some(m), Some((after, _))) if *after < m.index => r.next().map(|(_, m)| m),
                (Some(_), _) => e.next(),
                (None, _) => r.next().map(|(_, m)| m),
            }
        }))
    }

    /// The messages that have been delivered before (returned or rejected).
    pub fn iter_delivered(&self) -> impl Iterator<Item = &Msg> + '_ {
        self.returns
            .iter()
            .chain(self.rejected.iter().map(|(_, m)| m))
    }

    /// Empties the queue (purge), giving what was in it.
    pub fn take_all(&mut self) -> Vec<Msg> {
        let all: Vec<Msg> = self.iter().copied().collect();
        *self = Ready::default();
        all
    }
}

/// Which of `enqueued` and `rejected` serves next, as one queue.
fn merged_source(enqueued: &VecDeque<Msg>, rejected: &VecDeque<(u64, Msg)>) -> Option<Source> {
    match (enqueued.front(), rejected.front()) {
        (Some(m), Some((after, _))) if *after < m.index => Some(Source::Rejected),
        (Some(_), _) => Some(Source::Enqueued),
        (None, Some(_)) => Some(Source::Rejected),
        (None, None) => None,
    }
}

fn next_served(served: u8) -> u8 {
    if served >= WEIGHT {
        0
    } else {
        served + 1
    }
}

/// The snapshot form of the ready messages: counted runs (returns, enqueued, rejected, and
/// from version 2 high, then the served count) of varints; a never-delivered message's index
/// is the step from the one before it, so a long backlog costs about 3 bytes per message
/// before its TTL.
impl Ready {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.returns.len() as u64);
        for m in &self.returns {
            put_varint(out, m.index);
            put_header(out, m);
        }
        put_in_log_order(out, &self.enqueued);
        put_varint(out, self.rejected.len() as u64);
        for (after, m) in &self.rejected {
            put_varint(out, *after);
            put_varint(out, m.index);
            put_header(out, m);
        }
        put_in_log_order(out, &self.high);
        put_varint(out, self.served as u64);
    }

    /// Reads what [`Ready::encode`] wrote (or, for `version` 1, what it wrote before high
    /// priorities), checking the order the queues must keep.
    pub(super) fn decode(input: &mut &[u8], version: u8) -> Result<Ready, String> {
        let mut r = Ready::default();
        let n = counted(input)?;
        for _ in 0..n {
            let index = get_varint(input)?;
            r.push_return(get_header(input, index)?);
        }
        r.enqueued = get_in_log_order(input)?;
        let n = counted(input)?;
        let mut last_after = 0;
        for _ in 0..n {
            let after = get_varint(input)?;
            if after < last_after {
                return Err("rejected messages out of order".into());
            }
            last_after = after;
            let index = get_varint(input)?;
            r.rejected.push_back((after, get_header(input, index)?));
        }
        if version >= 2 {
            r.high = get_in_log_order(input)?;
            let served = get_varint(input)?;
            if served > WEIGHT as u64 {
                return Err(format!("served count {served} past the weight {WEIGHT}"));
            }
            r.served = served as u8;
        }
        r.bytes = r.iter().map(|m| m.size_bytes as u64).sum();
        Ok(r)
    }
}

/// Never-delivered messages: a count, then each index as the step from the one before.
fn put_in_log_order(out: &mut Vec<u8>, q: &VecDeque<Msg>) {
    put_varint(out, q.len() as u64);
    let mut previous = 0;
    for m in q {
        put_varint(out, m.index - previous);
        previous = m.index;
        put_header(out, m);
    }
}

fn get_in_log_order(input: &mut &[u8]) -> Result<VecDeque<Msg>, String> {
    let n = counted(input)?;
    let mut q = VecDeque::with_capacity(n as usize);
    let mut previous = 0u64;
    for _ in 0..n {
        let step = get_varint(input)?;
        if step == 0 {
            return Err("enqueued messages out of log order".into());
        }
        previous = previous.checked_add(step).ok_or("index overflow")?;
        q.push_back(get_header(input, previous)?);
    }
    Ok(q)
}

fn put_header(out: &mut Vec<u8>, m: &Msg) {
    put_varint(out, m.size_bytes as u64);
    put_varint(out, m.delivery_count as u64);
    put_varint(out, m.expires_at_ms);
}

fn get_header(input: &mut &[u8], index: u64) -> Result<Msg, String> {
    let narrow = |v: u64| u32::try_from(v).map_err(|_| format!("{v} does not fit 32 bits"));
    Ok(Msg {
        index,
        size_bytes: narrow(get_varint(input)?)?,
        delivery_count: narrow(get_varint(input)?)?,
        expires_at_ms: get_varint(input)?,
    })
}

/// A count of messages, each at least 4 bytes, so a corrupt count fails here rather than
/// asking for memory the snapshot could not fill.
fn counted(input: &mut &[u8]) -> Result<u64, String> {
    let n = get_varint(input)?;
    if n > input.len() as u64 / 4 {
        return Err(format!("{n} messages in {} bytes", input.len()));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(index: u64) -> Msg {
        Msg::new(index, 1, None)
    }

    fn order(r: &Ready) -> Vec<u64> {
        r.iter().map(|m| m.index).collect()
    }

    #[test]
    fn a_rejected_message_goes_behind_what_was_ready_and_ahead_of_later_enqueues() {
        let mut r = Ready::default();
        for i in [1, 2, 3] {
            r.push_enqueued(msg(i), false);
        }
        let first = r.pop().unwrap();
        r.push_rejected(3, first);
        r.push_enqueued(msg(4), false);
        assert_eq!(order(&r), [2, 3, 1, 4]);
        let served: Vec<u64> = std::iter::from_fn(|| r.pop().map(|m| m.index)).collect();
        assert_eq!(served, [2, 3, 1, 4], "pop serves in the order iter shows");
        assert_eq!(r.bytes(), 0);
    }

    #[test]
    fn returns_are_served_first_in_the_order_they_came_back() {
        let mut r = Ready::default();
        r.push_enqueued(msg(1), false);
        r.push_return(msg(7));
        r.push_return(msg(5));
        r.push_rejected(1, msg(6));
        assert_eq!(order(&r), [7, 5, 1, 6]);
        assert_eq!(r.peek().map(|m| m.index), Some(7));
        assert_eq!(r.len(), 4);
        assert_eq!(r.bytes(), 4);
    }

    #[test]
    fn high_priority_messages_go_first_two_to_one_and_normal_ones_are_not_starved() {
        let mut r = Ready::default();
        for i in 1..=3 {
            r.push_enqueued(msg(i), false);
        }
        for i in 4..=6 {
            r.push_enqueued(msg(i), true);
        }
        assert_eq!(r.first_enqueued_index(), Some(1));
        assert!(r.has_enqueued(5) && r.has_enqueued(2));
        assert_eq!(order(&r), [4, 5, 1, 6, 2, 3]);
        let served: Vec<u64> = std::iter::from_fn(|| r.pop().map(|m| m.index)).collect();
        assert_eq!(
            served,
            [4, 5, 1, 6, 2, 3],
            "pop serves in the order iter shows"
        );
    }

    #[test]
    fn a_snapshot_of_version_1_reads_as_normal_priority_messages() {
        let mut r = Ready::default();
        r.push_enqueued(msg(3), false);
        r.push_enqueued(msg(9), false);
        r.push_return(msg(1));
        let mut v2 = Vec::new();
        r.encode(&mut v2);
        // Version 1 ended before the high-priority run (count 0) and the served count (0).
        let v1 = &v2[..v2.len() - 2];
        assert_eq!(Ready::decode(&mut &v1[..], 1).unwrap(), r);
        assert_eq!(Ready::decode(&mut &v2[..], 2).unwrap(), r);
    }

    /// The obvious model: returns, then one list where a rejected message joins the back, and
    /// the high-priority messages beside it, weighed as rabbit_fifo_q weighs them.
    #[derive(Default, Clone)]
    struct Model {
        returns: VecDeque<u64>,
        main: VecDeque<u64>,
        high: VecDeque<u64>,
        served: u8,
    }

    impl Model {
        fn pop(&mut self) -> Option<u64> {
            if let Some(m) = self.returns.pop_front() {
                return Some(m);
            }
            let high = match (self.high.front(), self.main.front()) {
                (Some(h), Some(m)) => self.served != WEIGHT || h < m,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return None,
            };
            self.served = (self.served + 1) % (WEIGHT + 1);
            if high {
                self.high.pop_front()
            } else {
                self.main.pop_front()
            }
        }

        fn order(&self) -> Vec<u64> {
            let mut m = self.clone();
            std::iter::from_fn(|| m.pop()).collect()
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Enqueue {
            high: bool,
        },
        Pop,
        /// Pops the head and gives it back: as a return, or rejected.
        PopAndGiveBack {
            rejected: bool,
        },
        /// Gives back the message popped `k` pops ago, if still out.
        GiveBackOld {
            k: usize,
            rejected: bool,
        },
    }

    proptest! {
        #[test]
        fn serves_in_the_order_of_the_obvious_model(
            steps in prop::collection::vec(prop_oneof![
                3 => prop::bool::weighted(0.3).prop_map(|high| Step::Enqueue { high }),
                2 => Just(Step::Pop),
                2 => any::<bool>().prop_map(|rejected| Step::PopAndGiveBack { rejected }),
                2 => (0usize..4, any::<bool>())
                    .prop_map(|(k, rejected)| Step::GiveBackOld { k, rejected }),
            ], 0..200)
        ) {
            let mut r = Ready::default();
            let mut model = Model::default();
            let mut next = 1;
            let mut out: Vec<Msg> = Vec::new();
            let give_back = |r: &mut Ready, model: &mut Model, m: Msg, rejected: bool, last: u64| {
                if rejected {
                    r.push_rejected(last, m);
                    model.main.push_back(m.index);
                } else {
                    r.push_return(m);
                    model.returns.push_back(m.index);
                }
            };
            for step in steps {
                match step {
                    Step::Enqueue { high } => {
                        r.push_enqueued(msg(next), high);
                        if high {
                            model.high.push_back(next);
                        } else {
                            model.main.push_back(next);
                        }
                        next += 1;
                    }
                    Step::Pop => {
                        let want = model.pop();
                        let got = r.pop();
                        prop_assert_eq!(got.map(|m| m.index), want);
                        out.extend(got);
                    }
                    Step::PopAndGiveBack { rejected } => {
                        let want = model.pop();
                        let got = r.pop();
                        prop_assert_eq!(got.map(|m| m.index), want);
                        if let Some(m) = got {
                            give_back(&mut r, &mut model, m, rejected, next - 1);
                        }
                    }
                    Step::GiveBackOld { k, rejected } => {
                        if k < out.len() {
                            let m = out.remove(out.len() - 1 - k);
                            give_back(&mut r, &mut model, m, rejected, next - 1);
                        }
                    }
                }
                let order: Vec<u64> = r.iter().map(|m| m.index).collect();
                let want = model.order();
                prop_assert_eq!(&order, &want);
                let mut snapshot = Vec::new();
                r.encode(&mut snapshot);
                prop_assert_eq!(&Ready::decode(&mut &snapshot[..], 2).unwrap(), &r);
                prop_assert_eq!(r.len(), want.len());
                prop_assert_eq!(r.bytes(), want.len() as u64);
            }
        }
    }
}
