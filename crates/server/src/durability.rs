//! What publisher confirms wait for. A confirm goes out once each place its message went has
//! taken it ([`Wait`]): this node's storage engine (the WAL writer synced it; the engine tells
//! us per log, after each group commit), another node a publish was forwarded to (its
//! `Published` answers), a quorum queue's Raft group (it applied the publish), or a stream's
//! writer (it synced the chunk holding it). The same
//! waits hold back tx.commit-ok and an at-least-once dead letter's settlement.
//!
//! A refusal (a peer's, a group's, a link that broke, a leader change) refuses the wait: the
//! publisher gets a nack.

use std::sync::Mutex;
use tokio::sync::watch;
use warren_store::{DurabilityListener, Error};
use warren_store::{IdHashMap, IdHashSet};

/// One thing a publish waits for before its confirm. Copy, three words and no allocation of
/// its own: a publish's waits cost what the `(log, index)` pairs they replaced did, one word
/// more each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wait {
    /// Appended to this node's storage engine at `index` of the queue's `log`: taken once the
    /// WAL writer synced it.
    Stored { log: u64, index: u64 },
    /// Forwarded to the queue's node as the `seq`-th forward on `link` (one per peer and
    /// epoch of the connection to it): taken once that node answered `Published` up to it.
    Forwarded { link: u64, seq: u64 },
    /// The `seq`-th publish of a channel's `stream` of publishes to one quorum queue: taken
    /// once the queue's group applied it.
    Quorum { stream: u64, seq: u64 },
    /// The `seq`-th message handed to the writer of the stream whose log id is `log`: taken
    /// once the chunk holding it is synced.
    Stream { log: u64, seq: u64 },
}

// Three words: the kind, then the pair; a publish's waits stay a small copy.
const _: () = assert!(std::mem::size_of::<Wait>() == 24);

/// What the storage engine, the peers and the quorum groups have taken, and a generation
/// counter connections watch to look again.
pub struct Durability {
    taken: Mutex<Taken>,
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
            taken: Mutex::new(Taken::default()),
            remote: Mutex::new(Remote::default()),
            generation: watch::channel(0).0,
            failed: Default::default(),
            failure: watch::channel(None).0,
        }
    }
}

/// The newest index or sequence number taken, per source of each kind of [`Wait`].
#[derive(Default)]
struct Taken {
    stored: IdHashMap<u64, u64>,
    forwarded: IdHashMap<u64, u64>,
    quorum: IdHashMap<u64, u64>,
    stream: IdHashMap<u64, u64>,
}

impl Taken {
    fn has(&self, wait: &Wait) -> bool {
        let (newest, upto) = match wait {
            Wait::Stored { log, index } => (self.stored.get(log), index),
            Wait::Forwarded { link, seq } => (self.forwarded.get(link), seq),
            Wait::Quorum { stream, seq } => (self.quorum.get(stream), seq),
            Wait::Stream { log, seq } => (self.stream.get(log), seq),
        };
        newest.is_some_and(|n| n >= upto)
    }
}

impl Durability {
    /// Whether every one of `waits` was taken.
    pub fn all_durable(&self, waits: &[Wait]) -> bool {
        let taken = self.taken.lock().expect("durability lock");
        waits.iter().all(|w| taken.has(w))
    }

    /// The wait of the `seq`-th forward to `peer` in `epoch`.
    pub fn forwarded(&self, peer: u64, epoch: u64, seq: u64) -> Wait {
        let link = self.remote.lock().expect("remote lock").link(peer, epoch);
        Wait::Forwarded { link, seq }
    }

    /// The peer has every forward up to `upto` of this epoch; `rejected` ones were refused.
    pub fn remote_progress(&self, peer: u64, epoch: u64, upto: u64, rejected: &[u64]) {
        let link = {
            let mut r = self.remote.lock().expect("remote lock");
            let link = r.link(peer, epoch);
            r.rejected
                .extend(rejected.iter().map(|&seq| Wait::Forwarded { link, seq }));
            link
        };
        self.taken_now(|t| &mut t.forwarded, link, upto);
    }

