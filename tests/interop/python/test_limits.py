"""Vhost and user limits and topic permissions (issue 14), set with rabbitmqctl's commands and
refused with RabbitMQ's reply texts: the same tests pass against RabbitMQ 3.10
(scripts/interop.sh --broker rabbitmq), where warren's text is RabbitMQ's.

Each test works in a vhost and with users of its own, and clears what it set, so that limits
never leak into the rest of the suite."""

import json
import signal

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker, ProbableAccessDeniedError

from helpers import expect_channel_error, get, scratch_user, scratch_vhost
from test_management_api import Api

PASSWORD = "limits-pw"


@pytest.fixture
def vhost(broker, name):
    yield from scratch_vhost(broker, f"lim-{name}")


@pytest.fixture
def user(broker, vhost, name):
    yield from scratch_user(broker, f"lim-user-{name}", PASSWORD, vhost)


def connect(broker, vhost, user="guest", password="guest"):
    return broker.connect(virtual_host=vhost, credentials=pika.PlainCredentials(user, password))


def refused_at_open(broker, vhost, user="guest", password="guest"):
    """The reply text of a connection refused at connection.open (pika's wrapping removed)."""
    with pytest.raises((ProbableAccessDeniedError, ConnectionClosedByBroker)) as e:
        connect(broker, vhost, user, password)
    return str(e.value)


def test_vhost_max_connections_refuses_connection_open_until_one_closes(broker, vhost):
    broker.ctl("set_vhost_limits", "-p", vhost, '{"max-connections": 2}')
    a, b = connect(broker, vhost), connect(broker, vhost)
    text = refused_at_open(broker, vhost)
    assert "530" in text, text
    assert (f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': "
            "connection limit (2) is reached") in text
    a.close()
    c = connect(broker, vhost)  # room again
    broker.ctl("clear_vhost_limits", "-p", vhost)
    d = connect(broker, vhost)  # no limit any more
    for x in (b, c, d):
        x.close()


def test_vhost_max_connections_zero_refuses_everyone(broker, vhost):
    broker.ctl("set_vhost_limits", "-p", vhost, '{"max-connections": 0}')
    assert "connection limit (0) is reached" in refused_at_open(broker, vhost)
    # A negative value is no limit.
    broker.ctl("set_vhost_limits", "-p", vhost, '{"max-connections": -1}')
    connect(broker, vhost).close()


def test_vhost_max_queues_refuses_new_queues_with_406(broker, vhost):
    broker.ctl("set_vhost_limits", "-p", vhost, '{"max-queues": 1}')
    c = connect(broker, vhost)
    ch = c.channel()
    ch.queue_declare("q1")
    ch.queue_declare("q1")  # a redeclare is no new queue
    ch.queue_declare("q1", passive=True)
    expect_channel_error(
        406, f"PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost '{vhost}' (1) "
        "is reached", ch.queue_declare, "q2")
    ch = c.channel()
    text = expect_channel_error(406, "PRECONDITION_FAILED - cannot declare queue 'amq.gen-",
                                ch.queue_declare, "")
    assert text.endswith(f"queue limit in vhost '{vhost}' (1) is reached"), text
    ch = c.channel()
    ch.queue_delete("q1")
    ch.queue_declare("q2")  # room again
    ch.queue_delete("q2")
    c.close()


def test_set_vhost_limits_replaces_the_whole_set(broker, vhost):
    broker.ctl("set_vhost_limits", "-p", vhost, '{"max-queues": 3}')
    broker.ctl("set_vhost_limits", "-p", vhost, '{"max-connections": 5}')
    out = broker.ctl("list_vhost_limits", "-p", vhost)
    assert json.loads(out.strip().splitlines()[-1]) == {"max-connections": 5}, out


def test_user_max_connections_refuses_connection_open(broker, vhost, user):
    broker.ctl("set_user_limits", user, '{"max-connections": 1}')
    a = connect(broker, vhost, user, PASSWORD)
    text = refused_at_open(broker, vhost, user, PASSWORD)
    assert (f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) "
            "is reached") in text, text
    connect(broker, vhost).close()  # other users are not limited
    a.close()
    connect(broker, vhost, user, PASSWORD).close()


def test_user_max_channels_counts_every_connection_and_closes_the_connection(broker, vhost, user):
    broker.ctl("set_user_limits", user, '{"max-channels": 2}')
    a = connect(broker, vhost, user, PASSWORD)
    a.channel()
    b = connect(broker, vhost, user, PASSWORD)
    b.channel()
    with pytest.raises(ConnectionClosedByBroker) as e:
        b.channel()
    assert (e.value.reply_code, e.value.reply_text) == (
        530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the "
        "maximum allowed user limit of (2)")
    assert a.is_open, "only the connection that went over is closed"
    a.channel()  # the closed connection's channel no longer counts
    a.close()


