#!/usr/bin/env python3
"""Quorum queues side by side (issue 11's Proof): a local 3-node warren cluster
(scripts/cluster.sh, AMQP 5672-5674) and RabbitMQ 3.10's 3-node cluster
(../shared/rabbitmq/rabbitmq.sh start 3, AMQP 5700-5702), same machine, same client (the official
PerfTest), same workloads, one run:

  leader     1 queue, 1 producer and 1 consumer on the leader's node
  follower   the same with the clients on a node that does not lead the queue
  w2         the leader case on a queue of group size 1 (no replication): W3/W2 is the cost of it
  4q         4 queues led by different nodes, a producer and a consumer each, spread over nodes
  40q        40 queues, 40 producers at 10 msg/s, 40 consumers spread over the nodes: latency
  40q-tail   the same through `warren perf` (PerfTest's summary stops at the 99th percentile):
             p99.9, after 5 s of warm-up
  failover   a probe publishing with confirms through a surviving node while the queue's
             leader's node is killed -9 (under load): the longest wait for a confirm, and
             whether every confirmed message is still there

Each rate case is 1 KB persistent messages with confirms (-c 1000) and acks (-q 1000), queues with
x-quorum-initial-group-size=3 (except w2). Prints one line per broker and case (rates, latency
percentiles, CPU of the three nodes per message), then warren/RabbitMQ ratios, and writes them
as JSON (--json).

  scripts/compare-quorum.py [--seconds 20] [--cases leader,follower,...] [--json FILE]
                            [--brokers warren,rabbitmq] [--warren-args "--wal-commit-window-us 500"]
                            [--confirm-window N] [--warmup-seconds 20]
                            [--warren-session own|shared|both] [--port-offset N]

Before the first case, each broker runs the leader case's load unmeasured for --warmup-seconds
(default 20; 0 skips) on a queue of its own, so that the first measured case does not pay for
a fresh cluster alone: PerfTest's JIT, and a fresh warren node's first WAL files, which grow
(three disk round trips per sync) where later ones are recycled (one).

--trace-disk records every fsync and fdatasync on the machine (`perf record -a`, root) during
the 40-queue cases and adds, per broker and case, how many times the disk stalled (syncs of
10 ms or more, overlapping ones counted once) and the longest sync. This machine's virtual disk
stalls every node's syncs at once, for 10-100 ms, about once a minute, with or without a broker
running (an fdatasync loop alone sees it too): one stall in a case's window decides its p99.9.

--warren-disk-stalls EVERY_MS,STALL_MS[,SYNC_MS] starts the warren nodes with fault injection and
makes their WAL syncs stall the same way, together, every EVERY_MS for STALL_MS (or, with
SYNC_MS, each sync in that spell SYNC_MS slower): how warren's tail rides out the stalls above,
the same ones for every build compared (RabbitMQ has no such switch; measure it alone).

--warren-session own (default) starts each warren node in a session of its own (`setsid`, through
scripts/cluster.sh), as rabbitmq.sh starts RabbitMQ's; `shared` leaves them in this script's
session, which PerfTest runs in too. With the kernel's autogroup scheduling (Linux's default on
desktops and on this machine) the shared arrangement schedules warren and its load generator as
one group and flatters warren (issue 37): it is there to measure that, and every line printed
says which arrangement ran. `both` runs warren both ways, own first.

--profile prints, for each rate case and broker, per thread kind (threads grouped by name) the
CPU, voluntary and involuntary context switches and the hot path's syscalls per message
(scripts/thread_profile.py; perf, root): what batching saves does not move with the load.

--pin-nodes CPUS (e.g. 0,1,0) pins node i of each broker, every thread of it, to the i-th CPU
(`taskset -a -p`, once it runs), as on a host whose neighbours leave each node one core.

--port-offset N moves every port of both clusters up by N (warren's AMQP 5672+N.., management
15672+N.., links 25672+N..; RabbitMQ's AMQP 5700+N.., distribution 25700+N..), to run beside
another cluster on the same machine.

--confirm-window N replaces -c 1000 by -c N: each producer then waits on round trips rather
than on the CPU, which is how to see on a 2-core machine whether throughput grows with the
queues (4q/leader) when one queue does not already keep every core busy.
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pika

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_profile import Profile  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RMQ = os.path.join(ROOT, "..", "shared", "rabbitmq", "rabbitmq.sh")
TICKS = os.sysconf("SC_CLK_TCK")
RATE_FLAGS = ["-s", "1024", "-c", "1000", "-q", "1000", "-f", "persistent"]
# The 40-queue cases start each producer at a random moment within a second, as independent
# publishers are: `warren perf` starts its 40 producers in the same millisecond, and their
# schedules then stay in step, a burst of 40 messages every 100 ms (p50 4.6-5.1 ms against
# 2.0-2.1 ms spread, same broker). Both tools take the flag; both brokers get the same.
SPREAD_PRODUCERS = ["--producer-random-start-delay", "1"]
ALL_CASES = ["leader", "follower", "w2", "4q", "40q", "40q-tail", "failover"]
WARREN_BIN = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
# --profile: each rate case's nodes profiled per thread kind (scripts/thread_profile.py).
PROFILE = False


def log(msg):
    print(f"[compare-quorum] {msg}", file=sys.stderr, flush=True)


class Broker:
    def __init__(self, name, first_port, env, pid_files, start, stop, mgmt_port=None):
        self.name = name
        self.ports = [first_port + i for i in range(3)]
        self.mgmt_ports = [mgmt_port + i for i in range(3)] if mgmt_port else []
        self.env = env
        self.pid_files = pid_files
        self._start, self._stop = start, stop

    def uri(self, node):
        return f"amqp://guest:guest@127.0.0.1:{self.ports[node - 1]}"

    def pids(self):
        out = []
        for f in self.pid_files:
            try:
                out.append(int(open(f).read().strip()))
            except (OSError, ValueError):
                pass
        return out

    def cpu_ticks(self):
        total = 0
        for pid in self.pids():
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            except OSError:
                pass
        return total

    def start(self):
        subprocess.run(self._start, env=self.env, cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        if self.mgmt_ports:
            wait_formed(self.mgmt_ports[0])

    def stop(self):
        pids = self.pids()
        subprocess.run(self._stop, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        # Gone before the next cluster binds the same ports.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.1)


def stall_disks(spec, mgmt_ports):
    """Every warren node's WAL syncs stall as `spec` (EVERY_MS,STALL_MS[,SYNC_MS]) says."""
    every, stall, *sync = spec.split(",")
    query = f"every_ms={every}&stall_ms={stall}&sync_ms={sync[0] if sync else 0}"
    for port in mgmt_ports:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/warren/faults/disk-stalls?{query}", method="POST")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        urllib.request.urlopen(req, timeout=5)