    /// The epoch ended: its forwards not confirmed yet never will be.
    pub fn remote_failed(&self, peer: u64, epoch: u64) {
        {
            let mut r = self.remote.lock().expect("remote lock");
            let link = r.link(peer, epoch);
            r.ended.insert(link);
            r.links.remove(&(peer, epoch));
        }
        self.generation.send_modify(|g| *g += 1);
    }

    /// The next publish of `channel` to the quorum queue group `group`: the wait its confirm
    /// is. Each (channel, group) is a stream whose proposals the group applies in order, less
    /// those a leader change dropped.
    pub fn quorum_next(&self, channel: u64, group: u64) -> Wait {
        let mut guard = self.remote.lock().expect("remote lock");
        let r = &mut *guard;
        let next = &mut r.next_stream;
        let stream = r.quorum.entry((channel, group)).or_insert_with(|| {
            *next += 1;
            Stream {
                id: *next,
                assigned: 0,
                confirmed: 0,
                answered: 0,
            }
        });
        r.stream_key.insert(stream.id, (channel, group));
        stream.assigned += 1;
        Wait::Quorum {
            stream: stream.id,
            seq: stream.assigned,
        }
    }

    /// The group applied the publish `seq` of the stream (`rejected`: its queue refused it).
    /// Earlier ones not applied yet never will be, in this stream's order: they are refused.
    /// A stream not known here (closed since) is ignored.
    pub fn quorum_applied(&self, channel: u64, group: u64, seqs: &[(u64, bool)]) {
        let (stream, upto) = {
            let mut r = self.remote.lock().expect("remote lock");
            let Some(stream) = r.quorum.get(&(channel, group)) else {
                return;
            };
            let (id, mut confirmed) = (stream.id, stream.confirmed);
            let mut refused = Vec::new();
            for &(seq, rejected) in seqs {
                // Late (after a refusal for a gap or a leader change): already answered.
                if seq <= confirmed {
                    continue;
                }
                refused.extend((confirmed + 1..seq).map(|seq| Wait::Quorum { stream: id, seq }));
                if rejected {
                    refused.push(Wait::Quorum { stream: id, seq });
                }
                confirmed = seq;
            }
            r.rejected.extend(refused);
            let stream = r.quorum.get_mut(&(channel, group)).expect("found above");
            stream.confirmed = confirmed;
            stream.answered = stream.answered.max(confirmed);
            (id, confirmed)
        };
        self.taken_now(|t| &mut t.quorum, stream, upto);
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
                let id = stream.id;
                refused.extend(
                    (stream.confirmed + 1..=upto).map(|seq| Wait::Quorum { stream: id, seq }),
                );
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

    /// A channel closed: its streams go. Returns the groups it published to.
    pub fn forget_quorum_channel(&self, channel: u64) -> Vec<u64> {
        let groups: Vec<u64>;
        let streams: Vec<u64> = {
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
            let streams: Vec<u64> = keys
                .iter()
                .filter_map(|k| r.quorum.remove(k))
                .map(|s| s.id)
                .collect();
            for id in &streams {
                r.stream_key.remove(id);
            }
            let gone: std::collections::HashSet<u64> = streams.iter().copied().collect();
            r.rejected
                .retain(|w| !matches!(w, Wait::Quorum { stream, .. } if gone.contains(stream)));
            streams
        };
        if !streams.is_empty() {
            let mut taken = self.taken.lock().expect("durability lock");
            for id in streams {
                taken.quorum.remove(&id);
            }
        }
        groups
    }

    /// The group of quorum `stream`, and how many of its publishes up to `newest` the group
    /// has not answered yet (applied, or refused by a leader change); `None` for a stream gone
    /// (its channel closed).
    pub fn quorum_unanswered(&self, stream: u64, newest: u64) -> Option<(u64, u64)> {
        let r = self.remote.lock().expect("remote lock");
        let key = r.stream_key.get(&stream)?;
        let stream = r.quorum.get(key)?;
        Some((key.1, newest.saturating_sub(stream.answered)))
    }

    /// The writer of stream `log` synced every message up to its `upto`-th.
    pub fn stream_synced(&self, log: u64, upto: u64) {
        self.taken_now(|t| &mut t.stream, log, upto);
    }

    /// The messages `from..=upto` handed to the writer of replicated stream `log` were not
    /// committed in time (no leader, or a leader change lost their proposal): their
    /// publishers get nacks, though a late commit may still have stored them.
    pub fn stream_refused(&self, log: u64, from: u64, upto: u64) {
        self.remote
            .lock()
            .expect("remote lock")
            .rejected
            .extend((from..=upto).map(|seq| Wait::Stream { log, seq }));
        self.generation.send_modify(|g| *g += 1);
    }

    /// The writer of stream `log` stopped (a failed write or sync, or the stream was
    /// deleted): what it had not synced never will be, and its publishers get nacks.
    pub fn stream_stopped(&self, log: u64) {
        self.remote
            .lock()
            .expect("remote lock")
            .streams_stopped
            .insert(log);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Whether any of `waits` was refused (rejected by a peer or a group, or its link ended
    /// first).
    pub fn any_refused(&self, waits: &[Wait]) -> bool {
        if waits.iter().all(|w| matches!(w, Wait::Stored { .. })) {
            return false;
        }
        let r = self.remote.lock().expect("remote lock");
        let taken = self.taken.lock().expect("durability lock");
        waits.iter().any(|w| match w {
            Wait::Stored { .. } => false,
            Wait::Forwarded { link, .. } => {
                r.rejected.contains(w) || (r.ended.contains(link) && !taken.has(w))
            }
            Wait::Quorum { .. } => r.rejected.contains(w),
            Wait::Stream { log, .. } => {
                r.rejected.contains(w) || r.streams_stopped.contains(log) && !taken.has(w)
            }
        })
    }

    /// Forgets what was kept about a confirm once it went out.
    pub fn forget_refusal(&self, waits: &[Wait]) {
        if waits.iter().any(|w| !matches!(w, Wait::Stored { .. })) {
            let mut r = self.remote.lock().expect("remote lock");
            for w in waits {
                r.rejected.remove(w);
            }
        }
    }

    /// Records that `source`'s waits up to `upto` are taken, in the table `kind` picks, and
    /// wakes the connections to look.
    fn taken_now(
        &self,
        kind: impl FnOnce(&mut Taken) -> &mut IdHashMap<u64, u64>,
        source: u64,
        upto: u64,
    ) {
        {
            let mut taken = self.taken.lock().expect("durability lock");
            let newest = kind(&mut taken).entry(source).or_insert(0);
            *newest = (*newest).max(upto);
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

/// What is known of forwards to other nodes and of publishes to quorum queues.
#[derive(Default)]
struct Remote {
    /// Each (peer, epoch)'s link id, numbered from 1.
    links: IdHashMap<(u64, u64), u64>,
    next_link: u64,
    next_stream: u64,
    /// Forwards and quorum publishes refused.
    rejected: IdHashSet<Wait>,
    /// Links whose epoch ended.
    ended: IdHashSet<u64>,
    /// Streams (log ids) whose writer stopped; a log id is never reused.
    streams_stopped: IdHashSet<u64>,
    /// Publishes to quorum queues, per (channel, group): ordered so that a closing channel
    /// finds its own streams without walking every channel's.
    quorum: std::collections::BTreeMap<(u64, u64), Stream>,
    /// Each quorum stream's key by its id.
    stream_key: IdHashMap<u64, (u64, u64)>,
}

impl Remote {
    /// The link of forwards to `peer` in `epoch`.
    fn link(&mut self, peer: u64, epoch: u64) -> u64 {
        if let Some(link) = self.links.get(&(peer, epoch)) {
            return *link;
        }
        self.next_link += 1;
        self.links.insert((peer, epoch), self.next_link);
        self.next_link
    }
}

/// A channel's publishes to one quorum queue group.
struct Stream {
    id: u64,
    /// The last sequence number given out.
    assigned: u64,
    /// The last one the group applied (or that was refused): what its waits have taken.
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
        self.taken_now(|t| &mut t.stored, log_id, durable_index);
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
        assert!(durability.all_durable(&[Wait::Stored {
            log: 0x1234_5679,
            index: 10
        }]));
    }

    #[test]
    fn a_stream_publish_is_confirmed_once_synced_and_refused_if_its_writer_stops_first() {
        let d = Durability::default();
        let (first, second) = (
            Wait::Stream { log: 7, seq: 1 },
            Wait::Stream { log: 7, seq: 2 },
        );
        assert!(!d.all_durable(&[first]));
        // A queue log with the same number syncing says nothing of the stream.
        d.on_durable(7, 10);
        assert!(!d.all_durable(&[first]));
        d.stream_synced(7, 1);
        assert!(d.all_durable(&[first]) && !d.all_durable(&[second]));
        assert!(!d.any_refused(&[second]));
        d.stream_stopped(7);
        assert!(d.any_refused(&[second]), "never synced: nacked");
        assert!(
            !d.any_refused(&[first]),
            "synced before the stop: confirmed"
        );
    }

    #[test]
    fn a_wait_is_taken_only_by_its_own_kind_of_source_whatever_its_numbers() {
        let d = Durability::default();
        let forward = d.forwarded(9, 1, 5);
        let Wait::Forwarded { link, .. } = forward else {
            panic!("not a forward: {forward:?}");
        };
        let publish = d.quorum_next(3, 7);
        let Wait::Quorum { stream, seq } = publish else {
            panic!("not a quorum publish: {publish:?}");
        };
        // The storage engine syncing logs numbered like the link and the stream takes neither.
        d.on_durable(link, 100);
        d.on_durable(stream, 100);
        assert!(!d.all_durable(&[forward]));
        assert!(!d.all_durable(&[publish]));
        d.remote_progress(9, 1, 5, &[]);
        d.quorum_applied(3, 7, &[(seq, false)]);
        assert!(d.all_durable(&[forward, publish]));
        assert!(!d.any_refused(&[forward, publish]));
    }

    #[test]
    fn a_forward_is_refused_when_its_peer_rejects_it_or_its_link_ends_before_taking_it() {
        let d = Durability::default();
        let (taken, rejected, lost) = (
            d.forwarded(9, 1, 1),
            d.forwarded(9, 1, 2),
            d.forwarded(9, 1, 3),
        );
        d.remote_progress(9, 1, 2, &[2]);
        assert!(!d.any_refused(&[taken]));
        assert!(d.any_refused(&[rejected]));
        assert!(!d.any_refused(&[lost]), "the link may still take it");
        d.remote_failed(9, 1);
        assert!(d.any_refused(&[lost]));
        assert!(!d.any_refused(&[taken]), "taken before the link ended");
        let next_epoch = d.forwarded(9, 2, 1);
        assert_ne!(
            next_epoch, lost,
            "a new epoch's forwards wait on a link of their own"
        );
        assert!(!d.any_refused(&[next_epoch]));
        d.forget_refusal(&[rejected]);
        assert!(!d.any_refused(&[rejected]));
    }

    #[test]
    fn quorum_publishes_a_group_skipped_or_a_leader_change_dropped_are_refused() {
        let d = Durability::default();
        let waits: Vec<Wait> = (0..4).map(|_| d.quorum_next(3, 7)).collect();
        // Applied: the second, rejected by its queue; the first was skipped.
        d.quorum_applied(3, 7, &[(2, true)]);
        assert!(d.any_refused(&waits[0..1]));
        assert!(d.any_refused(&waits[1..2]));
        assert!(d.all_durable(&waits[0..2]), "answered either way");
        d.quorum_abandon(7, None, 0);
        assert!(d.any_refused(&waits[2..3]) && d.any_refused(&waits[3..4]));
        assert_eq!(d.forget_quorum_channel(3), vec![7]);
        assert!(
            !d.any_refused(&waits),
            "a closed channel's refusals are forgotten with its streams"
        );
    }
}
