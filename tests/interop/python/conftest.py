"""Fixtures that give every test a broker: the real RabbitMQ (the reference) or warren.

WARREN_TEST_BROKER=warren|rabbitmq picks which (default warren).
- rabbitmq: the broker is already running (scripts/interop.sh starts it once per run); the tests
  talk to WARREN_TEST_URI (default amqp://guest:guest@127.0.0.1:5680/) and manage users through
  rabbitmqctl (`rabbitmq.sh ctl 1 ...`, path in RABBITMQ_SH). Restart tests are skipped.
- warren: the fixture starts WARREN_BIN (default target/release/warren) itself on a free port with
  a fresh data dir, and can stop it with SIGTERM or SIGKILL and start it again on the same port and
  data dir. If WARREN_TEST_URI is set, an already running warren is used and restarts are skipped.
"""

import os
import signal
import socket
import subprocess
import time
import urllib.parse
import uuid

import pika
import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BROKER_KIND = os.environ.get("WARREN_TEST_BROKER", "warren")
# Set by `scripts/interop.sh --broker warren-cluster`: the suite runs against node 2 of a
# cluster, and tests that start clusters of their own are left to the single-node run.
IN_CLUSTER_RUN = bool(os.environ.get("WARREN_TEST_CLUSTER"))
BROKER_START_TIMEOUT_S = 30.0
BROKER_STOP_TIMEOUT_S = 15.0
CTL_TIMEOUT_S = 60.0


# A broker that stops answering would otherwise cost the per-test timeout for every test left;
# after this many timeouts in a row the rest of the run fails at once.
CONSECUTIVE_TIMEOUTS_MAX = 3
_timeouts_in_a_row = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    global _timeouts_in_a_row
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    if report.failed and "from pytest-timeout" in str(report.longrepr):
        _timeouts_in_a_row += 1
    else:
        _timeouts_in_a_row = 0


def pytest_runtest_setup(item):
    if (item.get_closest_marker("restart") and BROKER_KIND == "warren"
            and os.environ.get("WARREN_TEST_URI")):
        pytest.skip("restarts a broker process, and the suite did not start this one")
    if _timeouts_in_a_row >= CONSECUTIVE_TIMEOUTS_MAX:
        pytest.fail(f"not run: the broker stopped answering ({_timeouts_in_a_row} tests in a row "
                    "timed out)", pytrace=False)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host, port, timeout_s, proc=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s}s")


