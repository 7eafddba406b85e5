//! Routing: exchange to exchange.

use super::*;

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
