"""basic.*: qos, consume, cancel, publish, get, ack, nack, reject, recover."""

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from helpers import (drain, expect_channel_error, get, message_count, wait_for,
                     wait_message_count)


def pump(conn, until, timeout=5.0, what="deliveries"):
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or until(), timeout, what=what)


def fill(ch, queue, n, prefix="m"):
    for i in range(n):
        ch.basic_publish("", queue, f"{prefix}{i}".encode())
    wait_message_count(ch, queue, n)


# ---------------------------------------------------------------- qos


def test_prefetch_count_limits_unacked_deliveries_per_consumer(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 10)
    ch.basic_qos(prefetch_count=3)
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(m), auto_ack=False)
    pump(conn, lambda: len(got) >= 3)
    conn.process_data_events(time_limit=0.3)
    assert len(got) == 3
    ch.basic_ack(got[0].delivery_tag)
    pump(conn, lambda: len(got) >= 4)
    conn.process_data_events(time_limit=0.2)
    assert len(got) == 4
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    pump(conn, lambda: len(got) >= 7)
    conn.process_data_events(time_limit=0.2)
    assert len(got) == 7
    ch.queue_delete(name)


def test_prefetch_is_per_consumer_without_global(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 10)
    ch.basic_qos(prefetch_count=2)
    got = {"a": [], "b": []}
    ch.basic_consume(name, lambda c, m, p, b: got["a"].append(m), auto_ack=False)
    ch.basic_consume(name, lambda c, m, p, b: got["b"].append(m), auto_ack=False)
    pump(conn, lambda: len(got["a"]) + len(got["b"]) >= 4)
    conn.process_data_events(time_limit=0.3)
    assert (len(got["a"]), len(got["b"])) == (2, 2)
    ch.queue_delete(name)


def test_global_prefetch_is_shared_by_the_channel(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 10)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(m), auto_ack=False)
    ch.basic_consume(name, lambda c, m, p, b: got.append(m), auto_ack=False)
    pump(conn, lambda: len(got) >= 3)
    conn.process_data_events(time_limit=0.3)
    assert len(got) == 3
    ch.queue_delete(name)


def test_global_and_per_consumer_prefetch_both_apply(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 10)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    ch.basic_qos(prefetch_count=1)
    got = {"a": [], "b": []}
    ch.basic_consume(name, lambda c, m, p, b: got["a"].append(m), auto_ack=False)
    ch.basic_consume(name, lambda c, m, p, b: got["b"].append(m), auto_ack=False)
    pump(conn, lambda: len(got["a"]) + len(got["b"]) >= 2)
    conn.process_data_events(time_limit=0.3)
    assert (len(got["a"]), len(got["b"])) == (1, 1)
    ch.queue_delete(name)


def test_prefetch_zero_is_unlimited(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 20)
    ch.basic_qos(prefetch_count=0)
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(m), auto_ack=False)
    pump(conn, lambda: len(got) >= 20)
    ch.queue_delete(name)


def test_prefetch_does_not_limit_no_ack_consumers(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 10)
    ch.basic_qos(prefetch_count=1)
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(m), auto_ack=True)
    pump(conn, lambda: len(got) >= 10)
    ch.queue_delete(name)


def test_qos_prefetch_size_is_not_implemented_540(ch):
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        ch.basic_qos(prefetch_size=1000)
    assert excinfo.value.reply_code == 540
    assert excinfo.value.reply_text == "NOT_IMPLEMENTED - prefetch_size!=0 (1000)"


# ---------------------------------------------------------------- consume and cancel


def test_consume_on_missing_queue_is_404(ch, name):
    expect_channel_error(404, f"NOT_FOUND - no queue '{name}' in vhost '/'",
                         ch.basic_consume, name, lambda *a: None)


def test_no_ack_consumer_removes_messages_on_delivery(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 3)
    got = drain(conn, ch, name, 3, auto_ack=True)
    assert [b for _, _, b in got] == [b"m0", b"m1", b"m2"]
    assert all(not m.redelivered for m, _, _ in got)
    assert message_count(ch, name) == 0
    ch.queue_delete(name)