def test_set_user_limits_merges_and_clear_user_limits_removes(broker, vhost, user):
    broker.ctl("set_user_limits", user, '{"max-channels": 1, "max-connections": 0}')
    broker.ctl("set_user_limits", user, '{"max-connections": -1}')
    out = broker.ctl("list_user_limits", "--user", user)
    assert json.loads(out.strip().splitlines()[-1]) == {"max-channels": 1, "max-connections": -1}
    broker.ctl("clear_user_limits", user, "max-channels")
    out = broker.ctl("list_user_limits", "--user", user)
    assert json.loads(out.strip().splitlines()[-1]) == {"max-connections": -1}
    broker.ctl("clear_user_limits", user, "all")
    out = broker.ctl("list_user_limits", "--user", user)
    assert json.loads(out.strip().splitlines()[-1]) == {}


def topic_refused(key, user, vhost, exchange="amq.topic"):
    return (f"ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' in vhost "
            f"'{vhost}' refused for user '{user}'")


def test_topic_permissions_restrict_publish_and_bind_keys(broker, vhost, user):
    broker.ctl("set_topic_permissions", "-p", vhost, user, "amq.topic",
               r"^a\..*|^{vhost}$", "^r-{username}$")
    c = connect(broker, vhost, user, PASSWORD)
    ch = c.channel()
    ch.confirm_delivery()
    ch.queue_declare("tq", auto_delete=True)
    ch.queue_bind("tq", "amq.topic", f"r-{user}")
    admin = connect(broker, vhost)
    admin.channel().queue_bind("tq", "amq.topic", "a.#")  # guest has no topic permission
    ch.basic_publish("amq.topic", "a.x", b"1")
    assert get(ch, "tq")[2] == b"1"
    admin.close()
    ch.basic_publish("amq.topic", vhost, b"2")  # {vhost} expanded
    expect_channel_error(403, topic_refused("b.x", user, vhost),
                         ch.basic_publish, "amq.topic", "b.x", b"3")
    ch = c.channel()
    ch.basic_publish("amq.direct", "b.x", b"other exchanges are free")
    expect_channel_error(403, topic_refused("r-alice", user, vhost),
                         ch.queue_bind, "tq", "amq.topic", "r-alice")
    ch = c.channel()
    expect_channel_error(403, topic_refused("r-alice", user, vhost),
                         ch.queue_unbind, "tq", "amq.topic", "r-alice")
    ch = c.channel()
    ch.exchange_declare("lim-dx", "fanout", auto_delete=True)
    expect_channel_error(403, topic_refused("r-alice", user, vhost),
                         ch.exchange_bind, "lim-dx", "amq.topic", "r-alice")
    ch = c.channel()
    ch.exchange_bind("lim-dx", "amq.topic", f"r-{user}")
    ch.exchange_unbind("lim-dx", "amq.topic", f"r-{user}")
    # Topic exchanges the user has no topic permission for are not restricted.
    ch.exchange_declare("lim-topic", "topic", auto_delete=True)
    ch.queue_bind("tq", "lim-topic", "anything")
    ch.basic_publish("lim-topic", "b.x", b"4")
    c.close()
    out = broker.ctl("list_topic_permissions", "-p", vhost)
    assert f"{user}\tamq.topic\t^a\\..*|^{{vhost}}$\t^r-{{username}}$" in out, out
    broker.ctl("clear_topic_permissions", "-p", vhost, user)
    assert user not in broker.ctl("list_topic_permissions", "-p", vhost)
    c = connect(broker, vhost, user, PASSWORD)
    c.channel().basic_publish("amq.topic", "b.x", b"cleared: allowed again")
    c.close()


