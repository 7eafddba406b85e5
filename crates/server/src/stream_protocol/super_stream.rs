//! Super streams (RabbitMQ 3.11): a direct exchange whose bindings lead to its partitions,
//! each a stream, in the order of each binding's `x-stream-partition-order`. Route answers
//! which partitions a routing key is bound to, Partitions all of them in order; creating and
//! deleting one goes through the topology path, as an AMQP client's declares and binds would.

use super::connection::declare_arguments;
use crate::Shared;
use amq_protocol_types::{AMQPValue, FieldTable};
use std::sync::Arc;
use warren_broker::command::Command as Topo;
use warren_broker::vhost::VHost;
use warren_protocol::stream::constants::*;

/// The binding argument that orders a super stream's partitions.
pub const PARTITION_ORDER: &str = "x-stream-partition-order";
/// The exchange argument that marks a super stream.
pub const SUPER_STREAM: &str = "x-super-stream";

fn integer(v: Option<&AMQPValue>) -> i64 {
    match v {
        Some(AMQPValue::LongLongInt(n)) => *n,
        Some(AMQPValue::LongInt(n)) => i64::from(*n),
        Some(AMQPValue::ShortInt(n)) => i64::from(*n),
        Some(AMQPValue::LongUInt(n)) => i64::from(*n),
        Some(AMQPValue::ShortShortInt(n)) => i64::from(*n),
        _ => i64::MAX,
    }
}

/// The partitions of `super_stream`, in partition order (then by name).
pub fn partitions(v: &VHost, super_stream: &str) -> (u16, Vec<String>) {
    if !v.exchange_names().iter().any(|e| e == super_stream) {
        return (RESPONSE_CODE_STREAM_DOES_NOT_EXIST, Vec::new());
    }
    let mut bound: Vec<(i64, String)> = v
        .binding_infos()
        .into_iter()
        .filter(|b| b.source == super_stream && b.to_queue)
        .map(|b| {
            (
                integer(b.arguments.inner().get(PARTITION_ORDER)),
                b.destination,
            )
        })
        .collect();
    bound.sort();
    bound.dedup_by(|a, b| a.1 == b.1);
    (
        RESPONSE_CODE_OK,
        bound.into_iter().map(|(_, s)| s).collect(),
    )
}

/// The partitions `routing_key` is bound to in `super_stream`, in partition order.
pub fn route(v: &VHost, super_stream: &str, routing_key: &str) -> (u16, Vec<String>) {
    if !v.exchange_names().iter().any(|e| e == super_stream) {
        return (RESPONSE_CODE_STREAM_DOES_NOT_EXIST, Vec::new());
    }
    let mut bound: Vec<(i64, String)> = v
        .binding_infos()
        .into_iter()
        .filter(|b| b.source == super_stream && b.to_queue && b.routing_key == routing_key)
        .map(|b| {
            (
                integer(b.arguments.inner().get(PARTITION_ORDER)),
                b.destination,
            )
        })
        .collect();
    bound.sort();
    (
        RESPONSE_CODE_OK,
        bound.into_iter().map(|(_, s)| s).collect(),
    )
}

fn code_of(e: &warren_broker::error::AmqpError) -> u16 {
    match e.code {
        warren_protocol::constants::ACCESS_REFUSED => RESPONSE_CODE_ACCESS_REFUSED,
        warren_protocol::constants::PRECONDITION_FAILED => RESPONSE_CODE_PRECONDITION_FAILED,
        warren_protocol::constants::NOT_FOUND => RESPONSE_CODE_STREAM_DOES_NOT_EXIST,
        _ => RESPONSE_CODE_INTERNAL_ERROR,
    }
}

/// Creates super stream `name`: its partitions (streams with `arguments`), the exchange, and
/// a binding per partition with its key (`rabbitmq-streams add_super_stream`, the stream
/// protocol's CreateSuperStream). One partition per key, as the protocol requires.
pub async fn create(
    shared: &Arc<Shared>,
    vhost: &str,
    name: &str,
    partitions: &[String],
    binding_keys: &[String],
    arguments: &[(String, String)],
) -> u16 {
    if partitions.is_empty() || partitions.len() != binding_keys.len() {
        return RESPONSE_CODE_PRECONDITION_FAILED;
    }
    let Some(v) = shared.broker.vhost(vhost) else {
        return RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE;
    };
    {
        let v = v.lock().expect("vhost lock");
        if v.exchange_names().iter().any(|e| e == name) {
            return RESPONSE_CODE_STREAM_ALREADY_EXISTS;
        }
        if partitions.iter().any(|p| v.queue_names().contains(p)) {
            return RESPONSE_CODE_STREAM_ALREADY_EXISTS;
        }
    }
    let table = match declare_arguments(arguments) {
        Ok(t) => t,
        Err(_) => return RESPONSE_CODE_PRECONDITION_FAILED,
    };
    let topology = crate::topology::of(shared);
    let mut exchange_args = FieldTable::default();
    exchange_args.insert(SUPER_STREAM.into(), AMQPValue::Boolean(true));
    let mut commands = Vec::new();
    for p in partitions {
        commands.push(Topo::QueueDeclare {
            vhost: vhost.to_string(),
            conn: 0,
            name: p.clone(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            server_named: false,
            arguments: table.clone(),
            log_id: crate::topology::placement::rand_log_id(),
            node: String::new(),
            members: Vec::new(),
            at_unix_ms: 0,
        });
    }
    commands.push(Topo::ExchangeDeclare {
        vhost: vhost.to_string(),
        name: name.to_string(),
        kind: "direct".into(),
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: exchange_args,
    });
    for (order, (p, key)) in partitions.iter().zip(binding_keys).enumerate() {
        let mut args = FieldTable::default();
        args.insert(PARTITION_ORDER.into(), AMQPValue::LongInt(order as i32));
        commands.push(Topo::QueueBind {
            vhost: vhost.to_string(),
            conn: 0,
            queue: p.clone(),
            exchange: name.to_string(),
            key: key.clone(),
            arguments: args,
        });
    }
    for c in commands {
        if let Err(e) = topology.change(c).await {
            tracing::warn!(super_stream = name, error = %e.text, "super stream not created");
            return code_of(&e);
        }
    }
    RESPONSE_CODE_OK
}

/// Deletes super stream `name`: its exchange and its partitions.
pub async fn delete(shared: &Arc<Shared>, vhost: &str, name: &str) -> u16 {
    let Some(v) = shared.broker.vhost(vhost) else {
        return RESPONSE_CODE_VIRTUAL_HOST_ACCESS_FAILURE;
    };
    let (code, parts) = partitions(&v.lock().expect("vhost lock"), name);
    if code != RESPONSE_CODE_OK {
        return code;
    }
    let topology = crate::topology::of(shared);
    let exchange = Topo::ExchangeDelete {
        vhost: vhost.to_string(),
        name: name.to_string(),
        if_unused: false,
    };
    if let Err(e) = topology.change(exchange).await {
        return code_of(&e);
    }
    for p in parts {
        let delete = Topo::QueueDelete {
            vhost: vhost.to_string(),
            conn: 0,
            name: p.clone(),
        };
        match topology.change(delete).await {
            Ok(_) => shared.stream_connections.stream_deleted(vhost, &p),
            Err(e) => return code_of(&e),
        }
    }
    RESPONSE_CODE_OK
}
