//! The wait at the top of each round of a Raft loop (the metadata group's, the queue groups'):
//! sleep until an input arrives or the next tick is due, then take everything that queued
//! meanwhile, so one round handles a whole burst and one sync covers it.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// Hands `handle` every input that arrives within `wait`, and those queued behind it; false
/// once the loop is to stop (a stop input, or every sender gone).
pub(crate) fn take_inputs<I>(
    inputs: &Receiver<I>,
    wait: Duration,
    is_stop: impl Fn(&I) -> bool,
    mut handle: impl FnMut(I),
) -> bool {
    match inputs.recv_timeout(wait) {
        Ok(input) if is_stop(&input) => false,
        Ok(input) => {
            handle(input);
            while let Ok(input) = inputs.try_recv() {
                if is_stop(&input) {
                    return false;
                }
                handle(input);
            }
            true
        }
        Err(RecvTimeoutError::Timeout) => true,
        Err(RecvTimeoutError::Disconnected) => false,
    }
}
