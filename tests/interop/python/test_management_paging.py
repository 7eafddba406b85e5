"""Server-side paging of `/api/queues` as RabbitMQ's management API (and its UI) asks for it:
`?page=&page_size=&name=&use_regex=&sort=&sort_reverse=`, RabbitMQ's envelope around the page,
and its 400s for parameters that are not a page; the same for exchanges, connections and
channels, and (warren only: RabbitMQ 3.10 answers them whole) bindings. The expectations are
RabbitMQ 3.10's; the module runs against it too when its management API answers."""

import urllib.error
import urllib.parse
import urllib.request

import pytest

from helpers import wait_for
from test_management_api import STATS_WAIT_S, Api


@pytest.fixture
def queues(broker, name):
    """Seven queues named `{name}-0` .. `{name}-6`, deleted afterwards."""
    api = Api(broker)
    try:
        api.call("GET", "/api/overview")
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"the management API does not answer at {api.base}: {e}")
    names = [f"{name}-{i}" for i in range(7)]
    for n in names:
        assert api.call("PUT", f"/api/queues/%2F/{n}", {"durable": False}).status in (201, 204)
    yield api, names
    for n in names:
        api.call("DELETE", f"/api/queues/%2F/{n}")


def page(api, **params):
    r = api.call("GET", "/api/queues?" + urllib.parse.urlencode(params))
    return r.status, r.json


def test_a_page_holds_page_size_queues_and_rabbitmqs_counts(queues):
    api, names = queues
    status, body = page(api, page=2, page_size=3, name=names[0][:-2], sort="name")
    assert status == 200, body
    assert [q["name"] for q in body["items"]] == names[3:6]
    assert {k: body[k] for k in ("page", "page_size", "page_count", "item_count", "filtered_count")} == \
        {"page": 2, "page_size": 3, "page_count": 3, "item_count": 3, "filtered_count": 7}
    assert body["total_count"] >= 7


def test_name_filters_by_substring_regardless_of_case_or_by_regex(queues):
    api, names = queues
    _, body = page(api, page=1, name=names[2].upper())
    assert [q["name"] for q in body["items"]] == [names[2]]
    _, body = page(api, page=1, name=f"^{names[0][:-2]}-[35]$", use_regex="true")
    assert sorted(q["name"] for q in body["items"]) == [names[3], names[5]]


def test_sort_reverse_orders_the_page(queues):
    api, names = queues
    _, body = page(api, page=1, page_size=2, name=names[0][:-2], sort="name", sort_reverse="true")
    assert [q["name"] for q in body["items"]] == [names[6], names[5]]


def test_parameters_that_are_not_a_page_get_rabbitmqs_400s(queues):
    api, names = queues
    prefix = names[0][:-2]
    cases = [
        ({"page": 0}, "invalid_pagination_parameters",
         "Invalid pagination parameters: page number 0, page size undefined"),
        ({"page": 1, "page_size": 1000}, "invalid_pagination_parameters",
         "Invalid pagination parameters: page number 1, page size 1000"),
        ({"page": "x"}, "bad_request", "Pagination parameters are invalid"),
        ({"page": 1, "name": "(", "use_regex": "true"}, "bad_request",
         "Pagination parameters are invalid"),
        ({"page": 3, "page_size": 3, "name": prefix + "-1"}, "page_out_of_range",
         "Page out of range, page: 3 page size: 3, len: 1"),
    ]
    for params, error, reason in cases:
        status, body = page(api, **params)
        assert (status, body) == (400, {"error": error, "reason": reason}), params
    # A page just past the last starts at the end: empty, not refused.
    status, body = page(api, page=2, page_size=7, name=prefix)
    assert status == 200 and body["items"] == [] and body["page_count"] == 1


def test_exchanges_page_the_same_way(queues):
    api, _ = queues
    r = api.call("GET", "/api/exchanges/%2F?page=1&page_size=10&name=amq.TOPIC")
    assert r.status == 200, r
    assert [x["name"] for x in r.json["items"]] == ["amq.topic"]
    assert r.json["filtered_count"] == 1 and r.json["total_count"] >= 7


