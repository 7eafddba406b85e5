//! Resource alarms, as RabbitMQ has them: above the memory high watermark, or with less free
//! disk than the disk free limit, publishing connections are blocked (connection.blocked, and
//! their publishes are not read) until the resource recovers. Consumers go on, which is what
//! frees memory and disk.
//!
//! The storage alarm is ours: a failed fsync (of the WAL or the metadata journal) stopped the
//! node's writes. It blocks publishers the same way, so clients see it as RabbitMQ clients see
//! any resource alarm, and it never clears: after a failed fsync the kernel may have dropped
//! unwritten pages, so only a restart, which reads back what is really on disk, gets past it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlarmState {
    pub memory: bool,
    pub disk: bool,
    /// Storage failed; its reason is [`Alarms::storage_failure`].
    pub storage: bool,
}

impl AlarmState {
    pub fn any(&self) -> bool {
        self.memory || self.disk || self.storage
    }
}

pub struct Alarms {
    pub memory_watermark_bytes: AtomicU64,
    pub disk_free_limit_bytes: AtomicU64,
    /// The WAL, segment and metadata directories: they may sit on separate disks (seed 001), and
    /// any of them filling up stops the node's writes, so the least free one decides.
    disk_dirs: Vec<PathBuf>,
    state: watch::Sender<AlarmState>,
    /// What failed, set once: the first failure is the one that matters.
    storage_failure: OnceLock<String>,
    /// The storage engine, whose WAL writer may have hit a full disk before the free-space
    /// sample saw it (a disk filling faster than the sampler, or a limit set too low).
    store: OnceLock<Arc<warren_store::Store>>,
}

/// Free bytes for unprivileged writers on the file system holding `dir`.
pub fn disk_free_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Free bytes on the fullest of the file systems holding `dirs`; `None` when none can be read.
pub fn least_disk_free_bytes(dirs: &[PathBuf]) -> Option<u64> {
    dirs.iter().filter_map(|d| disk_free_bytes(d)).min()
}

impl Alarms {
    pub fn new(
        memory_watermark_bytes: u64,
        disk_free_limit_bytes: u64,
        disk_dirs: Vec<PathBuf>,
    ) -> Self {
        Alarms {
            memory_watermark_bytes: AtomicU64::new(memory_watermark_bytes),
            disk_free_limit_bytes: AtomicU64::new(disk_free_limit_bytes),
            disk_dirs,
            state: watch::channel(AlarmState::default()).0,
            storage_failure: OnceLock::new(),
            store: OnceLock::new(),
        }
    }

    /// Free bytes on the fullest storage file system: what the disk alarm compares to its limit.
    pub fn disk_free_bytes(&self) -> Option<u64> {
        least_disk_free_bytes(&self.disk_dirs)
    }

    /// Lets the disk alarm also follow the engine's own full-disk state.
    pub fn watch_store(&self, store: Arc<warren_store::Store>) {
        let _ = self.store.set(store);
    }

    pub fn state(&self) -> AlarmState {
        *self.state.borrow()
    }

    /// The reason connection.blocked carries: RabbitMQ's words for memory and disk.
    pub fn reason(&self, state: &AlarmState) -> String {
        match self.storage_failure() {
            Some(why) if state.storage => format!("storage failure: {why}"),
            _ if state.memory => "low on memory".into(),
            _ => "low on disk".into(),
        }
    }

    /// Why the node stopped writing, once it did.
    pub fn storage_failure(&self) -> Option<&str> {
        self.storage_failure.get().map(String::as_str)
    }

    /// Raises the storage alarm for good (see the module doc). Only the first failure is
    /// logged and kept; later ones are its consequences.
    pub fn raise_storage_failure(&self, why: &str) {
        if self.storage_failure.set(why.to_string()).is_err() {
            return;
        }
        tracing::error!(
            reason = why,
            "storage failure alarm set: publishers are blocked and durable changes refused \
             until the node is restarted"
        );
        self.state.send_modify(|s| s.storage = true);
    }

    /// Every alarm in effect as (resource, reason), as the health checks list them.
    pub fn active(&self) -> Vec<(&'static str, String)> {
        let s = self.state();
        let mut out = Vec::new();
        if s.memory {
            out.push(("memory", "low on memory".to_string()));
        }
        if s.disk {
            out.push(("disk", "low on disk".to_string()));
        }
        if s.storage {
            out.push(("storage", self.reason(&s)));
        }
        out
    }

    pub fn subscribe(&self) -> watch::Receiver<AlarmState> {
        self.state.subscribe()
    }

    /// Re-reads memory and disk and raises or clears the alarms; called by the sampler and at
    /// once when a limit changes (rabbitmqctl's changes take effect immediately too).
    pub fn evaluate(&self) {
        let rss = crate::node::memory::rss_bytes();
        let watermark = self.memory_watermark_bytes.load(Ordering::Relaxed);
        let free = self.disk_free_bytes();
        let limit = self.disk_free_limit_bytes.load(Ordering::Relaxed);
        let before = *self.state.borrow();
        let now = AlarmState {
            memory: rss > watermark,
            disk: free.is_some_and(|f| f < limit)
                || self.store.get().is_some_and(|s| s.is_disk_full()),
            storage: self.storage_failure.get().is_some(),
        };
        if before != now {
            if now.memory != before.memory {
                if now.memory {
                    tracing::warn!(watermark, rss, "memory alarm set: blocking publishers");
                } else {
                    tracing::info!("memory alarm cleared");
                }
            }
            if now.disk != before.disk {
                if now.disk {
                    tracing::warn!(
                        limit,
                        free = free.unwrap_or(0),
                        "disk alarm set: blocking publishers"
                    );
                } else {
                    tracing::info!("disk alarm cleared");
                }
            }
            // Stored even while no connection is subscribed yet; the storage bit is re-read
            // under the channel's lock so that a failure raised meanwhile is never undone.
            self.state.send_modify(|s| {
                *s = AlarmState {
                    storage: s.storage || now.storage,
                    ..now
                }
            });
        }
    }
}

pub async fn monitor(alarms: Arc<Alarms>) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    loop {
        tick.tick().await;
        alarms.evaluate();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alarms() -> Alarms {
        // Limits no machine reaches: only the storage alarm can be in effect.
        Alarms::new(u64::MAX, 0, vec![std::env::temp_dir()])
    }

    #[test]
    fn the_storage_alarm_blocks_with_its_reason_and_never_clears() {
        let a = alarms();
        a.evaluate();
        assert!(!a.state().any());
        a.raise_storage_failure("fdatasync of WAL file 3: Input/output error");
        a.raise_storage_failure("a consequence, not the cause");
        let s = a.state();
        assert!(s.storage && s.any());
        assert_eq!(
            a.reason(&s),
            "storage failure: fdatasync of WAL file 3: Input/output error"
        );
        // The sampler re-reads memory and disk, both fine: the storage alarm stays.
        a.evaluate();
        assert!(a.state().storage);
        assert_eq!(
            a.active(),
            vec![(
                "storage",
                "storage failure: fdatasync of WAL file 3: Input/output error".to_string()
            )]
        );
    }

    #[test]
    fn subscribers_see_the_storage_alarm() {
        let a = alarms();
        let rx = a.subscribe();
        a.raise_storage_failure("fdatasync of the metadata journal: Input/output error");
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow().storage);
    }
}
