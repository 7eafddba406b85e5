//! The headers exchange's matcher, following RabbitMQ's `rabbit_exchange_type_headers`.
//!
//! A binding's arguments are parsed once, at bind time, into the list of (key, pattern) pairs
//! that take part in matching, so routing does one ordered-map lookup per pattern key.
//!
//! RabbitMQ tests every binding of a headers exchange against every message. We index them
//! instead ([`HeadersIndex`]): a message can only match an `all` binding if it carries that
//! binding's first pattern key with an equal value (or at all, for a void pattern), and an
//! `any` binding only through one of its keys. So each binding is filed under one anchor
//! (`all`) or under each of its entries (`any`), by a fingerprint of (key, value up to
//! Erlang's `==`), and routing looks up each message header's fingerprints, then checks the
//! few candidates in full. Fingerprints may collide; that only adds candidates, which the
//! full check rejects. Route cost is O(message headers x candidates), not O(bindings).
//!
//! RabbitMQ compares a pattern value with a header value using Erlang's `==` on the decoded
//! values, not on the AMQP types: every integer type and the timestamp are the same kind of
//! number, `1 == 1.0` holds between an integer and a float or double, a long string equals a
//! byte array with the same bytes, and a boolean never equals a number. A pattern of type void
//! matches any value, as long as the header is present. Inside nested tables and arrays
//! RabbitMQ keeps the type tag beside each value, so there the types must match too.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};

use amq_protocol_types::{AMQPValue, FieldTable};

use super::RoutingError;

/// The four `x-match` modes; the "with-x" ones also compare arguments whose key starts with
/// `x-` (except `x-match` itself), the others ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XMatch {
    All,
    Any,
    AllWithX,
    AnyWithX,
}

#[derive(Debug)]
pub(crate) struct HeadersMatch {
    mode: XMatch,
    /// Pattern entries that take part in matching; `x-match` and (for all/any) `x-` keys removed.
    pattern: Box<[(Box<str>, AMQPValue)]>,
}

impl HeadersMatch {
    /// Parses binding arguments as RabbitMQ's `validate_binding` does: a missing `x-match`
    /// means `all`; anything other than a long string among the four modes is refused
    /// (the broker answers 406 PRECONDITION_FAILED).
    pub(crate) fn parse(args: &FieldTable) -> Result<HeadersMatch, RoutingError> {
        let mode = match args.inner().get("x-match") {
            None => XMatch::All,
            Some(AMQPValue::LongString(s)) => parse_mode(s.as_bytes())?,
            // Never decoded from the wire (a short string there is a 16-bit int in RabbitMQ's
            // dialect), but a broker building arguments in memory may use it.
            Some(AMQPValue::ShortString(s)) => parse_mode(s.as_str().as_bytes())?,
            Some(other) => {
                return Err(RoutingError::InvalidXMatchType {
                    type_name: type_tag(other).to_string(),
                    value: term_text(other),
                })
            }
        };
        let with_x = matches!(mode, XMatch::AllWithX | XMatch::AnyWithX);
        let pattern = args
            .inner()
            .iter()
            .filter(|(key, _)| {
                let key = key.as_str();
                key != "x-match" && (with_x || !key.starts_with("x-"))
            })
            .map(|(key, value)| (Box::from(key.as_str()), value.clone()))
            .collect();
        Ok(HeadersMatch { mode, pattern })
    }

    pub(crate) fn matches(&self, headers: Option<&FieldTable>) -> bool {
        let present = |key: &str| headers.and_then(|h| h.inner().get(key));
        let entry_matches = |(key, pattern): &(Box<str>, AMQPValue)| match present(key) {
            None => false,
            Some(_) if matches!(pattern, AMQPValue::Void) => true,
            Some(value) => erlang_equal(pattern, value),
        };
        match self.mode {
            XMatch::All | XMatch::AllWithX => self.pattern.iter().all(entry_matches),
            XMatch::Any | XMatch::AnyWithX => self.pattern.iter().any(entry_matches),
        }
    }
}

fn parse_mode(value: &[u8]) -> Result<XMatch, RoutingError> {
    match value {
        b"all" => Ok(XMatch::All),
        b"any" => Ok(XMatch::Any),
        b"all-with-x" => Ok(XMatch::AllWithX),
        b"any-with-x" => Ok(XMatch::AnyWithX),
        other => Err(RoutingError::InvalidXMatch {
            value: String::from_utf8_lossy(other).into_owned(),
        }),
    }
}

