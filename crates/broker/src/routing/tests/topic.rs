//! Routing: topic.

use super::*;

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
