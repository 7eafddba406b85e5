//! Policies and operator policies, as RabbitMQ 3.10 defines them (`rabbit_policy`,
//! `rabbit_policies`): named, vhost-scoped rules that give queues and exchanges whose names
//! match a regular expression optional arguments in bulk, changed at run time.
//!
//! What this module decides, with no I/O and no vhost state, so every rule is unit-tested:
//! - validation of a policy and its definition, refused with RabbitMQ's texts (the Erlang
//!   terms printed as `~p` prints them), so scripts that parse them keep working;
//! - which policy applies to an entity: one per kind, the highest priority among those whose
//!   pattern matches the name and whose `apply-to` covers the entity;
//! - the effective definition: the policy's keys, capped by the operator policy's (the lower
//!   value wins for every numeric key an operator policy may carry);
//! - the effective queue configuration: the declare's `x-` arguments merged with the effective
//!   definition as `rabbit_amqqueue_process:process_args_policy` merges them (the lower value
//!   for limits and TTLs, the argument for the dead-letter target, overflow and queue mode).
//!
//! The vhost keeps a [`Policies`] and re-applies it to its queues and exchanges whenever a
//! policy is set or cleared and whenever one is declared.

use crate::args::{Overflow, QueueConfig, QueueType};
use crate::stream_args::StreamConfig;
use amq_protocol_types::FieldTable;
use regex::Regex;
use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;

/// What a policy applies to (`apply-to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyTo {
    All,
    Queues,
    Exchanges,
    ClassicQueues,
    QuorumQueues,
}

impl ApplyTo {
    pub fn from_name(name: &str) -> Option<ApplyTo> {
        Some(match name {
            "all" => ApplyTo::All,
            "queues" => ApplyTo::Queues,
            "exchanges" => ApplyTo::Exchanges,
            "classic_queues" => ApplyTo::ClassicQueues,
            "quorum_queues" => ApplyTo::QuorumQueues,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ApplyTo::All => "all",
            ApplyTo::Queues => "queues",
            ApplyTo::Exchanges => "exchanges",
            ApplyTo::ClassicQueues => "classic_queues",
            ApplyTo::QuorumQueues => "quorum_queues",
        }
    }

    fn covers_queue(self, t: QueueType) -> bool {
        match self {
            ApplyTo::All | ApplyTo::Queues => true,
            ApplyTo::ClassicQueues => t == QueueType::Classic,
            ApplyTo::QuorumQueues => t == QueueType::Quorum,
            ApplyTo::Exchanges => false,
        }
    }

    fn covers_exchanges(self) -> bool {
        matches!(self, ApplyTo::All | ApplyTo::Exchanges)
    }
}

/// A user policy (`rabbitmqctl set_policy`) or an operator policy (`set_operator_policy`):
/// operator policies take only numeric limits and cap whatever the user policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    Policy,
    Operator,
}

/// One validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    pub pattern: String,
    regex: Regex,
    pub apply_to: ApplyTo,
    /// A JSON number as given: RabbitMQ takes any number, 1.5 included, and shows it back.
    pub priority: Number,
    /// The keys, sorted (a JSON object from serde_json keeps them sorted).
    pub definition: Map<String, Value>,
}

impl Policy {
    /// Validates as `rabbit_policy:validate/5` does, in its order: priority, pattern, apply-to,
    /// definition. The error is the text after RabbitMQ's "Validation failed\n\n".
    pub fn new(
        kind: PolicyKind,
        name: &str,
        pattern: &Value,
        apply_to: &str,
        priority: &Value,
        definition: &Value,
    ) -> Result<Policy, String> {
        let priority = match priority {
            Value::Number(n) => n.clone(),
            other => {
                return Err(format!(
                    "priority should be a number, actually was {}",
                    erlang_term(other)
                ))
            }
        };
        let pattern = match pattern {
            Value::String(s) => s.clone(),
            other => {
                return Err(format!(
                    "pattern should be a binary but was {}",
                    erlang_term(other)
                ))
            }
        };
        let regex = Regex::new(&pattern).map_err(|e| {
            let why = match e {
                regex::Error::Syntax(s) => s.lines().last().unwrap_or_default().to_string(),
                other => other.to_string(),
            };
            format!("pattern should be regular expression but is invalid: {why}")
        })?;
        let apply_to = ApplyTo::from_name(apply_to).ok_or_else(|| {
            format!(
                "apply-to '{apply_to}' unrecognised; should be 'queues', 'classic_queues', \
                 'quorum_queues', 'exchanges' or 'all'"
            )
        })?;
        let definition = validate_definition(kind, definition)?;
        Ok(Policy {
            name: name.to_string(),
            pattern,
            regex,
            apply_to,
            priority,
            definition,
        })
    }

