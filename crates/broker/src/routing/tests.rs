//! Behaviour of the routing table against RabbitMQ's semantics, and property tests against
//! naive models (a recursive topic matcher, a Vec of bindings).

use amq_protocol_types::{AMQPValue, DecimalValue, FieldArray, FieldTable, LongString};
use proptest::prelude::*;

use super::*;

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

// ---------------------------------------------------------------- direct, fanout

#[test]
fn table_and_scratch_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<RoutingTable>();
    send_sync::<RouteScratch>();
}

#[test]
fn direct_routes_only_the_exact_key() {
    let mut t = with_exchange(ExchangeKind::Direct);
    t.bind(X, q(1), b"orders", &no_args()).unwrap();
    t.bind(X, q(2), b"orders", &no_args()).unwrap();
    t.bind(X, q(3), b"order", &no_args()).unwrap();
    t.bind(X, q(4), b"", &no_args()).unwrap();
    assert_eq!(routed(&mut t, X, "orders", None), vec![1, 2]);
    assert_eq!(routed(&mut t, X, "order", None), vec![3]);
    assert_eq!(routed(&mut t, X, "", None), vec![4]);
    assert_eq!(routed(&mut t, X, "orders.x", None), Vec::<u32>::new());
    assert_eq!(routed(&mut t, X, "#", None), Vec::<u32>::new());
}

#[test]
fn direct_delivers_a_queue_once_when_bound_twice_with_other_args() {
    let mut t = with_exchange(ExchangeKind::Direct);
    assert!(t.bind(X, q(1), b"k", &no_args()).unwrap());
    assert!(t.bind(X, q(1), b"k", &table(&[("a", s("1"))])).unwrap());
    assert_eq!(t.binding_count(), 2);
    assert_eq!(routed(&mut t, X, "k", None), vec![1]);
}

#[test]
fn exchange_kinds_have_rabbitmq_names() {
    for kind in [
        ExchangeKind::Direct,
        ExchangeKind::Fanout,
        ExchangeKind::Topic,
        ExchangeKind::Headers,
    ] {
        assert_eq!(ExchangeKind::from_name(kind.name()), Some(kind));
    }
    assert_eq!(ExchangeKind::from_name("x-consistent-hash"), None);
    assert_eq!(ExchangeKind::from_name("Direct"), None);
}

#[test]
fn fanout_ignores_the_routing_key() {
    let mut t = with_exchange(ExchangeKind::Fanout);
    assert_eq!(routed(&mut t, X, "a", None), Vec::<u32>::new());
    t.bind(X, q(1), b"", &no_args()).unwrap();
    t.bind(X, q(2), b"whatever", &no_args()).unwrap();
    assert_eq!(routed(&mut t, X, "a", None), vec![1, 2]);
    assert_eq!(routed(&mut t, X, "", None), vec![1, 2]);
}

// ---------------------------------------------------------------- topic

/// Binds queue i to the i-th key of `keys` (i from 0) and returns which bind keys match.
fn topic_matches(keys: &[&str], routing_key: &str) -> Vec<String> {
    let mut t = with_exchange(ExchangeKind::Topic);
    for (i, k) in keys.iter().enumerate() {
        t.bind(X, q(i as u32), k.as_bytes(), &no_args()).unwrap();
    }
    routed(&mut t, X, routing_key, None)
        .into_iter()
        .map(|i| keys[i as usize].to_string())
        .collect()
}

fn topic_match(binding_key: &str, routing_key: &str) -> bool {
    !topic_matches(&[binding_key], routing_key).is_empty()
}

#[test]
fn topic_literal_words_match_exactly() {
    assert!(topic_match("a.b.c", "a.b.c"));
    assert!(!topic_match("a.b.c", "a.b"));
    assert!(!topic_match("a.b", "a.b.c"));
    assert!(!topic_match("a.b.c", "a.b.d"));
    // Partial wildcards are literal words.
    assert!(!topic_match("a#", "ab"));
    assert!(topic_match("a#", "a#"));
    assert!(!topic_match("*a", "ba"));
}

#[test]
fn topic_star_matches_exactly_one_word() {
    assert!(topic_match("*", "a"));
    assert!(!topic_match("*", ""));
    assert!(!topic_match("*", "a.b"));
    assert!(topic_match("a.*.c", "a.b.c"));
    assert!(!topic_match("a.*.c", "a.c"));
    assert!(topic_match("*.*", "a.b"));
    assert!(!topic_match("*.*", "a"));
}

#[test]
fn topic_hash_at_start_middle_end() {
    for key in ["", "a", "a.b.c", ".", "a..b"] {
        assert!(topic_match("#", key), "# matches {key:?}");
    }
    assert!(topic_match("#.c", "c"));
    assert!(topic_match("#.c", "a.b.c"));
    assert!(!topic_match("#.c", "a.c.b"));
    assert!(!topic_match("#.c", ""));
    assert!(topic_match("a.#.c", "a.c"));
    assert!(topic_match("a.#.c", "a.b.c"));
    assert!(topic_match("a.#.c", "a.b.b.b.c"));
    assert!(!topic_match("a.#.c", "a.b"));
    assert!(!topic_match("a.#.c", "a.c.d"));
    assert!(topic_match("a.#", "a"));
    assert!(topic_match("a.#", "a.b.c"));
    assert!(!topic_match("a.#", "b.a"));
    assert!(!topic_match("a.#", ""));
}

#[test]
fn topic_hash_hash_and_star_hash() {
    for key in ["", "a", "a.b", "a.b.c.d"] {
        assert!(topic_match("#.#", key), "#.# matches {key:?}");
    }
    assert!(!topic_match("*.#", ""));
    assert!(topic_match("*.#", "a"));
    assert!(topic_match("*.#", "a.b.c"));
    assert!(!topic_match("#.*", ""));
    assert!(topic_match("#.*", "a"));
    assert!(topic_match("#.*", "a.b"));
    assert!(topic_match("#.*.#", "a"));
    assert!(!topic_match("*.#.*", "a"));
    assert!(topic_match("*.#.*", "a.b"));
    assert!(topic_match("a.#.#.b", "a.b"));
    assert!(topic_match("a.#.#.b", "a.x.y.z.b"));
    assert!(topic_match("#.a.#", "a"));
    assert!(topic_match("#.a.#", "x.a.y"));
    assert!(!topic_match("#.a.#", "x.y"));
}

#[test]
fn topic_empty_words_are_words() {
    // RabbitMQ: "" is zero words, "." is two empty words, "a..b" has an empty middle word.
    assert!(topic_match("", ""));
    assert!(!topic_match("", "."));
    assert!(!topic_match("", "a"));
    assert!(topic_match(".", "."));
    assert!(!topic_match(".", ""));
    assert!(topic_match("*.*", "."));
    assert!(topic_match("a..b", "a..b"));
    assert!(!topic_match("a..b", "a.b"));
    assert!(topic_match("a.*.b", "a..b"));
    assert!(topic_match("a.#.b", "a..b"));
    assert!(topic_match("a.", "a."));
    assert!(topic_match("a.*", "a."));
    assert!(!topic_match("a.*", "a"));
    assert!(topic_match(".a", ".a"));
    assert!(!topic_match("*", "."));
    assert!(topic_match("#", "."));
}

#[test]
fn topic_keys_with_many_words() {
    // 85 distinct two-letter words: 254 bytes, the most a short-string key holds.
    let words: Vec<String> = (0..85u8)
        .map(|i| String::from_utf8(vec![b'a' + i / 26, b'a' + i % 26]).unwrap())
        .collect();
    let key = words.join(".");
    assert_eq!(key.len(), 254);
    assert!(topic_match(&key, &key));
    assert!(topic_match("#", &key));
    assert!(topic_match(&format!("{}.#", words[0]), &key));
    assert!(topic_match(&format!("#.{}", words[84]), &key));
    assert!(topic_match(&format!("#.{}.#", words[60]), &key));
    assert!(topic_match(
        &format!("#.{}.*.#.{}", words[10], words[84]),
        &key
    ));
    assert!(!topic_match(
        &format!("#.{}.{}.#", words[60], words[59]),
        &key
    ));
    assert!(!topic_match(&format!("#.{}", words[83]), &key));
    let stars = vec!["*"; 85].join(".");
    assert!(topic_match(&stars, &key));
    let hashes = vec!["#"; 85].join(".");
    assert!(topic_match(&hashes, &key));
    let too_few = vec!["*"; 84].join(".");
    assert!(!topic_match(&too_few, &key));
    let star_hash = vec!["*.#"; 42].join(".");
    assert!(topic_match(&star_hash, &key));
}