/// How RabbitMQ decodes a value into an Erlang term, reduced to what `==` distinguishes.
enum Term<'a> {
    Int(i128),
    Float(f64),
    Binary(&'a [u8]),
    Bool(bool),
    Decimal(u8, u32),
    Table(&'a FieldTable),
    Array(&'a [AMQPValue]),
    Undefined,
}

fn term(value: &AMQPValue) -> Term<'_> {
    match value {
        AMQPValue::Boolean(v) => Term::Bool(*v),
        AMQPValue::ShortShortInt(v) => Term::Int((*v).into()),
        AMQPValue::ShortShortUInt(v) => Term::Int((*v).into()),
        AMQPValue::ShortInt(v) => Term::Int((*v).into()),
        AMQPValue::ShortUInt(v) => Term::Int((*v).into()),
        AMQPValue::LongInt(v) => Term::Int((*v).into()),
        AMQPValue::LongUInt(v) => Term::Int((*v).into()),
        AMQPValue::LongLongInt(v) => Term::Int((*v).into()),
        AMQPValue::Timestamp(v) => Term::Int((*v).into()),
        AMQPValue::Float(v) => Term::Float((*v).into()),
        AMQPValue::Double(v) => Term::Float(*v),
        AMQPValue::DecimalValue(d) => Term::Decimal(d.scale, d.value),
        AMQPValue::ShortString(s) => Term::Binary(s.as_str().as_bytes()),
        AMQPValue::LongString(s) => Term::Binary(s.as_bytes()),
        AMQPValue::ByteArray(b) => Term::Binary(b.as_slice()),
        AMQPValue::FieldTable(t) => Term::Table(t),
        AMQPValue::FieldArray(a) => Term::Array(a.as_slice()),
        AMQPValue::Void => Term::Undefined,
    }
}

/// Erlang's `==` between the terms RabbitMQ decodes `a` and `b` into.
pub(crate) fn erlang_equal(a: &AMQPValue, b: &AMQPValue) -> bool {
    match (term(a), term(b)) {
        (Term::Int(x), Term::Int(y)) => x == y,
        // Erlang compares an integer and a float by value: equal only if the float is that
        // exact integer.
        (Term::Int(x), Term::Float(y)) | (Term::Float(y), Term::Int(x)) => {
            float_as_int(y) == Some(x)
        }
        (Term::Float(x), Term::Float(y)) => x == y,
        (Term::Binary(x), Term::Binary(y)) => x == y,
        (Term::Bool(x), Term::Bool(y)) => x == y,
        (Term::Decimal(s1, v1), Term::Decimal(s2, v2)) => s1 == s2 && v1 == v2,
        (Term::Undefined, Term::Undefined) => true,
        (Term::Table(x), Term::Table(y)) => {
            x.inner().len() == y.inner().len()
                && x.inner()
                    .iter()
                    .zip(y.inner())
                    .all(|((kx, vx), (ky, vy))| kx == ky && typed_equal(vx, vy))
        }
        (Term::Array(x), Term::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(vx, vy)| typed_equal(vx, vy))
        }
        _ => false,
    }
}

/// A value roughly as RabbitMQ prints it in error texts (`~tp`).
fn term_text(value: &AMQPValue) -> String {
    match term(value) {
        Term::Int(x) => x.to_string(),
        Term::Float(y) => y.to_string(),
        Term::Bool(b) => b.to_string(),
        Term::Binary(b) => format!("<<{:?}>>", String::from_utf8_lossy(b)),
        Term::Undefined => "undefined".to_string(),
        _ => format!("{value:?}"),
    }
}

/// Nested values carry RabbitMQ's type tag in the term, so the tags must match as well.
fn typed_equal(a: &AMQPValue, b: &AMQPValue) -> bool {
    type_tag(a) == type_tag(b) && erlang_equal(a, b)
}

/// RabbitMQ's type atom for a value, as its binary parser names it.
fn type_tag(value: &AMQPValue) -> &'static str {
    match value {
        AMQPValue::Boolean(_) => "bool",
        AMQPValue::ShortShortInt(_) => "byte",
        AMQPValue::ShortShortUInt(_) => "unsignedbyte",
        AMQPValue::ShortInt(_) => "short",
        AMQPValue::ShortUInt(_) => "unsignedshort",
        AMQPValue::LongInt(_) => "signedint",
        AMQPValue::LongUInt(_) => "unsignedint",
        AMQPValue::LongLongInt(_) => "long",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) | AMQPValue::LongString(_) => "longstr",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "binary",
        AMQPValue::Void => "void",
    }
}

/// The integer a float is exactly equal to, if any (so `1.0` and `1` share a fingerprint).
fn float_as_int(y: f64) -> Option<i128> {
    // 2^126 is far inside i128 and exactly representable, so `as` neither saturates nor rounds.
    const LIMIT: f64 = 85_070_591_730_234_615_865_843_651_857_942_052_864.0;
    (y.fract() == 0.0 && y.abs() < LIMIT).then_some(y as i128)
}

