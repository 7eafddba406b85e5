//! Primitive AMQP field readers and writers for the hand-coded hot path.
//!
//! The reader works on a `Bytes` so that strings and bodies can be sliced out without copying.

use bytes::{BufMut, Bytes, BytesMut};

/// A field did not fit in what was left of the frame: a syntax error on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

/// Reads AMQP primitives from a frame payload, slicing rather than copying.
pub struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    pub fn new(buf: Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Truncated> {
        if self.remaining() < n {
            return Err(Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next byte, left unread.
    pub fn peek_u8(&self) -> Result<u8, Truncated> {
        self.buf.get(self.pos).copied().ok_or(Truncated)
    }

    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, Truncated> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Result<u32, Truncated> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, Truncated> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A shortstr as a zero-copy slice of the frame.
    pub fn short_str(&mut self) -> Result<Bytes, Truncated> {
        let len = self.u8()? as usize;
        self.bytes(len)
    }

    /// A longstr as a zero-copy slice of the frame.
    pub fn long_str(&mut self) -> Result<Bytes, Truncated> {
        let len = self.u32()? as usize;
        self.bytes(len)
    }

    pub fn bytes(&mut self, len: usize) -> Result<Bytes, Truncated> {
        if self.remaining() < len {
            return Err(Truncated);
        }
        let s = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(s)
    }

    /// Skips a field table, returning its raw encoding (length prefix excluded).
    pub fn table_raw(&mut self) -> Result<Bytes, Truncated> {
        self.long_str()
    }
}

pub fn put_short_str(out: &mut BytesMut, s: &[u8]) {
    debug_assert!(
        s.len() <= u8::MAX as usize,
        "shortstr longer than 255 bytes"
    );
    out.put_u8(s.len() as u8);
    out.put_slice(s);
}

pub fn put_long_str(out: &mut BytesMut, s: &[u8]) {
    out.put_u32(s.len() as u32);
    out.put_slice(s);
}
