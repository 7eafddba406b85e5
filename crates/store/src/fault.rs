//! Fault injection, so tests can prove how the engine behaves when the disk misbehaves.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

/// Switches read by the WAL writer before each write and fsync.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct Faults {
    /// The next fdatasync of the WAL fails with EIO.
    pub fail_sync: AtomicBool,
    /// Every WAL write fails with ENOSPC while set.
    pub disk_full: AtomicBool,
    /// The segment writer stops dead (the engine is poisoned, as if the process died) when it
    /// reaches this [`CrashPoint`] (its `u8` value; 0 never). Fires once.
    pub crash_at: AtomicU8,
    /// Every fdatasync these switches govern (the WAL's) takes this many microseconds more
    /// (0: none): a slow disk, on which more appends pile up per sync. Tests run under it to
    /// prove that their verdict does not depend on how many appends share a sync.
    pub sync_delay_us: AtomicU64,
    /// While set, the WAL writer takes no new batch (until shutdown): whatever is appended
    /// meanwhile waits, and goes into the batches taken once it is cleared. Tests use it to
    /// line up records that must share a batch, whatever the speed of the disk and the cores.
    pub hold_writer: AtomicBool,
}

/// Points of the segment writer's work where tests make it stop as if the process died.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CrashPoint {
    /// An adopted file's sidecar is durable; the checkpoint naming it is not written.
    AfterSidecar = 1,
    /// A checkpoint is written; the WAL files and segments it made dead are not deleted.
    AfterCheckpoint = 2,
    /// An adopted file's live entries are copied into segments; no checkpoint says so yet.
    AfterAdoptedCompaction = 3,
}

/// The raw errno of ENOSPC on Linux.
const ENOSPC: i32 = 28;
/// The raw errno of EIO on Linux.
const EIO: i32 = 5;

impl Faults {
    pub(crate) fn before_write(&self) -> io::Result<()> {
        if self.disk_full.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        Ok(())
    }

    /// Fails (poisoning the engine) when the test asked for a crash at `point`.
    pub(crate) fn crash_point(&self, point: CrashPoint) -> crate::Result<()> {
        let hit = self
            .crash_at
            .compare_exchange(point as u8, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if hit {
            return Err(crate::Error::Poisoned(format!(
                "simulated crash at {point:?}"
            )));
        }
        Ok(())
    }

    pub(crate) fn writer_held(&self) -> bool {
        self.hold_writer.load(Ordering::Relaxed)
    }

    pub(crate) fn before_sync(&self) -> io::Result<()> {
        if self.fail_sync.swap(false, Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        let delay_us = self.sync_delay_us.load(Ordering::Relaxed);
        if delay_us > 0 {
            std::thread::sleep(Duration::from_micros(delay_us));
        }
        Ok(())
    }
}

/// True when an I/O error means the disk is full, which the broker answers by blocking
/// publishers rather than by giving up.
pub(crate) fn is_disk_full(error: &io::Error) -> bool {
    error.raw_os_error() == Some(ENOSPC) || error.kind() == io::ErrorKind::StorageFull
}
