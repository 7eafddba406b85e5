#!/usr/bin/env python3
"""A rolling restart of a 3-node cluster under load, with nothing confirmed lost, and the longest
pause in confirms while each node is away.

    scripts/rolling-restart.py [--broker warren|rabbitmq] [--no-drain] [--from-binary OLD]
                               [--settle-s 10] [--seed N]

Load: on every node a publisher with confirms (persistent, mandatory) to a quorum queue and to a
classic queue hosted on its own node, and a consumer with manual acks on each queue; clients that
lose their node reconnect to the next one. Then, node after node: (drain,) stop, restart, (revive),
wait until the cluster has every node again. At the end every confirmed message must have been
consumed (at least once).

--broker warren (default, root): three warren nodes in network namespaces found by name
  (tests/interop/python/netns_cluster.py); each node comes back on a new address under its name.
  `warren ctl drain` before the stop and `revive` after, unless --no-drain (SIGTERM only).
  --from-binary OLD: the cluster starts on OLD (a build of an older commit, configured by IP
  address as older builds are) and each node comes back on this build: a rolling upgrade. OLD has
  no drain, so the old nodes are stopped with SIGTERM alone.
--broker rabbitmq: RabbitMQ 3.10's 3-node cluster from ../shared/rabbitmq/rabbitmq.sh on
  127.0.0.1:5680-5682; each node `rabbitmq-upgrade drain`, `stop_app`, `start_app`, `revive`.

Prints one line per restarted node: the longest gap between two confirms of the publishers, for
the quorum queue and the classic ones, and the totals. Exit status 1 if a confirmed message was
lost.
"""

import argparse
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "interop", "python"))

import pika  # noqa: E402

QQ = "rolling-qq"


class Endpoint:
    """How the load reaches one node, and how the script restarts it."""

    def __init__(self, name, connect, restart):
        self.name = name
        self.connect = connect
        self.restart = restart


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.confirmed = set()
        self.received = set()
        # (publisher, queue kind) -> confirm times
        self.confirm_times = {}
        self.reconnects = 0
        self.nacked = 0

    def confirm(self, key, msg_id):
        now = time.monotonic()
        with self.lock:
            self.confirmed.add(msg_id)
            self.confirm_times.setdefault(key, []).append(now)


def publisher(index, endpoints, stats, stop):
    seq = 0
    name = endpoints[index].name
    target = index
    while not stop.is_set():
        ep = endpoints[target % len(endpoints)]
        try:
            conn = ep.connect()
        except Exception:  # noqa: BLE001 - the node is away: the next one
            target += 1
            time.sleep(0.1)
            continue
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            classic = f"rolling-classic-{name}"
            while not stop.is_set():
                for kind, queue in (("quorum", QQ), ("classic", classic)):
                    seq += 1
                    msg_id = f"{name}-{seq}"
                    try:
                        ch.basic_publish("", queue, msg_id.encode(),
                                         pika.BasicProperties(delivery_mode=2), mandatory=True)
                    except (pika.exceptions.UnroutableError, pika.exceptions.NackError):
                        with stats.lock:
                            stats.nacked += 1
                        continue
                    stats.confirm((name, kind), msg_id)
        except Exception:  # noqa: BLE001 - connection lost: reconnect elsewhere
            with stats.lock:
                stats.reconnects += 1
            target += 1
        finally:
            try:
                if conn.is_open:
                    conn.close()
            except Exception:  # noqa: BLE001
                pass


def consumer(index, endpoints, queue_of, stats, stop):
    target = index
    while not stop.is_set():
        ep = endpoints[target % len(endpoints)]
        try:
            conn = ep.connect()
            ch = conn.channel()
            ch.basic_qos(prefetch_count=200)

            def on_message(ch, method, _props, body):
                with stats.lock:
                    stats.received.add(body.decode())
                ch.basic_ack(method.delivery_tag)

            for q in queue_of(index):
                ch.basic_consume(q, on_message)
            while not stop.is_set():
                conn.process_data_events(time_limit=0.2)
            conn.close()
        except Exception:  # noqa: BLE001 - node away: the next one
            target += 1
            time.sleep(0.1)


def longest_gap(times, start, end):
    inside = [t for t in times if start <= t <= end]
    before = [t for t in times if t < start]
    after = [t for t in times if t > end]
    points = before[-1:] + inside + after[:1]
    if len(points) < 2:
        return end - start
    return max(b - a for a, b in zip(points, points[1:]))


def warren_cluster(args):
    import netns_cluster
    from netns_cluster import NetnsCluster

    ok, why = netns_cluster.available()
    if not ok:
        sys.exit(f"cannot run: {why}")
    new_bin = netns_cluster.WARREN_BIN
    upgrade = args.from_binary is not None
    c = NetnsCluster(3, named=not upgrade)
    if upgrade:
        for n in c.nodes:
            n.binary = os.path.abspath(args.from_binary)
    c.start()

    def ctl(node, *words):
        r = subprocess.run(["ip", "netns", "exec", node.ns, new_bin, "ctl", *words],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"warren ctl {' '.join(words)} on {node.name}: {r.stdout}{r.stderr}")

    def restart(i):
        node = c.nodes[i]
        old = upgrade and getattr(node, "binary", new_bin) != new_bin
        if args.drain and not old:
            ctl(node, "drain")
        node.stop()
        node.readdress(40 + 10 * (args.round) + i)
        node.binary = new_bin
        node.start(wait=False)
        netns_cluster.eventually(lambda: node.api("/api/overview"), f"{node.name} back", 120)
        if args.drain:
            netns_cluster.eventually(lambda: ctl(node, "revive") or True, "revive", 60)
        c.wait_formed(deadline_s=120)
        # The UI's node table from the node just restarted: in an upgrade it asks nodes of
        # both builds (the older ones must not be sent what they cannot read).
        listed = node.api("/api/nodes")
        assert len(listed) == 3 and all(n["running"] for n in listed), listed

    endpoints = [Endpoint(n.name, n.connection, lambda i=i: restart(i))
                 for i, n in enumerate(c.nodes)]
    return c, endpoints


