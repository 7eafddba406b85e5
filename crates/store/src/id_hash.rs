//! A fast hasher for ids: the hot path looks a log up on every append and again in the WAL
//! writer for every record, and SipHash costs more there than the rest of the bookkeeping.
//! The broker's own maps keyed by the ids it numbers (queues, channels, groups) use it too,
//! for the same reason. Such ids are chosen by the broker, not by clients, so hash flooding
//! is not a concern; maps keyed by names a client chose keep the default hasher.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplies by a large odd constant (Fibonacci hashing); meant for integer keys.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
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
/// A map keyed by ids the broker numbers (never by names a client chose).
pub type IdHashMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set of ids the broker numbers.
pub type IdHashSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;
