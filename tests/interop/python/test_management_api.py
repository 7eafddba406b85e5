"""The management HTTP API as rabbitmqadmin (the Python one and the v2 Rust crate), Terraform's
provider and operators' scripts call it: declaring and deleting queues, exchanges and bindings,
purge, publish and get, connections (and closing one), channels, consumers, whoami, the aliveness
test and the health checks, and who may see and do what by their tags. Every expected status and
body is RabbitMQ 3.10's: the module runs against RabbitMQ too when its management API answers
(`scripts/interop.sh --broker rabbitmq` starts it with the plugin).

What the API changes is checked over AMQP where it can be (a passive declare, a publish that
must arrive), so a test proves the change is the broker's and not only the API's; RabbitMQ's
own statistics (message counts, channels, consumers) lag by its 5 s collection interval, so
listings of them are polled."""

import base64
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from helpers import get, message_count, wait_for

# RabbitMQ refreshes connection, channel and consumer statistics every 5 s.
STATS_WAIT_S = 20.0
HTTP_TIMEOUT_S = 10.0
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
NOT_VHOST = {"error": "not_authorised", "reason": "User not authorised to access virtual host"}
ACCESS_REFUSED = {"error": "not_authorised", "reason": "Access refused."}


def q(name):
    """A path segment: every reserved character escaped, `/` included."""
    return urllib.parse.quote(name, safe="")


class Reply:
    def __init__(self, status, body, headers):
        self.status = status
        self.text = body
        self.headers = headers

    @property
    def json(self):
        return json.loads(self.text) if self.text else None

    def __repr__(self):
        return f"<{self.status} {self.text[:300]!r}>"


