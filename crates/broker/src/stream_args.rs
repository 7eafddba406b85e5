//! What a client asks of a stream over AMQP 0-9-1, read as RabbitMQ 3.10 reads it: the
//! retention and segment arguments at declare, and where a consumer starts (`x-stream-offset`).
//!
//! RabbitMQ's own parsers crash the channel's process on some malformed values (541
//! INTERNAL_ERROR for `x-max-age=bogus` or a boolean offset); here every malformed value is the
//! 406 RabbitMQ gives its near neighbours, so a client learns what it sent wrong. The texts of
//! the 406s are RabbitMQ 3.10.8's (checked by `tests/interop/python/test_streams.py` against the
//! real node).
//!
//! Time is an input: an interval offset (`"1h"`) is resolved against the `now_ms` the caller
//! passes, so the same consume resolves alike wherever it is replayed.

use crate::args::{integer, string, type_name};
use crate::error::AmqpError;
use amq_protocol_types::AMQPValue;

use warren_store::stream::{SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_LIMIT};

/// The units of `x-max-age` and of an interval offset, in milliseconds. RabbitMQ counts a
/// month as 30 days and a year as 365 (rabbit_amqqueue:unit_value_in_ms).
const UNITS_MS: [(char, u64); 6] = [
    ('Y', 365 * 24 * 3_600_000),
    ('M', 30 * 24 * 3_600_000),
    ('D', 24 * 3_600_000),
    ('h', 3_600_000),
    ('m', 60_000),
    ('s', 1_000),
];

/// A duration as RabbitMQ writes one: a positive whole number then exactly one unit of
/// `Y M D h m s`, case-sensitive (`7D`, `12h`, `30m`). `1h30m`, `7d`, `0s`, `1.5h` are not.
/// Saturates rather than overflows: `99999999999D` is accepted by RabbitMQ and means "forever".
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let unit = text.chars().last()?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (_, unit_ms) = UNITS_MS.iter().find(|(u, _)| *u == unit)?;
    // Leading zeros are fine ("007D"); the value is what matters, and it must be above zero.
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() {
        return None;
    }
    let value: u64 = trimmed.parse().unwrap_or(u64::MAX);
    Some(value.saturating_mul(*unit_ms))
}

/// A stream's declare arguments, parsed once. Retention is applied by whole segments, so both
/// limits are "at least this much is kept", never exact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// `x-max-length-bytes`: the stream's size above which its oldest segments go.
    pub max_bytes: Option<u64>,
    /// `x-max-age`: how long a segment is kept after its newest chunk was written.
    pub max_age_ms: Option<u64>,
    /// `x-stream-max-segment-size-bytes`: fixed at declare, as RabbitMQ fixes it.
    pub segment_bytes: u64,
    /// `x-initial-cluster-size`: how many nodes hold a member, capped at the cluster's size.
    pub initial_cluster_size: Option<u64>,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            max_bytes: None,
            max_age_ms: None,
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            initial_cluster_size: None,
        }
    }
}

impl StreamConfig {
    /// Reads a stream's own arguments from a declare whose other arguments (and the type's
    /// refusals) are checked by `args::QueueConfig::parse`. Errors name the queue as
    /// rabbit_amqqueue:check_declare_arguments does.
    pub fn parse(
        args: &amq_protocol_types::FieldTable,
        queue: &str,
        vhost: &str,
    ) -> Result<StreamConfig, AmqpError> {
        let bad = |key: &str, why: String| {
            AmqpError::precondition(format!(
                "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {why}"
            ))
        };
        let non_negative = |key: &str, v: &AMQPValue| -> Result<u64, AmqpError> {
            let i = integer(v)
                .ok_or_else(|| bad(key, format!("\"expected integer, got {}\"", type_name(v))))?;
            u64::try_from(i).map_err(|_| bad(key, format!("{{value_negative,{i}}}")))
        };
        let mut c = StreamConfig::default();
        for (k, v) in args.inner() {
            let key = k.as_str();
            match key {
                "x-max-length-bytes" => c.max_bytes = Some(non_negative(key, v)?),
                "x-max-age" => {
                    let text = string(v).ok_or_else(|| {
                        bad(key, format!("{{unacceptable_type,{}}}", type_name(v)))
                    })?;
                    c.max_age_ms = Some(
                        parse_duration_ms(&text)
                            .ok_or_else(|| bad(key, "invalid_max_age".into()))?,
                    );
                }
                "x-stream-max-segment-size-bytes" => {
                    // RabbitMQ takes 0 (a segment per chunk, in effect) and refuses above
                    // its limit with a text of its own.
                    let n = non_negative(key, v)?;
                    if n > SEGMENT_BYTES_LIMIT {
                        return Err(AmqpError::precondition(
                            "Exceeded max value for x-stream-max-segment-size-bytes",
                        ));
                    }
                    c.segment_bytes = n;
                }
                "x-initial-cluster-size" => {
                    let n = non_negative(key, v)?;
                    if n == 0 {
                        return Err(bad(key, "{value_zero,0}".into()));
                    }
                    c.initial_cluster_size = Some(n);
                }
                _ => {}
            }
        }
        Ok(c)
    }
}

