#!/usr/bin/env python3
"""Where a broker's CPU goes, in counts per message that do not depend on the machine's load
(issue 37): per thread kind (threads grouped by name), CPU, voluntary and involuntary context
switches from /proc/PID/task/*/{stat,status}, and the syscalls that batching is meant to
amortise (futex wake-ups and waits, epoll waits, socket reads and writes, WAL writes and
syncs) from `perf stat --per-thread` (root, tracepoints).

    scripts/thread_profile.py --pid PID [--pid PID ...] [--messages N] -- CMD [ARGS...]

runs CMD (the load: PerfTest, `warren perf`), profiles the given processes while it runs, and
prints one line per thread kind: CPU us, context switches (voluntary + involuntary) and each
syscall, all per message. The message count is --messages, else PerfTest's "sending rate avg"
times its -z seconds read from CMD's output. Used by compare-quorum.py --profile, importable
(`Profile`) for the other comparison scripts.

Rates and CPU seconds on a shared 2-core machine move with the neighbours' load; counts per
message (wake-ups, switches, syscalls per message) move with what the broker does, so an A/B
of two builds compares them, interleaved, same setup.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict

TICKS = os.sysconf("SC_CLK_TCK")
# The syscalls whose count per message says how well the hot path batches.
SYSCALLS = ["futex", "epoll_wait", "epoll_pwait", "read", "recvfrom", "write", "writev",
            "sendto", "sendmsg", "pwrite64", "pwritev", "fdatasync", "fsync", "sched_yield",
            "io_uring_enter"]


def thread_kind(comm):
    """Threads named alike do the same work: tokio's workers, one kind per named thread."""
    return re.sub(r"[-_ ]?\d+$", "", comm.strip()) or comm


def snapshot(pids):
    """{(pid, tid): (kind, cpu_ticks, voluntary, involuntary)} of every live thread."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                status = open(f"/proc/{pid}/task/{tid}/status").read()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            vol = int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))
            invol = int(re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", status).group(1))
            out[(pid, tid)] = (thread_kind(comm), int(fields[11]) + int(fields[12]), vol, invol)
    return out


class Profile:
    """Profiles `pids` between __enter__ and __exit__; `rows(messages)` then says it per
    message."""

    def __init__(self, pids, syscalls=True):
        self.pids = list(pids)
        self.syscalls = syscalls and os.geteuid() == 0
        self.perf = None

    def __enter__(self):
        self.before = snapshot(self.pids)
        if self.syscalls and self.pids:
            self.out = tempfile.mktemp(suffix=".perfstat")
            events = ["context-switches", "cpu-migrations"] + [
                f"syscalls:sys_enter_{s}" for s in SYSCALLS]
            self.perf = subprocess.Popen(
                ["perf", "stat", "-x", ",", "--per-thread", "-o", self.out,
                 "-e", ",".join(events), "-p", ",".join(map(str, self.pids))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        self.after = snapshot(self.pids)
        self.counts = defaultdict(lambda: defaultdict(int))
        if self.perf:
            self.perf.send_signal(signal.SIGINT)
            self.perf.wait()
            for line in open(self.out):
                parts = line.strip().split(",")
                if len(parts) < 4 or not parts[1].strip().isdigit():
                    continue
                comm = parts[0].rsplit("-", 1)[0]
                event = parts[3].replace("syscalls:sys_enter_", "")
                self.counts[thread_kind(comm)][event] += int(parts[1])
            os.unlink(self.out)

    def rows(self, messages):
        """[(kind, {figure: per message})], busiest kind first, and a total row last."""
        by_kind = defaultdict(lambda: defaultdict(float))
        for key, (kind, cpu, vol, invol) in self.after.items():
            b = self.before.get(key, (kind, 0, 0, 0))
            k = by_kind[kind]
            k["threads"] += 1
            k["cpu_us"] += (cpu - b[1]) / TICKS * 1e6
            k["vcs"] += vol - b[2]
            k["ivcs"] += invol - b[3]
        for kind, events in self.counts.items():
            for event, n in events.items():
                if event not in ("context-switches",):
                    by_kind[kind][event] += n
        m = max(1, messages)
        rows = []
        total = defaultdict(float)
        for kind, k in by_kind.items():
            row = {f: (v if f == "threads" else v / m) for f, v in k.items()}
            for f, v in row.items():
                total[f] += v
            rows.append((kind, row))
        rows.sort(key=lambda r: -r[1].get("cpu_us", 0))
        rows.append(("TOTAL", dict(total)))
        return rows

    def table(self, messages, title=""):
        cols = ["threads", "cpu_us", "vcs", "ivcs", "cpu-migrations"] + SYSCALLS
        rows = self.rows(messages)
        shown = [c for c in cols if any(r.get(c) for _, r in rows)]
        lines = [f"{title}per message, {messages} messages "
                 "(vcs/ivcs: voluntary/involuntary context switches; syscalls by name)",
                 f"{'thread kind':22}" + "".join(f"{c[:10]:>11}" for c in shown)]
        for kind, r in rows:
            cells = "".join(
                f"{int(r.get(c, 0)):>11}" if c == "threads" else f"{r.get(c, 0):>11.3f}"
                for c in shown)
            lines.append(f"{kind[:22]:22}{cells}")
        return "\n".join(lines)


def perftest_messages(output):
    """Messages sent in a PerfTest or `warren perf` run, from its summary and -z."""
    rate = re.search(r"sending rate avg: (\d+) msg/s", output)
    secs = re.search(r"-z\s+(\d+)", " ".join(sys.argv))
    return int(rate.group(1)) * int(secs.group(1)) if rate and secs else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pid", type=int, action="append", required=True)
    p.add_argument("--messages", type=int)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    with Profile(args.pid) as prof:
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
    print("\n".join(out.strip().splitlines()[-6:]))
    print(prof.table(args.messages or perftest_messages(out)))


if __name__ == "__main__":
    main()