class Api:
    """The broker's management API as one user."""

    def __init__(self, broker, user=None, password=None):
        uri = urllib.parse.urlparse(broker.management_uri)
        self.base = f"http://{uri.hostname}:{uri.port}"
        self.user = user or uri.username
        self.password = password if password is not None else uri.password

    def as_user(self, user, password):
        other = Api.__new__(Api)
        other.base, other.user, other.password = self.base, user, password
        return other

    def call(self, method, path, body=None, raw=None, headers=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
                return Reply(r.status, r.read().decode(), r.headers)
        except urllib.error.HTTPError as e:
            return Reply(e.code, e.read().decode(), e.headers)

    def get(self, path):
        return self.call("GET", path)

    def put(self, path, body=None):
        return self.call("PUT", path, body if body is not None else {})

    def post(self, path, body=None):
        return self.call("POST", path, body if body is not None else {})

    def delete(self, path, headers=None):
        return self.call("DELETE", path, headers=headers)

    def ok(self, method, path, body=None, status=(200, 201, 204)):
        r = self.call(method, path, body)
        assert r.status in status, f"{method} {path}: {r}"
        return r.json


@pytest.fixture
def api(broker):
    a = Api(broker)
    try:
        a.get("/api/whoami")
    except (urllib.error.URLError, ConnectionError) as e:
        if broker.is_rabbitmq:
            pytest.skip(f"RabbitMQ's management API does not answer at {a.base}: {e}")
        raise
    return a


def publish_json(routing_key, payload, properties=None, encoding="string"):
    return {"properties": properties if properties is not None else {},
            "routing_key": routing_key, "payload": payload, "payload_encoding": encoding}


def get_json(count, ackmode="ack_requeue_true", encoding="auto", truncate=None):
    body = {"count": count, "ackmode": ackmode, "encoding": encoding}
    if truncate is not None:
        body["truncate"] = truncate
    return body


# ---------------------------------------------------------------- queues

def test_queue_put_declares_a_queue_amqp_sees_and_delete_removes_it(api, ch, name):
    path = f"/api/queues/%2F/{q(name)}"
    assert api.put(path, {"durable": True, "arguments": {"x-max-length": 10}}).status == 201
    # Declared for real: an AMQP client finds it, with its arguments.
    ch.queue_declare(name, passive=True)
    assert api.put(path, {"durable": True, "arguments": {"x-max-length": 10}}).status == 204
    got = api.ok("GET", path)
    assert {k: got[k] for k in ("name", "vhost", "durable", "auto_delete", "exclusive",
                                "arguments", "type")} == {
        "name": name, "vhost": "/", "durable": True, "auto_delete": False, "exclusive": False,
        "arguments": {"x-max-length": 10}, "type": "classic"}
    assert name in [x["name"] for x in api.ok("GET", "/api/queues/%2F")]
    assert name in [x["name"] for x in api.ok("GET", "/api/queues")]

    assert api.delete(path).status == 204
    with pytest.raises(ChannelClosedByBroker):
        ch.queue_declare(name, passive=True)
    r = api.get(path)
    assert (r.status, r.json) == (404, NOT_FOUND)
    r = api.delete(path)
    assert (r.status, r.json) == (404, NOT_FOUND)


def test_queue_put_defaults_to_transient(api, name):
    path = f"/api/queues/%2F/{q(name)}"
    assert api.put(path).status == 201
    got = api.ok("GET", path)
    assert (got["durable"], got["auto_delete"], got["arguments"]) == (False, False, {})
    api.delete(path)


def test_an_inequivalent_queue_declare_is_400_with_rabbitmqs_text(api, name):
    path = f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", path, {"durable": True})
    r = api.put(path, {"durable": False})
    assert (r.status, r.json) == (400, {
        "error": "bad_request",
        "reason": f"inequivalent arg 'durable' for queue '{name}' in vhost '/': "
                  "received 'false' but current is 'true'"})
    r = api.put(f"/api/queues/%2F/{q(name)}.bad", {"arguments": {"x-max-length": "abc"}})
    assert (r.status, r.json) == (400, {
        "error": "bad_request",
        "reason": f"invalid arg 'x-max-length' for queue '{name}.bad' in vhost '/': "
                  "\"expected integer, got longstr\""})
    api.delete(path)


def test_names_longer_than_amqp_carries_are_400_not_a_dropped_request(api, broker, name):
    """A queue name over 255 bytes is refused as RabbitMQ refuses it. Its other names and keys
    (exchange names, routing keys, table keys) RabbitMQ takes, though no AMQP client could
    name them; warren refuses them too, with the reason, rather than store what it could never
    send (the conversion panicked and the connection dropped without an answer)."""
    long = "q" * 256
    r = api.put(f"/api/queues/%2F/{long}", {"durable": True})
    assert (r.status, r.json) == (400, {
        "error": "bad_request", "reason": "queue should be less than 255 bytes, actually was 256\n"})
    assert api.get(f"/api/queues/%2F/{long}").status == 404
    path = f"/api/queues/%2F/{q(name)}"
    assert api.put(path, {"durable": True}).status == 201
    if broker.is_rabbitmq:
        api.delete(path)
        return
    refused = [
        api.put(f"/api/queues/%2F/{q(name)}.args", {"arguments": {long: 1}}),
        api.put(f"/api/exchanges/%2F/{long}", {"type": "direct"}),
        api.post(f"/api/bindings/%2F/e/amq.direct/q/{q(name)}", {"routing_key": long}),
        api.post("/api/exchanges/%2F/amq.default/publish", {
            "routing_key": long, "payload": "x", "payload_encoding": "string", "properties": {}}),
        api.post("/api/exchanges/%2F/amq.default/publish", {
            "routing_key": name, "payload": "x", "payload_encoding": "string",
            "properties": {"message_id": long}}),
    ]
    for r in refused:
        assert r.status == 400 and "at most 255" in r.json["reason"], r
    assert api.get(f"/api/queues/%2F/{q(name)}.args").status == 404
    assert api.get(f"/api/exchanges/%2F/{long}").status == 404
    bindings = api.ok("GET", f"/api/queues/%2F/{q(name)}/bindings")
    assert all(b["routing_key"] != long for b in bindings), bindings
    api.delete(path)


def test_reserved_names_are_refused_as_amqp_refuses_them(api, name):
    assert (lambda r: (r.status, r.json))(api.put(f"/api/queues/%2F/amq.{q(name)}")) == \
        (401, ACCESS_REFUSED)
    assert (lambda r: (r.status, r.json))(api.put(f"/api/exchanges/%2F/amq.{q(name)}")) == \
        (401, ACCESS_REFUSED)
    r = api.delete("/api/exchanges/%2F/amq.default")
    assert (r.status, r.json) == (401, ACCESS_REFUSED)
    r = api.delete("/api/exchanges/%2F/amq.direct")
    assert (r.status, r.json) == (401, ACCESS_REFUSED)


def test_unknown_vhosts_and_bad_json_get_rabbitmqs_errors(api, name):
    r = api.put(f"/api/queues/no-such-vhost/{q(name)}")
    assert (r.status, r.json) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    r = api.put(f"/api/exchanges/no-such-vhost/{q(name)}")
    assert (r.status, r.json) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    for path in ["/api/queues/no-such-vhost", "/api/exchanges/no-such-vhost",
                 "/api/bindings/no-such-vhost", "/api/consumers/no-such-vhost",
                 "/api/vhosts/no-such-vhost/connections", "/api/aliveness-test/no-such-vhost",
                 f"/api/queues/no-such-vhost/{q(name)}"]:
        r = api.get(path)
        assert (r.status, r.json) == (404, NOT_FOUND), path
    for method, path in [("PUT", f"/api/queues/%2F/{q(name)}"),
                         ("PUT", f"/api/exchanges/%2F/{q(name)}"),
                         ("POST", "/api/queues/%2F/whatever/get")]:
        r = api.call(method, path, raw=b"{not json")
        assert (r.status, r.json) == (400, {"error": "bad_request", "reason": "not_json"}), path


def test_queue_delete_honours_if_empty_and_if_unused(api, conn, ch, name):
    path = f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", path)
    ch.basic_publish("", name, b"m")
    wait_for(lambda: message_count(ch, name) == 1, what="the message")
    r = api.delete(path + "?if-empty=true")
    assert (r.status, r.json) == (400, {
        "error": "bad_request", "reason": f"queue '{name}' in vhost '/' not empty"})
    other = conn.channel()
    other.basic_consume(name, lambda *a: None, auto_ack=False)
    r = api.delete(path + "?if-unused=true")
    assert (r.status, r.json) == (400, {
        "error": "bad_request", "reason": f"queue '{name}' in vhost '/' in use"})
    other.close()
    assert api.delete(path + "/contents").status == 204
    assert message_count(ch, name) == 0
    assert api.delete(path + "?if-empty=true&if-unused=true").status == 204
    with pytest.raises(ChannelClosedByBroker):
        ch.queue_declare(name, passive=True)


def test_purge_empties_the_queue(api, ch, name):
    path = f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", path)
    for i in range(3):
        ch.basic_publish("", name, b"m%d" % i)
    wait_for(lambda: message_count(ch, name) == 3, what="three messages")
    assert api.delete(path + "/contents").status == 204
    assert message_count(ch, name) == 0
    r = api.delete(f"/api/queues/%2F/{q(name)}.none/contents")
    assert (r.status, r.json) == (404, NOT_FOUND)
    api.delete(path)


# ---------------------------------------------------------------- publish and get

def test_publish_routes_through_the_exchange_and_get_returns_rabbitmqs_shape(api, ch, name):
    qpath = f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", qpath)
    props = {"delivery_mode": 2, "headers": {"h": 1}, "content_type": "text/plain"}
    assert api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
                  publish_json(name, "hello", props)) == {"routed": True}
    assert api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
                  publish_json(name, base64.b64encode(b"hi").decode(), {}, "base64")) == \
        {"routed": True}
    assert api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
                  publish_json(f"{name}.nowhere", "lost")) == {"routed": False}
    assert message_count(ch, name) == 2

    got = api.ok("POST", qpath + "/get", get_json(2, "ack_requeue_true", "auto", 50000))
    assert got == [
        {"payload_bytes": 5, "redelivered": False, "exchange": "", "routing_key": name,
         "message_count": 1, "properties": props, "payload": "hello",
         "payload_encoding": "string"},
        {"payload_bytes": 2, "redelivered": False, "exchange": "", "routing_key": name,
         "message_count": 0, "properties": [], "payload": "hi", "payload_encoding": "string"},
    ]
    # Requeued, in order, and now redelivered.
    assert message_count(ch, name) == 2
    got = api.ok("POST", qpath + "/get", get_json(5, "ack_requeue_false", "base64"))
    assert [(m["payload"], m["payload_encoding"], m["redelivered"]) for m in got] == [
        ("aGVsbG8=", "base64", True), ("aGk=", "base64", True)]
    assert message_count(ch, name) == 0
    assert api.ok("POST", qpath + "/get", get_json(5, "ack_requeue_false")) == []
    api.delete(qpath)


