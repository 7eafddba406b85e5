//! Routing: alternate exchanges.

use super::*;

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
