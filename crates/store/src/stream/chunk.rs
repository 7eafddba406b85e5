//! The chunk: the unit a stream writes, reads and replicates, laid out byte for byte as
//! RabbitMQ's osiris chunk, which is what the stream protocol's `Deliver` carries. A `Deliver`
//! is then a small frame header plus the chunk's bytes straight from the segment file.
//!
//! ```text
//! header, 48 bytes, big endian (as the stream protocol):
//!  0  1  magic (high 4 bits, 5) and version (low 4 bits, 0; 1 is read too)
//!  1  1  chunk type: 0 user, 1 tracking delta, 2 tracking snapshot (osiris's); 3 empty,
//!        4 configuration (warren's: Raft's own entries, which consumers never see)
//!  2  2  number of entries
//!  4  4  number of records (a simple entry is one, a sub-batch says how many it holds)
//!  8  8  timestamp, milliseconds since the Unix epoch (signed)
//! 16  8  epoch
//! 24  8  chunk id: the offset of the chunk's first record
//! 32  4  CRC-32 (IEEE, as zlib and erlang:crc32) of the data section
//! 36  4  data length
//! 40  4  trailer length
//! 44  1  filter length (a Bloom filter, 3.13's stream filtering)
//! 45  3  reserved, zero
//! 48     filter (filter length bytes), data (data length), trailer (trailer length)
//!
//! data: `number of entries` entries back to back, each
//!   simple:    bit 0 = 0, 31-bit body length; body
//!   sub-batch: bit 0 = 1, 3-bit compression, 4 reserved bits; u16 records;
//!              u32 uncompressed length; u32 body length; body (11-byte header)
//! ```
//!
//! Osiris's CRC covers the data section only; the filter and trailer are opaque here (the
//! stream layer above writes tracking into trailers and filters into filters). A segment's
//! index record checks the header (see `index`), so a damaged header is caught too.

use std::fmt;

/// Bytes of a chunk header.
pub const CHUNK_HEADER_BYTES: usize = 48;
/// The first byte of a chunk this crate writes: magic 5, version 0, as RabbitMQ 3.10 writes.
pub const MAGIC_VERSION: u8 = 0x50;
/// Largest whole chunk (header, filter, data, trailer): a chunk is read into memory whole when
/// it is decoded, so this bounds a reader's buffer. It takes one of RabbitMQ's largest
/// messages (128 MiB by default) with room to spare.
pub const CHUNK_BYTES_MAX: usize = 256 << 20;
/// Most entries in one chunk: what the header's 16-bit count holds.
pub const CHUNK_ENTRIES_MAX: usize = u16::MAX as usize;
/// Largest body of a simple entry: its 31-bit length.
pub const SIMPLE_BODY_BYTES_MAX: usize = (1 << 31) - 1;
/// Bytes before a simple entry's body.
pub const SIMPLE_ENTRY_HEADER_BYTES: usize = 4;
/// Bytes before a sub-batch entry's body.
pub const SUB_BATCH_HEADER_BYTES: usize = 11;
/// Largest filter: its length is one byte.
pub const FILTER_BYTES_MAX: usize = u8::MAX as usize;

/// What a chunk holds, as osiris numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ChunkType {
    /// Messages.
    User = 0,
    /// Changes of publisher sequences and consumer offsets (deduplication, offset tracking).
    TrackingDelta = 1,
    /// All tracking state at once, written at the start of a segment.
    TrackingSnapshot = 2,
    /// A Raft leader's empty entry at the start of its term: stored and counted (it takes an
    /// offset and a chunk sequence number), skipped by consumers' readers.
    Empty = 3,
    /// A Raft configuration change (its entry is the change): stored and counted, skipped by
    /// consumers' readers.
    Configuration = 4,
}

impl ChunkType {
    /// The type a header byte names, if any.
    pub fn from_u8(v: u8) -> Option<ChunkType> {
        match v {
            0 => Some(ChunkType::User),
            1 => Some(ChunkType::TrackingDelta),
            2 => Some(ChunkType::TrackingSnapshot),
            3 => Some(ChunkType::Empty),
            4 => Some(ChunkType::Configuration),
            _ => None,
        }
    }
}