def test_get_settles_as_the_ackmode_says(api, ch, name):
    qpath = f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", qpath)
    for body in ["a", "b", "c"]:
        api.ok("POST", "/api/exchanges/%2F/amq.default/publish", publish_json(name, body))
    got = api.ok("POST", qpath + "/get", get_json(1, "reject_requeue_true"))
    assert [m["payload"] for m in got] == ["a"]
    assert message_count(ch, name) == 3
    got = api.ok("POST", qpath + "/get", get_json(1, "reject_requeue_false"))
    assert [(m["payload"], m["redelivered"]) for m in got] == [("a", True)]
    assert message_count(ch, name) == 2
    # truncate cuts the payload, payload_bytes keeps its size; auto falls back to base64.
    api.ok("POST", "/api/exchanges/%2F/amq.default/publish",
           publish_json(name, base64.b64encode(b"\xff\xfe\x00").decode(), {}, "base64"))
    got = api.ok("POST", qpath + "/get", get_json(3, "ack_requeue_false", "auto", 1))
    assert [(m["payload"], m["payload_bytes"], m["payload_encoding"]) for m in got] == [
        ("b", 1, "string"), ("c", 1, "string"), ("/w==", 3, "base64")]
    api.delete(qpath)


def test_publish_and_get_errors_are_rabbitmqs(api, name):
    r = api.post(f"/api/exchanges/%2F/{q(name)}.none/publish", publish_json("k", "x"))
    assert (r.status, r.json) == (400, {
        "error": "bad_request",
        "reason": f"404 NOT_FOUND - no exchange '{name}.none' in vhost '/'"})
    r = api.post("/api/exchanges/%2F/amq.default/publish", publish_json("k", "x", {}, "bogus"))
    assert (r.status, r.json) == (400, {"error": "bad_request",
                                        "reason": ["unsupported_encoding", "bogus"]})
    r = api.post(f"/api/queues/%2F/{q(name)}.none/get", get_json(1))
    assert (r.status, r.json) == (404, {
        "error": "not_found", "reason": f"NOT_FOUND - no queue '{name}.none' in vhost '/'"})


