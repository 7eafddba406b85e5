"""Exchange declare, delete, exchange-to-exchange bindings, the predeclared exchanges."""

import pytest
from pika.exceptions import ChannelClosedByBroker

from helpers import expect_channel_error, expect_connection_error, get, no_more_messages, wait_message_count

TYPES = ["direct", "fanout", "topic", "headers"]


@pytest.mark.parametrize("ex_type", TYPES)
def test_declare_each_exchange_type_then_passive_finds_it(ch, name, ex_type):
    ch.exchange_declare(name, ex_type)
    ch.exchange_declare(name, ex_type, passive=True)
    ch.exchange_declare(name, ex_type)  # an identical redeclare is a no-op
    ch.exchange_delete(name)


def test_passive_declare_of_missing_exchange_is_404(ch, name):
    expect_channel_error(404, f"NOT_FOUND - no exchange '{name}' in vhost '/'",
                         ch.exchange_declare, name, "direct", passive=True)


def test_redeclare_with_different_type_is_406(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "direct")
    text = expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange "
                                f"'{name}' in vhost '/'", conn.channel().exchange_declare, name, "fanout")
    assert text.endswith("received 'fanout' but current is 'direct'"), text
    conn.channel().exchange_delete(name)


def test_redeclare_with_different_durable_is_406(conn, name):
    conn.channel().exchange_declare(name, "direct", durable=False)
    text = expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange "
                                f"'{name}' in vhost '/'", conn.channel().exchange_declare, name,
                                "direct", durable=True)
    assert text.endswith("received 'true' but current is 'false'"), text
    conn.channel().exchange_delete(name)


def test_redeclare_with_different_auto_delete_is_406(conn, name):
    conn.channel().exchange_declare(name, "direct")
    expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange",
                         conn.channel().exchange_declare, name, "direct", auto_delete=True)
    conn.channel().exchange_delete(name)


def test_passive_declare_ignores_type_mismatch(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "direct")
    ch.exchange_declare(name, "fanout", passive=True)
    ch.exchange_delete(name)


def test_unknown_exchange_type_closes_connection_with_503_command_invalid(conn, name):
    # COMMAND_INVALID is a hard error: the whole connection goes, not just the channel.
    text = expect_connection_error(503, "COMMAND_INVALID - unknown exchange type 'x-no-such-type'",
                                   conn.channel().exchange_declare, name, "x-no-such-type")
    assert text == "COMMAND_INVALID - unknown exchange type 'x-no-such-type'"


def test_declare_with_reserved_amq_prefix_is_403(ch):
    expect_channel_error(403, "ACCESS_REFUSED - exchange name 'amq.interop-test' contains reserved "
                         "prefix 'amq.*'", ch.exchange_declare, "amq.interop-test", "direct")


def test_passive_declare_of_amq_direct_succeeds(ch):
    for ex, ex_type in [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                        ("amq.headers", "headers"), ("amq.match", "headers")]:
        ch.exchange_declare(ex, ex_type, passive=True)


def test_redeclare_of_amq_direct_with_same_properties_succeeds(ch):
    ch.exchange_declare("amq.direct", "direct", durable=True)


@pytest.mark.parametrize("ex,ex_type", [
    ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
    ("amq.headers", "headers"), ("amq.match", "headers")])
def test_predeclared_amq_exchanges_route(ch, ex, ex_type):
    q = ch.queue_declare("", exclusive=True).method.queue
    args = {"k": "v", "x-match": "all"} if ex_type == "headers" else None
    ch.queue_bind(q, ex, routing_key=q, arguments=args)
    import pika
    ch.basic_publish(ex, q, b"via " + ex.encode(), pika.BasicProperties(headers={"k": "v"}))
    assert get(ch, q)[2] == b"via " + ex.encode()


def test_deleting_amq_exchange_is_403(ch):
    expect_channel_error(403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost "
                         "'/' not allowed", ch.exchange_delete, "amq.direct")


def test_declaring_the_default_exchange_is_403(ch):
    expect_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.exchange_declare, "", "direct")


def test_passive_declare_of_the_default_exchange_is_403(ch):
    expect_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.exchange_declare, "", "direct", passive=True)


def test_deleting_the_default_exchange_is_403(ch):
    expect_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.exchange_delete, "")


def test_binding_a_queue_to_the_default_exchange_is_403(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    expect_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.queue_bind, q, "", routing_key="other")