def rabbitmq_cluster(args):
    sh = os.path.join(ROOT, "..", "shared", "rabbitmq", "rabbitmq.sh")
    subprocess.run([sh, "start", "3"], check=True)

    def tool(i, *words):
        subprocess.run([sh, "tool", str(i + 1), *words], check=True, capture_output=True)

    def ctl(i, *words):
        subprocess.run([sh, "ctl", str(i + 1), *words], check=True, capture_output=True)

    def restart(i):
        if args.drain:
            tool(i, "rabbitmq-upgrade", "drain")
        ctl(i, "stop_app")
        ctl(i, "start_app")
        if args.drain:
            tool(i, "rabbitmq-upgrade", "revive")
        ctl(i, "await_online_nodes", "3")

    def connect(i):
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", 5680 + i, socket_timeout=5, blocked_connection_timeout=10,
            connection_attempts=1))

    class Stopper:
        def close(self):
            subprocess.run([sh, "stop"], check=False)

    endpoints = [Endpoint(f"rmq{i + 1}", lambda i=i: connect(i), lambda i=i: restart(i))
                 for i in range(3)]
    return Stopper(), endpoints


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--broker", choices=["warren", "rabbitmq"], default="warren")
    p.add_argument("--no-drain", dest="drain", action="store_false")
    p.add_argument("--from-binary", help="start on this older warren build: a rolling upgrade")
    p.add_argument("--settle-s", type=float, default=10.0,
                   help="load before the first restart and between restarts")
    args = p.parse_args()
    args.round = 0
    cluster, endpoints = (warren_cluster if args.broker == "warren" else rabbitmq_cluster)(args)
    try:
        conn = endpoints[0].connect()
        ch = conn.channel()
        ch.queue_declare(QQ, durable=True, arguments={"x-queue-type": "quorum"})
        conn.close()
        for ep in endpoints:
            conn = ep.connect()
            conn.channel().queue_declare(f"rolling-classic-{ep.name}", durable=True)
            conn.close()
        stats = Stats()
        stop = threading.Event()
        threads = [threading.Thread(target=publisher, args=(i, endpoints, stats, stop), daemon=True)
                   for i in range(len(endpoints))]
        names = [ep.name for ep in endpoints]
        threads += [threading.Thread(
            target=consumer,
            args=(i, endpoints, lambda i: [QQ] if i == 0 else [], stats, stop), daemon=True)
            for i in range(len(endpoints))]
        threads += [threading.Thread(
            target=consumer,
            args=(i, endpoints, lambda i: [f"rolling-classic-{n}" for n in names], stats, stop),
            daemon=True) for i in range(1)]
        for t in threads:
            t.start()
        time.sleep(args.settle_s)
        windows = []
        for i, ep in enumerate(endpoints):
            start = time.monotonic()
            ep.restart()
            end = time.monotonic()
            windows.append((ep.name, start, end))
            time.sleep(args.settle_s)
        stop.set()
        for t in threads[:len(endpoints)]:
            t.join(timeout=30)
        # The consumers go on until every confirmed message arrived (or a minute passed).
        with stats.lock:
            confirmed = set(stats.confirmed)
        deadline = time.monotonic() + 60
        stop_consumers = threading.Event()
        late = [threading.Thread(target=consumer,
                                 args=(0, endpoints,
                                       lambda i: [QQ] + [f"rolling-classic-{n}" for n in names],
                                       stats, stop_consumers), daemon=True)]
        for t in late:
            t.start()
        while time.monotonic() < deadline:
            with stats.lock:
                if confirmed <= stats.received:
                    break
            time.sleep(0.5)
        stop_consumers.set()
        with stats.lock:
            missing = confirmed - stats.received
            times = dict(stats.confirm_times)
            reconnects, nacked = stats.reconnects, stats.nacked
        mode = ("upgrade from " + args.from_binary if args.from_binary else "restart")
        print(f"{args.broker} rolling {mode}, drain={'yes' if args.drain else 'no'}")
        for name, start, end in windows:
            gaps = {kind: max((longest_gap(t, start, end) for (pub, k), t in times.items()
                               if k == kind), default=float("nan"))
                    for kind in ("quorum", "classic")}
            print(f"  {name}: away {end - start:.1f} s; longest pause in confirms: quorum "
                  f"{gaps['quorum'] * 1000:.0f} ms, classic {gaps['classic'] * 1000:.0f} ms")
        print(f"  confirmed {len(confirmed)}, consumed {len(stats.received)}, lost {len(missing)}, "
              f"nacked or returned {nacked}, reconnects {reconnects}")
        if missing:
            print(f"  LOST: {sorted(missing)[:20]}")
            return 1
        return 0
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