def test_bodies_as_the_classic_rabbitmqadmin_sends_them(api, ch, name):
    """The classic (Python) rabbitmqadmin sends every value as a string: "true", "1"."""
    qpath, xpath = f"/api/queues/%2F/{q(name)}", f"/api/exchanges/%2F/{q(name)}"
    assert api.put(qpath, {"durable": "true", "auto_delete": "false", "arguments": {}}).status \
        == 201
    assert api.ok("GET", qpath)["durable"] is True
    assert api.put(xpath, {"type": "fanout", "durable": "false", "auto_delete": "false",
                           "internal": "false", "arguments": {}}).status == 201
    assert api.post(f"/api/bindings/%2F/e/{q(name)}/q/{q(name)}",
                    {"routing_key": "r", "arguments": {}}).status == 201
    assert api.ok("POST", f"{xpath}/publish", publish_json("r", "classic")) == {"routed": True}
    got = api.ok("POST", f"{qpath}/get", {"count": "1", "ackmode": "ack_requeue_false",
                                          "encoding": "auto", "truncate": "50000"})
    assert [m["payload"] for m in got] == ["classic"]
    api.delete(xpath)
    api.delete(qpath)


# ---------------------------------------------------------------- exchanges

def test_exchange_put_list_and_delete(api, ch, name):
    path = f"/api/exchanges/%2F/{q(name)}"
    assert api.put(path, {"type": "topic", "durable": True}).status == 201
    ch.exchange_declare(name, "topic", passive=True)
    assert api.put(path, {"type": "topic", "durable": True}).status == 204
    r = api.put(path, {"type": "direct", "durable": True})
    assert (r.status, r.json) == (400, {
        "error": "bad_request",
        "reason": f"inequivalent arg 'type' for exchange '{name}' in vhost '/': "
                  "received 'direct' but current is 'topic'"})
    got = api.ok("GET", path)
    assert {k: got[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal",
                                "arguments")} == {
        "name": name, "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
        "internal": False, "arguments": {}}
    names = [x["name"] for x in api.ok("GET", "/api/exchanges/%2F")]
    assert {"", "amq.direct", "amq.topic", name} <= set(names)
    assert name in [x["name"] for x in api.ok("GET", "/api/exchanges")]
    default = api.ok("GET", "/api/exchanges/%2F/amq.default")
    assert (default["name"], default["type"], default["durable"]) == ("", "direct", True)

    # if-unused: a binding from it keeps it.
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, name, "k")
    r = api.delete(path + "?if-unused=true")
    assert (r.status, r.json) == (400, {
        "error": "bad_request", "reason": f"exchange '{name}' in vhost '/' in use"})
    assert api.delete(path).status == 204
    r = api.get(path)
    assert (r.status, r.json) == (404, NOT_FOUND)
    r = api.put(f"/api/exchanges/%2F/{q(name)}.bad", {"type": "bogus"})
    assert (r.status, r.json) == (400, {"error": "bad_request",
                                        "reason": "unknown exchange type 'bogus'"})


# ---------------------------------------------------------------- bindings

