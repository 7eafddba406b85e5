//! Messages across nodes, the server's side: what other nodes ask of this one, and the
//! deliveries relayed to this node's clients (the vhosts' work for other nodes is sent by
//! [`crate::queues::effects`]).
//!
//! As the client's node: forwards publishes (a publisher confirm waits for the queue's node to
//! have the message durably), sends acks of relayed deliveries back, and writes relayed
//! deliveries to its clients (see `VHost::accept_delivery`).
//! As the queue's node: enqueues forwarded publishes and answers `Published` once they are
//! durable, serves other nodes' consumers through stand-in channels whose [`Relay`] sends each
//! delivery to the client's node, and answers consume, cancel, get, purge and passive declare.

use crate::queues::effects;
use crate::storage::MetaGuard;
use crate::Shared;
use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use warren_broker::error::AmqpError;
use warren_broker::message::Message;
use warren_broker::queue::ChannelKey;
use warren_broker::relay::{Delivery, Relay};
use warren_broker::vhost::GetResult;
use warren_cluster::messaging::{self, Data, Deliver, Got, Handler, Messaging, Request, Response};
use warren_cluster::Cluster;

mod ask;
pub use ask::{
    applied_everywhere, ask_running_peers, call, declared_there, execute_everywhere,
    home_node_down, reachable_home, CATCH_UP_TIMEOUT,
};

/// A stand-in's basic.get message, as its client's node is answered.
pub fn got_for_client(d: &Delivery) -> Got {
    Got {
        tag: d.tag,
        redelivered: d.redelivered,
        no_ack: d.no_ack,
        message_count: d.message_count,
        exchange: d.message.exchange.to_vec(),
        routing_key: d.message.routing_key.to_vec(),
        properties: d.properties.to_vec(),
        body: d.message.body.to_vec(),
    }
}

/// A forwarded publish taken from a peer, not answered yet.
struct Forward {
    epoch: u64,
    seq: u64,
    /// The (log, index) appends it waits for.
    waits: Vec<crate::durability::Wait>,
    refused: bool,
}

/// Forwarded publishes taken from one peer, answered in order once durable.
#[derive(Default)]
struct Taken {
    pending: VecDeque<Forward>,
}

/// This node's answers to what other nodes send.
pub struct Peers {
    shared: Weak<Shared>,
    taken: Mutex<HashMap<u64, Taken>>,
    /// Client channels of this node whose outbox went over the bound while a peer relayed
    /// deliveries to them, by (peer, vhost, channel): that peer's stand-in was told to hold
    /// them, and is told to go on once the outbox drained.
    congested: Mutex<HashSet<(u64, String, u64)>>,
    /// Wakes the watch over `congested` when it gains its first entry.
    congested_added: tokio::sync::Notify,
}

/// How often a congested client channel is looked at until it drained: it waits for a slow
/// socket, so a few milliseconds more do not matter, and nothing polls while none is.
const CONGESTION_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Makes this node serve other nodes' requests; call once the node's [`Shared`] exists.
pub fn install(shared: &Arc<Shared>) {
    let Some(cluster) = &shared.cluster else {
        return;
    };
    let peers = Arc::new(Peers {
        shared: Arc::downgrade(shared),
        taken: Mutex::new(HashMap::new()),
        congested: Mutex::new(HashSet::new()),
        congested_added: tokio::sync::Notify::new(),
    });
    cluster.messaging().set_handler(peers.clone());
    let watching = peers.clone();
    tokio::spawn(async move {
        loop {
            watching.congested_added.notified().await;
            loop {
                tokio::time::sleep(CONGESTION_POLL).await;
                let Some(shared) = watching.shared.upgrade() else {
                    return;
                };
                if watching.release_drained(&shared) == 0 {
                    break;
                }
            }
        }
    });
    // Forwards waiting for this node's WAL are answered as it syncs.
    let mut durable = shared.durability.subscribe();
    tokio::spawn(async move {
        while durable.changed().await.is_ok() {
            let Some(shared) = peers.shared.upgrade() else {
                return;
            };
            peers.answer_published(&shared);
        }
    });
}