def exactly(names):
    """A regex matching exactly `names` (escaping the dots of addresses; both brokers' regex
    engines read it alike)."""
    return "^(" + "|".join(n.replace(".", "\\.") for n in names) + ")$"


@pytest.fixture
def clients(broker, queues, name):
    """Three connections named `{name}-c0..2`, each with two channels, and their names as the
    API lists them."""
    api, _ = queues
    conns = [broker.connect(client_properties={"connection_name": f"{name}-c{i}"}) for i in range(3)]
    try:
        for c in conns:
            c.channel()
            c.channel()

        def listed():
            mine = [x["name"] for x in api.call("GET", "/api/connections").json
                    if (x.get("user_provided_name") or "").startswith(f"{name}-c")]
            return sorted(mine) if len(mine) == 3 else None
        names = wait_for(listed, timeout=STATS_WAIT_S, interval=0.5, what="the connections")
        yield api, names
    finally:
        for c in conns:
            if c.is_open:
                c.close()


def test_connections_page_the_same_way(clients):
    api, names = clients
    r = api.call("GET", "/api/connections?" + urllib.parse.urlencode(
        {"page": 1, "page_size": 2, "name": exactly(names), "use_regex": "true", "sort": "name"}))
    assert r.status == 200, r
    assert [c["name"] for c in r.json["items"]] == names[:2]
    assert (r.json["filtered_count"], r.json["page_count"], r.json["item_count"]) == (3, 2, 2)
    assert r.json["total_count"] >= 3
    r = api.call("GET", "/api/connections?" + urllib.parse.urlencode(
        {"page": 2, "page_size": 2, "name": exactly(names), "use_regex": "true", "sort": "name"}))
    assert [c["name"] for c in r.json["items"]] == names[2:]
    # A substring of one name (its client's address) finds that one connection.
    one = names[1].split(" -> ")[0]
    r = api.call("GET", "/api/connections?page=1&name=" + urllib.parse.quote(one))
    assert [c["name"] for c in r.json["items"]] == [names[1]]
    r = api.call("GET", "/api/connections?page=0")
    assert (r.status, r.json) == (400, {
        "error": "invalid_pagination_parameters",
        "reason": "Invalid pagination parameters: page number 0, page size undefined"})
    assert isinstance(api.call("GET", "/api/connections").json, list)


def test_channels_page_the_same_way(clients):
    api, names = clients
    pattern = exactly(names)[:-2] + ") \\([12]\\)$"
    params = {"page": 1, "page_size": 4, "name": pattern, "use_regex": "true", "sort": "name",
              "sort_reverse": "true"}

    def paged():
        r = api.call("GET", "/api/channels?" + urllib.parse.urlencode(params))
        assert r.status == 200, r
        return r.json if r.json["filtered_count"] == 6 else None
    body = wait_for(paged, timeout=STATS_WAIT_S, interval=0.5, what="the channels")
    expected = sorted((f"{n} ({k})" for n in names for k in (1, 2)), reverse=True)
    assert [c["name"] for c in body["items"]] == expected[:4]
    assert (body["page_count"], body["item_count"]) == (2, 4)
    r = api.call("GET", "/api/channels?page=1&page_size=501")
    assert (r.status, r.json["error"]) == (400, "invalid_pagination_parameters")


def test_bindings_page_on_warren(broker, queues):
    api, names = queues
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ 3.10 answers /api/bindings whole, ignoring page")
    for n in names[:2]:
        assert api.call("POST", f"/api/bindings/%2F/e/amq.fanout/q/{n}", {}).status == 201
    prefix = names[0][:-2]
    for path in ("/api/bindings", "/api/bindings/%2F"):
        r = api.call("GET", f"{path}?page=1&page_size=4&sort=name&name={prefix}")
        assert r.status == 200, r
        got = [(b["source"], b["destination"]) for b in r.json["items"]]
        assert got == [("", names[0]), ("amq.fanout", names[0]), ("", names[1]),
                       ("amq.fanout", names[1])], path
        assert (r.json["filtered_count"], r.json["page_count"]) == (9, 3)
        r = api.call("GET", f"{path}?page=4&page_size=4&name={prefix}")
        assert (r.status, r.json["error"]) == (400, "page_out_of_range")
    assert isinstance(api.call("GET", "/api/bindings/%2F").json, list)
