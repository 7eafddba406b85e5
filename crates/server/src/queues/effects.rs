//! What a vhost's calls leave to do with messages, carried out in one place. The vhost is a
//! state machine: a publish, an ack, a delivery relayed back or a tick changes it and records
//! the work that follows, which the caller hands here before it releases the vhost's lock:
//! - [`store`]: appends and releases for the storage engine, under the lock, so each log gets
//!   its appends in index order; an append's confirm waits for its fsync.
//! - [`send`]: the work for queues that are not this vhost's own, in the order it was made:
//!   forwards to a queue's node, proposals and settlements to a quorum queue's group, appends
//!   and credit to a stream's writer and readers, settlements, closes and prefetch relayed to
//!   other nodes' stand-ins.
//!
//! [`carry_out`] does both. A caller that must not hold the vhost's lock while it proposes to
//! a Raft group (a quorum replica applying entries on the groups' thread) calls [`store_now`]
//! under the lock and sends what it leaves after it. A transaction's commit takes the
//! settlements of quorum queue deliveries out first ([`take_quorum_settles`]), to propose them
//! and wait until they are applied before tx.commit-ok.

use crate::durability::Wait;
use crate::storage::NotStored;
use crate::Shared;
use warren_broker::queue::ChannelKey;
use warren_broker::relay::RemoteEffect;
use warren_broker::vhost::VHost;
use warren_cluster::messaging::Data;

/// What carrying out a vhost's work came to, for a publisher.
#[derive(Debug)]
pub struct Carried {
    /// What the storage engine took ([`store`]).
    pub stored: Result<Vec<Wait>, NotStored>,
    /// What the queues elsewhere took ([`send`]).
    pub sent: Sent,
}

impl Carried {
    /// Every wait a publisher confirm needs, or `Err` when a queue refused the message (a
    /// failed append, a forward with no link): the publisher gets a nack.
    pub fn waits(self) -> Result<Vec<Wait>, NotStored> {
        let mut waits = self.stored?;
        if self.sent.failed {
            return Err(NotStored);
        }
        waits.extend(self.sent.waits);
        Ok(waits)
    }
}

/// What sending a vhost's work to queues elsewhere came to, for a publisher.
#[derive(Debug, Default)]
pub struct Sent {
    /// What a publisher confirm must wait for: one entry per forward, proposal or append.
    pub waits: Vec<Wait>,
    /// A forward could not be sent (the link to the queue's node is down) or a stream took
    /// nothing: nack.
    pub failed: bool,
    /// A peer whose link has too much waiting: the publisher waits until it drains.
    pub congested: Option<u64>,
}

/// Carries out all the work `vhost` recorded (call with it still locked); `publisher` is the
/// channel whose publish this is (see [`send`]).
pub fn carry_out(shared: &Shared, vhost: &mut VHost, publisher: Option<ChannelKey>) -> Carried {
    let stored = store(shared, vhost);
    let sent = if vhost.has_remote() {
        let effects = vhost.take_remote();
        send(shared, &vhost.name, effects, publisher)
    } else {
        Sent::default()
    };
    Carried { stored, sent }
}

/// Carries out the storage work `vhost` recorded, in order, and pages out the queues that
/// took stored messages; the appends a publisher confirm waits for, or `Err` when one failed.
fn store(shared: &Shared, vhost: &mut VHost) -> Result<Vec<Wait>, NotStored> {
    let stored = if vhost.has_store_ops() {
        crate::storage::apply_store_ops(shared, vhost.take_store_ops())
    } else {
        Ok(Vec::new())
    };
    vhost.page_out();
    stored
}

/// The settlements of quorum queue deliveries `vhost` recorded, taken out of its work for
/// queues elsewhere (the rest stays, in order, for [`carry_out`]): a transaction's commit
/// proposes them itself and waits until they are applied
/// ([`crate::queues::quorum::client::settle_applied`]).
pub fn take_quorum_settles(vhost: &mut VHost) -> Vec<RemoteEffect> {
    vhost.take_quorum_settles()
}

