//! A single node's topology: a change is applied here by [`Broker::execute_then`] and, with the
//! vhost still locked, what it made durable is appended to the metadata journal and synced
//! ([`crate::storage::settle`]), so the journal's order is the order of the changes and a
//! declare-ok goes out only once the declare survives kill -9. A journal that cannot be written
//! answers 541 INTERNAL_ERROR, the change staying in memory as it did before the write.
//! Users, vhosts, grants, policies and limits ([`Command::Meta`]) are applied, then their
//! record journaled, one change at a time.
//!
//! [`Broker::execute_then`]: warren_broker::broker::Broker::execute_then

use super::{Answer, Topology};
use crate::Shared;
use std::sync::{Arc, Mutex};
use warren_broker::command::Command;

/// Held across a [`Command::Meta`]'s apply and its journal append, so that concurrent changes
/// reach the journal in the order they were made (a user's two quick password changes are
/// recovered as the last one).
static META_ORDER: Mutex<()> = Mutex::new(());

pub struct Journal {
    pub shared: Arc<Shared>,
}

impl Topology for Journal {
    fn change(&self, command: Command) -> Answer {
        let shared = &self.shared;
        if let Command::Meta { record } = &command {
            // A user, vhost, grant or policy: refused before it is made once storage failed,
            // so that memory never holds what a restart would lose.
            let _order = META_ORDER.lock().expect("meta order lock");
            let outcome = crate::storage::refuse_if_failed(shared)
                .and_then(|()| shared.broker.execute(&command))
                .and_then(|done| {
                    crate::storage::append(shared, vec![record.clone()]).map(|()| done)
                });
            return Box::pin(std::future::ready(outcome));
        }
        let outcome = shared
            .broker
            .execute_then(&command, |vhost| crate::storage::settle(shared, vhost));
        Box::pin(std::future::ready(outcome))
    }

    fn is_replicated(&self) -> bool {
        false
    }
}
