//! AMQP 1.0's type system (OASIS AMQP 1.0, part 1): every primitive, lists, maps, arrays and
//! described values, in the encodings the spec defines, compact forms included.
//!
//! Decoding accepts every encoding of a value (a uint may come as `uint0`, `smalluint` or
//! `uint`); encoding picks the smallest, as RabbitMQ and the clients do, so what a client sends
//! and what we write back agree in value, not necessarily in bytes. Nesting is bounded by
//! [`DEPTH_MAX`] and every count is checked against the bytes that would have to hold it, so no
//! input can overflow the stack or make the decoder allocate past its own size.

use crate::wire::{Reader, Truncated};
use bytes::{BufMut, Bytes, BytesMut};

/// How deeply lists, maps, arrays and described values may nest in a message we read.
pub const DEPTH_MAX: usize = 32;

pub const CODE_DESCRIBED: u8 = 0x00;
pub const CODE_NULL: u8 = 0x40;
pub const CODE_TRUE: u8 = 0x41;
pub const CODE_FALSE: u8 = 0x42;
pub const CODE_BOOLEAN: u8 = 0x56;
pub const CODE_UBYTE: u8 = 0x50;
pub const CODE_USHORT: u8 = 0x60;
pub const CODE_UINT: u8 = 0x70;
pub const CODE_SMALLUINT: u8 = 0x52;
pub const CODE_UINT0: u8 = 0x43;
pub const CODE_ULONG: u8 = 0x80;
pub const CODE_SMALLULONG: u8 = 0x53;
pub const CODE_ULONG0: u8 = 0x44;
pub const CODE_BYTE: u8 = 0x51;
pub const CODE_SHORT: u8 = 0x61;
pub const CODE_INT: u8 = 0x71;
pub const CODE_SMALLINT: u8 = 0x54;
pub const CODE_LONG: u8 = 0x81;
pub const CODE_SMALLLONG: u8 = 0x55;
pub const CODE_FLOAT: u8 = 0x72;
pub const CODE_DOUBLE: u8 = 0x82;
pub const CODE_DECIMAL32: u8 = 0x74;
pub const CODE_DECIMAL64: u8 = 0x84;
pub const CODE_DECIMAL128: u8 = 0x94;
pub const CODE_CHAR: u8 = 0x73;
pub const CODE_TIMESTAMP: u8 = 0x83;
pub const CODE_UUID: u8 = 0x98;
pub const CODE_VBIN8: u8 = 0xa0;
pub const CODE_VBIN32: u8 = 0xb0;
pub const CODE_STR8: u8 = 0xa1;
pub const CODE_STR32: u8 = 0xb1;
pub const CODE_SYM8: u8 = 0xa3;
pub const CODE_SYM32: u8 = 0xb3;
pub const CODE_LIST0: u8 = 0x45;
pub const CODE_LIST8: u8 = 0xc0;
pub const CODE_LIST32: u8 = 0xd0;
pub const CODE_MAP8: u8 = 0xc1;
pub const CODE_MAP32: u8 = 0xd1;
pub const CODE_ARRAY8: u8 = 0xe0;
pub const CODE_ARRAY32: u8 = 0xf0;

/// A value of any AMQP 1.0 type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Ubyte(u8),
    Ushort(u16),
    Uint(u32),
    Ulong(u64),
    Byte(i8),
    Short(i16),
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    /// IEEE 754 decimals, kept as their bytes: nothing here computes with them.
    Decimal32([u8; 4]),
    Decimal64([u8; 8]),
    Decimal128([u8; 16]),
    Char(char),
    /// Milliseconds since the Unix epoch.
    Timestamp(i64),
    Uuid([u8; 16]),
    Binary(Bytes),
    String(String),
    Symbol(String),
    List(Vec<Value>),
    Map(Vec<(Value, Value)>),
    /// Elements of one type; written with the widest constructor of that type.
    Array(Vec<Value>),
    Described(Box<Value>, Box<Value>),
}

