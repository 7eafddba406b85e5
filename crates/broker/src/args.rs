//! Queue arguments (`x-*`), validated as RabbitMQ 3.10 validates them.
//!
//! Unknown arguments are accepted and ignored, as RabbitMQ does; known ones with the wrong type
//! or value are a 406 PRECONDITION_FAILED whose text matches RabbitMQ's
//! (`invalid arg 'x-message-ttl' for queue 'q' in vhost '/': "expected integer, got longstr"`).

use crate::error::AmqpError;
use amq_protocol_types::{AMQPValue, FieldTable};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    #[default]
    DropHead,
    RejectPublish,
    RejectPublishDlx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    #[default]
    Classic,
    Quorum,
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
    pub lazy: bool,
    pub max_in_memory_length: Option<u64>,
    pub max_in_memory_bytes: Option<u64>,
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

impl QueueConfig {
    pub fn parse(args: &FieldTable, queue: &str, vhost: &str) -> Result<QueueConfig, AmqpError> {
        let mut c = QueueConfig::default();
        let bad = |key: &str, why: String| {
            AmqpError::precondition(format!(
                "invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {why}"
            ))
        };
        // Integer arguments, with RabbitMQ's reasons: a wrong type, then sign, then range.
        let int =
            |key: &str, v: &AMQPValue, min: i64, max: Option<i64>| -> Result<u64, AmqpError> {
                let i = integer(v).ok_or_else(|| {
                    bad(key, format!("\"expected integer, got {}\"", type_name(v)))
                })?;
                if i < 0 && min >= 0 {
                    return Err(bad(key, format!("{{value_negative,{i}}}")));
                }
                if i < min {
                    return Err(bad(key, format!("{{value_zero,{i}}}")));
                }
                if let Some(m) = max {
                    if i > m {
                        return Err(bad(key, format!("{{value_too_large,{i}}}")));
                    }
                }
                Ok(i as u64)
            };
        let text = |key: &str, v: &AMQPValue| -> Result<String, AmqpError> {
            string(v).ok_or_else(|| bad(key, format!("{{unacceptable_type,{}}}", type_name(v))))
        };
        // String arguments that name things report a wrong type in another phrasing.
        let name = |key: &str, v: &AMQPValue| -> Result<String, AmqpError> {
            string(v).ok_or_else(|| {
                AmqpError::precondition(format!(
                    "invalid type '{}' for arg '{key}' in queue '{queue}' in vhost '{vhost}'",
                    type_name(v)
                ))
            })
        };
        for (k, v) in args.inner() {
            let key = k.as_str();
            match key {
                "x-message-ttl" => c.message_ttl_ms = Some(int(key, v, 0, Some(EXPIRY_MS_MAX))?),
                "x-expires" => c.expires_ms = Some(int(key, v, 1, Some(EXPIRY_MS_MAX))?),
                "x-max-length" => c.max_length = Some(int(key, v, 0, None)?),
                "x-max-length-bytes" => c.max_length_bytes = Some(int(key, v, 0, None)?),
                "x-delivery-limit" => c.delivery_limit = Some(int(key, v, 0, None)?),
                "x-max-in-memory-length" => c.max_in_memory_length = Some(int(key, v, 0, None)?),
                "x-max-in-memory-bytes" => c.max_in_memory_bytes = Some(int(key, v, 0, None)?),
                "x-quorum-initial-group-size" => {
                    int(key, v, 1, None)?;
                }
                "x-max-priority" => {
                    let p = int(key, v, 0, None)?;
                    if p > 255 {
                        return Err(bad(key, format!("{{max_value_exceeded,{p}}}")));
                    }
                    c.max_priority = Some(p as u8);
                }
                "x-dead-letter-exchange" => c.dead_letter_exchange = Some(name(key, v)?),
                "x-dead-letter-routing-key" => c.dead_letter_routing_key = Some(name(key, v)?),
                "x-overflow" => {
                    c.overflow = match text(key, v)?.as_str() {
                        "drop-head" => Overflow::DropHead,
                        "reject-publish" => Overflow::RejectPublish,
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
                "x-dead-letter-strategy" => match text(key, v)?.as_str() {
                    "at-most-once" | "at-least-once" => {}
                    _ => return Err(bad(key, "invalid_dlx_strategy".into())),
                },
                "x-single-active-consumer" => match v {
                    AMQPValue::Boolean(b) => c.single_active_consumer = *b,
                    _ => return Err(bad(key, format!("{{unacceptable_type,{}}}", type_name(v)))),
                },
                "x-queue-type" => {
                    c.queue_type = match text(key, v)?.as_str() {
                        "classic" => QueueType::Classic,
                        "quorum" => QueueType::Quorum,
                        other => {
                            return Err(bad(key, format!("\"unsupported queue type '{other}'\"")))
                        }
                    }
                }
                _ => {}
            }
        }
        if c.dead_letter_routing_key.is_some() && c.dead_letter_exchange.is_none() {
            return Err(bad(
                "x-dead-letter-routing-key",
                "routing_key_but_no_dlx_defined".into(),
            ));
        }
        Ok(c)
    }
}

/// RabbitMQ's largest TTL and expiry: 2^32 - 1 milliseconds.
pub const EXPIRY_MS_MAX: i64 = 4_294_967_295;

/// Arguments only a quorum queue accepts; a classic queue refuses them (406).
pub const QUORUM_ONLY_ARGUMENTS: &[&str] = &[
    "x-delivery-limit",
    "x-quorum-initial-group-size",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-dead-letter-strategy",
];

/// Arguments a quorum queue refuses (406), as RabbitMQ 3.10 does.
pub const CLASSIC_ONLY_ARGUMENTS: &[&str] = &[
    "x-max-priority",
    "x-queue-mode",
    "x-queue-master-locator",
    "x-queue-version",
];

/// The arguments whose values must match when a queue is declared again (RabbitMQ's list).
pub const EQUIVALENCE_KEYS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
];

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
