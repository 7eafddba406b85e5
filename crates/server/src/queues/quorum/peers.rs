//! Quorum queues for nodes that are not among a queue's members: such a node reaches the queue
//! as a classic queue hosted by its home (its first member), so its publishes are forwarded
//! there and its consumers are served through stand-in channels there. This is the member's
//! side: a forwarded request for a quorum queue becomes a request to the group like a local
//! channel's ([`crate::queues::quorum::client`]), answered once its entry is applied here; deliveries
//! to a stand-in's consumer are relayed as a classic queue's are.

use crate::queues::quorum::client::{self, Wait};
use crate::Shared;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use warren_broker::error::AmqpError;
use warren_broker::quorum::ConsumerSpec;
use warren_broker::relay::{Delivery, Relay};
use warren_broker::vhost::VHost;
use warren_cluster::messaging::{Data, Messaging, Request, Response};
use warren_cluster::replicas::group_id;

/// The pseudo channel a peer's forwarded publishes are confirmed on (channel keys are
/// `node id << 40 | ...`, far below).
pub fn forward_channel(peer: u64) -> u64 {
    u64::MAX - peer
}

/// Answers `request` if it is for a quorum queue this node is a member of; gives it back
/// otherwise.
#[allow(clippy::too_many_arguments)]
pub fn answer(
    shared: &Arc<Shared>,
    v: &mut VHost,
    from: u64,
    id: u64,
    node: Arc<str>,
    relay: impl FnOnce() -> Arc<dyn Relay>,
    request: Request,
) -> Option<Request> {
    let messaging = shared.cluster.as_ref()?.messaging().clone();
    let group = match &request {
        Request::Consume { queue, .. }
        | Request::Get { queue, .. }
        | Request::Purge { queue, .. }
        | Request::Declare { queue, .. } => v.quorum_log(queue),
        Request::Cancel { channel, tag, .. } => v.quorum_consumer_log(*channel, tag),
        _ => None,
    }
    .map(group_id);
    let Some(group) = group else {
        return Some(request);
    };
    let reply = move |m: &Messaging, result: Result<Response, AmqpError>| {
        m.send(
            from,
            &Data::Answer {
                id,
                result: result.map_err(|e| (e.code, e.text)),
            },
        );
    };
    let shared = shared.clone();
    match request {
        Request::Consume {
            channel,
            conn,
            number,
            user,
            queue,
            tag,
            no_ack,
            exclusive,
            arguments,
            prefetch,
            ..
        } => {
            v.open_stand_in(channel, conn, number, &user, node, relay());
            let consume = match v.consume_quorum(channel, &queue, &tag, &arguments) {
                Ok(c) => c,
                Err(e) => {
                    reply(&messaging, Err(e));
                    return None;
                }
            };
            let spec = ConsumerSpec {
                credit: prefetch.into(),
                priority: consume.priority,
                no_ack,
                exclusive,
            };
            let command = client::checkout(&shared, channel, &consume.tag, spec);
            let wait = Wait::Checkout {
                group,
                channel,
                tag: consume.tag.clone(),
            };
            // Answered from the replica, before the deliveries it relays next on the link.
            let m = messaging.clone();
            let on_applied: client::OnApplied = Box::new(move |_, _| reply(&m, Ok(Response::Done)));
            let vhost = shared.broker.vhost(&v.name);
            tokio::spawn(async move {
                let tag = consume.tag;
                let r = client::request(shared, group, wait, Some(on_applied), command);
                if let Err(e) = r.await {
                    if let Some(v) = vhost {
                        v.lock()
                            .expect("vhost lock")
                            .forget_remote_consumer(channel, &tag);
                    }
                    reply(&messaging, Err(e));
                }
            });
        }
        Request::Cancel { channel, tag, .. } => {
            let command = client::cancel(&shared, channel, &tag);
            let wait = Wait::Cancel {
                group,
                channel,
                tag,
            };
            tokio::spawn(async move {
                let r = client::request(shared, group, wait, None, command).await;
                reply(&messaging, r.map(|_| Response::Done));
            });
        }
        Request::Get {
            channel,
            conn,
            number,
            user,
            no_ack,
            ..
        } => {
            v.open_stand_in(channel, conn, number, &user, node, relay());
            v.note_quorum_get(channel, group - 1);
            let command = client::dequeue(&shared, channel, no_ack);
            let wait = Wait::Get { group, channel };
            let m = messaging.clone();
            let on_applied: client::OnApplied = Box::new(move |_, d: Option<Delivery>| {
                reply(
                    &m,
                    Ok(Response::Got {
                        got: d.as_ref().map(crate::peers::got_for_client),
                    }),
                )
            });
            tokio::spawn(async move {
                let r = client::request(shared, group, wait, Some(on_applied), command);
                if let Err(e) = r.await {
                    reply(&messaging, Err(e));
                }
            });
        }
        Request::Purge { .. } => {
            tokio::spawn(async move {
                let r = client::purge(shared, group).await;
                reply(&messaging, r.map(|count| Response::Purged { count }));
            });
        }
        Request::Declare { .. } => {
            let info = shared.quorum.replica(group);
            let (messages, consumers) = info.map_or((0, 0), |i| {
                (
                    i.ready.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
                    i.consumers.load(Ordering::Relaxed).min(u32::MAX as u64) as u32,
                )
            });
            reply(
                &messaging,
                Ok(Response::Declared {
                    messages,
                    consumers,
                }),
            );
        }
        Request::QueueStats { .. }
        | Request::Applied { .. }
        | Request::Clients { .. }
        | Request::Node => {}
    }
    None
}
