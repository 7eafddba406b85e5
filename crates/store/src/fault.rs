//! Fault injection, so tests can prove how the engine behaves when the disk misbehaves.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Switches read by the WAL writer before each write and fsync.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct Faults {
    /// The next fdatasync of the WAL fails with EIO.
    pub fail_sync: AtomicBool,
    /// Every WAL write fails with ENOSPC while set.
    pub disk_full: AtomicBool,
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

    pub(crate) fn before_sync(&self) -> io::Result<()> {
        if self.fail_sync.swap(false, Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        Ok(())
    }
}

/// True when an I/O error means the disk is full, which the broker answers by blocking
/// publishers rather than by giving up.
pub(crate) fn is_disk_full(error: &io::Error) -> bool {
    error.raw_os_error() == Some(ENOSPC) || error.kind() == io::ErrorKind::StorageFull
}
