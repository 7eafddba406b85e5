"""Policies and operator policies (issue 13) as RabbitMQ 3.10 has them: `/api/policies` and
`/api/operator-policies` with RabbitMQ's statuses and refusal texts, `set_policy` and friends,
and what a policy does to queues and exchanges that exist: a lowered max-length drops or
dead-letters from the head without reordering, the lower of argument and policy wins for limits
and the argument for the dead-letter target, operator policies cap, clearing restores.

Runs against RabbitMQ too when its management API answers (`scripts/interop.sh --broker
rabbitmq`). RabbitMQ applies a policy to its queue processes asynchronously and refreshes
`/api/queues` every 5 s, so effects are polled."""

import re
import urllib.parse

import pika
import pytest

from helpers import get, get_all, message_count, wait_for
from test_management_api import NOT_FOUND, Api

STATS_WAIT_S = 20.0


def q(name):
    return urllib.parse.quote(name, safe="")


@pytest.fixture
def api(broker):
    a = Api(broker)
    try:
        a.get("/api/whoami")
    except OSError as e:
        if broker.is_rabbitmq:
            pytest.skip(f"RabbitMQ's management API does not answer at {a.base}: {e}")
        raise
    return a


@pytest.fixture
def policies(api):
    """Sets policies for one test and clears them after it, so that tests never match each
    other's queues: (kind, name) -> set; kind is "policies" or "operator-policies"."""
    made = []

    def put(name, pattern, definition, priority=0, apply_to="queues", kind="policies"):
        body = {"pattern": pattern, "definition": definition, "priority": priority,
                "apply-to": apply_to}
        r = api.put(f"/api/{kind}/%2F/{q(name)}", body)
        assert r.status in (201, 204), r
        made.append((kind, name))
        return r
    yield put
    for kind, name in made:
        api.delete(f"/api/{kind}/%2F/{q(name)}")


def anchored(name):
    """A pattern matching `name` alone (not the test's other queues, which extend it)."""
    return "^" + re.escape(name) + "$"


def publish(ch, queue, bodies, **kwargs):
    for b in bodies:
        ch.basic_publish("", queue, b, pika.BasicProperties(**kwargs))


def bodies_in(ch, queue):
    return [body for _, body in get_all(ch, queue)]


def test_policies_are_put_listed_got_and_deleted_as_rabbitmq_serves_them(api, name):
    path = f"/api/policies/%2F/{q(name)}"
    body = {"pattern": anchored(name), "definition": {"max-length": 5}, "priority": 3,
            "apply-to": "queues"}
    try:
        assert api.put(path, body).status == 201
        assert api.put(path, body).status == 204, "a second PUT replaces it"
        one = api.get(path)
        assert one.status == 200
        assert one.json == {"vhost": "/", "name": name, "pattern": anchored(name),
                            "apply-to": "queues", "definition": {"max-length": 5},
                            "priority": 3}
        assert one.json in api.get("/api/policies").json
        assert one.json in api.get("/api/policies/%2F").json
        defaults = api.put(path, {"pattern": "x", "definition": {"max-length": 1}})
        assert defaults.status == 204
        assert (api.get(path).json["priority"], api.get(path).json["apply-to"]) == (0, "all")
    finally:
        assert api.delete(path).status == 204
    assert api.get(path).status == 404
    assert api.get(path).json == NOT_FOUND
    assert api.delete(path).status == 404


