//! Resource alarms, as RabbitMQ has them: above the memory high watermark, or with less free
//! disk than the disk free limit, publishing connections are blocked (connection.blocked, and
//! their publishes are not read) until the resource recovers. Consumers go on, which is what
//! frees memory and disk.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlarmState {
    pub memory: bool,
    pub disk: bool,
}

impl AlarmState {
    pub fn any(&self) -> bool {
        self.memory || self.disk
    }

    /// The reason connection.blocked carries, in RabbitMQ's words.
    pub fn reason(&self) -> &'static str {
        if self.memory {
            "low on memory"
        } else {
            "low on disk"
        }
    }
}

pub struct Alarms {
    pub memory_watermark_bytes: AtomicU64,
    pub disk_free_limit_bytes: AtomicU64,
    /// The directory whose file system is watched: the WAL's, where publishes land first.
    disk_dir: PathBuf,
    state: watch::Sender<AlarmState>,
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

impl Alarms {
    pub fn new(memory_watermark_bytes: u64, disk_free_limit_bytes: u64, disk_dir: PathBuf) -> Self {
        Alarms {
            memory_watermark_bytes: AtomicU64::new(memory_watermark_bytes),
            disk_free_limit_bytes: AtomicU64::new(disk_free_limit_bytes),
            disk_dir,
            state: watch::channel(AlarmState::default()).0,
        }
    }

    pub fn subscribe(&self) -> watch::Receiver<AlarmState> {
        self.state.subscribe()
    }

    /// Re-reads memory and disk and raises or clears the alarms; called by the sampler and at
    /// once when a limit changes (rabbitmqctl's changes take effect immediately too).
    pub fn evaluate(&self) {
        let rss = crate::memory::rss_bytes();
        let watermark = self.memory_watermark_bytes.load(Ordering::Relaxed);
        let free = disk_free_bytes(&self.disk_dir);
        let limit = self.disk_free_limit_bytes.load(Ordering::Relaxed);
        let now = AlarmState {
            memory: rss > watermark,
            disk: free.is_some_and(|f| f < limit),
        };
        let before = *self.state.borrow();
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
            // send_replace: stored even while no connection is subscribed yet.
            self.state.send_replace(now);
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
