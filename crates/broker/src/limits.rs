//! Vhost and user limits as RabbitMQ 3.10 has them: what may be limited, how a limit's value
//! is read, and the refusals a client gets once one is reached.
//!
//! A vhost may cap its connections and queues (`max-connections`, `max-queues`), a user its
//! connections and channels (`max-connections`, `max-channels`). A negative value means no limit
//! and 0 refuses every new one, as in RabbitMQ. Limits are kept with what they limit (a vhost's
//! in its [`crate::vhost::VHost`], a user's in [`crate::users::Users`]), so they go when it goes.
//!
//! Where each is enforced: a vhost's and a user's connections at connection.open and a user's
//! channels at channel.open (the server, which counts its connections); a vhost's queues in
//! the vhost's own queue.declare, so that in a cluster every node applies the same declare to
//! the same queue count (the replicated metadata has every queue) and refuses it alike.

use crate::error::AmqpError;
use serde_json::Value;
use std::collections::BTreeMap;

/// A set of limits by name (`max-connections`, ...); the value as given, negative for none.
pub type LimitMap = BTreeMap<String, i64>;

pub const MAX_CONNECTIONS: &str = "max-connections";
pub const MAX_QUEUES: &str = "max-queues";
pub const MAX_CHANNELS: &str = "max-channels";

/// What a set of limits belongs to: each accepts its own names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Vhost,
    User,
}

impl Scope {
    fn names(self) -> [&'static str; 2] {
        match self {
            Scope::Vhost => [MAX_CONNECTIONS, MAX_QUEUES],
            Scope::User => [MAX_CONNECTIONS, MAX_CHANNELS],
        }
    }

    /// How RabbitMQ names the set in its validation errors.
    fn component(self) -> &'static str {
        match self {
            Scope::Vhost => "limits",
            Scope::User => "user-limits",
        }
    }
}

