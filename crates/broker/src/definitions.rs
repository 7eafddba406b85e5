//! Metadata records: every change to durable topology (vhosts, users, permissions, durable
//! exchanges, queues and bindings, policies) as a record that the server appends to its metadata
//! journal, and the replay of those records into a fresh broker at start. Limits and topic
//! permissions are records too, so they are durable and, in a cluster, replicated with the rest.
//!
//! Records are JSON (control-plane volume, and readable when an operator needs to look);
//! arguments keep their AMQP types through amq-protocol-types' serde support, so equivalence
//! checks after a restart see exactly what was declared. Password hashes use RabbitMQ's
//! definitions format (base64 of salt ++ SHA-256(salt ++ password)).

use crate::limits::LimitMap;
use crate::policy::PolicyKind;
use amq_protocol_types::FieldTable;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MetaRecord {
    AddVhost {
        name: String,
    },
    DeleteVhost {
        name: String,
    },
    PutUser {
        name: String,
        password_hash: String,
        tags: Vec<String>,
    },
    DeleteUser {
        name: String,
    },
    SetPermissions {
        user: String,
        vhost: String,
        configure: String,
        write: String,
        read: String,
    },
    ClearPermissions {
        user: String,
        vhost: String,
    },
    DeclareExchange {
        vhost: String,
        name: String,
        kind: String,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    },
    DeleteExchange {
        vhost: String,
        name: String,
    },
    DeclareQueue {
        vhost: String,
        name: String,
        auto_delete: bool,
        arguments: FieldTable,
        /// The queue's log in the storage engine, where its persistent messages are.
        #[serde(default)]
        log_id: u64,
    },
    DeleteQueue {
        vhost: String,
        name: String,
    },
    Bind {
        vhost: String,
        source: String,
        destination: String,
        to_queue: bool,
        key: String,
        arguments: FieldTable,
    },
    Unbind {
        vhost: String,
        source: String,
        destination: String,
        to_queue: bool,
        key: String,
        arguments: FieldTable,
    },
    /// A policy or operator policy set (created or replaced) in a vhost, as validated by
    /// [`crate::policy::Policy::new`]; replay validates it again.
    SetPolicy {
        vhost: String,
        name: String,
        kind: PolicyKind,
        pattern: String,
        apply_to: String,
        priority: serde_json::Number,
        definition: serde_json::Map<String, serde_json::Value>,
    },
    ClearPolicy {
        vhost: String,
        name: String,
        kind: PolicyKind,
    },
    /// A vhost's whole set of limits (RabbitMQ keeps them as one runtime parameter, and
    /// `set_vhost_limits` replaces them all); empty clears them.
    SetVhostLimits {
        vhost: String,
        limits: LimitMap,
    },
    /// A user's whole set of limits; empty clears them.
    SetUserLimits {
        user: String,
        limits: LimitMap,
    },
    SetTopicPermissions {
        user: String,
        vhost: String,
        exchange: String,
        write: String,
        read: String,
    },
    /// The user's topic permission on `exchange` in `vhost`, or on every exchange there.
    ClearTopicPermissions {
        user: String,
        vhost: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exchange: Option<String>,
    },
}

impl MetaRecord {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("metadata records always serialise")
    }

    pub fn decode(bytes: &[u8]) -> Result<MetaRecord, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("unreadable metadata record: {e}"))
    }
}
