//! Writes queue groups' snapshots off the groups loop. A snapshot file costs two fsyncs (the
//! file, then its directory after the rename); on the loop, every group of the node waited
//! for them, each time any group took a snapshot (every 4096 entries applied), and that wait
//! was the tail of the node's publish latency.
//!
//! The loop encodes the snapshot (the state machine's bytes are the loop's to read) and hands
//! it over; this thread writes it and tells the loop, which only then makes it the group's
//! latest and releases the log behind it ([`crate::raft_log::RaftLog::snapshot_saved`]): until
//! the file is durable, a crash finds the previous snapshot and the entries after it. A group
//! has at most one snapshot here at a time.

use crate::groups::Input;
use crate::raft_log::SnapshotFile;
use raft::eraftpb::Snapshot;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// A snapshot a group took, to write.
pub struct SnapshotJob {
    pub group: u64,
    pub snapshot: Snapshot,
    /// How far the log may be released once it is durable.
    pub upto: u64,
    pub file: Arc<SnapshotFile>,
}

/// The writer's report to the loop: `Ok(true)` once the file is durable, `Ok(false)` if it
/// was not written (the group closed, or a later snapshot is on disk already).
pub struct SnapshotWritten {
    pub job: SnapshotJob,
    pub result: Result<bool, String>,
}

/// Starts the writer thread; it reports to the loop's `inputs`.
pub fn start(inputs: crate::groups::InputSender) -> Result<Sender<SnapshotJob>, String> {
    let (tx, rx) = std::sync::mpsc::channel::<SnapshotJob>();
    std::thread::Builder::new()
        .name("queue-groups-snapshots".into())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                let result = job.file.write(&job.snapshot);
                if !inputs.send(Input::SnapshotWritten(SnapshotWritten { job, result })) {
                    return;
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(tx)
}