def wait_formed(mgmt_port, deadline_s=60):
    """Until node 1 sees a metadata leader and all three members running: topology changes
    are refused before."""
    deadline = time.monotonic() + deadline_s
    req = urllib.request.Request(f"http://127.0.0.1:{mgmt_port}/api/warren/cluster")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    while True:
        try:
            status = json.load(urllib.request.urlopen(req, timeout=2))
            if status["metadata"]["leader"] and len(status["members"]) == 3 \
                    and all(m["running"] for m in status["members"]):
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the warren cluster did not form")
        time.sleep(0.2)


def connect(port, deadline_s=60):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", port, heartbeat=0, blocked_connection_timeout=None))
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def declare(port, queue, group_size=3):
    """Declares through the node at `port`: with both brokers' client-local placement, its
    node leads the queue."""
    conn = connect(port)
    ch = conn.channel()
    ch.queue_delete(queue)
    ch.queue_declare(queue, durable=True, arguments={
        "x-queue-type": "quorum", "x-quorum-initial-group-size": group_size})
    conn.close()


def perftest(broker, uris, seconds, args):
    cmd = [RMQ, "perftest", "-H", ",".join(uris), "-z", str(seconds), "-p"] + args
    t0 = broker.cpu_ticks()
    with Profile(broker.pids() if PROFILE else []) as prof:
        out = subprocess.run(cmd, env=broker.env, cwd=ROOT, capture_output=True,
                             text=True).stdout
    cpu_s = (broker.cpu_ticks() - t0) / TICKS
    sent = re.search(r"sending rate avg: (\d+) msg/s", out)
    recv = re.search(r"receiving rate avg: (\d+) msg/s", out)
    lat = re.search(r"consumer latency min/median/75th/95th/99th ([\d/]+) ", out)
    if not sent:
        log(f"{broker.name}: PerfTest printed no summary:\n{out[-2000:]}")
        return None
    sent, recv = int(sent.group(1)), int(recv.group(1)) if recv else 0
    if sent == 0:
        log(f"{broker.name}: PerfTest sent nothing:\n{out[-3000:]}")
    result = {"sent": sent, "received": recv,
              "cpu_us_per_msg": cpu_s * 1e6 / max(1, sent * seconds)}
    if PROFILE:
        print(prof.table(sent * seconds, f"{broker.name} {' '.join(args[:2])}: "), flush=True)
        result["profile"] = dict(prof.rows(sent * seconds))
    if lat:
        p = [int(x) for x in lat.group(1).split("/")]
        result.update(lat_p50_us=p[1], lat_p95_us=p[3], lat_p99_us=p[4])
    return result