@pytest.mark.parametrize("body,reason", [
    ({"pattern": "^a", "definition": {"max-length": "x"}},
     'Validation failed\n\n&lt;&lt;"x"&gt;&gt; is not a valid maximum length\n'),
    ({"pattern": "^a", "definition": {"max-length": -1}},
     "Validation failed\n\n-1 is not a valid maximum length\n"),
    ({"pattern": "^a", "definition": {"message-ttl": "x", "max-length": -1}},
     "Validation failed\n\n-1 is not a valid maximum length\n"),
    ({"pattern": "^a", "definition": {"expires": 0}},
     "Validation failed\n\n0 is not a valid queue expiry\n"),
    ({"pattern": "^a", "definition": {"queue-mode": "x"}},
     'Validation failed\n\n&lt;&lt;"x"&gt;&gt; is not a valid queue-mode value\n'),
    ({"pattern": "^a", "definition": {"overflow": "x"}},
     'Validation failed\n\n&lt;&lt;"x"&gt;&gt; is not a valid overflow value\n'),
    ({"pattern": "^a", "definition": {"dead-letter-exchange": 1}},
     "Validation failed\n\n1 is not a valid dead letter exchange name\n"),
    ({"pattern": "^a", "definition": {"max-length": 1, "foo": 2, "bar": "x"}},
     "Validation failed\n\n[{&lt;&lt;\"bar\"&gt;&gt;,&lt;&lt;\"x\"&gt;&gt;},"
     "{&lt;&lt;\"foo\"&gt;&gt;,2}] are not recognised policy settings\n"),
    ({"pattern": "^a", "definition": {"single-active-consumer": True}},
     "Validation failed\n\n[{&lt;&lt;\"single-active-consumer\"&gt;&gt;,true}] are not "
     "recognised policy settings\n"),
    ({"pattern": "^a", "definition": {}}, "Validation failed\n\nno policy provided\n"),
    ({"pattern": "^a"}, "[{key_missing,definition}]"),
    ({"definition": {"max-length": 1}}, "[{key_missing,pattern}]"),
    ({"pattern": 1, "definition": {"max-length": 1}},
     "Validation failed\n\npattern should be a binary but was 1\n"),
    ({"pattern": "a", "definition": {"max-length": 1}, "priority": "3"},
     'Validation failed\n\npriority should be a number, actually was &lt;&lt;"3"&gt;&gt;\n'),
])
def test_bad_policies_are_refused_with_rabbitmqs_texts(api, name, body, reason):
    r = api.put(f"/api/policies/%2F/{q(name)}", body)
    assert (r.status, r.json) == (400, {"error": "bad_request", "reason": reason})
    assert api.get(f"/api/policies/%2F/{q(name)}").status == 404


def test_bad_patterns_and_apply_to_are_refused(api, name):
    path = f"/api/policies/%2F/{q(name)}"
    r = api.put(path, {"pattern": "(", "definition": {"max-length": 1}})
    assert r.status == 400
    assert r.json["reason"].startswith(
        "Validation failed\n\npattern should be regular expression but is invalid: ")
    r = api.put(path, {"pattern": "a", "definition": {"max-length": 1}, "apply-to": "bogus"})
    assert r.status == 400
    assert r.json["reason"].startswith("Validation failed\n\napply-to 'bogus' unrecognised; ")
    r = api.put(f"/api/policies/{q(name)}/{q(name)}",
                {"pattern": "a", "definition": {"max-length": 1}})
    assert (r.status, r.json) == (404, {"error": "not_found", "reason": "vhost_not_found"})


def test_operator_policies_take_limits_only_and_answer_unescaped(api, name):
    path = f"/api/operator-policies/%2F/{q(name)}"
    r = api.put(path, {"pattern": "^a", "definition": {"dead-letter-exchange": "x"}})
    assert (r.status, r.json["reason"]) == (
        400, 'Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised '
             'policy settings\n')
    r = api.put(path, {"pattern": "^a", "definition": {"max-length": "x"}})
    assert (r.status, r.json["reason"]) == (
        400, 'Validation failed\n\n<<"x">> is not a valid maximum length\n')
    try:
        assert api.put(path, {"pattern": anchored(name), "definition": {"max-length": 3},
                              "apply-to": "queues"}).status == 201
        got = api.get(path).json
        assert got == {"vhost": "/", "name": name, "pattern": anchored(name),
                       "apply-to": "queues", "definition": {"max-length": 3}, "priority": 0}
        assert got in api.get("/api/operator-policies").json
    finally:
        assert api.delete(path).status == 204


def test_ha_keys_are_refused_naming_quorum_queues(broker, api, name):
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ 3.10 still has classic queue mirroring")
    r = api.put(f"/api/policies/%2F/{q(name)}",
                {"pattern": "^a", "definition": {"ha-mode": "all"}})
    assert r.status == 400
    assert "'ha-mode' is not supported" in r.json["reason"]
    assert "quorum queues" in r.json["reason"]


def test_a_lowered_max_length_drops_an_existing_queues_oldest_messages(ch, name, policies):
    ch.queue_declare(name)
    publish(ch, name, [b"m%d" % i for i in range(6)])
    policies(name, anchored(name), {"max-length": 2})
    wait_for(lambda: message_count(ch, name) == 2, what="the queue trimmed to 2")
    assert bodies_in(ch, name) == [b"m4", b"m5"], "the head goes, the order stays"
    publish(ch, name, [b"n0", b"n1", b"n2"])
    assert bodies_in(ch, name) == [b"n1", b"n2"], "new messages obey the policy too"


