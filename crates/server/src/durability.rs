//! Publisher confirms for stored messages: a confirm goes out only once the WAL writer has
//! synced the message (the engine tells us per log, after each group commit).
//!
//! A publish forwarded to a queue on another node waits the same way, on a pseudo log per
//! (peer, epoch) whose index is the forward's number: the peer's `Published` answers advance
//! it, a refusal there or a broken link refuses it (the publisher gets a nack).

use std::sync::Mutex;
use tokio::sync::watch;
use warren_store::{DurabilityListener, Error};
use warren_store::{IdHashMap, IdHashSet};

/// What the WAL writer has made durable, per log, and a generation counter connections watch.
pub struct Durability {
    durable: Mutex<IdHashMap<u64, u64>>,
    remote: Mutex<Remote>,
    generation: watch::Sender<u64>,
    failed: std::sync::atomic::AtomicBool,
    /// Why the engine stopped, for the node to raise its storage alarm (the engine calls
    /// [`DurabilityListener::on_failure`] on its own thread, outside any runtime).
    failure: watch::Sender<Option<String>>,
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            durable: Mutex::new(IdHashMap::default()),
            remote: Mutex::new(Remote::default()),
            generation: watch::channel(0).0,
            failed: Default::default(),
            failure: watch::channel(None).0,
        }
    }
}

impl Durability {
    pub fn is_durable(&self, log: u64, index: u64) -> bool {
        self.durable
            .lock()
            .expect("durability lock")
            .get(&log)
            .is_some_and(|d| *d >= index)
    }

    /// Whether every (log, index) in `waits` is durable.
    pub fn all_durable(&self, waits: &[(u64, u64)]) -> bool {
        let map = self.durable.lock().expect("durability lock");
        waits
            .iter()
            .all(|(log, index)| map.get(log).is_some_and(|d| d >= index))
    }

    /// The pseudo log a forward to `peer` in `epoch` waits on.
    pub fn remote_log(&self, peer: u64, epoch: u64) -> u64 {
        let mut r = self.remote.lock().expect("remote lock");
        if let Some(log) = r.logs.get(&(peer, epoch)) {
            return *log;
        }
        // Even and far above every store log id (queue logs are odd, the cluster's are small).
        r.next += 2;
        let log = REMOTE_LOGS + r.next;
        r.logs.insert((peer, epoch), log);
        log
    }

    /// The peer has every forward up to `upto` of this epoch; `rejected` ones were refused.
    pub fn remote_progress(&self, peer: u64, epoch: u64, upto: u64, rejected: &[u64]) {
        let log = self.remote_log(peer, epoch);
        if !rejected.is_empty() {
            let mut r = self.remote.lock().expect("remote lock");
            r.rejected.extend(rejected.iter().map(|seq| (log, *seq)));
        }
        self.on_durable_now(log, upto);
    }

    /// The epoch ended: its forwards not confirmed yet never will be.
    pub fn remote_failed(&self, peer: u64, epoch: u64) {
        let log = self.remote_log(peer, epoch);
        {
            let mut r = self.remote.lock().expect("remote lock");
            r.failed.insert(log);
            r.logs.remove(&(peer, epoch));
        }
        self.generation.send_modify(|g| *g += 1);
    }

    /// The next publish of `channel` to the quorum queue group `group`: the pseudo log and
    /// sequence number its confirm waits on. Each (channel, group) is a stream whose proposals
    /// the group applies in order, less those a leader change dropped.
    pub fn quorum_next(&self, channel: u64, group: u64) -> (u64, u64) {
        let mut guard = self.remote.lock().expect("remote lock");
        let r = &mut *guard;
        let next = &mut r.next;
        let stream = r.quorum.entry((channel, group)).or_insert_with(|| {
            *next += 2;
            Stream {
                log: QUORUM_STREAMS + *next,
                assigned: 0,
                confirmed: 0,
                answered: 0,
            }
        });
        r.stream_of_log.insert(stream.log, (channel, group));
        stream.assigned += 1;
        (stream.log, stream.assigned)
    }

