//! A segment's files: the segment (chunks back to back) and its index (one record per chunk),
//! named after the segment's first offset so that a listing of the directory is the order of
//! the stream.
//!
//! ```text
//! NNNNNNNNNNNNNNNNNNNN.segment (20 decimal digits: the first chunk id)
//!  0  8  magic "WRNSTSEG"
//!  8  4  version (1), big endian
//! 12  4  zero
//! 16     chunks, back to back, exactly as `chunk` lays them out
//!
//! NNNNNNNNNNNNNNNNNNNN.index
//!  0  8  magic "WRNSTIDX"
//!  8  4  version (1), big endian
//! 12  4  zero
//! 16  8  chunk sequence number of the segment's first chunk (the n-th chunk of the stream,
//!        from 0, kept across retention: a Raft log's index)
//! 24  4  zero
//! 28  4  crc32c of bytes 0..28
//! 32     records of 48 bytes, record k (chunk sequence number first + k) at 32 + 48 k,
//!        big endian:
//!         0  8  chunk id (first offset)
//!         8  8  timestamp, ms (signed)
//!        16  8  epoch
//!        24  4  file position of the chunk in the segment
//!        28  4  chunk bytes (header, filter, data, trailer)
//!        32  4  records
//!        36  1  chunk type
//!        37  3  zero
//!        40  4  the chunk's data CRC, as in its header
//!        44  4  crc32c of bytes 0..44
//! ```
//!
//! The index file's header is synced when the segment is created, before any chunk goes in.
//! The index record repeats what a reader needs to find a chunk by offset or by timestamp and
//! to hand it out as (file, position, length) without reading the segment; its own checksum
//! catches a torn record, and comparing it with the chunk's header catches a torn chunk.

use std::path::{Path, PathBuf};

use super::chunk::{ChunkHeader, ChunkType};

/// Bytes of a segment file's header: its first chunk starts here.
pub const SEGMENT_HEADER_BYTES: u64 = 16;
/// Bytes of an index file's header.
pub const INDEX_HEADER_BYTES: u64 = 32;
/// Bytes of one index record.
pub const INDEX_RECORD_BYTES: u64 = 48;
const SEGMENT_MAGIC: &[u8; 8] = b"WRNSTSEG";
const INDEX_MAGIC: &[u8; 8] = b"WRNSTIDX";
const VERSION: u32 = 1;

/// The header of a segment file.
pub fn segment_header() -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_be_bytes());
    h
}

/// The header of an index file whose first record is chunk `first_seq` of the stream.
pub fn index_header(first_seq: u64) -> [u8; INDEX_HEADER_BYTES as usize] {
    let mut h = [0u8; INDEX_HEADER_BYTES as usize];
    h[..8].copy_from_slice(INDEX_MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_be_bytes());
    h[16..24].copy_from_slice(&first_seq.to_be_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_be_bytes());
    h
}

/// The first chunk sequence number an index header names, if the header is whole.
pub fn parse_index_header(h: &[u8]) -> Option<u64> {
    let h = h.get(..INDEX_HEADER_BYTES as usize)?;
    let first_seq = u64::from_be_bytes(h[16..24].try_into().expect("8"));
    (h == index_header(first_seq)).then_some(first_seq)
}

/// The segment file whose first chunk id is `first`.
pub fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.segment"))
}

/// The index file of the segment whose first chunk id is `first`.
pub fn index_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.index"))
}

/// What a file name in a stream's directory is: (first offset, is it an index).
pub fn parse_name(name: &str) -> Option<(u64, bool)> {
    let (stem, is_index) = match name.strip_suffix(".segment") {
        Some(stem) => (stem, false),
        None => (name.strip_suffix(".index")?, true),
    };
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, is_index))
}

/// One chunk as the index knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexRecord {
    /// The chunk's first offset.
    pub chunk_id: u64,
    /// The chunk's timestamp.
    pub timestamp_ms: i64,
    /// The chunk's epoch.
    pub epoch: u64,
    /// Where the chunk starts in the segment file.
    pub position: u32,
    /// Bytes of the whole chunk.
    pub chunk_bytes: u32,
    /// Records (offsets) in the chunk.
    pub records: u32,
    /// What the chunk holds.
    pub chunk_type: ChunkType,
    /// The chunk's data CRC.
    pub data_crc: u32,
}

