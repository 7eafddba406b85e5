//! Finding the other members by the seeds of this start when the addresses the cluster
//! stored for them reach nobody.
//!
//! A node dials its peers at the addresses in the replicated member table. When every node of
//! a cluster comes back under new addresses at once (a StatefulSet rescheduled, VMs given new
//! IPs), each one's table holds only the old ones and no node can reach another to tell it the
//! new address. The seeds of this start say where the nodes are now, but not which node is
//! which: so each seed is asked who it is ([`Transport::identify`]), and a member found that
//! way is dialled at the address it advertises. Once links are up, each node re-registers its
//! new address through the metadata log (`MetadataGroup::register_if_needed`), and the table
//! follows.
//!
//! [`Transport::identify`]: crate::transport::Transport::identify

use crate::address::HostPort;
use crate::Cluster;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How often seeds whose node is not linked are asked again.
const ASK_INTERVAL: Duration = Duration::from_secs(2);

pub(crate) fn spawn(cluster: Arc<Cluster>, seeds: Vec<HostPort>) {
    if seeds.is_empty() {
        return;
    }
    tokio::spawn(async move {
        // What each seed said it is, so a seed whose node is linked is not asked again.
        let mut answered: HashMap<HostPort, u64> = HashMap::new();
        let mut said: HashMap<HostPort, String> = HashMap::new();
        loop {
            tokio::time::sleep(ASK_INTERVAL).await;
            for seed in &seeds {
                if let Some(id) = answered.get(seed) {
                    if *id == cluster.me.id || cluster.transport.is_up(*id) {
                        continue;
                    }
                }
                let hello = match cluster.transport.identify(seed).await {
                    Ok(hello) => hello,
                    Err(e) => {
                        if said.get(seed) != Some(&e) {
                            tracing::debug!(%seed, "seed not identified: {e}");
                            said.insert(seed.clone(), e);
                        }
                        continue;
                    }
                };
                let info = hello.info;
                answered.insert(seed.clone(), info.id);
                said.remove(seed);
                if info.id == cluster.me.id {
                    continue;
                }
                let (known, homonym) = {
                    let status = cluster.status.lock().expect("status lock");
                    let known = status.voters.contains(&info.id)
                        || status.members.contains_key(&info.id)
                        || cluster.seeds.contains_key(&info.id);
                    let homonym = status
                        .members
                        .values()
                        .find(|m| m.name == info.name && m.id != info.id)
                        .map(|m| m.id);
                    (known, homonym)
                };
                if let Some(other) = homonym {
                    tracing::error!(
                        %seed,
                        name = %info.name,
                        id = info.id,
                        member = other,
                        "seed {seed} is a node named {} with id {}, but the cluster's member of \
                         that name has id {other}: two nodes share a name, or the node lost its \
                         data directory (forget the old member first)",
                        info.name,
                        info.id
                    );
                    continue;
                }
                if known && !cluster.transport.is_up(info.id) {
                    tracing::info!(
                        %seed,
                        node = %info.name,
                        id = info.id,
                        advertise = %info.cluster,
                        "found a member at a seed address; dialling it"
                    );
                    cluster.transport.connect(info.id, info.cluster);
                }
            }
        }
    });
}