    /// The group applied the publish `seq` of the stream (`rejected`: its queue refused it).
    /// Earlier ones not applied yet never will be, in this stream's order: they are refused.
    /// A stream not known here (closed since) is ignored.
    pub fn quorum_applied(&self, channel: u64, group: u64, seqs: &[(u64, bool)]) {
        let (log, upto) = {
            let mut r = self.remote.lock().expect("remote lock");
            let Some(stream) = r.quorum.get(&(channel, group)) else {
                return;
            };
            let (log, mut confirmed) = (stream.log, stream.confirmed);
            let mut refused = Vec::new();
            for &(seq, rejected) in seqs {
                // Late (after a refusal for a gap or a leader change): already answered.
                if seq <= confirmed {
                    continue;
                }
                refused.extend((confirmed + 1..seq).map(|s| (log, s)));
                if rejected {
                    refused.push((log, seq));
                }
                confirmed = seq;
            }
            r.rejected.extend(refused);
            let stream = r.quorum.get_mut(&(channel, group)).expect("found above");
            stream.confirmed = confirmed;
            stream.answered = stream.answered.max(confirmed);
            (log, confirmed)
        };
        self.on_durable_now(log, upto);
    }

    /// Refuses every publish of the streams to `group` not applied yet (its leader changed,
    /// so what the old one had not committed may be lost), or of one stream up to `upto`.
    pub fn quorum_abandon(&self, group: u64, channel: Option<u64>, upto: u64) {
        let mut r = self.remote.lock().expect("remote lock");
        let mut refused = Vec::new();
        for ((c, g), stream) in r.quorum.iter_mut() {
            if *g != group || channel.is_some_and(|ch| ch != *c) {
                continue;
            }
            let upto = if channel.is_some() {
                upto
            } else {
                stream.assigned
            };
            if upto > stream.confirmed {
                refused.extend((stream.confirmed + 1..=upto).map(|s| (stream.log, s)));
            }
            stream.answered = stream.answered.max(upto);
        }
        if refused.is_empty() {
            return;
        }
        r.rejected.extend(refused);
        drop(r);
        self.generation.send_modify(|g| *g += 1);
    }

    /// A channel closed: its streams' pseudo logs go. Returns the groups it published to.
    pub fn forget_quorum_channel(&self, channel: u64) -> Vec<u64> {
        let groups: Vec<u64>;
        let logs: Vec<u64> = {
            let mut r = self.remote.lock().expect("remote lock");
            let keys: Vec<(u64, u64)> = r
                .quorum
                .range((channel, 0)..=(channel, u64::MAX))
                .map(|(k, _)| *k)
                .collect();
            groups = keys.iter().map(|(_, g)| *g).collect();
            if keys.is_empty() {
                return groups;
            }
            let logs: Vec<u64> = keys
                .iter()
                .filter_map(|k| r.quorum.remove(k))
                .map(|s| s.log)
                .collect();
            for log in &logs {
                r.stream_of_log.remove(log);
            }
            let gone: std::collections::HashSet<u64> = logs.iter().copied().collect();
            r.rejected.retain(|(log, _)| !gone.contains(log));
            logs
        };
        if !logs.is_empty() {
            let mut map = self.durable.lock().expect("durability lock");
            for log in logs {
                map.remove(&log);
            }
        }
        groups
    }

    /// The group of quorum stream `log`, and how many of its publishes up to `newest` the group
    /// has not answered yet (applied, or refused by a leader change); `None` for a stream gone
    /// (its channel closed).
    pub fn quorum_unanswered(&self, log: u64, newest: u64) -> Option<(u64, u64)> {
        let r = self.remote.lock().expect("remote lock");
        let key = r.stream_of_log.get(&log)?;
        let stream = r.quorum.get(key)?;
        Some((key.1, newest.saturating_sub(stream.answered)))
    }

    /// Whether any of `waits` was refused (rejected by a peer, or its epoch ended first).
    pub fn any_refused(&self, waits: &[(u64, u64)]) -> bool {
        if waits.iter().all(|(log, _)| *log < REMOTE_LOGS) {
            return false;
        }
        let r = self.remote.lock().expect("remote lock");
        let durable = self.durable.lock().expect("durability lock");
        waits.iter().any(|w| {
            w.0 >= REMOTE_LOGS
                && (r.rejected.contains(w)
                    || (r.failed.contains(&w.0) && durable.get(&w.0).is_none_or(|d| *d < w.1)))
        })
    }

