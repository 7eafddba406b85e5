//! Content headers and basic properties.
//!
//! A published message's property list is kept as the exact bytes the publisher sent and
//! forwarded unchanged to consumers, so that properties and headers arrive byte-exact. The
//! broker parses a [`Properties`] view (zero-copy slices) for the fields its semantics need, and
//! re-encodes only when it must change them (dead-lettering, CC/BCC, delivery counts).

use crate::frame::{self, FRAME_HEADER};
use crate::wire::{put_long_str, put_short_str, Reader, Truncated};
use amq_protocol_types::{generation::gen_field_table, parsing::parse_field_table, FieldTable};
use bytes::{BufMut, Bytes, BytesMut};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentHeader {
    pub class_id: u16,
    pub body_size: u64,
    /// Property flags followed by the property fields, as sent.
    pub properties: Bytes,
}

impl ContentHeader {
    pub fn decode(payload: Bytes) -> Result<ContentHeader, Truncated> {
        let mut r = Reader::new(payload);
        let class_id = r.u16()?;
        let _weight = r.u16()?;
        let body_size = r.u64()?;
        let properties = r.bytes(r.remaining())?;
        Ok(ContentHeader {
            class_id,
            body_size,
            properties,
        })
    }

    pub fn encode(&self, channel: u16, out: &mut BytesMut) {
        encode_header(
            out,
            channel,
            self.class_id,
            self.body_size,
            &self.properties,
        );
    }
}

/// Appends a content header frame with the given raw property bytes.
pub fn encode_header(
    out: &mut BytesMut,
    channel: u16,
    class_id: u16,
    body_size: u64,
    properties: &[u8],
) {
    let start = frame::begin(out, FRAME_HEADER, channel);
    out.put_u16(class_id);
    out.put_u16(0);
    out.put_u64(body_size);
    if properties.is_empty() {
        out.put_u16(0);
    } else {
        out.put_slice(properties);
    }
    frame::finish(out, start);
}

const FLAG_CONTENT_TYPE: u16 = 1 << 15;
const FLAG_CONTENT_ENCODING: u16 = 1 << 14;
const FLAG_HEADERS: u16 = 1 << 13;
const FLAG_DELIVERY_MODE: u16 = 1 << 12;
const FLAG_PRIORITY: u16 = 1 << 11;
const FLAG_CORRELATION_ID: u16 = 1 << 10;
const FLAG_REPLY_TO: u16 = 1 << 9;
const FLAG_EXPIRATION: u16 = 1 << 8;
const FLAG_MESSAGE_ID: u16 = 1 << 7;
const FLAG_TIMESTAMP: u16 = 1 << 6;
const FLAG_TYPE: u16 = 1 << 5;
const FLAG_USER_ID: u16 = 1 << 4;
const FLAG_APP_ID: u16 = 1 << 3;
const FLAG_CLUSTER_ID: u16 = 1 << 2;

/// The fourteen basic properties, as slices of the raw property bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    pub content_type: Option<Bytes>,
    pub content_encoding: Option<Bytes>,
    /// The headers table's encoding without its length prefix; see [`Properties::headers_table`].
    pub headers: Option<Bytes>,
    pub delivery_mode: Option<u8>,
    pub priority: Option<u8>,
    pub correlation_id: Option<Bytes>,
    pub reply_to: Option<Bytes>,
    pub expiration: Option<Bytes>,
    pub message_id: Option<Bytes>,
    pub timestamp: Option<u64>,
    pub kind: Option<Bytes>,
    pub user_id: Option<Bytes>,
    pub app_id: Option<Bytes>,
    pub cluster_id: Option<Bytes>,
}

impl Properties {
    /// Parses the raw property bytes of a content header (flags first).
    pub fn decode(raw: &Bytes) -> Result<Properties, Truncated> {
        let mut p = Properties::default();
        if raw.is_empty() {
            return Ok(p);
        }
        let mut r = Reader::new(raw.clone());
        let flags = r.u16()?;
        let has = |f: u16| flags & f != 0;
        if has(FLAG_CONTENT_TYPE) {
            p.content_type = Some(r.short_str()?);
        }
        if has(FLAG_CONTENT_ENCODING) {
            p.content_encoding = Some(r.short_str()?);
        }
        if has(FLAG_HEADERS) {
            p.headers = Some(r.table_raw()?);
        }
        if has(FLAG_DELIVERY_MODE) {
            p.delivery_mode = Some(r.u8()?);
        }
        if has(FLAG_PRIORITY) {
            p.priority = Some(r.u8()?);
        }
        if has(FLAG_CORRELATION_ID) {
            p.correlation_id = Some(r.short_str()?);
        }
        if has(FLAG_REPLY_TO) {
            p.reply_to = Some(r.short_str()?);
        }
        if has(FLAG_EXPIRATION) {
            p.expiration = Some(r.short_str()?);
        }
        if has(FLAG_MESSAGE_ID) {
            p.message_id = Some(r.short_str()?);
        }
        if has(FLAG_TIMESTAMP) {
            p.timestamp = Some(r.u64()?);
        }
        if has(FLAG_TYPE) {
            p.kind = Some(r.short_str()?);
        }
        if has(FLAG_USER_ID) {
            p.user_id = Some(r.short_str()?);
        }
        if has(FLAG_APP_ID) {
            p.app_id = Some(r.short_str()?);
        }
        if has(FLAG_CLUSTER_ID) {
            p.cluster_id = Some(r.short_str()?);
        }
        Ok(p)
    }

