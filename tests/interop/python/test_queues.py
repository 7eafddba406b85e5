"""Queue declare, bind, unbind, purge, delete and the counts they report."""

import uuid

import pika
import pytest

from helpers import (drain, expect_channel_error, get, wait_for, wait_message_count)

LOCKED_SUFFIX = (". It could be originally declared on another connection or the exclusive property "
                 "value does not match that of the original declaration.")


def test_declare_ok_reports_name_and_zero_counts(ch, name):
    ok = ch.queue_declare(name, auto_delete=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    ch.queue_delete(name)


def test_server_named_queue_gets_amq_gen_name(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-") and len(q) > len("amq.gen-") + 10
    q2 = ch.queue_declare("", exclusive=True).method.queue
    assert q2 != q


def test_passive_declare_of_missing_queue_is_404(ch, name):
    expect_channel_error(404, f"NOT_FOUND - no queue '{name}' in vhost '/'",
                         ch.queue_declare, name, passive=True)


def test_declare_with_reserved_amq_prefix_is_403(ch):
    expect_channel_error(403, "ACCESS_REFUSED - queue name 'amq.interop' contains reserved prefix "
                         "'amq.*'", ch.queue_declare, "amq.interop")


def test_passive_declare_reports_message_and_consumer_counts(conn, ch, name):
    ch.queue_declare(name)
    for i in range(3):
        ch.basic_publish("", name, str(i).encode())
    wait_message_count(ch, name, 3)
    c2 = conn.channel()
    c2.basic_qos(prefetch_count=1)
    c2.basic_consume(name, lambda *a: None)
    c2.basic_consume(name, lambda *a: None)
    conn.process_data_events(time_limit=0.2)
    ok = ch.queue_declare(name, passive=True).method
    # two consumers hold one unacked message each: ready messages only are counted
    assert (ok.message_count, ok.consumer_count) == (1, 2)
    c2.close()
    wait_message_count(ch, name, 3)
    ch.queue_delete(name)


def test_exclusive_queue_is_locked_405_for_other_connections(broker, conn):
    name = "interop-locked-" + uuid.uuid4().hex[:8]  # short: the full reply text fits in 255 bytes
    conn.channel().queue_declare(name, exclusive=True)
    other = broker.connect()
    try:
        for op in [lambda c: c.queue_declare(name, passive=True),
                   lambda c: c.queue_declare(name, exclusive=True),
                   lambda c: c.basic_consume(name, lambda *a: None),
                   lambda c: c.basic_get(name),
                   lambda c: c.queue_delete(name),
                   lambda c: c.queue_purge(name),
                   lambda c: c.queue_bind(name, "amq.fanout")]:
            text = expect_channel_error(405, "RESOURCE_LOCKED - cannot obtain exclusive access to "
                                        f"locked queue '{name}' in vhost '/'", op, other.channel())
            assert text.endswith(LOCKED_SUFFIX), text
        other.channel().queue_unbind(name, "amq.fanout")  # RabbitMQ 3.10 lets unbind through
    finally:
        other.close()


def test_exclusive_queue_can_be_published_to_from_another_connection(broker, conn, name):
    ch = conn.channel()
    ch.queue_declare(name, exclusive=True)
    other = broker.connect()
    other.channel().basic_publish("", name, b"from outside")
    other.close()
    assert get(ch, name)[2] == b"from outside"


def test_exclusive_queue_is_deleted_when_its_connection_closes(broker, name):
    c = broker.connect()
    c.channel().queue_declare(name, exclusive=True, durable=True)
    c.close()
    c2 = broker.connect()
    expect_channel_error(404, "NOT_FOUND", c2.channel().queue_declare, name, passive=True)
    c2.close()


def test_auto_delete_queue_goes_when_last_consumer_cancels(conn, ch, name):
    ch.queue_declare(name, auto_delete=True)
    ch.queue_declare(name, passive=True)  # no consumer ever: it stays
    t1 = ch.basic_consume(name, lambda *a: None)
    t2 = ch.basic_consume(name, lambda *a: None)
    ch.basic_cancel(t1)
    ch.queue_declare(name, passive=True)
    ch.basic_cancel(t2)
    wait_for(lambda: _missing(conn, name), what="auto-delete queue to go")


def _missing(conn, queue):
    try:
        conn.channel().queue_declare(queue, passive=True)
        return False
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404
        return True


def test_redeclare_with_different_durable_is_406(conn, name):
    conn.channel().queue_declare(name, durable=False)
    text = expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue "
                                f"'{name}' in vhost '/': received 'true' but current is 'false'",
                                conn.channel().queue_declare, name, durable=True)
    conn.channel().queue_delete(name)
    assert text


def test_redeclare_with_different_auto_delete_is_406(conn, name):
    conn.channel().queue_declare(name)
    expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue "
                         f"'{name}' in vhost '/': received 'true' but current is 'false'",
                         conn.channel().queue_declare, name, auto_delete=True)
    conn.channel().queue_delete(name)


