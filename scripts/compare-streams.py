#!/usr/bin/env python3
"""Streams side by side (issue 36's Proof): warren and RabbitMQ 3.10 with its stream plugin on
this machine, each node started alike (in a session of its own, `setsid`), one broker at a time,
the same client for both (`warren perf stream` over the stream protocol, `warren perf` with
PerfTest's flags over AMQP 0-9-1):

  12b      1 stream, 1 producer, 1 consumer, 12-byte messages, confirms, one node
  1kb      the same with 1 KB messages
  cluster  the 12b and 1kb cases on a 3-node cluster, clients on the stream's leader node
  memory   a stream of --memory-bytes (1 KB messages) is filled, then --memory-consumers
           consumers read it from offsets spread evenly over it for --seconds: the broker's RSS
           when idle before, after the fill, and its peak and last value while they read

Each rate case prints, per broker and protocol: published, confirmed and consumed msg/s,
end-to-end and confirm latency p50/p99, the broker's CPU per message published (user+system
from /proc/PID/stat, summed over the nodes), then warren/RabbitMQ ratios; every line carries
the load average, since other work on the machine moves these figures. --json FILE writes them.

  scripts/compare-streams.py [--seconds 20] [--cases 12b,1kb,memory] [--protocols stream,amqp]
                             [--brokers warren,rabbitmq] [--memory-bytes 10gb]
                             [--memory-consumers 10] [--confirms 10000] [--json FILE]

Protocols: `stream` is RabbitMQ's stream protocol (warren's `--stream-listen`; skipped for warren,
with a message, while `warren server` has no such flag); `amqp` is streams over AMQP 0-9-1
(x-queue-type=stream, consumers with x-stream-offset and prefetch 1000, confirms). The cluster
case needs replicated streams on warren: until a 3-node warren cluster accepts
x-queue-type=stream, warren's part is skipped with a message and RabbitMQ's is still measured.

The memory case writes --memory-bytes to the disk once per broker and protocol (deleted with the
broker's data before the next one starts); warren held up to 2.3x that on disk right after the
fill, so the script refuses a size whose 2.5x would not leave 5 GB free.
Every port is picked free at start; nothing binds RabbitMQ's or warren's default ports.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RMQ = os.path.join(ROOT, "..", "shared", "rabbitmq", "rabbitmq.sh")
WARREN_BIN = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
TICKS = os.sysconf("SC_CLK_TCK")
DISK_MARGIN_BYTES = 5 * 10**9
# warren held 2.3x a 1 GB stream on disk right after the fill (the WAL and the segments, the
# WAL not yet reclaimed); RabbitMQ 1.0x. The memory case budgets for the larger.
DISK_BYTES_PER_STREAM_BYTE = 2.5
ALL_CASES = ["12b", "1kb", "cluster", "memory"]
SIZES = {"12b": 12, "1kb": 1024}
# Rate cases keep at most this much of each stream on disk (whole segments are dropped).
RATE_MAX_LENGTH = "2gb"
RATE_SEGMENT = "100mb"


def log(msg):
    print(f"[compare-streams] {msg}", file=sys.stderr, flush=True)


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_port(port, deadline_s=60):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {deadline_s}s")


def parse_bytes(s):
    m = re.fullmatch(r"(\d+)\s*(b|kb|mb|gb|tb)?", s.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size such as 10gb, got {s!r}")
    return int(m.group(1)) * {None: 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
                              "tb": 10**12}[m.group(2)]


def load_average():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def rss_bytes(pids):
    total = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


class Warren:
    name = "warren"

    def __init__(self):
        help_text = subprocess.run([WARREN_BIN, "server", "--help"], capture_output=True,
                                   text=True).stdout
        self.speaks_stream = "--stream-listen" in help_text
        self.procs, self.dirs = [], []
        self.cluster_env = None
        self.stream_uri = None

    def start(self, nodes=1):
        if nodes != 1:
            return self.start_cluster(nodes)
        amqp, stream = free_ports(2)
        data = tempfile.mkdtemp(prefix="compare-streams-warren-")
        cmd = [WARREN_BIN, "server", "--listen", f"127.0.0.1:{amqp}", "--data-dir", data,
               "--management-listen", "none"]
        if self.speaks_stream:
            cmd += ["--stream-listen", f"127.0.0.1:{stream}"]
        log_file = open(os.path.join(data, "log"), "w")
        # In a session of its own, as rabbitmq.sh starts RabbitMQ (issue 37).
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs, self.dirs = [proc], [data]
        wait_port(amqp)
        if self.speaks_stream:
            wait_port(stream)
        self.amqp_uri = f"amqp://guest:guest@127.0.0.1:{amqp}/%2f"
        self.stream_uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{stream}/%2f"

    def start_cluster(self, nodes):
        """scripts/cluster.sh's nodes (each in its own session), every port moved by an offset
        that finds them free; skipped while its clusters refuse streams."""
        for _ in range(20):
            offset = 1000 * (10 + int.from_bytes(os.urandom(1), "big") % 30)
            ports = [base + offset + i for base in (5672, 15672, 25672) for i in range(nodes)]
            if all(port_free(p) for p in ports):
                break
        else:
            raise RuntimeError("no free port range for a warren cluster")
        data = tempfile.mkdtemp(prefix="compare-streams-warren-cluster-")
        self.cluster_env = dict(os.environ, WARREN_CLUSTER_DIR=data,
                                WARREN_CLUSTER_PORT_OFFSET=str(offset), WARREN_BIN=WARREN_BIN)
        self.dirs = [data]
        subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "start", str(nodes)],
                       env=self.cluster_env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        self.cluster_pids = [int(open(os.path.join(data, f"n{i}.pid")).read())
                             for i in range(1, nodes + 1)]
        self.amqp_uri = f"amqp://guest:guest@127.0.0.1:{5672 + offset}/%2f"
        # scripts/cluster.sh gives its nodes no stream listener yet.
        self.stream_uri = None
        for i in range(nodes):
            wait_port(5672 + offset + i)
        probe = subprocess.run(
            [WARREN_BIN, "perf", "-h", self.amqp_uri, "-u", "compare-streams-probe",
             "--exchange=", "-f", "persistent", "-ad", "false", "-qa", "x-queue-type=stream",
             "-x", "1", "-y", "0", "-C", "1", "-c", "1", "--quiet"],
            capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            why = (probe.stdout + probe.stderr).strip().splitlines()[-1:]
            self.stop()
            if "406" not in " ".join(why):
                raise RuntimeError(f"probing the warren cluster for streams: {why}")
            raise Skip(f"this build's clusters do not serve streams yet ({' '.join(why)}); "
                       f"skipped until branch stream-cluster lands")

    def pids(self):
        return self.cluster_pids if self.cluster_env else [p.pid for p in self.procs]

    def data_bytes(self):
        return sum(dir_bytes(d) for d in self.dirs)

    def stop(self):
        if self.cluster_env:
            subprocess.run([os.path.join(ROOT, "scripts", "cluster.sh"), "stop"],
                           env=self.cluster_env, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            self.cluster_env = None
        for p in self.procs:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.procs, self.dirs = [], []


class RabbitMQ:
    name = "rabbitmq"
    speaks_stream = True

    def __init__(self):
        self.state = None

    def start(self, nodes=1):
        amqp, dist, epmd, stream = free_ports(4)
        # Consecutive ports from each first one: take the first ones far enough apart.
        self.state = tempfile.mkdtemp(prefix="compare-streams-rmq-")
        self.env = dict(os.environ, RMQ_STATE=self.state, RMQ_PORT=str(amqp),
                        RMQ_DIST_PORT=str(dist), RMQ_EPMD_PORT=str(epmd),
                        RMQ_STREAM_PORT=str(stream), RMQ_PLUGINS="rabbitmq_stream",
                        RMQ_NAME=f"cmpstr{amqp}")
        subprocess.run([RMQ, "start", str(nodes)], env=self.env, check=True,
                       stdout=subprocess.DEVNULL)
        self.nodes = nodes
        self.amqp_uri = f"amqp://guest:guest@127.0.0.1:{amqp}/%2f"
        self.stream_uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{stream}/%2f"
        wait_port(stream)

    def pids(self):
        return [int(open(os.path.join(self.state, f"rabbit{i}.pid")).read().strip())
                for i in range(1, self.nodes + 1)]

    def data_bytes(self):
        return dir_bytes(os.path.join(self.state, "data"))

    def stop(self):
        if self.state:
            subprocess.run([RMQ, "stop"], env=self.env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            shutil.rmtree(self.state, ignore_errors=True)
            self.state = None


class Skip(Exception):
    pass


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def perf(args, json_path):
    """Runs `warren perf ARGS --json json_path` and returns the JSON; the output's last lines
    go to the log."""
    out = subprocess.run([WARREN_BIN, "perf", *args, "--json", json_path], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"warren perf {' '.join(args)} failed: "
                           f"{(out.stdout + out.stderr).strip()[-2000:]}")
    return json.load(open(json_path))


def rate_case(broker, protocol, size, seconds, confirms, name, tmp):
    """One producer and one consumer on one stream; the broker's CPU over the run."""
    json_path = os.path.join(tmp, f"{name}.json")
    if protocol == "stream":
        args = ["stream", "--uris", broker.stream_uri, "--streams", name, "-x", "1", "-y", "1",
                "-s", str(size), "-c", str(confirms), "-z", str(seconds), "--offset", "first",
                "--max-length-bytes", RATE_MAX_LENGTH,
                "--stream-max-segment-size-bytes", RATE_SEGMENT, "--delete-streams", "--quiet"]
    else:
        args = ["-h", broker.amqp_uri, "-u", name, "--exchange=", "-x", "1", "-y", "1",
                "-s", str(size), "-c", str(confirms), "-q", "1000", "-z", str(seconds),
                "-f", "persistent", "-ad", "false",
                "-qa", f"x-queue-type=stream,x-max-length-bytes={parse_bytes(RATE_MAX_LENGTH)},"
                       f"x-stream-max-segment-size-bytes={parse_bytes(RATE_SEGMENT)}",
                "-ca", "x-stream-offset=first", "--quiet"]
    load = load_average()
    t0 = cpu_ticks(broker.pids())
    r = perf(args, json_path)
    cpu_s = (cpu_ticks(broker.pids()) - t0) / TICKS
    if protocol == "stream":
        published, rates = r["published"], (r["published_rate_avg"], r["confirmed_rate_avg"],
                                            r["consumed_rate_avg"])
    else:
        published, rates = r["totals"]["sent"], (r["send_rate_avg"], r["confirm_rate_avg"],
                                                 r["receive_rate_avg"])
    return {
        "published_rate": rates[0], "confirmed_rate": rates[1], "consumed_rate": rates[2],
        "latency_us_p50": r["latency_us"]["p50"], "latency_us_p99": r["latency_us"]["p99"],
        "confirm_latency_us_p50": r["confirm_latency_us"]["p50"],
        "confirm_latency_us_p99": r["confirm_latency_us"]["p99"],
        "broker_cpu_s": cpu_s, "cpu_us_per_msg": cpu_s * 1e6 / max(published, 1),
        "load_before": load, "load_after": load_average(),
    }