#[test]
fn topic_routes_each_queue_once_across_matching_keys() {
    let mut t = with_exchange(ExchangeKind::Topic);
    for key in ["#", "a.*", "a.b", "*.b", "#.b", "a.#"] {
        t.bind(X, q(7), key.as_bytes(), &no_args()).unwrap();
    }
    t.bind(X, q(8), b"c", &no_args()).unwrap();
    assert_eq!(routed(&mut t, X, "a.b", None), vec![7]);
    assert_eq!(routed(&mut t, X, "c", None), vec![7, 8]);
}

#[test]
fn topic_trie_is_pruned_when_bindings_go() {
    let mut t = with_exchange(ExchangeKind::Topic);
    let keys = ["a.b.c", "a.*.c", "a.#", "#", "", "a..b", "*.#.*"];
    for (i, k) in keys.iter().enumerate() {
        t.bind(X, q(i as u32), k.as_bytes(), &no_args()).unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        assert!(
            t.unbind(X, q(i as u32), k.as_bytes(), &no_args())
                .unwrap()
                .existed
        );
        assert_eq!(topic_matches(&keys[i + 1..], "a.b.c").len(), {
            let mut out = Vec::new();
            t.route(X, b"a.b.c", None, &mut out).unwrap();
            out.len()
        });
    }
    let Some(Exchange {
        index: Index::Topic(trie),
        ..
    }) = t.exchange(X)
    else {
        panic!("topic exchange")
    };
    assert_eq!(trie.node_count(), 1, "only the root is left");
}

/// Routing keys published to RabbitMQ 3.10 for the fixture below.
const RABBITMQ_ROUTING_KEYS: &[&str] = &[
    "", ".", "..", "a", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y", "a#", "*",
    "#", "a.a.a",
];

/// For each binding key, the routing keys above that RabbitMQ 3.10 delivered through it
/// (recorded with pika against the broker from `shared/rabbitmq/rabbitmq.sh`).
const RABBITMQ_TOPIC_MATCHES: &[(&str, &[&str])] = &[
    ("", &[""]),
    (".", &["."]),
    (
        "#",
        &[
            "", ".", "..", "a", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y",
            "a#", "*", "#", "a.a.a",
        ],
    ),
    ("*", &["a", "a#", "*", "#"]),
    (
        "#.#",
        &[
            "", ".", "..", "a", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y",
            "a#", "*", "#", "a.a.a",
        ],
    ),
    (
        "*.#",
        &[
            ".", "..", "a", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y", "a#",
            "*", "#", "a.a.a",
        ],
    ),
    (
        "#.*",
        &[
            ".", "..", "a", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y", "a#",
            "*", "#", "a.a.a",
        ],
    ),
    ("a", &["a"]),
    ("a.", &["a."]),
    (".a", &[".a"]),
    ("a..b", &["a..b"]),
    ("a.*.b", &["a..b", "a.x.b"]),
    ("a.#.b", &["a.b", "a..b", "a.x.b", "a.x.y.b"]),
    (
        "a.#",
        &["a", "a.", "a.b", "a..b", "a.x.b", "a.x.y.b", "a.a.a"],
    ),
    ("#.a", &["a", ".a", "b.a", "a.a.a"]),
    ("*.*", &[".", "a.", ".a", "a.b", "b.a"]),
    (
        "#.a.#",
        &[
            "a", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y", "a.a.a",
        ],
    ),
    ("a.*", &["a.", "a.b"]),
    ("*.a.*", &["x.a.y", "a.a.a"]),
    ("a.#.#.b", &["a.b", "a..b", "a.x.b", "a.x.y.b"]),
    ("#.#.a", &["a", ".a", "b.a", "a.a.a"]),
    ("a#", &["a#"]),
    (
        "*.*.#",
        &[
            ".", "..", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y", "a.a.a",
        ],
    ),
    (
        "#.*.#",
        &[
            ".", "..", "a", "a.", ".a", "a.b", "a..b", "a.x.b", "a.x.y.b", "b.a", "x.a.y", "a#",
            "*", "#", "a.a.a",
        ],
    ),
    ("..", &[".."]),
    ("*..*", &["..", "a..b"]),
];

#[test]
fn topic_matches_what_rabbitmq_delivered() {
    let mut t = with_exchange(ExchangeKind::Topic);
    for (i, (binding_key, _)) in RABBITMQ_TOPIC_MATCHES.iter().enumerate() {
        t.bind(X, q(i as u32), binding_key.as_bytes(), &no_args())
            .unwrap();
    }
    for routing_key in RABBITMQ_ROUTING_KEYS {
        let expected: Vec<u32> = RABBITMQ_TOPIC_MATCHES
            .iter()
            .enumerate()
            .filter(|(_, (_, delivered))| delivered.contains(routing_key))
            .map(|(i, _)| i as u32)
            .collect();
        assert_eq!(
            routed(&mut t, X, routing_key, None),
            expected,
            "routing key {routing_key:?}"
        );
    }
}

// ---------------------------------------------------------------- headers

fn headers_match(args: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let mut t = with_exchange(ExchangeKind::Headers);
    t.bind(X, q(1), b"", args).unwrap();
    !routed(&mut t, X, "ignored", headers).is_empty()
}

#[test]
fn headers_all_needs_every_key_and_is_the_default() {
    let all = table(&[("x-match", s("all")), ("a", s("1")), ("b", s("2"))]);
    let default = table(&[("a", s("1")), ("b", s("2"))]);
    for args in [&all, &default] {
        assert!(headers_match(
            args,
            Some(&table(&[("a", s("1")), ("b", s("2"))]))
        ));
        assert!(headers_match(
            args,
            Some(&table(&[("a", s("1")), ("b", s("2")), ("c", s("3"))]))
        ));
        assert!(!headers_match(args, Some(&table(&[("a", s("1"))]))));
        assert!(!headers_match(
            args,
            Some(&table(&[("a", s("1")), ("b", s("3"))]))
        ));
        assert!(!headers_match(args, None));
    }
}

#[test]
fn headers_any_needs_one_key() {
    let any = table(&[("x-match", s("any")), ("a", s("1")), ("b", s("2"))]);
    assert!(headers_match(&any, Some(&table(&[("a", s("1"))]))));
    assert!(headers_match(
        &any,
        Some(&table(&[("a", s("0")), ("b", s("2"))]))
    ));
    assert!(!headers_match(
        &any,
        Some(&table(&[("a", s("0")), ("b", s("0"))]))
    ));
    assert!(!headers_match(&any, Some(&table(&[("c", s("1"))]))));
    assert!(!headers_match(&any, None));
}

#[test]
fn headers_empty_pattern_all_matches_everything_any_nothing() {
    assert!(headers_match(&no_args(), None));
    assert!(headers_match(
        &table(&[("x-match", s("all"))]),
        Some(&table(&[("a", s("1"))]))
    ));
    assert!(!headers_match(
        &table(&[("x-match", s("any"))]),
        Some(&table(&[("a", s("1"))]))
    ));
}

#[test]
fn headers_x_keys_ignored_by_all_and_any_but_not_with_x() {
    let headers = table(&[("x-tenant", s("blue")), ("a", s("1"))]);
    let other_tenant = table(&[("x-tenant", s("red")), ("a", s("1"))]);
    let all = table(&[
        ("x-match", s("all")),
        ("x-tenant", s("blue")),
        ("a", s("1")),
    ]);
    assert!(headers_match(&all, Some(&headers)));
    assert!(
        headers_match(&all, Some(&other_tenant)),
        "all ignores x- keys"
    );
    let all_x = table(&[
        ("x-match", s("all-with-x")),
        ("x-tenant", s("blue")),
        ("a", s("1")),
    ]);
    assert!(headers_match(&all_x, Some(&headers)));
    assert!(!headers_match(&all_x, Some(&other_tenant)));

    let any = table(&[("x-match", s("any")), ("x-tenant", s("blue"))]);
    assert!(
        !headers_match(&any, Some(&headers)),
        "any has nothing left to match"
    );
    let any_x = table(&[
        ("x-match", s("any-with-x")),
        ("x-tenant", s("blue")),
        ("b", s("9")),
    ]);
    assert!(headers_match(&any_x, Some(&headers)));
    assert!(!headers_match(&any_x, Some(&other_tenant)));
    // x-match itself is never compared, even with-x.
    let only_mode = table(&[("x-match", s("all-with-x"))]);
    assert!(headers_match(
        &only_mode,
        Some(&table(&[("x-match", s("any"))]))
    ));
}

