#!/usr/bin/env python3
"""A well-behaved PerfTest client beside hostile ones (issue 14): the official PerfTest's rate
against one warren node undisturbed, then while the clients of
tests/interop/python/test_hostile_clients.py misbehave (a thousand idle sockets, half protocol
headers, half frames, a slow loris sending a frame byte by byte throughout, every channel up to
channel-max open, a consumer that never reads its socket and a publisher that never reads its
confirms), alternating, and the ratio. The issue asks for at least 0.8x.

    scripts/hostile-perftest.py [--seconds 15] [--rounds 2] [PerfTest flags...]

Default PerfTest flags: 1 KB persistent messages, one producer with confirms (-c 1000) and one
consumer acking (-q 1000). Run from the repo root with the interop venv (.venv/bin/python) and a
release build ($WARREN_BIN, default target/release/warren). Prints each run and the median
ratio; nothing here is a test verdict (the rate depends on the machine).
"""

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "interop", "python"))
import amqp_raw as amqp  # noqa: E402

RMQ = os.path.join(ROOT, "..", "shared", "rabbitmq", "rabbitmq.sh")
WARREN_BIN = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
DEFAULT_FLAGS = ["-x", "1", "-y", "1", "-s", "1024", "-f", "persistent", "-c", "1000",
                 "-q", "1000"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline_s=30):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) >> 10
    return 0


def perftest(port, seconds, flags):
    out = subprocess.run([RMQ, "perftest", "-h", f"amqp://guest:guest@127.0.0.1:{port}",
                          "-z", str(seconds)] + flags, capture_output=True, text=True).stdout
    sent = re.search(r"sending rate avg: (\d+) msg/s", out)
    recv = re.search(r"receiving rate avg: (\d+) msg/s", out)
    if not sent:
        raise SystemExit(f"PerfTest printed no summary:\n{out[-2000:]}")
    return int(sent.group(1)), int(recv.group(1)) if recv else 0


class Hostiles:
    """The test's misbehaving clients, kept open; the loris trickles its frame on a thread."""

    def __init__(self, port):
        self.port = port
        self.sockets = []
        self.conns = []
        self.stop = threading.Event()

    def start(self):
        port = self.port
        for _ in range(1000):
            self.sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(amqp.PROTOCOL_HEADER[:4])
            self.sockets.append(s)
        for _ in range(20):
            c = self.open()
            c.send(bytes([1, 0, 1, 0, 0, 0, 100]) + b"\x00" * 10)
        flood = self.open(channel=False)
        channel_max = flood.negotiated[0]
        flood.send(b"".join(amqp.method_frame(n, amqp.CHANNEL_OPEN, amqp.channel_open_args())
                            for n in range(1, channel_max + 1)))
        for _ in range(channel_max):
            flood.expect_method(amqp.CHANNEL_OPEN_OK, timeout=30)
        stuck = self.open()
        self.declare(stuck, "hostile.stuck")
        stuck.send(amqp.method_frame(1, amqp.BASIC_CONSUME,
                                     amqp.basic_consume_args("hostile.stuck", no_ack=True)))
        stuck.expect_method(amqp.BASIC_CONSUME_OK)
        deaf = self.open()
        self.declare(deaf, "hostile.deaf")
        deaf.send(amqp.method_frame(1, amqp.CONFIRM_SELECT, b"\x00"))
        deaf.expect_method(amqp.CONFIRM_SELECT_OK)
        for queue, count, size, conn in (("hostile.stuck", 5000, 10_000, deaf),
                                         ("hostile.deaf", 20_000, 1000, deaf)):
            one = (amqp.method_frame(1, amqp.BASIC_PUBLISH, amqp.basic_publish_args("", queue))
                   + amqp.header_frame(1, size) + amqp.body_frame(1, b"h" * size))
            for _ in range(count // 1000):
                conn.send(one * 1000)
        loris = self.open()
        frame_max = loris.negotiated[1]
        loris.send(amqp.method_frame(1, amqp.BASIC_PUBLISH,
                                     amqp.basic_publish_args("", "hostile.loris")))
        loris.send(amqp.header_frame(1, frame_max - 8))
        body = amqp.body_frame(1, b"x" * (frame_max - 8))

        def trickle():
            for b in body[:-1]:
                if self.stop.wait(0.01):
                    return
                loris.send(bytes([b]))
        threading.Thread(target=trickle, daemon=True).start()

    def open(self, channel=True):
        c = amqp.RawConnection("127.0.0.1", self.port).open()
        if channel:
            c.open_channel()
        self.conns.append(c)
        return c

    @staticmethod
    def declare(conn, queue):
        conn.send(amqp.method_frame(1, amqp.QUEUE_DECLARE, amqp.queue_declare_args(queue)))
        conn.expect_method(amqp.QUEUE_DECLARE_OK)

    def close(self):
        self.stop.set()
        for s in self.sockets:
            s.close()
        for c in self.conns:
            c.close()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--rounds", type=int, default=2)
    args, flags = p.parse_known_args()
    flags = flags or DEFAULT_FLAGS
    work = tempfile.mkdtemp(prefix="warren-hostile-")
    port, http = free_port(), free_port()
    node = subprocess.Popen([WARREN_BIN, "server", "--listen", f"127.0.0.1:{port}",
                             "--management-listen", f"127.0.0.1:{http}",
                             "--data-dir", os.path.join(work, "data")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    ratios = []
    try:
        wait_port(port)
        for r in range(1, args.rounds + 1):
            calm = perftest(port, args.seconds, flags)
            print(f"round {r} undisturbed: sent {calm[0]} msg/s, received {calm[1]} msg/s, "
                  f"RSS {rss_mib(node.pid)} MiB", flush=True)
            hostiles = Hostiles(port)
            hostiles.start()
            try:
                rough = perftest(port, args.seconds, flags)
                print(f"round {r} hostile:     sent {rough[0]} msg/s, received {rough[1]} msg/s, "
                      f"RSS {rss_mib(node.pid)} MiB", flush=True)
            finally:
                hostiles.close()
            ratios.append(min(rough) / max(1, min(calm)))
            time.sleep(2)
        print(f"hostile/undisturbed rate (the lower of sent and received), median of "
              f"{len(ratios)}: {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in ratios)})")
    finally:
        node.kill()
        node.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