/// Why bytes are not an AMQP 1.0 value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeError {
    Truncated,
    UnknownCode(u8),
    NotUtf8,
    BadChar(u32),
    /// A count larger than the bytes that would hold it, or a size smaller than its contents.
    BadLength,
    /// A map with an odd number of elements.
    OddMap,
    TooDeep,
    /// A section or field of a type the message format does not allow there.
    Unexpected(&'static str),
}

impl From<Truncated> for TypeError {
    fn from(_: Truncated) -> Self {
        TypeError::Truncated
    }
}

impl std::fmt::Display for TypeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TypeError::Truncated => f.write_str("a value runs past the end of the message"),
            TypeError::UnknownCode(c) => write!(f, "unknown format code 0x{c:02x}"),
            TypeError::NotUtf8 => f.write_str("a string is not UTF-8"),
            TypeError::BadChar(c) => write!(f, "0x{c:x} is not a character"),
            TypeError::BadLength => f.write_str("a size or count the message cannot hold"),
            TypeError::OddMap => f.write_str("a map with an odd number of elements"),
            TypeError::TooDeep => write!(f, "values nested deeper than {DEPTH_MAX}"),
            TypeError::Unexpected(what) => write!(f, "unexpected {what}"),
        }
    }
}

impl std::error::Error for TypeError {}

impl Value {
    /// Reads one value (constructor and data).
    pub fn decode(r: &mut Reader) -> Result<Value, TypeError> {
        decode_value(r, 0)
    }

    pub fn decode_bytes(raw: &Bytes) -> Result<Value, TypeError> {
        let mut r = Reader::new(raw.clone());
        let v = Value::decode(&mut r)?;
        if r.remaining() != 0 {
            return Err(TypeError::Unexpected("bytes after the value"));
        }
        Ok(v)
    }

    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Value::Null => out.put_u8(CODE_NULL),
            Value::Bool(true) => out.put_u8(CODE_TRUE),
            Value::Bool(false) => out.put_u8(CODE_FALSE),
            Value::Ubyte(v) => {
                out.put_u8(CODE_UBYTE);
                out.put_u8(*v);
            }
            Value::Ushort(v) => {
                out.put_u8(CODE_USHORT);
                out.put_u16(*v);
            }
            Value::Uint(0) => out.put_u8(CODE_UINT0),
            Value::Uint(v) if *v <= 0xff => {
                out.put_u8(CODE_SMALLUINT);
                out.put_u8(*v as u8);
            }
            Value::Ulong(0) => out.put_u8(CODE_ULONG0),
            Value::Ulong(v) if *v <= 0xff => {
                out.put_u8(CODE_SMALLULONG);
                out.put_u8(*v as u8);
            }
            Value::Int(v) if i8::try_from(*v).is_ok() => {
                out.put_u8(CODE_SMALLINT);
                out.put_i8(*v as i8);
            }
            Value::Long(v) if i8::try_from(*v).is_ok() => {
                out.put_u8(CODE_SMALLLONG);
                out.put_i8(*v as i8);
            }
            Value::Binary(b) if b.len() <= 0xff => {
                out.put_u8(CODE_VBIN8);
                out.put_u8(b.len() as u8);
                out.put_slice(b);
            }
            Value::String(s) if s.len() <= 0xff => {
                out.put_u8(CODE_STR8);
                out.put_u8(s.len() as u8);
                out.put_slice(s.as_bytes());
            }
            Value::Symbol(s) if s.len() <= 0xff => {
                out.put_u8(CODE_SYM8);
                out.put_u8(s.len() as u8);
                out.put_slice(s.as_bytes());
            }
            Value::List(items) if items.is_empty() => out.put_u8(CODE_LIST0),
            Value::List(items) => {
                let mut body = BytesMut::new();
                for v in items {
                    v.encode(&mut body);
                }
                put_compound(out, CODE_LIST8, CODE_LIST32, items.len(), &body);
            }
            Value::Map(pairs) => {
                let mut body = BytesMut::new();
                for (k, v) in pairs {
                    k.encode(&mut body);
                    v.encode(&mut body);
                }
                put_compound(out, CODE_MAP8, CODE_MAP32, pairs.len() * 2, &body);
            }
            Value::Array(items) => {
                let code = items.first().map_or(CODE_NULL, wide_code);
                let mut body = BytesMut::new();
                // The element constructor, described ones as 0x00, descriptor, code.
                if let Some(Value::Described(descriptor, _)) = items.first() {
                    body.put_u8(CODE_DESCRIBED);
                    descriptor.encode(&mut body);
                }
                body.put_u8(code);
                for v in items {
                    assert_eq!(wide_code(v), code, "array elements of different types");
                    let v = match v {
                        Value::Described(_, inner) => inner,
                        v => v,
                    };
                    encode_data(v, &mut body);
                }
                put_compound(out, CODE_ARRAY8, CODE_ARRAY32, items.len(), &body);
            }
            Value::Described(descriptor, value) => {
                out.put_u8(CODE_DESCRIBED);
                descriptor.encode(out);
                value.encode(out);
            }
            v => {
                out.put_u8(wide_code(v));
                encode_data(v, out);
            }
        }
    }
}

