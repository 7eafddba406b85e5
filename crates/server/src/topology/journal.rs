//! A single node's topology: a change is applied here by [`Broker::execute_then`] and, with the
//! vhost still locked, what it made durable is appended to the metadata journal and synced
//! ([`crate::storage::settle`]), so the journal's order is the order of the changes and a
//! declare-ok goes out only once the declare survives kill -9. A journal that cannot be written
//! answers 541 INTERNAL_ERROR, the change staying in memory as it did before the write.
//!
//! [`Broker::execute_then`]: warren_broker::broker::Broker::execute_then

use super::{Answer, Topology};
use crate::Shared;
use std::sync::Arc;
use warren_broker::command::Command;

pub struct Journal {
    pub shared: Arc<Shared>,
}

impl Topology for Journal {
    fn change(&self, command: Command) -> Answer {
        let shared = &self.shared;
        let outcome = shared
            .broker
            .execute_then(&command, |vhost| crate::storage::settle(shared, vhost));
        Box::pin(std::future::ready(outcome))
    }
}