    /// The pattern is searched for anywhere in the name (`re:run`, unanchored), as RabbitMQ.
    pub fn matches(&self, name: &str) -> bool {
        self.regex.is_match(name)
    }

    fn priority_f64(&self) -> f64 {
        self.priority.as_f64().unwrap_or_default()
    }
}

/// What a definition key is and which values it takes.
#[derive(Clone, Copy)]
enum Check {
    /// An integer >= the bound.
    IntAtLeast(i64),
    /// A string.
    Text,
    /// One of these strings.
    OneOf(&'static [&'static str]),
    /// A stream's max-age: a count and a unit (`7D`, `12h`).
    Age,
}

/// The keys RabbitMQ 3.10 validates (rabbit_policies) with the text of its refusal; the
/// stream and leader-locator keys are taken (and shown) so that definitions exported from
/// RabbitMQ import, though warren's queues do not use them.
const KEYS: &[(&str, Check, &str)] = &[
    (
        "alternate-exchange",
        Check::Text,
        "is not a valid alternate exchange name",
    ),
    (
        "dead-letter-exchange",
        Check::Text,
        "is not a valid dead letter exchange name",
    ),
    (
        "dead-letter-routing-key",
        Check::Text,
        "is not a valid dead letter routing key",
    ),
    (
        "dead-letter-strategy",
        Check::OneOf(&["at-most-once", "at-least-once"]),
        "is not a valid dead letter strategy",
    ),
    (
        "delivery-limit",
        Check::IntAtLeast(0),
        "is not a valid delivery limit",
    ),
    (
        "expires",
        Check::IntAtLeast(1),
        "is not a valid queue expiry",
    ),
    (
        "initial-cluster-size",
        Check::IntAtLeast(0),
        "is not a valid cluster size",
    ),
    ("max-age", Check::Age, "is not a valid max age"),
    (
        "max-in-memory-bytes",
        Check::IntAtLeast(0),
        "is not a valid maximum memory in bytes",
    ),
    (
        "max-in-memory-length",
        Check::IntAtLeast(0),
        "is not a valid maximum memory in bytes",
    ),
    (
        "max-length",
        Check::IntAtLeast(0),
        "is not a valid maximum length",
    ),
    (
        "max-length-bytes",
        Check::IntAtLeast(0),
        "is not a valid maximum length in bytes",
    ),
    (
        "message-ttl",
        Check::IntAtLeast(0),
        "is not a valid message TTL",
    ),
    (
        "overflow",
        Check::OneOf(&["drop-head", "reject-publish", "reject-publish-dlx"]),
        "is not a valid overflow value",
    ),
    (
        "queue-leader-locator",
        Check::OneOf(&["client-local", "random", "least-leaders", "balanced"]),
        "is not a valid queue leader locator value",
    ),
    (
        "queue-mode",
        Check::OneOf(&["default", "lazy"]),
        "is not a valid queue-mode value",
    ),
    (
        "stream-max-segment-size-bytes",
        Check::IntAtLeast(0),
        "is not a valid segment size",
    ),
];

/// The keys an operator policy may carry (rabbit_policies' operator_policy_validator): limits
/// only, each merged with the user policy's by taking the lower.
const OPERATOR_KEYS: &[&str] = &[
    "delivery-limit",
    "expires",
    "max-in-memory-bytes",
    "max-in-memory-length",
    "max-length",
    "max-length-bytes",
    "message-ttl",
];