#[test]
fn headers_void_pattern_matches_presence() {
    let args = table(&[("flag", AMQPValue::Void)]);
    assert!(headers_match(
        &args,
        Some(&table(&[("flag", s("anything"))]))
    ));
    assert!(headers_match(
        &args,
        Some(&table(&[("flag", AMQPValue::LongLongInt(3))]))
    ));
    assert!(headers_match(
        &args,
        Some(&table(&[("flag", AMQPValue::Void)]))
    ));
    assert!(!headers_match(&args, Some(&table(&[("other", s("x"))]))));
    // A void header does not equal a non-void pattern.
    assert!(!headers_match(
        &table(&[("a", s(""))]),
        Some(&table(&[("a", AMQPValue::Void)]))
    ));
}

#[test]
fn headers_values_compare_as_erlang_terms() {
    let one =
        |v: AMQPValue, h: AMQPValue| headers_match(&table(&[("k", v)]), Some(&table(&[("k", h)])));
    // Every integer type is one kind of number in Erlang.
    assert!(one(AMQPValue::LongInt(1), AMQPValue::LongLongInt(1)));
    assert!(one(AMQPValue::ShortShortUInt(7), AMQPValue::Timestamp(7)));
    assert!(one(
        AMQPValue::LongUInt(u32::MAX),
        AMQPValue::LongLongInt(u32::MAX as i64)
    ));
    assert!(!one(AMQPValue::LongInt(1), AMQPValue::LongLongInt(2)));
    assert!(!one(
        AMQPValue::ShortShortInt(-1),
        AMQPValue::ShortShortUInt(255)
    ));
    // `==` between integer and float compares values.
    assert!(one(AMQPValue::LongInt(1), AMQPValue::Double(1.0)));
    assert!(one(AMQPValue::Float(0.5), AMQPValue::Double(0.5)));
    assert!(!one(AMQPValue::LongInt(1), AMQPValue::Double(1.5)));
    // Strings and byte arrays are both binaries; strings never equal numbers or booleans.
    assert!(one(s("abc"), AMQPValue::ByteArray(b"abc".to_vec().into())));
    assert!(!one(s("1"), AMQPValue::LongInt(1)));
    assert!(!one(s("true"), AMQPValue::Boolean(true)));
    assert!(!one(AMQPValue::Boolean(true), AMQPValue::LongInt(1)));
    assert!(one(AMQPValue::Boolean(false), AMQPValue::Boolean(false)));
    let d = |scale, value| AMQPValue::DecimalValue(DecimalValue { scale, value });
    assert!(one(d(2, 150), d(2, 150)));
    assert!(!one(d(2, 150), d(1, 15)));
    // Nested values keep RabbitMQ's type tag, so there the types must agree.
    let nested = |v: AMQPValue| AMQPValue::FieldTable(table(&[("n", v)]));
    assert!(one(
        nested(AMQPValue::LongInt(1)),
        nested(AMQPValue::LongInt(1))
    ));
    assert!(!one(
        nested(AMQPValue::LongInt(1)),
        nested(AMQPValue::LongLongInt(1))
    ));
    let array = |v: Vec<AMQPValue>| AMQPValue::FieldArray(FieldArray::from(v));
    assert!(one(
        array(vec![s("a"), s("b")]),
        array(vec![s("a"), s("b")])
    ));
    assert!(!one(
        array(vec![s("a"), s("b")]),
        array(vec![s("b"), s("a")])
    ));
    assert!(!one(array(vec![s("a")]), array(vec![s("a"), s("a")])));
}

/// Cases published with pika to RabbitMQ 3.10, and whether it delivered: pika sends Python
/// ints as signed 32-bit (`I`), bytes as byte arrays (`x`), None as void.
#[test]
fn headers_match_what_rabbitmq_delivered() {
    let int = AMQPValue::LongInt;
    let bytes = |b: &[u8]| AMQPValue::ByteArray(b.to_vec().into());
    let cases: Vec<(FieldTable, Option<FieldTable>, bool)> = vec![
        (table(&[("k", int(1))]), Some(table(&[("k", int(1))])), true),
        (
            table(&[("k", int(1))]),
            Some(table(&[("k", int(2))])),
            false,
        ),
        (
            table(&[("k", s("abc"))]),
            Some(table(&[("k", bytes(b"abc"))])),
            true,
        ),
        (
            table(&[("k", s("1"))]),
            Some(table(&[("k", int(1))])),
            false,
        ),
        (
            table(&[("k", AMQPValue::Boolean(true))]),
            Some(table(&[("k", int(1))])),
            false,
        ),
        (
            table(&[("k", AMQPValue::Boolean(true))]),
            Some(table(&[("k", AMQPValue::Boolean(true))])),
            true,
        ),
        (
            table(&[("k", AMQPValue::Void)]),
            Some(table(&[("k", s("anything"))])),
            true,
        ),
        (
            table(&[("k", AMQPValue::Void)]),
            Some(table(&[("j", s("anything"))])),
            false,
        ),
        (
            table(&[("x-match", s("any")), ("a", int(1)), ("b", int(2))]),
            Some(table(&[("b", int(2))])),
            true,
        ),
        (
            table(&[("x-match", s("all")), ("a", int(1)), ("b", int(2))]),
            Some(table(&[("b", int(2))])),
            false,
        ),
        (
            table(&[("x-match", s("all")), ("x-t", s("blue")), ("a", int(1))]),
            Some(table(&[("a", int(1)), ("x-t", s("red"))])),
            true,
        ),
        (
            table(&[
                ("x-match", s("all-with-x")),
                ("x-t", s("blue")),
                ("a", int(1)),
            ]),
            Some(table(&[("a", int(1)), ("x-t", s("red"))])),
            false,
        ),
        (
            table(&[("x-match", s("any")), ("x-t", s("blue"))]),
            Some(table(&[("x-t", s("blue"))])),
            false,
        ),
        (
            table(&[("x-match", s("any-with-x")), ("x-t", s("blue"))]),
            Some(table(&[("x-t", s("blue"))])),
            true,
        ),
        (no_args(), Some(table(&[("a", int(1))])), true),
        (no_args(), None, true),
        (
            table(&[("x-match", s("any"))]),
            Some(table(&[("a", int(1))])),
            false,
        ),
        (
            table(&[("k", AMQPValue::FieldTable(table(&[("n", int(1))])))]),
            Some(table(&[(
                "k",
                AMQPValue::FieldTable(table(&[("n", int(1))])),
            )])),
            true,
        ),
        (
            table(&[("k", AMQPValue::FieldArray(vec![int(1), int(2)].into()))]),
            Some(table(&[(
                "k",
                AMQPValue::FieldArray(vec![int(1), int(2)].into()),
            )])),
            true,
        ),
    ];
    for (args, headers, delivered) in cases {
        assert_eq!(
            headers_match(&args, headers.as_ref()),
            delivered,
            "{args:?} {headers:?}"
        );
    }
}

