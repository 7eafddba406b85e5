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
            // A policy may have given streams a new retention: their writers take it now.
            crate::queues::stream::reconfigure_changed(shared);
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

#[cfg(test)]
mod tests {
    use super::*;
    use warren_broker::broker::Broker;
    use warren_broker::definitions::MetaRecord;
    use warren_broker::users::Users;
    use warren_protocol::constants::PRECONDITION_FAILED;

    fn grant(user: &str, configure: &str) -> Command {
        Command::Meta {
            record: MetaRecord::SetPermissions {
                user: user.into(),
                vhost: "/".into(),
                configure: configure.into(),
                write: ".*".into(),
                read: ".*".into(),
            },
        }
    }

    /// What the management API's writes rely on: an accepted user or grant is applied and
    /// journaled (a restart replays it), a record the broker refuses is answered 406 and
    /// neither applied nor journaled.
    #[tokio::test]
    async fn a_meta_change_is_journaled_once_applied_and_a_refused_one_is_not() {
        let dir =
            std::env::temp_dir().join(format!("warren-topology-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = crate::node::config::ServerConfig {
            data_dir: dir.clone(),
            ..Default::default()
        };
        let meta_dir = config.meta_dir();
        let broker = Arc::new(Broker::new());
        let mut shared = Shared::standalone(config, broker.clone());
        let (journal, _) = warren_store::journal::Journal::open(&meta_dir).unwrap();
        Arc::get_mut(&mut shared).expect("not shared yet").journal =
            Some(std::sync::Mutex::new(journal));
        let topology = Journal {
            shared: shared.clone(),
        };
        let mut scratch = Users::default();
        scratch.add_user("ann", "secret", vec![]);
        let put = Command::Meta {
            record: MetaRecord::PutUser {
                name: "ann".into(),
                password_hash: scratch.password_hash("ann").unwrap(),
                tags: vec![],
            },
        };
        topology.change(put).await.unwrap();
        topology.change(grant("ann", "^ann-")).await.unwrap();
        let refused = topology.change(grant("ann", "(")).await.unwrap_err();
        assert_eq!(refused.code, PRECONDITION_FAILED, "{}", refused.text);
        let kept = |b: &Broker| {
            let users = b.users.read().unwrap();
            assert!(users.exists("ann"));
            let p = users.permissions("ann", "/").expect("the accepted grant");
            assert_eq!(p.configure.as_str(), "^ann-");
        };
        kept(&broker);
        drop((topology, shared));
        let restarted = Broker::new();
        crate::storage::recover(&meta_dir, &restarted).unwrap();
        kept(&restarted);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