/// Checks a definition as `rabbit_policy:validation/3` does: known keys first, in key order,
/// the first bad value refused; then any keys left over, listed together.
pub fn validate_definition(
    kind: PolicyKind,
    definition: &Value,
) -> Result<Map<String, Value>, String> {
    let Value::Object(map) = definition else {
        return Err(format!(
            "definition must be a dictionary: {}",
            erlang_term(definition)
        ));
    };
    if map.is_empty() {
        return Err("no policy provided".into());
    }
    if let Some(ha) = map.keys().find(|k| k.starts_with("ha-")) {
        return Err(format!(
            "'{ha}' is not supported: warren has no classic queue mirroring; declare quorum \
             queues (x-queue-type=quorum) for replicated queues"
        ));
    }
    let mut unknown = Vec::new();
    for (key, value) in map {
        let known = KEYS.iter().find(|(k, _, _)| k == key);
        let allowed = kind == PolicyKind::Policy || OPERATOR_KEYS.contains(&key.as_str());
        let Some((_, check, why)) = known.filter(|_| allowed) else {
            unknown.push(format!("{{{},{}}}", erlang_binary(key), erlang_term(value)));
            continue;
        };
        let ok = match check {
            Check::IntAtLeast(min) => match (value.as_i64(), value.as_u64()) {
                (Some(i), _) => i >= *min,
                // Beyond i64 but an integer still: as large a limit as anyone means.
                (None, Some(_)) => true,
                _ => false,
            },
            Check::Text => value.is_string(),
            Check::OneOf(allowed) => value.as_str().is_some_and(|s| allowed.contains(&s)),
            Check::Age => value.as_str().is_some_and(valid_max_age),
        };
        if !ok {
            return Err(format!("{} {why}", erlang_term(value)));
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "[{}] are not recognised policy settings",
            unknown.join(",")
        ));
    }
    Ok(map.clone())
}

/// A stream's `max-age` as rabbit_amqqueue:check_max_age takes it: digits and one unit.
fn valid_max_age(s: &str) -> bool {
    let Some(unit) = s.chars().last() else {
        return false;
    };
    let digits = &s[..s.len() - unit.len_utf8()];
    "YMDhms".contains(unit) && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// A JSON value as Erlang's `~p` prints the term RabbitMQ decoded it to, for its error texts.
pub fn erlang_term(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => erlang_binary(s),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(erlang_term).collect::<Vec<_>>().join(",")
        ),
        Value::Object(m) => format!(
            "#{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{} => {}", erlang_binary(k), erlang_term(v)))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

fn erlang_binary(s: &str) -> String {
    let escaped = s.replace('\\', "\\\\").replace('"', "\\\"");
    if s.is_ascii() {
        format!("<<\"{escaped}\">>")
    } else {
        format!("<<\"{escaped}\"/utf8>>")
    }
}

/// A vhost's policies and operator policies, by name.
#[derive(Debug, Default, Clone)]
pub struct Policies {
    user: BTreeMap<String, Policy>,
    operator: BTreeMap<String, Policy>,
}

/// The policies that apply to one queue or exchange.
#[derive(Debug, Clone, Copy, Default)]
pub struct Matched<'a> {
    pub policy: Option<&'a Policy>,
    pub operator: Option<&'a Policy>,
}

impl Policies {
    fn of(&self, kind: PolicyKind) -> &BTreeMap<String, Policy> {
        match kind {
            PolicyKind::Policy => &self.user,
            PolicyKind::Operator => &self.operator,
        }
    }

    /// Adds or replaces a policy; true when it is new.
    pub fn set(&mut self, kind: PolicyKind, policy: Policy) -> bool {
        let map = match kind {
            PolicyKind::Policy => &mut self.user,
            PolicyKind::Operator => &mut self.operator,
        };
        map.insert(policy.name.clone(), policy).is_none()
    }

    /// Removes a policy; false when there was none of that name.
    pub fn clear(&mut self, kind: PolicyKind, name: &str) -> bool {
        let map = match kind {
            PolicyKind::Policy => &mut self.user,
            PolicyKind::Operator => &mut self.operator,
        };
        map.remove(name).is_some()
    }

    pub fn get(&self, kind: PolicyKind, name: &str) -> Option<&Policy> {
        self.of(kind).get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.user.is_empty() && self.operator.is_empty()
    }

