//! Routing: direct, fanout.

use super::*;

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
