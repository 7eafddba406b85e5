//! The stream protocol's field types over the shared [`Reader`]: strings (int16 length, -1 for
//! null), bytes (int32 length, -1 for null), arrays (int32 count) and string maps.
//!
//! Every count read off the wire is checked against the bytes left before anything is allocated,
//! so a frame claiming four billion entries costs nothing but its rejection.

use crate::wire::{Reader, Truncated};
use bytes::{BufMut, Bytes, BytesMut};

/// Why a frame's body does not parse; the connection answers each with `UNKNOWN_FRAME`, as
/// RabbitMQ answers a frame its parser does not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// A field ran past the end of the frame.
    Truncated,
    /// Bytes were left after the last field.
    TrailingBytes,
    /// A string that is not UTF-8 (PROTOCOL.adoc: strings are UTF-8).
    NotUtf8,
    /// A negative length other than -1, or a count larger than the bytes left could hold.
    BadLength,
    /// An offset specification type outside 0-5.
    BadOffsetType(u16),
    /// No command (or no response) has this key.
    UnknownKey,
}

impl From<Truncated> for BodyError {
    fn from(_: Truncated) -> Self {
        BodyError::Truncated
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Truncated => f.write_str("a field runs past the end of the frame"),
            BodyError::TrailingBytes => f.write_str("bytes left after the last field"),
            BodyError::NotUtf8 => f.write_str("a string is not UTF-8"),
            BodyError::BadLength => f.write_str("a length or count the frame cannot hold"),
            BodyError::BadOffsetType(t) => write!(f, "unknown offset type {t}"),
            BodyError::UnknownKey => f.write_str("unknown command"),
        }
    }
}

/// A string; null (-1) reads as empty, since no command gives null a meaning of its own.
pub fn string(r: &mut Reader) -> Result<String, BodyError> {
    let len = r.u16()? as i16;
    if len == -1 {
        return Ok(String::new());
    }
    if len < 0 {
        return Err(BodyError::BadLength);
    }
    let raw = r.bytes(len as usize)?;
    String::from_utf8(raw.to_vec()).map_err(|_| BodyError::NotUtf8)
}

/// Bytes as a slice of the frame; null (-1) reads as empty.
pub fn bytes(r: &mut Reader) -> Result<Bytes, BodyError> {
    let len = r.u32()? as i32;
    if len == -1 {
        return Ok(Bytes::new());
    }
    if len < 0 {
        return Err(BodyError::BadLength);
    }
    Ok(r.bytes(len as usize)?)
}

/// An array's count, refused when `element_bytes_min` bytes each would not fit in what is left.
pub fn count(r: &mut Reader, element_bytes_min: usize) -> Result<usize, BodyError> {
    let n = r.u32()? as usize;
    if n.saturating_mul(element_bytes_min) > r.remaining() {
        return Err(BodyError::BadLength);
    }
    Ok(n)
}

pub fn strings(r: &mut Reader) -> Result<Vec<String>, BodyError> {
    let n = count(r, 2)?;
    (0..n).map(|_| string(r)).collect()
}

/// A map of strings in wire order (duplicates kept: the caller decides which wins).
pub fn string_map(r: &mut Reader) -> Result<Vec<(String, String)>, BodyError> {
    let n = count(r, 4)?;
    (0..n).map(|_| Ok((string(r)?, string(r)?))).collect()
}

pub fn put_string(out: &mut BytesMut, s: &str) {
    assert!(
        s.len() <= i16::MAX as usize,
        "stream protocol string over 32767 bytes"
    );
    out.put_u16(s.len() as u16);
    out.put_slice(s.as_bytes());
}

pub fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    assert!(
        b.len() <= i32::MAX as usize,
        "stream protocol bytes over 2 GiB"
    );
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

pub fn put_count(out: &mut BytesMut, n: usize) {
    assert!(
        n <= i32::MAX as usize,
        "stream protocol array over 2^31 entries"
    );
    out.put_u32(n as u32);
}

pub fn put_strings(out: &mut BytesMut, items: &[String]) {
    put_count(out, items.len());
    for s in items {
        put_string(out, s);
    }
}

pub fn put_string_map(out: &mut BytesMut, map: &[(String, String)]) {
    put_count(out, map.len());
    for (k, v) in map {
        put_string(out, k);
        put_string(out, v);
    }
}
