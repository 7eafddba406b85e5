"""Assertions shared by the suite: the exact AMQP error a broker answers with; reading warren's
management API."""

import base64
import time
import urllib.parse
import urllib.request

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

# How long the polls below wait for a condition before failing: a deadline, not a delay (they
# return as soon as it holds), so it is generous, for a loaded machine or a slow disk.
WAIT_S = 15.0


def expect_channel_error(code, text_prefix, fn, *args, **kwargs):
    """Runs fn and asserts that the broker closes the channel with code and text prefix."""
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        fn(*args, **kwargs)
    e = excinfo.value
    assert (e.reply_code, e.reply_text[:len(text_prefix)]) == (code, text_prefix), e.reply_text
    return e.reply_text


def expect_connection_error(code, text_prefix, fn, *args, **kwargs):
    with pytest.raises(ConnectionClosedByBroker) as excinfo:
        fn(*args, **kwargs)
    e = excinfo.value
    assert (e.reply_code, e.reply_text[:len(text_prefix)]) == (code, text_prefix), e.reply_text
    return e.reply_text


def wait_for(predicate, timeout=WAIT_S, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def get(ch, queue, timeout=WAIT_S, auto_ack=True):
    """basic.get, retried until a message arrives (routing may be asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, props, body
        if time.monotonic() > deadline:
            raise AssertionError(f"no message in {queue} after {timeout}s")
        time.sleep(0.02)


def get_all(ch, queue):
    """basic.get (auto-ack) until get-empty: [(method, body)] in queue order."""
    got = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((method, body))


def message_count(ch, queue):
    return ch.queue_declare(queue, passive=True).method.message_count


def wait_message_count(ch, queue, expected, timeout=WAIT_S):
    wait_for(lambda: message_count(ch, queue) == expected, timeout,
             what=f"{queue} to hold {expected} messages (has {message_count(ch, queue)})")


def drain(conn, ch, queue, n, timeout=WAIT_S, auto_ack=True):
    """Consumes exactly n messages (bounded wait) and returns [(method, props, body)]."""
    got = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: got.append((m, p, b)), auto_ack=auto_ack)
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    assert len(got) >= n, f"got {len(got)} of {n} messages from {queue}"
    return got


def no_more_messages(conn, ch, queue, wait=0.3):
    """True when nothing arrives from queue within `wait` seconds."""
    got = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: got.append(m), auto_ack=False)
    conn.process_data_events(time_limit=wait)
    ch.basic_cancel(tag)
    return not got


def props(**kwargs):
    return pika.BasicProperties(**kwargs)


def management(broker, path):
    """GET `path` from the broker's management API as its administrator; the body as text."""
    uri = urllib.parse.urlparse(broker.management_uri)
    req = urllib.request.Request(f"http://{uri.hostname}:{uri.port}{path}")
    token = base64.b64encode(f"{uri.username}:{uri.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def metric(broker, name):
    """The value of an unlabelled metric in /metrics."""
    for line in management(broker, "/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def scratch_vhost(broker, vhost):
    """A fixture's body: `vhost` with guest granted everything, deleted afterwards (use it
    as `yield from scratch_vhost(broker, name)`)."""
    broker.provision("guest", "guest", vhost)
    yield vhost
    broker.ctl("delete_vhost", vhost)


def scratch_user(broker, user, password, vhost):
    """A fixture's body: `user` granted everything on `vhost`, deleted afterwards."""
    broker.provision(user, password, vhost)
    yield user
    broker.ctl("delete_user", user)
