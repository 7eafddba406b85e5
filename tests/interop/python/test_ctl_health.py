"""rabbitmq-diagnostics' health checks as `warren ctl` commands (ping, check_running,
check_alarms, check_local_alarms, check_virtual_hosts, check_port_listener,
check_protocol_listener): exit code 0 when the check passes, 1 with the reason when it fails,
as container probes expect."""

import subprocess

import pytest

from conftest import BROKER_KIND, CTL_TIMEOUT_S
from helpers import wait_for

pytestmark = pytest.mark.skipif(BROKER_KIND != "warren", reason="warren ctl's own commands")


def ctl(broker, *args):
    return subprocess.run([broker.bin_path, "ctl", "--uri", broker.management_uri, *args],
                          capture_output=True, text=True, timeout=CTL_TIMEOUT_S)


def test_the_checks_pass_on_a_healthy_node(broker):
    for check in (["ping"], ["check_running"], ["check_alarms"], ["check_local_alarms"],
                  ["check_virtual_hosts"], ["check_port_listener", str(broker.port)],
                  ["check_protocol_listener", "amqp"]):
        out = ctl(broker, *check)
        assert out.returncode == 0, (check, out)


def test_a_listener_the_node_lacks_fails_its_check(broker):
    unused = 1 if broker.port != 1 else 2
    out = ctl(broker, "check_port_listener", str(unused))
    assert out.returncode == 1 and "No active listener" in out.stderr, out
    out = ctl(broker, "check_protocol_listener", "stomp")
    assert out.returncode == 1, out


def test_an_alarm_fails_the_alarm_checks_until_it_clears(broker):
    broker.set_memory_alarm(True)
    try:
        for check in ("check_alarms", "check_local_alarms"):
            wait_for(lambda check=check: ctl(broker, check).returncode == 1, what=f"{check} fails")
            out = ctl(broker, check)
            assert "memory alarm" in out.stderr, (check, out)
    finally:
        broker.set_memory_alarm(False)
    for check in ("check_alarms", "check_local_alarms"):
        wait_for(lambda check=check: ctl(broker, check).returncode == 0, what=f"{check} passes")