def test_management_api_serves_limits_as_rabbitmq(broker, vhost, user):
    api = Api(broker)
    enc = vhost.replace("/", "%2F")
    assert api.put(f"/api/vhost-limits/{enc}/max-queues", {"value": 7}).status == 204
    r = api.get(f"/api/vhost-limits/{enc}")
    assert (r.status, r.json) == (200, [{"vhost": vhost, "value": {"max-queues": 7}}])
    assert {"vhost": vhost, "value": {"max-queues": 7}} in api.get("/api/vhost-limits").json
    r = api.put(f"/api/vhost-limits/{enc}/max-queues", {"value": "x"})
    assert r.status == 400 and "max-queues should be a number" in r.json["reason"], r
    r = api.put(f"/api/vhost-limits/{enc}/max-foo", {"value": 3})
    assert r.status == 400 and "Unrecognised terms" in r.json["reason"], r
    assert api.put("/api/vhost-limits/no-such-vhost/max-queues", {"value": 3}).status == 404
    assert api.delete(f"/api/vhost-limits/{enc}/max-queues").status == 204
    assert api.get(f"/api/vhost-limits/{enc}").json == []
    assert api.put(f"/api/user-limits/{user}/max-channels", {"value": 5}).status == 204
    assert api.get(f"/api/user-limits/{user}").json == [{"user": user,
                                                         "value": {"max-channels": 5}}]
    assert api.get(f"/api/users/{user}").json["limits"] == {"max-channels": 5}
    r = api.put("/api/user-limits/no-such-user/max-channels", {"value": 5})
    assert r.status == 400, r
    assert api.put(f"/api/user-limits/{user}/max-queues", {"value": 5}).status == 400
    assert api.delete(f"/api/user-limits/{user}/max-channels").status == 204
    assert api.get(f"/api/user-limits/{user}").json == []
    body = {"exchange": "amq.topic", "write": "^x", "read": ".*"}
    assert api.put(f"/api/topic-permissions/{enc}/{user}", body).status == 201
    assert api.put(f"/api/topic-permissions/{enc}/{user}", body).status == 204
    expected = [{"user": user, "vhost": vhost, **body}]
    assert api.get(f"/api/topic-permissions/{enc}/{user}").json == expected
    assert api.get(f"/api/users/{user}/topic-permissions").json == expected
    assert api.get(f"/api/vhosts/{enc}/topic-permissions").json == expected
    r = api.put(f"/api/topic-permissions/{enc}/{user}", {"write": "x", "read": ".*"})
    assert r.status == 400 and "key_missing,exchange" in r.text, r
    r = api.put(f"/api/topic-permissions/{enc}/no-such-user", body)
    assert (r.status, r.json["reason"]) == (400, "vhost_or_user_not_found"), r
    assert api.delete(f"/api/topic-permissions/{enc}/{user}").status == 204
    assert api.get(f"/api/topic-permissions/{enc}/{user}").status == 404


def test_limits_and_topic_permissions_survive_a_restart(broker, vhost, user):
    if not broker.can_restart:
        pytest.skip("the suite did not start this broker")
    broker.ctl("set_vhost_limits", "-p", vhost, '{"max-queues": 1}')
    broker.ctl("set_user_limits", user, '{"max-connections": 1}')
    broker.ctl("set_topic_permissions", "-p", vhost, user, "amq.topic", "^a", ".*")
    broker.restart(signal.SIGKILL)
    c = connect(broker, vhost, user, PASSWORD)
    assert "user connection limit (1) is reached" in refused_at_open(broker, vhost, user,
                                                                      PASSWORD)
    ch = c.channel()
    ch.queue_declare("only-one", auto_delete=True)
    expect_channel_error(406, "PRECONDITION_FAILED - cannot declare queue 'two'",
                         ch.queue_declare, "two")
    ch = c.channel()
    ch.confirm_delivery()
    expect_channel_error(403, topic_refused("b", user, vhost),
                         ch.basic_publish, "amq.topic", "b", b"x")
    c.close()


def failed_logins(broker):
    from helpers import management
    for line in management(broker, "/metrics").splitlines():
        if line.startswith("warren_auth_attempts_failed_total "):
            return int(line.split()[1])
    raise AssertionError("no warren_auth_attempts_failed_total in /metrics")


def test_failed_logins_are_logged_with_the_peer_address_and_counted(broker, vhost, user):
    if broker.is_rabbitmq or not broker.log_path:
        pytest.skip("reads warren's log and metrics")
    before = failed_logins(broker)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(broker, vhost, user, "wrong-password")
    assert failed_logins(broker) == before + 1
    with open(broker.log_path, errors="replace") as log:
        lines = [x for x in log if "login refused" in x and user in x]
    assert lines, "no log line for the refused login"
    assert "peer=127.0.0.1:" in lines[-1] and "invalid credentials" in lines[-1], lines[-1]
    # A connection refused by a limit is no failed login.
    broker.ctl("set_user_limits", user, '{"max-connections": 0}')
    refused_at_open(broker, vhost, user, PASSWORD)
    assert failed_logins(broker) == before + 1
