#!/usr/bin/env python3
"""Backlogs larger than memory, measured on a real warren process.

  scripts/backlog-bench.py memory  [--messages 10000000] [--size 1024]
      One durable queue filled with N persistent messages (warren perf, confirms, no consumer):
      the broker's peak RSS while filling; then SIGKILL, restart, time until the management API
      shows every message back, and RSS after; then a drain (warren perf consumer) with its rate and peak RSS.
  scripts/backlog-bench.py quorum  [--messages 3000000] [--size 1024]
      A local 3-node cluster (scripts/cluster.sh, AMQP 5672-5674): one quorum queue on two of the
      nodes filled with N persistent messages (warren perf, confirms, no consumer) after a few
      were consumed; then the third node added as a member, which is behind every entry the
      leader keeps and fetches the backlog below a snapshot; then a drain by a consumer on the
      new member's node. Each phase's peak RSS per node. --fill-only stops after the fill.
  scripts/backlog-bench.py queues  [--queues 10000] [--per-queue 1000] [--size 1024]
      Q durable queues bound to one fanout exchange, M persistent messages published to it
      (Q x M stored messages); then SIGKILL and the time until the management API shows every
      message back, and RSS.

Needs target/release/warren (cargo build --release -p warren) and the interop venv (pika):
run it as .venv/bin/python scripts/backlog-bench.py ... Data goes to --data-dir (default a
fresh directory under /tmp), removed at the end unless --keep.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import base64

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARREN = os.path.join(ROOT, "target", "release", "warren")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def mib(n):
    return f"{n / 2**20:,.0f} MiB"


class PeakRss:
    """Samples a process's RSS every 100 ms in the background; `peak` is the highest seen."""

    def __init__(self, pid):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.1)

    def stop(self):
        self._stop.set()
        self._t.join()
        return self.peak