#[test]
fn headers_invalid_x_match_is_precondition_failed() {
    let mut t = with_exchange(ExchangeKind::Headers);
    let err = t
        .bind(X, q(1), b"", &table(&[("x-match", s("some"))]))
        .unwrap_err();
    assert_eq!(
        err,
        RoutingError::InvalidXMatch {
            value: "some".into()
        }
    );
    assert_eq!(err.reply_code(), 406);
    let err = t
        .bind(X, q(1), b"", &table(&[("x-match", AMQPValue::LongInt(1))]))
        .unwrap_err();
    assert_eq!(err.reply_code(), 406);
    // The texts RabbitMQ 3.10 sent for the same binds.
    assert_eq!(
        err.to_string(),
        "Invalid x-match field type signedint (value 1); expected longstr"
    );
    let err = t
        .bind(X, q(1), b"", &table(&[("x-match", s("some"))]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Invalid x-match field value <<\"some\">>; expected all, any, all-with-x, or any-with-x"
    );
    assert_eq!(t.binding_count(), 0);
    // Other kinds do not look at x-match, as in RabbitMQ.
    t.declare_exchange(Y, ExchangeKind::Direct).unwrap();
    assert!(t
        .bind(Y, q(1), b"", &table(&[("x-match", s("some"))]))
        .unwrap());
}

#[test]
fn headers_routes_only_matching_bindings() {
    let mut t = with_exchange(ExchangeKind::Headers);
    t.bind(
        X,
        q(1),
        b"",
        &table(&[("format", s("pdf")), ("type", s("report"))]),
    )
    .unwrap();
    t.bind(
        X,
        q(2),
        b"",
        &table(&[
            ("x-match", s("any")),
            ("format", s("zip")),
            ("type", s("log")),
        ]),
    )
    .unwrap();
    t.bind(
        X,
        q(3),
        b"",
        &table(&[("x-match", s("any")), ("format", s("pdf"))]),
    )
    .unwrap();
    let pdf_report = table(&[("format", s("pdf")), ("type", s("report"))]);
    assert_eq!(routed(&mut t, X, "", Some(&pdf_report)), vec![1, 3]);
    let zip_report = table(&[("format", s("zip")), ("type", s("report"))]);
    assert_eq!(routed(&mut t, X, "", Some(&zip_report)), vec![2]);
}

// ---------------------------------------------------------------- bindings

#[test]
fn bind_is_idempotent_and_args_are_identity() {
    let mut t = with_exchange(ExchangeKind::Topic);
    let args = table(&[("a", AMQPValue::Double(1.5))]);
    assert!(t.bind(X, q(1), b"k", &args).unwrap());
    assert!(!t.bind(X, q(1), b"k", &args).unwrap());
    assert_eq!(t.binding_count(), 1);
    assert!(t.binding_exists(X, q(1), b"k", &args));
    assert!(!t.binding_exists(X, q(1), b"k", &no_args()));
    // The same value under another type is another binding.
    let other_type = table(&[("a", AMQPValue::Float(1.5))]);
    assert!(t.bind(X, q(1), b"k", &other_type).unwrap());
    assert_eq!(t.binding_count(), 2);
}

#[test]
fn unbind_of_a_missing_binding_succeeds_and_says_so() {
    let mut t = with_exchange(ExchangeKind::Direct);
    let outcome = t.unbind(X, q(1), b"k", &no_args()).unwrap();
    assert_eq!(
        outcome,
        Unbound {
            existed: false,
            source_unused: false
        }
    );
    t.bind(X, q(1), b"k", &no_args()).unwrap();
    t.bind(X, q(2), b"k", &no_args()).unwrap();
    let outcome = t.unbind(X, q(1), b"k", &no_args()).unwrap();
    assert_eq!(
        outcome,
        Unbound {
            existed: true,
            source_unused: false
        }
    );
    let outcome = t.unbind(X, q(2), b"k", &no_args()).unwrap();
    assert_eq!(
        outcome,
        Unbound {
            existed: true,
            source_unused: true
        }
    );
    assert_eq!(routed(&mut t, X, "k", None), Vec::<u32>::new());
    assert!(!t.has_bindings_as_source(X));
}

#[test]
fn missing_exchanges_are_not_found() {
    let mut t = with_exchange(ExchangeKind::Direct);
    let err = t.bind(Y, q(1), b"", &no_args()).unwrap_err();
    assert_eq!(err, RoutingError::ExchangeNotFound(Y));
    assert_eq!(err.reply_code(), 404);
    assert_eq!(
        t.bind(X, x(Y), b"", &no_args()),
        Err(RoutingError::ExchangeNotFound(Y))
    );
    assert_eq!(
        t.unbind(Y, q(1), b"", &no_args()),
        Err(RoutingError::ExchangeNotFound(Y))
    );
    assert_eq!(
        t.route(Y, b"", None, &mut Vec::new()),
        Err(RoutingError::ExchangeNotFound(Y))
    );
    assert_eq!(t.delete_exchange(Y), Err(RoutingError::ExchangeNotFound(Y)));
    assert_eq!(
        t.set_alternate_exchange(Y, None),
        Err(RoutingError::ExchangeNotFound(Y))
    );
    assert_eq!(
        t.declare_exchange(X, ExchangeKind::Fanout),
        Err(RoutingError::ExchangeAlreadyDeclared(X))
    );
}

#[test]
fn limits_are_enforced() {
    let mut t = with_exchange(ExchangeKind::Direct);
    let long = vec![b'a'; KEY_BYTES_MAX + 1];
    assert_eq!(
        t.bind(X, q(1), &long, &no_args()),
        Err(RoutingError::KeyTooLong {
            bytes: KEY_BYTES_MAX + 1
        })
    );
    assert!(t.bind(X, q(1), &long[..KEY_BYTES_MAX], &no_args()).unwrap());
    assert_eq!(
        t.bind(X, q(ID_COUNT_MAX), b"", &no_args()),
        Err(RoutingError::IdOutOfRange(ID_COUNT_MAX))
    );
    assert_eq!(
        t.declare_exchange(ExchangeId(ID_COUNT_MAX), ExchangeKind::Direct),
        Err(RoutingError::IdOutOfRange(ID_COUNT_MAX))
    );
}

#[test]
fn removing_a_queue_removes_its_bindings_and_reports_emptied_sources() {
    let mut t = with_exchange(ExchangeKind::Direct);
    t.declare_exchange(Y, ExchangeKind::Topic).unwrap();
    t.declare_exchange(Z, ExchangeKind::Fanout).unwrap();
    t.bind(X, q(1), b"a", &no_args()).unwrap();
    t.bind(X, q(1), b"b", &no_args()).unwrap();
    t.bind(Y, q(1), b"#", &no_args()).unwrap();
    t.bind(Y, q(2), b"#", &no_args()).unwrap();
    t.bind(Z, q(1), b"", &no_args()).unwrap();
    assert_eq!(t.destination_binding_count(q(1)), 4);
    let mut unused = t.remove_destination(q(1)).unwrap();
    unused.sort();
    assert_eq!(unused, vec![X, Z]);
    assert_eq!(t.binding_count(), 1);
    assert!(!t.has_bindings_as_destination(q(1)));
    assert_eq!(routed(&mut t, Y, "a", None), vec![2]);
    assert_eq!(t.remove_destination(q(1)).unwrap(), vec![]);
    t.assert_consistent();
}

#[test]
fn deleting_an_exchange_removes_its_bindings_on_both_sides() {
    let mut t = with_exchange(ExchangeKind::Fanout);
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.declare_exchange(Z, ExchangeKind::Fanout).unwrap();
    t.bind(X, x(Y), b"", &no_args()).unwrap(); // X's only binding
    t.bind(Z, x(Y), b"", &no_args()).unwrap();
    t.bind(Z, q(9), b"", &no_args()).unwrap(); // Z keeps this one
    t.bind(Y, q(1), b"", &no_args()).unwrap();
    t.bind(Y, x(Y), b"", &no_args()).unwrap(); // self-binding
    assert!(t.has_bindings_as_destination(x(Y)));
    assert_eq!(t.delete_exchange(Y).unwrap(), vec![X]);
    assert_eq!(t.exchange_count(), 2);
    assert_eq!(t.binding_count(), 1);
    assert!(!t.has_bindings_as_source(X));
    assert_eq!(t.bindings_of_destination(q(1)).count(), 0);
    assert_eq!(routed(&mut t, Z, "", None), vec![9]);
    t.assert_consistent();
    // The id can be declared again, empty.
    t.declare_exchange(Y, ExchangeKind::Direct).unwrap();
    assert_eq!(t.source_binding_count(Y), 0);
}

#[test]
fn remove_destination_of_an_exchange_keeps_its_bindings_as_source() {
    let mut t = with_exchange(ExchangeKind::Fanout);
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.bind(X, x(Y), b"", &no_args()).unwrap();
    t.bind(Y, q(1), b"", &no_args()).unwrap();
    assert_eq!(t.remove_destination(x(Y)).unwrap(), vec![X]);
    assert_eq!(routed(&mut t, Y, "", None), vec![1]);
    assert_eq!(
        t.remove_destination(x(Z)),
        Err(RoutingError::ExchangeNotFound(Z))
    );
}

#[test]
fn bindings_are_listed_by_source_and_destination() {
    let mut t = with_exchange(ExchangeKind::Direct);
    t.declare_exchange(Y, ExchangeKind::Topic).unwrap();
    let args = table(&[("a", s("b"))]);
    t.bind(X, q(1), b"k1", &args).unwrap();
    t.bind(X, x(Y), b"k2", &no_args()).unwrap();
    t.bind(Y, q(1), b"k3", &no_args()).unwrap();
    let mut of_x: Vec<(Destination, Vec<u8>)> = t
        .bindings_of_source(X)
        .map(|b| (b.destination, b.key.to_vec()))
        .collect();
    of_x.sort();
    assert_eq!(of_x, vec![(q(1), b"k1".to_vec()), (x(Y), b"k2".to_vec())]);
    let mut to_q1: Vec<ExchangeId> = t.bindings_of_destination(q(1)).map(|b| b.source).collect();
    to_q1.sort();
    assert_eq!(to_q1, vec![X, Y]);
    let with_args = t.bindings_of_source(X).find(|b| b.key == b"k1").unwrap();
    assert_eq!(with_args.args_table(), args);
    assert_eq!(with_args.args.len(), 1);
    assert_eq!(t.bindings().count(), 3);
    assert_eq!(t.bindings_of_source(Z).count(), 0);
    assert_eq!(t.source_binding_count(X), 2);
    assert_eq!(t.destination_binding_count(x(Y)), 1);
}

// ---------------------------------------------------------------- exchange to exchange

#[test]
fn exchange_to_exchange_bindings_are_followed() {
    let mut t = with_exchange(ExchangeKind::Topic);
    t.declare_exchange(Y, ExchangeKind::Direct).unwrap();
    t.declare_exchange(Z, ExchangeKind::Fanout).unwrap();
    t.bind(X, x(Y), b"logs.#", &no_args()).unwrap();
    t.bind(Y, x(Z), b"logs.error", &no_args()).unwrap();
    t.bind(Y, q(1), b"logs.info", &no_args()).unwrap();
    t.bind(Z, q(2), b"", &no_args()).unwrap();
    t.bind(Z, q(3), b"", &no_args()).unwrap();
    assert_eq!(routed(&mut t, X, "logs.error", None), vec![2, 3]);
    assert_eq!(routed(&mut t, X, "logs.info", None), vec![1]);
    assert_eq!(routed(&mut t, X, "metrics", None), Vec::<u32>::new());
}

#[test]
fn cycles_terminate_and_deliver_each_queue_once() {
    let mut t = with_exchange(ExchangeKind::Fanout);
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.declare_exchange(Z, ExchangeKind::Topic).unwrap();
    t.bind(X, x(Y), b"", &no_args()).unwrap();
    t.bind(Y, x(Z), b"", &no_args()).unwrap();
    t.bind(Z, x(X), b"#", &no_args()).unwrap();
    t.bind(X, x(X), b"", &no_args()).unwrap();
    t.bind(X, q(1), b"", &no_args()).unwrap();
    t.bind(Y, q(1), b"", &no_args()).unwrap();
    t.bind(Z, q(2), b"a.*", &no_args()).unwrap();
    for start in [X, Y, Z] {
        assert_eq!(routed(&mut t, start, "a.b", None), vec![1, 2]);
        assert_eq!(routed(&mut t, start, "c", None), vec![1]);
    }
}

#[test]
fn diamond_delivers_once() {
    let mut t = with_exchange(ExchangeKind::Fanout);
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.declare_exchange(Z, ExchangeKind::Fanout).unwrap();
    t.bind(X, x(Y), b"", &no_args()).unwrap();
    t.bind(X, x(Z), b"", &no_args()).unwrap();
    t.bind(Y, q(5), b"", &no_args()).unwrap();
    t.bind(Z, q(5), b"", &no_args()).unwrap();
    assert_eq!(routed(&mut t, X, "", None), vec![5]);
}

// ---------------------------------------------------------------- alternate exchanges

#[test]
fn alternate_exchange_takes_unroutable_messages() {
    let mut t = with_exchange(ExchangeKind::Direct);
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.bind(X, q(1), b"known", &no_args()).unwrap();
    t.bind(Y, q(2), b"", &no_args()).unwrap();
    t.set_alternate_exchange(X, Some(Y)).unwrap();
    assert_eq!(t.alternate_exchange(X), Some(Y));
    assert_eq!(routed(&mut t, X, "known", None), vec![1]);
    assert_eq!(routed(&mut t, X, "unknown", None), vec![2]);
    t.set_alternate_exchange(X, None).unwrap();
    assert_eq!(routed(&mut t, X, "unknown", None), Vec::<u32>::new());
}

#[test]
fn alternate_exchange_chains_and_cycles() {
    let mut t = with_exchange(ExchangeKind::Direct);
    t.declare_exchange(Y, ExchangeKind::Direct).unwrap();
    t.declare_exchange(Z, ExchangeKind::Topic).unwrap();
    t.set_alternate_exchange(X, Some(Y)).unwrap();
    t.set_alternate_exchange(Y, Some(Z)).unwrap();
    t.set_alternate_exchange(Z, Some(X)).unwrap();
    t.bind(Z, q(3), b"z.*", &no_args()).unwrap();
    t.bind(Y, q(2), b"y", &no_args()).unwrap();
    assert_eq!(routed(&mut t, X, "z.1", None), vec![3]);
    assert_eq!(routed(&mut t, X, "y", None), vec![2]);
    // X -> Y -> Z -> X: nothing matches anywhere, and the walk ends.
    assert_eq!(routed(&mut t, X, "nowhere", None), Vec::<u32>::new());
    assert_eq!(routed(&mut t, Z, "y", None), vec![2]);
}

#[test]
fn alternate_exchange_is_not_used_when_a_binding_matched() {
    // RabbitMQ hands a message to X's alternate only when X's own bindings matched nothing,
    // even if what they matched (here exchange Y) then routes nowhere.
    let mut t = with_exchange(ExchangeKind::Fanout);
    t.declare_exchange(Y, ExchangeKind::Direct).unwrap();
    t.declare_exchange(Z, ExchangeKind::Fanout).unwrap();
    t.bind(X, x(Y), b"", &no_args()).unwrap();
    t.bind(Z, q(9), b"", &no_args()).unwrap();
    t.set_alternate_exchange(X, Some(Z)).unwrap();
    assert_eq!(routed(&mut t, X, "k", None), Vec::<u32>::new());
    // Y's own alternate does apply.
    t.set_alternate_exchange(Y, Some(Z)).unwrap();
    assert_eq!(routed(&mut t, X, "k", None), vec![9]);
}

#[test]
fn deleting_an_alternate_clears_it_until_the_broker_sets_it_again() {
    let mut t = with_exchange(ExchangeKind::Direct);
    assert_eq!(
        t.set_alternate_exchange(X, Some(Y)),
        Err(RoutingError::ExchangeNotFound(Y))
    );
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.bind(Y, q(4), b"", &no_args()).unwrap();
    t.set_alternate_exchange(X, Some(Y)).unwrap();
    assert_eq!(routed(&mut t, X, "k", None), vec![4]);
    t.delete_exchange(Y).unwrap();
    assert_eq!(t.alternate_exchange(X), None);
    assert_eq!(routed(&mut t, X, "k", None), Vec::<u32>::new());
    // The id is reused for another exchange: it must not become X's alternate by accident.
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.bind(Y, q(5), b"", &no_args()).unwrap();
    assert_eq!(routed(&mut t, X, "k", None), Vec::<u32>::new());
    t.set_alternate_exchange(X, Some(Y)).unwrap();
    assert_eq!(routed(&mut t, X, "k", None), vec![5]);
}

#[test]
fn changing_an_alternate_forgets_the_old_one() {
    let mut t = with_exchange(ExchangeKind::Direct);
    t.declare_exchange(Y, ExchangeKind::Fanout).unwrap();
    t.declare_exchange(Z, ExchangeKind::Fanout).unwrap();
    t.set_alternate_exchange(X, Some(Y)).unwrap();
    t.set_alternate_exchange(X, Some(Z)).unwrap();
    // Deleting the old alternate must leave X's new one alone.
    t.delete_exchange(Y).unwrap();
    assert_eq!(t.alternate_exchange(X), Some(Z));
    // An exchange deleted while it has an alternate unregisters from it.
    t.delete_exchange(X).unwrap();
    t.declare_exchange(X, ExchangeKind::Direct).unwrap();
    t.delete_exchange(Z).unwrap();
    assert_eq!(t.alternate_exchange(X), None);
    // An exchange may be its own alternate; deleting it is fine.
    t.set_alternate_exchange(X, Some(X)).unwrap();
    assert_eq!(routed(&mut t, X, "k", None), Vec::<u32>::new());
    t.delete_exchange(X).unwrap();
}

#[test]
fn route_appends_without_looking_at_previous_output() {
    let mut t = with_exchange(ExchangeKind::Fanout);
    t.bind(X, q(1), b"", &no_args()).unwrap();
    let mut out = vec![QueueId(1)];
    t.route(X, b"", None, &mut out).unwrap();
    assert_eq!(out, vec![QueueId(1), QueueId(1)]);
    // Marks from one call do not leak into the next.
    out.clear();
    t.route(X, b"", None, &mut out).unwrap();
    assert_eq!(out, vec![QueueId(1)]);
}

#[test]
fn epoch_wraparound_resets_marks() {
    let mut t = with_exchange(ExchangeKind::Topic);
    t.bind(X, q(1), b"a.#", &no_args()).unwrap();
    t.route_scratch.epoch = u32::MAX - 1;
    t.route_scratch.topic.set_epoch_for_test(u32::MAX - 1);
    for _ in 0..4 {
        assert_eq!(routed(&mut t, X, "a.b", None), vec![1]);
    }
}

// ---------------------------------------------------------------- property tests

/// RabbitMQ's split: zero words for the empty key.
fn naive_words(key: &str) -> Vec<&str> {
    if key.is_empty() {
        Vec::new()
    } else {
        key.split('.').collect()
    }
}

/// The textbook recursive matcher; exponential on many `#`, fine on small keys.
fn naive_topic_match(pattern: &[&str], words: &[&str]) -> bool {
    match pattern.split_first() {
        None => words.is_empty(),
        Some((&"#", rest)) => (0..=words.len()).any(|skip| naive_topic_match(rest, &words[skip..])),
        Some((p, rest)) => match words.split_first() {
            Some((w, words_rest)) => (*p == "*" || p == w) && naive_topic_match(rest, words_rest),
            None => false,
        },
    }
}

fn topic_key(
    words: impl Strategy<Value = String>,
    max_words: usize,
) -> impl Strategy<Value = String> {
    prop::collection::vec(words, 0..=max_words).prop_map(|w| w.join("."))
}

fn binding_word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just(String::new()),
        Just("*".to_string()),
        Just("#".to_string()),
    ]
}

