"""The default user given by --default-user/--default-pass (WARREN_DEFAULT_USER/_PASS), as
RabbitMQ's default_user/default_pass and its image's RABBITMQ_DEFAULT_USER/_PASS: an
administrator on vhost / in guest's place, the password of record at every start, and what
`warren ctl` logs in with when its --uri names no user.

Each test starts a warren of its own (the suite's broker keeps guest). RabbitMQ sets these in
its config file at first boot, which the suite cannot restart with: warren only."""

import os
import subprocess

import pika
import pytest

from conftest import BROKER_KIND, Broker, free_port
from pika.exceptions import AuthenticationError, ProbableAuthenticationError

pytestmark = pytest.mark.skipif(BROKER_KIND != "warren",
                                reason="a config-file setting of RabbitMQ's, set at first boot")

USER, PASSWORD = "operator", "s3cret-default"


@pytest.fixture
def node(tmp_path):
    bin_path = os.environ.get("WARREN_BIN", os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "target", "release", "warren"))
    b = Broker("warren", f"amqp://{USER}:{PASSWORD}@127.0.0.1:{free_port()}/%2F",
               bin_path=bin_path, data_dir=str(tmp_path / "data"),
               log_path=str(tmp_path / "warren.log"),
               management_uri=f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}")
    b.extra_args = ["--default-user", USER, "--default-pass", PASSWORD]
    b._spawn()
    yield b
    b.stop()


def login(node, user, password):
    return pika.BlockingConnection(node.params(credentials=pika.PlainCredentials(user, password)))


def refused(node, user, password):
    with pytest.raises((AuthenticationError, ProbableAuthenticationError)) as excinfo:
        login(node, user, password)
    assert "ACCESS_REFUSED" in str(excinfo.value)


def ctl_from_env(node, *args, env_user=USER, env_pass=PASSWORD):
    """`warren ctl` with a --uri that names no user, the login from the node's environment."""
    port = node.management_uri.rsplit(":", 1)[1]
    env = dict(os.environ, WARREN_DEFAULT_USER=env_user, WARREN_DEFAULT_PASS=env_pass)
    env.pop("WARREN_CTL_URI", None)
    return subprocess.run([node.bin_path, "ctl", "--uri", f"http://127.0.0.1:{port}", *args],
                          env=env, capture_output=True, text=True, timeout=30)


def test_default_user_replaces_guest_and_administers_vhost_slash(node):
    conn = login(node, USER, PASSWORD)
    ch = conn.channel()
    ch.queue_declare("default-user-q", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "default-user-q", b"hello")
    assert ch.basic_get("default-user-q", auto_ack=True)[2] == b"hello"
    conn.close()
    # Guest is gone, as RabbitMQ never creates it beside a default user: refused even here.
    refused(node, "guest", "guest")
    users = ctl_from_env(node, "list_users")
    assert users.returncode == 0, users.stderr
    assert USER in users.stdout and "administrator" in users.stdout
    assert "guest" not in users.stdout


@pytest.mark.restart
def test_the_settings_stay_the_password_of_record_across_restarts(node):
    node.ctl("add_user", "guest", "guest")
    node.ctl("change_password", USER, "changed-by-hand")  # the last call with the old password
    node.restart()
    login(node, USER, PASSWORD).close()
    refused(node, USER, "changed-by-hand")
    refused(node, "guest", "guest")
    # Without the settings the node keeps what it has: the user, and no guest come back.
    node.restart(extra_args=[])
    login(node, USER, PASSWORD).close()
    refused(node, "guest", "guest")


def test_ctl_with_other_credentials_in_its_environment_is_refused(node):
    out = ctl_from_env(node, "list_users", env_pass="wrong")
    assert out.returncode != 0
    assert "not authorised" in out.stderr and "WARREN_DEFAULT_USER" in out.stderr


def test_a_default_user_without_a_password_stops_the_node_at_start(tmp_path, node):
    out = subprocess.run([node.bin_path, "server", "--listen", f"127.0.0.1:{free_port()}",
                          "--management-listen", "none", "--data-dir", str(tmp_path / "half"),
                          "--default-user", "alone"],
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode != 0
    assert "--default-user and --default-pass go together" in out.stderr