def test_a_lowered_max_length_dead_letters_the_head_in_order(ch, name, policies):
    dlq = f"{name}.dlq"
    ch.exchange_declare(f"{name}.dlx", "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, f"{name}.dlx")
    ch.queue_declare(name, durable=True)
    publish(ch, name, [b"m%d" % i for i in range(5)], delivery_mode=2)
    policies(name, anchored(name), {"max-length": 1, "dead-letter-exchange": f"{name}.dlx"})
    wait_for(lambda: message_count(ch, dlq) == 4, what="four dead letters")
    dead = []
    for _ in range(4):
        _, props, body = get(ch, dlq)
        dead.append(body)
        death = props.headers["x-death"][0]
        assert (death["reason"], death["queue"]) == ("maxlen", name)
    assert dead == [b"m0", b"m1", b"m2", b"m3"]
    assert bodies_in(ch, name) == [b"m4"]
    ch.queue_delete(name)


def test_the_lower_of_argument_and_policy_wins_and_an_operator_policy_caps(
        api, ch, name, policies):
    ch.queue_declare(name, arguments={"x-max-length": 4})
    policies(name, anchored(name), {"max-length": 3, "message-ttl": 60000}, priority=5)
    publish(ch, name, [b"%d" % i for i in range(10)])
    wait_for(lambda: message_count(ch, name) == 3, what="policy's 3 below the argument's 4")
    policies(name, anchored(name), {"max-length": 9}, priority=5)
    publish(ch, name, [b"%d" % i for i in range(10)])
    wait_for(lambda: message_count(ch, name) == 4, what="the argument's 4 below the policy's 9")
    policies(f"{name}.op", anchored(name), {"max-length": 2}, kind="operator-policies")
    wait_for(lambda: message_count(ch, name) == 2, what="the operator policy's cap of 2")

    def shown():
        r = api.get(f"/api/queues/%2F/{q(name)}").json
        return (r.get("policy"), r.get("operator_policy"),
                r.get("effective_policy_definition")) == (
            name, f"{name}.op", {"max-length": 2}) and r
    shown_queue = wait_for(shown, STATS_WAIT_S, interval=0.5, what="the queue's policies shown")
    assert shown_queue["arguments"] == {"x-max-length": 4}, "arguments stay as declared"


def test_the_dead_letter_exchange_argument_wins_over_the_policys(ch, name, policies):
    for suffix in ("arg", "pol"):
        ch.exchange_declare(f"{name}.{suffix}", "fanout")
        ch.queue_declare(f"{name}.{suffix}.q")
        ch.queue_bind(f"{name}.{suffix}.q", f"{name}.{suffix}")
    ch.queue_declare(name, arguments={"x-dead-letter-exchange": f"{name}.arg"})
    policies(name, anchored(name), {"dead-letter-exchange": f"{name}.pol", "max-length": 1})
    publish(ch, name, [b"a", b"b"])
    get(ch, f"{name}.arg.q")
    assert message_count(ch, f"{name}.pol.q") == 0


def test_clearing_a_policy_restores_what_the_arguments_say(api, ch, name, policies):
    ch.queue_declare(name, arguments={"x-max-length": 3})
    policies(name, anchored(name), {"max-length": 1})
    publish(ch, name, [b"a", b"b"])
    wait_for(lambda: message_count(ch, name) == 1, what="the policy's limit")
    assert api.delete(f"/api/policies/%2F/{q(name)}").status == 204
    publish(ch, name, [b"c", b"d", b"e"])
    wait_for(lambda: message_count(ch, name) == 3, what="the argument's limit back")
    assert bodies_in(ch, name) == [b"c", b"d", b"e"]


def test_a_queue_declared_later_gets_the_highest_priority_policy(ch, name, policies):
    policies(f"{name}.low", "^" + re.escape(name), {"max-length": 5}, priority=1)
    policies(f"{name}.high", anchored(f"{name}.q"), {"max-length": 1}, priority=7)
    ch.queue_declare(f"{name}.q")
    ch.queue_declare(f"{name}.other")
    publish(ch, f"{name}.q", [b"1", b"2", b"3"])
    publish(ch, f"{name}.other", [b"1", b"2", b"3"])
    wait_for(lambda: message_count(ch, f"{name}.q") == 1, what="the high policy")
    assert message_count(ch, f"{name}.other") == 3, "only the low policy matches it"


def test_reject_publish_overflow_by_policy_nacks_the_publisher(ch, name, policies):
    ch.queue_declare(name)
    policies(name, anchored(name), {"max-length": 1, "overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", name, b"first")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", name, b"second")
    assert bodies_in(ch, name) == [b"first"]


def test_message_ttl_by_policy_expires_new_messages(ch, name, policies):
    ch.queue_declare(name)
    policies(name, anchored(name), {"message-ttl": 50})
    publish(ch, name, [b"short-lived"])
    wait_for(lambda: message_count(ch, name) == 0, what="the message to expire")


def test_an_alternate_exchange_by_policy_takes_unroutable_messages(ch, name, policies):
    ch.exchange_declare(f"{name}.ae", "fanout")
    ch.queue_declare(f"{name}.ae.q")
    ch.queue_bind(f"{name}.ae.q", f"{name}.ae")
    ch.exchange_declare(f"{name}.x", "direct")
    policies(name, anchored(f"{name}.x"), {"alternate-exchange": f"{name}.ae"},
             apply_to="exchanges")

    def rerouted():
        ch.basic_publish(f"{name}.x", "nowhere", b"lost?")
        return ch.basic_get(f"{name}.ae.q", auto_ack=True)[0] is not None
    wait_for(rerouted, interval=0.2, what="an unroutable message at the policy's alternate")


def test_ctl_sets_lists_and_clears_policies(broker, api, name):
    broker.ctl("set_policy", "--priority", "2", "--apply-to", "queues", name, anchored(name),
               '{"max-length": 7}')
    try:
        got = api.get(f"/api/policies/%2F/{q(name)}").json
        assert (got["definition"], got["priority"], got["apply-to"]) == (
            {"max-length": 7}, 2, "queues")
        assert name in broker.ctl("list_policies")
        broker.ctl("set_operator_policy", "--apply-to", "queues", name, anchored(name),
                   '{"message-ttl": 1000}')
        assert name in broker.ctl("list_operator_policies")
        broker.ctl("clear_operator_policy", name)
    finally:
        broker.ctl("clear_policy", name)
    assert api.get(f"/api/policies/%2F/{q(name)}").status == 404
    assert api.get(f"/api/operator-policies/%2F/{q(name)}").status == 404


def answers(api, path):
    """The JSON `path` answers with, or None while the API is not listening yet (warren opens
    its AMQP port first)."""
    try:
        return api.get(path).json
    except OSError:
        return None


@pytest.mark.restart
def test_policies_survive_a_restart(broker, api, name):
    path = f"/api/policies/%2F/{q(name)}"
    body = {"pattern": anchored(name), "definition": {"max-length": 2}, "priority": 1,
            "apply-to": "queues"}
    assert api.put(path, body).status == 201
    op = f"/api/operator-policies/%2F/{q(name)}"
    assert api.put(op, {"pattern": anchored(name), "definition": {"expires": 60000}}).status == 201
    try:
        broker.restart()
        wait_for(lambda: answers(api, path), what="the management API after the restart")
        assert api.get(path).json["definition"] == {"max-length": 2}
        assert api.get(op).json["definition"] == {"expires": 60000}
        c = broker.connect()
        ch = c.channel()
        ch.queue_declare(name)
        publish(ch, name, [b"1", b"2", b"3"])
        wait_for(lambda: message_count(ch, name) == 2, what="the policy after the restart")
        ch.queue_delete(name)
        c.close()
    finally:
        api.delete(path)
        api.delete(op)


def test_policies_are_listed_lowest_priority_first_and_go_with_their_vhost(api, name):
    vhost = q(name)
    assert api.put(f"/api/vhosts/{vhost}").status == 201
    try:
        for policy, priority in (("b", 5), ("a", 1), ("c", 3)):
            assert api.put(f"/api/policies/{vhost}/{policy}",
                           {"pattern": "^x", "definition": {"max-length": 1},
                            "priority": priority}).status == 201
        listed = api.get(f"/api/policies/{vhost}").json
        assert [(p["name"], p["priority"], p["vhost"]) for p in listed] == [
            ("a", 1, name), ("c", 3, name), ("b", 5, name)]
    finally:
        assert api.delete(f"/api/vhosts/{vhost}").status == 204
    assert api.put(f"/api/vhosts/{vhost}").status == 201
    try:
        assert api.get(f"/api/policies/{vhost}").json == [], "deleted with their vhost"
    finally:
        api.delete(f"/api/vhosts/{vhost}")