def memory_case(broker, protocol, total_bytes, consumers, seconds, confirms, tmp):
    """Fills one stream with total_bytes of 1 KB messages, then reads it with consumers spread
    over its offsets, sampling the broker's RSS every second."""
    name = "memory"
    size = 1024
    messages = total_bytes // size
    pids = broker.pids()
    out = {"stream_bytes": total_bytes, "messages": messages, "consumers": consumers,
           "rss_idle_bytes": rss_bytes(pids), "load_before": load_average()}
    max_length = str(total_bytes * 2)
    fill_json = os.path.join(tmp, "fill.json")
    t = time.monotonic()
    if protocol == "stream":
        perf(["stream", "--uris", broker.stream_uri, "--streams", name, "-x", "1", "-y", "0",
              "-s", str(size), "-c", str(confirms), "-C", str(messages),
              "--max-length-bytes", max_length, "--quiet"], fill_json)
    else:
        perf(["-h", broker.amqp_uri, "-u", name, "--exchange=", "-x", "1", "-y", "0",
              "-s", str(size), "-c", str(confirms), "-C", str(messages), "-f", "persistent",
              "-ad", "false", "-qa", f"x-queue-type=stream,x-max-length-bytes={max_length}",
              "--quiet"], fill_json)
    out["fill_s"] = time.monotonic() - t
    time.sleep(2)
    out["rss_after_fill_bytes"] = rss_bytes(pids)
    out["disk_bytes"] = broker.data_bytes()
    procs = []
    for i in range(consumers):
        offset = messages * i // consumers
        jp = os.path.join(tmp, f"consumer-{i}.json")
        if protocol == "stream":
            args = ["stream", "--uris", broker.stream_uri, "--streams", name, "-x", "0",
                    "-y", "1", "-p", "--offset", str(offset), "-z", str(seconds), "--quiet"]
        else:
            args = ["-h", broker.amqp_uri, "-u", name, "--exchange=", "-x", "0", "-y", "1",
                    "-p", "-q", "1000", "-ca", f"x-stream-offset={offset}", "-z", str(seconds),
                    "--quiet"]
        procs.append(subprocess.Popen([WARREN_BIN, "perf", *args, "--json", jp],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    samples = []
    while any(p.poll() is None for p in procs):
        samples.append(rss_bytes(pids))
        time.sleep(1)
    consumed = 0
    for i, p in enumerate(procs):
        if p.returncode != 0:
            raise RuntimeError(f"memory consumer {i} failed: {p.stderr.read()[-1000:]}")
        r = json.load(open(os.path.join(tmp, f"consumer-{i}.json")))
        consumed += r["consumed"] if protocol == "stream" else r["totals"]["received"]
    out.update({"rss_peak_bytes": max(samples or [0]), "rss_last_bytes": (samples or [0])[-1],
                "consumed": consumed, "consumed_rate": consumed / seconds,
                "load_after": load_average()})
    return out


def fmt_rate(c):
    return (f"published {c['published_rate']:,.0f} confirmed {c['confirmed_rate']:,.0f} "
            f"consumed {c['consumed_rate']:,.0f} msg/s, latency p50/p99 "
            f"{c['latency_us_p50']}/{c['latency_us_p99']} us, confirm p50/p99 "
            f"{c['confirm_latency_us_p50']}/{c['confirm_latency_us_p99']} us, broker CPU "
            f"{c['cpu_us_per_msg']:.2f} us/msg, load {c['load_before']} -> {c['load_after']}")


def fmt_memory(c):
    mib = 1 << 20
    return (f"{c['stream_bytes'] / 1e9:.1f} GB stream ({c['messages']:,} msgs, filled in "
            f"{c['fill_s']:.0f} s, {c['disk_bytes'] / 1e9:.1f} GB on disk), RSS idle "
            f"{c['rss_idle_bytes'] / mib:.0f} MiB, after fill {c['rss_after_fill_bytes'] / mib:.0f}"
            f" MiB, {c['consumers']} consumers: peak {c['rss_peak_bytes'] / mib:.0f} MiB, last "
            f"{c['rss_last_bytes'] / mib:.0f} MiB, consumed {c['consumed_rate']:,.0f} msg/s, "
            f"load {c['load_before']} -> {c['load_after']}")


def run_case(a, broker, bname, protocol, case, nodes, tmp, results):
    label = f"{bname} {protocol} {case}{' 3 nodes' if nodes > 1 else ''}"
    if protocol == "stream" and broker.stream_uri is None:
        print(f"{label}: skipped, scripts/cluster.sh starts no stream listener yet")
        return
    try:
        if case == "memory":
            r = memory_case(broker, protocol, a.memory_bytes, a.memory_consumers, a.seconds,
                            a.confirms, tmp)
            line = fmt_memory(r)
        else:
            r = rate_case(broker, protocol, SIZES[case], a.seconds, a.confirms,
                          f"cs-{protocol}-{case}-{nodes}", tmp)
            line = fmt_rate(r)
    except RuntimeError as e:
        print(f"{label}: FAILED {e}", flush=True)
        results["results"].append({"broker": bname, "protocol": protocol, "case": case,
                                   "nodes": nodes, "error": str(e)})
        return
    print(f"{label}: {line}", flush=True)
    r.update({"broker": bname, "protocol": protocol, "case": case, "nodes": nodes})
    results["results"].append(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--cases", default="12b,1kb,memory")
    ap.add_argument("--protocols", default="stream,amqp")
    ap.add_argument("--brokers", default="warren,rabbitmq")
    ap.add_argument("--memory-bytes", type=parse_bytes, default=parse_bytes("10gb"))
    ap.add_argument("--memory-consumers", type=int, default=10)
    ap.add_argument("--confirms", type=int, default=10000)
    ap.add_argument("--json")
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    for c in cases:
        if c not in ALL_CASES:
            ap.error(f"unknown case {c!r}: choose from {','.join(ALL_CASES)}")
    protocols = [p for p in a.protocols.split(",") if p]
    if any(p not in ("stream", "amqp") for p in protocols):
        ap.error("--protocols takes stream and/or amqp")
    if "memory" in cases:
        free = shutil.disk_usage(tempfile.gettempdir()).free
        if a.memory_bytes * DISK_BYTES_PER_STREAM_BYTE + DISK_MARGIN_BYTES > free:
            ap.error(f"--memory-bytes {a.memory_bytes / 1e9:.1f} GB does not fit: it may take "
                     f"{DISK_BYTES_PER_STREAM_BYTE}x on disk, {free / 1e9:.1f} GB are free and "
                     f"{DISK_MARGIN_BYTES / 1e9:.0f} GB are kept free")
    if not os.path.exists(WARREN_BIN):
        ap.error(f"{WARREN_BIN} is missing: cargo build --release -p warren")
    brokers = {"warren": Warren, "rabbitmq": RabbitMQ}
    results = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "cpus": os.cpu_count(), "seconds": a.seconds, "results": []}
    print(f"streams side by side, {a.seconds} s per case, load before {load_average()}, "
          f"each broker node in a session of its own (setsid)")
    for bname in [b for b in a.brokers.split(",") if b]:
        broker = brokers[bname]()
        # A fresh broker per protocol and node count: one's streams (and their disk) are gone
        # before the next is measured.
        for protocol in protocols:
            if protocol == "stream" and not broker.speaks_stream:
                print(f"{bname} stream protocol: skipped, `warren server` has no "
                      f"--stream-listen in this build (branch stream-proto)")
                continue
            for nodes, node_cases in ((1, [c for c in cases if c != "cluster"]),
                                      (3, ["12b", "1kb"] if "cluster" in cases else [])):
                if not node_cases:
                    continue
                try:
                    broker.start(nodes)
                except Skip as e:
                    print(f"{bname} {protocol} {nodes} nodes: {e}")
                    continue
                except (RuntimeError, subprocess.CalledProcessError) as e:
                    print(f"{bname} {protocol} {nodes} nodes: FAILED to start: {e}")
                    broker.stop()
                    continue
                tmp = tempfile.mkdtemp(prefix="compare-streams-")
                try:
                    for case in node_cases:
                        run_case(a, broker, bname, protocol, case, nodes, tmp, results)
                finally:
                    broker.stop()
                    shutil.rmtree(tmp, ignore_errors=True)
    by = {(r["broker"], r["protocol"], r["case"], r["nodes"]): r for r in results["results"]
          if "error" not in r}
    for (b, p, c, n), w in sorted(by.items()):
        rq = by.get(("rabbitmq", p, c, n))
        if b != "warren" or rq is None:
            continue
        if c == "memory":
            print(f"ratio {p} memory: RSS peak warren/rabbitmq = "
                  f"{w['rss_peak_bytes'] / rq['rss_peak_bytes']:.2f}")
        else:
            print(f"ratio {p} {c}{' 3 nodes' if n > 1 else ''}: published warren/rabbitmq = "
                  f"{w['published_rate'] / rq['published_rate']:.2f}x, consumed "
                  f"{w['consumed_rate'] / max(rq['consumed_rate'], 1):.2f}x, CPU per message "
                  f"{w['cpu_us_per_msg'] / rq['cpu_us_per_msg']:.3f}x, confirm p99 "
                  f"{w['confirm_latency_us_p99'] / max(rq['confirm_latency_us_p99'], 1):.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