/// The fixed (widest) constructor of a value's type: what arrays are written with.
fn wide_code(v: &Value) -> u8 {
    match v {
        Value::Null => CODE_NULL,
        Value::Bool(_) => CODE_BOOLEAN,
        Value::Ubyte(_) => CODE_UBYTE,
        Value::Ushort(_) => CODE_USHORT,
        Value::Uint(_) => CODE_UINT,
        Value::Ulong(_) => CODE_ULONG,
        Value::Byte(_) => CODE_BYTE,
        Value::Short(_) => CODE_SHORT,
        Value::Int(_) => CODE_INT,
        Value::Long(_) => CODE_LONG,
        Value::Float(_) => CODE_FLOAT,
        Value::Double(_) => CODE_DOUBLE,
        Value::Decimal32(_) => CODE_DECIMAL32,
        Value::Decimal64(_) => CODE_DECIMAL64,
        Value::Decimal128(_) => CODE_DECIMAL128,
        Value::Char(_) => CODE_CHAR,
        Value::Timestamp(_) => CODE_TIMESTAMP,
        Value::Uuid(_) => CODE_UUID,
        Value::Binary(_) => CODE_VBIN32,
        Value::String(_) => CODE_STR32,
        Value::Symbol(_) => CODE_SYM32,
        Value::List(_) => CODE_LIST32,
        Value::Map(_) => CODE_MAP32,
        Value::Array(_) => CODE_ARRAY32,
        Value::Described(_, inner) => wide_code(inner),
    }
}

/// The data of `v` as its [`wide_code`] constructor lays it out.
fn encode_data(v: &Value, out: &mut BytesMut) {
    match v {
        Value::Null => {}
        Value::Bool(b) => out.put_u8(u8::from(*b)),
        Value::Ubyte(x) => out.put_u8(*x),
        Value::Ushort(x) => out.put_u16(*x),
        Value::Uint(x) => out.put_u32(*x),
        Value::Ulong(x) => out.put_u64(*x),
        Value::Byte(x) => out.put_i8(*x),
        Value::Short(x) => out.put_i16(*x),
        Value::Int(x) => out.put_i32(*x),
        Value::Long(x) => out.put_i64(*x),
        Value::Float(x) => out.put_f32(*x),
        Value::Double(x) => out.put_f64(*x),
        Value::Decimal32(b) => out.put_slice(b),
        Value::Decimal64(b) => out.put_slice(b),
        Value::Decimal128(b) => out.put_slice(b),
        Value::Char(c) => out.put_u32(*c as u32),
        Value::Timestamp(t) => out.put_i64(*t),
        Value::Uuid(u) => out.put_slice(u),
        Value::Binary(b) => put_sized32(out, b),
        Value::String(s) | Value::Symbol(s) => put_sized32(out, s.as_bytes()),
        Value::List(items) => {
            let mut body = BytesMut::new();
            for v in items {
                v.encode(&mut body);
            }
            put_compound32(out, items.len(), &body);
        }
        Value::Map(pairs) => {
            let mut body = BytesMut::new();
            for (k, v) in pairs {
                k.encode(&mut body);
                v.encode(&mut body);
            }
            put_compound32(out, pairs.len() * 2, &body);
        }
        Value::Array(_) => {
            // An array's data without its constructor: the constructor and count follow the size.
            let mut whole = BytesMut::new();
            v.encode(&mut whole);
            let (code, rest) = whole.split_first().expect("an array encodes to bytes");
            if *code == CODE_ARRAY8 {
                // Re-lay an array8 as array32: size and count widen.
                let size = rest[0] as usize;
                let count = rest[1] as u32;
                out.put_u32((size + 3) as u32);
                out.put_u32(count);
                out.put_slice(&rest[2..]);
            } else {
                out.put_slice(rest);
            }
        }
        Value::Described(_, inner) => encode_data(inner, out),
    }
}

