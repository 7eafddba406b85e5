"""AMQP over TLS with a real client (pika), against warren and, with the same certificates, the
real RabbitMQ 3.10: the differential part of the suite for TLS.

The module makes its own certificates (tls_pki.py) and starts a node of its own configured with
them: warren with --tls-listen, or a second RabbitMQ node (rabbitmq.sh with RMQ_EXTRA_CONF and
the rabbitmq_auth_mechanism_ssl plugin) on ports of its own, beside the suite's main one. Both are
configured alike:
  verify_peer + fail_if_no_peer_cert, CA = the test CA, TLS 1.2 and 1.3,
  auth_mechanisms PLAIN AMQPLAIN EXTERNAL, ssl_cert_login_from distinguished_name,
  handshake timeouts of 2 s (RabbitMQ: handshake_timeout and ssl_handshake_timeout).

What both must do (the spec):
- a client with a trusted certificate connects over TLS 1.2 and 1.3, logs in with PLAIN, and
  messages go through;
- EXTERNAL logs in as the certificate's subject DN ("CN=...,O=..."): the user must exist, no
  password is sent, and user_id is checked against that name; EXTERNAL is not offered on the
  plain port; an EXTERNAL login for a user that does not exist is refused with 403;
- a certificate from an untrusted CA, an expired one, no certificate, a client that does not trust
  the server, and a plain AMQP client on the TLS port are all refused within seconds: never a
  hang; a client that says nothing is closed after the handshake timeout.
warren only (skipped on RabbitMQ): each refusal is logged saying which and counted in /metrics;
--listen none; the management API over HTTPS; a bad key or certificate file stops the node with
a message naming it; certificates reloaded by SIGHUP and `warren ctl reload_certificates`;
ssl_cert_login_from common_name.
"""

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pika
import pytest
from pika.exceptions import AMQPConnectionError, AuthenticationError

from conftest import (BROKER_START_TIMEOUT_S, CTL_TIMEOUT_S, REPO_ROOT, Broker, free_port,
                      wait_port)
from helpers import expect_channel_error, get, wait_for
from tls_pki import CLIENT_CN, CLIENT_DN, NOBODY_DN, Pki, issue_server, make_ca

HANDSHAKE_TIMEOUT_MS = 2000
# A refused connection fails within this: the refusal is immediate, the margin is for a busy
# machine. A hang would take pika's socket timeout or longer.
REFUSAL_S = 4.0
# A silent client is closed after the handshake timeout (RabbitMQ: up to TLS + AMQP timeouts).
SILENT_CLOSE_S_MAX = 2 * HANDSHAKE_TIMEOUT_MS / 1000 + 3.0
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"

# Starting a RabbitMQ node for the module takes 10-60 s and is charged to the first test.
pytestmark = pytest.mark.timeout(240)


def rabbitmq_script():
    return os.environ.get("RABBITMQ_SH",
                          os.path.join(REPO_ROOT, "..", "shared", "rabbitmq", "rabbitmq.sh"))


class RabbitNode(Broker):
    """The module's own RabbitMQ node: rabbitmq.sh with its own state dir and ports."""

    def __init__(self, uri, env):
        super().__init__("rabbitmq", uri)
        self.env = env

    def ctl(self, *args):
        cmd = [rabbitmq_script(), "ctl", "1", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=CTL_TIMEOUT_S,
                             env=self.env)
        assert out.returncode == 0, f"{cmd} failed: {out.stdout}{out.stderr}"
        return out.stdout


