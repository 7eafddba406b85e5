"""Server-side paging of `/api/queues` as RabbitMQ's management API (and its UI) asks for it:
`?page=&page_size=&name=&use_regex=&sort=&sort_reverse=`, RabbitMQ's envelope around the page,
and its 400s for parameters that are not a page. The expectations are RabbitMQ 3.10's; the module
runs against it too when its management API answers."""

import urllib.error
import urllib.parse
import urllib.request

import pytest

from test_management_api import Api


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
