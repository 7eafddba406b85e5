//! What travels inside the stream protocol's frames: the AMQP 1.0 message a publisher sends
//! (one Data section, as stream-perf-test's messages) and the osiris chunk a Deliver carries
//! (PROTOCOL.adoc's "OsirisChunk": a 48-byte header, then entries, each a message or a
//! sub-batch of messages).
//!
//! A consumer does not decode whole messages: it counts the chunk's records and reads the first
//! eight bytes of each message's first Data section, where the producer wrote its clock.

use bytes::BufMut;

/// Bytes of an osiris chunk header.
pub const CHUNK_HEADER_BYTES: usize = 48;
/// Magic (0x5) and version (0) of the chunk format RabbitMQ 3.9-3.13 writes.
pub const CHUNK_MAGIC_VERSION: u8 = 0x50;
/// Chunk type of user data; tracking chunks (1, 2) carry no messages.
pub const CHUNK_TYPE_USER: u8 = 0;
/// Set on the first byte of an entry that is a sub-batch.
pub const ENTRY_SUB_BATCH_BIT: u8 = 0x80;
/// The timestamp stream-perf-test writes at the start of a body: `System.nanoTime()`.
pub const BODY_TIMESTAMP_BYTES: usize = 8;

/// AMQP 1.0: the described-type constructor, the small-ulong descriptor code and Data's code.
const DESCRIBED: u8 = 0x00;
const SMALL_ULONG: u8 = 0x53;
const ULONG: u8 = 0x80;
const DATA_SECTION: u64 = 0x75;
const VBIN8: u8 = 0xa0;
const VBIN32: u8 = 0xb0;

/// Bytes of the message [`put_message`] writes for a body of `body_bytes`.
pub fn message_bytes(body_bytes: usize) -> usize {
    3 + if body_bytes <= u8::MAX as usize { 2 } else { 5 } + body_bytes
}

/// Appends an AMQP 1.0 message with one Data section holding `body`.
pub fn put_message(out: &mut impl BufMut, body: &[u8]) {
    out.put_u8(DESCRIBED);
    out.put_u8(SMALL_ULONG);
    out.put_u8(DATA_SECTION as u8);
    if body.len() <= u8::MAX as usize {
        out.put_u8(VBIN8);
        out.put_u8(body.len() as u8);
    } else {
        out.put_u8(VBIN32);
        out.put_u32(body.len() as u32);
    }
    out.put_slice(body);
}

/// The first Data section's bytes of an AMQP 1.0 message; sections before it (header,
/// annotations, properties, as RabbitMQ adds to a message published over AMQP 0-9-1) are
/// skipped. `None` for a message without one, or one that does not parse.
pub fn message_body(message: &[u8]) -> Option<&[u8]> {
    let mut at = 0;
    while at < message.len() {
        if message[at] != DESCRIBED {
            return None;
        }
        at += 1;
        let code = match *message.get(at)? {
            SMALL_ULONG => {
                at += 2;
                *message.get(at - 1)? as u64
            }
            ULONG => {
                let b = message.get(at + 1..at + 9)?;
                at += 9;
                u64::from_be_bytes(b.try_into().ok()?)
            }
            // A symbolic descriptor: no section we look for, skip it as a value.
            _ => {
                at = skip_value(message, at)?;
                u64::MAX
            }
        };
        if code == DATA_SECTION {
            let (len, header) = match *message.get(at)? {
                VBIN8 => (*message.get(at + 1)? as usize, 2),
                VBIN32 => (
                    u32::from_be_bytes(message.get(at + 1..at + 5)?.try_into().ok()?) as usize,
                    5,
                ),
                _ => return None,
            };
            return message.get(at + header..at + header + len);
        }
        at = skip_value(message, at)?;
    }
    None
}

/// The position after the AMQP 1.0 value at `at`, from its constructor's width class.
fn skip_value(b: &[u8], at: usize) -> Option<usize> {
    let constructor = *b.get(at)?;
    let end = match constructor {
        DESCRIBED => {
            let after_descriptor = skip_value(b, at + 1)?;
            return skip_value(b, after_descriptor);
        }
        0x40..=0x4f => at + 1,
        0x50..=0x5f => at + 2,
        0x60..=0x6f => at + 3,
        0x70..=0x7f => at + 5,
        0x80..=0x8f => at + 9,
        0x90..=0x9f => at + 17,
        0xa0..=0xaf | 0xc0..=0xcf | 0xe0..=0xef => at + 2 + *b.get(at + 1)? as usize,
        0xb0..=0xbf | 0xd0..=0xdf | 0xf0..=0xff => {
            at + 5 + u32::from_be_bytes(b.get(at + 1..at + 5)?.try_into().ok()?) as usize
        }
        _ => return None,
    };
    (end <= b.len()).then_some(end)
}

