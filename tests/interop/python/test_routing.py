"""Routing semantics of direct, fanout, topic and headers exchanges.

Each case publishes a set of messages and then a marker through the default exchange, so that
"nothing else arrived" is proven by the marker being next (no sleeps)."""

import pika
import pytest

from helpers import get


def routed(ch, queue):
    """Publishes a marker to queue and returns the bodies that arrived before it."""
    ch.basic_publish("", queue, b"--marker--")
    out = []
    while True:
        body = get(ch, queue)[2]
        if body == b"--marker--":
            return out
        out.append(body)


def test_direct_routes_on_exact_key_only(ch, name):
    ch.exchange_declare(name, "direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name, routing_key="a")
    for key in ["a", "A", "a.b", "", "b"]:
        ch.basic_publish(name, key, key.encode())
    assert routed(ch, q) == [b"a"]
    ch.exchange_delete(name)


def test_direct_with_two_bindings_delivers_once_per_queue(ch, name):
    ch.exchange_declare(name, "direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name, routing_key="a")
    ch.queue_bind(q, name, routing_key="b")
    ch.queue_bind(q, name, routing_key="a")  # the same binding twice is one binding
    ch.basic_publish(name, "a", b"1")
    ch.basic_publish(name, "b", b"2")
    assert routed(ch, q) == [b"1", b"2"]
    ch.exchange_delete(name)


def test_fanout_ignores_routing_key_and_reaches_every_queue(ch, name):
    ch.exchange_declare(name, "fanout")
    queues = [ch.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    for q in queues:
        ch.queue_bind(q, name, routing_key="ignored-" + q)
    ch.basic_publish(name, "anything", b"all")
    for q in queues:
        assert routed(ch, q) == [b"all"]
    ch.exchange_delete(name)


TOPIC_CASES = [
    ("a.b.c", ["a.b.c"], ["a.b", "a.b.c.d", "a.b.x", "A.b.c"]),
    ("a.*.c", ["a.b.c", "a.x.c", "a..c"], ["a.c", "a.b.b.c", "a.b.c.d"]),
    ("a.#", ["a", "a.b", "a.b.c", "a."], ["b.a", "ab", "b"]),
    ("#.c", ["c", "a.c", "a.b.c", ".c"], ["c.a", "ac"]),
    ("#", ["", "a", "a.b.c", "..."], []),
    ("*", ["a"], ["a.b", ".", ""]),  # RabbitMQ: "*" does not match the empty key
    ("*.*", ["a.b", ".", "a."], ["a", "a.b.c"]),
    ("a.#.c", ["a.c", "a.b.c", "a.b.b.c"], ["a.b", "a.c.d", "c"]),
    ("#.b.#", ["b", "a.b", "b.c", "a.b.c", "a.x.b.y.z"], ["a.c", "ab.c", "a.bb"]),
    ("*.#", ["a", "a.b", "a.b.c"], [""]),
    ("#.*", ["a", "a.b"], [""]),
    ("a.*.#", ["a.b", "a.b.c"], ["a"]),
    ("", [""], ["a", "."]),
    ("a.b", ["a.b"], ["a.b.", "a", ".a.b"]),
]


@pytest.mark.parametrize("pattern,matches,misses", TOPIC_CASES, ids=[c[0] or "empty" for c in TOPIC_CASES])
def test_topic_pattern_matching(ch, name, pattern, matches, misses):
    ch.exchange_declare(name, "topic")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name, routing_key=pattern)
    for key in matches + misses:
        ch.basic_publish(name, key, key.encode() or b"<empty>")
    assert routed(ch, q) == [k.encode() or b"<empty>" for k in matches]
    ch.exchange_delete(name)


def test_topic_overlapping_bindings_deliver_once(ch, name):
    ch.exchange_declare(name, "topic")
    q = ch.queue_declare("", exclusive=True).method.queue
    for pattern in ["a.*", "a.#", "#", "a.b"]:
        ch.queue_bind(q, name, routing_key=pattern)
    ch.basic_publish(name, "a.b", b"once")
    assert routed(ch, q) == [b"once"]
    ch.queue_unbind(q, name, routing_key="#")
    ch.queue_unbind(q, name, routing_key="a.#")
    ch.basic_publish(name, "a.b.c", b"no longer")
    ch.basic_publish(name, "a.x", b"still")
    assert routed(ch, q) == [b"still"]
    ch.exchange_delete(name)


def hdr(ch, ex, headers, body):
    ch.basic_publish(ex, "", body, pika.BasicProperties(headers=headers))


HEADERS_CASES = [
    # (binding args, [(message headers, routed?)])
    ({"x-match": "all", "a": 1, "b": "two"}, [
        ({"a": 1, "b": "two"}, True),
        ({"a": 1, "b": "two", "c": 3}, True),
        ({"a": 1}, False),
        ({"a": 2, "b": "two"}, False),
        ({}, False),
    ]),
    ({"x-match": "any", "a": 1, "b": "two"}, [
        ({"a": 1}, True),
        ({"b": "two", "z": 0}, True),
        ({"a": 2, "b": "three"}, False),
        ({}, False),
    ]),
    ({"a": 1}, [  # x-match defaults to all
        ({"a": 1}, True),
        ({"a": 1, "x": 2}, True),
        ({"b": 1}, False),
    ]),
    ({"x-match": "all"}, [  # no headers to match: everything matches
        ({}, True),
        ({"a": 1}, True),
    ]),
    ({"x-match": "any"}, [  # any of nothing: nothing matches
        ({}, False),
        ({"a": 1}, False),
    ]),
    ({"x-match": "all", "a": 1, "x-extra": "v"}, [  # x- binding args are ignored by "all"
        ({"a": 1}, True),
        ({"a": 1, "x-extra": "v"}, True),
    ]),
    ({"x-match": "any", "x-extra": "v"}, [  # and by "any"
        ({"x-extra": "v"}, False),
    ]),
    ({"x-match": "all-with-x", "a": 1, "x-extra": "v"}, [
        ({"a": 1, "x-extra": "v"}, True),
        ({"a": 1}, False),
        ({"a": 1, "x-extra": "w"}, False),
    ]),
    ({"x-match": "any-with-x", "x-extra": "v"}, [
        ({"x-extra": "v"}, True),
        ({"x-extra": "w"}, False),
        ({"a": 1}, False),
    ]),
    ({"x-match": "all", "a": None}, [  # a void value matches presence of the key only
        ({"a": "anything"}, True),
        ({"a": None}, True),
        ({"b": 1}, False),
    ]),
    ({"x-match": "all", "s": "1"}, [  # types matter: the string "1" is not the integer 1
        ({"s": "1"}, True),
        ({"s": 1}, False),
    ]),
]


@pytest.mark.parametrize("binding,cases", HEADERS_CASES,
                         ids=[str(i) + "-" + str(b.get("x-match", "default")) for i, (b, _) in enumerate(HEADERS_CASES)])
def test_headers_exchange_matching(ch, name, binding, cases):
    ch.exchange_declare(name, "headers")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name, arguments=binding)
    for i, (headers, _) in enumerate(cases):
        hdr(ch, name, headers, str(i).encode())
    expected = [str(i).encode() for i, (_, ok) in enumerate(cases) if ok]
    assert routed(ch, q) == expected
    ch.exchange_delete(name)


def test_headers_exchange_ignores_routing_key(ch, name):
    ch.exchange_declare(name, "headers")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name, routing_key="rk", arguments={"x-match": "all", "a": 1})
    ch.basic_publish(name, "other", b"m", pika.BasicProperties(headers={"a": 1}))
    assert routed(ch, q) == [b"m"]
    ch.exchange_delete(name)


def test_headers_binding_with_invalid_x_match_is_406(conn, name):
    from helpers import expect_channel_error
    ch = conn.channel()
    ch.exchange_declare(name, "headers")
    q = ch.queue_declare("", exclusive=True).method.queue
    expect_channel_error(406, "PRECONDITION_FAILED - Invalid x-match field value <<\"nonsense\">>",
                         ch.queue_bind, q, name, arguments={"x-match": "nonsense"})
    conn.channel().exchange_delete(name)


def test_unbind_needs_the_same_arguments_as_bind(ch, name):
    ch.exchange_declare(name, "headers")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name, arguments={"x-match": "any", "a": 1})
    ch.queue_unbind(q, name, arguments={"x-match": "any", "a": 2})  # a different binding: no-op
    hdr(ch, name, {"a": 1}, b"still bound")
    assert routed(ch, q) == [b"still bound"]
    ch.queue_unbind(q, name, arguments={"x-match": "any", "a": 1})
    hdr(ch, name, {"a": 1}, b"unbound")
    assert routed(ch, q) == []
    ch.exchange_delete(name)