/// Where a consumer starts reading a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOffset {
    /// The oldest chunk still kept.
    First,
    /// The start of the newest chunk: the consumer sees the last batch written, then what
    /// follows.
    Last,
    /// Only what is written after the consumer starts (the default).
    Next,
    /// The message at this offset, or the first kept if it is older; nothing until the
    /// stream reaches it if it is beyond the end.
    Offset(u64),
    /// The first chunk written at or after this time (milliseconds since the epoch).
    Timestamp(i64),
}

impl StartOffset {
    /// `x-stream-offset` as rabbit_stream_queue:consume reads it: `first`, `last`, `next`, a
    /// number (below zero means the first), an AMQP timestamp (seconds), or an interval
    /// string counted back from `now_ms`.
    pub fn from_argument(
        value: Option<&AMQPValue>,
        queue: &str,
        vhost: &str,
        now_ms: i64,
    ) -> Result<StartOffset, AmqpError> {
        let Some(v) = value else {
            return Ok(StartOffset::Next);
        };
        if let Some(i) = integer(v) {
            return Ok(StartOffset::Offset(u64::try_from(i).unwrap_or(0)));
        }
        if let AMQPValue::Timestamp(seconds) = v {
            let ms = i64::try_from(*seconds)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000);
            return Ok(StartOffset::Timestamp(ms));
        }
        let refuse = |what: String| {
            AmqpError::precondition(format!(
                "invalid arg 'x-stream-offset' for queue '{queue}' in vhost '{vhost}': \
                 {{invalid_stream_offset_arg,{what}}}"
            ))
        };
        let Some(text) = string(v) else {
            return Err(refuse(format!("{{{},{}}}", type_name(v), render_term(v))));
        };
        match text.as_str() {
            "first" => Ok(StartOffset::First),
            "last" => Ok(StartOffset::Last),
            "next" => Ok(StartOffset::Next),
            _ => match parse_duration_ms(&text) {
                Some(ms) => Ok(StartOffset::Timestamp(
                    now_ms.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX)),
                )),
                None => Err(refuse(format!(
                    "{{{},{}}}",
                    type_name(v),
                    crate::error::erlang_binary(text.as_bytes())
                ))),
            },
        }
    }
}