def test_delivery_tags_count_up_from_one_per_channel(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 3)
    got = drain(conn, ch, name, 3, auto_ack=False)
    assert [m.delivery_tag for m, _, _ in got] == [1, 2, 3]
    ch.basic_ack(3, multiple=True)
    ch.basic_publish("", name, b"next")
    m, _, _ = get(ch, name, auto_ack=True)
    assert m.delivery_tag == 4  # basic.get shares the channel's tag sequence
    ch.queue_delete(name)


def test_deliver_carries_consumer_tag_exchange_and_routing_key(conn, ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", routing_key="a.#")
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m), auto_ack=True, consumer_tag="my-tag")
    ch.basic_publish("amq.topic", "a.b.c", b"x")
    pump(conn, lambda: got)
    assert (got[0].consumer_tag, got[0].exchange, got[0].routing_key) == ("my-tag", "amq.topic", "a.b.c")


def test_server_generated_consumer_tag_is_amq_ctag(broker, raw):
    import amqp_raw as amqp
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    q = c.expect_method(amqp.QUEUE_DECLARE_OK).args().shortstr()
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(q, "")))
    tag = c.expect_method(amqp.BASIC_CONSUME_OK).args().shortstr()
    assert tag.startswith("amq.ctag-") and len(tag) > len("amq.ctag-") + 10, tag


def test_exclusive_consume_refuses_a_second_consumer_403(broker, name):
    c1 = broker.connect()
    ch1 = c1.channel()
    ch1.queue_declare(name)
    ch1.basic_consume(name, lambda *a: None, exclusive=True)
    c2 = broker.connect()
    try:
        expect_channel_error(403, f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use",
                             c2.channel().basic_consume, name, lambda *a: None)
        expect_channel_error(403, f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use",
                             ch1.connection.channel().basic_consume, name, lambda *a: None)
    finally:
        c2.close()
    c1.channel().queue_delete(name)
    c1.close()


def test_exclusive_consume_on_queue_with_consumers_is_403(conn, name):
    ch = conn.channel()
    ch.queue_declare(name)
    ch.basic_consume(name, lambda *a: None)
    expect_channel_error(403, f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use",
                         conn.channel().basic_consume, name, lambda *a: None, exclusive=True)
    conn.channel().queue_delete(name)


