"""Importing definitions (issue 13): `POST /api/definitions` (and per vhost), `ctl
import_definitions` / `export_definitions` and `--load-definitions` at boot, in RabbitMQ 3.10's
JSON format.

The reference document, fixtures/rabbitmq-3.10.8-definitions.json, was exported by the real
RabbitMQ 3.10.8 (users with their salted SHA-256 hashes, vhosts, permissions, policies, an
operator policy, classic and quorum queues, exchanges with arguments, queue and exchange
bindings). It must import and export back without loss, with working logins, and importing
twice must change nothing. Runs against RabbitMQ too (`scripts/interop.sh --broker rabbitmq`),
and when WARREN_TEST_RABBITMQ_MANAGEMENT_URI names a live RabbitMQ, its own export is imported
into the broker under test as well."""

import json
import os
import urllib.parse

import pika
import pytest

from helpers import wait_for
from test_management_api import Api

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "rabbitmq-3.10.8-definitions.json")
VHOST = "imported"
USERS = ("importer", "importer2")


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
def reference(api):
    """The RabbitMQ export, and the broker cleaned of what importing it adds afterwards."""
    with open(FIXTURE) as f:
        doc = json.load(f)
    yield doc
    api.delete(f"/api/vhosts/{VHOST}")
    for u in USERS:
        api.delete(f"/api/users/{u}")
    api.delete("/api/permissions/%2F/importer2")


def entries(doc, section, keep=lambda e: True):
    """A section's entries as canonical JSON texts (users without `limits`, tags sorted)."""
    out = set()
    for e in doc.get(section, []):
        if not keep(e):
            continue
        e = dict(e)
        if section == "users":
            e.pop("limits", None)
            e["tags"] = sorted(e["tags"] if isinstance(e["tags"], list)
                               else [t for t in e["tags"].split(",") if t])
        if section == "parameters" and e.get("component") != "operator_policy":
            continue
        out.add(json.dumps(e, sort_keys=True))
    return out


SECTIONS = ("users", "vhosts", "permissions", "policies", "parameters", "queues", "exchanges",
            "bindings")


def missing(expected, exported, keep=lambda section, e: True):
    """What of `expected` the export `exported` lacks, by section."""
    out = {}
    for section in SECTIONS:
        lacks = entries(expected, section, lambda e: keep(section, e)) - entries(exported, section)
        if lacks:
            out[section] = sorted(lacks)
    return out


def test_a_rabbitmq_export_imports_and_exports_back_without_loss(broker, api, reference):
    r = api.post("/api/definitions", reference)
    assert r.status == 204, r
    exported = api.get("/api/definitions").json
    # guest is the broker's own: RabbitMQ's hash of "guest" is imported, the password stays.
    assert missing(reference, exported) == {}
    for user, password, vhost in (("importer", "s3cret", VHOST), ("importer2", "other", "/")):
        c = pika.BlockingConnection(pika.URLParameters(
            f"amqp://{user}:{password}@{broker.host}:{broker.port}/{urllib.parse.quote(vhost, safe='')}"))
        c.close()
    c = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@{broker.host}:{broker.port}/{VHOST}"))
    ch = c.channel()
    ch.confirm_delivery()
    # The imported binding routes, and the imported policy (max-length 100 with reject-publish
    # under the argument's 500) is in force on the imported queue.
    ch.basic_publish("imp.x", "orders.new", b"routed")
    assert ch.queue_declare("imp.limited.q", passive=True).method.message_count == 1
    c.close()


def test_importing_twice_changes_nothing(api, reference):
    assert api.post("/api/definitions", reference).status == 204
    first = api.get(f"/api/definitions/{VHOST}").json
    assert api.post("/api/definitions", reference).status == 204
    assert api.get(f"/api/definitions/{VHOST}").json == first


