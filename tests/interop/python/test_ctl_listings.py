"""rabbitmqctl's listings with info items (`list_queues name messages`, `list_bindings`,
`list_connections`, `list_channels`, `list_consumers`, `list_permissions`,
`list_user_permissions`) and its queue and connection operations (`purge_queue`,
`delete_queue`, `close_connection`): the same tests pass against RabbitMQ 3.10's rabbitmqctl
(scripts/interop.sh --broker rabbitmq).

Rows are read as rabbitmqctl prints them: tab-separated, under a header of the items asked
for; the lines before the header (`Listing queues ...`, rabbitmqctl's `Timeout: ...`) are not
compared."""

import time

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from helpers import scratch_user, scratch_vhost

PASSWORD = "ctl-pw"
DEADLINE_S = 30.0


@pytest.fixture
def vhost(broker, name):
    yield from scratch_vhost(broker, f"ctl-{name}")


@pytest.fixture
def user(broker, vhost, name):
    yield from scratch_user(broker, f"ctl-user-{name}", PASSWORD, vhost)


def rows(out, header):
    """The rows under `header` (the items asked for, tab-separated) in a listing's output; none
    when there is no header (rabbitmqctl prints none over an empty listing)."""
    lines = out.splitlines()
    if "\t".join(header) not in lines:
        return []
    start = lines.index("\t".join(header)) + 1
    return [tuple(line.split("\t")) for line in lines[start:] if line]


def listed(broker, header, *command):
    return rows(broker.ctl(*command, *header), header)


def eventually(check, what):
    end = time.monotonic() + DEADLINE_S
    last = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not true after {DEADLINE_S} s (last: {last!r})")


def connect(broker, vhost, user, password=PASSWORD):
    return broker.connect(virtual_host=vhost, credentials=pika.PlainCredentials(user, password))


def test_list_queues_takes_info_items_and_purge_and_delete_queue_act_on_the_queue(broker, vhost):
    conn = connect(broker, vhost, "guest", "guest")
    ch = conn.channel()
    ch.queue_declare("ctl-q", durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", "ctl-q", f"m{i}".encode())
    header = ("name", "messages", "durable")
    eventually(lambda: ("ctl-q", "3", "true") in listed(broker, header, "list_queues", "-p", vhost),
               "three messages listed")
    broker.ctl("purge_queue", "-p", vhost, "ctl-q")
    assert ("ctl-q", "0", "true") in listed(broker, header, "list_queues", "-p", vhost)
    broker.ctl("delete_queue", "-p", vhost, "ctl-q")
    assert not [r for r in listed(broker, header, "list_queues", "-p", vhost) if r[0] == "ctl-q"]
    conn.close()


def test_delete_queue_if_empty_keeps_a_queue_with_messages(broker, vhost):
    conn = connect(broker, vhost, "guest", "guest")
    ch = conn.channel()
    ch.queue_declare("ctl-full", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "ctl-full", b"m")
    try:
        broker.ctl("delete_queue", "-p", vhost, "--if-empty", "ctl-full")
    except AssertionError:
        pass  # refused, as it should be (rabbitmqctl exits non-zero too)
    assert ("ctl-full",) in listed(broker, ("name",), "list_queues", "-p", vhost)
    ch.queue_purge("ctl-full")
    broker.ctl("delete_queue", "-p", vhost, "--if-empty", "ctl-full")
    assert ("ctl-full",) not in listed(broker, ("name",), "list_queues", "-p", vhost)
    conn.close()


def test_list_bindings_names_source_destination_and_key(broker, vhost):
    conn = connect(broker, vhost, "guest", "guest")
    ch = conn.channel()
    ch.queue_declare("ctl-bound", durable=True)
    ch.queue_bind("ctl-bound", "amq.direct", "the-key")
    header = ("source_name", "source_kind", "destination_name", "destination_kind", "routing_key")
    got = listed(broker, header, "list_bindings", "-p", vhost)
    assert ("amq.direct", "exchange", "ctl-bound", "queue", "the-key") in got, got
    # The default exchange's implicit binding, as rabbitmqctl lists it.
    assert ("", "exchange", "ctl-bound", "queue", "ctl-bound") in got, got
    conn.close()


def test_clients_are_listed_with_their_user_and_vhost(broker, vhost, user):
    conn = connect(broker, vhost, user)
    ch = conn.channel()
    ch.queue_declare("ctl-consumed", durable=True)
    ch.basic_qos(prefetch_count=7)
    ch.basic_consume("ctl-consumed", lambda *a: None, consumer_tag="ctl-tag")
    eventually(lambda: (user, vhost) in listed(broker, ("user", "vhost"), "list_connections"),
               "the connection listed")
    eventually(lambda: (user, "1") in listed(broker, ("user", "consumer_count"), "list_channels"),
               "the channel and its consumer listed")
    consumers = listed(broker, ("queue_name", "consumer_tag", "ack_required", "prefetch_count"),
                       "list_consumers", "-p", vhost)
    assert ("ctl-consumed", "ctl-tag", "true", "7") in consumers, consumers
    conn.close()


def test_close_connection_closes_it_with_the_explanation(broker, vhost, user):
    conn = connect(broker, vhost, user)
    conn.channel()
    # rabbitmqctl names a connection by its pid (warren's pid is the connection's name).
    named = eventually(lambda: [r for r in listed(broker, ("pid", "user"), "list_connections")
                                if r[1] == user], "the connection listed")
    broker.ctl("close_connection", named[0][0], "maintenance window")
    with pytest.raises(ConnectionClosedByBroker) as e:
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            conn.process_data_events(time_limit=0.2)
    assert e.value.reply_code == 320
    assert "maintenance window" in e.value.reply_text


def test_permissions_are_listed_per_vhost_and_per_user(broker, vhost, user):
    broker.ctl("set_permissions", "-p", vhost, user, "^cfg", "^w", "^r")
    got = rows(broker.ctl("list_permissions", "-p", vhost), ("user", "configure", "write", "read"))
    assert (user, "^cfg", "^w", "^r") in got, got
    got = rows(broker.ctl("list_user_permissions", user), ("vhost", "configure", "write", "read"))
    assert got == [(vhost, "^cfg", "^w", "^r")], got


def test_an_unknown_info_item_is_refused(broker, vhost):
    conn = connect(broker, vhost, "guest", "guest")
    conn.channel().queue_declare("ctl-any", durable=True)
    conn.close()
    with pytest.raises(AssertionError):
        broker.ctl("list_queues", "-p", vhost, "name", "no_such_item")