/// A decoded chunk header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// What the chunk holds.
    pub chunk_type: ChunkType,
    /// Entries in the data section.
    pub entries: u16,
    /// Records (offsets) the chunk takes: at least one.
    pub records: u32,
    /// Milliseconds since the Unix epoch, as the writer's caller said.
    pub timestamp_ms: i64,
    /// The leader's epoch when the chunk was written.
    pub epoch: u64,
    /// The offset of the first record.
    pub chunk_id: u64,
    /// CRC-32 of the data section.
    pub data_crc: u32,
    /// Bytes of the data section.
    pub data_bytes: u32,
    /// Bytes of the trailer.
    pub trailer_bytes: u32,
    /// Bytes of the filter.
    pub filter_bytes: u8,
}

impl ChunkHeader {
    /// Bytes of the whole chunk, header included.
    pub fn chunk_bytes(&self) -> u64 {
        CHUNK_HEADER_BYTES as u64
            + u64::from(self.filter_bytes)
            + u64::from(self.data_bytes)
            + u64::from(self.trailer_bytes)
    }

    /// One past the chunk's last offset: the next chunk's id.
    pub fn next_offset(&self) -> u64 {
        self.chunk_id + u64::from(self.records)
    }

    /// Where the data section starts, from the chunk's first byte.
    pub fn data_start(&self) -> usize {
        CHUNK_HEADER_BYTES + usize::from(self.filter_bytes)
    }

    /// The 48 header bytes.
    pub fn encode(&self) -> [u8; CHUNK_HEADER_BYTES] {
        let mut h = [0u8; CHUNK_HEADER_BYTES];
        h[0] = MAGIC_VERSION;
        h[1] = self.chunk_type as u8;
        h[2..4].copy_from_slice(&self.entries.to_be_bytes());
        h[4..8].copy_from_slice(&self.records.to_be_bytes());
        h[8..16].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        h[16..24].copy_from_slice(&self.epoch.to_be_bytes());
        h[24..32].copy_from_slice(&self.chunk_id.to_be_bytes());
        h[32..36].copy_from_slice(&self.data_crc.to_be_bytes());
        h[36..40].copy_from_slice(&self.data_bytes.to_be_bytes());
        h[40..44].copy_from_slice(&self.trailer_bytes.to_be_bytes());
        h[44] = self.filter_bytes;
        h
    }

    /// Decodes and checks a header on its own: magic, version, type, counts, sizes within
    /// [`CHUNK_BYTES_MAX`]. The data is not checked (see [`Chunk::parse`]).
    pub fn decode(b: &[u8]) -> Result<ChunkHeader, ChunkError> {
        if b.len() < CHUNK_HEADER_BYTES {
            return Err(ChunkError::Truncated);
        }
        if b[0] >> 4 != MAGIC_VERSION >> 4 || b[0] & 0x0f > 1 {
            return Err(ChunkError::BadMagic(b[0]));
        }
        let chunk_type = ChunkType::from_u8(b[1]).ok_or(ChunkError::BadType(b[1]))?;
        let u32_at = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8"));
        let header = ChunkHeader {
            chunk_type,
            entries: u16::from_be_bytes([b[2], b[3]]),
            records: u32_at(4),
            timestamp_ms: u64_at(8) as i64,
            epoch: u64_at(16),
            chunk_id: u64_at(24),
            data_crc: u32_at(32),
            data_bytes: u32_at(36),
            trailer_bytes: u32_at(40),
            filter_bytes: b[44],
        };
        if header.entries == 0 || header.records == 0 || header.records < u32::from(header.entries)
        {
            return Err(ChunkError::BadCounts);
        }
        if header.chunk_bytes() > CHUNK_BYTES_MAX as u64 {
            return Err(ChunkError::TooLarge(header.chunk_bytes()));
        }
        if header
            .chunk_id
            .checked_add(u64::from(header.records))
            .is_none()
        {
            return Err(ChunkError::BadCounts);
        }
        Ok(header)
    }
}