/// Where a binding is filed in a [`HeadersIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AnchorList {
    /// An `all` binding with nothing to compare: it matches every message.
    Always,
    /// The list of bindings a header with this fingerprint may satisfy.
    Keyed(u64),
}

/// One filing of a binding, with its position in the list for O(1) removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Anchor {
    pub(crate) list: AnchorList,
    pub(crate) position: u32,
}

#[derive(Debug, Default)]
pub(crate) struct HeadersIndex {
    /// Random keys, so clients cannot choose colliding fingerprints on purpose.
    hasher: RandomState,
    pub(crate) always: Vec<super::BindingId>,
    pub(crate) keyed: std::collections::HashMap<u64, Vec<super::BindingId>>,
}

impl HeadersIndex {
    /// Fingerprint of a header or pattern with this key and a value equal to `value`.
    pub(crate) fn value_fingerprint(&self, key: &str, value: &AMQPValue) -> u64 {
        let mut h = self.hasher.build_hasher();
        0u8.hash(&mut h);
        key.hash(&mut h);
        match term(value) {
            Term::Int(x) => (0u8, x).hash(&mut h),
            Term::Float(y) => match float_as_int(y) {
                Some(x) => (0u8, x).hash(&mut h),
                None => (1u8, y.to_bits()).hash(&mut h),
            },
            Term::Binary(b) => (2u8, b).hash(&mut h),
            Term::Bool(b) => (3u8, b).hash(&mut h),
            Term::Decimal(scale, v) => (4u8, scale, v).hash(&mut h),
            // Nested values share one fingerprint per key: rare in bindings, checked in full.
            Term::Table(_) | Term::Array(_) => 5u8.hash(&mut h),
            Term::Undefined => 6u8.hash(&mut h),
        }
        h.finish()
    }

    /// Fingerprint of "a header with this key is present", for void patterns.
    pub(crate) fn key_fingerprint(&self, key: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        1u8.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    fn entry_list(&self, (key, pattern): &(Box<str>, AMQPValue)) -> AnchorList {
        AnchorList::Keyed(match pattern {
            AMQPValue::Void => self.key_fingerprint(key),
            _ => self.value_fingerprint(key, pattern),
        })
    }

    /// Files `binding` where a matching message will find it; returns its anchors.
    pub(crate) fn insert(
        &mut self,
        binding: super::BindingId,
        matcher: &HeadersMatch,
    ) -> Vec<Anchor> {
        let lists: Vec<AnchorList> = match (matcher.mode, matcher.pattern.first()) {
            (XMatch::All | XMatch::AllWithX, None) => vec![AnchorList::Always],
            // Any one entry must match, so file under the most selective one: the shortest
            // list now, a value rather than mere presence on ties. Bindings that share their
            // first key and value (format=pdf, tenant=N) then spread over the tenant lists.
            (XMatch::All | XMatch::AllWithX, Some(_)) => {
                let best = matcher.pattern.iter().min_by_key(|entry| {
                    let len = match self.entry_list(entry) {
                        AnchorList::Keyed(f) => self.keyed.get(&f).map_or(0, Vec::len),
                        AnchorList::Always => 0,
                    };
                    (len, matches!(entry.1, AMQPValue::Void))
                });
                vec![self.entry_list(best.expect("the pattern is not empty"))]
            }
            // `any` with nothing to compare never matches: filed nowhere.
            (XMatch::Any | XMatch::AnyWithX, _) => {
                matcher.pattern.iter().map(|e| self.entry_list(e)).collect()
            }
        };
        lists
            .into_iter()
            .map(|list| {
                let bindings = self.list_mut(list);
                bindings.push(binding);
                Anchor {
                    list,
                    position: u32::try_from(bindings.len() - 1)
                        .expect("lists are shorter than 2^32"),
                }
            })
            .collect()
    }

    fn list_mut(&mut self, list: AnchorList) -> &mut Vec<super::BindingId> {
        match list {
            AnchorList::Always => &mut self.always,
            AnchorList::Keyed(f) => self.keyed.entry(f).or_default(),
        }
    }

    /// Unfiles one anchor of `binding`. Returns the binding that moved into the anchor's
    /// position and the position it moved from, to find and update its anchor on this list.
    pub(crate) fn remove(
        &mut self,
        anchor: Anchor,
        binding: super::BindingId,
    ) -> Option<(super::BindingId, u32)> {
        let list = self.list_mut(anchor.list);
        let removed = list.swap_remove(anchor.position as usize);
        assert_eq!(removed, binding, "headers anchor out of date");
        let old_position = u32::try_from(list.len()).expect("lists are shorter than 2^32");
        let moved = list
            .get(anchor.position as usize)
            .map(|&moved| (moved, old_position));
        if let (AnchorList::Keyed(f), true) = (anchor.list, list.is_empty()) {
            self.keyed.remove(&f);
        }
        moved
    }
}