def test_bindings_are_made_listed_and_removed_by_properties_key(api, ch, name):
    xq, qq = f"/api/exchanges/%2F/{q(name)}", f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", xq, {"type": "topic"})
    api.ok("PUT", qq)
    base = f"/api/bindings/%2F/e/{q(name)}/q/{q(name)}"
    r = api.post(base, {"routing_key": "a.b", "arguments": {}})
    assert (r.status, r.headers["Location"]) == (201, f"{q(name)}/a.b")
    r = api.post(base, {})
    assert (r.status, r.headers["Location"]) == (201, f"{q(name)}/~")
    r = api.post(base, {"routing_key": "a b/c", "arguments": {"x": 1}})
    assert r.status == 201
    key_with_args = urllib.parse.unquote(r.headers["Location"].split("/", 1)[1])
    assert key_with_args.startswith("a+b%2Fc~") and len(key_with_args) == len("a+b%2Fc~") + 6

    between = api.ok("GET", base)
    assert sorted((b["routing_key"], b["properties_key"]) for b in between) == [
        ("", "~"), ("a b/c", key_with_args), ("a.b", "a.b")]
    assert all({b["source"], b["destination"], b["destination_type"], b["vhost"]} ==
               {name, name, "queue", "/"} for b in between)
    one = api.ok("GET", f"{base}/{q(key_with_args)}")
    assert (one["routing_key"], one["arguments"]) == ("a b/c", {"x": 1})

    # The binding routes: a publish through the exchange reaches the queue.
    ch.basic_publish(name, "a.b", b"routed")
    assert get(ch, name)[2] == b"routed"

    of_queue = api.ok("GET", f"{qq}/bindings")
    assert {"source": "", "vhost": "/", "destination": name, "destination_type": "queue",
            "routing_key": name, "arguments": {}, "properties_key": q(name)} in of_queue
    assert len(of_queue) == 4
    assert len(api.ok("GET", f"{xq}/bindings/source")) == 3
    assert len([b for b in api.ok("GET", "/api/bindings/%2F") if b["source"] == name]) == 3
    assert len([b for b in api.ok("GET", "/api/bindings") if b["source"] == name]) == 3

    assert api.delete(f"{base}/a.b").status == 204
    r = api.delete(f"{base}/a.b")
    assert (r.status, r.json) == (404, NOT_FOUND)
    r = api.get(f"{base}/a.b")
    assert (r.status, r.json) == (404, NOT_FOUND)
    ch.basic_publish(name, "a.b", b"not routed")
    ch.basic_publish(name, "", b"routed by ~")
    assert get(ch, name)[2] == b"routed by ~"
    api.delete(xq)
    api.delete(qq)


def test_exchange_to_exchange_bindings(api, ch, name):
    src, dst = f"{name}.src", f"{name}.dst"
    api.ok("PUT", f"/api/exchanges/%2F/{q(src)}", {"type": "direct"})
    api.ok("PUT", f"/api/exchanges/%2F/{q(dst)}", {"type": "fanout"})
    r = api.post(f"/api/bindings/%2F/e/{q(src)}/e/{q(dst)}", {"routing_key": "k"})
    assert (r.status, r.headers["Location"]) == (201, f"{q(dst)}/k")
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, dst)
    ch.basic_publish(src, "k", b"via two exchanges")
    assert get(ch, name)[2] == b"via two exchanges"
    assert [(b["source"], b["destination"], b["destination_type"])
            for b in api.ok("GET", f"/api/exchanges/%2F/{q(dst)}/bindings/destination")] == [
        (src, dst, "exchange")]
    assert api.delete(f"/api/bindings/%2F/e/{q(src)}/e/{q(dst)}/k").status == 204
    assert api.ok("GET", f"/api/bindings/%2F/e/{q(src)}/e/{q(dst)}") == []
    api.delete(f"/api/exchanges/%2F/{q(src)}")
    api.delete(f"/api/exchanges/%2F/{q(dst)}")


def test_binding_to_a_missing_end_is_404_with_amqps_text(api, name):
    api.ok("PUT", f"/api/queues/%2F/{q(name)}")
    r = api.post(f"/api/bindings/%2F/e/{q(name)}.none/q/{q(name)}", {})
    assert (r.status, r.json) == (404, {
        "error": "not_found", "reason": f"no exchange '{name}.none' in vhost '/'"})
    r = api.post(f"/api/bindings/%2F/e/amq.direct/q/{q(name)}.none", {})
    assert (r.status, r.json) == (404, {
        "error": "not_found", "reason": f"no queue '{name}.none' in vhost '/'"})
    api.delete(f"/api/queues/%2F/{q(name)}")


# ---------------------------------------------------------------- connections, channels, consumers

