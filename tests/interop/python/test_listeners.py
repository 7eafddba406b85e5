"""AMQP listeners: a node may listen on several addresses, IPv6 included, each a way into the
same broker (issue 12). RabbitMQ takes them as `listeners.tcp.*`; warren as repeated `--listen`,
comma-separated WARREN_LISTEN or a TOML array. Against RabbitMQ the tests check what its
management API lists (each listener it names takes AMQP connections); against warren they start
nodes of their own with two listeners, given each way."""

import base64
import json
import os
import socket
import subprocess
import urllib.parse
import urllib.request

import pika
import pytest

from conftest import BROKER_START_TIMEOUT_S, Broker, free_port, wait_port
from helpers import get


def free_port_v6():
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        return s.getsockname()[1]


def amqp_listeners(management_uri):
    """(ip, port) of each amqp listener /api/overview names."""
    parsed = urllib.parse.urlparse(management_uri)
    req = urllib.request.Request(f"http://{parsed.hostname}:{parsed.port}/api/overview")
    auth = base64.b64encode(f"{parsed.username}:{parsed.password}".encode()).decode()
    req.add_header("Authorization", "Basic " + auth)
    overview = json.load(urllib.request.urlopen(req, timeout=5))
    return [(l["ip_address"], l["port"]) for l in overview["listeners"] if l["protocol"] == "amqp"]


def connect(ip, port):
    host = f"[{ip}]" if ":" in ip else ip
    return pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@{host}:{port}/%2F?connection_attempts=1&socket_timeout=5"))


def assert_one_broker_behind(listeners, queue):
    """A message published through each listener is read through the next one."""
    conns = [connect(ip, port) for ip, port in listeners]
    try:
        chans = [c.channel() for c in conns]
        chans[0].queue_declare(queue, auto_delete=False)
        for i, ch in enumerate(chans):
            body = f"through {listeners[i]}".encode()
            ch.basic_publish("", queue, body)
            assert get(chans[(i + 1) % len(chans)], queue)[2] == body
        chans[0].queue_delete(queue)
    finally:
        for c in conns:
            c.close()


@pytest.fixture
def two_listener_node(broker, tmp_path, request):
    """Starts warren with 127.0.0.1:P1 and [::1]:P2, given the way request.param says."""
    if broker.is_rabbitmq:
        pytest.skip("RabbitMQ's listeners are its config file's: see test_every_listener_the_management_api_names_takes_amqp")
    v4, v6 = ("127.0.0.1", free_port()), ("::1", free_port_v6())
    mgmt = f"127.0.0.1:{free_port()}"
    args = [broker.bin_path, "server", "--data-dir", str(tmp_path / "data"),
            "--management-listen", mgmt]
    env = dict(os.environ)
    env.pop("WARREN_LISTEN", None)
    if request.param == "flags":
        args += ["--listen", f"{v4[0]}:{v4[1]}", "--listen", f"[{v6[0]}]:{v6[1]}"]
    elif request.param == "env":
        env["WARREN_LISTEN"] = f"{v4[0]}:{v4[1]},[{v6[0]}]:{v6[1]}"
    else:
        config = tmp_path / "warren.toml"
        config.write_text(f'listen = ["{v4[0]}:{v4[1]}", "[{v6[0]}]:{v6[1]}"]\n')
        args += ["--config", str(config)]
    with open(tmp_path / "warren.log", "ab") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    node = Broker("warren", f"amqp://guest:guest@127.0.0.1:{v4[1]}/%2F", proc=proc,
                  management_uri=f"http://guest:guest@{mgmt}")
    try:
        wait_port("127.0.0.1", v4[1], BROKER_START_TIMEOUT_S, proc)
        wait_port("::1", v6[1], BROKER_START_TIMEOUT_S, proc)
        # The HTTP listener comes up on its own task, possibly after AMQP's.
        host, port = mgmt.rsplit(":", 1)
        wait_port(host, int(port), BROKER_START_TIMEOUT_S, proc)
        yield node, [v4, v6]
    finally:
        node.stop()


def test_every_listener_the_management_api_names_takes_amqp(broker, name):
    listeners = amqp_listeners(broker.management_uri)
    assert listeners, "a node with a plain AMQP listener lists it"
    reachable = [(("127.0.0.1" if ip in ("0.0.0.0", "::") else ip), port)
                 for ip, port in listeners]
    assert_one_broker_behind(reachable, name)


@pytest.mark.parametrize("two_listener_node", ["flags", "env", "toml"], indirect=True)
def test_a_node_listens_on_each_address_given_ipv6_included(two_listener_node, name):
    node, given = two_listener_node
    assert sorted(amqp_listeners(node.management_uri)) == sorted(given)
    assert_one_broker_behind(given, name)


def test_listen_none_with_an_address_is_refused_at_start(broker, tmp_path):
    if broker.is_rabbitmq:
        pytest.skip("warren's command line")
    out = subprocess.run([broker.bin_path, "server", "--data-dir", str(tmp_path / "data"),
                          "--listen", "none", "--listen", f"127.0.0.1:{free_port()}",
                          "--management-listen", "none"],
                         capture_output=True, text=True, timeout=BROKER_START_TIMEOUT_S)
    assert out.returncode != 0
    assert "--listen 'none' cannot be combined with addresses" in out.stderr
