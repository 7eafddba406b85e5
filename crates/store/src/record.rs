//! The record: the unit written to the WAL and, byte for byte the same, to segment data areas.
//!
//! Layout (little endian), 32-byte header then payload:
//!
//! ```text
//! offset size field
//!  0     4    crc32c of bytes 4..32 followed by the payload
//!  4     4    kind (top 4 bits: 1 append, 2 truncate, 3 release, 4 release prefix,
//!             5 delete log, 6 release range: entries `index` to `term` inclusive,
//!             7 padding: zeros up to the next page boundary, skipped (WAL version 2),
//!             8 hard state: Raft's term in `term`, commit in `index`, vote in the payload,
//!             9 batch end: the WAL file's sequence in `log id`, the batch's first byte in
//!             `index`, the crc32c of the batch's records in `term`, then zeros up to the
//!             next page boundary)
//!             and payload length in bytes (low 28 bits)
//!  8     8    log id
//! 16     8    index
//! 24     8    term
//! 32     len  payload (entry data, or snapshot blob for a release prefix)
//! ```
//!
//! The header is per entry, so its size is a share of every message's disk writes: 32 bytes
//! are 3 % of a 1 KB message (the first layout, 40 bytes with 7 padding bytes, was 4 %).
//!
//! A zeroed header (kind 0) is never valid, so a preallocated or torn tail stops replay.

use crate::config::PAYLOAD_BYTES_MAX;

/// Size of a record header in bytes.
pub const RECORD_HEADER_BYTES: usize = 32;
/// Bits of the kind-and-length word that hold the payload length.
const LEN_BITS: u32 = 28;
const LEN_MASK: u32 = (1 << LEN_BITS) - 1;

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// An entry: index, term, payload.
    Append = 1,
    /// Entries from `index` on are gone (a Raft conflict).
    Truncate = 2,
    /// The entry at `index` is consumed and acknowledged.
    Release = 3,
    /// Everything up to `index` (of `term`) is gone; the payload is the snapshot blob.
    ReleasePrefix = 4,
    /// The whole log is gone.
    DeleteLog = 5,
    /// The entries from `index` to the record's `term` field, inclusive, are consumed and
    /// acknowledged: the WAL writer's coalescing of a run of [`RecordKind::Release`]s, so that
    /// consumers acking in order cost one record per group commit instead of one per message.
    ReleaseRange = 6,
    /// Zeros that ended a WAL batch on a page boundary in WAL files of version 2; says
    /// nothing. Version 3 ends batches with [`RecordKind::BatchEnd`] instead.
    Padding = 7,
    /// A Raft group's hard state: `term` is its current term, `index` its commit index, the
    /// payload (8 bytes, little endian) the node it voted for. Kept in the WAL beside the
    /// group's entries so that one fsync makes both durable.
    HardState = 8,
    /// The end of a WAL batch: `log_id` is the WAL file's sequence, `index` the file offset of
    /// the batch's first record, `term` the crc32c of the batch's records; zeros follow up to
    /// the next page boundary, so that the next batch starts on a page of its own. A recycled
    /// WAL file still holds valid records of its previous life past its current ones: replay
    /// takes a batch only when its end names this file and the checksum matches (see
    /// `wal_reader`).
    BatchEnd = 9,
}

impl RecordKind {
    fn from_u8(v: u8) -> Option<RecordKind> {
        Some(match v {
            1 => RecordKind::Append,
            2 => RecordKind::Truncate,
            3 => RecordKind::Release,
            4 => RecordKind::ReleasePrefix,
            5 => RecordKind::DeleteLog,
            6 => RecordKind::ReleaseRange,
            7 => RecordKind::Padding,
            8 => RecordKind::HardState,
            9 => RecordKind::BatchEnd,
            _ => return None,
        })
    }
}

/// A decoded, checksum-verified record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// The record's checksum, as stored.
    pub crc: u32,
    /// Payload length.
    pub len: u32,
    /// What the record says.
    pub kind: RecordKind,
    /// The log it belongs to.
    pub log_id: u64,
    /// The entry index it is about.
    pub index: u64,
    /// The entry's term.
    pub term: u64,
}

impl RecordHeader {
    /// Bytes taken by the whole record.
    pub fn record_bytes(&self) -> usize {
        RECORD_HEADER_BYTES + self.len as usize
    }
}

