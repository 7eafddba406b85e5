//! What a vhost's changes write to disk: durable topology to the metadata journal, and
//! messages to the storage engine ([`apply_store_ops`], called by [`crate::queues::effects`],
//! and [`recover_messages`]); [`MetaGuard`], a
//! locked vhost that writes both (and sends its work for other nodes) when released.
//!
//! Durable topology on disk: changes a command made to durable entities are appended to the
//! metadata journal (and synced) while the vhost is still locked, so the journal's order is
//! the order of the changes and a declare-ok is sent only once the declare is durable.
//!
//! The journal is compacted by folding it: its records are replayed into a scratch broker
//! and that broker's state is written as the new snapshot. That needs no lock on live vhosts,
//! only the journal's own lock, which keeps appends out while it runs.

use crate::Shared;
use std::sync::Arc;
use warren_broker::backlog::PayloadSource;
use warren_broker::broker::Broker;
use warren_broker::definitions::MetaRecord;
use warren_broker::error::AmqpError;
use warren_broker::persistence::StoreOp;
use warren_broker::vhost::VHost;
use warren_protocol::constants::INTERNAL_ERROR;
use warren_store::journal::Journal;
use warren_store::{Entry, Error as StoreError, Store};

/// Appends `records`; an I/O failure is reported to the client as 541 INTERNAL_ERROR. Once
/// storage has failed nothing more is written (see [`refuse_if_failed`]), and a failed sync of
/// the journal itself is such a failure.
pub fn append(shared: &Shared, records: Vec<MetaRecord>) -> Result<(), AmqpError> {
    let Some(journal) = &shared.journal else {
        return Ok(());
    };
    if records.is_empty() {
        return Ok(());
    }
    refuse_if_failed(shared)?;
    let payloads: Vec<Vec<u8>> = records.iter().map(MetaRecord::encode).collect();
    let mut journal = journal.lock().expect("journal lock");
    journal.append(&payloads).map_err(|e| {
        tracing::error!(error = %e, "cannot write the metadata journal");
        if let Some(why) = journal.poisoned() {
            shared.storage_failed(why);
        }
        AmqpError::new(INTERNAL_ERROR, format!("cannot persist metadata: {e}"))
    })
}

/// 541 INTERNAL_ERROR once the node's storage has failed: a change that cannot be written is
/// refused rather than made in memory only.
pub fn refuse_if_failed(shared: &Shared) -> Result<(), AmqpError> {
    match shared.alarms.storage_failure() {
        None => Ok(()),
        Some(why) => Err(AmqpError::new(
            INTERNAL_ERROR,
            format!(
                "storage failure: {why}; durable changes are refused until the node is restarted"
            ),
        )),
    }
}

/// Persists what the last command on `vhost` changed; call with the vhost still locked.
pub fn persist(shared: &Shared, vhost: &mut VHost) -> Result<(), AmqpError> {
    let records = vhost.take_meta();
    let declared: Vec<String> = records
        .iter()
        .filter_map(|r| match r {
            MetaRecord::DeclareQueue { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    append(shared, records)?;
    // A stream's log is there from its declare-ok on.
    for name in declared {
        crate::queues::stream::opened_at_declare(shared, vhost, &name);
    }
    Ok(())
}

/// Time-driven work: TTL expiry and x-expires in every vhost (persisting queue deletions),
/// then journal compaction when it has grown.
pub fn tick(shared: &Arc<Shared>) {
    let now = shared.broker.now_ms();
    for (_, v) in shared.broker.vhosts() {
        // Persists deleted queues and carries out releases and dead-letter appends on drop.
        let mut v = MetaGuard {
            vhost: v.lock().expect("vhost lock"),
            shared,
        };
        v.tick(now);
        // Queues a policy change left over their length limits (in a cluster, the change was
        // applied by the metadata group's thread, which carries out no storage work).
        v.enforce_limits(now);
        // Remote consumers held off while their node's link was congested.
        v.resume_stand_ins(now);
    }
    if let Some(journal) = &shared.journal {
        let mut j = journal.lock().expect("journal lock");
        if j.wants_compaction() && shared.alarms.storage_failure().is_none() {
            if let Err(e) = compact(&mut j) {
                tracing::error!(error = %e, "metadata journal compaction failed");
                if let Some(why) = j.poisoned() {
                    shared.storage_failed(why);
                }
            }
        }
    }
}

fn compact(journal: &mut Journal) -> Result<(), String> {
    let records = journal.read_all().map_err(|e| e.to_string())?;
    let scratch = Broker::new();
    for r in records {
        scratch.apply(MetaRecord::decode(&r)?)?;
    }
    let state: Vec<Vec<u8>> = scratch
        .export_meta()
        .iter()
        .map(MetaRecord::encode)
        .collect();
    journal.compact(&state).map_err(|e| e.to_string())?;
    tracing::info!(records = state.len(), "metadata journal compacted");
    Ok(())
}

/// Opens the journal and replays it into `broker`; returns the journal for appending.
pub fn recover(dir: &std::path::Path, broker: &Broker) -> Result<Journal, String> {
    let (mut journal, records) = Journal::open(dir)
        .map_err(|e| format!("cannot open metadata journal in {}: {e}", dir.display()))?;
    let count = records.len();
    for r in records {
        let record = MetaRecord::decode(&r)?;
        if let Err(e) = broker.apply(record.clone()) {
            // A record that no longer applies (e.g. a binding whose queue a later record
            // removed before compaction) is logged, not fatal.
            tracing::warn!(error = %e, ?record, "metadata record skipped at recovery");
        }
    }
    broker.discard_meta();
    if journal.wants_compaction() {
        compact(&mut journal)?;
    }
    tracing::info!(records = count, "durable topology recovered");
    Ok(journal)
}

/// A locked vhost that journals the durable changes made through it when released, before
/// the caller's next statement can reply to the client.
pub struct MetaGuard<'a> {
    pub vhost: std::sync::MutexGuard<'a, VHost>,
    pub shared: &'a Arc<Shared>,
}

impl std::ops::Deref for MetaGuard<'_> {
    type Target = VHost;
    fn deref(&self) -> &VHost {
        &self.vhost
    }
}

impl std::ops::DerefMut for MetaGuard<'_> {
    fn deref_mut(&mut self) -> &mut VHost {
        &mut self.vhost
    }
}