/// A value as Erlang prints it inside RabbitMQ's offset error (`true`, `1.5`).
fn render_term(v: &AMQPValue) -> String {
    match v {
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::Float(f) => f.to_string(),
        AMQPValue::Double(d) => d.to_string(),
        AMQPValue::Void => "undefined".into(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol_types::{FieldTable, LongString};

    fn long(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
    }

    fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    #[test]
    fn durations_are_digits_then_one_case_sensitive_unit() {
        assert_eq!(parse_duration_ms("7D"), Some(7 * 86_400_000));
        assert_eq!(parse_duration_ms("12h"), Some(12 * 3_600_000));
        assert_eq!(parse_duration_ms("30m"), Some(30 * 60_000));
        assert_eq!(parse_duration_ms("30M"), Some(30 * 30 * 86_400_000));
        assert_eq!(parse_duration_ms("1Y"), Some(365 * 86_400_000));
        assert_eq!(parse_duration_ms("007D"), Some(7 * 86_400_000));
        assert_eq!(
            parse_duration_ms("99999999999999999999999D"),
            Some(u64::MAX)
        );
        for bad in [
            "7d", "1H", "1y", "0s", "0D", "1h30m", "10", "1D ", " 1D", "1.5h", "1W", "s", "-1D",
            "", "bogus", "1é",
        ] {
            assert_eq!(parse_duration_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn declare_arguments_parse_with_rabbitmq_texts() {
        let c = StreamConfig::parse(
            &table(&[
                ("x-max-age", long("7D")),
                ("x-max-length-bytes", AMQPValue::LongLongInt(1_000_000)),
                ("x-stream-max-segment-size-bytes", AMQPValue::LongInt(1000)),
                ("x-initial-cluster-size", AMQPValue::ShortShortUInt(3)),
            ]),
            "s",
            "/",
        )
        .unwrap();
        assert_eq!(
            c,
            StreamConfig {
                max_bytes: Some(1_000_000),
                max_age_ms: Some(7 * 86_400_000),
                segment_bytes: 1000,
                initial_cluster_size: Some(3),
            }
        );
        assert_eq!(
            StreamConfig::parse(&FieldTable::default(), "s", "/").unwrap(),
            StreamConfig::default()
        );
        let err = |pairs: &[(&str, AMQPValue)]| {
            StreamConfig::parse(&table(pairs), "s", "/")
                .unwrap_err()
                .text
        };
        assert_eq!(
            err(&[("x-max-age", AMQPValue::LongInt(7))]),
            "PRECONDITION_FAILED - invalid arg 'x-max-age' for queue 's' in vhost '/': {unacceptable_type,signedint}"
        );
        assert_eq!(
            err(&[("x-max-age", long("bogus"))]),
            "PRECONDITION_FAILED - invalid arg 'x-max-age' for queue 's' in vhost '/': invalid_max_age"
        );
        assert_eq!(
            err(&[("x-max-length-bytes", AMQPValue::LongInt(-1))]),
            "PRECONDITION_FAILED - invalid arg 'x-max-length-bytes' for queue 's' in vhost '/': {value_negative,-1}"
        );
        assert_eq!(
            err(&[("x-max-length-bytes", long("10"))]),
            "PRECONDITION_FAILED - invalid arg 'x-max-length-bytes' for queue 's' in vhost '/': \"expected integer, got longstr\""
        );
        assert_eq!(
            err(&[(
                "x-stream-max-segment-size-bytes",
                AMQPValue::LongLongInt(3_000_000_001)
            )]),
            "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes"
        );
        assert_eq!(
            err(&[("x-initial-cluster-size", AMQPValue::LongInt(0))]),
            "PRECONDITION_FAILED - invalid arg 'x-initial-cluster-size' for queue 's' in vhost '/': {value_zero,0}"
        );
    }

    #[test]
    fn start_offsets_as_rabbitmq_reads_them() {
        let now = 1_000_000_000_000;
        let at = |v: Option<AMQPValue>| StartOffset::from_argument(v.as_ref(), "s", "/", now);
        assert_eq!(at(None).unwrap(), StartOffset::Next);
        assert_eq!(at(Some(long("first"))).unwrap(), StartOffset::First);
        assert_eq!(at(Some(long("last"))).unwrap(), StartOffset::Last);
        assert_eq!(at(Some(long("next"))).unwrap(), StartOffset::Next);
        assert_eq!(
            at(Some(AMQPValue::LongLongInt(3))).unwrap(),
            StartOffset::Offset(3)
        );
        assert_eq!(
            at(Some(AMQPValue::ShortShortInt(-1))).unwrap(),
            StartOffset::Offset(0)
        );
        assert_eq!(
            at(Some(AMQPValue::Timestamp(1_700_000_000))).unwrap(),
            StartOffset::Timestamp(1_700_000_000_000)
        );
        assert_eq!(
            at(Some(long("1h"))).unwrap(),
            StartOffset::Timestamp(now - 3_600_000)
        );
        assert_eq!(
            at(Some(long("3"))).unwrap_err().text,
            "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue 's' in vhost '/': {invalid_stream_offset_arg,{longstr,<<\"3\">>}}"
        );
        assert_eq!(
            at(Some(AMQPValue::Boolean(true))).unwrap_err().text,
            "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue 's' in vhost '/': {invalid_stream_offset_arg,{bool,true}}"
        );
    }
}