fn put_sized32(out: &mut BytesMut, b: &[u8]) {
    assert!(b.len() <= u32::MAX as usize, "AMQP 1.0 value over 4 GiB");
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

/// A list, map or array: the 8-bit form when size and count fit, else the 32-bit one. The size
/// counts the count field and the elements.
fn put_compound(out: &mut BytesMut, code8: u8, code32: u8, count: usize, body: &[u8]) {
    if body.len() < 0xff && count <= 0xff {
        out.put_u8(code8);
        out.put_u8((body.len() + 1) as u8);
        out.put_u8(count as u8);
        out.put_slice(body);
    } else {
        out.put_u8(code32);
        put_compound32(out, count, body);
    }
}

fn put_compound32(out: &mut BytesMut, count: usize, body: &[u8]) {
    assert!(
        body.len() + 4 <= u32::MAX as usize,
        "AMQP 1.0 compound over 4 GiB"
    );
    out.put_u32((body.len() + 4) as u32);
    out.put_u32(count as u32);
    out.put_slice(body);
}

fn decode_value(r: &mut Reader, depth: usize) -> Result<Value, TypeError> {
    let code = r.u8()?;
    if code == CODE_DESCRIBED {
        if depth >= DEPTH_MAX {
            return Err(TypeError::TooDeep);
        }
        let descriptor = decode_value(r, depth + 1)?;
        let value = decode_value(r, depth + 1)?;
        return Ok(Value::Described(Box::new(descriptor), Box::new(value)));
    }
    decode_data(code, r, depth)
}

fn string(raw: Bytes) -> Result<String, TypeError> {
    String::from_utf8(raw.to_vec()).map_err(|_| TypeError::NotUtf8)
}

fn array<const N: usize>(r: &mut Reader) -> Result<[u8; N], TypeError> {
    let b = r.bytes(N)?;
    let mut a = [0u8; N];
    a.copy_from_slice(&b);
    Ok(a)
}

/// The data following constructor `code`.
fn decode_data(code: u8, r: &mut Reader, depth: usize) -> Result<Value, TypeError> {
    Ok(match code {
        CODE_NULL => Value::Null,
        CODE_TRUE => Value::Bool(true),
        CODE_FALSE => Value::Bool(false),
        CODE_BOOLEAN => match r.u8()? {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            _ => return Err(TypeError::Unexpected("boolean other than 0 or 1")),
        },
        CODE_UBYTE => Value::Ubyte(r.u8()?),
        CODE_USHORT => Value::Ushort(r.u16()?),
        CODE_UINT => Value::Uint(r.u32()?),
        CODE_SMALLUINT => Value::Uint(r.u8()? as u32),
        CODE_UINT0 => Value::Uint(0),
        CODE_ULONG => Value::Ulong(r.u64()?),
        CODE_SMALLULONG => Value::Ulong(r.u8()? as u64),
        CODE_ULONG0 => Value::Ulong(0),
        CODE_BYTE => Value::Byte(r.u8()? as i8),
        CODE_SHORT => Value::Short(r.u16()? as i16),
        CODE_INT => Value::Int(r.u32()? as i32),
        CODE_SMALLINT => Value::Int(r.u8()? as i8 as i32),
        CODE_LONG => Value::Long(r.u64()? as i64),
        CODE_SMALLLONG => Value::Long(r.u8()? as i8 as i64),
        CODE_FLOAT => Value::Float(f32::from_bits(r.u32()?)),
        CODE_DOUBLE => Value::Double(f64::from_bits(r.u64()?)),
        CODE_DECIMAL32 => Value::Decimal32(array(r)?),
        CODE_DECIMAL64 => Value::Decimal64(array(r)?),
        CODE_DECIMAL128 => Value::Decimal128(array(r)?),
        CODE_CHAR => {
            let c = r.u32()?;
            Value::Char(char::from_u32(c).ok_or(TypeError::BadChar(c))?)
        }
        CODE_TIMESTAMP => Value::Timestamp(r.u64()? as i64),
        CODE_UUID => Value::Uuid(array(r)?),
        CODE_VBIN8 => {
            let n = r.u8()? as usize;
            Value::Binary(r.bytes(n)?)
        }
        CODE_VBIN32 => {
            let n = r.u32()? as usize;
            Value::Binary(r.bytes(n)?)
        }
        CODE_STR8 | CODE_SYM8 => {
            let n = r.u8()? as usize;
            let s = string(r.bytes(n)?)?;
            if code == CODE_STR8 {
                Value::String(s)
            } else {
                Value::Symbol(s)
            }
        }
        CODE_STR32 | CODE_SYM32 => {
            let n = r.u32()? as usize;
            let s = string(r.bytes(n)?)?;
            if code == CODE_STR32 {
                Value::String(s)
            } else {
                Value::Symbol(s)
            }
        }
        CODE_LIST0 => Value::List(Vec::new()),
        CODE_LIST8 | CODE_LIST32 | CODE_MAP8 | CODE_MAP32 => {
            if depth >= DEPTH_MAX {
                return Err(TypeError::TooDeep);
            }
            let wide = code == CODE_LIST32 || code == CODE_MAP32;
            let mut inner = compound(r, wide)?;
            let count = inner.count;
            // Every element takes at least its constructor byte.
            if count > inner.r.remaining() {
                return Err(TypeError::BadLength);
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(decode_value(&mut inner.r, depth + 1)?);
            }
            if inner.r.remaining() != 0 {
                return Err(TypeError::BadLength);
            }
            if code == CODE_LIST8 || code == CODE_LIST32 {
                Value::List(items)
            } else {
                if items.len() % 2 != 0 {
                    return Err(TypeError::OddMap);
                }
                let mut pairs = Vec::with_capacity(items.len() / 2);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                Value::Map(pairs)
            }
        }
        CODE_ARRAY8 | CODE_ARRAY32 => {
            if depth >= DEPTH_MAX {
                return Err(TypeError::TooDeep);
            }
            let mut inner = compound(r, code == CODE_ARRAY32)?;
            let count = inner.count;
            // Elements of a zero-width type (null, true, uint0, ...) take no bytes: bound the
            // count by the array's size all the same, or four bytes could claim 2^32 elements.
            if count > inner.size {
                return Err(TypeError::BadLength);
            }
            let mut element_code = inner.r.u8()?;
            let mut descriptor = None;
            if element_code == CODE_DESCRIBED {
                descriptor = Some(decode_value(&mut inner.r, depth + 1)?);
                element_code = inner.r.u8()?;
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let v = decode_data(element_code, &mut inner.r, depth + 1)?;
                items.push(match &descriptor {
                    Some(d) => Value::Described(Box::new(d.clone()), Box::new(v)),
                    None => v,
                });
            }
            if inner.r.remaining() != 0 {
                return Err(TypeError::BadLength);
            }
            Value::Array(items)
        }
        other => return Err(TypeError::UnknownCode(other)),
    })
}

struct Compound {
    r: Reader,
    count: usize,
    /// The size field: the bytes of the count and the elements.
    size: usize,
}

/// Size and count of a list, map or array, and a reader over exactly its elements.
fn compound(r: &mut Reader, wide: bool) -> Result<Compound, TypeError> {
    let (size, width) = if wide {
        (r.u32()? as usize, 4)
    } else {
        (r.u8()? as usize, 1)
    };
    if size < width {
        return Err(TypeError::BadLength);
    }
    let mut body = Reader::new(r.bytes(size)?);
    let count = if wide {
        body.u32()? as usize
    } else {
        body.u8()? as usize
    };
    Ok(Compound {
        r: body,
        count,
        size,
    })
}