fn routing_word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just(String::new()),
        Just("c".to_string())
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn topic_trie_agrees_with_naive_matcher(
        binding_keys in prop::collection::vec(topic_key(binding_word(), 5), 1..24),
        routing_keys in prop::collection::vec(topic_key(routing_word(), 6), 1..16),
    ) {
        let mut t = with_exchange(ExchangeKind::Topic);
        for (i, k) in binding_keys.iter().enumerate() {
            t.bind(X, q(i as u32), k.as_bytes(), &no_args()).unwrap();
        }
        for rk in &routing_keys {
            let expected: Vec<u32> = binding_keys
                .iter()
                .enumerate()
                .filter(|(_, bk)| naive_topic_match(&naive_words(bk), &naive_words(rk)))
                .map(|(i, _)| i as u32)
                .collect();
            prop_assert_eq!(routed(&mut t, X, rk, None), expected, "routing key {:?}", rk);
        }
    }
}

/// One command of the model-based test. Exchanges 0..4 are direct, topic, fanout, headers;
/// queue ids are 0..4 too.
#[derive(Debug, Clone)]
enum Command {
    Bind {
        source: u32,
        destination: Destination,
        key: usize,
        args: usize,
    },
    Unbind {
        source: u32,
        destination: Destination,
        key: usize,
        args: usize,
    },
    RemoveQueue(u32),
    RecreateExchange(u32),
    SetAlternate(u32, Option<u32>),
    Route {
        source: u32,
        key: usize,
        headers: Option<usize>,
    },
}