def test_connections_channels_and_consumers_are_listed_and_a_connection_closed(
        broker, api, name):
    c = broker.connect(client_properties={"connection_name": name})
    try:
        ch = c.channel()
        ch.queue_declare(name, exclusive=True)
        ch.basic_qos(prefetch_count=7)
        ch.basic_consume(name, lambda *a: None, consumer_tag=f"{name}.ctag")
        local_port = c._impl._transport._sock.getsockname()[1]

        def mine():
            return [x for x in api.ok("GET", "/api/connections")
                    if x.get("user_provided_name") == name]
        conns = wait_for(mine, timeout=STATS_WAIT_S, interval=0.5, what="the connection")
        conn = conns[0]
        assert (conn["user"], conn["vhost"], conn["peer_port"], conn["protocol"]) == \
            ("guest", "/", local_port, "AMQP 0-9-1")
        assert conn["client_properties"]["connection_name"] == name
        assert conn["name"].startswith(f"127.0.0.1:{local_port} -> ")
        assert api.ok("GET", f"/api/connections/{q(conn['name'])}")["name"] == conn["name"]
        assert conn["name"] in [x["name"] for x in api.ok("GET", "/api/vhosts/%2F/connections")]

        def channel():
            return [x for x in api.ok("GET", "/api/channels")
                    if x["name"] == f"{conn['name']} (1)" and x["consumer_count"] == 1]
        chan = wait_for(channel, timeout=STATS_WAIT_S, interval=0.5, what="the channel")[0]
        assert (chan["number"], chan["prefetch_count"], chan["user"], chan["vhost"]) == \
            (1, 7, "guest", "/")
        assert chan["connection_details"]["name"] == conn["name"]

        def consumer():
            return [x for x in api.ok("GET", "/api/consumers/%2F")
                    if x["consumer_tag"] == f"{name}.ctag"]
        cons = wait_for(consumer, timeout=STATS_WAIT_S, interval=0.5, what="the consumer")[0]
        assert cons["queue"] == {"name": name, "vhost": "/"}
        assert (cons["ack_required"], cons["exclusive"], cons["prefetch_count"]) == \
            (True, False, 7)
        assert cons["channel_details"]["connection_name"] == conn["name"]
        assert f"{name}.ctag" in [x["consumer_tag"] for x in api.ok("GET", "/api/consumers")]

        r = api.delete(f"/api/connections/{q(conn['name'])}", headers={"X-Reason": "bye now"})
        assert r.status == 204
        with pytest.raises(ConnectionClosedByBroker) as e:
            c.process_data_events(time_limit=5)
            c.process_data_events(time_limit=5)
        assert (e.value.reply_code, e.value.reply_text) == (320, "CONNECTION_FORCED - bye now")
    finally:
        if c.is_open:
            c.close()
    r = api.get("/api/connections/no%20such%20connection")
    assert (r.status, r.json) == (404, NOT_FOUND)


# ---------------------------------------------------------------- whoami, aliveness, health

def test_whoami_aliveness_and_health_checks(broker, api):
    assert api.ok("GET", "/api/whoami") == {"name": "guest", "tags": ["administrator"]}
    assert api.ok("GET", "/api/aliveness-test/%2F") == {"status": "ok"}
    # certificate-expiration: no TLS listener here, so no certificate expires (3.10 has it).
    for check in ["alarms", "local-alarms", "virtual-hosts", "node-is-quorum-critical",
                  "certificate-expiration/1/weeks"]:
        assert api.ok("GET", f"/api/health/checks/{check}")["status"] == "ok", check
    assert api.ok("GET", f"/api/health/checks/port-listener/{broker.port}") == {
        "status": "ok", "port": broker.port}
    unused = broker.port + 1 if broker.port < 65000 else 1
    r = api.get(f"/api/health/checks/port-listener/{unused}")
    assert r.status == 503
    assert (r.json["status"], r.json["reason"], r.json["missing"]) == (
        "failed", "No active listener", unused)
    assert broker.port in r.json["ports"]
    assert api.ok("GET", "/api/health/checks/protocol-listener/amqp") == {
        "status": "ok", "protocol": "amqp"}
    r = api.get("/api/health/checks/protocol-listener/mqtt")
    assert r.status == 503
    assert (r.json["status"], r.json["reason"], r.json["missing"]) == (
        "failed", "No active listener", "mqtt")


def test_overview_counts_what_the_node_holds(api, ch, name):
    ch.queue_declare(name, exclusive=True)
    o = api.ok("GET", "/api/overview")
    assert {"management_version", "rabbitmq_version", "product_name", "node", "object_totals",
            "queue_totals", "exchange_types", "listeners"} <= set(o)
    assert {"connections", "channels", "consumers", "queues", "exchanges"} <= \
        set(o["object_totals"])
    assert o["object_totals"]["queues"] >= 1
    assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(o["queue_totals"])
    assert {"direct", "fanout", "topic", "headers"} <= {t["name"] for t in o["exchange_types"]}
    assert "amqp" in {listener["protocol"] for listener in o["listeners"]}


