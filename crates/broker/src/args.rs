//! Queue arguments (`x-*`), validated as RabbitMQ 3.10 validates them.
//!
//! Unknown arguments are accepted and ignored, as RabbitMQ does; known ones with the wrong type
//! or value, or that belong to another queue type, are a 406 PRECONDITION_FAILED whose text
//! matches RabbitMQ 3.10.8's
//! (`invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "expected integer, got longstr"`).

use crate::error::AmqpError;
pub use crate::queue_type::QueueType;
use crate::queue_type::{CLASSIC_ARGUMENTS, QUORUM_ARGUMENTS, STREAM_ARGUMENTS};
use amq_protocol_types::{AMQPValue, FieldTable};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    #[default]
    DropHead,
    RejectPublish,
    RejectPublishDlx,
}

/// Everything the queue's behaviour depends on, parsed once at declare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueConfig {
    pub message_ttl_ms: Option<u64>,
    pub expires_ms: Option<u64>,
    pub max_length: Option<u64>,
    pub max_length_bytes: Option<u64>,
    pub overflow: Overflow,
    pub dead_letter_exchange: Option<String>,
    pub dead_letter_routing_key: Option<String>,
    pub max_priority: Option<u8>,
    pub single_active_consumer: bool,
    pub queue_type: QueueType,
    pub delivery_limit: Option<u64>,
    /// `x-dead-letter-strategy=at-least-once` (quorum queues only; see
    /// `quorum::dead_letters`).
    pub dead_letter_at_least_once: bool,
    pub lazy: bool,
    pub max_in_memory_length: Option<u64>,
    pub max_in_memory_bytes: Option<u64>,
    /// A stream's retention and segment size (streams only).
    pub stream: Option<crate::stream_args::StreamConfig>,
}

/// RabbitMQ's name for a field's type, as it appears in its error texts.
pub fn type_name(v: &AMQPValue) -> &'static str {
    match v {
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
        AMQPValue::ShortString(_) => "shortstr",
        AMQPValue::LongString(_) => "longstr",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "binary",
        AMQPValue::Void => "void",
    }
}

/// The value of an integer-typed field, if it is one of the types RabbitMQ accepts as integer.
pub fn integer(v: &AMQPValue) -> Option<i64> {
    Some(match v {
        AMQPValue::ShortShortInt(x) => *x as i64,
        AMQPValue::ShortShortUInt(x) => *x as i64,
        AMQPValue::ShortInt(x) => *x as i64,
        AMQPValue::ShortUInt(x) => *x as i64,
        AMQPValue::LongInt(x) => *x as i64,
        AMQPValue::LongUInt(x) => *x as i64,
        AMQPValue::LongLongInt(x) => *x,
        _ => return None,
    })
}