/// Why bytes are not a chunk. Cheap: decoding runs on every chunk a replica receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkError {
    /// The bytes end before the chunk does (a torn tail, or read more).
    Truncated,
    /// The first byte is not magic 5 with version 0 or 1.
    BadMagic(u8),
    /// An unknown chunk type.
    BadType(u8),
    /// No entries, no records, or counts that disagree with the entries.
    BadCounts,
    /// Over [`CHUNK_BYTES_MAX`].
    TooLarge(u64),
    /// The data section fails its CRC.
    BadCrc,
    /// The entries do not fill the data section exactly.
    BadEntries,
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkError::Truncated => write!(f, "chunk truncated"),
            ChunkError::BadMagic(b) => write!(f, "bad chunk magic/version byte {b:#04x}"),
            ChunkError::BadType(t) => write!(f, "unknown chunk type {t}"),
            ChunkError::BadCounts => write!(f, "chunk entry/record counts are inconsistent"),
            ChunkError::TooLarge(n) => {
                write!(
                    f,
                    "chunk of {n} bytes is over the limit of {CHUNK_BYTES_MAX}"
                )
            }
            ChunkError::BadCrc => write!(f, "chunk data fails its CRC"),
            ChunkError::BadEntries => write!(f, "chunk entries do not fill its data section"),
        }
    }
}

impl std::error::Error for ChunkError {}

/// One entry of a chunk's data section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// One record.
    Simple(&'a [u8]),
    /// Several records in one body, possibly compressed by the client (the store never looks
    /// inside: a consumer decompresses).
    SubBatch {
        /// The client's compression code (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).
        compression: u8,
        /// Records in the body: the offsets this entry takes.
        records: u16,
        /// Bytes of the body uncompressed.
        uncompressed_bytes: u32,
        /// The body as stored.
        body: &'a [u8],
    },
}

impl Entry<'_> {
    /// Offsets the entry takes.
    pub fn records(&self) -> u32 {
        match self {
            Entry::Simple(_) => 1,
            Entry::SubBatch { records, .. } => u32::from(*records),
        }
    }

    /// Bytes the entry takes in the data section.
    pub fn encoded_bytes(&self) -> usize {
        match self {
            Entry::Simple(b) => SIMPLE_ENTRY_HEADER_BYTES + b.len(),
            Entry::SubBatch { body, .. } => SUB_BATCH_HEADER_BYTES + body.len(),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Entry::Simple(b) => {
                assert!(b.len() <= SIMPLE_BODY_BYTES_MAX);
                out.extend_from_slice(&(b.len() as u32).to_be_bytes());
                out.extend_from_slice(b);
            }
            Entry::SubBatch {
                compression,
                records,
                uncompressed_bytes,
                body,
            } => {
                assert!(compression < 8 && body.len() <= u32::MAX as usize);
                out.push(0x80 | (compression << 4));
                out.extend_from_slice(&records.to_be_bytes());
                out.extend_from_slice(&uncompressed_bytes.to_be_bytes());
                out.extend_from_slice(&(body.len() as u32).to_be_bytes());
                out.extend_from_slice(body);
            }
        }
    }
}

/// What the encoder needs besides the entries.
#[derive(Clone, Copy, Debug)]
pub struct ChunkMeta<'a> {
    /// What the chunk holds.
    pub chunk_type: ChunkType,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The writer's epoch.
    pub epoch: u64,
    /// The offset of the first record.
    pub chunk_id: u64,
    /// Filter bytes (at most [`FILTER_BYTES_MAX`]), empty for none.
    pub filter: &'a [u8],
    /// Trailer bytes, empty for none.
    pub trailer: &'a [u8],
}