impl IndexRecord {
    /// The record of the chunk with `header`, written at `position`.
    pub fn of(header: &ChunkHeader, position: u32) -> IndexRecord {
        IndexRecord {
            chunk_id: header.chunk_id,
            timestamp_ms: header.timestamp_ms,
            epoch: header.epoch,
            position,
            chunk_bytes: header.chunk_bytes() as u32,
            records: header.records,
            chunk_type: header.chunk_type,
            data_crc: header.data_crc,
        }
    }

    /// One past the chunk's last offset.
    pub fn next_offset(&self) -> u64 {
        self.chunk_id + u64::from(self.records)
    }

    /// One past the chunk's last byte in the segment.
    pub fn end_position(&self) -> u64 {
        u64::from(self.position) + u64::from(self.chunk_bytes)
    }

    /// Whether a chunk header read from the segment is the chunk this record describes.
    pub fn matches(&self, header: &ChunkHeader) -> bool {
        *self == IndexRecord::of(header, self.position)
    }

    /// The 48 bytes of the record.
    pub fn encode(&self) -> [u8; INDEX_RECORD_BYTES as usize] {
        let mut b = [0u8; INDEX_RECORD_BYTES as usize];
        b[0..8].copy_from_slice(&self.chunk_id.to_be_bytes());
        b[8..16].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_be_bytes());
        b[24..28].copy_from_slice(&self.position.to_be_bytes());
        b[28..32].copy_from_slice(&self.chunk_bytes.to_be_bytes());
        b[32..36].copy_from_slice(&self.records.to_be_bytes());
        b[36] = self.chunk_type as u8;
        b[40..44].copy_from_slice(&self.data_crc.to_be_bytes());
        let crc = crc32c::crc32c(&b[..44]);
        b[44..48].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Decodes a record; `None` when its checksum fails or a field is impossible (a torn or
    /// zeroed record).
    pub fn decode(b: &[u8]) -> Option<IndexRecord> {
        let b = b.get(..INDEX_RECORD_BYTES as usize)?;
        let u32_at = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8"));
        if crc32c::crc32c(&b[..44]) != u32_at(44) || b[37..40] != [0, 0, 0] {
            return None;
        }
        let record = IndexRecord {
            chunk_id: u64_at(0),
            timestamp_ms: u64_at(8) as i64,
            epoch: u64_at(16),
            position: u32_at(24),
            chunk_bytes: u32_at(28),
            records: u32_at(32),
            chunk_type: ChunkType::from_u8(b[36])?,
            data_crc: u32_at(40),
        };
        let sane = record.records > 0
            && u64::from(record.position) >= SEGMENT_HEADER_BYTES
            && record.chunk_bytes as usize >= super::chunk::CHUNK_HEADER_BYTES
            && record.chunk_bytes as usize <= super::chunk::CHUNK_BYTES_MAX
            && record
                .chunk_id
                .checked_add(u64::from(record.records))
                .is_some();
        sane.then_some(record)
    }
}

/// Where index record `k` lives in the index file.
pub fn record_position(k: u64) -> u64 {
    INDEX_HEADER_BYTES + INDEX_RECORD_BYTES * k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_as_offsets_and_round_trip() {
        let p = segment_path(Path::new("/s"), 1234);
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "00000000000000001234.segment");
        assert_eq!(parse_name(name), Some((1234, false)));
        assert_eq!(
            parse_name("18446744073709551615.index"),
            Some((u64::MAX, true))
        );
        assert_eq!(parse_name("99999999999999999999.index"), None);
        assert_eq!(parse_name("0001.index"), None);
        assert_eq!(parse_name("0000000000000000000x.index"), None);
    }

    #[test]
    fn index_header_names_its_first_sequence_number() {
        let h = index_header(1 << 40);
        assert_eq!(parse_index_header(&h), Some(1 << 40));
        for bit in 0..h.len() * 8 {
            let mut bad = h;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(parse_index_header(&bad), None, "bit {bit}");
        }
        assert_eq!(parse_index_header(&h[..31]), None);
    }

    #[test]
    fn any_flipped_bit_of_a_record_is_caught() {
        let r = IndexRecord {
            chunk_id: 77,
            timestamp_ms: -5,
            epoch: 2,
            position: 16,
            chunk_bytes: 100,
            records: 3,
            chunk_type: ChunkType::TrackingDelta,
            data_crc: 0xdead_beef,
        };
        let b = r.encode();
        assert_eq!(IndexRecord::decode(&b), Some(r));
        for bit in 0..b.len() * 8 {
            let mut bad = b;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(IndexRecord::decode(&bad), Some(r), "bit {bit}");
        }
        assert_eq!(IndexRecord::decode(&[0u8; 48]), None);
    }
}