    /// The headers table, parsed; `Err` when its encoding is malformed.
    pub fn headers_table(&self) -> Result<Option<FieldTable>, Truncated> {
        match &self.headers {
            None => Ok(None),
            Some(raw) => decode_table(raw).map(Some),
        }
    }

    pub fn set_headers_table(&mut self, table: Option<&FieldTable>) {
        self.headers = table.map(encode_table);
    }

    /// Encodes the properties (flags first), the inverse of [`Properties::decode`].
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(64);
        out.put_u16(0);
        let mut flags = 0u16;
        let mut short = |out: &mut BytesMut, f: u16, v: &Option<Bytes>| {
            if let Some(v) = v {
                flags |= f;
                put_short_str(out, v);
            }
        };
        short(&mut out, FLAG_CONTENT_TYPE, &self.content_type);
        short(&mut out, FLAG_CONTENT_ENCODING, &self.content_encoding);
        if let Some(h) = &self.headers {
            flags |= FLAG_HEADERS;
            put_long_str(&mut out, h);
        }
        if let Some(d) = self.delivery_mode {
            flags |= FLAG_DELIVERY_MODE;
            out.put_u8(d);
        }
        if let Some(p) = self.priority {
            flags |= FLAG_PRIORITY;
            out.put_u8(p);
        }
        let mut short = |out: &mut BytesMut, f: u16, v: &Option<Bytes>| {
            if let Some(v) = v {
                flags |= f;
                put_short_str(out, v);
            }
        };
        short(&mut out, FLAG_CORRELATION_ID, &self.correlation_id);
        short(&mut out, FLAG_REPLY_TO, &self.reply_to);
        short(&mut out, FLAG_EXPIRATION, &self.expiration);
        short(&mut out, FLAG_MESSAGE_ID, &self.message_id);
        if let Some(t) = self.timestamp {
            flags |= FLAG_TIMESTAMP;
            out.put_u64(t);
        }
        let mut short = |out: &mut BytesMut, f: u16, v: &Option<Bytes>| {
            if let Some(v) = v {
                flags |= f;
                put_short_str(out, v);
            }
        };
        short(&mut out, FLAG_TYPE, &self.kind);
        short(&mut out, FLAG_USER_ID, &self.user_id);
        short(&mut out, FLAG_APP_ID, &self.app_id);
        short(&mut out, FLAG_CLUSTER_ID, &self.cluster_id);
        out[0..2].copy_from_slice(&flags.to_be_bytes());
        out.freeze()
    }
}

/// The raw properties (flags first) with a headers table of one long-long int `key = value`,
/// when they carry no headers table; `None` if they do (or are cut short). A quorum queue adds
/// `x-delivery-count` to every delivery and most messages carry no headers: splicing the table
/// in costs one small copy, where decoding every property and encoding them again cost a
/// tenth of the loop that delivers them.
pub fn with_sole_long_long_header(raw: &[u8], key: &[u8], value: i64) -> Option<Bytes> {
    let (flags, mut at) = match raw {
        [] => (0u16, 2),
        [a, b, ..] => (u16::from_be_bytes([*a, *b]), 2),
        _ => return None,
    };
    if flags & FLAG_HEADERS != 0 || key.len() > u8::MAX as usize {
        return None;
    }
    // The headers come after content-type and content-encoding, each a shortstr.
    for flag in [FLAG_CONTENT_TYPE, FLAG_CONTENT_ENCODING] {
        if flags & flag != 0 {
            at += 1 + usize::from(*raw.get(at)?);
        }
    }
    let rest = if raw.is_empty() {
        &[][..]
    } else {
        raw.get(at..)?
    };
    let table_len = 1 + key.len() + 1 + 8;
    let mut out = BytesMut::with_capacity(raw.len().max(2) + 4 + table_len);
    out.put_u16(flags | FLAG_HEADERS);
    out.put_slice(&raw[2.min(raw.len())..at.min(raw.len())]);
    out.put_u32(table_len as u32);
    put_short_str(&mut out, key);
    out.put_u8(b'l');
    out.put_i64(value);
    out.put_slice(rest);
    Some(out.freeze())
}