impl MetaGuard<'_> {
    /// Journals the durable changes made through the guard now, so that a failed write
    /// reaches the client as 541 INTERNAL_ERROR instead of a declare-ok (the drop can only log
    /// it). For commands a client waits on; node-initiated changes rely on the drop.
    pub fn persist(mut self) -> Result<(), AmqpError> {
        if self.vhost.has_meta() {
            persist(self.shared, &mut self.vhost)?;
        }
        Ok(())
    }
}

impl Drop for MetaGuard<'_> {
    fn drop(&mut self) {
        // A policy change's new stream retention reaches the streams' writers here, whatever
        // path changed the policy (API, definitions import, the cluster's log).
        for (log, config) in self.vhost.take_reconfigured_streams() {
            self.shared.streams.reconfigure(log, &config);
        }
        let deleted = self.vhost.take_self_deleted();
        if !deleted.is_empty() {
            crate::topology::deleted_here(self.shared, &self.vhost.name, deleted);
        }
        if let Err(e) = settle(self.shared, &mut self.vhost) {
            tracing::error!(error = %e.text, "durable topology change not persisted");
        }
    }
}

/// Carries out what the last changes to `vhost` left to do (call with it still locked): their
/// durable topology journaled, their storage work done, their work for other nodes sent. Only
/// a failed journal write is an error, for the client that waits on the change; the rest is
/// logged where it fails, as no publisher waits on it.
pub fn settle(shared: &Shared, vhost: &mut VHost) -> Result<(), AmqpError> {
    let journaled = if vhost.has_meta() {
        persist(shared, vhost)
    } else {
        Ok(())
    };
    // Acks of relayed deliveries, dead letters for queues on other nodes.
    crate::queues::effects::carry_out(shared, vhost, None);
    journaled
}

/// A stored message the engine refused (full disk, stopped engine): its publisher gets a nack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotStored;