/// Appends one encoded record to `buf` and returns its checksum.
pub fn encode(
    buf: &mut Vec<u8>,
    kind: RecordKind,
    log_id: u64,
    index: u64,
    term: u64,
    payload: &[u8],
) -> u32 {
    assert!(payload.len() <= PAYLOAD_BYTES_MAX);
    let start = buf.len();
    buf.extend_from_slice(&[0u8; 4]);
    let kind_and_len = (kind as u32) << LEN_BITS | payload.len() as u32;
    buf.extend_from_slice(&kind_and_len.to_le_bytes());
    buf.extend_from_slice(&log_id.to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    buf.extend_from_slice(&term.to_le_bytes());
    buf.extend_from_slice(payload);
    let crc = crc32c::crc32c(&buf[start + 4..]);
    buf[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    crc
}

/// The payload length a record header announces, before its checksum is verified: how many
/// more bytes to read for the whole record.
pub fn payload_len(header: &[u8]) -> usize {
    (u32_at(header, 4) & LEN_MASK) as usize
}

/// The result of decoding bytes that should start with a record.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, verified record and its payload.
    Record(RecordHeader, &'a [u8]),
    /// The bytes end inside the record: a torn tail, or read more.
    Incomplete,
    /// The bytes are not a valid record.
    Corrupt,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Decodes and verifies the record at the start of `buf`.
pub fn decode(buf: &[u8]) -> Decoded<'_> {
    if buf.len() < RECORD_HEADER_BYTES {
        return Decoded::Incomplete;
    }
    let word = u32_at(buf, 4);
    let len = word & LEN_MASK;
    let Some(kind) = RecordKind::from_u8((word >> LEN_BITS) as u8) else {
        return Decoded::Corrupt;
    };
    if len as usize > PAYLOAD_BYTES_MAX {
        return Decoded::Corrupt;
    }
    let total = RECORD_HEADER_BYTES + len as usize;
    if buf.len() < total {
        return Decoded::Incomplete;
    }
    let crc = u32_at(buf, 0);
    if crc32c::crc32c(&buf[4..total]) != crc {
        return Decoded::Corrupt;
    }
    let header = RecordHeader {
        crc,
        len,
        kind,
        log_id: u64_at(buf, 8),
        index: u64_at(buf, 16),
        term: u64_at(buf, 24),
    };
    Decoded::Record(header, &buf[RECORD_HEADER_BYTES..total])
}

/// Reads the record of entry (`log_id`, `index`) at `offset` of `file` and verifies it right after
/// the read: checksum, kind, log id, index and length must all match what the index promised.
pub(crate) fn read_entry_at(
    file: &std::fs::File,
    offset: u64,
    payload_len: u32,
    log_id: u64,
    index: u64,
) -> crate::Result<(u64, bytes::Bytes)> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; RECORD_HEADER_BYTES + payload_len as usize];
    file.read_exact_at(&mut buf, offset)?;
    match decode(&buf) {
        Decoded::Record(h, _)
            if h.kind == RecordKind::Append
                && h.log_id == log_id
                && h.index == index
                && h.len == payload_len =>
        {
            let term = h.term;
            let mut bytes = bytes::Bytes::from(buf);
            Ok((term, bytes.split_off(RECORD_HEADER_BYTES)))
        }
        _ => Err(crate::Error::Corrupt(format!(
            "log {log_id} entry {index}: bad record at offset {offset}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_any_flipped_bit_is_caught() {
        let mut buf = Vec::new();
        let crc = encode(&mut buf, RecordKind::Append, 7, 42, 3, b"hello");
        assert_eq!(buf.len(), RECORD_HEADER_BYTES + 5);
        match decode(&buf) {
            Decoded::Record(h, p) => {
                assert_eq!(
                    (h.crc, h.kind, h.log_id, h.index, h.term),
                    (crc, RecordKind::Append, 7, 42, 3)
                );
                assert_eq!(p, b"hello");
            }
            other => panic!("{other:?}"),
        }
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(decode(&bad), Decoded::Record(..)),
                "flipped bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn short_buffers_are_incomplete_and_zeroes_are_corrupt() {
        let mut buf = Vec::new();
        encode(&mut buf, RecordKind::Release, 1, 2, 3, b"");
        assert_eq!(decode(&buf[..RECORD_HEADER_BYTES - 1]), Decoded::Incomplete);
        assert_eq!(decode(&[0u8; 64]), Decoded::Corrupt);
        let mut with_payload = Vec::new();
        encode(&mut with_payload, RecordKind::Append, 1, 2, 3, b"abcdef");
        assert_eq!(
            decode(&with_payload[..with_payload.len() - 1]),
            Decoded::Incomplete
        );
    }
}
