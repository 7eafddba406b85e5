#!/usr/bin/env python3
"""Cluster figures, warren beside RabbitMQ 3.10 in the same run (docs/benchmarks/cluster.md):

1. the time a 3-node warren cluster takes to form (all three started at once, until every node
   sees a leader and every member running and named);
2. declaring N queues (default 10,000) with one binding each through one node, one client
   waiting for each reply, against a 3-node warren cluster and a 3-node RabbitMQ cluster
   (`../shared/rabbitmq/rabbitmq.sh start 3`);
3. each node's idle CPU (percent of a core over 20 s) and RSS holding those queues.

    scripts/cluster-bench.py [--queues N] [--skip-rabbitmq] [--queue-type classic|quorum]

Run it from the repo root with the interop venv (.venv/bin/python, made by scripts/interop-setup.sh)
and a release build. It prints a table; nothing here is a test verdict.
"""

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import pika

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WARREN = os.environ.get("WARREN_BIN", os.path.join(REPO, "target", "release", "warren"))
RABBITMQ_SH = os.path.abspath(os.path.join(REPO, "..", "shared", "rabbitmq", "rabbitmq.sh"))
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def idle(pids, seconds=20):
    before = {p: cpu_seconds(p) for p in pids}
    time.sleep(seconds)
    return {p: (100 * (cpu_seconds(p) - before[p]) / seconds, rss_mib(p)) for p in pids}


def api(port, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


QUEUE_ARGS = {}


def declare(port, n):
    conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=port))
    ch = conn.channel()
    ch.exchange_declare("bench.x", "direct", durable=True)
    start = time.monotonic()
    for i in range(n):
        ch.queue_declare(f"bench.q{i}", durable=True, arguments=QUEUE_ARGS)
        ch.queue_bind(f"bench.q{i}", "bench.x", f"k{i}")
        if (i + 1) % 1000 == 0:
            print(f"  {i + 1} queues", file=sys.stderr)
    elapsed = time.monotonic() - start
    conn.close()
    return elapsed


def warren_cluster(n_queues):
    d = tempfile.mkdtemp(prefix="warren-cluster-bench-")
    seeds = ",".join(f"127.0.0.1:{25771 + i}" for i in range(3))
    procs = []
    try:
        start = time.monotonic()
        for i in range(3):
            log = open(os.path.join(d, f"n{i + 1}.log"), "wb")
            procs.append(subprocess.Popen(
                [WARREN, "server", "--node-name", f"n{i + 1}", "--listen", f"127.0.0.1:{5771 + i}",
                 "--cluster-listen", f"127.0.0.1:{25771 + i}", "--cluster-seeds", seeds,
                 "--data-dir", os.path.join(d, f"n{i + 1}"),
                 "--management-listen", f"127.0.0.1:{15771 + i}"], stdout=log, stderr=log,
                # A session of its own, as rabbitmq.sh starts RabbitMQ's nodes (issue 37).
                start_new_session=True))
        while True:
            try:
                ok = True
                for i in range(3):
                    s = api(15771 + i, "/api/warren/cluster")
                    ok &= (s["metadata"]["leader"] != 0 and all(m["running"] for m in s["members"])
                           and len(s["metadata"]["members"]) == 3)
                if ok:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.01)
        formed = time.monotonic() - start
        print(f"warren: cluster formed in {formed:.2f} s", file=sys.stderr)
        declared = declare(5771, n_queues)
        counts = [len(api(15771 + i, "/api/queues")) for i in range(3)]
        usage = idle([p.pid for p in procs])
        return formed, declared, counts, usage
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


def rabbitmq_cluster(n_queues):
    subprocess.run([RABBITMQ_SH, "start", "3"], check=True, stdout=subprocess.DEVNULL)
    try:
        declared = declare(5680, n_queues)
        pids = []
        state = os.environ.get("RMQ_STATE", "/tmp/warren-rabbitmq")
        for i in range(1, 4):
            with open(os.path.join(state, f"rabbit{i}.pid")) as f:
                pids.append(int(f.read().strip()))
        usage = idle(pids)
        return declared, usage
    finally:
        subprocess.run([RABBITMQ_SH, "stop"], stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--skip-rabbitmq", action="store_true")
    ap.add_argument("--queue-type", choices=("classic", "quorum"), default="classic",
                    help="quorum: every queue a 3-member quorum queue (a Raft group each)")
    args = ap.parse_args()
    if args.queue_type == "quorum":
        QUEUE_ARGS["x-queue-type"] = "quorum"
    formed, w_declared, counts, w_usage = warren_cluster(args.queues)
    print(f"\n| | warren 3 nodes | RabbitMQ 3.10, 3 nodes |\n|---|---|---|")
    r = None if args.skip_rabbitmq else rabbitmq_cluster(args.queues)
    print(f"| cluster formed | {formed:.2f} s | |")
    rate = lambda s: f"{s:.1f} s ({args.queues / s:,.0f} queues+bindings/s)"
    print(f"| declare {args.queues:,} {args.queue_type} queues + 1 binding each, one node | {rate(w_declared)} | "
          f"{rate(r[0]) if r else '-'} |")
    print(f"| queues seen on each node | {counts} | |")
    for i, (cpu, rss) in enumerate(w_usage.values()):
        other = list(r[1].values())[i] if r else None
        o = f"{other[0]:.2f} % CPU, {other[1]:.0f} MiB" if other else "-"
        print(f"| node {i + 1} idle with the queues | {cpu:.2f} % CPU, {rss:.0f} MiB | {o} |")


if __name__ == "__main__":
    main()
