//! Behaviour of the routing table against RabbitMQ's semantics, and property tests against
//! naive models (a recursive topic matcher, a Vec of bindings), one file per exchange kind or
//! concern; the helpers here are shared by all of them.

use amq_protocol_types::{AMQPValue, DecimalValue, FieldArray, FieldTable, LongString};
use proptest::prelude::*;

use super::*;

mod alternate_exchanges;
mod bindings;
mod direct_fanout;
mod exchange_to_exchange;
mod headers;
mod properties;
mod topic;

const X: ExchangeId = ExchangeId(1);
const Y: ExchangeId = ExchangeId(2);
const Z: ExchangeId = ExchangeId(3);

fn q(id: u32) -> Destination {
    Destination::Queue(QueueId(id))
}

fn x(id: ExchangeId) -> Destination {
    Destination::Exchange(id)
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

fn no_args() -> FieldTable {
    FieldTable::default()
}

fn routed(
    t: &mut RoutingTable,
    ex: ExchangeId,
    key: &str,
    headers: Option<&FieldTable>,
) -> Vec<u32> {
    let mut out = Vec::new();
    t.route(ex, key.as_bytes(), headers, &mut out)
        .expect("exchange exists");
    let mut ids: Vec<u32> = out.iter().map(|q| q.0).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    assert_eq!(before, ids.len(), "route returned a queue twice");
    ids
}

fn with_exchange(kind: ExchangeKind) -> RoutingTable {
    let mut t = RoutingTable::new();
    t.declare_exchange(X, kind).unwrap();
    t
}
