//! Consumers: their credit, what they hold, and which of them the next message goes to.
//!
//! Every consumer lives in one ordered map by [`ConsumerId`], so that walking them (a node
//! going down, a channel closing, a snapshot) is the same on every member. The ones that may
//! receive messages are also in `service`, in the order they subscribed: with a single
//! active consumer the first of them is the active one and the rest wait their turn; without,
//! the next message goes to the next consumer in round-robin order among those of the
//! highest priority that have credit, as warren's single-node queues do.

use super::command::{ConsumerId, ConsumerSpec, MsgId};
use super::messages::Msg;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// Receiving messages (or waiting for its turn on a single-active-consumer queue).
    Up,
    /// basic.cancel'ed, still holding unsettled messages; gone once it holds none.
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumer {
    pub spec: ConsumerSpec,
    pub status: Status,
    /// Unsettled messages by id; ids increase with delivery order, so the map's order is it.
    pub checked_out: BTreeMap<MsgId, Msg>,
}

impl Consumer {
    pub fn new(spec: ConsumerSpec) -> Self {
        Consumer {
            spec,
            status: Status::Up,
            checked_out: BTreeMap::new(),
        }
    }

    /// Whether it may take one more message: no-ack consumers and a credit of 0 have no
    /// limit, as prefetch in RabbitMQ.
    pub fn has_credit(&self) -> bool {
        self.spec.no_ack
            || self.spec.credit == 0
            || self.checked_out.len() < self.spec.credit as usize
    }
}

/// The consumers and the order in which they are served.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumers {
    #[serde(with = "super::snapshot::pairs")]
    pub all: BTreeMap<ConsumerId, Consumer>,
    /// Consumers with status `Up` and a non-empty tag, in subscription order.
    service: Vec<ConsumerId>,
    /// Where the round robin resumes in `service`.
    next: usize,
}

impl Consumers {
    pub fn get(&self, id: &ConsumerId) -> Option<&Consumer> {
        self.all.get(id)
    }

    pub fn get_mut(&mut self, id: &ConsumerId) -> Option<&mut Consumer> {
        self.all.get_mut(id)
    }

    /// Consumers that receive messages (or wait to), in subscription order.
    pub fn service(&self) -> &[ConsumerId] {
        &self.service
    }

    /// Adds a consumer, or changes the settings of one already there (a cancelled one
    /// subscribes again at the back).
    pub fn subscribe(&mut self, id: ConsumerId, spec: ConsumerSpec) {
        let c = self
            .all
            .entry(id.clone())
            .or_insert_with(|| Consumer::new(spec));
        c.spec = spec;
        c.status = Status::Up;
        if !self.service.contains(&id) {
            self.service.push(id);
        }
    }

    /// Takes the consumer out of the round robin (basic.cancel); it stays in `all` while
    /// it holds messages.
    pub fn unsubscribe(&mut self, id: &ConsumerId) {
        self.leave_service(id);
        if let Some(c) = self.all.get_mut(id) {
            c.status = Status::Cancelled;
        }
    }

    fn leave_service(&mut self, id: &ConsumerId) {
        let Some(pos) = self.service.iter().position(|s| s == id) else {
            return;
        };
        self.service.remove(pos);
        if pos < self.next {
            self.next -= 1;
        }
        if self.next >= self.service.len() {
            self.next = 0;
        }
    }

    /// Forgets a consumer that is cancelled and holds nothing.
    pub fn remove_if_done(&mut self, id: &ConsumerId) {
        if self
            .all
            .get(id)
            .is_some_and(|c| c.status == Status::Cancelled && c.checked_out.is_empty())
        {
            self.all.remove(id);
        }
    }

    /// Forgets a consumer, whatever it holds (the caller returned it all first).
    pub fn remove(&mut self, id: &ConsumerId) -> Option<Consumer> {
        self.leave_service(id);
        self.all.remove(id)
    }

    /// The consumer the next message goes to, or None when no consumer can take one.
    pub fn pick(&mut self, single_active: bool) -> Option<ConsumerId> {
        if single_active {
            let first = self.service.first()?;
            return self.all[first].has_credit().then(|| first.clone());
        }
        let n = self.service.len();
        let top = self
            .service
            .iter()
            .map(|id| &self.all[id])
            .filter(|c| c.has_credit())
            .map(|c| c.spec.priority)
            .max()?;
        for step in 0..n {
            let i = (self.next + step) % n;
            let c = &self.all[&self.service[i]];
            if c.spec.priority == top && c.has_credit() {
                self.next = (i + 1) % n;
                return Some(self.service[i].clone());
            }
        }
        unreachable!("a consumer with credit at the top priority exists")
    }

    /// The active consumer of a single-active-consumer queue.
    pub fn active(&self) -> Option<&ConsumerId> {
        self.service.first()
    }
}