class Node:
    def __init__(self, data_dir, extra):
        self.data_dir, self.extra = data_dir, extra
        self.port, self.mport = free_port(), free_port()
        self.proc = None

    def start(self):
        """Starts warren; returns seconds until it accepts AMQP connections."""
        t0 = time.monotonic()
        log = open(os.path.join(self.data_dir, "warren.log"), "ab")
        self.proc = subprocess.Popen(
            [WARREN, "server", "--listen", f"127.0.0.1:{self.port}", "--data-dir",
             os.path.join(self.data_dir, "node"), "--management-listen",
             f"127.0.0.1:{self.mport}", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"warren exited with {self.proc.returncode}; see {self.data_dir}/warren.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return time.monotonic() - t0
            except OSError:
                time.sleep(0.02)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)

    @property
    def uri(self):
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def api(self, path):
        req = urllib.request.Request(f"http://127.0.0.1:{self.mport}{path}")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def ready_messages(self):
        """Ready messages over all queues, or -1 while the API is not up yet (it starts once
        recovery is done; the AMQP port is bound before, so a TCP connect proves little)."""
        try:
            return self.api("/api/overview")["queue_totals"]["messages_ready"]
        except OSError:
            return -1

    def wal_files(self):
        wal = os.path.join(self.data_dir, "node", "wal")
        files = [os.path.join(wal, f) for f in os.listdir(wal)]
        return f"{len(files)} WAL files, {mib(sum(os.path.getsize(f) for f in files))}"


def perf(node, *args):
    out = subprocess.run([WARREN, "perf", "-h", node.uri, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"warren perf failed: {out.stdout}{out.stderr}")
    return out.stdout


def rate_of(output, what):
    key = f"{what} rate avg:"
    for line in output.splitlines():
        if key in line:
            return float(line.split(key)[1].split()[0])
    return float("nan")


def memory(args, node):
    n, size = args.messages, args.size
    print(f"filling one durable queue with {n:,} x {size} B persistent messages", flush=True)
    peak = PeakRss(node.proc.pid)
    t0 = time.monotonic()
    out = perf(node, "-x", "1", "-y", "0", "-u", "backlog", "-ad", "false", "-f", "persistent",
               "-s", str(size), "-c", "1000", "-C", str(n))
    fill_s = time.monotonic() - t0
    fill_peak = peak.stop()
    print(f"  filled in {fill_s:.0f} s ({rate_of(out, 'sending'):,.0f} msg/s); "
          f"peak RSS {mib(fill_peak)}; RSS now {mib(rss_bytes(node.proc.pid))}", flush=True)
    assert node.ready_messages() == n
    print(f"  at the kill: {node.wal_files()}", flush=True)
    node.kill()
    up = node.start()
    t0 = time.monotonic()
    while node.ready_messages() != n:
        time.sleep(0.05)
    back = up + time.monotonic() - t0
    print(f"  SIGKILL + restart: all {n:,} messages back {back:.2f} s after start; "
          f"RSS {mib(rss_bytes(node.proc.pid))}", flush=True)
    peak = PeakRss(node.proc.pid)
    t0 = time.monotonic()
    out = perf(node, "-x", "0", "-y", "1", "-u", "backlog", "-p", "-q", "1000", "-D", str(n))
    drain_s = time.monotonic() - t0
    print(f"  drained in {drain_s:.0f} s ({rate_of(out, 'receiving'):,.0f} msg/s); "
          f"peak RSS {mib(peak.stop())}", flush=True)
    return {"messages": n, "size": size, "fill_s": fill_s, "fill_peak_rss": fill_peak,
            "all_back_s": back, "drain_s": drain_s}


def queues(args, node):
    import pika  # the interop venv has it

    q, m, size = args.queues, args.per_queue, args.size
    print(f"{q:,} durable queues on a fanout exchange, {m:,} persistent {size} B messages "
          f"published to it: {q * m:,} stored messages", flush=True)
    c = pika.BlockingConnection(pika.URLParameters(node.uri))
    ch = c.channel()
    ch.exchange_declare("fan", "fanout", durable=True)
    t0 = time.monotonic()
    for i in range(q):
        ch.queue_declare(f"q{i}", durable=True)
        ch.queue_bind(f"q{i}", "fan")
    print(f"  declared and bound in {time.monotonic() - t0:.1f} s", flush=True)
    ch.confirm_delivery()
    t0 = time.monotonic()
    payload = b"x" * size
    for i in range(m):
        ch.basic_publish("fan", "", payload, pika.BasicProperties(delivery_mode=2))
        if (i + 1) % max(1, m // 10) == 0:
            print(f"  {i + 1:,} published ({(i + 1) * q:,} stored) in "
                  f"{time.monotonic() - t0:.0f} s, RSS {mib(rss_bytes(node.proc.pid))}", flush=True)
    c.close()
    assert node.ready_messages() == q * m
    print(f"  at the kill: {node.wal_files()}", flush=True)
    node.kill()
    up = node.start()
    t0 = time.monotonic()
    while node.ready_messages() != q * m:
        time.sleep(0.05)
    back = up + time.monotonic() - t0
    print(f"  SIGKILL + restart: all {q * m:,} messages back {back:.2f} s after start; "
          f"RSS {mib(rss_bytes(node.proc.pid))}", flush=True)
    return {"queues": q, "per_queue": m, "all_back_s": back}


def quorum(args):
    """See the module's docstring."""
    import pika  # the interop venv has it

    n, size = args.messages, args.size
    cdir = args.data_dir or tempfile.mkdtemp(prefix="warren-quorum-backlog-")
    env = dict(os.environ, WARREN_CLUSTER_DIR=cdir, WARREN_BIN=WARREN)
    sh = os.path.join(ROOT, "scripts", "cluster.sh")
    subprocess.run([sh, "start", "3"], env=env, check=True, stdout=subprocess.DEVNULL)
    ports = {f"n{i}": (5671 + i, 15671 + i) for i in (1, 2, 3)}

    def api(node, path):
        req = urllib.request.Request(f"http://127.0.0.1:{ports[node][1]}{path}")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def pid(node):
        return int(open(os.path.join(cdir, f"{node}.pid")).read())

    def uri(node):
        return f"amqp://guest:guest@127.0.0.1:{ports[node][0]}/%2F"

    def peaks():
        return {node: PeakRss(pid(node)) for node in ports}

    def report(what, t0, samplers):
        rss = {node: mib(p.stop()) for node, p in samplers.items()}
        print(f"  {what} in {time.monotonic() - t0:.0f} s; peak RSS {rss}", flush=True)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status = api("n1", "/api/warren/cluster")
                if status["metadata"]["leader"] and all(m["running"] for m in status["members"]):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.exit("the cluster did not form")
            time.sleep(0.2)
        c = pika.BlockingConnection(pika.URLParameters(uri("n1")))
        ch = c.channel()
        ch.queue_declare("backlog", durable=True, arguments={
            "x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
        ch.confirm_delivery()
        for _ in range(1000):
            ch.basic_publish("", "backlog", b"settled", pika.BasicProperties(delivery_mode=2))
        for _ in range(1000):
            method, _, _ = ch.basic_get("backlog", auto_ack=True)
            assert method is not None
        c.close()
        members = api("n1", "/api/queues/%2F/backlog")["members"]
        [outsider] = [node for node in ports if node not in members]
        print(f"one quorum queue on {members}, {n:,} x {size} B persistent messages", flush=True)
        samplers, t0 = peaks(), time.monotonic()
        out = subprocess.run([WARREN, "perf", "-h", uri("n1"), "-x", "1", "-y", "0", "-u",
                              "backlog", "-p", "-f", "persistent", "-s", str(size), "-c", "1000",
                              "-C", str(n)], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"warren perf failed: {out.stdout}{out.stderr}")
        report(f"filled ({rate_of(out.stdout, 'sending'):,.0f} msg/s)", t0, samplers)
        if args.fill_only:
            return {"messages": n, "size": size, "members": members}
        samplers, t0 = peaks(), time.monotonic()
        r = subprocess.run([WARREN, "ctl", "--uri", f"http://127.0.0.1:{ports['n1'][1]}",
                            "add_member", "backlog", outsider], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"add_member failed: {r.stderr}")
        log = os.path.join(cdir, f"{outsider}.log")
        while "a snapshot's entries were fetched" not in open(log, errors="replace").read():
            time.sleep(0.2)
        line = [x for x in open(log, errors="replace") if "entries were fetched" in x][-1]
        report(f"{outsider} added and caught up ({line.split('fetched')[1].strip()})", t0,
               samplers)
        samplers, t0 = peaks(), time.monotonic()
        out = subprocess.run([WARREN, "perf", "-h", uri(outsider), "-x", "0", "-y", "1", "-u",
                              "backlog", "-p", "-q", "1000", "-D", str(n)],
                             capture_output=True, text=True)
        report(f"drained through {outsider} ({rate_of(out.stdout, 'receiving'):,.0f} msg/s)",
               t0, samplers)
        return {"messages": n, "size": size, "members": members + [outsider]}
    finally:
        subprocess.run([sh, "stop"], env=env, stdout=subprocess.DEVNULL)
        if not args.keep:
            shutil.rmtree(cdir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["memory", "queues", "quorum"])
    p.add_argument("--messages", type=int, default=10_000_000)
    p.add_argument("--queues", type=int, default=10_000)
    p.add_argument("--per-queue", type=int, default=1000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--data-dir")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--fill-only", action="store_true",
                   help="quorum: stop after the fill (no third member: a third of the disk)")
    p.add_argument("--cold", action="store_true",
                   help="drop the page cache before the restart (root): a cold recovery")
    p.add_argument("server_args", nargs="*", help="extra `warren server` flags, after --")
    args = p.parse_args()
    if not os.access(WARREN, os.X_OK):
        sys.exit("build it first: cargo build --release -p warren")
    if args.what == "quorum":
        print(json.dumps(quorum(args)))
        return
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="warren-backlog-")
    os.makedirs(data_dir, exist_ok=True)
    node = Node(data_dir, args.server_args)
    node.start()
    if args.cold:
        orig_kill = node.kill

        def cold_kill():
            orig_kill()
            subprocess.run(["sync"])
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        node.kill = cold_kill
    try:
        result = memory(args, node) if args.what == "memory" else queues(args, node)
        print(json.dumps(result))
    finally:
        if node.proc and node.proc.poll() is None:
            node.stop()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