def test_queue_and_overview_message_stats_count_publish_deliver_redeliver_ack(api, ch, name):
    path = f"/api/queues/%2F/{q(name)}"
    api.ok("PUT", path)
    for i in range(3):
        ch.basic_publish("", name, b"m%d" % i)
    first = get(ch, name, auto_ack=False)[0]
    ch.basic_ack(first.delivery_tag)
    second = get(ch, name, auto_ack=False)[0]
    ch.basic_nack(second.delivery_tag, requeue=True)
    again = get(ch, name, auto_ack=False)[0]
    assert again.redelivered
    ch.basic_ack(again.delivery_tag)
    want = {"publish": 3, "deliver_get": 3, "redeliver": 1, "ack": 2}

    def counted():
        stats = api.ok("GET", path).get("message_stats", {})
        return stats if {k: stats.get(k) for k in want} == want else None
    stats = wait_for(counted, timeout=STATS_WAIT_S, interval=0.5, what="the queue's counters")
    for k in want:
        assert isinstance(stats[f"{k}_details"]["rate"], (int, float)), k
    overview = api.ok("GET", "/api/overview")["message_stats"]
    for k in want:
        assert overview[k] >= want[k], k
        assert isinstance(overview[f"{k}_details"]["rate"], (int, float)), k
    api.delete(path)


# ---------------------------------------------------------------- who sees and does what

@pytest.fixture
def tagged(api, name):
    """A vhost of its own and users with each management tag: (vhost, {tag: Api})."""
    vhost = f"{name}.vhost"
    api.ok("PUT", f"/api/vhosts/{q(vhost)}")
    users = {}
    for tag in ["management", "policymaker", "monitoring", "administrator", ""]:
        user = f"{name}.{tag or 'none'}"
        api.ok("PUT", f"/api/users/{q(user)}", {"password": "pw", "tags": tag})
        users[tag] = api.as_user(user, "pw")
    api.ok("PUT", f"/api/permissions/{q(vhost)}/{q(users['management'].user)}",
           {"configure": ".*", "write": ".*", "read": ".*"})
    yield vhost, users
    for u in users.values():
        api.delete(f"/api/users/{q(u.user)}")
    api.delete(f"/api/vhosts/{q(vhost)}")


def test_users_without_a_management_tag_or_a_good_password_are_refused(api, tagged):
    _, users = tagged
    r = users[""].get("/api/whoami")
    assert (r.status, r.json) == (401, {"error": "not_authorised",
                                        "reason": "Not management user"})
    r = api.as_user("guest", "wrong").get("/api/whoami")
    assert (r.status, r.json) == (401, {"error": "not_authorized", "reason": "Login failed"})
    for tag in ["management", "policymaker", "monitoring", "administrator"]:
        assert users[tag].ok("GET", "/api/whoami") == {"name": users[tag].user, "tags": [tag]}


def test_a_management_user_sees_and_changes_only_its_vhosts(api, tagged, name):
    vhost, users = tagged
    mg = users["management"]
    assert [v["name"] for v in mg.ok("GET", "/api/vhosts")] == [vhost]
    assert mg.put(f"/api/queues/{q(vhost)}/{q(name)}").status == 201
    assert {x["vhost"] for x in mg.ok("GET", "/api/queues")} == {vhost}
    assert {x["vhost"] for x in mg.ok("GET", "/api/exchanges")} == {vhost}
    for method, path in [("GET", "/api/queues/%2F"), ("GET", "/api/exchanges/%2F"),
                         ("PUT", f"/api/queues/%2F/{q(name)}"),
                         ("GET", "/api/aliveness-test/%2F")]:
        r = mg.call(method, path, {} if method == "PUT" else None)
        assert (r.status, r.json) == (401, NOT_VHOST), path
    r = mg.get("/api/users")
    assert (r.status, r.json) == (401, {"error": "not_authorised",
                                        "reason": "Not administrator user"})
    r = mg.get("/api/nodes")
    assert (r.status, r.json) == (401, {"error": "not_authorised", "reason": "Not monitor user"})
    assert mg.ok("GET", f"/api/aliveness-test/{q(vhost)}") == {"status": "ok"}
    assert mg.delete(f"/api/queues/{q(vhost)}/{q(name)}").status == 204


def test_a_user_without_permissions_in_a_vhost_cannot_change_it(api, tagged, name):
    vhost, users = tagged
    # A policymaker without permissions does not see the vhost at all.
    pm = users["policymaker"]
    assert vhost not in [v["name"] for v in pm.ok("GET", "/api/vhosts")]
    r = pm.put(f"/api/queues/{q(vhost)}/{q(name)}")
    assert (r.status, r.json) == (401, NOT_VHOST)
    # An administrator sees every vhost, but changes one through an AMQP connection of its
    # own, which its missing permissions refuse.
    admin = users["administrator"]
    assert admin.ok("GET", f"/api/queues/{q(vhost)}") == []
    r = admin.put(f"/api/queues/{q(vhost)}/{q(name)}")
    assert (r.status, r.json) == (401, ACCESS_REFUSED)
    r = admin.get(f"/api/aliveness-test/{q(vhost)}")
    assert (r.status, r.json) == (401, ACCESS_REFUSED)