/// Parses a field table's encoding (without its 4-byte length prefix).
pub fn decode_table(raw: &[u8]) -> Result<FieldTable, Truncated> {
    let mut framed = Vec::with_capacity(raw.len() + 4);
    framed.extend_from_slice(&(raw.len() as u32).to_be_bytes());
    framed.extend_from_slice(raw);
    match parse_field_table(&framed[..]) {
        Ok(([], table)) => Ok(table),
        _ => Err(Truncated),
    }
}

/// Encodes a field table without its 4-byte length prefix.
pub fn encode_table(table: &FieldTable) -> Bytes {
    let (bytes, _) = cookie_factory::gen(gen_field_table(table), Vec::with_capacity(64))
        .expect("serialising into a Vec cannot fail");
    Bytes::from(bytes).slice(4..)
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol_types::{AMQPValue, LongString};

    #[test]
    fn a_sole_header_spliced_in_reads_as_one_set_through_the_table() {
        let full = Properties {
            content_type: Some(Bytes::from_static(b"text/plain")),
            content_encoding: Some(Bytes::from_static(b"gzip")),
            delivery_mode: Some(2),
            message_id: Some(Bytes::from_static(b"m")),
            timestamp: Some(7),
            app_id: Some(Bytes::from_static(b"a")),
            ..Properties::default()
        };
        let bare = Properties {
            delivery_mode: Some(2),
            ..Properties::default()
        };
        let cases = [
            (full.encode(), full),
            (bare.encode(), bare),
            (Properties::default().encode(), Properties::default()),
            // A content header may carry no property bytes at all.
            (Bytes::new(), Properties::default()),
        ];
        for (raw, p) in cases {
            let mut expected = p;
            let mut table = FieldTable::default();
            table.insert("x-delivery-count".into(), AMQPValue::LongLongInt(3));
            expected.set_headers_table(Some(&table));
            let spliced = with_sole_long_long_header(&raw, b"x-delivery-count", 3).unwrap();
            assert_eq!(Properties::decode(&spliced).unwrap(), expected, "{raw:?}");
            assert_eq!(spliced, expected.encode());
        }
        let mut with_headers = Properties::default();
        with_headers.set_headers_table(Some(&FieldTable::default()));
        assert_eq!(
            with_sole_long_long_header(&with_headers.encode(), b"k", 1),
            None
        );
        // Cut short inside the content type: refused, never a panic.
        assert_eq!(
            with_sole_long_long_header(&[0x80, 0, 5, b'a'], b"k", 1),
            None
        );
        assert_eq!(with_sole_long_long_header(&[0x80], b"k", 1), None);
    }

    #[test]
    fn properties_roundtrip_every_field() {
        let mut headers = FieldTable::default();
        headers.insert("x".into(), AMQPValue::LongString(LongString::from("y")));
        headers.insert("n".into(), AMQPValue::LongLongInt(-5));
        let mut p = Properties {
            content_type: Some(Bytes::from_static(b"text/plain")),
            content_encoding: Some(Bytes::from_static(b"gzip")),
            headers: None,
            delivery_mode: Some(2),
            priority: Some(7),
            correlation_id: Some(Bytes::from_static(b"c")),
            reply_to: Some(Bytes::from_static(b"r")),
            expiration: Some(Bytes::from_static(b"1000")),
            message_id: Some(Bytes::from_static(b"m")),
            timestamp: Some(12345),
            kind: Some(Bytes::from_static(b"t")),
            user_id: Some(Bytes::from_static(b"guest")),
            app_id: Some(Bytes::from_static(b"app")),
            cluster_id: Some(Bytes::from_static(b"cl")),
        };
        p.set_headers_table(Some(&headers));
        let raw = p.encode();
        let back = Properties::decode(&raw).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.headers_table().unwrap(), Some(headers));
        assert_eq!(back.encode(), raw);
    }

    #[test]
    fn truncated_properties_are_rejected() {
        let raw = Bytes::from_static(&[0x80, 0, 10, b'a']);
        assert_eq!(Properties::decode(&raw), Err(Truncated));
    }

    #[test]
    fn content_header_keeps_property_bytes_verbatim() {
        let props = Properties {
            delivery_mode: Some(1),
            ..Default::default()
        }
        .encode();
        let mut out = BytesMut::new();
        encode_header(&mut out, 1, 60, 42, &props);
        let f = crate::frame::decode(&mut out, 0).unwrap().unwrap();
        let h = ContentHeader::decode(f.payload).unwrap();
        assert_eq!((h.class_id, h.body_size, h.properties), (60, 42, props));
    }
}