const MODEL_KEYS: [&str; 6] = ["a", "b", "a.b", "#", "*.b", ""];
const MODEL_KINDS: [ExchangeKind; 4] = [
    ExchangeKind::Direct,
    ExchangeKind::Topic,
    ExchangeKind::Fanout,
    ExchangeKind::Headers,
];

/// Binding arguments: identity only, except on the headers exchange (id 3).
fn model_args(index: usize) -> FieldTable {
    match index {
        0 => FieldTable::default(),
        1 => table(&[("v", AMQPValue::LongInt(1))]),
        _ => table(&[
            ("x-match", s("any")),
            ("v", AMQPValue::LongLongInt(2)),
            ("w", AMQPValue::Void),
        ]),
    }
}

fn model_headers(index: usize) -> FieldTable {
    match index {
        0 => table(&[("v", AMQPValue::Double(1.0))]),
        1 => table(&[("v", AMQPValue::LongLongInt(2))]),
        _ => table(&[("w", s("z"))]),
    }
}

fn destination() -> impl Strategy<Value = Destination> {
    prop_oneof![
        (0u32..4).prop_map(|i| Destination::Queue(QueueId(i))),
        (0u32..4).prop_map(|i| Destination::Exchange(ExchangeId(i))),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        4 => (0u32..4, destination(), 0..MODEL_KEYS.len(), 0usize..3)
            .prop_map(|(source, destination, key, args)| Command::Bind { source, destination, key, args }),
        3 => (0u32..4, destination(), 0..MODEL_KEYS.len(), 0usize..3)
            .prop_map(|(source, destination, key, args)| Command::Unbind { source, destination, key, args }),
        1 => (0u32..4).prop_map(Command::RemoveQueue),
        1 => (0u32..4).prop_map(Command::RecreateExchange),
        1 => (0u32..4, prop::option::of(0u32..4)).prop_map(|(x, a)| Command::SetAlternate(x, a)),
        3 => (0u32..4, 0..MODEL_KEYS.len(), prop::option::of(0usize..3))
            .prop_map(|(source, key, headers)| Command::Route { source, key, headers }),
    ]
}

#[derive(Debug, Default)]
struct Model {
    /// (source, destination, key index, args index), no duplicates.
    bindings: Vec<(u32, Destination, usize, usize)>,
    alternates: [Option<u32>; 4],
}

impl Model {
    fn matches(
        source: u32,
        binding_key: &str,
        args: usize,
        routing_key: &str,
        headers: &FieldTable,
    ) -> bool {
        match MODEL_KINDS[source as usize] {
            ExchangeKind::Direct => binding_key == routing_key,
            ExchangeKind::Fanout => true,
            ExchangeKind::Topic => {
                naive_topic_match(&naive_words(binding_key), &naive_words(routing_key))
            }
            ExchangeKind::Headers => naive_headers_match(&model_args(args), headers),
        }
    }