/// Checks that `entries` with `meta` make a chunk within the limits: at least one entry, at
/// most [`CHUNK_ENTRIES_MAX`], every sub-batch with at least one record, at most
/// [`CHUNK_BYTES_MAX`] bytes in all. Returns the chunk's size.
pub fn check(meta: &ChunkMeta<'_>, entries: &[Entry<'_>]) -> Result<usize, ChunkError> {
    if entries.is_empty() || entries.len() > CHUNK_ENTRIES_MAX {
        return Err(ChunkError::BadCounts);
    }
    if meta.filter.len() > FILTER_BYTES_MAX {
        return Err(ChunkError::TooLarge(meta.filter.len() as u64));
    }
    let mut bytes = CHUNK_HEADER_BYTES + meta.filter.len() + meta.trailer.len();
    let mut records = 0u64;
    for e in entries {
        match e {
            Entry::SubBatch { records: 0, .. } => return Err(ChunkError::BadCounts),
            Entry::SubBatch { compression, .. } if *compression >= 8 => {
                return Err(ChunkError::BadEntries)
            }
            Entry::Simple(b) if b.len() > SIMPLE_BODY_BYTES_MAX => {
                return Err(ChunkError::TooLarge(b.len() as u64))
            }
            _ => {}
        }
        bytes = bytes.saturating_add(e.encoded_bytes());
        records += u64::from(e.records());
    }
    if bytes > CHUNK_BYTES_MAX {
        return Err(ChunkError::TooLarge(bytes as u64));
    }
    if meta.chunk_id.checked_add(records).is_none() {
        return Err(ChunkError::BadCounts);
    }
    Ok(bytes)
}

/// Appends the chunk of `entries` to `out` and returns its header. The entries must pass
/// [`check`] (a programmer error otherwise: the writer checks first).
pub fn encode(out: &mut Vec<u8>, meta: &ChunkMeta<'_>, entries: &[Entry<'_>]) -> ChunkHeader {
    let bytes = check(meta, entries).expect("chunk within limits");
    out.reserve(bytes);
    let start = out.len();
    out.extend_from_slice(&[0u8; CHUNK_HEADER_BYTES]);
    out.extend_from_slice(meta.filter);
    let data_start = out.len();
    let mut records = 0u32;
    for e in entries {
        e.encode(out);
        records += e.records();
    }
    let data = &out[data_start..];
    let header = ChunkHeader {
        chunk_type: meta.chunk_type,
        entries: entries.len() as u16,
        records,
        timestamp_ms: meta.timestamp_ms,
        epoch: meta.epoch,
        chunk_id: meta.chunk_id,
        data_crc: crc32fast::hash(data),
        data_bytes: data.len() as u32,
        trailer_bytes: meta.trailer.len() as u32,
        filter_bytes: meta.filter.len() as u8,
    };
    out.extend_from_slice(meta.trailer);
    out[start..start + CHUNK_HEADER_BYTES].copy_from_slice(&header.encode());
    debug_assert_eq!(out.len() - start, bytes);
    header
}

/// A whole chunk, checked: header, CRC, and entries that fill the data section exactly with
/// the header's counts.
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    /// Its header.
    pub header: ChunkHeader,
    /// The filter section.
    pub filter: &'a [u8],
    /// The data section (entries).
    pub data: &'a [u8],
    /// The trailer section.
    pub trailer: &'a [u8],
}