/// The start of a body as a stream-perf-test timestamp, if it is long enough.
pub fn body_timestamp(body: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(
        body.get(..BODY_TIMESTAMP_BYTES)?.try_into().ok()?,
    ))
}

/// What one chunk held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSummary {
    pub chunk_type: u8,
    pub first_offset: u64,
    /// Messages in the chunk (sub-batches counted by their messages).
    pub records: u32,
}

/// Why a chunk does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad chunk: {}", self.0)
    }
}

impl std::error::Error for ChunkError {}

fn be_u32(b: &[u8], at: usize) -> Result<u32, ChunkError> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes(s.try_into().expect("four bytes")))
        .ok_or(ChunkError("truncated"))
}

/// Reads a chunk's header and calls `message(offset, bytes)` for every message of a user
/// chunk, in order. Compressed sub-batches are counted but not opened (`warren perf stream`
/// never writes them).
pub fn for_each_message(
    chunk: &[u8],
    mut message: impl FnMut(u64, &[u8]),
) -> Result<ChunkSummary, ChunkError> {
    if chunk.len() < CHUNK_HEADER_BYTES {
        return Err(ChunkError("shorter than its header"));
    }
    if chunk[0] != CHUNK_MAGIC_VERSION {
        return Err(ChunkError("unknown magic or version"));
    }
    let chunk_type = chunk[1];
    let entries = u16::from_be_bytes([chunk[2], chunk[3]]);
    let records = be_u32(chunk, 4)?;
    let first_offset = u64::from_be_bytes(chunk[24..32].try_into().expect("eight bytes"));
    let data_bytes = be_u32(chunk, 36)? as usize;
    let summary = ChunkSummary {
        chunk_type,
        first_offset,
        records,
    };
    if chunk_type != CHUNK_TYPE_USER {
        return Ok(summary);
    }
    let data = chunk
        .get(CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + data_bytes)
        .ok_or(ChunkError("data runs past the frame"))?;
    let mut at = 0;
    let mut offset = first_offset;
    for _ in 0..entries {
        let head = *data
            .get(at)
            .ok_or(ChunkError("fewer entries than announced"))?;
        if head & ENTRY_SUB_BATCH_BIT == 0 {
            let size = be_u32(data, at)? as usize;
            let m = data
                .get(at + 4..at + 4 + size)
                .ok_or(ChunkError("entry runs past the data"))?;
            message(offset, m);
            offset += 1;
            at += 4 + size;
        } else {
            let compression = (head >> 4) & 0x7;
            let count = u16::from_be_bytes(
                data.get(at + 1..at + 3)
                    .ok_or(ChunkError("truncated sub-batch"))?
                    .try_into()
                    .expect("two bytes"),
            );
            let length = be_u32(data, at + 7)? as usize;
            let batch = data
                .get(at + 11..at + 11 + length)
                .ok_or(ChunkError("sub-batch runs past the data"))?;
            if compression == 0 {
                let mut inner = 0;
                for _ in 0..count {
                    let size = be_u32(batch, inner)? as usize;
                    let m = batch
                        .get(inner + 4..inner + 4 + size)
                        .ok_or(ChunkError("message runs past its sub-batch"))?;
                    message(offset, m);
                    offset += 1;
                    inner += 4 + size;
                }
            } else {
                offset += count as u64;
            }
            at += 11 + length;
        }
    }
    Ok(summary)
}