class DiskTrace:
    """Every sync syscall on the machine while a case runs: the disk's stalls in its window."""
    STALL_S = 0.010
    EVENTS = ",".join(f"syscalls:sys_{k}_{c}" for c in ("fdatasync", "fsync")
                      for k in ("enter", "exit"))

    def __init__(self, enabled):
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            self.out = tempfile.mktemp(suffix=".perf")
            self.proc = subprocess.Popen(["perf", "record", "-q", "-a", "-o", self.out, "-e",
                                          self.EVENTS], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait()

    def summary(self):
        """{disk_stalls, slowest_sync_ms, syncs}, or {} when not traced."""
        if not self.enabled:
            return {}
        text = subprocess.run(["perf", "script", "-i", self.out, "-F", "tid,time,event"],
                              capture_output=True, text=True).stdout
        os.unlink(self.out)
        began, slow, syncs, slowest = {}, [], 0, 0.0
        for m in re.finditer(r"(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_", text):
            tid, t, kind = m.group(1), float(m.group(2)), m.group(3)
            if kind == "enter":
                began[tid] = t
            elif tid in began:
                start = began.pop(tid)
                syncs += 1
                slowest = max(slowest, t - start)
                if t - start >= self.STALL_S:
                    slow.append((start, t))
        stalls, end = 0, None
        for start, stop in sorted(slow):
            if end is None or start > end:
                stalls += 1
                end = stop
            else:
                end = max(end, stop)
        return {"disk_stalls": stalls, "slowest_sync_ms": round(slowest * 1e3, 1),
                "syncs": syncs}


def case_rate(broker, seconds, case, trace_disk=False):
    if case in ("40q", "40q-tail"):
        with DiskTrace(trace_disk) as trace:
            result = case_latency(broker, seconds, case)
        if result is not None:
            result.update(trace.summary())
        return result
    if case in ("leader", "follower", "w2"):
        queue = f"cq-{case}"
        declare(broker.ports[0], queue, 1 if case == "w2" else 3)
        node = 2 if case == "follower" else 1
        return perftest(broker, [broker.uri(node)], seconds,
                        ["-u", queue, "-x", "1", "-y", "1"] + RATE_FLAGS)
    if case == "4q":
        for i in range(1, 5):
            declare(broker.ports[(i - 1) % 3], f"cq-4q-{i}")
        uris = [broker.uri(n) for n in (1, 2, 3)]
        return perftest(broker, uris, seconds,
                        ["--queue-pattern", "cq-4q-%d", "--queue-pattern-from", "1",
                         "--queue-pattern-to", "4", "-x", "4", "-y", "4"] + RATE_FLAGS)
    raise ValueError(case)


def case_latency(broker, seconds, case):
    if case == "40q":
        for i in range(1, 41):
            declare(broker.ports[(i - 1) % 3], f"cq-40q-{i}")
        uris = [broker.uri(n) for n in (1, 2, 3)]
        return perftest(broker, uris, seconds,
                        ["--queue-pattern", "cq-40q-%d", "--queue-pattern-from", "1",
                         "--queue-pattern-to", "40", "-x", "40", "-y", "40", "-r", "10"]
                        + SPREAD_PRODUCERS + RATE_FLAGS)
    if case == "40q-tail":
        for i in range(1, 41):
            declare(broker.ports[(i - 1) % 3], f"cq-40t-{i}")
        uris = [broker.uri(n) for n in (1, 2, 3)]
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [WARREN_BIN, "perf", "-H", ",".join(uris), "-z", str(seconds + 5),
                   "--warmup-seconds", "5", "--json", out.name,
                   "--queue-pattern", "cq-40t-%d", "--queue-pattern-from", "1",
                   "--queue-pattern-to", "40", "-x", "40", "-y", "40", "-r", "10", "-p",
                   *SPREAD_PRODUCERS, *RATE_FLAGS]
            t0 = broker.cpu_ticks()
            subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            cpu_s = (broker.cpu_ticks() - t0) / TICKS
            r = json.load(open(out.name))
        lat = r["latency_us"]
        sent = r["totals"]["sent"]
        return {"sent": round(r["send_rate_avg"]), "received": round(r["receive_rate_avg"]),
                "cpu_us_per_msg": cpu_s * 1e6 / max(1, sent),
                "lat_p50_us": lat["p50"], "lat_p99_us": lat["p99"], "lat_p999_us": lat["p999"],
                "lat_max_us": lat["max"]}
    raise ValueError(case)


def warm_up(broker, seconds):
    """The leader case's load on a queue of its own, unmeasured, then deleted."""
    declare(broker.ports[0], "cq-warmup")
    perftest(broker, [broker.uri(1)], seconds, ["-u", "cq-warmup", "-x", "1", "-y", "1"]
             + RATE_FLAGS)
    conn = connect(broker.ports[0])
    conn.channel().queue_delete("cq-warmup")
    conn.close()
    log(f"{broker.name}: warmed up for {seconds} s")


def case_failover(broker, seconds):
    """Kills the leader's node (node 1) -9 a third into the run while PerfTest loads a queue
    it leads and a probe publishes to another one with confirms, both through node 2."""
    declare(broker.ports[0], "cq-fo-load")
    declare(broker.ports[0], "cq-fo-probe")
    load = subprocess.Popen(
        [RMQ, "perftest", "-H", broker.uri(2), "-z", str(seconds), "-p", "-u", "cq-fo-load",
         "-x", "1", "-y", "1", "-r", "2000"] + RATE_FLAGS,
        env=broker.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conn = connect(broker.ports[1])
    ch = conn.channel()
    ch.confirm_delivery()
    confirmed, nacked, waits = [], 0, []
    started = time.monotonic()
    killed_at = None
    seq = 0
    while time.monotonic() - started < seconds:
        if killed_at is None and time.monotonic() - started > seconds / 3:
            pid = broker.pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
        seq += 1
        t = time.monotonic()
        try:
            ch.basic_publish("", "cq-fo-probe", str(seq).encode(),
                             pika.BasicProperties(delivery_mode=2), mandatory=False)
            confirmed.append(seq)
        except pika.exceptions.NackError:
            nacked += 1
        waits.append((t, time.monotonic() - t))
    conn.close()
    load.wait()
    after = [w for t, w in waits if killed_at and t >= killed_at - 1]
    # Nothing confirmed lost: drain the probe queue through a surviving node.
    conn = connect(broker.ports[2])
    ch = conn.channel()
    seen = set()
    while True:
        m, _, body = ch.basic_get("cq-fo-probe", auto_ack=True)
        if m is None:
            break
        seen.add(int(body))
    conn.close()
    lost = len(set(confirmed) - seen)
    return {"longest_confirm_wait_s": round(max(after, default=0), 3),
            "probe_confirmed": len(confirmed), "probe_nacked": nacked, "lost": lost}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--cases", default=",".join(ALL_CASES))
    p.add_argument("--json")
    p.add_argument("--brokers", default="warren,rabbitmq",
                   help="which of the two to measure (one alone: no ratios)")
    p.add_argument("--warren-args", default="", help="extra arguments for every warren node")
    p.add_argument("--warmup-seconds", type=int, default=20,
                   help="the leader case's load, unmeasured, before the first case (0: none)")
    p.add_argument("--trace-disk", action="store_true",
                   help="count the disk's stalls during the 40-queue cases (perf, root)")
    p.add_argument("--warren-disk-stalls", metavar="EVERY_MS,STALL_MS[,SYNC_MS]",
                   help="warren's WAL syncs stall together this way (fault injection)")
    p.add_argument("--warren-session", choices=("own", "shared", "both"), default="own",
                   help="warren's nodes each in a session of their own (as RabbitMQ's), or in "
                        "this script's, or both one after the other")
    p.add_argument("--profile", action="store_true",
                   help="per thread kind: CPU, context switches, syscalls per message (perf, root)")
    p.add_argument("--pin-nodes", metavar="CPUS",
                   help="node i of each broker pinned to the i-th CPU of this list (taskset)")
    p.add_argument("--port-offset", type=int, default=0,
                   help="every port of both clusters moved up by this much")
    p.add_argument("--confirm-window", type=int,
                   help="unconfirmed publishes per producer (PerfTest -c) instead of 1000")
    args = p.parse_args()
    global PROFILE
    PROFILE = args.profile
    if args.confirm_window:
        RATE_FLAGS[RATE_FLAGS.index("-c") + 1] = str(args.confirm_window)
    cases = [c for c in args.cases.split(",") if c]
    if args.warren_disk_stalls:
        args.warren_args = f"{args.warren_args} --fault-injection".strip()
    if "WARREN_BIN" not in os.environ:  # as cluster.sh: a given binary is not rebuilt
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "warren"], cwd=ROOT,
                       check=True)
    off = args.port_offset
    wdir = tempfile.mkdtemp(prefix="warren-compare-quorum.")
    sessions = ["own", "shared"] if args.warren_session == "both" else [args.warren_session]
    brokers = []
    for session in sessions:
        # One name per arrangement when both run: results and ratios keep them apart.
        name = "warren" if len(sessions) == 1 else f"warren-{session}"
        wenv = dict(os.environ, WARREN_CLUSTER_DIR=os.path.join(wdir, session),
                    WARREN_BIN=WARREN_BIN, WARREN_EXTRA_ARGS=args.warren_args,
                    WARREN_SESSION=session, WARREN_CLUSTER_PORT_OFFSET=str(off))
        brokers.append(Broker(name, 5672 + off, wenv,
                              [f"{wdir}/{session}/n{i}.pid" for i in (1, 2, 3)],
                              ["scripts/cluster.sh", "start", "3"], ["scripts/cluster.sh", "stop"],
                              mgmt_port=15672 + off))
    rstate = "/tmp/warren-rabbitmq-quorum" + (f"-{off}" if off else "")
    renv = dict(os.environ, RMQ_STATE=rstate, RMQ_PORT=str(5700 + off),
                RMQ_DIST_PORT=str(25700 + off))
    brokers.append(Broker("rabbitmq", 5700 + off, renv,
                          [f"{rstate}/rabbit{i}.pid" for i in (1, 2, 3)],
                          [RMQ, "start", "3"], [RMQ, "stop"]))
    wanted = args.brokers.split(",")
    brokers = [b for b in brokers if b.name.split("-")[0] in wanted]
    log("warren's nodes: " + ", then ".join(
        "each in a session of its own (setsid), as RabbitMQ's" if s == "own"
        else "in this script's session, with PerfTest (not like for like)" for s in sessions))
    results = {}
    # One broker at a time: an idle Erlang VM's schedulers spin, and on a small machine the
    # other cluster's mere presence moved latency percentiles by tens of milliseconds.
    for b in brokers:
        try:
            b.start()
            if args.pin_nodes:
                cpus = args.pin_nodes.split(",")
                for i, pid in enumerate(b.pids()):
                    subprocess.run(["taskset", "-a", "-p", "-c", cpus[i % len(cpus)], str(pid)],
                                   check=True, stdout=subprocess.DEVNULL)
                log(f"{b.name}: nodes pinned to CPUs {args.pin_nodes}")
            if b.mgmt_ports and args.warren_disk_stalls:
                stall_disks(args.warren_disk_stalls, b.mgmt_ports)
            log(f"{b.name}: load before: {open('/proc/loadavg').read().split()[:3]}")
            if args.warmup_seconds > 0:
                warm_up(b, args.warmup_seconds)
            for case in cases:
                r = case_failover(b, args.seconds) if case == "failover" \
                    else case_rate(b, args.seconds, case, args.trace_disk)
                results.setdefault(case, {})[b.name] = r
                shown = {k: v for k, v in r.items() if k != "profile"} if r else r
                print(f"{case:9} {b.name:9} {shown}", flush=True)
        finally:
            b.stop()
    # Each run's nodes write gigabytes; fifty runs filled this machine's disk.
    shutil.rmtree(wdir, ignore_errors=True)
    print()
    warrens = {b.name: b.env["WARREN_SESSION"] for b in brokers if b.mgmt_ports}
    for case, r in results.items():
        for wname, session in warrens.items():
            w, q = r.get(wname), r.get("rabbitmq")
            if not w or not q or "sent" not in w:
                continue
            line = (f"{case:9} {wname} ({session} session)/RabbitMQ "
                    f"rate {w['sent'] / max(1, q['sent']):.2f}x, "
                    f"received {w['received'] / max(1, q['received']):.2f}x, "
                    f"CPU per message {w['cpu_us_per_msg'] / max(1e-9, q['cpu_us_per_msg']):.3f}x")
            if "lat_p99_us" in w and "lat_p99_us" in q:
                line += f", p99 {w['lat_p99_us']} us vs {q['lat_p99_us']} us"
            if "lat_p999_us" in w and "lat_p999_us" in q:
                line += f", p99.9 {w['lat_p999_us']} us vs {q['lat_p999_us']} us"
            print(line)
    for name in [*warrens, "rabbitmq"]:
        lead = results.get("leader", {}).get(name)
        for other in ("follower", "w2", "4q"):
            o = results.get(other, {}).get(name)
            if lead and o:
                print(f"{name:9} {other}/leader rate {o['sent'] / max(1, lead['sent']):.2f}x, "
                      f"received {o['received'] / max(1, lead['received']):.2f}x")
    results["warren_sessions"] = warrens
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