impl<'a> Chunk<'a> {
    /// Decodes the chunk at the start of `b` (bytes past its end are ignored). Never panics,
    /// whatever the bytes.
    pub fn parse(b: &'a [u8]) -> Result<Chunk<'a>, ChunkError> {
        let header = ChunkHeader::decode(b)?;
        let total = header.chunk_bytes() as usize;
        if b.len() < total {
            return Err(ChunkError::Truncated);
        }
        let data_start = header.data_start();
        let data_end = data_start + header.data_bytes as usize;
        let data = &b[data_start..data_end];
        if crc32fast::hash(data) != header.data_crc {
            return Err(ChunkError::BadCrc);
        }
        let chunk = Chunk {
            header,
            filter: &b[CHUNK_HEADER_BYTES..data_start],
            data,
            trailer: &b[data_end..total],
        };
        let (mut entries, mut records) = (0u32, 0u64);
        for e in chunk.raw_entries() {
            let e = e?;
            entries += 1;
            records += u64::from(e.records());
        }
        if entries != u32::from(header.entries) || records != u64::from(header.records) {
            return Err(ChunkError::BadCounts);
        }
        Ok(chunk)
    }

    /// The whole chunk's bytes in its buffer.
    pub fn bytes_len(&self) -> usize {
        self.header.chunk_bytes() as usize
    }

    /// The entries with the offset of each one's first record.
    pub fn entries(&self) -> impl Iterator<Item = (u64, Entry<'a>)> + 'a {
        let mut offset = self.header.chunk_id;
        self.raw_entries().map_while(Result::ok).map(move |e| {
            let at = offset;
            offset += u64::from(e.records());
            (at, e)
        })
    }

    fn raw_entries(&self) -> EntryIter<'a> {
        EntryIter {
            rest: self.data,
            left: self.header.entries,
        }
    }
}

/// Walks a data section, one entry at a time, refusing any entry that overruns it and any
/// bytes left after the header's count.
struct EntryIter<'a> {
    rest: &'a [u8],
    left: u16,
}

impl<'a> Iterator for EntryIter<'a> {
    type Item = Result<Entry<'a>, ChunkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            if self.rest.is_empty() {
                return None;
            }
            self.rest = &[];
            return Some(Err(ChunkError::BadEntries));
        }
        self.left -= 1;
        let r = decode_entry(self.rest);
        match r {
            Ok((e, used)) => {
                self.rest = &self.rest[used..];
                Some(Ok(e))
            }
            Err(err) => {
                self.left = 0;
                self.rest = &[];
                Some(Err(err))
            }
        }
    }
}

