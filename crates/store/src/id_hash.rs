//! A fast hasher for log ids: the hot path looks a log up on every append and again in the WAL
//! writer for every record, and SipHash costs more there than the rest of the bookkeeping.
//! Log ids are chosen by the broker, not by clients, so hash flooding is not a concern.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplies by a large odd constant (Fibonacci hashing); only `u64` keys are expected.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

/// A map keyed by log id.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
/// A set of log ids.
pub(crate) type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;