impl Peers {
    /// Sends each peer `Published` for the forwards now durable, in order.
    fn answer_published(&self, shared: &Shared) {
        let Some(cluster) = &shared.cluster else {
            return;
        };
        let mut taken = self.taken.lock().expect("taken lock");
        for (peer, t) in taken.iter_mut() {
            let mut answers: Vec<(u64, u64, Vec<u64>)> = Vec::new();
            while let Some(Forward {
                epoch,
                seq,
                waits,
                refused,
            }) = t.pending.front()
            {
                let refused_there = shared.durability.any_refused(waits);
                if !*refused
                    && !refused_there
                    && !shared.durability.has_failed()
                    && !shared.durability.all_durable(waits)
                {
                    break;
                }
                if refused_there {
                    shared.durability.forget_refusal(waits);
                }
                let refused = *refused || refused_there || shared.durability.has_failed();
                match answers.last_mut() {
                    Some((e, upto, rejected)) if e == epoch => {
                        *upto = *seq;
                        if refused {
                            rejected.push(*seq);
                        }
                    }
                    _ => answers.push((*epoch, *seq, if refused { vec![*seq] } else { vec![] })),
                }
                t.pending.pop_front();
            }
            for (epoch, upto, rejected) in answers {
                cluster.messaging().send(
                    *peer,
                    &Data::Published {
                        epoch,
                        upto,
                        rejected,
                    },
                );
            }
        }
    }

    fn forwarded(&self, shared: &Shared, from: u64, data: Data) {
        let Data::Publish {
            epoch,
            seq,
            vhost,
            queues,
            exchange,
            routing_key,
            properties,
            body,
        } = data
        else {
            return;
        };
        let message = Arc::new(messaging::message(exchange, routing_key, properties, body));
        // Planted for the checker to catch, tests only: skip the enqueue, confirm anyway.
        let planted = crate::node::fault_injection::confirms_without_storing(shared);
        // A vhost this node does not know (its metadata lags, or it was deleted) stores
        // nothing: refused, so the publisher gets a nack rather than a confirm.
        let mut refused = !planted;
        let mut waits = Vec::new();
        if let Some(v) = shared.broker.vhost(&vhost).filter(|_| !planted) {
            let now = shared.broker.now_ms();
            let mut v = v.lock().expect("vhost lock");
            let outcome = v.enqueue_forwarded(&queues, message, now);
            refused = outcome.rejected;
            // Quorum queues among them: confirmed once their groups applied it.
            let forwarder = Some(crate::queues::quorum::peers::forward_channel(from));
            let carried = effects::carry_out(shared, &mut v, forwarder);
            match carried.stored {
                Ok(w) => waits = w,
                Err(_) => refused = true,
            }
            waits.extend(carried.sent.waits);
            refused |= carried.sent.failed;
        }
        self.taken
            .lock()
            .expect("taken lock")
            .entry(from)
            .or_default()
            .pending
            .push_back(Forward {
                epoch,
                seq,
                waits,
                refused,
            });
        self.answer_published(shared);
    }

