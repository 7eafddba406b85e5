//! What a queue's type decides, in one place, as RabbitMQ's `rabbit_queue_type` does: which
//! arguments it takes, which declare properties it refuses, which messages it stores, where a
//! returned message goes, whether it counts deliveries and takes global qos. The vhost's state
//! machines ask the queue's type instead of testing for one, so a new type (replicated quorum
//! queues, streams) is a new arm here, not branches over the vhost's files.

/// A queue's type: `x-queue-type` at declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    #[default]
    Classic,
    Quorum,
    /// An append-only log read from offsets (`rabbit_stream_queue`): messages are never
    /// consumed away, so none of the backlog's machinery applies.
    Stream,
}

/// Where a message returned to its queue (nack or reject with requeue, recover, its channel
/// closing) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnPosition {
    /// Back where it was, ahead of everything published after it (classic queues).
    Original,
    /// Behind earlier returns, ahead of messages never delivered (rabbit_fifo's `returns`).
    AfterReturns,
    /// Behind everything (a quorum queue's rejected message, in RabbitMQ 3.10).
    Back,
}

pub const CLASSIC_ARGUMENTS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
];
pub const QUORUM_ARGUMENTS: &[&str] = &[
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-overflow",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-delivery-limit",
    "x-message-ttl",
    "x-queue-leader-locator",
];
pub const STREAM_ARGUMENTS: &[&str] = &[
    "x-max-length-bytes",
    "x-queue-type",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
];

impl QueueType {
    /// The type named by `x-queue-type`, if warren has it.
    pub fn from_name(name: &str) -> Option<QueueType> {
        match name {
            "classic" => Some(QueueType::Classic),
            "quorum" => Some(QueueType::Quorum),
            "stream" => Some(QueueType::Stream),
            _ => None,
        }
    }

    /// Its name in `x-queue-type` and the management API.
    pub fn name(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }

    /// RabbitMQ's module for the type, as its error texts name it.
    pub fn module(self) -> &'static str {
        match self {
            QueueType::Classic => "rabbit_classic_queue",
            QueueType::Quorum => "rabbit_quorum_queue",
            QueueType::Stream => "rabbit_stream_queue",
        }
    }

    /// The arguments the type takes; on a redeclare, the ones whose values must match
    /// (rabbit_amqqueue:assert_args_equivalence).
    pub fn arguments(self) -> &'static [&'static str] {
        match self {
            QueueType::Classic => CLASSIC_ARGUMENTS,
            QueueType::Quorum => QUORUM_ARGUMENTS,
            QueueType::Stream => STREAM_ARGUMENTS,
        }
    }

    /// Only classic queues may be server-named (the queue type capability `server_named`).
    pub fn may_be_server_named(self) -> bool {
        self == QueueType::Classic
    }

    /// The declare property the type refuses, in the order rabbit_quorum_queue:declare and
    /// rabbit_stream_queue:declare check them (rabbit_queue_type_util), or None.
    pub fn refused_property(
        self,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
    ) -> Option<&'static str> {
        match self {
            QueueType::Classic => None,
            QueueType::Quorum | QueueType::Stream if auto_delete => Some("auto-delete"),
            QueueType::Quorum | QueueType::Stream if exclusive => Some("exclusive-owner"),
            QueueType::Quorum | QueueType::Stream if !durable => Some("non-durable"),
            QueueType::Quorum | QueueType::Stream => None,
        }
    }

    /// Whether a message not marked persistent is written to a durable queue's log: a quorum
    /// queue stores every message, as RabbitMQ does.
    pub fn stores_transient_messages(self) -> bool {
        self == QueueType::Quorum
    }

    /// rabbit_quorum_queue:consume refuses a channel whose global limiter is active.
    pub fn supports_global_qos(self) -> bool {
        self == QueueType::Classic
    }

    /// Whether deliveries carry `x-delivery-count` (every quorum queue delivery, 0 the first
    /// time, as RabbitMQ 3.10.8 sends it).
    pub fn counts_deliveries(self) -> bool {
        self == QueueType::Quorum
    }

    /// Whether a queue of `len` messages is over an `x-max-length` of `max` for the next
    /// publish: a quorum queue checks whether it is already over (so it may hold one more than
    /// the limit), a classic queue whether the new message would put it over; both as
    /// RabbitMQ 3.10 does.
    pub fn length_over(self, len: u64, max: u64) -> bool {
        match self {
            QueueType::Classic => len >= max,
            QueueType::Quorum | QueueType::Stream => len > max,
        }
    }

    /// Where a returned message goes; `rejected`: the client nacked or rejected it, rather
    /// than its channel closing or it calling recover.
    pub fn return_position(self, rejected: bool) -> ReturnPosition {
        match self {
            QueueType::Classic => ReturnPosition::Original,
            QueueType::Quorum | QueueType::Stream if rejected => ReturnPosition::Back,
            QueueType::Quorum | QueueType::Stream => ReturnPosition::AfterReturns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in [QueueType::Classic, QueueType::Quorum, QueueType::Stream] {
            assert_eq!(QueueType::from_name(t.name()), Some(t));
        }
        assert_eq!(QueueType::from_name("STREAM"), None);
    }

    #[test]
    fn a_quorum_queue_refuses_what_rabbitmq_refuses_in_its_order() {
        let q = QueueType::Quorum;
        assert_eq!(q.refused_property(false, true, true), Some("auto-delete"));
        assert_eq!(
            q.refused_property(false, true, false),
            Some("exclusive-owner")
        );
        assert_eq!(q.refused_property(false, false, false), Some("non-durable"));
        assert_eq!(q.refused_property(true, false, false), None);
        assert_eq!(QueueType::Classic.refused_property(false, true, true), None);
        let s = QueueType::Stream;
        assert_eq!(s.refused_property(false, true, true), Some("auto-delete"));
        assert_eq!(
            s.refused_property(false, true, false),
            Some("exclusive-owner")
        );
        assert_eq!(s.refused_property(false, false, false), Some("non-durable"));
        assert!(!s.may_be_server_named() && !s.supports_global_qos());
    }

    #[test]
    fn length_limits_differ_by_one() {
        assert!(QueueType::Classic.length_over(10, 10));
        assert!(!QueueType::Quorum.length_over(10, 10));
        assert!(QueueType::Quorum.length_over(11, 10));
    }
}