def test_a_monitoring_user_reads_node_wide_state(broker, api, tagged, name):
    vhost, users = tagged
    mon = users["monitoring"]
    assert {"/", vhost} <= {v["name"] for v in mon.ok("GET", "/api/vhosts")}
    assert mon.ok("GET", "/api/nodes")
    r = mon.get("/api/users")
    assert (r.status, r.json) == (401, {"error": "not_authorised",
                                        "reason": "Not administrator user"})
    r = mon.get("/api/queues/%2F")
    assert (r.status, r.json) == (401, NOT_VHOST)
    c = broker.connect(client_properties={"connection_name": name})
    try:
        def seen_by(who):
            return [x for x in who.ok("GET", "/api/connections")
                    if x.get("user_provided_name") == name]
        # A monitor sees guest's connection; a management user only its own.
        wait_for(lambda: seen_by(mon), timeout=STATS_WAIT_S, interval=0.5,
                 what="guest's connection, as the monitor sees it")
        assert seen_by(users["management"]) == []
    finally:
        c.close()


def test_creating_a_vhost_grants_its_creator_full_permissions(api, name):
    vhost = f"{name}.granted"
    assert api.put(f"/api/vhosts/{q(vhost)}").status == 201
    try:
        assert api.ok("GET", f"/api/permissions/{q(vhost)}/guest") == {
            "user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}
        assert api.put(f"/api/vhosts/{q(vhost)}").status == 204
    finally:
        api.delete(f"/api/vhosts/{q(vhost)}")


# ---------------------------------------------------------------- rabbitmqadmin v2

def rabbitmqadmin_binary():
    """rabbitmqadmin v2 (the crate of that name), as `scripts/interop-setup.sh` installs it."""
    candidates = [os.environ.get("RABBITMQADMIN", ""),
                  os.path.join(os.path.dirname(__file__), "..", "..", "..", ".tools", "bin",
                               "rabbitmqadmin"),
                  shutil.which("rabbitmqadmin") or ""]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            try:
                out = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=10)
            except OSError:
                continue
            if out.returncode == 0 and " 2." in out.stdout:
                return c
    return None


def test_rabbitmqadmin_v2_declares_lists_publishes_gets_and_deletes(api, name):
    binary = rabbitmqadmin_binary()
    if binary is None:
        pytest.skip("rabbitmqadmin v2 is not installed (scripts/interop-setup.sh installs it)")
    uri = urllib.parse.urlparse(api.base)

    def admin(*args):
        cmd = [binary, "--host", uri.hostname, "--port", str(uri.port), "--username", api.user,
               "--password", api.password, "--vhost", "/", "--non-interactive", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{args}: {out.stdout}{out.stderr}"
        return out.stdout

    qn, xn = f"{name}.q", f"{name}.x"
    admin("declare", "queue", "--name", qn, "--type", "classic", "--durable", "true")
    admin("declare", "exchange", "--name", xn, "--type", "topic")
    admin("declare", "binding", "--source", xn, "--destination-type", "queue",
          "--destination", qn, "--routing-key", "k.*")
    assert qn in admin("list", "queues")
    assert xn in admin("list", "exchanges")
    assert "k.*" in admin("list", "bindings")
    admin("publish", "message", "--exchange", xn, "--routing-key", "k.1",
          "--payload", "from-rabbitmqadmin")
    assert "from-rabbitmqadmin" in admin("get", "messages", "--queue", qn, "--count", "1",
                                         "--ack-mode", "ack_requeue_false")
    assert api.ok("POST", f"/api/queues/%2F/{q(qn)}/get", get_json(1)) == []
    admin("publish", "message", "--routing-key", qn, "--payload", "to-purge")
    admin("purge", "queue", "--name", qn)
    admin("delete", "binding", "--source", xn, "--destination-type", "queue",
          "--destination", qn, "--routing-key", "k.*")
    admin("delete", "exchange", "--name", xn)
    admin("delete", "queue", "--name", qn)
    assert api.get(f"/api/queues/%2F/{q(qn)}").status == 404
    assert api.get(f"/api/exchanges/%2F/{q(xn)}").status == 404
    # (`list nodes` is left out: rabbitmqadmin 2.35 wants `being_drained`, which RabbitMQ 3.10
    # does not send; warren sends it.)
    for listing in [("list", "connections"), ("list", "channels"), ("list", "consumers"),
                    ("list", "vhosts"), ("list", "users"), ("show", "overview"),
                    ("health_check", "local_alarms")]:
        admin(*listing)