    fn answer(&self, shared: &Arc<Shared>, from: u64, epoch: u64, id: u64, request: Request) {
        let cluster = shared.cluster.as_ref().expect("peers exist in clusters");
        let messaging = cluster.messaging();
        let node: Arc<str> = cluster
            .member_name(from)
            .unwrap_or_else(|| format!("node-{from}"))
            .into();
        let vhost_name = match &request {
            Request::Applied { index } => {
                let (index, cluster, messaging) = (*index, cluster.clone(), messaging.clone());
                tokio::spawn(async move {
                    let result = if cluster.wait_applied(index, CATCH_UP_TIMEOUT).await {
                        Ok(Response::Done)
                    } else {
                        Err((
                            warren_protocol::constants::INTERNAL_ERROR,
                            format!("node has not applied metadata entry {index} yet"),
                        ))
                    };
                    messaging.send(from, &Data::Answer { id, result });
                });
                return;
            }
            Request::QueueStats { vhost } => {
                let queues = crate::queue_stats::hosted_here(shared, vhost.as_deref());
                let result = Ok(Response::QueueStats { queues });
                messaging.send(from, &Data::Answer { id, result });
                return;
            }
            Request::Clients { ask } => {
                let result = crate::management::answer_clients(shared, ask);
                messaging.send(from, &Data::Answer { id, result });
                return;
            }
            Request::Node => {
                let result = Ok(Response::Node {
                    node: crate::management::node_json(shared),
                });
                messaging.send(from, &Data::Answer { id, result });
                return;
            }
            Request::Consume { vhost, .. }
            | Request::Cancel { vhost, .. }
            | Request::Get { vhost, .. }
            | Request::Purge { vhost, .. }
            | Request::Declare { vhost, .. } => vhost.clone(),
        };
        let Some(shared_vhost) = shared.broker.vhost(&vhost_name) else {
            let e = AmqpError::not_found(format!("no vhost '{vhost_name}'"));
            messaging.send(
                from,
                &Data::Answer {
                    id,
                    result: Err((e.code, e.text)),
                },
            );
            return;
        };
        let now = shared.broker.now_ms();
        let relay = || -> Arc<dyn Relay> {
            Arc::new(StandIn {
                messaging: messaging.clone(),
                peer: from,
                epoch,
                vhost: vhost_name.clone(),
            })
        };
        let mut v = MetaGuard {
            vhost: shared_vhost.lock().expect("vhost lock"),
            shared,
        };
        let request = match self.shared.upgrade() {
            Some(arc) => {
                match crate::queues::quorum::peers::answer(
                    &arc,
                    &mut v,
                    from,
                    id,
                    node.clone(),
                    relay,
                    request,
                ) {
                    Some(request) => request,
                    None => return,
                }
            }
            None => request,
        };
        let mut kick = None;
        let result: Result<Response, AmqpError> = match request {
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
                global_prefetch,
                ..
            } => {
                v.open_stand_in(channel, conn, number, &user, node.clone(), relay());
                v.set_stand_in_prefetch(channel, prefetch.into(), global_prefetch.into(), now);
                let r = v.basic_consume(channel, &queue, &tag, no_ack, exclusive, arguments, now);
                if r.is_ok() {
                    kick = Some(queue);
                }
                r.map(|_| Response::Done)
            }
            Request::Cancel { channel, tag, .. } => {
                if v.has_channel(channel) {
                    v.basic_cancel(channel, &tag, now);
                }
                Ok(Response::Done)
            }
            Request::Get {
                channel,
                conn,
                number,
                user,
                queue,
                no_ack,
                ..
            } => {
                v.open_stand_in(channel, conn, number, &user, node.clone(), relay());
                v.basic_get(channel, &queue, no_ack, now).map(|r| match r {
                    GetResult::Relayed(d) => Response::Got {
                        got: Some(got_for_client(&d)),
                    },
                    _ => Response::Got { got: None },
                })
            }
            Request::Purge { conn, queue, .. } => v
                .queue_purge(conn, &queue)
                .map(|count| Response::Purged { count }),
            Request::Declare { conn, queue, .. } => v
                .queue_declare(
                    conn,
                    &queue,
                    true,
                    false,
                    false,
                    false,
                    Default::default(),
                    now,
                )
                .map(|ok| Response::Declared {
                    messages: ok.message_count,
                    consumers: ok.consumer_count,
                }),
            Request::QueueStats { .. }
            | Request::Applied { .. }
            | Request::Clients { .. }
            | Request::Node => {
                unreachable!("answered above")
            }
        };
        messaging.send(
            from,
            &Data::Answer {
                id,
                result: result.map_err(|e| (e.code, e.text)),
            },
        );
        // Deliveries only after the consume-ok, on the same link.
        if let Some(queue) = kick {
            v.kick(&queue, now);
        }
    }

    fn accept(&self, shared: &Shared, from: u64, d: Deliver) {
        let Some(cluster) = &shared.cluster else {
            return;
        };
        let Some(v) = shared.broker.vhost(&d.vhost) else {
            return;
        };
        let node: Arc<str> = cluster
            .member_name(from)
            .unwrap_or_else(|| format!("node-{from}"))
            .into();
        let channel = d.channel;
        let mut v = v.lock().expect("vhost lock");
        v.accept_delivery(&node, relayed(d), None);
        let congested = v.is_client_congested(channel);
        effects::carry_out(shared, &mut v, None);
        let vhost = v.name.clone();
        drop(v);
        if congested {
            let told = (from, vhost, channel);
            let mut set = self.congested.lock().expect("congested lock");
            if set.insert(told.clone()) {
                if set.len() == 1 {
                    self.congested_added.notify_one();
                }
                drop(set);
                self.tell_congested(cluster, told, true);
            }
        }
    }

    /// Tells the stand-ins of client channels whose outbox drained to go on; how many are
    /// still congested.
    fn release_drained(&self, shared: &Shared) -> usize {
        let Some(cluster) = &shared.cluster else {
            return 0;
        };
        let told: Vec<(u64, String, u64)> = self
            .congested
            .lock()
            .expect("congested lock")
            .iter()
            .cloned()
            .collect();
        let mut still = 0;
        for t in told {
            let congested = shared
                .broker
                .vhost(&t.1)
                .is_some_and(|v| v.lock().expect("vhost lock").is_client_congested(t.2));
            if congested {
                still += 1;
                continue;
            }
            self.congested.lock().expect("congested lock").remove(&t);
            self.tell_congested(cluster, t, false);
        }
        still
    }

    fn tell_congested(
        &self,
        cluster: &Cluster,
        (peer, vhost, channel): (u64, String, u64),
        congested: bool,
    ) {
        let messaging = cluster.messaging();
        let epoch = messaging.epoch(peer);
        messaging.send(
            peer,
            &Data::Congested {
                epoch,
                vhost,
                channel,
                congested,
            },
        );
    }
}