/// Carries out a command's storage work, in order (still under the vhost lock, so each log's
/// appends reach the engine in index order). Returns the appended (log, index) pairs a
/// publisher confirm must wait for, or `Err` when an append failed (the publisher gets a nack).
pub fn apply_store_ops(
    shared: &Shared,
    ops: Vec<StoreOp>,
) -> Result<Vec<crate::durability::Wait>, NotStored> {
    let Some(store) = &shared.store else {
        return Ok(Vec::new());
    };
    let mut appended = Vec::new();
    let mut failed = false;
    for op in ops {
        let result = match op {
            StoreOp::Append {
                log,
                index,
                payload,
            } => {
                let entry = [Entry {
                    index,
                    term: 0,
                    payload,
                }];
                let mut r = store.append(log, &entry);
                if matches!(r, Err(StoreError::Backpressure)) {
                    // The WAL writer is behind: wait for it, which holds this publisher back.
                    r = store.append_blocking(log, &entry);
                }
                if r.is_ok() {
                    appended.push(crate::durability::Wait::Stored { log, index });
                } else {
                    failed = true;
                }
                r
            }
            StoreOp::Release { log, index } => store.release(log, index),
            StoreOp::ReleasePrefix { log, index } => {
                store.release_prefix(log, index, 0, bytes::Bytes::new())
            }
            StoreOp::DeleteLog { log } => {
                // A stream's log is its own files, not the engine's.
                shared.streams_consumers.stop_stream(log);
                shared.streams.delete(log);
                store.delete_log(log)
            }
        };
        match result {
            Ok(()) => {}
            // Reported once, by the storage alarm; every ack after it would repeat it.
            // Block publishers now rather than at the next sample of the disk.
            Err(StoreError::DiskFull) => shared.alarms.evaluate(),
            Err(StoreError::Poisoned(e)) => {
                tracing::debug!(error = %e, "stopped storage engine refused an operation")
            }
            Err(e) => tracing::error!(error = %e, "storage engine refused an operation"),
        }
    }
    if failed {
        Err(NotStored)
    } else {
        Ok(appended)
    }
}

/// The store as the broker's source of paged-out message bodies.
pub struct StorePayloads(pub std::sync::Arc<Store>);

impl PayloadSource for StorePayloads {
    fn read(
        &self,
        log: u64,
        from: u64,
        to: u64,
        max_bytes: usize,
    ) -> Result<Vec<(u64, bytes::Bytes)>, String> {
        let entries = self
            .0
            .read_range(log, from, to, max_bytes)
            .map_err(|e| e.to_string())?;
        Ok(entries.into_iter().map(|e| (e.index, e.payload)).collect())
    }
}

/// Reads the live entries of an at-least-once quorum queue's log for the dead letters it held
/// before the restart (flagged entries), puts those back among its held dead letters and
/// returns the others, its ready messages. This reads every body of such a queue once at
/// startup, a page at a time: only these queues pay it, and only there can an entry be a dead
/// letter (anywhere else the flag is never written).
fn restore_dead_letters(
    store: &Store,
    v: &mut VHost,
    queue: &str,
    log: u64,
    entries: Vec<(u64, u32)>,
) -> Result<Vec<(u64, u32)>, String> {
    const PAGE_BYTES: usize = 16 << 20;
    let (Some(&(first, _)), Some(&(last, _))) = (entries.first(), entries.last()) else {
        return Ok(entries);
    };
    let mut held = std::collections::HashSet::new();
    let mut from = first;
    while from <= last {
        let page = store
            .read_range(log, from, last + 1, PAGE_BYTES)
            .map_err(|e| e.to_string())?;
        let Some(end) = page.last().map(|e| e.index) else {
            break;
        };
        for e in page {
            if v.restore_dead_letter(queue, e.index, &e.payload) {
                held.insert(e.index);
            }
        }
        from = end + 1;
    }
    if !held.is_empty() {
        tracing::info!(
            queue,
            dead_letters = held.len(),
            "held dead letters recovered"
        );
    }
    Ok(entries
        .into_iter()
        .filter(|(i, _)| !held.contains(i))
        .collect())
}

/// Puts every durable queue's stored messages back after a restart, bodies left on disk
/// (read back as consumers reach them), and drops queue logs whose queue no longer exists
/// (deleted while the deletion's log record was not yet durable).
pub fn recover_messages(store: &Store, broker: &Broker) -> Result<(), String> {
    const PAGE_ENTRIES: usize = 65_536;
    let mut known = std::collections::HashSet::new();
    let mut restored = 0usize;
    for (_, v) in broker.vhosts() {
        let mut v = v.lock().expect("vhost lock");
        for (queue, log) in v.queue_logs() {
            known.insert(log);
            let Some(info) = store.log_info(log) else {
                continue;
            };
            let mut entries = Vec::new();
            let mut from = info.first_index;
            loop {
                let page = store.live_entries(log, from, PAGE_ENTRIES);
                let Some(&(last, _)) = page.last() else { break };
                entries.extend(page);
                from = last + 1;
            }
            if v.holds_dead_letters(&queue) {
                entries = restore_dead_letters(store, &mut v, &queue, log, entries)?;
            }
            restored += entries.len();
            v.restore_stored(&queue, info.last_index + 1, &entries);
        }
    }
    for info in store.logs() {
        // Queue logs have odd ids; even ones are the cluster's own (its Raft groups' logs).
        if info.log_id % 2 == 1 && !known.contains(&info.log_id) {
            store.delete_log(info.log_id).map_err(|e| e.to_string())?;
        }
    }
    tracing::info!(messages = restored, "stored messages recovered");
    Ok(())
}