    /// The policies of a kind, lowest priority first (as RabbitMQ's `/api/policies` and
    /// `rabbitmqctl list_policies` list them), then by name.
    pub fn listed(&self, kind: PolicyKind) -> Vec<&Policy> {
        let mut v: Vec<&Policy> = self.of(kind).values().collect();
        v.sort_by(|a, b| a.priority_f64().total_cmp(&b.priority_f64()));
        v
    }

    /// The policies of a kind, highest priority first, then by name: the order of matching.
    pub fn list(&self, kind: PolicyKind) -> Vec<&Policy> {
        let mut v: Vec<&Policy> = self.of(kind).values().collect();
        v.sort_by(|a, b| b.priority_f64().total_cmp(&a.priority_f64()));
        v
    }

    /// The one policy of `kind` for an entity: the highest priority among those that match
    /// (ties go to the first name in order, so that every node picks the same one).
    fn pick(
        &self,
        kind: PolicyKind,
        name: &str,
        covers: impl Fn(ApplyTo) -> bool,
    ) -> Option<&Policy> {
        self.list(kind)
            .into_iter()
            .find(|p| covers(p.apply_to) && p.matches(name))
    }

    pub fn for_queue(&self, name: &str, queue_type: QueueType) -> Matched<'_> {
        let covers = |a: ApplyTo| a.covers_queue(queue_type);
        Matched {
            policy: self.pick(PolicyKind::Policy, name, covers),
            operator: self.pick(PolicyKind::Operator, name, covers),
        }
    }

    pub fn for_exchange(&self, name: &str) -> Matched<'_> {
        Matched {
            policy: self.pick(PolicyKind::Policy, name, ApplyTo::covers_exchanges),
            operator: self.pick(PolicyKind::Operator, name, ApplyTo::covers_exchanges),
        }
    }
}

impl Matched<'_> {
    pub fn policy_name(&self) -> Option<String> {
        self.policy.map(|p| p.name.clone())
    }

    pub fn operator_name(&self) -> Option<String> {
        self.operator.map(|p| p.name.clone())
    }

    /// rabbit_policy:merge_operator_definitions: every key of either, the lower value where
    /// both set a number.
    pub fn effective_definition(&self) -> Map<String, Value> {
        let mut out = self
            .policy
            .map(|p| p.definition.clone())
            .unwrap_or_default();
        for (k, op) in self.operator.map(|p| &p.definition).into_iter().flatten() {
            let merged = match (out.get(k), op) {
                (Some(Value::Number(a)), Value::Number(b)) => {
                    if b.as_f64() < a.as_f64() {
                        op.clone()
                    } else {
                        Value::Number(a.clone())
                    }
                }
                _ => op.clone(),
            };
            out.insert(k.clone(), merged);
        }
        out
    }
}

fn count(def: &Map<String, Value>, key: &str) -> Option<u64> {
    def.get(key).and_then(Value::as_u64)
}

fn text(def: &Map<String, Value>, key: &str) -> Option<String> {
    def.get(key).and_then(Value::as_str).map(String::from)
}

fn lower(arg: Option<u64>, policy: Option<u64>) -> Option<u64> {
    match (arg, policy) {
        (Some(a), Some(p)) => Some(a.min(p)),
        (a, p) => a.or(p),
    }
}

