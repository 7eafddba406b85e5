//! Snapshots: the queue's whole state as bytes, so a member (a restarted one, or a new one
//! catching up) starts from them instead of the log prefix they cover, and the log below the
//! release cursor can go.
//!
//! Format: one version byte; the ready messages as varints ([`super::messages::Ready`]'s
//! `encode`: about 3 bytes per message of a backlog, which is most of a queue's state);
//! then the rest (settings, consumers and what they hold, counters) as JSON. Version 2 added
//! the high-priority messages to the ready ones; a version 1 snapshot is read as before. The bodies are
//! not in it: they are in the log entries the live messages point at, which the release
//! cursor keeps.

use super::messages::Ready;
use super::state::QuorumQueue;

/// The first byte of every snapshot; a member refuses one of a version it does not know
/// rather than misread it.
pub const SNAPSHOT_VERSION: u8 = 2;

#[derive(Debug)]
pub enum SnapshotError {
    Version(u8),
    Empty,
    Decode(String),
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Version(v) => write!(f, "quorum queue snapshot of unknown version {v}"),
            SnapshotError::Empty => write!(f, "empty quorum queue snapshot"),
            SnapshotError::Decode(e) => write!(f, "corrupt quorum queue snapshot: {e}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

impl QuorumQueue {
    /// The state as of the last applied entry ([`QuorumQueue::last_applied`]).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = vec![SNAPSHOT_VERSION];
        self.ready.encode(&mut out);
        serde_json::to_writer(&mut out, self).expect("the state is plain data");
        out
    }

    /// The state a snapshot holds; apply the entries after its `last_applied()` next.
    pub fn restore(bytes: &[u8]) -> Result<QuorumQueue, SnapshotError> {
        let (&version, mut rest) = bytes.split_first().ok_or(SnapshotError::Empty)?;
        if version == 0 || version > SNAPSHOT_VERSION {
            return Err(SnapshotError::Version(version));
        }
        let ready = Ready::decode(&mut rest, version).map_err(SnapshotError::Decode)?;
        let mut q: QuorumQueue =
            serde_json::from_slice(rest).map_err(|e| SnapshotError::Decode(e.to_string()))?;
        q.ready = ready;
        q.delivered = q
            .ready
            .iter_delivered()
            .map(|m| m.index)
            .chain(
                q.consumers
                    .all
                    .values()
                    .flat_map(|c| c.checked_out.values().map(|m| m.index)),
            )
            .chain(q.discards.iter().map(|(_, d)| d.index))
            .collect();
        Ok(q)
    }
}

/// LEB128: 7 bits a byte, low first.
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn get_varint(input: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = input.split_first().ok_or("truncated varint")?;
        *input = rest;
        if shift == 63 && b > 1 {
            return Err("varint over 64 bits".into());
        }
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint longer than 64 bits".into())
}

/// A map with keys JSON cannot have (structs), as a list of pairs.
pub(super) mod pairs {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<K, V, S>(map: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize,
        V: Serialize,
        S: Serializer,
    {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        let pairs: Vec<(K, V)> = Vec::deserialize(d)?;
        Ok(pairs.into_iter().collect())
    }
}