    /// RabbitMQ's route1: a work list, a seen set, alternates for exchanges that matched nothing.
    fn route(&self, start: u32, routing_key: &str, headers: &FieldTable) -> Vec<u32> {
        let mut seen = vec![start];
        let mut work = vec![start];
        let mut queues = Vec::new();
        while let Some(current) = work.pop() {
            let matched: Vec<Destination> = self
                .bindings
                .iter()
                .filter(|(s, _, k, a)| {
                    *s == current
                        && Self::matches(current, MODEL_KEYS[*k], *a, routing_key, headers)
                })
                .map(|(_, d, _, _)| *d)
                .collect();
            if matched.is_empty() {
                if let Some(alternate) = self.alternates[current as usize] {
                    if !seen.contains(&alternate) {
                        seen.push(alternate);
                        work.push(alternate);
                    }
                }
            }
            for d in matched {
                match d {
                    Destination::Queue(q) => queues.push(q.0),
                    Destination::Exchange(x) => {
                        if !seen.contains(&x.0) {
                            seen.push(x.0);
                            work.push(x.0);
                        }
                    }
                }
            }
        }
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    fn has_source(&self, source: u32) -> bool {
        self.bindings.iter().any(|b| b.0 == source)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn table_agrees_with_vec_model(commands in prop::collection::vec(command(), 1..80)) {
        let mut t = RoutingTable::new();
        for (i, kind) in MODEL_KINDS.iter().enumerate() {
            t.declare_exchange(ExchangeId(i as u32), *kind).unwrap();
        }
        let mut model = Model::default();
        for command in commands {
            match command {
                Command::Bind { source, destination, key, args } => {
                    let created = t
                        .bind(ExchangeId(source), destination, MODEL_KEYS[key].as_bytes(), &model_args(args))
                        .unwrap();
                    let entry = (source, destination, key, args);
                    prop_assert_eq!(created, !model.bindings.contains(&entry));
                    if created {
                        model.bindings.push(entry);
                    }
                }
                Command::Unbind { source, destination, key, args } => {
                    let outcome = t
                        .unbind(ExchangeId(source), destination, MODEL_KEYS[key].as_bytes(), &model_args(args))
                        .unwrap();
                    let entry = (source, destination, key, args);
                    let existed = model.bindings.contains(&entry);
                    model.bindings.retain(|b| *b != entry);
                    prop_assert_eq!(outcome.existed, existed);
                    prop_assert_eq!(outcome.source_unused, existed && !model.has_source(source));
                }
                Command::RemoveQueue(queue) => {
                    let destination = Destination::Queue(QueueId(queue));
                    let mut unused = t.remove_destination(destination).unwrap();
                    unused.sort();
                    let sources_before: Vec<u32> = (0..4).filter(|s| model.has_source(*s)).collect();
                    model.bindings.retain(|b| b.1 != destination);
                    let expected: Vec<ExchangeId> = sources_before
                        .into_iter()
                        .filter(|s| !model.has_source(*s))
                        .map(ExchangeId)
                        .collect();
                    prop_assert_eq!(unused, expected);
                }
                Command::RecreateExchange(id) => {
                    prop_assert_eq!(
                        t.alternate_exchange(ExchangeId(id)),
                        model.alternates[id as usize].map(ExchangeId)
                    );
                    let mut unused = t.delete_exchange(ExchangeId(id)).unwrap();
                    unused.sort();
                    let sources_before: Vec<u32> = (0..4).filter(|s| *s != id && model.has_source(*s)).collect();
                    let gone = Destination::Exchange(ExchangeId(id));
                    model.bindings.retain(|b| b.0 != id && b.1 != gone);
                    let expected: Vec<ExchangeId> = sources_before
                        .into_iter()
                        .filter(|s| !model.has_source(*s))
                        .map(ExchangeId)
                        .collect();
                    prop_assert_eq!(unused, expected);
                    t.declare_exchange(ExchangeId(id), MODEL_KINDS[id as usize]).unwrap();
                    prop_assert_eq!(t.alternate_exchange(ExchangeId(id)), None);
                    model.alternates[id as usize] = None;
                    // Exchanges that had this one as alternate lose it.
                    for alternate in model.alternates.iter_mut() {
                        if *alternate == Some(id) {
                            *alternate = None;
                        }
                    }
                }
                Command::SetAlternate(id, alternate) => {
                    t.set_alternate_exchange(ExchangeId(id), alternate.map(ExchangeId)).unwrap();
                    model.alternates[id as usize] = alternate;
                }
                Command::Route { source, key, headers } => {
                    let headers = headers.map(model_headers);
                    let empty = FieldTable::default();
                    prop_assert_eq!(
                        routed(&mut t, ExchangeId(source), MODEL_KEYS[key], headers.as_ref()),
                        model.route(source, MODEL_KEYS[key], headers.as_ref().unwrap_or(&empty))
                    );
                }
            }
            t.assert_consistent();
            prop_assert_eq!(t.binding_count(), model.bindings.len());
            for s in 0..4 {
                prop_assert_eq!(
                    t.alternate_exchange(ExchangeId(s)),
                    model.alternates[s as usize].map(ExchangeId)
                );
                prop_assert_eq!(t.has_bindings_as_source(ExchangeId(s)), model.has_source(s));
                prop_assert_eq!(
                    t.destination_binding_count(Destination::Exchange(ExchangeId(s))),
                    model.bindings.iter().filter(|b| b.1 == Destination::Exchange(ExchangeId(s))).count()
                );
            }
            for (source, destination, key, args) in &model.bindings {
                prop_assert!(t.binding_exists(ExchangeId(*source), *destination, MODEL_KEYS[*key].as_bytes(), &model_args(*args)));
            }
        }
    }
}

/// Values for the headers property test: equal and unequal across types, as Erlang sees them.
fn header_value() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        Just(AMQPValue::LongInt(1)),
        Just(AMQPValue::Double(1.0)),
        Just(AMQPValue::LongLongInt(2)),
        Just(s("1")),
        Just(s("z")),
        Just(AMQPValue::ByteArray(b"z".to_vec().into())),
        Just(AMQPValue::Boolean(true)),
        Just(AMQPValue::Void),
    ]
}

/// The values above as the Erlang terms RabbitMQ compares, written out by hand.
fn naive_term(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongInt(1) | AMQPValue::Double(1.0) => "num:1".into(),
        AMQPValue::LongLongInt(2) => "num:2".into(),
        AMQPValue::LongString(x) => format!("bin:{}", String::from_utf8_lossy(x.as_bytes())),
        AMQPValue::ByteArray(x) => format!("bin:{}", String::from_utf8_lossy(x.as_slice())),
        AMQPValue::Boolean(true) => "atom:true".into(),
        AMQPValue::Void => "undefined".into(),
        other => panic!("not in the generator: {other:?}"),
    }
}

/// A transcription of RabbitMQ's `headers_match/5` merge over sorted keys.
fn naive_headers_match(args: &FieldTable, headers: &FieldTable) -> bool {
    let mode = match args.inner().get("x-match") {
        Some(AMQPValue::LongString(m)) => m.to_string(),
        _ => "all".to_string(),
    };
    let with_x = mode.ends_with("-with-x");
    let all = mode.starts_with("all");
    let pattern: Vec<(&str, &AMQPValue)> =
        args.inner().iter().map(|(k, v)| (k.as_str(), v)).collect();
    let data: Vec<(&str, &AMQPValue)> = headers
        .inner()
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let (mut all_match, mut any_match) = (true, false);
    let (mut p, mut d) = (0, 0);
    while p < pattern.len() {
        let (pk, pv) = pattern[p];
        if pk == "x-match" || (!with_x && pk.starts_with("x-")) {
            p += 1;
            continue;
        }
        if d == data.len() {
            all_match = false;
            break;
        }
        let (dk, dv) = data[d];
        if pk > dk {
            d += 1;
        } else if pk < dk {
            all_match = false;
            p += 1;
        } else {
            if matches!(pv, AMQPValue::Void) || naive_term(pv) == naive_term(dv) {
                any_match = true;
            } else {
                all_match = false;
            }
            p += 1;
            d += 1;
        }
    }
    if all {
        all_match
    } else {
        any_match
    }
}

fn header_table(max: usize) -> impl Strategy<Value = FieldTable> {
    prop::collection::vec(
        (
            prop::sample::select(vec!["a", "b", "c", "x-d"]),
            header_value(),
        ),
        0..=max,
    )
    .prop_map(|entries| {
        let mut t = FieldTable::default();
        for (k, v) in entries {
            t.insert(k.into(), v);
        }
        t
    })
}