/// A relayed delivery as the client's vhost takes it.
fn relayed(d: Deliver) -> Delivery {
    Delivery {
        channel: d.channel,
        consumer_tag: d.consumer_tag,
        tag: d.tag,
        redelivered: d.redelivered,
        no_ack: d.no_ack,
        message_count: 0,
        message: Arc::new(bare_message(
            d.exchange,
            d.routing_key,
            d.properties.clone(),
            d.body,
        )),
        properties: d.properties,
    }
}

/// A message to encode for a client, whose properties need not be read here.
pub fn bare_message(
    exchange: Bytes,
    routing_key: Bytes,
    properties: Bytes,
    body: Bytes,
) -> Message {
    Message {
        exchange,
        routing_key,
        properties,
        body,
        persistent: false,
        priority: 0,
        expiration_ms: None,
        bcc: Vec::new(),
    }
}

/// A basic.get's answer as the client's vhost takes it.
pub fn got(channel: ChannelKey, g: Got) -> Delivery {
    let properties = Bytes::from(g.properties);
    Delivery {
        channel,
        consumer_tag: Bytes::new(),
        tag: g.tag,
        redelivered: g.redelivered,
        no_ack: g.no_ack,
        message_count: g.message_count,
        message: Arc::new(bare_message(
            Bytes::from(g.exchange),
            Bytes::from(g.routing_key),
            properties.clone(),
            Bytes::from(g.body),
        )),
        properties,
    }
}

