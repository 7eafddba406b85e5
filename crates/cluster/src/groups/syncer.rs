//! The thread that makes the WAL durable for the groups loop, so the loop goes on stepping
//! peers' messages while a sync runs.

use super::{Input, Synced};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use warren_store::Store;

/// The thread that waits for the WAL on the loop's behalf: for each request it syncs once for
/// every round asked for so far, then reports the newest one done.
pub(super) fn start_syncer(
    store: Arc<Store>,
    inputs: Sender<Input>,
    syncs: Arc<AtomicU64>,
) -> Result<(Sender<u64>, std::thread::JoinHandle<()>), String> {
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let thread = std::thread::Builder::new()
        .name("queue-groups-sync".into())
        .spawn(move || {
            while let Ok(mut round) = rx.recv() {
                while let Ok(later) = rx.try_recv() {
                    round = later;
                }
                let result = store.sync().map(|()| round).map_err(|e| e.to_string());
                syncs.fetch_add(1, Ordering::Relaxed);
                let failed = result.is_err();
                if inputs.send(Input::Synced(Synced(result))).is_err() || failed {
                    return;
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok((tx, thread))
}
