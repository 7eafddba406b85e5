//! A binding's identity as bytes: (source, destination, key, arguments), the tuple RabbitMQ
//! compares to decide that a second bind is the same binding.
//!
//! `FieldTable` is neither `Hash` nor `Eq` (it holds floats), so the arguments are encoded
//! canonically (sorted keys, a tag per type, floats by their bits) and the whole tuple becomes
//! one byte string, the key of the table's identity map. Encoding costs O(key + arguments),
//! which bind and unbind pay anyway to copy them.

use amq_protocol_types::{AMQPValue, FieldTable, ShortString};

use super::{Destination, ExchangeId};

/// `args` in key order, as a `FieldTable` iterates or a binding stores them.
pub(crate) fn encode<'a>(
    source: ExchangeId,
    destination: Destination,
    key: &[u8],
    args: impl ExactSizeIterator<Item = (&'a ShortString, &'a AMQPValue)>,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(&source.0.to_le_bytes());
    match destination {
        Destination::Queue(q) => {
            out.push(b'q');
            out.extend_from_slice(&q.0.to_le_bytes());
        }
        Destination::Exchange(x) => {
            out.push(b'x');
            out.extend_from_slice(&x.0.to_le_bytes());
        }
    }
    bytes(key, out);
    entries(args, out);
}

fn bytes(b: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(b.len()).expect("AMQP strings are shorter than 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(b);
}

fn entries<'a>(
    entries: impl ExactSizeIterator<Item = (&'a ShortString, &'a AMQPValue)>,
    out: &mut Vec<u8>,
) {
    let len = u32::try_from(entries.len()).expect("AMQP tables have fewer than 2^32 entries");
    out.extend_from_slice(&len.to_le_bytes());
    for (k, v) in entries {
        bytes(k.as_str().as_bytes(), out);
        value(v, out);
    }
}

fn table(t: &FieldTable, out: &mut Vec<u8>) {
    entries(t.inner().iter(), out);
}

fn value(v: &AMQPValue, out: &mut Vec<u8>) {
    match v {
        AMQPValue::Boolean(x) => out.extend_from_slice(&[b't', u8::from(*x)]),
        AMQPValue::ShortShortInt(x) => out.extend_from_slice(&[b'b', x.to_le_bytes()[0]]),
        AMQPValue::ShortShortUInt(x) => out.extend_from_slice(&[b'B', *x]),
        AMQPValue::ShortInt(x) => {
            out.push(b's');
            out.extend_from_slice(&x.to_le_bytes());
        }
        AMQPValue::ShortUInt(x) => {
            out.push(b'u');
            out.extend_from_slice(&x.to_le_bytes());
        }
        AMQPValue::LongInt(x) => {
            out.push(b'I');
            out.extend_from_slice(&x.to_le_bytes());
        }
        AMQPValue::LongUInt(x) => {
            out.push(b'i');
            out.extend_from_slice(&x.to_le_bytes());
        }
        AMQPValue::LongLongInt(x) => {
            out.push(b'l');
            out.extend_from_slice(&x.to_le_bytes());
        }
        AMQPValue::Float(x) => {
            out.push(b'f');
            out.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        AMQPValue::Double(x) => {
            out.push(b'd');
            out.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        AMQPValue::DecimalValue(d) => {
            out.extend_from_slice(&[b'D', d.scale]);
            out.extend_from_slice(&d.value.to_le_bytes());
        }
        // Same tag: RabbitMQ has only the long string on the wire.
        AMQPValue::ShortString(s) => {
            out.push(b'S');
            bytes(s.as_str().as_bytes(), out);
        }
        AMQPValue::LongString(s) => {
            out.push(b'S');
            bytes(s.as_bytes(), out);
        }
        AMQPValue::FieldArray(a) => {
            out.push(b'A');
            let len = u32::try_from(a.as_slice().len()).expect("AMQP arrays are short");
            out.extend_from_slice(&len.to_le_bytes());
            for v in a.as_slice() {
                value(v, out);
            }
        }
        AMQPValue::Timestamp(x) => {
            out.push(b'T');
            out.extend_from_slice(&x.to_le_bytes());
        }
        AMQPValue::FieldTable(t) => {
            out.push(b'F');
            table(t, out);
        }
        AMQPValue::ByteArray(b) => {
            out.push(b'x');
            bytes(b.as_slice(), out);
        }
        AMQPValue::Void => out.push(b'V'),
    }
}
