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
    /// Disk stalls, as this project's test machine's virtual disk has them (every node's syncs
    /// held at once for 10-100 ms, about once a minute): every `stall_every_ms` of wall-clock
    /// time, a WAL fdatasync that overlaps the first `stall_ms` of it ends only when they end.
    /// Windows are aligned on the Unix epoch, so nodes on one machine stall together.
    /// Benchmarks use it to compare how the latency tail rides out the same stalls.
    pub stall_every_ms: AtomicU64,
    pub stall_ms: AtomicU64,
    /// Instead of holding syncs to the window's end, each sync that overlaps it takes this
    /// much longer (0: held to the end): a slow spell rather than a stall, which the same
    /// machine also has (hundreds of milliseconds of 4-14 ms syncs).
    pub stall_sync_ms: AtomicU64,
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

    /// Whether disk stalls are asked for ([`Faults::stall_every_ms`]).
    pub(crate) fn stalling(&self) -> bool {
        self.stall_every_ms.load(Ordering::Relaxed) > 0
    }

    /// After a WAL fdatasync that began at `began`: holds the caller as a stalled disk would.
    pub(crate) fn after_sync(&self, began: std::time::SystemTime) {
        let stalls = Stalls {
            every_us: self
                .stall_every_ms
                .load(Ordering::Relaxed)
                .saturating_mul(1000),
            stall_us: self.stall_ms.load(Ordering::Relaxed).saturating_mul(1000),
            sync_us: self
                .stall_sync_ms
                .load(Ordering::Relaxed)
                .saturating_mul(1000),
        };
        if stalls.every_us == 0 || stalls.stall_us == 0 {
            return;
        }
        let since_epoch = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64)
        };
        let hold = stalls.hold_us(
            since_epoch(began),
            since_epoch(std::time::SystemTime::now()),
        );
        if hold > 0 {
            std::thread::sleep(Duration::from_micros(hold));
        }
    }
}

/// [`Faults::stall_every_ms`] and its companions, in microseconds.
struct Stalls {
    every_us: u64,
    stall_us: u64,
    sync_us: u64,
}

impl Stalls {
    /// How much longer a sync that ran from `start` to `end` (microseconds since the epoch)
    /// takes: one that ended inside a window's stall is held to its end, or by `sync_us`.
    fn hold_us(&self, start: u64, end: u64) -> u64 {
        let stall = self.stall_us.min(self.every_us);
        // The stall of the last window that began before the sync ended.
        let window_end = end - end % self.every_us + stall;
        if start >= window_end || end >= window_end {
            0
        } else if self.sync_us > 0 {
            self.sync_us
        } else {
            window_end - end
        }
    }
}

/// True when an I/O error means the disk is full, which the broker answers by blocking
/// publishers rather than by giving up.
pub(crate) fn is_disk_full(error: &io::Error) -> bool {
    error.raw_os_error() == Some(ENOSPC) || error.kind() == io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests {
    use super::Stalls;

    #[test]
    fn a_sync_inside_a_stall_ends_with_it_and_one_outside_is_not_held() {
        let stalls = Stalls {
            every_us: 1_000_000,
            stall_us: 20_000,
            sync_us: 0,
        };
        // Began before the window, ended inside its stall.
        assert_eq!(stalls.hold_us(2_999_900, 3_000_300), 19_700);
        // Began and ended inside it.
        assert_eq!(stalls.hold_us(3_010_000, 3_010_200), 9_800);
        // After the stall, and well before the next window.
        assert_eq!(stalls.hold_us(3_020_000, 3_020_200), 0);
        assert_eq!(stalls.hold_us(3_500_000, 3_500_200), 0);
        let spell = Stalls {
            sync_us: 8_000,
            ..stalls
        };
        assert_eq!(spell.hold_us(3_010_000, 3_010_200), 8_000);
        assert_eq!(spell.hold_us(3_500_000, 3_500_200), 0);
    }
}
