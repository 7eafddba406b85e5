//! Frames: a uint32 size (not counting itself), then key, version and the command's body.
//!
//! [`decode`] splits the next frame off the front of a read buffer, judging its size from the
//! first four bytes so that a frame over the negotiated maximum is refused before its bytes are
//! waited for, and hands every payload out as slices of the buffer (a published message is never
//! copied on its way in). Encoders append whole frames to a `BytesMut`, so a connection can build
//! many and write them with one syscall; Deliver's header can be written alone
//! ([`encode_deliver_header`]) for a chunk that follows from the store by `sendfile`.

use super::command::Command;
use super::constants::*;
use super::wire::BodyError;
use bytes::{Buf, BufMut, BytesMut};

/// Why the bytes are not a frame the server can act on. Each maps to the response code a
/// RabbitMQ server closes the connection with ([`DecodeError::response_code`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The size prefix says more than `frame_max` (size prefix included, as RabbitMQ counts it).
    /// The frame is left in the buffer: the connection is closed, not resynchronised.
    FrameTooLarge { size: u32, max: u32 },
    /// A frame too short to hold a key and a version.
    TooShort { size: u32 },
    /// A key no command (or no response) has. The frame was consumed.
    UnknownCommand { key: u16, version: u16 },
    /// A version of a known command this codec does not speak. The frame was consumed.
    UnsupportedVersion { key: u16, version: u16 },
    /// A known command whose body does not parse. The frame was consumed.
    BadBody {
        key: u16,
        version: u16,
        why: BodyError,
    },
}

impl DecodeError {
    /// The code to close the connection with.
    pub fn response_code(&self) -> u16 {
        match self {
            DecodeError::FrameTooLarge { .. } => RESPONSE_CODE_FRAME_TOO_LARGE,
            _ => RESPONSE_CODE_UNKNOWN_FRAME,
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::FrameTooLarge { size, max } => write!(
                f,
                "frame too large: {} bytes, the negotiated maximum is {max}",
                *size as u64 + FRAME_SIZE_PREFIX_BYTES as u64
            ),
            DecodeError::TooShort { size } => {
                write!(f, "frame of {size} bytes has no room for key and version")
            }
            DecodeError::UnknownCommand { key, version } => {
                write!(f, "unknown command key 0x{key:04x} (version {version})")
            }
            DecodeError::UnsupportedVersion { key, version } => {
                write!(
                    f,
                    "unsupported version {version} of command key 0x{key:04x}"
                )
            }
            DecodeError::BadBody { key, version, why } => {
                write!(
                    f,
                    "malformed command key 0x{key:04x} version {version}: {why}"
                )
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Splits the next frame off `buf` and decodes it; `Ok(None)` when more bytes are needed.
///
/// `frame_max` is the negotiated maximum frame size including the size prefix (0: no limit, as
/// Tune has it; a server should still impose its own, since a frame is buffered whole).
pub fn decode(buf: &mut BytesMut, frame_max: u32) -> Result<Option<Command>, DecodeError> {
    if buf.len() < FRAME_SIZE_PREFIX_BYTES {
        return Ok(None);
    }
    let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if frame_max != 0 && size as u64 + FRAME_SIZE_PREFIX_BYTES as u64 > frame_max as u64 {
        return Err(DecodeError::FrameTooLarge {
            size,
            max: frame_max,
        });
    }
    let total = FRAME_SIZE_PREFIX_BYTES + size as usize;
    if buf.len() < total {
        // Room for the rest, but never more than a default frame ahead of the bytes: a size
        // prefix alone must not make the connection allocate gigabytes.
        buf.reserve((total - buf.len()).min(FRAME_MAX_DEFAULT_BYTES as usize));
        return Ok(None);
    }
    if (size as usize) < FRAME_HEADER_BYTES {
        buf.advance(total);
        return Err(DecodeError::TooShort { size });
    }
    let mut frame = buf.split_to(total);
    frame.advance(FRAME_SIZE_PREFIX_BYTES);
    let wire_key = frame.get_u16();
    let version = frame.get_u16();
    let key = wire_key & !RESPONSE_BIT;
    match version_max(key) {
        None => {
            return Err(DecodeError::UnknownCommand {
                key: wire_key,
                version,
            })
        }
        Some(max) if version == 0 || version > max => {
            return Err(DecodeError::UnsupportedVersion {
                key: wire_key,
                version,
            })
        }
        Some(_) => {}
    }
    Command::decode_body(wire_key, version, frame.freeze())
        .map(Some)
        .map_err(|why| match why {
            BodyError::UnknownKey => DecodeError::UnknownCommand {
                key: wire_key,
                version,
            },
            why => DecodeError::BadBody {
                key: wire_key,
                version,
                why,
            },
        })
}

/// Appends `command` as one whole frame.
pub fn encode(out: &mut BytesMut, command: &Command) {
    let start = out.len();
    out.put_u32(0);
    out.put_u16(command.wire_key());
    out.put_u16(command.version());
    command.encode_body(out);
    let size = out.len() - start - FRAME_SIZE_PREFIX_BYTES;
    assert!(size <= u32::MAX as usize, "stream frame over 4 GiB");
    out[start..start + FRAME_SIZE_PREFIX_BYTES].copy_from_slice(&(size as u32).to_be_bytes());
}

/// Appends the frame header of a Deliver whose `chunk_bytes` bytes the caller writes right after
/// (from memory or from the segment file); the same bytes as [`encode`] of a whole Deliver.
pub fn encode_deliver_header(
    out: &mut BytesMut,
    subscription_id: u8,
    committed_offset: Option<u64>,
    chunk_bytes: usize,
) {
    let committed_bytes = if committed_offset.is_some() { 8 } else { 0 };
    let size = FRAME_HEADER_BYTES + 1 + committed_bytes + chunk_bytes;
    assert!(size <= u32::MAX as usize, "stream frame over 4 GiB");
    out.put_u32(size as u32);
    out.put_u16(KEY_DELIVER);
    match committed_offset {
        Some(c) => {
            out.put_u16(VERSION_2);
            out.put_u8(subscription_id);
            out.put_u64(c);
        }
        None => {
            out.put_u16(VERSION_1);
            out.put_u8(subscription_id);
        }
    }
}