/// A JSON value as Erlang's `~p` prints the term RabbitMQ decoded it to, for error texts that
/// read as RabbitMQ's.
fn erlang_term(v: &Value) -> String {
    match v {
        Value::String(s) => format!("<<\"{s}\">>"),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// One limit's value: an integer (RabbitMQ refuses 1.5 and "1" alike).
pub fn parse_value(name: &str, value: &Value) -> Result<i64, String> {
    value.as_i64().ok_or_else(|| {
        format!(
            "{name} should be a number, actually was {}",
            erlang_term(value)
        )
    })
}

/// Checks that `name` is a limit of `scope`, with RabbitMQ's text when it is not.
pub fn check_name(scope: Scope, name: &str, value: &Value) -> Result<(), String> {
    if scope.names().contains(&name) {
        return Ok(());
    }
    Err(format!(
        "Unrecognised terms [{{<<\"{name}\">>,{}}}] in {}",
        erlang_term(value),
        scope.component()
    ))
}

/// A JSON object of limits (`set_vhost_limits`' and `set_user_limits`' argument), validated
/// as RabbitMQ validates it: every name known, every value an integer.
pub fn parse(scope: Scope, json: &str) -> Result<LimitMap, String> {
    let value: Value =
        serde_json::from_str(json).map_err(|e| format!("JSON decoding error. Reason: {e}"))?;
    let Value::Object(fields) = value else {
        return Err(format!(
            "limits must be a JSON object, actually was {}",
            erlang_term(&value)
        ));
    };
    let mut out = LimitMap::new();
    for (name, v) in &fields {
        check_name(scope, name, v)?;
        out.insert(name.clone(), parse_value(name, v)?);
    }
    Ok(out)
}

/// The limit named `name` in `limits`, if it limits anything (a negative value does not).
pub fn effective(limits: &LimitMap, name: &str) -> Option<u64> {
    limits.get(name).and_then(|&v| u64::try_from(v).ok())
}

/// Whether one more would go past `limit` with `count` already there.
pub fn reached(limit: Option<u64>, count: usize) -> bool {
    limit.is_some_and(|l| count as u64 >= l)
}

/// connection.open refused: the vhost has `limit` connections already (RabbitMQ's text).
pub fn vhost_connections_refused(vhost: &str, user: &str, limit: u64) -> AmqpError {
    AmqpError::not_allowed(format!(
        "access to vhost '{vhost}' refused for user '{user}': connection limit ({limit}) is reached"
    ))
}

/// connection.open refused: the user has `limit` connections already (RabbitMQ's text).
pub fn user_connections_refused(user: &str, limit: u64) -> AmqpError {
    AmqpError::not_allowed(format!(
        "connection refused for user '{user}': user connection limit ({limit}) is reached"
    ))
}

/// channel.open refused: the user has `limit` channels open already. RabbitMQ closes the
/// connection with this (530 NOT_ALLOWED), not only the channel.
pub fn user_channels_refused(user: &str, limit: u64) -> AmqpError {
    AmqpError::not_allowed(format!(
        "number of channels opened for user '{user}' has reached the maximum allowed user limit of ({limit})"
    ))
}

/// queue.declare of a new queue refused: the vhost has `limit` queues (406, RabbitMQ's text).
pub fn queues_refused(queue: &str, vhost: &str, limit: u64) -> AmqpError {
    AmqpError::precondition(format!(
        "cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_parse_as_rabbitmq_validates_them() {
        let v = parse(Scope::Vhost, r#"{"max-connections": 2, "max-queues": -1}"#).unwrap();
        assert_eq!(v.get(MAX_CONNECTIONS), Some(&2));
        assert_eq!(effective(&v, MAX_QUEUES), None, "negative is no limit");
        assert_eq!(effective(&v, MAX_CONNECTIONS), Some(2));
        assert_eq!(
            parse(Scope::Vhost, r#"{"max-connections": "a"}"#).unwrap_err(),
            "max-connections should be a number, actually was <<\"a\">>"
        );
        assert_eq!(
            parse(Scope::User, r#"{"max-channels": 1.5}"#).unwrap_err(),
            "max-channels should be a number, actually was 1.5"
        );
        assert_eq!(
            parse(Scope::Vhost, r#"{"max-channels": 3}"#).unwrap_err(),
            "Unrecognised terms [{<<\"max-channels\">>,3}] in limits"
        );
        assert_eq!(
            parse(Scope::User, r#"{"max-queues": 3}"#).unwrap_err(),
            "Unrecognised terms [{<<\"max-queues\">>,3}] in user-limits"
        );
        assert!(parse(Scope::User, "notjson").is_err());
        assert!(parse(Scope::User, "[1]").is_err());
        assert!(check_name(Scope::User, MAX_CHANNELS, &json!(1)).is_ok());
    }

    #[test]
    fn zero_refuses_every_new_one_and_negative_none() {
        assert!(reached(Some(0), 0));
        assert!(reached(Some(2), 2));
        assert!(!reached(Some(2), 1));
        assert!(!reached(None, 1_000_000));
    }

    #[test]
    fn refusals_carry_rabbitmqs_reply_texts() {
        assert_eq!(
            vhost_connections_refused("/", "guest", 2).text,
            "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (2) is reached"
        );
        assert_eq!(
            user_connections_refused("bob", 1).text,
            "NOT_ALLOWED - connection refused for user 'bob': user connection limit (1) is reached"
        );
        assert_eq!(
            user_channels_refused("bob", 2).text,
            "NOT_ALLOWED - number of channels opened for user 'bob' has reached the maximum allowed user limit of (2)"
        );
        let e = queues_refused("q2", "/", 1);
        assert_eq!(e.code, warren_protocol::constants::PRECONDITION_FAILED);
        assert_eq!(
            e.text,
            "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost '/' (1) is reached"
        );
    }

    fn declare(v: &mut crate::vhost::VHost, name: &str) -> Result<(), AmqpError> {
        let args = amq_protocol_types::FieldTable::default();
        v.queue_declare(1, name, false, true, false, false, args, 0)
            .map(|_| ())
    }

    #[test]
    fn max_queues_refuses_new_queues_only() {
        let b = crate::broker::Broker::new();
        let v = b.vhost("/").unwrap();
        let mut v = v.lock().unwrap();
        v.set_limits(parse(Scope::Vhost, r#"{"max-queues": 1}"#).unwrap());
        declare(&mut v, "q1").unwrap();
        declare(&mut v, "q1").expect("a redeclare is no new queue");
        let e = declare(&mut v, "q2").unwrap_err();
        assert_eq!(e, queues_refused("q2", "/", 1));
        v.queue_delete(1, "q1", false, false).unwrap();
        declare(&mut v, "q2").expect("room again once one is deleted");
    }

    #[test]
    fn limits_and_topic_permissions_survive_replay_even_below_the_queue_count() {
        use crate::definitions::MetaRecord;
        let b = crate::broker::Broker::new();
        b.users.write().unwrap().add_user("bob", "pw", vec![]);
        {
            let v = b.vhost("/").unwrap();
            let mut v = v.lock().unwrap();
            declare(&mut v, "q1").unwrap();
            declare(&mut v, "q2").unwrap();
            // Lowered below the count: the two queues stay, as in RabbitMQ.
            v.set_limits(parse(Scope::Vhost, r#"{"max-queues": 1}"#).unwrap());
        }
        b.apply(MetaRecord::SetUserLimits {
            user: "bob".into(),
            limits: parse(Scope::User, r#"{"max-channels": 3}"#).unwrap(),
        })
        .unwrap();
        b.apply(MetaRecord::SetTopicPermissions {
            user: "bob".into(),
            vhost: "/".into(),
            exchange: "amq.topic".into(),
            write: "^{username}\\.".into(),
            read: ".*".into(),
        })
        .unwrap();
        // What journal compaction writes, replayed as recovery does.
        let replayed = crate::broker::Broker::new();
        for r in b.export_meta() {
            replayed.apply(r).unwrap();
        }
        let v = replayed.vhost("/").unwrap();
        let mut v = v.lock().unwrap();
        let mut names = v.queue_names();
        names.sort();
        assert_eq!(names, ["q1", "q2"]);
        assert_eq!(effective(v.limits(), MAX_QUEUES), Some(1));
        assert!(
            declare(&mut v, "q3").is_err(),
            "the limit holds after replay"
        );
        let users = replayed.users.read().unwrap();
        assert_eq!(users.limit("bob", MAX_CHANNELS), Some(3));
        let p = users
            .topic_permissions
            .get("bob", "/", "amq.topic")
            .unwrap();
        assert!(p.allows(crate::users::Access::Write, "bob.x"));
        assert!(!p.allows(crate::users::Access::Write, "alice.x"));
    }

    #[test]
    fn deleting_a_user_or_vhost_drops_its_limits_and_topic_permissions() {
        use crate::definitions::MetaRecord;
        let b = crate::broker::Broker::new();
        b.add_vhost("v");
        b.users.write().unwrap().add_user("bob", "pw", vec![]);
        for vhost in ["/", "v"] {
            b.apply(MetaRecord::SetTopicPermissions {
                user: "bob".into(),
                vhost: vhost.into(),
                exchange: "x".into(),
                write: ".*".into(),
                read: ".*".into(),
            })
            .unwrap();
        }
        b.apply(MetaRecord::SetUserLimits {
            user: "bob".into(),
            limits: parse(Scope::User, r#"{"max-connections": 1}"#).unwrap(),
        })
        .unwrap();
        b.apply(MetaRecord::DeleteVhost { name: "v".into() })
            .unwrap();
        assert_eq!(b.users.read().unwrap().topic_permissions.all().len(), 1);
        b.apply(MetaRecord::DeleteUser { name: "bob".into() })
            .unwrap();
        let users = b.users.read().unwrap();
        assert!(users.topic_permissions.all().is_empty());
        assert!(users.all_limits().is_empty());
    }
}