impl Handler for Peers {
    fn data(&self, from: u64, data: Data) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        // Settlements a peer's message led to (its clients' acks of a stand-in's deliveries)
        // are proposed when it is handled: no connection read ends here to do it.
        let _flush = crate::queues::quorum::client::FlushSettlesOnDrop(&shared);
        let now = shared.broker.now_ms();
        match data {
            Data::Publish { .. } => self.forwarded(&shared, from, data),
            Data::Published {
                epoch,
                upto,
                rejected,
            } => shared
                .durability
                .remote_progress(from, epoch, upto, &rejected),
            Data::Call { epoch, id, request } => self.answer(&shared, from, epoch, id, request),
            Data::Deliver(d) => self.accept(&shared, from, d),
            Data::Cancelled {
                vhost,
                channel,
                consumer_tag,
                ..
            } => {
                if let Some(v) = shared.broker.vhost(&vhost) {
                    v.lock()
                        .expect("vhost lock")
                        .remote_consumer_cancelled(channel, &consumer_tag);
                }
            }
            Data::Settle {
                vhost,
                channel,
                op,
                tags,
                ..
            } => {
                if let Some(v) = shared.broker.vhost(&vhost) {
                    let mut v = MetaGuard {
                        vhost: v.lock().expect("vhost lock"),
                        shared: &shared,
                    };
                    v.settle_stand_in(channel, op, &tags, now);
                }
            }
            Data::Close { vhost, channel, .. } => {
                if let Some(v) = shared.broker.vhost(&vhost) {
                    let mut v = MetaGuard {
                        vhost: v.lock().expect("vhost lock"),
                        shared: &shared,
                    };
                    if v.has_channel(channel) {
                        v.channel_close(channel, now);
                    }
                }
            }
            Data::Qos {
                vhost,
                channel,
                channel_prefetch,
                ..
            } => {
                if let Some(v) = shared.broker.vhost(&vhost) {
                    let mut v = MetaGuard {
                        vhost: v.lock().expect("vhost lock"),
                        shared: &shared,
                    };
                    v.set_stand_in_channel_prefetch(channel, channel_prefetch, now);
                }
            }
            Data::Congested {
                vhost,
                channel,
                congested,
                ..
            } => {
                if let Some(v) = shared.broker.vhost(&vhost) {
                    let mut v = MetaGuard {
                        vhost: v.lock().expect("vhost lock"),
                        shared: &shared,
                    };
                    v.set_stand_in_congested(channel, congested, now);
                }
            }
            Data::Reset { .. } | Data::Broken { .. } | Data::Answer { .. } => {}
        }
    }

    fn client_side_broken(&self, peer: u64, ended_epoch: u64) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        shared.durability.remote_failed(peer, ended_epoch);
        let Some(node) = shared.cluster.as_ref().and_then(|c| c.member_name(peer)) else {
            return;
        };
        for (_, v) in shared.broker.vhosts() {
            v.lock().expect("vhost lock").remote_node_lost(&node);
        }
    }

    fn server_side_broken(&self, peer: u64) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let Some(node) = shared.cluster.as_ref().and_then(|c| c.member_name(peer)) else {
            return;
        };
        let now = shared.broker.now_ms();
        for (_, v) in shared.broker.vhosts() {
            let mut v = MetaGuard {
                vhost: v.lock().expect("vhost lock"),
                shared: &shared,
            };
            v.close_stand_ins(&node, now);
        }
    }
}

/// Sends a stand-in channel's deliveries to its client's node.
struct StandIn {
    messaging: Arc<Messaging>,
    peer: u64,
    /// The epoch of the client's node when the stand-in was opened: deliveries of an epoch it
    /// has left are dropped there (and requeued here when it says so).
    epoch: u64,
    vhost: String,
}

impl Relay for StandIn {
    fn deliver(&self, d: Delivery) {
        self.messaging.send(
            self.peer,
            &Data::Deliver(Deliver {
                epoch: self.epoch,
                vhost: self.vhost.clone(),
                channel: d.channel,
                consumer_tag: d.consumer_tag,
                tag: d.tag,
                redelivered: d.redelivered,
                no_ack: d.no_ack,
                exchange: d.message.exchange.clone(),
                routing_key: d.message.routing_key.clone(),
                properties: d.properties,
                body: d.message.body.clone(),
            }),
        );
    }

    fn cancelled(&self, channel: ChannelKey, consumer_tag: &[u8]) {
        self.messaging.send(
            self.peer,
            &Data::Cancelled {
                epoch: self.epoch,
                vhost: self.vhost.clone(),
                channel,
                consumer_tag: Bytes::copy_from_slice(consumer_tag),
            },
        );
    }

    fn is_congested(&self) -> bool {
        self.messaging.is_congested(self.peer)
    }
}
