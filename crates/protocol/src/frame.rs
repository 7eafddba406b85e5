//! Frames: the 7-byte header (type, channel, size), the payload and the frame-end octet.
//!
//! Decoding splits complete frames off the front of the read buffer and hands out the payload
//! as a `Bytes` that shares the buffer's memory: a published body is never copied on its way in.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const FRAME_METHOD: u8 = 1;
pub const FRAME_HEADER: u8 = 2;
pub const FRAME_BODY: u8 = 3;
pub const FRAME_HEARTBEAT: u8 = 8;
pub const FRAME_END: u8 = 0xCE;
/// Header (7) plus frame-end (1): what a frame costs beyond its payload.
pub const FRAME_OVERHEAD_BYTES: usize = 8;
const FRAME_HEADER_BYTES: usize = 7;
/// The smallest frame-max a peer may negotiate, and the limit before tune-ok (as in RabbitMQ).
pub const FRAME_MIN_BYTES: u32 = 4096;
/// What we offer in connection.tune: RabbitMQ's default.
pub const FRAME_MAX_DEFAULT_BYTES: u32 = 131_072;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub channel: u16,
    pub payload: Bytes,
}

/// Why a byte stream is not a sequence of frames; each is a 501 FRAME_ERROR in RabbitMQ.
/// (A frame of an unknown type is still a frame: the connection judges its type, as RabbitMQ
/// does after reading the whole frame.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    TooLarge {
        kind: u8,
        channel: u16,
        size: u32,
        max: u32,
    },
    BadFrameEnd {
        kind: u8,
        channel: u16,
        payload: Bytes,
        found: u8,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge {
                kind, size, max, ..
            } => write!(
                f,
                "type {kind}, frame size {size} larger than negotiated maximum {max}"
            ),
            FrameError::BadFrameEnd { kind, found, .. } => {
                write!(f, "type {kind}, invalid frame end marker {found}")
            }
        }
    }
}

/// Splits the next complete frame off `buf`; `Ok(None)` when more bytes are needed.
///
/// `frame_max` is the negotiated maximum total frame size (0 means unlimited), so the payload
/// may be at most `frame_max - 8` bytes, as RabbitMQ enforces it.
pub fn decode(buf: &mut BytesMut, frame_max: u32) -> Result<Option<Frame>, FrameError> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Ok(None);
    }
    let kind = buf[0];
    let channel = u16::from_be_bytes([buf[1], buf[2]]);
    let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]);
    let payload_max = frame_max.saturating_sub(FRAME_OVERHEAD_BYTES as u32);
    if frame_max != 0 && size > payload_max {
        return Err(FrameError::TooLarge {
            kind,
            channel,
            size,
            max: payload_max,
        });
    }
    let total = FRAME_HEADER_BYTES + size as usize + 1;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let end = buf[total - 1];
    if end != FRAME_END {
        let payload = Bytes::copy_from_slice(&buf[FRAME_HEADER_BYTES..total - 1]);
        return Err(FrameError::BadFrameEnd {
            kind,
            channel,
            payload,
            found: end,
        });
    }
    let mut whole = buf.split_to(total);
    whole.advance(FRAME_HEADER_BYTES);
    whole.truncate(size as usize);
    Ok(Some(Frame {
        kind,
        channel,
        payload: whole.freeze(),
    }))
}

/// Starts a frame in `out` and returns the offset `finish` needs; the caller appends the payload.
pub fn begin(out: &mut BytesMut, kind: u8, channel: u16) -> usize {
    let start = out.len();
    out.put_u8(kind);
    out.put_u16(channel);
    out.put_u32(0);
    start
}

/// Patches the payload size of the frame begun at `start` and appends the frame-end octet.
pub fn finish(out: &mut BytesMut, start: usize) {
    let size = (out.len() - start - FRAME_HEADER_BYTES) as u32;
    out[start + 3..start + 7].copy_from_slice(&size.to_be_bytes());
    out.put_u8(FRAME_END);
}

/// Appends a body as as many body frames as `frame_max` requires (none for an empty body).
pub fn encode_body(out: &mut BytesMut, channel: u16, body: &[u8], frame_max: u32) {
    let chunk_max = if frame_max == 0 {
        usize::MAX
    } else {
        frame_max as usize - FRAME_OVERHEAD_BYTES
    };
    out.reserve(body.len() + FRAME_OVERHEAD_BYTES * (1 + body.len() / chunk_max.max(1)));
    for chunk in body.chunks(chunk_max) {
        out.put_u8(FRAME_BODY);
        out.put_u16(channel);
        out.put_u32(chunk.len() as u32);
        out.put_slice(chunk);
        out.put_u8(FRAME_END);
    }
}

pub fn encode_heartbeat(out: &mut BytesMut) {
    out.put_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(kind: u8, channel: u16, payload: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        let start = begin(&mut out, kind, channel);
        out.put_slice(payload);
        finish(&mut out, start);
        out
    }

    #[test]
    fn decodes_a_frame_split_across_reads() {
        let whole = frame_bytes(FRAME_METHOD, 3, b"hello");
        let mut buf = BytesMut::new();
        for (i, b) in whole.iter().enumerate() {
            buf.put_u8(*b);
            let got = decode(&mut buf, 0).unwrap();
            if i + 1 < whole.len() {
                assert!(got.is_none());
            } else {
                let f = got.unwrap();
                assert_eq!(
                    (f.kind, f.channel, &f.payload[..]),
                    (FRAME_METHOD, 3, &b"hello"[..])
                );
            }
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn rejects_wrong_frame_end() {
        let mut buf = frame_bytes(FRAME_BODY, 1, b"x");
        let n = buf.len();
        buf[n - 1] = 0;
        assert_eq!(
            decode(&mut buf, 0),
            Err(FrameError::BadFrameEnd {
                kind: FRAME_BODY,
                channel: 1,
                payload: Bytes::from_static(b"x"),
                found: 0
            })
        );
    }

    #[test]
    fn rejects_frame_larger_than_frame_max_before_reading_payload() {
        let mut buf = BytesMut::from(&[FRAME_BODY, 0, 1, 0, 0, 0x10, 0][..]);
        assert!(matches!(
            decode(&mut buf, 4096),
            Err(FrameError::TooLarge {
                size: 4096,
                max: 4088,
                ..
            })
        ));
    }

    #[test]
    fn hands_out_frames_of_unknown_type_for_the_connection_to_judge() {
        let mut buf = frame_bytes(9, 0, b"abc");
        let f = decode(&mut buf, 0).unwrap().unwrap();
        assert_eq!((f.kind, &f.payload[..]), (9, &b"abc"[..]));
    }

    #[test]
    fn splits_bodies_at_frame_max() {
        let mut out = BytesMut::new();
        let body = vec![7u8; 10_000];
        encode_body(&mut out, 1, &body, 4096);
        let mut got = Vec::new();
        while let Some(f) = decode(&mut out, 4096).unwrap() {
            assert!(f.payload.len() <= 4088);
            got.extend_from_slice(&f.payload);
        }
        assert_eq!(got, body);
    }
}