/// A classic queue's effective configuration: `declared` (what its arguments say, with
/// `arguments` to tell a given argument from a default) merged with the effective policy
/// definition as rabbit_amqqueue_process:process_args_policy does: `res_min` for expires,
/// message-ttl, max-length and max-length-bytes, `res_arg` (the argument wins) for the
/// dead-letter exchange and routing key, overflow and queue mode.
///
/// A stream's retention and segment size come from [`stream_config`]. Quorum queues keep
/// `declared`: their replicated state machine takes its configuration at creation, so a
/// policy is stored and shown for them but changes nothing yet.
pub fn queue_config(
    declared: &QueueConfig,
    arguments: &FieldTable,
    definition: &Map<String, Value>,
) -> QueueConfig {
    if declared.queue_type == QueueType::Stream {
        let mut c = declared.clone();
        c.stream = Some(stream_config(
            &declared.stream.clone().unwrap_or_default(),
            definition,
        ));
        return c;
    }
    if declared.queue_type != QueueType::Classic || definition.is_empty() {
        return declared.clone();
    }
    let has = |key: &str| arguments.inner().contains_key(key);
    let mut c = declared.clone();
    c.expires_ms = lower(declared.expires_ms, count(definition, "expires"));
    c.message_ttl_ms = lower(declared.message_ttl_ms, count(definition, "message-ttl"));
    c.max_length = lower(declared.max_length, count(definition, "max-length"));
    c.max_length_bytes = lower(
        declared.max_length_bytes,
        count(definition, "max-length-bytes"),
    );
    if !has("x-dead-letter-exchange") {
        c.dead_letter_exchange = text(definition, "dead-letter-exchange");
    }
    if !has("x-dead-letter-routing-key") {
        c.dead_letter_routing_key = text(definition, "dead-letter-routing-key");
    }
    if !has("x-overflow") {
        c.overflow = match text(definition, "overflow").as_deref() {
            Some("reject-publish") => Overflow::RejectPublish,
            Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
            _ => Overflow::DropHead,
        };
    }
    if !has("x-queue-mode") {
        c.lazy = text(definition, "queue-mode").as_deref() == Some("lazy");
    }
    c
}

/// A stream's effective retention and segment size, as RabbitMQ 3.10's
/// rabbit_stream_queue:make_stream_conf (and its coordinator's update_stream_conf, on a
/// policy change) derive them with `policy_precedence`: where the policy sets
/// `max-length-bytes`, `max-age` or `stream-max-segment-size-bytes`, its value wins over the
/// argument's, higher or lower (unlike a classic queue's limits, where the lower wins); where
/// it does not, the argument's stands.
pub fn stream_config(declared: &StreamConfig, definition: &Map<String, Value>) -> StreamConfig {
    let age = definition
        .get("max-age")
        .and_then(Value::as_str)
        .and_then(crate::stream_args::parse_duration_ms);
    let segment = count(definition, "stream-max-segment-size-bytes")
        .map(|n| n.min(warren_store::stream::SEGMENT_BYTES_LIMIT));
    StreamConfig {
        max_bytes: count(definition, "max-length-bytes").or(declared.max_bytes),
        max_age_ms: age.or(declared.max_age_ms),
        segment_bytes: segment.unwrap_or(declared.segment_bytes),
        initial_cluster_size: declared.initial_cluster_size,
    }
}

