"""Message safety of a 3-node warren cluster under faults (issue 11's Proof), with the Jepsen-style
workload and checker of queue_jepsen.py: confirming publishers and transactional acking consumers
on every node while at least 20 faults (kill -9 and restart, a node partitioned, two nodes cut
from each other, SIGSTOP/SIGCONT) hit the nodes; then heal, drain and check that no confirmed
message was lost, none was corrupt and none appeared that was never published.

The second test shows that the checker catches a broker that lies: a node started with
--fault-injection is told to confirm the publishes other nodes forward to it without storing
them, and the tool must report them lost and exit non-zero.

Verdicts are about message sets, never timings: the schedule runs until its fault count is
reached (with a generous cap), and every wait polls to a deadline. Knobs:
WARREN_JEPSEN_SEED (random by default, printed: replays the fault schedule),
WARREN_JEPSEN_QUEUE_TYPE (both classic and quorum by default, one schedule each; quorum queues
are also held to --strict-acks: nothing delivered after its ack's tx.commit-ok),
WARREN_JEPSEN_FAULTS (default 22).
The long run (300+ faults, an hour) is scripts/queue-faults.sh.
"""

import os
import random
import re
import subprocess
import sys

import pytest

from conftest import BROKER_KIND, IN_CLUSTER_RUN
import netns_cluster
import queue_jepsen

NETNS_OK, NETNS_WHY = (netns_cluster.available() if BROKER_KIND == "warren"
                       else (False, "starts warren nodes itself"))

pytestmark = [
    pytest.mark.skipif(IN_CLUSTER_RUN, reason="starts warren nodes itself"),
    pytest.mark.skipif(not NETNS_OK, reason=NETNS_WHY),
]

SEED = int(os.environ.get("WARREN_JEPSEN_SEED", str(random.SystemRandom().randrange(1 << 31))))
QUEUE_TYPES = os.environ.get("WARREN_JEPSEN_QUEUE_TYPE", "classic,quorum").split(",")
QUEUE_TYPE = QUEUE_TYPES[0]
FAULTS = int(os.environ.get("WARREN_JEPSEN_FAULTS", "22"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_no_confirmed_message_is_lost_under_a_fault_schedule(capsys, queue_type):
    # Short gaps and holds so that 20+ faults fit in about a minute; a slow machine only takes
    # longer (the schedule ends on its fault count, capped at --duration).
    strict = ["--strict-acks"] if queue_type == "quorum" else []
    args = queue_jepsen.parser().parse_args([
        "--seed", str(SEED), "--queue-type", queue_type, "--faults", str(FAULTS),
        "--duration", "600", "--gap", "0.5", "1.5", "--hold", "0.5", "2.5"] + strict)
    with capsys.disabled():
        print()
        result = queue_jepsen.run(args)
        for d in result.details:
            print(f"[queue-jepsen] {d}")
        print(result.line())
    s = result.summary
    assert s["faults"] >= min(FAULTS, 20), s
    assert s["confirmed"] > 0, s
    assert result.ok, (f"seed {SEED}: " + "; ".join(result.violations) + "\n"
                       + "\n".join(result.details))


@pytest.mark.timeout(300)
def test_the_checker_reports_messages_a_node_confirmed_without_storing():
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "queue_jepsen.py")
    r = subprocess.run(
        [sys.executable, tool, "--plant-bug", "--faults", "0", "--duration", "8",
         "--seed", str(SEED), "--queue-type", QUEUE_TYPE],
        capture_output=True, text=True, timeout=280)
    out = r.stdout + r.stderr
    summary = re.search(r"\[queue-jepsen\] summary: (.*)", out)
    assert summary, out
    fields = dict(kv.split("=", 1) for kv in summary.group(1).split(", "))
    # Every publish forwarded to the planted node was confirmed and stored nowhere.
    assert int(fields["lost"]) > 0, out
    assert int(fields["unexpected"]) == 0 and int(fields["corrupt"]) == 0, out
    assert r.returncode == 1, out
    assert "VIOLATIONS" in out and "confirmed messages lost" in out, out