def test_unbinding_a_queue_from_the_default_exchange_is_403(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    expect_channel_error(403, "ACCESS_REFUSED - operation not permitted on the default exchange",
                         ch.queue_unbind, q, "", routing_key=q)


def test_default_exchange_routes_by_queue_name(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"direct to queue")
    assert get(ch, q)[2] == b"direct to queue"


def test_publish_to_internal_exchange_is_403(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "fanout", internal=True)
    ch2 = conn.channel()
    ch2.basic_publish(name, "", b"x")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        ch2.queue_declare("", exclusive=True)  # a round trip surfaces the asynchronous close
    assert excinfo.value.reply_code == 403
    assert excinfo.value.reply_text == (f"ACCESS_REFUSED - cannot publish to internal exchange "
                                        f"'{name}' in vhost '/'")
    conn.channel().exchange_delete(name)


def test_internal_exchange_receives_through_e2e_binding(ch, name):
    ch.exchange_declare(name + ".in", "fanout")
    ch.exchange_declare(name + ".internal", "fanout", internal=True)
    ch.exchange_bind(name + ".internal", name + ".in")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name + ".internal")
    ch.basic_publish(name + ".in", "", b"through")
    assert get(ch, q)[2] == b"through"
    ch.exchange_delete(name + ".in")
    ch.exchange_delete(name + ".internal")


def test_delete_missing_exchange_succeeds(ch, name):
    ch.exchange_delete(name)  # RabbitMQ 3.10: deleting what is not there is not an error


def test_delete_if_unused_with_bindings_is_406(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "fanout")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name)
    expect_channel_error(406, f"PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use",
                         conn.channel().exchange_delete, name, if_unused=True)
    ch.queue_unbind(q, name)
    ch.exchange_delete(name, if_unused=True)
    expect_channel_error(404, "NOT_FOUND", conn.channel().exchange_declare, name, passive=True)


def test_delete_if_unused_counts_exchange_bindings_as_source(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name + ".src", "fanout")
    ch.exchange_declare(name + ".dst", "fanout")
    ch.exchange_bind(name + ".dst", name + ".src")
    expect_channel_error(406, "PRECONDITION_FAILED", conn.channel().exchange_delete, name + ".src",
                         if_unused=True)
    ch.exchange_delete(name + ".dst", if_unused=True)  # a destination is not "in use"
    ch.exchange_delete(name + ".src", if_unused=True)


def test_exchange_to_exchange_bind_routes_and_unbind_stops(ch, name):
    ch.exchange_declare(name + ".src", "topic")
    ch.exchange_declare(name + ".dst", "direct")
    ch.exchange_bind(name + ".dst", name + ".src", routing_key="a.*")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name + ".dst", routing_key="a.b")
    ch.basic_publish(name + ".src", "a.b", b"e2e")
    ch.basic_publish(name + ".src", "a.c", b"filtered by dst")
    ch.basic_publish(name + ".src", "b.b", b"filtered by src")
    assert get(ch, q)[2] == b"e2e"
    ch.exchange_unbind(name + ".dst", name + ".src", routing_key="a.*")
    ch.basic_publish(name + ".src", "a.b", b"after unbind")
    ch.basic_publish("", q, b"marker")
    assert get(ch, q)[2] == b"marker"
    ch.exchange_delete(name + ".src")
    ch.exchange_delete(name + ".dst")


def test_e2e_bindings_with_a_cycle_deliver_once(ch, name):
    a, b = name + ".a", name + ".b"
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(b, "fanout")
    ch.exchange_bind(b, a)
    ch.exchange_bind(a, b)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, a)
    ch.queue_bind(q, b)
    ch.basic_publish(a, "", b"once")
    wait_message_count(ch, q, 1)
    ch.basic_publish("", q, b"marker")
    wait_message_count(ch, q, 2)
    ch.exchange_delete(a)
    ch.exchange_delete(b)


def test_exchange_bind_to_missing_source_is_404(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "fanout")
    expect_channel_error(404, f"NOT_FOUND - no exchange '{name}.missing' in vhost '/'",
                         conn.channel().exchange_bind, name, name + ".missing")
    ch.exchange_delete(name)


def test_exchange_bind_from_missing_destination_is_404(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "fanout")
    expect_channel_error(404, f"NOT_FOUND - no exchange '{name}.missing' in vhost '/'",
                         conn.channel().exchange_bind, name + ".missing", name)
    ch.exchange_delete(name)