class TlsNode:
    def __init__(self, kind, broker, tls_port, pki, management_tls_port=None):
        self.kind = kind
        self.broker = broker
        self.host = "127.0.0.1"
        self.port = broker.port
        self.tls_port = tls_port
        self.pki = pki
        self.management_tls_port = management_tls_port

    @property
    def is_warren(self):
        return self.kind == "warren"

    def log(self):
        if not self.is_warren or not self.broker.log_path:
            return ""
        with open(self.broker.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def log_says(self, text, timeout=3.0):
        """warren only: waits until its log holds `text` (log lines are written asynchronously)."""
        wait_for(lambda: text in self.log(), timeout, what=f"warren's log to say {text!r}")

    def metric(self, name):
        """warren only: one sample of /metrics, 0 if absent."""
        body = urllib.request.urlopen(self.broker.management_uri.replace(
            "http://guest:guest@", "http://") + "/metrics", timeout=5).read().decode()
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        return 0.0


def tls_warren_args(pki, tls_port, extra=()):
    return ["--tls-listen", f"127.0.0.1:{tls_port}",
            "--tls-cert", pki.server.cert, "--tls-key", pki.server.key, "--tls-ca", pki.ca.cert,
            "--tls-verify-peer", "--tls-fail-if-no-peer-cert",
            "--auth-mechanisms", "PLAIN,AMQPLAIN,EXTERNAL",
            "--handshake-timeout", str(HANDSHAKE_TIMEOUT_MS), *extra]


def spawn_warren(bin_path, work, args, plain=True):
    """A warren node of the module's own, started with `args` (TLS flags), ready once its
    management API answers; without `plain` its plain listener is off (--listen none)."""
    port = free_port()
    b = Broker("warren", f"amqp://guest:guest@127.0.0.1:{port}/%2F", bin_path=bin_path,
               data_dir=os.path.join(work, "data"), log_path=os.path.join(work, "warren.log"),
               management_uri=f"http://guest:guest@127.0.0.1:{free_port()}")
    os.makedirs(b.data_dir, exist_ok=True)
    management = b.management_uri.replace("http://guest:guest@", "")
    listen = f"127.0.0.1:{port}" if plain else "none"
    with open(b.log_path, "ab") as log:
        b.proc = subprocess.Popen([bin_path, "server", "--data-dir", b.data_dir, "--listen", listen,
                                   "--management-listen", management, *args],
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wait_port("127.0.0.1", int(management.rsplit(":", 1)[1]), BROKER_START_TIMEOUT_S, b.proc)
    return b


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def node(broker, pki, tmp_path_factory):
    if broker.is_rabbitmq:
        port = int(os.environ.get("WARREN_TLS_RMQ_PORT", "5690"))
        tls_port = port + 1
        conf = "\n".join([
            f"listeners.ssl.default = 127.0.0.1:{tls_port}",
            f"ssl_options.cacertfile = {pki.ca.cert}",
            f"ssl_options.certfile = {pki.server.cert}",
            f"ssl_options.keyfile = {pki.server.key}",
            "ssl_options.verify = verify_peer",
            "ssl_options.fail_if_no_peer_cert = true",
            "ssl_options.versions.1 = tlsv1.3",
            "ssl_options.versions.2 = tlsv1.2",
            "auth_mechanisms.1 = PLAIN",
            "auth_mechanisms.2 = AMQPLAIN",
            "auth_mechanisms.3 = EXTERNAL",
            "ssl_cert_login_from = distinguished_name",
            f"handshake_timeout = {HANDSHAKE_TIMEOUT_MS}",
            f"ssl_handshake_timeout = {HANDSHAKE_TIMEOUT_MS}",
        ])
        env = dict(os.environ, RMQ_PORT=str(port), RMQ_DIST_PORT=str(port + 20000),
                   RMQ_STATE=str(tmp_path_factory.mktemp("rabbitmq-tls")),
                   RMQ_PLUGINS="rabbitmq_auth_mechanism_ssl", RMQ_EXTRA_CONF=conf)
        subprocess.run([rabbitmq_script(), "start"], env=env, check=True, timeout=200,
                       stdout=subprocess.DEVNULL)
        b = RabbitNode(f"amqp://guest:guest@127.0.0.1:{port}/%2F", env)
        try:
            wait_port("127.0.0.1", tls_port, BROKER_START_TIMEOUT_S)
            yield TlsNode("rabbitmq", b, tls_port, pki)
        finally:
            subprocess.run([rabbitmq_script(), "stop"], env=env, timeout=120,
                           stdout=subprocess.DEVNULL)
        return
    tls_port, mgmt_tls_port = free_port(), free_port()
    b = spawn_warren(broker.bin_path, str(tmp_path_factory.mktemp("warren-tls")),
                     tls_warren_args(pki, tls_port,
                                     ["--management-tls-listen", f"127.0.0.1:{mgmt_tls_port}"]))
    wait_port("127.0.0.1", tls_port, BROKER_START_TIMEOUT_S, b.proc)
    yield TlsNode("warren", b, tls_port, pki, mgmt_tls_port)
    b.stop(signal.SIGTERM)


@pytest.fixture(scope="module")
def external_user(node):
    """The user the trusted client certificate logs in as with EXTERNAL (its DN)."""
    node.broker.provision(CLIENT_DN, "not-used-by-external", "/")
    return CLIENT_DN


def client_context(ca, cert=None, version=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def tls_params(node, cert=None, credentials=None, ca=None, version=None, port=None):
    ctx = client_context(ca or node.pki.ca.cert, cert, version)
    return pika.ConnectionParameters(
        host=node.host, port=port or node.tls_port,
        ssl_options=pika.SSLOptions(ctx, server_hostname="localhost"),
        credentials=credentials or pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10)


def roundtrip(conn, queue):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, auto_delete=True)
    ch.basic_publish("", queue, b"over tls " * 200)
    _, _, body = get(ch, queue)
    assert body == b"over tls " * 200
    return ch


def refused_quickly(params):
    """Connecting fails, and fast; returns the exception."""
    start = time.monotonic()
    with pytest.raises(AMQPConnectionError) as excinfo:
        c = pika.BlockingConnection(params)
        # A TLS 1.3 client learns that its certificate was refused on its first read at the
        # latest; one round trip on a channel makes sure it does.
        c.channel()
    elapsed = time.monotonic() - start
    assert elapsed < REFUSAL_S, f"refusal took {elapsed:.1f}s"
    return excinfo.value


def read_until_closed(sock, limit_s):
    """Reads until the peer closes (EOF or reset); returns (bytes, seconds). Fails if still open."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, ssl.SSLError, ssl.SSLEOFError):
        pass
    except socket.timeout:
        pytest.fail(f"the connection was still open after {limit_s}s")
    return data, time.monotonic() - start


# ------------------------------------------------------------------ what both brokers do


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3],
                         ids=["tls1.2", "tls1.3"])
def test_trusted_client_logs_in_with_plain_and_messages_go_through(node, name, version):
    conn = pika.BlockingConnection(tls_params(node, cert=node.pki.client, version=version))
    try:
        roundtrip(conn, name)
    finally:
        conn.close()


def test_external_logs_in_as_the_certificate_dn_without_a_password(node, external_user, name):
    conn = pika.BlockingConnection(tls_params(
        node, cert=node.pki.client, credentials=pika.credentials.ExternalCredentials()))
    try:
        ch = roundtrip(conn, name)
        # user_id must be the authenticated user: proves who EXTERNAL logged in as.
        ch.basic_publish("", name, b"x", pika.BasicProperties(user_id=CLIENT_DN))
        assert get(ch, name)[1].user_id == CLIENT_DN
        expect_channel_error(
            406, f"PRECONDITION_FAILED - user_id property set to 'guest' but authenticated user "
                 f"was '{CLIENT_DN}'",
            ch.basic_publish, "", name, b"x", pika.BasicProperties(user_id="guest"))
    finally:
        if conn.is_open:
            conn.close()


def test_external_for_a_user_that_does_not_exist_is_refused(node):
    e = refused_quickly(tls_params(node, cert=node.pki.nobody,
                                   credentials=pika.credentials.ExternalCredentials()))
    assert "ACCESS_REFUSED" in str(e) or "403" in str(e), repr(e)
    if node.is_warren:
        node.log_says("login refused: no such user")
        assert NOBODY_DN in node.log()


def test_external_is_not_offered_on_the_plain_port(node, external_user):
    params = pika.ConnectionParameters(host=node.host, port=node.port,
                                       credentials=pika.credentials.ExternalCredentials(),
                                       connection_attempts=1, socket_timeout=5)
    with pytest.raises(AuthenticationError):
        pika.BlockingConnection(params)


def test_certificate_from_an_untrusted_ca_is_refused(node):
    before = node.metric('warren_tls_handshake_failures_total{reason="untrusted_certificate"}') \
        if node.is_warren else 0
    refused_quickly(tls_params(node, cert=node.pki.stranger))
    if node.is_warren:
        node.log_says("the client certificate is not signed by a trusted CA")
        assert node.metric(
            'warren_tls_handshake_failures_total{reason="untrusted_certificate"}') == before + 1


def test_expired_client_certificate_is_refused(node):
    refused_quickly(tls_params(node, cert=node.pki.expired))
    if node.is_warren:
        node.log_says("the client certificate expired at")
        assert node.metric('warren_tls_handshake_failures_total{reason="expired_certificate"}') >= 1


def test_client_without_a_certificate_is_refused(node):
    refused_quickly(tls_params(node))
    if node.is_warren:
        node.log_says("the client presented no certificate")
        assert node.metric('warren_tls_handshake_failures_total{reason="no_certificate"}') >= 1


def test_client_that_does_not_trust_the_server_fails_its_handshake(node, tmp_path):
    with pytest.raises((AMQPConnectionError, ssl.SSLError)):
        pika.BlockingConnection(tls_params(node, cert=node.pki.client,
                                           ca=node.pki.other_ca.cert))
    if node.is_warren:
        node.log_says("it does not trust the server's certificate")


def test_plain_amqp_client_on_the_tls_port_is_closed_not_left_hanging(node):
    with socket.create_connection((node.host, node.tls_port), timeout=5) as s:
        s.sendall(AMQP_HEADER)
        data, _ = read_until_closed(s, REFUSAL_S)
    # Never an AMQP answer (connection.start or a protocol header) on the TLS port.
    assert not data.startswith(b"\x01") and not data.startswith(b"AMQP"), data[:16]
    params = pika.ConnectionParameters(host=node.host, port=node.tls_port,
                                       connection_attempts=1, socket_timeout=5)
    refused_quickly(params)
    if node.is_warren:
        node.log_says("a plain AMQP client on the TLS port")
        assert node.metric('warren_tls_handshake_failures_total{reason="not_tls"}') >= 2


def test_silent_client_on_the_tls_port_is_closed_after_the_handshake_timeout(node):
    with socket.create_connection((node.host, node.tls_port), timeout=5) as s:
        _, elapsed = read_until_closed(s, SILENT_CLOSE_S_MAX)
    assert elapsed >= HANDSHAKE_TIMEOUT_MS / 1000 * 0.8, f"closed after {elapsed:.1f}s"
    if node.is_warren:
        node.log_says("TLS handshake refused: not finished within the handshake timeout")


def test_client_silent_after_the_tls_handshake_is_closed_after_the_timeout(node):
    ctx = client_context(node.pki.ca.cert, node.pki.client)
    with socket.create_connection((node.host, node.tls_port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            _, elapsed = read_until_closed(s, SILENT_CLOSE_S_MAX)
    assert elapsed >= HANDSHAKE_TIMEOUT_MS / 1000 * 0.5, f"closed after {elapsed:.1f}s"
    if node.is_warren:
        node.log_says("handshake not finished within the handshake timeout")
        assert node.metric("warren_handshake_timeouts_total") >= 1


def test_silent_client_on_the_plain_port_is_closed_after_the_handshake_timeout(node):
    with socket.create_connection((node.host, node.port), timeout=5) as s:
        _, elapsed = read_until_closed(s, SILENT_CLOSE_S_MAX)
    assert elapsed >= HANDSHAKE_TIMEOUT_MS / 1000 * 0.8, f"closed after {elapsed:.1f}s"


# ------------------------------------------------------------------ warren only


def warren_only(node):
    if not node.is_warren:
        pytest.skip("warren only: operates on the warren process, its flags or its log")


def test_failed_logins_are_logged_with_the_peer_and_counted(node):
    warren_only(node)
    before = node.metric("warren_auth_attempts_failed_total")
    with pytest.raises(AMQPConnectionError):
        pika.BlockingConnection(tls_params(node, cert=node.pki.client,
                                           credentials=pika.PlainCredentials("guest", "nope")))
    wait_for(lambda: node.metric("warren_auth_attempts_failed_total") == before + 1,
             what="the failed login to be counted")
    node.log_says("login refused: invalid credentials")
    assert "peer=127.0.0.1:" in re.sub(r"\x1b\[[0-9;]*m", "", node.log())


def test_management_api_over_https(node):
    warren_only(node)
    ctx = ssl.create_default_context(cafile=node.pki.ca.cert)
    req = urllib.request.Request(f"https://localhost:{node.management_tls_port}/api/overview",
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
        assert r.status == 200
        assert b'"product_name":"warren"' in r.read()
    # warren ctl speaks HTTPS too, trusting the CA it is given.
    uri = f"https://guest:guest@localhost:{node.management_tls_port}"
    out = subprocess.run([node.broker.bin_path, "ctl", "--uri", uri, "--cacert", node.pki.ca.cert,
                          "list_vhosts"], capture_output=True, text=True, timeout=CTL_TIMEOUT_S)
    assert out.returncode == 0 and "/" in out.stdout.splitlines()[1:], out.stderr
    out = subprocess.run([node.broker.bin_path, "ctl", "--uri", uri, "--cacert",
                          node.pki.other_ca.cert, "list_vhosts"], capture_output=True, text=True,
                         timeout=CTL_TIMEOUT_S)
    assert out.returncode != 0
    # Plain HTTP on the HTTPS port is refused, and the log says what came instead.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{node.management_tls_port}/api/overview",
                               timeout=5).read()
    node.log_says("not a TLS ClientHello: the client sent plain text")


def test_listen_none_serves_tls_only(node, tmp_path):
    warren_only(node)
    pki = node.pki
    tls_port = free_port()
    b = spawn_warren(node.broker.bin_path, str(tmp_path), tls_warren_args(pki, tls_port),
                     plain=False)
    try:
        wait_port("127.0.0.1", tls_port, BROKER_START_TIMEOUT_S, b.proc)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", b.port), timeout=2)
        conn = pika.BlockingConnection(
            tls_params(TlsNode("warren", b, tls_port, pki), cert=pki.client))
        roundtrip(conn, "tls-only")
        conn.close()
    finally:
        b.stop()


@pytest.mark.parametrize("fault,expected", [
    ("mismatched-key", "does not match the certificate"),
    ("missing-cert", "cannot read certificates from"),
    ("no-key", "cannot read a private key from"),
    ("cert-without-key-flag", "--tls-listen needs --tls-cert and --tls-key"),
])
def test_bad_certificate_files_stop_the_node_with_a_message_naming_them(node, tmp_path, fault,
                                                                         expected):
    warren_only(node)
    pki = node.pki
    cert, key = pki.server.cert, pki.server.key
    if fault == "mismatched-key":
        key = pki.client.key
    elif fault == "missing-cert":
        cert = str(tmp_path / "nowhere.pem")
    elif fault == "no-key":
        key = pki.server.cert
    args = [node.broker.bin_path, "server", "--data-dir", str(tmp_path / "data"),
            "--listen", f"127.0.0.1:{free_port()}", "--management-listen", "none",
            "--tls-listen", f"127.0.0.1:{free_port()}", "--tls-cert", cert]
    if fault != "cert-without-key-flag":
        args += ["--tls-key", key]
    out = subprocess.run(args, capture_output=True, text=True, timeout=20)
    assert out.returncode != 0
    assert expected in out.stderr, out.stderr


def test_common_name_login(node, tmp_path):
    warren_only(node)
    pki = node.pki
    tls_port = free_port()
    b = spawn_warren(node.broker.bin_path, str(tmp_path),
                     tls_warren_args(pki, tls_port, ["--tls-cert-login-from", "common_name"]))
    try:
        wait_port("127.0.0.1", tls_port, BROKER_START_TIMEOUT_S, b.proc)
        b.provision(CLIENT_CN, "unused", "/")
        n = TlsNode("warren", b, tls_port, pki)
        conn = pika.BlockingConnection(tls_params(
            n, cert=pki.client, credentials=pika.credentials.ExternalCredentials()))
        ch = roundtrip(conn, "cn-login")
        ch.basic_publish("", "cn-login", b"x", pika.BasicProperties(user_id=CLIENT_CN))
        assert get(ch, "cn-login")[1].user_id == CLIENT_CN
        conn.close()
    finally:
        b.stop()


def test_certificates_reload_on_sighup_and_ctl_without_dropping_connections(node, tmp_path):
    warren_only(node)
    pki = node.pki
    cert, key = str(tmp_path / "live.pem"), str(tmp_path / "live.key")
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    tls_port = free_port()
    args = ["--tls-listen", f"127.0.0.1:{tls_port}", "--tls-cert", cert, "--tls-key", key,
            "--tls-ca", pki.ca.cert, "--tls-verify-peer"]
    b = spawn_warren(node.broker.bin_path, str(tmp_path / "node"), args)
    n = TlsNode("warren", b, tls_port, pki)
    try:
        wait_port("127.0.0.1", tls_port, BROKER_START_TIMEOUT_S, b.proc)
        old = pika.BlockingConnection(tls_params(n, cert=pki.client))
        old_ch = roundtrip(old, "reload-old")
        # Rotate: a server certificate from a new CA, written over the same files.
        rotated_ca = make_ca(str(tmp_path), "rotated-ca", "warren rotated CA")
        rotated = issue_server(str(tmp_path), "rotated", rotated_ca)
        shutil.copy(rotated.cert, cert)
        shutil.copy(rotated.key, key)
        b.proc.send_signal(signal.SIGHUP)
        n.log_says("TLS certificates reloaded")
        assert n.metric("warren_tls_certificate_reloads_total") == 1
        # New connections get the new certificate; the open one goes on with the old session.
        new = pika.BlockingConnection(tls_params(n, cert=pki.client, ca=rotated_ca.cert))
        roundtrip(new, "reload-new")
        new.close()
        with pytest.raises((AMQPConnectionError, ssl.SSLError)):
            pika.BlockingConnection(tls_params(n, cert=pki.client))
        old_ch.basic_publish("", "reload-old", b"still here")
        assert get(old_ch, "reload-old")[2] == b"still here"
        old.close()
        # A bad key: the reload fails naming the file, and the node keeps the working ones.
        with open(key, "w") as f:
            f.write("not a key\n")
        out = subprocess.run([b.bin_path, "ctl", "--uri", b.management_uri,
                              "reload_certificates"], capture_output=True, text=True,
                             timeout=CTL_TIMEOUT_S)
        assert out.returncode != 0
        assert f"cannot read a private key from {key}" in out.stderr, out.stderr
        assert n.metric("warren_tls_certificate_reload_failures_total") == 1
        again = pika.BlockingConnection(tls_params(n, cert=pki.client, ca=rotated_ca.cert))
        roundtrip(again, "reload-kept")
        again.close()
        # And a good one through ctl.
        shutil.copy(pki.server.key, key)
        shutil.copy(pki.server.cert, cert)
        out = subprocess.run([b.bin_path, "ctl", "--uri", b.management_uri,
                              "reload_certificates"], capture_output=True, text=True,
                             timeout=CTL_TIMEOUT_S)
        assert out.returncode == 0, out.stderr
        back = pika.BlockingConnection(tls_params(n, cert=pki.client))
        back.close()
    finally:
        b.stop()


def test_certificate_expiration_check_names_the_listener_whose_certificate_expires(node):
    # The server certificate and its CA are valid for 30 days: not within a week, within two
    # months. RabbitMQ 3.10 passes both: it looks for the files in the listener's options,
    # where a listener configured by ssl_options has none (checked against 3.10.8).
    base = node.broker.management_uri.replace("http://guest:guest@", "http://")

    def check(within):
        req = urllib.request.Request(f"{base}/api/health/checks/certificate-expiration/{within}",
                                     headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert check("1/weeks") == (200, {"status": "ok"})
    assert check("1/fortnights")[0] == 400
    if node.kind != "warren":
        return
    code, body = check("2/months")
    assert (code, body.get("status"), body.get("reason")) == (503, "failed", "Certificates expiring"), body
    # Its HTTPS listener serves the same certificate.
    assert [(e["protocol"], e["port"]) for e in body["expired"]] == [
        ("amqp/ssl", node.tls_port), ("https", node.management_tls_port)]
    first = body["expired"][0]
    assert first["certfile"] == node.pki.server.cert and first["cacertfile"] == node.pki.ca.cert
    assert len(first["certfile_expires_on"]) == 1 and len(first["cacertfile_expires_on"]) == 1