def test_redeclare_with_different_argument_value_is_406(conn, name):
    conn.channel().queue_declare(name, arguments={"x-max-length": 10})
    expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue "
                         f"'{name}' in vhost '/': received '20' but current is '10'",
                         conn.channel().queue_declare, name, arguments={"x-max-length": 20})
    conn.channel().queue_delete(name)


def test_redeclare_adding_an_argument_is_406(conn, name):
    conn.channel().queue_declare(name)
    expect_channel_error(406, "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue "
                         f"'{name}' in vhost '/': received the value '1000' of type 'signedint' "
                         "but current is none", conn.channel().queue_declare, name,
                         arguments={"x-message-ttl": 1000})
    conn.channel().queue_delete(name)


def test_redeclare_with_same_arguments_and_passive_without_them_succeed(ch, name):
    ch.queue_declare(name, arguments={"x-max-length": 10, "x-message-ttl": 60000})
    ch.queue_declare(name, arguments={"x-max-length": 10, "x-message-ttl": 60000})
    ch.queue_declare(name, passive=True)
    ch.queue_delete(name)


def test_bind_to_missing_exchange_is_404(ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    expect_channel_error(404, f"NOT_FOUND - no exchange '{name}' in vhost '/'",
                         ch.queue_bind, q, name, routing_key="k")


def test_bind_of_missing_queue_is_404(ch, name):
    expect_channel_error(404, f"NOT_FOUND - no queue '{name}' in vhost '/'",
                         ch.queue_bind, name, "amq.direct", routing_key="k")


def test_unbind_of_missing_binding_succeeds(ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_unbind(q, "amq.direct", routing_key="never-bound")


def test_unbind_from_missing_exchange_succeeds(ch, name):
    # RabbitMQ 3.10 answers unbind-ok when the exchange does not exist.
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_unbind(q, name, routing_key="k")


def test_bind_and_unbind_control_routing(ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.direct", routing_key=name)
    ch.basic_publish("amq.direct", name, b"bound")
    assert get(ch, q)[2] == b"bound"
    ch.queue_unbind(q, "amq.direct", routing_key=name)
    ch.basic_publish("amq.direct", name, b"unbound")
    ch.basic_publish("", q, b"marker")
    assert get(ch, q)[2] == b"marker"


def test_purge_returns_message_count_and_empties_queue(ch, name):
    ch.queue_declare(name)
    for i in range(5):
        ch.basic_publish("", name, b"x")
    wait_message_count(ch, name, 5)
    assert ch.queue_purge(name).method.message_count == 5
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    assert ch.queue_purge(name).method.message_count == 0
    ch.queue_delete(name)


def test_purge_keeps_unacked_messages(conn, ch, name):
    ch.queue_declare(name)
    for i in range(3):
        ch.basic_publish("", name, str(i).encode())
    wait_message_count(ch, name, 3)
    method, _, _ = get(ch, name, auto_ack=False)
    assert ch.queue_purge(name).method.message_count == 2
    ch.basic_reject(method.delivery_tag, requeue=True)
    wait_message_count(ch, name, 1)
    ch.queue_delete(name)


def test_purge_of_missing_queue_is_404(ch, name):
    expect_channel_error(404, f"NOT_FOUND - no queue '{name}' in vhost '/'", ch.queue_purge, name)


def test_delete_returns_message_count(ch, name):
    ch.queue_declare(name)
    for i in range(4):
        ch.basic_publish("", name, b"x")
    wait_message_count(ch, name, 4)
    assert ch.queue_delete(name).method.message_count == 4
    expect_channel_error(404, "NOT_FOUND", ch.queue_declare, name, passive=True)


def test_delete_of_missing_queue_succeeds(ch, name):
    assert ch.queue_delete(name).method.message_count == 0


def test_delete_if_empty_with_messages_is_406(conn, name):
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_publish("", name, b"x")
    wait_message_count(ch, name, 1)
    expect_channel_error(406, f"PRECONDITION_FAILED - queue '{name}' in vhost '/' not empty",
                         conn.channel().queue_delete, name, if_empty=True)
    ch.queue_delete(name)


def test_delete_if_unused_with_consumer_is_406(conn, name):
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_consume(name, lambda *a: None)
    expect_channel_error(406, f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use",
                         conn.channel().queue_delete, name, if_unused=True)
    conn.channel().queue_delete(name)


def test_delete_if_unused_and_if_empty_on_idle_empty_queue_succeeds(ch, name):
    ch.queue_declare(name)
    ch.queue_delete(name, if_unused=True, if_empty=True)
    expect_channel_error(404, "NOT_FOUND", ch.queue_declare, name, passive=True)


def test_deleting_a_queue_removes_its_bindings(ch, name):
    ch.exchange_declare(name, "fanout")
    ch.queue_declare(name)
    ch.queue_bind(name, name)
    ch.queue_delete(name)
    ch.queue_declare(name)  # same name, new queue: the old binding must not come back
    ch.basic_publish(name, "", b"x")
    ch.basic_publish("", name, b"marker")
    assert get(ch, name)[2] == b"marker"
    ch.queue_delete(name)
    ch.exchange_delete(name)


def test_durable_queue_declared_by_many_channels_counts_consumers(conn, name):
    channels = [conn.channel() for _ in range(3)]
    channels[0].queue_declare(name, durable=True)
    for c in channels:
        c.basic_consume(name, lambda *a: None)
    assert channels[0].queue_declare(name, durable=True).method.consumer_count == 3
    channels[0].queue_delete(name)


def test_messages_are_delivered_in_fifo_order(conn, ch, name):
    ch.queue_declare(name)
    for i in range(50):
        ch.basic_publish("", name, str(i).encode())
    got = drain(conn, ch, name, 50)
    assert [b for _, _, b in got] == [str(i).encode() for i in range(50)]
    ch.queue_delete(name)




def test_redeclare_exclusive_queue_as_non_exclusive_is_405_even_from_owner(conn):
    name = "interop-excl-" + uuid.uuid4().hex[:8]  # short: the full reply text fits in 255 bytes
    conn.channel().queue_declare(name, exclusive=True)
    text = expect_channel_error(405, "RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                                f"queue '{name}' in vhost '/'", conn.channel().queue_declare, name)
    assert text.endswith(LOCKED_SUFFIX), text


def test_redeclare_plain_queue_as_exclusive_is_405(conn):
    name = "interop-plain-" + uuid.uuid4().hex[:8]
    conn.channel().queue_declare(name)
    text = expect_channel_error(405, "RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                                f"queue '{name}' in vhost '/'", conn.channel().queue_declare, name,
                                exclusive=True)
    assert text.endswith(LOCKED_SUFFIX), text
    conn.channel().queue_delete(name)


def test_redeclare_with_explicit_classic_type_or_unknown_args_is_accepted(ch, name):
    ch.queue_declare(name)
    ch.queue_declare(name, arguments={"x-queue-type": "classic"})
    ch.queue_declare(name, arguments={"x-unknown": 1})
    ch.queue_delete(name)


def test_max_length_counts_ready_messages_only(ch, name):
    ch.queue_declare(name, arguments={"x-max-length": 1})
    ch.basic_publish("", name, b"taken")
    m, _, _ = get(ch, name, auto_ack=False)
    ch.basic_publish("", name, b"ready")
    wait_message_count(ch, name, 1)
    ch.basic_reject(m.delivery_tag, requeue=True)  # back in: now 2 ready > max, head dropped
    wait_message_count(ch, name, 1)
    assert get(ch, name)[2] == b"ready"
    ch.queue_delete(name)


def test_auto_delete_queue_goes_when_the_consumers_channel_closes(conn, name):
    ch = conn.channel()
    ch.queue_declare(name, auto_delete=True)
    ch2 = conn.channel()
    ch2.basic_consume(name, lambda *a: None)
    ch2.close()
    wait_for(lambda: _missing(conn, name), what="auto-delete queue to go")


def test_reply_text_longer_than_255_bytes_is_cut_to_252_plus_ellipsis(ch):
    name = "q" * 250
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(name, passive=True)
    full = f"NOT_FOUND - no queue '{name}' in vhost '/'"
    assert excinfo.value.reply_code == 404
    assert excinfo.value.reply_text == full[:252] + "..."
