//! Exchange metadata; the bindings and matching live in `routing`.

use crate::routing::{ExchangeId, ExchangeKind};
use amq_protocol_types::FieldTable;

#[derive(Debug, Clone)]
pub struct Exchange {
    pub id: ExchangeId,
    pub name: String,
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    pub internal: bool,
    pub arguments: FieldTable,
    /// Its alternate exchange's name: the `alternate-exchange` argument, else its policy's.
    pub alternate: Option<String>,
    /// The policy and operator policy that apply to it.
    pub policy: Option<String>,
    pub operator_policy: Option<String>,
}

pub fn kind_from_name(name: &str) -> Option<ExchangeKind> {
    Some(match name {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "topic" => ExchangeKind::Topic,
        "headers" => ExchangeKind::Headers,
        _ => return None,
    })
}

pub fn kind_name(kind: ExchangeKind) -> &'static str {
    match kind {
        ExchangeKind::Direct => "direct",
        ExchangeKind::Fanout => "fanout",
        ExchangeKind::Topic => "topic",
        ExchangeKind::Headers => "headers",
    }
}

/// The exchanges every vhost has, as RabbitMQ creates them.
pub const STANDARD_EXCHANGES: &[(&str, ExchangeKind, bool)] = &[
    ("amq.direct", ExchangeKind::Direct, false),
    ("amq.fanout", ExchangeKind::Fanout, false),
    ("amq.topic", ExchangeKind::Topic, false),
    ("amq.headers", ExchangeKind::Headers, false),
    ("amq.match", ExchangeKind::Headers, false),
    ("amq.rabbitmq.trace", ExchangeKind::Topic, true),
];