    /// Forgets what was kept about a confirm once it went out.
    pub fn forget_refusal(&self, waits: &[(u64, u64)]) {
        if waits.iter().any(|(log, _)| *log >= REMOTE_LOGS) {
            let mut r = self.remote.lock().expect("remote lock");
            for w in waits {
                r.rejected.remove(w);
            }
        }
    }

    fn on_durable_now(&self, log_id: u64, durable_index: u64) {
        {
            let mut map = self.durable.lock().expect("durability lock");
            let d = map.entry(log_id).or_insert(0);
            *d = (*d).max(durable_index);
        }
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The engine stopped writing (a failed fsync): nothing more will become durable.
    pub fn has_failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns `Some(why)` once the engine stops.
    pub fn subscribe_failure(&self) -> watch::Receiver<Option<String>> {
        self.failure.subscribe()
    }
}

/// Pseudo logs of forwarded publishes start here.
const REMOTE_LOGS: u64 = 1 << 62;
/// Pseudo logs of publishes to quorum queues (a range of the forwards' own, so that what
/// treats every pseudo log alike still does).
const QUORUM_STREAMS: u64 = REMOTE_LOGS + (1 << 61);

/// Whether `log` is a channel's stream of publishes to a quorum queue. Queue logs are random
/// odd numbers, so they reach into this range too: pseudo logs are even.
pub fn is_quorum_stream(log: u64) -> bool {
    log.is_multiple_of(2) && log >= QUORUM_STREAMS
}

/// What is known of forwards to other nodes.
#[derive(Default)]
struct Remote {
    logs: IdHashMap<(u64, u64), u64>,
    next: u64,
    /// (pseudo log, forward number) refused by the peer.
    rejected: IdHashSet<(u64, u64)>,
    /// Pseudo logs whose epoch ended.
    failed: IdHashSet<u64>,
    /// Publishes to quorum queues, per (channel, group): ordered so that a closing channel
    /// finds its own streams without walking every channel's.
    quorum: std::collections::BTreeMap<(u64, u64), Stream>,
    /// Each quorum stream's key by its pseudo log.
    stream_of_log: IdHashMap<u64, (u64, u64)>,
}

/// A channel's publishes to one quorum queue group.
struct Stream {
    log: u64,
    /// The last sequence number given out.
    assigned: u64,
    /// The last one the group applied (or that was refused): the pseudo log's durable index.
    confirmed: u64,
    /// The last one answered either way, refusals for a leader change included: what the
    /// publisher's flow control counts as no longer in flight.
    answered: u64,
}

/// Whether a store log is one of the cluster's own Raft logs (the metadata group's, a quorum
/// queue's group log): queue logs are odd, the cluster's are even. No confirm waits on them.
fn is_raft_log(log_id: u64) -> bool {
    log_id.is_multiple_of(2)
}

impl DurabilityListener for Durability {
    fn on_durable(&self, log_id: u64, durable_index: u64) {
        // A Raft log's sync would wake every connection with a confirm pending for nothing:
        // a quorum queue's confirms wait on its stream, which the group's apply advances.
        if is_raft_log(log_id) {
            return;
        }
        self.on_durable_now(log_id, durable_index);
    }

    fn on_failure(&self, error: &Error) {
        tracing::error!(%error, "the storage engine stopped: no more writes are durable");
        self.failed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.generation.send_modify(|g| *g += 1);
        let why = match error {
            Error::Poisoned(why) => why.clone(),
            other => other.to_string(),
        };
        self.failure.send_if_modified(|f| {
            let first = f.is_none();
            f.get_or_insert(why);
            first
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_queue_logs_syncs_wake_the_connections_waiting_for_confirms() {
        let durability = Durability::default();
        let mut watching = durability.subscribe();
        watching.mark_unchanged();
        // A quorum queue's group log (its odd queue log plus one) and the metadata group's.
        for raft_log in [0x1234_5679 + 1, 2] {
            durability.on_durable(raft_log, 10);
            assert!(
                !watching.has_changed().unwrap(),
                "woken by Raft log {raft_log}"
            );
        }
        durability.on_durable(0x1234_5679, 10);
        assert!(watching.has_changed().unwrap());
        assert!(durability.all_durable(&[(0x1234_5679, 10)]));
    }
}
