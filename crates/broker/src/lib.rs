//! Broker logic as plain state machines: vhosts, exchanges, bindings, queues, consumers.

pub mod routing;