/// The storage work `vhost` recorded carried out now (call under its lock), and its work for
/// queues elsewhere taken, to send once the lock is released.
pub fn store_now(shared: &Shared, vhost: &mut VHost) -> SendLater {
    let _ = store(shared, vhost);
    SendLater(vhost.has_remote().then(|| vhost.take_remote()))
}

/// A vhost's work for queues elsewhere, taken under its lock, sent after it.
#[must_use = "the work is lost unless it is sent"]
pub struct SendLater(Option<Vec<RemoteEffect>>);

impl SendLater {
    pub fn send(self, shared: &Shared, vhost: &str) {
        if let Some(effects) = self.0 {
            send(shared, vhost, effects, None);
        }
    }
}

/// Carries out a vhost's work for queues elsewhere, in order; `publisher` is the channel whose
/// publish this is: its publishes to quorum queues are numbered, and the groups answer each
/// (confirms, transactions and flow control wait on those answers).
fn send(
    shared: &Shared,
    vhost: &str,
    effects: Vec<RemoteEffect>,
    publisher: Option<ChannelKey>,
) -> Sent {
    let mut sent = Sent::default();
    let effects =
        super::stream::carry_out(shared, vhost, effects, &mut sent.waits, &mut sent.failed);
    let Some(cluster) = &shared.cluster else {
        return sent;
    };
    let messaging = cluster.messaging();
    for effect in effects {
        match effect {
            RemoteEffect::Propose { queues, message } => {
                let waits = super::quorum::client::publish(shared, queues, &message, publisher);
                sent.waits.extend(waits);
            }
            RemoteEffect::QuorumSettle {
                log,
                channel,
                consumer_tag,
                op,
                msg_ids,
            } => super::quorum::client::settle(shared, log, channel, &consumer_tag, op, msg_ids),
            RemoteEffect::QuorumChannelDown { log, channel } => {
                super::quorum::client::channel_down(shared, log, channel)
            }
            RemoteEffect::Forward {
                node,
                queues,
                message,
            } => {
                let forwarded = cluster
                    .member_id(&node)
                    .and_then(|peer| messaging.publish(peer, vhost, queues, &message));
                match forwarded {
                    Some(f) => {
                        sent.waits
                            .push(shared.durability.forwarded(f.peer, f.epoch, f.seq));
                        if messaging.is_congested(f.peer) {
                            sent.congested = Some(f.peer);
                        }
                    }
                    None => sent.failed = true,
                }
            }
            RemoteEffect::Settle {
                node,
                channel,
                op,
                tags,
            } => {
                if let Some(peer) = cluster.member_id(&node) {
                    let epoch = messaging.epoch(peer);
                    messaging.send(
                        peer,
                        &Data::Settle {
                            epoch,
                            vhost: vhost.to_string(),
                            channel,
                            op,
                            tags,
                        },
                    );
                }
            }
            RemoteEffect::Close { node, channel } => {
                if let Some(peer) = cluster.member_id(&node) {
                    let epoch = messaging.epoch(peer);
                    messaging.send(
                        peer,
                        &Data::Close {
                            epoch,
                            vhost: vhost.to_string(),
                            channel,
                        },
                    );
                }
            }
            RemoteEffect::Qos {
                node,
                channel,
                channel_prefetch,
            } => {
                if let Some(peer) = cluster.member_id(&node) {
                    let epoch = messaging.epoch(peer);
                    messaging.send(
                        peer,
                        &Data::Qos {
                            epoch,
                            vhost: vhost.to_string(),
                            channel,
                            channel_prefetch,
                        },
                    );
                }
            }
            // Carried out above, on a single node as in a cluster.
            RemoteEffect::StreamAppend { .. }
            | RemoteEffect::StreamSettle { .. }
            | RemoteEffect::StreamCancel { .. } => {}
        }
    }
    sent
}