fn decode_entry(b: &[u8]) -> Result<(Entry<'_>, usize), ChunkError> {
    let first = *b.first().ok_or(ChunkError::BadEntries)?;
    if first & 0x80 == 0 {
        let head = b
            .get(..SIMPLE_ENTRY_HEADER_BYTES)
            .ok_or(ChunkError::BadEntries)?;
        let len = u32::from_be_bytes(head.try_into().expect("4")) as usize;
        let body = b
            .get(SIMPLE_ENTRY_HEADER_BYTES..SIMPLE_ENTRY_HEADER_BYTES + len)
            .ok_or(ChunkError::BadEntries)?;
        Ok((Entry::Simple(body), SIMPLE_ENTRY_HEADER_BYTES + len))
    } else {
        let head = b
            .get(..SUB_BATCH_HEADER_BYTES)
            .ok_or(ChunkError::BadEntries)?;
        let records = u16::from_be_bytes([head[1], head[2]]);
        if records == 0 {
            return Err(ChunkError::BadCounts);
        }
        let uncompressed_bytes = u32::from_be_bytes(head[3..7].try_into().expect("4"));
        let len = u32::from_be_bytes(head[7..11].try_into().expect("4")) as usize;
        let body = b
            .get(SUB_BATCH_HEADER_BYTES..SUB_BATCH_HEADER_BYTES + len)
            .ok_or(ChunkError::BadEntries)?;
        let entry = Entry::SubBatch {
            compression: (first >> 4) & 0x07,
            records,
            uncompressed_bytes,
            body,
        };
        Ok((entry, SUB_BATCH_HEADER_BYTES + len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(chunk_id: u64) -> ChunkMeta<'static> {
        ChunkMeta {
            chunk_type: ChunkType::User,
            timestamp_ms: 1_700_000_000_123,
            epoch: 3,
            chunk_id,
            filter: b"",
            trailer: b"",
        }
    }

    #[test]
    fn chunk_of_simple_entries_is_laid_out_as_osiris_lays_it_out() {
        let mut out = Vec::new();
        let h = encode(
            &mut out,
            &meta(7),
            &[Entry::Simple(b"ab"), Entry::Simple(b"")],
        );
        assert_eq!(out.len(), 48 + 4 + 2 + 4);
        assert_eq!(out[0], 0x50);
        assert_eq!(out[1], 0);
        assert_eq!(&out[2..4], &[0, 2]);
        assert_eq!(&out[4..8], &[0, 0, 0, 2]);
        assert_eq!(&out[8..16], &1_700_000_000_123i64.to_be_bytes());
        assert_eq!(&out[16..24], &3u64.to_be_bytes());
        assert_eq!(&out[24..32], &7u64.to_be_bytes());
        // CRC-32/IEEE of the data section, as zlib computes it.
        let data = [0, 0, 0, 2, b'a', b'b', 0, 0, 0, 0];
        assert_eq!(&out[32..36], &crc32fast::hash(&data).to_be_bytes());
        assert_eq!(&out[36..40], &10u32.to_be_bytes());
        assert_eq!(&out[40..48], &[0u8; 8]);
        assert_eq!(&out[48..], &data);
        assert_eq!(h.next_offset(), 9);
        let c = Chunk::parse(&out).unwrap();
        let got: Vec<_> = c.entries().collect();
        assert_eq!(
            got,
            vec![(7, Entry::Simple(b"ab")), (8, Entry::Simple(b""))]
        );
    }

    #[test]
    fn sub_batch_takes_as_many_offsets_as_it_has_records() {
        let mut out = Vec::new();
        let sub = Entry::SubBatch {
            compression: 1,
            records: 5,
            uncompressed_bytes: 99,
            body: b"zzz",
        };
        let meta = ChunkMeta {
            filter: b"ff",
            trailer: b"ttt",
            ..meta(10)
        };
        let h = encode(
            &mut out,
            &meta,
            &[Entry::Simple(b"x"), sub, Entry::Simple(b"y")],
        );
        assert_eq!((h.entries, h.records, h.next_offset()), (3, 7, 17));
        // The sub-batch header: type bit and compression, records, uncompressed, length.
        let at = 48 + 2 + 5;
        assert_eq!(&out[at..at + 11], &[0x90, 0, 5, 0, 0, 0, 99, 0, 0, 0, 3]);
        let c = Chunk::parse(&out).unwrap();
        assert_eq!((c.filter, c.trailer), (&b"ff"[..], &b"ttt"[..]));
        let offsets: Vec<u64> = c.entries().map(|(o, _)| o).collect();
        assert_eq!(offsets, vec![10, 11, 16]);
    }

    #[test]
    fn damaged_or_short_chunks_are_refused() {
        let mut out = Vec::new();
        encode(&mut out, &meta(0), &[Entry::Simple(b"hello")]);
        for cut in 0..out.len() {
            assert!(Chunk::parse(&out[..cut]).is_err(), "cut at {cut}");
        }
        for bit in (48 * 8)..out.len() * 8 {
            let mut bad = out.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Chunk::parse(&bad).is_err(), "flipped data bit {bit}");
        }
        let mut bad = out.clone();
        bad[0] = 0x60;
        assert_eq!(Chunk::parse(&bad).unwrap_err(), ChunkError::BadMagic(0x60));
        let mut bad = out.clone();
        bad[3] = 2; // two entries announced, one present
        assert_eq!(Chunk::parse(&bad).unwrap_err(), ChunkError::BadCounts);
    }

    #[test]
    fn encoder_refuses_what_the_header_cannot_say() {
        assert_eq!(check(&meta(0), &[]), Err(ChunkError::BadCounts));
        let zero = Entry::SubBatch {
            compression: 0,
            records: 0,
            uncompressed_bytes: 0,
            body: b"",
        };
        assert_eq!(check(&meta(0), &[zero]), Err(ChunkError::BadCounts));
        let many = vec![Entry::Simple(b""); CHUNK_ENTRIES_MAX + 1];
        assert_eq!(check(&meta(0), &many), Err(ChunkError::BadCounts));
        assert_eq!(
            check(&meta(u64::MAX), &[Entry::Simple(b"")]),
            Err(ChunkError::BadCounts)
        );
    }
}
