#!/usr/bin/env python3
"""Reproduces a lost confirmed message found by queue_jepsen.py (fixed on main by c426af0; kept as a
regression check): a node that restarted accepted its
cluster links (Cluster::start) before it installs the handler for other nodes' data
(remote::install, in serve(), after the metadata replay and recover_messages). A forwarded
publish that arrives in that window is dropped (Messaging::receive returns when no handler is
set), and the next forward of the same epoch that the node does take is answered with
Published{upto}, which the publisher's node reads as "every seq up to here is durable": the
dropped message is confirmed to its publisher and stored nowhere.

Steps: a 3-node netns cluster; queue `q` declared through n1 (lives on n1) and a backlog queue
on n1 filled with BACKLOG persistent messages (so that n1's recover_messages takes a while and
the window is wide); a confirming publisher on n2 publishing to `q` without pause; kill -9 n1,
restart it at once; keep publishing until confirms flow again; then read `q` to the end and
compare with the confirmed ids.

  sudo .venv/bin/python scripts/repro-forward-during-startup.py [--backlog 1000000] [--rounds 8]

Exits 1 (and prints the missing ids) when a confirmed message is missing.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "interop", "python"))
import netns_cluster  # noqa: E402
import queue_jepsen  # noqa: E402
from netns_cluster import NetnsCluster, eventually  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backlog", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=8, help="kill/restart rounds")
    args = p.parse_args()
    ok, why = netns_cluster.available()
    if not ok:
        sys.exit(f"cannot run: {why}")
    with NetnsCluster(3) as c:
        c.start()
        n1, n2 = c.nodes[0], c.nodes[1]
        conn = n1.connection()
        conn.channel().queue_declare("q", durable=True)
        conn.close()
        if args.backlog:
            subprocess.run(
                ["ip", "netns", "exec", n1.ns, netns_cluster.WARREN_BIN, "perf", "-h",
                 "amqp://guest:guest@127.0.0.1:5672", "-x", "1", "-y", "0", "-u", "backlog",
                 "--auto-delete", "false", "-s", "100", "-f", "persistent", "-c", "1000",
                 "-C", str(args.backlog)], check=True, capture_output=True, timeout=600)
        print(f"backlog of {args.backlog} on n1; queues: "
              f"{[(q['name'], q['node'], q.get('messages')) for q in n1.api('/api/queues')]}")
        ledger = queue_jepsen.Ledger()
        # The publisher's home is n2 (index 1); it sometimes reconnects elsewhere, which is fine.
        pub = queue_jepsen.Publisher(c, ledger, 1, ["q"], 7, rate=2000, window=200)
        pub.start()
        eventually(lambda: len(ledger.confirmed) > 1000, "confirms flow")
        for r in range(args.rounds):
            before = len(ledger.confirmed)
            n1.kill()
            time.sleep(0.3)
            n1.start(wait=False)
            started = time.monotonic()
            eventually(lambda: n1.api("/api/overview", timeout=2), "n1 serves its API", 120)
            eventually(lambda: len(ledger.confirmed) > before + 2000, "confirms flow again", 120)
            print(f"round {r + 1}: n1 back after {time.monotonic() - started:.1f} s, "
                  f"{len(ledger.confirmed)} confirmed")
        pub.stopping.set()
        pub.join(60)
        got = set()
        conn = n2.connection()
        ch = conn.channel()
        while True:
            method, props, body = ch.basic_get("q", auto_ack=True)
            if method is None:
                break
            got.add(queue_jepsen.text(props.headers[queue_jepsen.ID_HEADER]))
        conn.close()
        with ledger.lock:
            confirmed = set(ledger.confirmed) - ledger.returned
        lost = sorted(confirmed - got, key=lambda m: ledger.published[m][3])
        print(f"published {len(ledger.published)}, confirmed {len(confirmed)}, "
              f"nacked {len(ledger.nacked)}, in q {len(got)}, lost {len(lost)}")
        for m in lost[:20]:
            q, _, via, sent = ledger.published[m]
            print(f"  lost {m}: through {via}, sent {ledger.wall(sent)}, confirmed "
                  f"{ledger.wall(ledger.confirmed[m])}")
        with open(n1.log_path, errors="replace") as f:
            tail = [line for line in f.read().splitlines()[-400:]
                    if any(w in line for w in ("warren started", "cluster link up", "recovered",
                                               "management API started", "replayed"))]
        print("n1's last start:\n  " + "\n  ".join(tail[-6:]))
        with open(n2.log_path, errors="replace") as f:
            tail = [line for line in f.read().splitlines()[-200:] if "peer=1" in line]
        print("n2's link to n1:\n  " + "\n  ".join(tail[-4:]))
        if lost:
            keep = c.dir + "-kept"
            os.system(f"cp -r {c.dir} {keep} 2>/dev/null")
            print(f"node logs kept in {keep}")
            sys.exit(1)


if __name__ == "__main__":
    main()