/// An exchange's alternate exchange: its `alternate-exchange` argument, else the policy's
/// (rabbit_policy:get_arg: the argument wins).
pub fn alternate_exchange(
    arguments: &FieldTable,
    definition: &Map<String, Value>,
) -> Option<String> {
    match arguments.inner().get("alternate-exchange") {
        Some(v) => crate::args::string(v),
        None => text(definition, "alternate-exchange"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol_types::AMQPValue;
    use serde_json::json;

    fn policy(kind: PolicyKind, name: &str, pattern: &str, priority: i64, def: Value) -> Policy {
        Policy::new(kind, name, &json!(pattern), "all", &json!(priority), &def).unwrap()
    }

    fn refusal(kind: PolicyKind, def: Value) -> String {
        validate_definition(kind, &def).unwrap_err()
    }

    #[test]
    fn bad_values_are_refused_with_rabbitmq_texts() {
        use PolicyKind::*;
        assert_eq!(
            refusal(Policy, json!({"max-length": "x"})),
            "<<\"x\">> is not a valid maximum length"
        );
        assert_eq!(
            refusal(Policy, json!({"max-length": -1})),
            "-1 is not a valid maximum length"
        );
        assert_eq!(
            refusal(Policy, json!({"max-length": 1.5})),
            "1.5 is not a valid maximum length"
        );
        assert_eq!(
            refusal(Policy, json!({"expires": 0})),
            "0 is not a valid queue expiry"
        );
        assert_eq!(
            refusal(Policy, json!({"dead-letter-exchange": 1})),
            "1 is not a valid dead letter exchange name"
        );
        assert_eq!(
            refusal(Policy, json!({"message-ttl": "x", "max-length": -1})),
            "-1 is not a valid maximum length",
            "keys are checked in order, the first bad one reported"
        );
        assert_eq!(refusal(Policy, json!({})), "no policy provided");
        assert_eq!(
            refusal(Policy, json!({"max-length": 1, "foo": 2, "bar": "x"})),
            "[{<<\"bar\">>,<<\"x\">>},{<<\"foo\">>,2}] are not recognised policy settings"
        );
        assert_eq!(
            refusal(Policy, json!({"single-active-consumer": true})),
            "[{<<\"single-active-consumer\">>,true}] are not recognised policy settings"
        );
        assert_eq!(
            refusal(Operator, json!({"dead-letter-exchange": "x"})),
            "[{<<\"dead-letter-exchange\">>,<<\"x\">>}] are not recognised policy settings",
            "operator policies take limits only"
        );
        assert!(refusal(Policy, json!({"ha-mode": "all"})).contains("quorum queues"));
        assert!(
            validate_definition(Policy, &json!({"queue-mode": "lazy", "max-age": "7D"})).is_ok()
        );
    }

    #[test]
    fn policy_fields_are_validated_in_rabbitmq_order() {
        let def = json!({"max-length": 1});
        let err = |pattern: Value, apply: &str, prio: Value| {
            Policy::new(PolicyKind::Policy, "p", &pattern, apply, &prio, &def).unwrap_err()
        };
        assert_eq!(
            err(json!("a"), "all", json!("3")),
            "priority should be a number, actually was <<\"3\">>"
        );
        assert_eq!(
            err(json!(1), "all", json!(0)),
            "pattern should be a binary but was 1"
        );
        assert!(err(json!("("), "all", json!(0))
            .starts_with("pattern should be regular expression but is invalid"));
        assert!(err(json!("a"), "bogus", json!(0)).starts_with("apply-to 'bogus' unrecognised"));
    }

    #[test]
    fn highest_priority_match_wins_per_kind() {
        let mut ps = Policies::default();
        ps.set(
            PolicyKind::Policy,
            policy(PolicyKind::Policy, "low", "^a", 0, json!({"max-length": 5})),
        );
        ps.set(
            PolicyKind::Policy,
            policy(
                PolicyKind::Policy,
                "high",
                "^ab",
                10,
                json!({"max-length": 9}),
            ),
        );
        let mut qonly = policy(
            PolicyKind::Policy,
            "x-only",
            ".*",
            99,
            json!({"alternate-exchange": "alt"}),
        );
        qonly.apply_to = ApplyTo::Exchanges;
        ps.set(PolicyKind::Policy, qonly);
        let m = ps.for_queue("abc", QueueType::Classic);
        assert_eq!(m.policy_name().as_deref(), Some("high"));
        assert_eq!(
            ps.for_queue("axe", QueueType::Classic)
                .policy_name()
                .as_deref(),
            Some("low")
        );
        assert_eq!(ps.for_queue("zzz", QueueType::Classic).policy_name(), None);
        assert_eq!(
            ps.for_exchange("abc").policy_name().as_deref(),
            Some("x-only")
        );
        let mut classic = policy(PolicyKind::Policy, "c", "^q", 0, json!({"max-length": 1}));
        classic.apply_to = ApplyTo::ClassicQueues;
        ps.set(PolicyKind::Policy, classic);
        assert!(ps.for_queue("q", QueueType::Classic).policy.is_some());
        assert!(ps.for_queue("q", QueueType::Quorum).policy.is_none());
        assert!(ps.clear(PolicyKind::Policy, "c"));
        assert!(!ps.clear(PolicyKind::Policy, "c"));
    }

    #[test]
    fn operator_policy_caps_numeric_keys_and_adds_its_own() {
        let mut ps = Policies::default();
        ps.set(
            PolicyKind::Policy,
            policy(
                PolicyKind::Policy,
                "p",
                "^a",
                1,
                json!({"max-length": 5, "dead-letter-exchange": "dlx", "expires": 100}),
            ),
        );
        ps.set(
            PolicyKind::Operator,
            policy(
                PolicyKind::Operator,
                "op",
                "^a",
                0,
                json!({"max-length": 3, "message-ttl": 1000, "expires": 500}),
            ),
        );
        let def = ps
            .for_queue("abc", QueueType::Classic)
            .effective_definition();
        assert_eq!(
            Value::Object(def),
            json!({"dead-letter-exchange": "dlx", "expires": 100, "max-length": 3, "message-ttl": 1000})
        );
    }

    #[test]
    fn arguments_and_policy_merge_as_rabbitmq_classic_queues_do() {
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongInt(2));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("mine".into()),
        );
        let declared = QueueConfig::parse(&args, "q", "/").unwrap();
        let def = json!({"max-length": 10, "max-length-bytes": 100, "dead-letter-exchange": "theirs",
                         "overflow": "reject-publish", "queue-mode": "lazy", "message-ttl": 5});
        let c = queue_config(&declared, &args, def.as_object().unwrap());
        assert_eq!(c.max_length, Some(2), "the lower of argument and policy");
        assert_eq!(c.max_length_bytes, Some(100), "policy alone");
        assert_eq!(
            c.dead_letter_exchange.as_deref(),
            Some("mine"),
            "the argument wins"
        );
        assert_eq!(c.overflow, Overflow::RejectPublish);
        assert!(c.lazy);
        assert_eq!(c.message_ttl_ms, Some(5));
        let lower = json!({"max-length": 1});
        assert_eq!(
            queue_config(&declared, &args, lower.as_object().unwrap()).max_length,
            Some(1)
        );
        assert_eq!(
            queue_config(&declared, &args, &Map::new()),
            declared,
            "no policy: as declared"
        );
    }

    #[test]
    fn quorum_queues_keep_their_declared_configuration() {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let declared = QueueConfig::parse(&args, "q", "/").unwrap();
        let def = json!({"max-length": 1});
        assert_eq!(
            queue_config(&declared, &args, def.as_object().unwrap()),
            declared
        );
    }

    #[test]
    fn alternate_exchange_argument_wins_over_policy() {
        let def = json!({"alternate-exchange": "pol"});
        let def = def.as_object().unwrap();
        assert_eq!(
            alternate_exchange(&FieldTable::default(), def).as_deref(),
            Some("pol")
        );
        let mut args = FieldTable::default();
        args.insert(
            "alternate-exchange".into(),
            AMQPValue::LongString("arg".into()),
        );
        assert_eq!(alternate_exchange(&args, def).as_deref(), Some("arg"));
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;
    use serde_json::json;

    fn definition(v: Value) -> Map<String, Value> {
        v.as_object().expect("an object").clone()
    }

    #[test]
    fn a_streams_policy_wins_over_its_arguments_higher_or_lower() {
        let declared = StreamConfig {
            max_bytes: Some(1_000),
            max_age_ms: Some(60_000),
            segment_bytes: 5_000,
            initial_cluster_size: Some(3),
        };
        let c = stream_config(
            &declared,
            &definition(json!({"max-length-bytes": 9_000, "max-age": "1s",
                               "stream-max-segment-size-bytes": 2_000})),
        );
        assert_eq!(c.max_bytes, Some(9_000));
        assert_eq!(c.max_age_ms, Some(1_000));
        assert_eq!(c.segment_bytes, 2_000);
        assert_eq!(c.initial_cluster_size, Some(3));
    }

    #[test]
    fn what_a_streams_policy_leaves_unset_keeps_the_argument() {
        let declared = StreamConfig {
            max_bytes: Some(1_000),
            ..StreamConfig::default()
        };
        let c = stream_config(&declared, &definition(json!({"max-age": "7D"})));
        assert_eq!(c.max_bytes, Some(1_000));
        assert_eq!(c.max_age_ms, Some(7 * 24 * 3_600_000));
        assert_eq!(c.segment_bytes, declared.segment_bytes);
        assert_eq!(stream_config(&declared, &Map::new()), declared);
    }

    #[test]
    fn stream_segment_size_is_a_policy_key_and_the_old_name_is_not() {
        assert!(validate_definition(
            PolicyKind::Policy,
            &json!({"stream-max-segment-size-bytes": 1_000})
        )
        .is_ok());
        assert_eq!(
            validate_definition(
                PolicyKind::Policy,
                &json!({"stream-max-segment-size-bytes": -1})
            ),
            Err("-1 is not a valid segment size".into())
        );
        assert!(
            validate_definition(PolicyKind::Policy, &json!({"max-segment-size": 5}))
                .unwrap_err()
                .ends_with("are not recognised policy settings")
        );
    }
}
