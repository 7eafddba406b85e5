//! Topology commands, as a cluster applies them on every node: the same commands in the same
//! order give the same state and outcomes, a refused command changes nothing, and a snapshot
//! (the state exported as commands) rebuilds exactly that state on an empty broker.

use amq_protocol_types::{AMQPValue, FieldTable};
use warren_broker::broker::Broker;
use warren_broker::command::{Command, Outcome};
use warren_broker::definitions::MetaRecord;

fn queue(name: &str, conn: u64, durable: bool, exclusive: bool, node: &str) -> Command {
    Command::QueueDeclare {
        vhost: "/".into(),
        conn,
        name: name.into(),
        durable,
        exclusive,
        auto_delete: false,
        server_named: name.starts_with("amq.gen-"),
        arguments: FieldTable::default(),
        log_id: 0x11 + 2 * name.len() as u64,
        node: node.into(),
        members: vec![],
        at_unix_ms: 0,
    }
}

fn history() -> Vec<Command> {
    let mut ttl = FieldTable::default();
    ttl.insert("x-message-ttl".into(), AMQPValue::LongUInt(60_000));
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    vec![
        Command::Meta {
            record: MetaRecord::AddVhost {
                name: "shop".into(),
            },
        },
        Command::ExchangeDeclare {
            vhost: "/".into(),
            name: "orders".into(),
            kind: "topic".into(),
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::default(),
        },
        Command::ExchangeDeclare {
            vhost: "/".into(),
            name: "scratch".into(),
            kind: "fanout".into(),
            durable: false,
            auto_delete: false,
            internal: false,
            arguments: FieldTable::default(),
        },
        queue("orders.eu", 0, true, false, "n1"),
        queue("amq.gen-abc", (2 << 40) + 7, false, true, "n2"),
        Command::QueueDeclare {
            vhost: "/".into(),
            conn: 0,
            name: "with-ttl".into(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            server_named: false,
            arguments: ttl,
            log_id: 0x31,
            node: "n3".into(),
            members: vec![],
            at_unix_ms: 0,
        },
        // A replicated queue: a snapshot must not declare it as server-named (refused for
        // quorum queues), as it once did.
        Command::QueueDeclare {
            vhost: "/".into(),
            conn: 0,
            name: "replicated".into(),
            durable: true,
            exclusive: false,
            auto_delete: false,
            server_named: false,
            arguments: quorum,
            log_id: 0x41,
            node: "n1".into(),
            members: vec!["n1".into(), "n2".into(), "n3".into()],
            at_unix_ms: 0,
        },
        Command::QueueBind {
            vhost: "/".into(),
            conn: 0,
            queue: "orders.eu".into(),
            exchange: "orders".into(),
            key: "eu.#".into(),
            arguments: FieldTable::default(),
        },
        Command::QueueBind {
            vhost: "/".into(),
            conn: (2 << 40) + 7,
            queue: "amq.gen-abc".into(),
            exchange: "scratch".into(),
            key: "".into(),
            arguments: FieldTable::default(),
        },
        Command::ExchangeBind {
            vhost: "/".into(),
            destination: "scratch".into(),
            source: "orders".into(),
            key: "#".into(),
            arguments: FieldTable::default(),
        },
    ]
}

/// The broker's state as commands, password hashes included: every broker's default user has
/// the same hash, so nodes that applied the same commands export the same definitions.
fn state(b: &Broker) -> String {
    serde_json::to_string(&b.export_commands()).unwrap()
}

#[test]
fn the_same_commands_give_every_node_the_same_state_and_outcomes() {
    let (a, b) = (Broker::new(), Broker::new());
    for c in history() {
        assert_eq!(a.execute(&c), b.execute(&c), "{c:?}");
    }
    assert_eq!(state(&a), state(&b));
    let v = a.vhost("/").unwrap();
    let v = v.lock().unwrap();
    assert_eq!(v.queue_home("orders.eu").as_deref(), Some("n1"));
    assert_eq!(v.queue_home("amq.gen-abc").as_deref(), Some("n2"));
}

#[test]
fn every_node_starts_with_the_same_default_user_hash_and_a_new_password_gets_a_fresh_salt() {
    let (a, b) = (Broker::new(), Broker::new());
    let hash = |b: &Broker| b.users.read().unwrap().password_hash("guest").unwrap();
    assert_eq!(hash(&a), hash(&b));
    assert!(a.users.read().unwrap().authenticate("guest", "guest"));
    a.users.write().unwrap().change_password("guest", "guest");
    assert_ne!(
        hash(&a),
        hash(&b),
        "a changed password keeps the fixed salt"
    );
    assert!(a.users.read().unwrap().authenticate("guest", "guest"));
}

#[test]
fn a_refused_command_is_refused_alike_and_changes_nothing() {
    let a = Broker::new();
    for c in history() {
        a.execute(&c).unwrap();
    }
    let before = state(&a);
    // Inequivalent redeclare, exclusive queue used by another connection, missing exchange.
    let refused = [
        queue("orders.eu", 0, false, false, "n1"),
        Command::QueueBind {
            vhost: "/".into(),
            conn: 99,
            queue: "amq.gen-abc".into(),
            exchange: "orders".into(),
            key: "x".into(),
            arguments: FieldTable::default(),
        },
        Command::QueueBind {
            vhost: "/".into(),
            conn: 0,
            queue: "orders.eu".into(),
            exchange: "nope".into(),
            key: "x".into(),
            arguments: FieldTable::default(),
        },
    ];
    let codes: Vec<u16> = refused
        .iter()
        .map(|c| a.execute(c).unwrap_err().code)
        .collect();
    assert_eq!(codes, vec![406, 405, 404]);
    // A server-named quorum queue is refused as on a single node, though its name was made
    // before the command was proposed.
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let named = Command::QueueDeclare {
        vhost: "/".into(),
        conn: 0,
        name: "amq.gen-q".into(),
        durable: true,
        exclusive: false,
        auto_delete: false,
        server_named: true,
        arguments: quorum,
        log_id: 0x41,
        node: "n1".into(),
        members: vec![],
        at_unix_ms: 0,
    };
    let refusal = a.execute(&named).unwrap_err();
    assert!(
        refusal.text.contains("server-named queue"),
        "{}",
        refusal.text
    );
    assert_eq!(state(&a), before);
    // Applying a declare again (a retried proposal) changes nothing either.
    assert!(matches!(
        a.execute(&queue("orders.eu", 0, true, false, "n1")),
        Ok(Outcome::QueueDeclared(_))
    ));
    assert_eq!(state(&a), before);
}

#[test]
fn a_snapshot_rebuilds_the_same_state_on_an_empty_broker() {
    let a = Broker::new();
    for c in history() {
        a.execute(&c).unwrap();
    }
    let snapshot = a.export_commands();
    let b = Broker::new();
    b.execute(&queue("left-over", 0, true, false, "n9"))
        .unwrap();
    b.clear_topology();
    for c in &snapshot {
        b.execute(c).unwrap();
    }
    assert_eq!(state(&a), state(&b));
    assert!(b.vhost("shop").is_some());
    assert!(b.users.read().unwrap().exists("guest"));
}

/// A declare carries its time: a queue's unused time (x-expires) starts when the client declared
/// it on the proposer, not when each node, its broker started at another moment, applies it.
#[test]
fn a_declared_queue_is_unused_from_the_time_its_command_carries() {
    let broker = Broker::new();
    let now = broker.now_ms();
    let mut expires = FieldTable::default();
    expires.insert("x-expires".into(), AMQPValue::LongUInt(1_000));
    let command = Command::QueueDeclare {
        vhost: "/".into(),
        conn: 0,
        name: "idle".into(),
        durable: false,
        exclusive: false,
        auto_delete: false,
        server_named: false,
        arguments: expires,
        log_id: 0,
        node: String::new(),
        members: vec![],
        // The proposer's clock reads 100 s later than this broker's.
        at_unix_ms: broker.unix_ms_at(now + 100_000),
    };
    broker.execute(&command).expect("declared");
    let vhost = broker.vhost("/").expect("default vhost");
    // Unused for 50 s by this broker's clock, which would expire it, but not yet by its own.
    vhost.lock().unwrap().tick(now + 50_000);
    assert!(vhost.lock().unwrap().queue_stats("idle").is_some());
    vhost.lock().unwrap().tick(now + 101_001);
    assert!(vhost.lock().unwrap().queue_stats("idle").is_none());
}
