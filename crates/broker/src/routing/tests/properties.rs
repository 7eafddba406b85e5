//! Routing: property tests against naive models (a recursive topic matcher, a Vec of bindings).

use super::*;

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

    /// Of the exchanges that were sources before, those that no longer are: what the table must
    /// report as unused after a removal.
    fn no_longer_sources(&self, before: Vec<u32>) -> Vec<ExchangeId> {
        before
            .into_iter()
            .filter(|s| !self.has_source(*s))
            .map(ExchangeId)
            .collect()
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
                    prop_assert_eq!(unused, model.no_longer_sources(sources_before));
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
                    prop_assert_eq!(unused, model.no_longer_sources(sources_before));
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
