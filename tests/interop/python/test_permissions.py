"""Per-vhost permissions (configure / write / read regexps) as rabbitmqctl set_permissions sets them."""

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from helpers import expect_channel_error, get

VHOST = "interop-perm"
USER = "interop-limited"
PASSWORD = "limited-pw"
# The limited user may configure, write and read only names starting with "lim-".
PERMS = ("^lim-.*", "^lim-.*", "^lim-.*")


@pytest.fixture(scope="module")
def limited(broker):
    broker.provision(USER, PASSWORD, VHOST, PERMS)
    broker.provision("guest", "guest", VHOST)  # the admin side of each test
    admin = pika.BlockingConnection(broker.params(virtual_host=VHOST))
    ach = admin.channel()
    ach.queue_declare("other-q")
    ach.exchange_declare("other-x", "fanout")
    ach.queue_declare("lim-q")
    yield broker
    if admin.is_open:
        ach = admin.channel()
        for q in ["other-q", "lim-q"]:
            ach.queue_delete(q)
        ach.exchange_delete("other-x")
        admin.close()


@pytest.fixture
def lch(limited):
    c = pika.BlockingConnection(limited.params(
        credentials=pika.PlainCredentials(USER, PASSWORD), virtual_host=VHOST))
    yield c.channel()
    if c.is_open:
        c.close()


def refused(kind, name, user=USER, vhost=VHOST):
    return f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


def test_limited_user_configures_matching_names(lch):
    lch.queue_declare("lim-own", auto_delete=True)
    lch.exchange_declare("lim-x", "direct", auto_delete=False)
    lch.queue_bind("lim-own", "lim-x", routing_key="k")
    lch.basic_publish("lim-x", "k", b"allowed")
    assert get(lch, "lim-own")[2] == b"allowed"
    lch.exchange_delete("lim-x")
    lch.queue_delete("lim-own")


def test_declaring_a_queue_without_configure_permission_is_403(lch):
    expect_channel_error(403, refused("queue", "no-configure"), lch.queue_declare, "no-configure")


def test_declaring_an_exchange_without_configure_permission_is_403(lch):
    expect_channel_error(403, refused("exchange", "no-configure-x"), lch.exchange_declare,
                         "no-configure-x", "direct")


def test_deleting_a_queue_without_configure_permission_is_403(lch):
    expect_channel_error(403, refused("queue", "other-q"), lch.queue_delete, "other-q")


def test_publishing_to_the_default_exchange_needs_write_on_amq_default(lch):
    lch.basic_publish("", "lim-q", b"x")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        lch.queue_declare("lim-q", passive=True)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        403, refused("exchange", "amq.default"))


def test_publishing_to_an_exchange_without_write_permission_is_403(lch):
    lch.basic_publish("other-x", "", b"x")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        lch.queue_declare("lim-q", passive=True)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (403, refused("exchange", "other-x"))


def test_consuming_without_read_permission_is_403(lch):
    expect_channel_error(403, refused("queue", "other-q"), lch.basic_consume, "other-q",
                         lambda *a: None)


def test_get_without_read_permission_is_403(lch):
    expect_channel_error(403, refused("queue", "other-q"), lch.basic_get, "other-q")


def test_purge_without_read_permission_is_403(lch):
    expect_channel_error(403, refused("queue", "other-q"), lch.queue_purge, "other-q")


def test_binding_needs_read_on_the_exchange(lch):
    expect_channel_error(403, refused("exchange", "other-x"), lch.queue_bind, "lim-q", "other-x")


def test_binding_needs_write_on_the_queue(lch):
    # the limited user may read lim-x but not write to other-q
    lch.exchange_declare("lim-bx", "fanout")
    expect_channel_error(403, refused("queue", "other-q"), lch.queue_bind, "other-q", "lim-bx")
    lch.connection.channel().exchange_delete("lim-bx")


def test_passive_declare_needs_no_permission(lch):
    assert lch.queue_declare("other-q", passive=True).method.queue == "other-q"


def test_same_queue_name_in_two_vhosts_is_two_queues(broker, limited, name):
    a = broker.connect()
    b = pika.BlockingConnection(broker.params(virtual_host=VHOST))
    try:
        a.channel().queue_declare(name)
        b.channel().queue_declare(name)
        a.channel().basic_publish("", name, b"in /")
        bch = b.channel()
        assert bch.queue_declare(name, passive=True).method.message_count == 0
        assert get(a.channel(), name)[2] == b"in /"
    finally:
        a.channel().queue_delete(name)
        b.channel().queue_delete(name)
        a.close()
        b.close()
