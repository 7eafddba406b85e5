//! Test-only fault injection: the switches a node started with the hidden `--fault-injection`
//! flag holds (its WAL's and its metadata journal's, and a planted bug), which the management
//! API's test-only routes turn (`crate::management`'s `faults`). That flag has no environment
//! variable and no config-file key, so it cannot be turned on by accident; the node then logs
//! a warning at start.

use crate::Shared;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use warren_store::Faults;
/// The switches a node with fault injection on hands to the management API.
#[derive(Debug, Clone, Default)]
pub struct FaultInjection {
    /// The storage engine's (the WAL's) switches.
    pub wal: Arc<Faults>,
    /// The metadata journal's: apart, so a test chooses which file fails.
    pub metadata: Arc<Faults>,
    /// The planted bug: forwarded publishes confirmed, not enqueued.
    pub confirm_without_storing: Arc<AtomicBool>,
}

/// True while the planted bug is on (never without `--fault-injection`).
pub fn confirms_without_storing(s: &Shared) -> bool {
    s.config
        .fault_injection
        .as_ref()
        .is_some_and(|f| f.confirm_without_storing.load(Ordering::Relaxed))
}