def test_auto_delete_exchange_goes_after_last_queue_unbind(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "fanout", auto_delete=True)
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, name)
    ch.queue_bind(q2, name)
    ch.queue_unbind(q1, name)
    ch.exchange_declare(name, "fanout", passive=True)
    ch.queue_unbind(q2, name)
    expect_channel_error(404, f"NOT_FOUND - no exchange '{name}' in vhost '/'",
                         conn.channel().exchange_declare, name, "fanout", passive=True)


def test_auto_delete_exchange_without_bindings_stays(ch, name):
    ch.exchange_declare(name, "fanout", auto_delete=True)
    ch.exchange_declare(name, "fanout", passive=True)
    ch.exchange_delete(name)


def test_auto_delete_exchange_goes_when_its_bound_queue_is_deleted(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "fanout", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name)
    ch.queue_delete(q)
    expect_channel_error(404, "NOT_FOUND", conn.channel().exchange_declare, name, "fanout", passive=True)


def test_auto_delete_exchange_goes_after_last_exchange_unbind(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name + ".src", "fanout", auto_delete=True)
    ch.exchange_declare(name + ".dst", "fanout")
    ch.exchange_bind(name + ".dst", name + ".src")
    ch.exchange_unbind(name + ".dst", name + ".src")
    expect_channel_error(404, "NOT_FOUND", conn.channel().exchange_declare, name + ".src", "fanout",
                         passive=True)
    conn.channel().exchange_delete(name + ".dst")


def test_alternate_exchange_receives_unroutable_messages(ch, name):
    ch.exchange_declare(name + ".ae", "fanout")
    ch.exchange_declare(name, "direct", arguments={"alternate-exchange": name + ".ae"})
    routed = ch.queue_declare("", exclusive=True).method.queue
    unrouted = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(routed, name, routing_key="known")
    ch.queue_bind(unrouted, name + ".ae")
    ch.basic_publish(name, "known", b"routed")
    ch.basic_publish(name, "unknown", b"to ae")
    assert get(ch, routed)[2] == b"routed"
    assert get(ch, unrouted)[2] == b"to ae"
    ch.exchange_delete(name)
    ch.exchange_delete(name + ".ae")


def test_alternate_exchange_message_is_not_returned_as_mandatory(conn, ch, name):
    ch.exchange_declare(name + ".ae", "fanout")
    ch.exchange_declare(name, "direct", arguments={"alternate-exchange": name + ".ae"})
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, name + ".ae")
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.confirm_delivery()
    ch.basic_publish(name, "nowhere", b"m", mandatory=True)
    conn.process_data_events(time_limit=0.2)
    assert not returned
    assert get(ch, q)[2] == b"m"
    ch.exchange_delete(name)
    ch.exchange_delete(name + ".ae")


def test_missing_alternate_exchange_means_unroutable(conn, ch, name):
    ch.exchange_declare(name, "direct", arguments={"alternate-exchange": name + ".missing"})
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append(m))
    ch.basic_publish(name, "nowhere", b"m", mandatory=True)
    conn.process_data_events(time_limit=0.3)
    assert [(m.reply_code, m.reply_text) for m in returned] == [(312, "NO_ROUTE")]
    ch.exchange_delete(name)


def test_redeclare_with_different_alternate_exchange_is_406(conn, name):
    ch = conn.channel()
    ch.exchange_declare(name, "direct", arguments={"alternate-exchange": "a"})
    text = expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' "
                                f"for exchange '{name}' in vhost '/'", conn.channel().exchange_declare,
                                name, "direct", arguments={"alternate-exchange": "b"})
    assert text.endswith("received 'b' but current is 'a'"), text
    conn.channel().exchange_delete(name)


def test_redeclare_with_different_internal_is_406(conn, name):
    conn.channel().exchange_declare(name, "direct")
    text = expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'internal' for exchange "
                                f"'{name}' in vhost '/'", conn.channel().exchange_declare, name,
                                "direct", internal=True)
    assert text.endswith("received 'true' but current is 'false'"), text
    conn.channel().exchange_delete(name)


def test_redeclare_with_other_custom_arguments_is_accepted(ch, name):
    ch.exchange_declare(name, "direct", arguments={"x-foo": 1})
    ch.exchange_declare(name, "direct", arguments={"x-foo": 2})
    ch.exchange_declare(name, "direct")
    ch.exchange_delete(name)