pub fn string(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Renders a value the way RabbitMQ prints it inside `inequivalent arg` errors.
pub fn render(v: &AMQPValue) -> String {
    match v {
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::LongString(_) | AMQPValue::ShortString(_) => string(v).unwrap_or_default(),
        _ => integer(v)
            .map(|i| i.to_string())
            .unwrap_or_else(|| format!("{v:?}")),
    }
}

/// The longest x-message-ttl / x-expires RabbitMQ accepts (rabbit_misc:check_expiry): ten years.
pub const EXPIRY_MS_MAX: i64 = 315_360_000_000;

/// The arguments each queue type takes (its `queue_arguments` capability in RabbitMQ 3.10.8).
/// A known argument of another type is refused with "... of queue type rabbit_X_queue".
impl QueueConfig {
    /// Validates as rabbit_amqqueue:check_declare_arguments does: x-queue-type first, then the
    /// type's own arguments (type and value), then known arguments of other queue types.
    /// Error details are Erlang terms printed with `~p`, hence the quoted strings.
    pub fn parse(args: &FieldTable, queue: &str, vhost: &str) -> Result<QueueConfig, AmqpError> {
        let mut c = QueueConfig::default();
        let bad = |key: &str, why: String| {
            AmqpError::precondition(format!(
                "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {why}"
            ))
        };
        let wrong_type =
            |key: &str, v: &AMQPValue| bad(key, format!("{{unacceptable_type,{}}}", type_name(v)));
        let int = |key: &str, v: &AMQPValue| -> Result<i64, AmqpError> {
            integer(v)
                .ok_or_else(|| bad(key, format!("\"expected integer, got {}\"", type_name(v))))
        };
        let non_negative = |key: &str, v: &AMQPValue| -> Result<u64, AmqpError> {
            let i = int(key, v)?;
            if i < 0 {
                return Err(bad(key, format!("{{value_negative,{i}}}")));
            }
            Ok(i as u64)
        };
        let positive = |key: &str, v: &AMQPValue| -> Result<u64, AmqpError> {
            let i = non_negative(key, v)?;
            if i == 0 {
                return Err(bad(key, "{value_zero,0}".into()));
            }
            Ok(i)
        };
        let expiry = |key: &str, v: &AMQPValue, zero_ok: bool| -> Result<u64, AmqpError> {
            let i = int(key, v)?;
            if i == 0 && !zero_ok {
                return Err(bad(key, "{value_zero,0}".into()));
            }
            if i < 0 {
                return Err(bad(key, format!("{{value_negative,{i}}}")));
            }
            if i > EXPIRY_MS_MAX {
                return Err(bad(key, format!("{{value_too_large,{i}}}")));
            }
            Ok(i as u64)
        };
        let text = |key: &str, v: &AMQPValue| -> Result<String, AmqpError> {
            string(v).ok_or_else(|| wrong_type(key, v))
        };

        // rabbit_channel reads the DLX name (rabbit_misc:r_arg) before the arguments are
        // validated, with a wording of its own.
        if let Some(v) = args.inner().get("x-dead-letter-exchange") {
            if !matches!(v, AMQPValue::LongString(_)) {
                return Err(AmqpError::precondition(format!(
                    "invalid type '{}' for arg 'x-dead-letter-exchange' in queue '{queue}' in vhost '{vhost}'",
                    type_name(v)
                )));
            }
        }
        if let Some(v) = args.inner().get("x-queue-type") {
            let name = text("x-queue-type", v)?;
            c.queue_type = QueueType::from_name(&name).ok_or_else(|| {
                bad(
                    "x-queue-type",
                    format!("\"unsupported queue type '{name}'\""),
                )
            })?;
        }
        let (own, type_module) = (c.queue_type.arguments(), c.queue_type.module());
        for (k, v) in args.inner() {
            let key = k.as_str();
            if !own.contains(&key) {
                continue;
            }
            match key {
                "x-message-ttl" => c.message_ttl_ms = Some(expiry(key, v, true)?),
                "x-expires" => c.expires_ms = Some(expiry(key, v, false)?),
                "x-max-length" => c.max_length = Some(non_negative(key, v)?),
                "x-max-length-bytes" => c.max_length_bytes = Some(non_negative(key, v)?),
                "x-max-in-memory-length" => c.max_in_memory_length = Some(non_negative(key, v)?),
                "x-max-in-memory-bytes" => c.max_in_memory_bytes = Some(non_negative(key, v)?),
                "x-quorum-initial-group-size" => {
                    positive(key, v)?;
                }
                // RabbitMQ 3.10 does not validate it; a value that is no count means no limit.
                "x-delivery-limit" => {
                    c.delivery_limit = integer(v).and_then(|i| u64::try_from(i).ok());
                }
                "x-max-priority" => {
                    let p = non_negative(key, v)?;
                    if p > 255 {
                        return Err(bad(key, format!("{{max_value_exceeded,{p}}}")));
                    }
                    c.max_priority = Some(p as u8);
                }
                "x-dead-letter-exchange" => c.dead_letter_exchange = Some(text(key, v)?),
                "x-dead-letter-routing-key" => c.dead_letter_routing_key = Some(text(key, v)?),
                "x-dead-letter-strategy" => {
                    let s = text(key, v)?;
                    if s != "at-most-once" && s != "at-least-once" {
                        return Err(bad(key, "invalid_dlx_strategy".into()));
                    }
                    c.dead_letter_at_least_once = s == "at-least-once";
                }
                "x-overflow" => {
                    c.overflow = match text(key, v)?.as_str() {
                        "drop-head" => Overflow::DropHead,
                        "reject-publish" => Overflow::RejectPublish,
                        // Quorum queues log a warning and keep the default (rabbit_quorum_queue).
                        "reject-publish-dlx" if c.queue_type == QueueType::Quorum => {
                            Overflow::DropHead
                        }
                        "reject-publish-dlx" => Overflow::RejectPublishDlx,
                        _ => return Err(bad(key, "invalid_overflow".into())),
                    }
                }
                "x-queue-mode" => {
                    c.lazy = match text(key, v)?.as_str() {
                        "default" => false,
                        "lazy" => true,
                        other => {
                            return Err(bad(key, format!("\"unsupported queue mode '{other}'\"")))
                        }
                    }
                }
                "x-queue-version" => {
                    let version = non_negative(key, v)?;
                    if version != 1 && version != 2 {
                        return Err(bad(
                            key,
                            format!("\"unsupported queue version '{version}'\""),
                        ));
                    }
                }
                "x-single-active-consumer" => match v {
                    AMQPValue::Boolean(b) => c.single_active_consumer = *b,
                    _ => return Err(wrong_type(key, v)),
                },
                "x-queue-leader-locator" => {
                    let s = text(key, v)?;
                    if !["client-local", "balanced", "random", "least-leaders"]
                        .contains(&s.as_str())
                    {
                        return Err(bad(key, "invalid_queue_locator_arg".into()));
                    }
                }
                _ => {}
            }
        }
        if c.queue_type == QueueType::Stream {
            c.stream = Some(crate::stream_args::StreamConfig::parse(args, queue, vhost)?);
        }
        if c.dead_letter_routing_key.is_some() && c.dead_letter_exchange.is_none() {
            return Err(bad(
                "x-dead-letter-routing-key",
                "routing_key_but_no_dlx_defined".into(),
            ));
        }
        for k in args.inner().keys() {
            let key = k.as_str();
            let known = CLASSIC_ARGUMENTS
                .iter()
                .chain(QUORUM_ARGUMENTS)
                .chain(STREAM_ARGUMENTS)
                .any(|a| *a == key);
            if known && !own.contains(&key) {
                return Err(AmqpError::precondition(format!(
                    "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}' of queue type {type_module}"
                )));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol_types::LongString;

    fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    #[test]
    fn string_ttl_is_rejected_with_rabbitmq_wording() {
        let err = QueueConfig::parse(
            &table(&[(
                "x-message-ttl",
                AMQPValue::LongString(LongString::from("5")),
            )]),
            "q",
            "/",
        )
        .unwrap_err();
        assert_eq!(err.code, 406);
        assert_eq!(
            err.text,
            "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue 'q' in vhost '/': \"expected integer, got longstr\""
        );
    }

    #[test]
    fn zero_expires_and_negative_length_are_rejected() {
        assert!(
            QueueConfig::parse(&table(&[("x-expires", AMQPValue::LongInt(0))]), "q", "/").is_err()
        );
        assert!(QueueConfig::parse(
            &table(&[("x-max-length", AMQPValue::LongInt(-1))]),
            "q",
            "/"
        )
        .is_err());
    }

    #[test]
    fn known_arguments_are_parsed_and_unknown_ignored() {
        let c = QueueConfig::parse(
            &table(&[
                ("x-message-ttl", AMQPValue::LongInt(100)),
                (
                    "x-overflow",
                    AMQPValue::LongString(LongString::from("reject-publish")),
                ),
                ("x-max-priority", AMQPValue::ShortShortUInt(10)),
                ("x-whatever", AMQPValue::Boolean(true)),
            ]),
            "q",
            "/",
        )
        .unwrap();
        assert_eq!(c.message_ttl_ms, Some(100));
        assert_eq!(c.overflow, Overflow::RejectPublish);
        assert_eq!(c.max_priority, Some(10));
    }
}