def test_an_existing_queue_is_left_as_it_is(api, reference):
    assert api.put(f"/api/vhosts/{VHOST}").status in (201, 204)
    assert api.put(f"/api/queues/{VHOST}/imp.dead", {"durable": False}).status == 201
    assert api.post("/api/definitions", reference).status == 204, "as RabbitMQ: no 400"
    assert api.get(f"/api/queues/{VHOST}/imp.dead").json["durable"] is False


def test_a_vhosts_definitions_import_into_the_named_vhost(api, reference, name):
    assert api.put(f"/api/vhosts/{VHOST}").status in (201, 204)
    doc = {"queues": [{"name": name, "durable": True, "auto_delete": False,
                       "arguments": {"x-max-length": 3}}],
           "exchanges": [{"name": f"{name}.x", "type": "fanout", "durable": True,
                          "auto_delete": False, "internal": False, "arguments": {}}],
           "bindings": [{"source": f"{name}.x", "destination": name,
                         "destination_type": "queue", "routing_key": "", "arguments": {}}],
           "policies": [{"name": name, "pattern": "^" + name + "$", "apply-to": "queues",
                         "definition": {"max-length": 1}, "priority": 0}]}
    assert api.post(f"/api/definitions/{VHOST}", doc).status == 204
    exported = api.get(f"/api/definitions/{VHOST}").json
    assert doc["queues"][0] in exported["queues"]
    assert doc["exchanges"][0] in exported["exchanges"]
    assert doc["bindings"][0] in exported["bindings"]
    # RabbitMQ keeps `vhost` in a per-vhost document's policies, not in its queues.
    assert dict(doc["policies"][0], vhost=VHOST) in exported["policies"]


def test_bad_documents_are_refused(api, name):
    r = api.call("POST", "/api/definitions", raw=b"not json")
    assert (r.status, r.json) == (400, {"error": "bad_request", "reason": "failed_to_parse_json"})
    r = api.post("/api/definitions", {"queues": [{"name": name, "vhost": f"{name}.nope",
                                                  "durable": True, "auto_delete": False,
                                                  "arguments": {}}]})
    assert r.status == 400
    assert r.json["error"] == "bad_request"


def test_ctl_exports_and_imports_definition_files(broker, api, reference, tmp_path):
    if broker.is_rabbitmq:
        pytest.skip("rabbitmqctl reads files on the node's host: covered by the API tests")
    source = FIXTURE
    broker.ctl("import_definitions", source)
    out = str(tmp_path / "out.json")
    broker.ctl("export_definitions", out)
    with open(out) as f:
        exported = json.load(f)
    assert missing(reference, exported) == {}


def answers(api, path):
    """The JSON `path` answers with, or None while the API is not listening yet."""
    try:
        return api.get(path).json
    except OSError:
        return None


@pytest.mark.restart
def test_definitions_load_at_boot(broker, api, reference, tmp_path):
    if broker.is_rabbitmq:
        pytest.skip("load_definitions is a RabbitMQ config file setting")
    broker.restart(extra_args=["--load-definitions", FIXTURE])
    try:
        exported = wait_for(lambda: answers(api, "/api/definitions"), what="the management API")
        assert missing(reference, exported) == {}
    finally:
        broker.restart(extra_args=[])
        wait_for(lambda: answers(api, "/api/whoami"), what="the management API")


def test_a_live_rabbitmq_export_imports_without_loss(api, reference):
    uri = os.environ.get("WARREN_TEST_RABBITMQ_MANAGEMENT_URI")
    if not uri:
        pytest.skip("no live RabbitMQ named by WARREN_TEST_RABBITMQ_MANAGEMENT_URI")
    parsed = urllib.parse.urlparse(uri)
    rabbit = Api.__new__(Api)
    rabbit.base = f"http://{parsed.hostname}:{parsed.port}"
    rabbit.user, rabbit.password = parsed.username, parsed.password
    assert rabbit.post("/api/definitions", reference).status == 204
    live = rabbit.get("/api/definitions").json
    assert api.post("/api/definitions", live).status == 204
    exported = api.get("/api/definitions").json
    assert missing(live, exported) == {}