def test_reusing_a_consumer_tag_on_the_channel_is_530(broker, raw, name):
    import amqp_raw as amqp
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args("", exclusive=True)))
    q = c.expect_method(amqp.QUEUE_DECLARE_OK).args().shortstr()
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(q, "dup")))
    c.expect_method(amqp.BASIC_CONSUME_OK)
    c.send(amqp.method_frame(1, amqp.BASIC_CONSUME, amqp.basic_consume_args(q, "dup")))
    assert c.expect_connection_close() == (
        530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'", 60, 20)


def test_same_consumer_tag_on_two_channels_is_allowed(conn, name):
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    conn.channel().basic_consume(q, lambda *a: None, consumer_tag="shared")
    conn.channel().basic_consume(q, lambda *a: None, consumer_tag="shared")


def test_cancel_stops_deliveries_and_requeues_nothing(conn, ch, name):
    ch.queue_declare(name)
    got = []
    tag = ch.basic_consume(name, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", name, b"before")
    pump(conn, lambda: got)
    ch.basic_cancel(tag)
    ch.basic_publish("", name, b"after")
    wait_message_count(ch, name, 1)
    assert got == [b"before"]
    ch.queue_delete(name)


def test_cancel_of_unknown_consumer_tag_is_ok(broker, raw):
    import amqp_raw as amqp
    import struct
    c = raw()
    c.open()
    c.open_channel(1)
    c.send(amqp.method_frame(1, (60, 30), amqp.shortstr("never-consumed") + b"\x00"))
    f = c.expect_method((60, 31))
    assert f.args().shortstr() == "never-consumed"


def test_unacked_messages_of_a_cancelled_consumer_stay_unacked_until_ack(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 2)
    got = []
    tag = ch.basic_consume(name, lambda c, m, p, b: got.append(m), auto_ack=False)
    pump(conn, lambda: len(got) == 2)
    ch.basic_cancel(tag)
    assert message_count(ch, name) == 0
    ch.basic_ack(got[0].delivery_tag)  # acking after cancel is valid
    ch.basic_nack(got[1].delivery_tag, requeue=True)
    wait_message_count(ch, name, 1)
    ch.queue_delete(name)


def test_queue_deletion_sends_consumer_cancel_notification(broker, name):
    c1 = broker.connect()
    ch1 = c1.channel()
    ch1.queue_declare(name)
    cancelled = []
    ch1.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch1.basic_consume(name, lambda *a: None)
    c2 = broker.connect()
    c2.channel().queue_delete(name)
    c2.close()
    pump(c1, lambda: cancelled)
    assert cancelled == [tag]
    assert ch1.is_open
    c1.close()


def test_closing_a_channel_requeues_its_unacked_messages_as_redelivered(conn, name):
    ch = conn.channel()
    ch.queue_declare(name)
    fill(ch, name, 2)
    ch2 = conn.channel()
    got = []
    ch2.basic_consume(name, lambda c, m, p, b: got.append(b), auto_ack=False)
    pump(conn, lambda: len(got) == 2)
    ch2.close()
    wait_message_count(ch, name, 2)
    m1, _, b1 = get(ch, name)
    assert m1.redelivered and b1 == b"m0"
    ch.queue_delete(name)


def test_round_robin_between_consumers(conn, ch, name):
    ch.queue_declare(name)
    got = {"a": [], "b": []}
    ch.basic_consume(name, lambda c, m, p, b: got["a"].append(b), auto_ack=True)
    ch.basic_consume(name, lambda c, m, p, b: got["b"].append(b), auto_ack=True)
    for i in range(6):
        ch.basic_publish("", name, str(i).encode())
    pump(conn, lambda: len(got["a"]) + len(got["b"]) == 6)
    assert len(got["a"]) == 3 and len(got["b"]) == 3
    ch.queue_delete(name)


# ---------------------------------------------------------------- publish


def test_mandatory_unroutable_publish_is_returned_312_no_route(conn, ch, name):
    ch.exchange_declare(name, "direct")
    returned = []
    ch.add_on_return_callback(lambda c, m, p, b: returned.append((m, p, b)))
    ch.basic_publish(name, "nowhere", b"back", pika.BasicProperties(message_id="r1"), mandatory=True)
    pump(conn, lambda: returned)
    m, p, b = returned[0]
    assert (m.reply_code, m.reply_text, m.exchange, m.routing_key) == (312, "NO_ROUTE", name, "nowhere")
    assert (p.message_id, b) == ("r1", b"back")
    ch.exchange_delete(name)


def test_mandatory_routable_publish_is_not_returned(conn, ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish("", q, b"ok", mandatory=True)
    assert get(ch, q)[2] == b"ok"
    conn.process_data_events(time_limit=0.1)
    assert not returned


def test_non_mandatory_unroutable_publish_is_dropped_silently(conn, ch, name):
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish("amq.direct", name, b"dropped")
    conn.process_data_events(time_limit=0.2)
    assert not returned and ch.is_open


def test_mandatory_returned_publish_is_still_confirmed(conn, ch, name):
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", name, b"x", mandatory=True)


def test_publish_to_missing_exchange_is_404(conn, name):
    ch = conn.channel()
    ch.basic_publish(name, "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        ch.queue_declare("", exclusive=True)
    assert excinfo.value.reply_code == 404
    assert excinfo.value.reply_text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_publish_to_default_exchange_with_missing_queue_is_dropped(conn, ch, name):
    ch.basic_publish("", name, b"nobody")
    assert ch.queue_declare("", exclusive=True).method.queue


# ---------------------------------------------------------------- get


def test_get_returns_message_with_remaining_count(ch, name):
    ch.queue_declare(name)
    fill(ch, name, 3)
    m, p, b = ch.basic_get(name, auto_ack=True)
    assert (b, m.message_count, m.redelivered, m.exchange, m.routing_key) == (b"m0", 2, False, "", name)
    ch.queue_delete(name)


def test_get_on_empty_queue_is_get_empty(ch, name):
    ch.queue_declare(name)
    assert ch.basic_get(name, auto_ack=True) == (None, None, None)
    ch.queue_delete(name)


def test_get_on_missing_queue_is_404(ch, name):
    expect_channel_error(404, f"NOT_FOUND - no queue '{name}' in vhost '/'", ch.basic_get, name)


def test_get_without_ack_keeps_message_unacked_until_ack(ch, name):
    ch.queue_declare(name)
    fill(ch, name, 1)
    m, _, _ = ch.basic_get(name, auto_ack=False)
    assert message_count(ch, name) == 0
    ch.basic_ack(m.delivery_tag)
    ch.queue_delete(name)


# ---------------------------------------------------------------- ack, nack, reject


def test_reject_with_requeue_redelivers_with_redelivered_flag(ch, name):
    ch.queue_declare(name)
    fill(ch, name, 1)
    m, _, _ = ch.basic_get(name)
    assert not m.redelivered
    ch.basic_reject(m.delivery_tag, requeue=True)
    m2, _, b = get(ch, name)
    assert m2.redelivered and b == b"m0"
    ch.queue_delete(name)


def test_reject_without_requeue_discards(ch, name):
    ch.queue_declare(name)
    fill(ch, name, 1)
    m, _, _ = ch.basic_get(name)
    ch.basic_reject(m.delivery_tag, requeue=False)
    time.sleep(0.05)
    assert message_count(ch, name) == 0
    ch.queue_delete(name)


def test_requeued_message_goes_back_to_its_original_position(ch, name):
    ch.queue_declare(name)
    fill(ch, name, 3)
    m, _, _ = ch.basic_get(name)
    ch.basic_reject(m.delivery_tag, requeue=True)
    assert [get(ch, name)[2] for _ in range(3)] == [b"m0", b"m1", b"m2"]
    ch.queue_delete(name)


def test_nack_multiple_requeues_all_up_to_tag(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 4)
    got = drain(conn, ch, name, 4, auto_ack=False)
    ch.basic_nack(got[2][0].delivery_tag, multiple=True, requeue=True)
    wait_message_count(ch, name, 3)
    ch.basic_ack(got[3][0].delivery_tag)
    ms = [get(ch, name) for _ in range(3)]
    assert [b for _, _, b in ms] == [b"m0", b"m1", b"m2"]
    assert all(m.redelivered for m, _, _ in ms)
    ch.queue_delete(name)


def test_nack_multiple_with_tag_zero_nacks_everything(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 3)
    drain(conn, ch, name, 3, auto_ack=False)
    ch.basic_nack(0, multiple=True, requeue=True)
    wait_message_count(ch, name, 3)
    ch.queue_delete(name)


def test_ack_multiple_with_tag_zero_acks_everything(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 3)
    drain(conn, ch, name, 3, auto_ack=False)
    ch.basic_ack(0, multiple=True)
    ch.close()
    ch2 = conn.channel()
    assert message_count(ch2, name) == 0
    ch2.queue_delete(name)


def test_ack_of_unknown_delivery_tag_is_406(ch, name):
    expect_channel_error(406, "PRECONDITION_FAILED - unknown delivery tag 42",
                         lambda: (ch.basic_ack(42), ch.queue_declare("", exclusive=True)))


def test_double_ack_is_406(ch, name):
    ch.queue_declare(name)
    fill(ch, name, 1)
    m, _, _ = ch.basic_get(name)
    ch.basic_ack(m.delivery_tag)
    expect_channel_error(406, f"PRECONDITION_FAILED - unknown delivery tag {m.delivery_tag}",
                         lambda: (ch.basic_ack(m.delivery_tag), ch.queue_declare(name, passive=True)))
    ch.connection.channel().queue_delete(name)


def test_ack_of_auto_acked_delivery_is_406(ch, name):
    ch.queue_declare(name)
    fill(ch, name, 1)
    m, _, _ = ch.basic_get(name, auto_ack=True)
    expect_channel_error(406, f"PRECONDITION_FAILED - unknown delivery tag {m.delivery_tag}",
                         lambda: (ch.basic_ack(m.delivery_tag), ch.queue_declare(name, passive=True)))
    ch.connection.channel().queue_delete(name)


def test_reject_of_unknown_delivery_tag_is_406(ch):
    expect_channel_error(406, "PRECONDITION_FAILED - unknown delivery tag 7",
                         lambda: (ch.basic_reject(7), ch.queue_declare("", exclusive=True)))


def test_nack_of_unknown_delivery_tag_is_406(ch):
    expect_channel_error(406, "PRECONDITION_FAILED - unknown delivery tag 9",
                         lambda: (ch.basic_nack(9), ch.queue_declare("", exclusive=True)))


def test_delivery_tag_from_another_channel_is_unknown_406(conn, name):
    ch1 = conn.channel()
    ch1.queue_declare(name)
    fill(ch1, name, 1)
    m, _, _ = ch1.basic_get(name)
    ch2 = conn.channel()
    expect_channel_error(406, f"PRECONDITION_FAILED - unknown delivery tag {m.delivery_tag}",
                         lambda: (ch2.basic_ack(m.delivery_tag), ch2.queue_declare(name, passive=True)))
    ch1.queue_delete(name)


# ---------------------------------------------------------------- recover


def test_recover_requeue_redelivers_unacked(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 2)
    got = []
    ch.basic_consume(name, lambda c, m, p, b: got.append((m.redelivered, b)), auto_ack=False)
    pump(conn, lambda: len(got) == 2)
    ch.basic_recover(requeue=True)
    pump(conn, lambda: len(got) == 4)
    assert sorted(got[2:]) == [(True, b"m0"), (True, b"m1")]
    ch.queue_delete(name)


def test_recover_without_requeue_is_not_implemented_540(ch):
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        ch.basic_recover(requeue=False)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")


# ---------------------------------------------------------------- bodies


def test_zero_length_body_round_trips(conn, ch, name):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"", pika.BasicProperties(content_type="empty"))
    m, p, b = get(ch, q)
    assert (b, p.content_type) == (b"", "empty")
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"")
    pump(conn, lambda: got)
    assert got == [b""]


@pytest.mark.parametrize("size", [131072 - 8, 131072 - 7, 131072, 1024 * 1024 + 13, 5 * 1024 * 1024])
def test_large_body_spanning_many_frames_round_trips(conn, ch, size):
    q = ch.queue_declare("", exclusive=True).method.queue
    body = bytes((i * 7 + size) % 251 for i in range(size))
    ch.basic_publish("", q, body)
    m, p, b = get(ch, q, timeout=15)
    assert len(b) == size and b == body
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, body)
    pump(conn, lambda: got, timeout=15)
    assert got[0] == body


def test_large_body_with_small_frame_max(broker):
    c = broker.connect(frame_max=4096)
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = bytes(range(256)) * 4096  # 1 MiB in 4 KiB frames
    ch.basic_publish("", q, body)
    assert get(ch, q, timeout=15)[2] == body
    c.close()


def test_changing_prefetch_applies_to_later_consumers_only(conn, ch, name):
    ch.queue_declare(name)
    fill(ch, name, 10)
    ch.basic_qos(prefetch_count=1)
    first = []
    ch.basic_consume(name, lambda c, m, p, b: first.append(m), auto_ack=False)
    pump(conn, lambda: first)
    ch.basic_qos(prefetch_count=3)
    second = []
    ch.basic_consume(name, lambda c, m, p, b: second.append(m), auto_ack=False)
    pump(conn, lambda: len(second) >= 3)
    conn.process_data_events(time_limit=0.3)
    assert (len(first), len(second)) == (1, 3)
    ch.queue_delete(name)