/// Appends a sub-batch entry (uncompressed) of `bodies`, each as an AMQP 1.0 message, as the
/// stream clients publish with sub-entry batching.
pub fn put_sub_batch<'a>(
    out: &mut impl BufMut,
    bodies: impl ExactSizeIterator<Item = &'a [u8]> + Clone,
) {
    let count = bodies.len();
    assert!(count <= u16::MAX as usize, "sub-batch over 65535 messages");
    let length: usize = bodies.clone().map(|b| 4 + message_bytes(b.len())).sum();
    out.put_u8(ENTRY_SUB_BATCH_BIT);
    out.put_u16(count as u16);
    out.put_u32(length as u32);
    out.put_u32(length as u32);
    for b in bodies {
        out.put_u32(message_bytes(b.len()) as u32);
        put_message(out, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(first_offset: u64, entries: &[Vec<u8>], records: u32) -> Vec<u8> {
        let data: Vec<u8> = entries.concat();
        let mut c = vec![CHUNK_MAGIC_VERSION, CHUNK_TYPE_USER];
        c.extend_from_slice(&(entries.len() as u16).to_be_bytes());
        c.extend_from_slice(&records.to_be_bytes());
        c.extend_from_slice(&0i64.to_be_bytes()); // timestamp
        c.extend_from_slice(&1u64.to_be_bytes()); // epoch
        c.extend_from_slice(&first_offset.to_be_bytes());
        c.extend_from_slice(&0u32.to_be_bytes()); // crc
        c.extend_from_slice(&(data.len() as u32).to_be_bytes());
        c.extend_from_slice(&0u32.to_be_bytes()); // trailer
        c.extend_from_slice(&0u32.to_be_bytes()); // reserved
        assert_eq!(c.len(), CHUNK_HEADER_BYTES);
        c.extend_from_slice(&data);
        c
    }

    fn simple_entry(body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        put_message(&mut m, body);
        let mut e = (m.len() as u32).to_be_bytes().to_vec();
        e.extend_from_slice(&m);
        e
    }

    #[test]
    fn message_round_trips_short_and_long_bodies() {
        for len in [8usize, 255, 256, 70_000] {
            let body: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut m = Vec::new();
            put_message(&mut m, &body);
            assert_eq!(m.len(), message_bytes(len));
            assert_eq!(message_body(&m), Some(&body[..]));
        }
    }

    /// RabbitMQ stores a message published over AMQP 0-9-1 with header, annotations and
    /// properties before its Data section; the body is still found.
    #[test]
    fn message_body_skips_sections_before_data() {
        let mut m = vec![
            0x00, 0x53, 0x70, 0xc0, 0x04, 0x02, 0x41, 0x50,
            0x04, // header: list8 [true, ubyte 4]
            0x00, 0x53, 0x72, 0xc1, 0x01, 0x00, // message annotations: empty map8
            0x00, 0x53, 0x73, 0x45, // properties: list0
        ];
        put_message(&mut m, b"0123456789");
        assert_eq!(message_body(&m), Some(&b"0123456789"[..]));
        assert_eq!(
            message_body(&[0x00, 0x53, 0x77, 0x40]),
            None,
            "amqp-value, no data"
        );
        assert_eq!(
            message_body(&[0x00, 0x53, 0x75, 0xa0, 9, 1]),
            None,
            "truncated"
        );
        assert_eq!(message_body(&[0x13]), None);
    }

    #[test]
    fn chunk_messages_are_visited_with_their_offsets_including_sub_batches() {
        let bodies: Vec<Vec<u8>> = (0..5u64)
            .map(|i| (100 + i).to_be_bytes().to_vec())
            .collect();
        let mut sub = Vec::new();
        put_sub_batch(&mut sub, bodies[1..4].iter().map(|b| &b[..]));
        let c = chunk(
            1000,
            &[simple_entry(&bodies[0]), sub, simple_entry(&bodies[4])],
            5,
        );
        let mut seen = Vec::new();
        let s = for_each_message(&c, |offset, m| {
            seen.push((offset, body_timestamp(message_body(m).unwrap()).unwrap()))
        })
        .unwrap();
        assert_eq!(s.records, 5);
        assert_eq!(s.first_offset, 1000);
        assert_eq!(
            seen,
            (0..5u64).map(|i| (1000 + i, 100 + i)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn bad_chunks_are_refused_not_overrun() {
        let c = chunk(0, &[simple_entry(b"abcdefgh")], 1);
        assert!(for_each_message(&c[..40], |_, _| {}).is_err());
        assert!(for_each_message(&c[..c.len() - 1], |_, _| {}).is_err());
        let mut wrong_magic = c.clone();
        wrong_magic[0] = 0x51;
        assert!(for_each_message(&wrong_magic, |_, _| {}).is_err());
        let mut too_many = c.clone();
        too_many[3] = 2;
        assert!(for_each_message(&too_many, |_, _| {}).is_err());
        let mut tracking = c;
        tracking[1] = 1;
        let mut n = 0;
        for_each_message(&tracking, |_, _| n += 1).unwrap();
        assert_eq!(n, 0, "tracking chunks hold no messages");
    }
}
