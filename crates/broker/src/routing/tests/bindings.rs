//! Routing: bindings.

use super::*;

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