fn binding_args() -> impl Strategy<Value = FieldTable> {
    let mode = prop::option::of(prop::sample::select(vec![
        "all",
        "any",
        "all-with-x",
        "any-with-x",
    ]));
    (mode, header_table(3)).prop_map(|(mode, mut t)| {
        if let Some(mode) = mode {
            t.insert("x-match".into(), s(mode));
        }
        t
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn headers_index_agrees_with_rabbitmq_merge(
        args in prop::collection::vec(binding_args(), 1..24),
        mut removed in prop::collection::vec(any::<bool>(), 24),
        rebound in prop::collection::vec(any::<bool>(), 24),
        messages in prop::collection::vec(prop::option::of(header_table(4)), 1..12),
    ) {
        let mut t = with_exchange(ExchangeKind::Headers);
        for (i, a) in args.iter().enumerate() {
            t.bind(X, q(i as u32), b"", a).unwrap();
        }
        for (i, a) in args.iter().enumerate() {
            if removed[i] {
                prop_assert!(t.unbind(X, q(i as u32), b"", a).unwrap().existed);
                t.assert_consistent();
            }
        }
        // Binding again reuses freed slots and refiles anchors among the survivors.
        for (i, a) in args.iter().enumerate().rev() {
            if removed[i] && rebound[i] {
                prop_assert!(t.bind(X, q(i as u32), b"", a).unwrap());
                removed[i] = false;
                t.assert_consistent();
            }
        }
        for headers in &messages {
            let empty = FieldTable::default();
            let expected: Vec<u32> = args
                .iter()
                .enumerate()
                .filter(|(i, a)| !removed[*i] && naive_headers_match(a, headers.as_ref().unwrap_or(&empty)))
                .map(|(i, _)| i as u32)
                .collect();
            prop_assert_eq!(routed(&mut t, X, "", headers.as_ref()), expected, "headers {:?}", headers);
        }
    }
}

#[test]
fn route_with_caller_scratch_through_a_shared_reference() {
    let mut t = with_exchange(ExchangeKind::Topic);
    let mut early = RouteScratch::new();
    let mut out = Vec::new();
    t.route_with(&mut early, X, b"a", None, &mut out).unwrap();
    assert!(out.is_empty());
    // The table grows after the scratch was sized: route_with must grow the scratch.
    t.declare_exchange(ExchangeId(500), ExchangeKind::Fanout)
        .unwrap();
    t.bind(X, x(ExchangeId(500)), b"a.#", &no_args()).unwrap();
    t.bind(ExchangeId(500), q(70_000), b"", &no_args()).unwrap();
    t.bind(X, q(3), b"*", &no_args()).unwrap();
    let shared: &RoutingTable = &t;
    let mut late = RouteScratch::new();
    for use_late in [false, true, false] {
        let scratch = if use_late { &mut late } else { &mut early };
        out.clear();
        shared.route_with(scratch, X, b"a", None, &mut out).unwrap();
        out.sort();
        assert_eq!(out, vec![QueueId(3), QueueId(70_000)]);
    }
    let threads: Vec<u32> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut scratch = RouteScratch::new();
                    let mut out = Vec::new();
                    shared
                        .route_with(&mut scratch, X, b"a.b", None, &mut out)
                        .unwrap();
                    out.len() as u32
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(threads, vec![1, 1]);
}

#[test]
fn several_routing_keys_are_one_walk_as_with_cc_headers() {
    let mut t = with_exchange(ExchangeKind::Direct);
    t.declare_exchange(Y, ExchangeKind::Topic).unwrap();
    t.declare_exchange(Z, ExchangeKind::Fanout).unwrap();
    t.bind(X, q(1), b"k1", &no_args()).unwrap();
    t.bind(X, q(1), b"k2", &no_args()).unwrap();
    t.bind(X, x(Y), b"k3", &no_args()).unwrap();
    t.bind(Y, q(2), b"k1", &no_args()).unwrap();
    t.bind(Y, q(3), b"*", &no_args()).unwrap();
    t.bind(Z, q(9), b"", &no_args()).unwrap();
    t.set_alternate_exchange(X, Some(Z)).unwrap();
    t.set_alternate_exchange(Y, Some(Z)).unwrap();
    let route = |t: &RoutingTable, keys: &[&[u8]]| {
        let mut out = Vec::new();
        t.route_keys_with(&mut RouteScratch::new(), X, keys, None, &mut out)
            .unwrap();
        out.sort();
        out.into_iter().map(|q| q.0).collect::<Vec<u32>>()
    };
    // k1 and k2 both reach queue 1: once. "nope" alone would go to the alternate, but
    // another key matched, so the alternate is not used (one walk, not one per key).
    assert_eq!(route(&t, &[b"k1", b"k2", b"nope"]), vec![1]);
    assert_eq!(route(&t, &[b"nope"]), vec![9]);
    // Y sees every key too: k3 brings the message to Y, where k1 and `*` match.
    assert_eq!(route(&t, &[b"k3", b"k1"]), vec![1, 2, 3]);
    assert_eq!(route(&t, &[]), vec![9]);
    let mut out = Vec::new();
    t.route_keys(X, &[b"k2", b"k3", b"k1"], None, &mut out)
        .unwrap();
    out.sort();
    assert_eq!(out, [QueueId(1), QueueId(2), QueueId(3)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Interleaved binds and unbinds of random topic keys keep the trie equal to the naive
    /// matcher over the live bindings, and removing everything prunes it to its root.
    #[test]
    fn topic_trie_survives_interleaved_bind_unbind(
        ops in prop::collection::vec((any::<bool>(), 0u32..6, topic_key(binding_word(), 4)), 1..60),
        routing_keys in prop::collection::vec(topic_key(routing_word(), 5), 1..8),
    ) {
        let mut t = with_exchange(ExchangeKind::Topic);
        let mut live: Vec<(u32, String)> = Vec::new();
        for (bind, queue, key) in ops {
            let entry = (queue, key.clone());
            if bind {
                let created = t.bind(X, q(queue), key.as_bytes(), &no_args()).unwrap();
                prop_assert_eq!(created, !live.contains(&entry));
                if created {
                    live.push(entry);
                }
            } else {
                let outcome = t.unbind(X, q(queue), key.as_bytes(), &no_args()).unwrap();
                prop_assert_eq!(outcome.existed, live.contains(&entry));
                live.retain(|e| *e != entry);
            }
            t.assert_consistent();
        }
        for rk in &routing_keys {
            let mut expected: Vec<u32> = live
                .iter()
                .filter(|(_, bk)| naive_topic_match(&naive_words(bk), &naive_words(rk)))
                .map(|(queue, _)| *queue)
                .collect();
            expected.sort_unstable();
            expected.dedup();
            prop_assert_eq!(routed(&mut t, X, rk, None), expected, "routing key {:?}", rk);
        }
        for (queue, key) in &live {
            prop_assert!(t.unbind(X, q(*queue), key.as_bytes(), &no_args()).unwrap().existed);
        }
        let Some(Exchange { index: Index::Topic(trie), .. }) = t.exchange(X) else {
            panic!("topic exchange")
        };
        prop_assert_eq!(trie.node_count(), 1);
    }
}

#[test]
fn removing_every_queue_leaves_every_index_empty() {
    let mut t = RoutingTable::new();
    let kinds = [
        ExchangeKind::Direct,
        ExchangeKind::Topic,
        ExchangeKind::Fanout,
        ExchangeKind::Headers,
    ];
    for (i, kind) in kinds.iter().enumerate() {
        t.declare_exchange(ExchangeId(i as u32), *kind).unwrap();
    }
    for queue in 0..2_000u32 {
        for (i, _) in kinds.iter().enumerate() {
            let key = format!("k{}.{}", queue % 7, queue);
            let args = table(&[("k", AMQPValue::LongInt((queue % 5) as i32))]);
            t.bind(ExchangeId(i as u32), q(queue), key.as_bytes(), &args)
                .unwrap();
        }
    }
    assert_eq!(t.binding_count(), 8_000);
    let mut emptied = Vec::new();
    for queue in (0..2_000u32).rev() {
        emptied.extend(t.remove_destination(q(queue)).unwrap());
    }
    emptied.sort();
    assert_eq!(emptied, (0..4).map(ExchangeId).collect::<Vec<_>>());
    t.assert_consistent();
    assert_eq!(t.binding_count(), 0);
    assert!(t.identities.is_empty());
    assert!(t.queue_bindings.is_empty());
    for (i, _) in kinds.iter().enumerate() {
        match &t.exchange(ExchangeId(i as u32)).unwrap().index {
            Index::Direct(keys) => assert!(keys.is_empty()),
            Index::Topic(trie) => assert_eq!(trie.node_count(), 1),
            Index::Headers(index) => {
                assert!(index.always.is_empty());
                assert!(index.keyed.is_empty());
            }
            Index::Fanout => {}
        }
    }
}