class Broker:
    """The broker under test, and the operations tests need on it."""

    def __init__(self, kind, uri, proc=None, bin_path=None, data_dir=None, log_path=None,
                 management_uri=None):
        self.kind = kind
        self.uri = uri
        # warren is administered through its HTTP management API (warren ctl --uri ...).
        self.management_uri = management_uri or os.environ.get("WARREN_TEST_MANAGEMENT_URI",
                                                               "http://guest:guest@127.0.0.1:15672")
        parsed = urllib.parse.urlparse(uri)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 5672
        self.proc = proc
        self.bin_path = bin_path
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = []

    @property
    def is_rabbitmq(self):
        return self.kind == "rabbitmq"

    @property
    def can_restart(self):
        return self.proc is not None

    def params(self, **kwargs):
        p = pika.URLParameters(self.uri)
        p.connection_attempts = 1
        p.socket_timeout = 5
        p.blocked_connection_timeout = 10
        for k, v in kwargs.items():
            setattr(p, k, v)
        return p

    def connect(self, **kwargs):
        return pika.BlockingConnection(self.params(**kwargs))

    # ------------------------------------------------------------ process control (warren only)

    def _spawn(self):
        os.makedirs(self.data_dir, exist_ok=True)
        management = urllib.parse.urlparse(self.management_uri)
        args = [self.bin_path, "server", "--listen", f"{self.host}:{self.port}",
                "--data-dir", self.data_dir,
                "--management-listen", f"{management.hostname}:{management.port}"] + self.extra_args
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        wait_port(self.host, self.port, BROKER_START_TIMEOUT_S, self.proc)
        # The HTTP listener may come up a moment after AMQP's; tests call `ctl` through it
        # at once (a loaded machine made that "connection refused").
        if "--management-listen" not in self.extra_args:
            wait_port(management.hostname, management.port, BROKER_START_TIMEOUT_S, self.proc)

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(BROKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(BROKER_STOP_TIMEOUT_S)
            raise AssertionError(f"broker ignored {sig!r} for {BROKER_STOP_TIMEOUT_S}s")

    def restart(self, sig=signal.SIGTERM, extra_args=None):
        """Stops the broker with `sig` and starts it again on the same port and data dir.

        On RabbitMQ a graceful restart is `rabbitmqctl stop_app` + `start_app` (the node recovers
        its durable state from disk as after SIGTERM); SIGKILL cannot be done there."""
        if self.is_rabbitmq and sig == signal.SIGTERM and not extra_args:
            self.ctl("stop_app")
            self.ctl("start_app")
            wait_port(self.host, self.port, BROKER_START_TIMEOUT_S)
            return
        if not self.can_restart:
            pytest.skip(f"cannot {signal.Signals(sig).name} a {self.kind} broker the suite did not "
                        "start")
        self.stop(sig)
        if extra_args is not None:
            self.extra_args = list(extra_args)
        self._spawn()

    # ------------------------------------------------------------ administration

    def ctl(self, *args):
        """rabbitmqctl-style administration, with rabbitmqctl's argument order on both brokers."""
        if self.is_rabbitmq:
            script = os.environ.get("RABBITMQ_SH",
                                    os.path.join(REPO_ROOT, "..", "shared", "rabbitmq", "rabbitmq.sh"))
            cmd = [script, "ctl", "1", *args]
        else:
            cmd = [self.bin_path, "ctl", "--uri", self.management_uri, *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=CTL_TIMEOUT_S)
        assert out.returncode == 0, f"{cmd} failed: {out.stdout}{out.stderr}"
        return out.stdout

    def provision(self, user, password, vhost, perms=(".*", ".*", ".*")):
        """Creates `user` and `vhost` (either may already exist) and grants `perms` on it.

        perms is (configure, write, read) as rabbitmqctl's set_permissions takes them, or None
        to grant nothing."""
        self._ctl_ignore_exists("add_vhost", vhost)
        self._ctl_ignore_exists("add_user", user, password)
        if perms is not None:
            self.ctl("set_permissions", "-p", vhost, user, *perms)

    def _ctl_ignore_exists(self, *args):
        try:
            self.ctl(*args)
        except AssertionError as e:
            if "already exists" not in str(e) and "already_exists" not in str(e):
                raise

    def uri_for(self, user, password, vhost):
        return (f"amqp://{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}"
                f"@{self.host}:{self.port}/{urllib.parse.quote(vhost, safe='')}")

    def set_memory_alarm(self, on):
        """Raises or clears the memory alarm (publishers get connection.blocked)."""
        self.ctl("set_vm_memory_high_watermark", "0.0000001" if on else "0.4")


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    uri = os.environ.get("WARREN_TEST_URI")
    if BROKER_KIND == "rabbitmq":
        b = Broker("rabbitmq", uri or "amqp://guest:guest@127.0.0.1:5680/%2F")
        wait_port(b.host, b.port, BROKER_START_TIMEOUT_S)
        yield b
        return
    assert BROKER_KIND == "warren", f"unknown WARREN_TEST_BROKER={BROKER_KIND!r}"
    bin_path = os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren"))
    if uri:
        b = Broker("warren", uri, bin_path=bin_path)
        wait_port(b.host, b.port, BROKER_START_TIMEOUT_S)
        yield b
        return
    assert os.access(bin_path, os.X_OK), f"no warren binary at {bin_path}"
    work = tmp_path_factory.mktemp("warren")
    port = free_port()
    b = Broker("warren", f"amqp://guest:guest@127.0.0.1:{port}/%2F", bin_path=bin_path,
               data_dir=str(work / "data"), log_path=str(work / "warren.log"),
               management_uri=f"http://guest:guest@127.0.0.1:{free_port()}")
    b._spawn()
    yield b
    b.stop(signal.SIGTERM)


@pytest.fixture(autouse=True)
def broker_survives_the_test(request):
    """Fails the test during which a broker process the suite started died, and starts it again
    so that one crash does not fail every test after it."""
    yield
    if "broker" not in request.fixturenames:
        return
    b = request.getfixturevalue("broker")
    if b.proc is None or b.proc.poll() is None:
        return
    code = b.proc.returncode
    tail = ""
    if b.log_path and os.path.exists(b.log_path):
        with open(b.log_path, "rb") as f:
            tail = f.read()[-2000:].decode(errors="replace")
    b.extra_args = []
    b._spawn()
    pytest.fail(f"the broker process exited with {code} during this test; log tail:\n{tail}")


@pytest.fixture
def conn(broker):
    c = broker.connect()
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def ch(conn):
    return conn.channel()


@pytest.fixture
def name(request):
    """A name unique to this test run, so tests never see each other's objects."""
    return f"interop.{request.node.name[:60]}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def raw(broker):
    from amqp_raw import RawConnection
    conns = []

    def make(**kwargs):
        c = RawConnection(broker.host, broker.port, **kwargs)
        conns.append(c)
        return c
    yield make
    for c in conns:
        c.close()


def channel_error(excinfo):
    """(reply_code, reply_text) of a ChannelClosedByBroker / ConnectionClosedByBroker."""
    e = excinfo.value
    return e.reply_code, e.reply_text
