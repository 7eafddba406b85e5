"""GET /api/definitions in RabbitMQ's export format: what RabbitMQ 3.10 puts in (and leaves out),
field by field, so that tools reading RabbitMQ's definitions read warren's. Runs against RabbitMQ
too when its management API answers at the broker's management URI."""

import json
import urllib.error

import pytest

from helpers import management

QUEUE_FIELDS = {"name", "vhost", "durable", "auto_delete", "arguments"}
EXCHANGE_FIELDS = {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"}
BINDING_FIELDS = {"source", "vhost", "destination", "destination_type", "routing_key", "arguments"}


def definitions(broker, path="/api/definitions"):
    try:
        return json.loads(management(broker, path))
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, ConnectionError) as e:
        if broker.is_rabbitmq:
            pytest.skip(f"RabbitMQ's management API does not answer: {e}")
        raise


def test_definitions_hold_the_topology_in_rabbitmqs_export_format(broker, conn, ch, name):
    ch.exchange_declare(f"{name}.x", "topic", durable=True,
                        arguments={"alternate-exchange": f"{name}.ae"})
    ch.exchange_declare(f"{name}.ae", "fanout", durable=True)
    ch.queue_declare(f"{name}.q", durable=True, arguments={"x-max-length": 10})
    ch.queue_declare(f"{name}.excl", exclusive=True)
    ch.queue_bind(f"{name}.q", f"{name}.x", "eu.#", arguments={"x-foo": "bar"})
    ch.queue_bind(f"{name}.q", "amq.direct", name)
    ch.queue_bind(f"{name}.excl", f"{name}.x", "excl")
    ch.exchange_bind(f"{name}.ae", f"{name}.x", "zz")

    d = definitions(broker)
    assert {"rabbit_version", "users", "vhosts", "permissions", "queues", "exchanges",
            "bindings", "policies", "parameters", "global_parameters",
            "topic_permissions"} <= set(d)
    guest = next(u for u in d["users"] if u["name"] == "guest")
    assert guest["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert len(guest["password_hash"]) == 48  # base64 of a 4-byte salt and a SHA-256
    assert "administrator" in guest["tags"]
    assert {"name": "/"} in [{"name": v["name"]} for v in d["vhosts"]]
    assert {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*",
            "read": ".*"} in d["permissions"]

    queues = {q["name"]: q for q in d["queues"] if q["name"].startswith(name)}
    # An exclusive queue means nothing without its connection: RabbitMQ leaves it out.
    assert set(queues) == {f"{name}.q"}
    assert queues[f"{name}.q"] == {"name": f"{name}.q", "vhost": "/", "durable": True,
                                   "auto_delete": False, "arguments": {"x-max-length": 10}}
    exchanges = {x["name"]: x for x in d["exchanges"]}
    assert not [x for x in exchanges if x == "" or x.startswith("amq.")]
    assert exchanges[f"{name}.x"] == {
        "name": f"{name}.x", "vhost": "/", "type": "topic", "durable": True,
        "auto_delete": False, "internal": False, "arguments": {"alternate-exchange": f"{name}.ae"}}
    assert set(exchanges[f"{name}.ae"]) == EXCHANGE_FIELDS

    ours = [b for b in d["bindings"] if b["destination"].startswith(name)]
    assert all(set(b) == BINDING_FIELDS for b in ours)
    assert sorted((b["source"], b["destination"], b["destination_type"], b["routing_key"],
                   json.dumps(b["arguments"])) for b in ours) == sorted([
        (f"{name}.x", f"{name}.q", "queue", "eu.#", json.dumps({"x-foo": "bar"})),
        ("amq.direct", f"{name}.q", "queue", name, "{}"),
        (f"{name}.x", f"{name}.ae", "exchange", "zz", "{}"),
    ])

    # One vhost's: its entities without their vhost field, and nothing node-wide.
    v = definitions(broker, "/api/definitions/%2F")
    assert "users" not in v and "vhosts" not in v and "permissions" not in v
    mine = next(q for q in v["queues"] if q["name"] == f"{name}.q")
    assert set(mine) == QUEUE_FIELDS - {"vhost"}
    assert all("vhost" not in b for b in v["bindings"])


def test_definitions_are_sorted_so_that_equal_topologies_give_equal_documents(broker, ch, name):
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ lists its definitions in table order")
    for suffix in ("b", "a", "c"):
        ch.queue_declare(f"{name}.{suffix}", durable=True)
        ch.queue_bind(f"{name}.{suffix}", "amq.topic", suffix)
    d = definitions(broker)
    keys = [(q["vhost"], q["name"]) for q in d["queues"]]
    assert keys == sorted(keys)
    assert [u["name"] for u in d["users"]] == sorted(u["name"] for u in d["users"])
    ours = [b["destination"] for b in d["bindings"] if b["destination"].startswith(name)]
    assert ours == sorted(ours)


def test_definitions_of_a_missing_vhost_are_a_bad_request_as_in_rabbitmq(broker):
    with pytest.raises(urllib.error.HTTPError) as e:
        definitions(broker, "/api/definitions/no-such-vhost")
    assert e.value.code == 400
    assert json.loads(e.value.read()) == {"error": "bad_request", "reason": "vhost_not_found"}
