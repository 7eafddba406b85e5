"""A warren cluster whose nodes each run in a network namespace of their own, and the faults a
real network and real machines have: a node cut off (its cluster link down), paused (SIGSTOP, a
long GC or a VM stall), killed with SIGKILL, and restarted with its data.

Layout (every address lives in a namespace made here, none in the host's):

    warren-nc-<pid>-<k>-n<i>   node i: cl (10.77.0.i: cluster links), lo (127.0.0.1: AMQP on
                               5672 and HTTP on 15672, for clients)
    warren-nc-<pid>-<k>-hub    bridge brc, joining the nodes' cluster links (c<i> its ends)

Named (`NetnsCluster(named=True)`), the nodes find each other by name as on real machines: node i
is `n<i>.warren.test` in every namespace's `/etc/netns/<ns>/hosts` (which `ip netns exec` mounts
over `/etc/hosts`), listens on 0.0.0.0 and advertises its name, and the seeds are the names. A
node given another address (`readdress`) keeps its name: every hosts file follows.

A partition sets node i's cluster veth down (both ends lose carrier, packets vanish, open TCP
connections hang rather than reset, as a pulled cable does). Clients reach a node on its own
loopback, so a test still talks to a node it cut off and sees what a client there sees (and
`guest` logs in, loopback only as in RabbitMQ): this process's thread enters the node's namespace
(setns) just while it opens a socket, and the socket keeps the namespace it was made in.

Everything is undone on every exit path (close(), the context manager, atexit, SIGTERM), and
namespaces a killed run left behind (their creator's pid no longer runs) are removed at the next
start. `tc netem` is not used (not in every kernel): a cut link drops everything, a slow one is
not modelled.

As a tool: `python netns_cluster.py [--nodes N]` starts a cluster and reads commands on stdin
(`partition n2`, `heal n2`, `cut n1 n2`, `uncut n1 n2`, `pause n1`, `resume n1`, `kill n3`,
`restart n3`, `status`, `quit`).
"""

import atexit
import base64
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WARREN_BIN = os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren"))
NS_PREFIX = "warren-nc-"
CLUSTER_NET = "10.77.0"
AMQP_PORT, CLUSTER_PORT, HTTP_PORT = 5672, 25672, 15672
DEADLINE_S = 30.0
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)
# Straight to the node: a proxy from the environment could not reach into its namespace.
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_live = set()
_live_lock = threading.Lock()
_instances = 0


def run(*args, check=True):
    """Runs `ip ...` and friends; a failure says what failed and why."""
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def available():
    """(True, "") when namespaces work here, else (False, why): tests skip with the reason."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "no `ip` command (iproute2)"
    if not os.path.exists(WARREN_BIN):
        return False, f"no warren binary at {WARREN_BIN} (cargo build --release)"
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    r = run("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return False, f"`ip netns add` fails here: {r.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return True, ""


def _alive(pid):
    """True while `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def remove_stale_namespaces():
    """Deletes namespaces of earlier runs whose process is gone (a run killed with SIGKILL has no
    chance to clean up), with the warren processes still inside them."""
    for line in run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.match(rf"{NS_PREFIX}(\d+)-", name)
        if not m or _alive(int(m.group(1))):
            continue
        for pid in run("ip", "netns", "pids", name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        run("ip", "netns", "del", name, check=False)
        shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


@contextlib.contextmanager
def in_namespace(name):
    """Runs the block with this thread in namespace `name`; sockets made inside stay there."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                # A thread left in the wrong namespace would connect anything anywhere: stop.
                os._exit(70)
    finally:
        os.close(target)
        os.close(own)


def eventually(check, what, deadline_s=DEADLINE_S, interval_s=0.1):
    """Polls `check` until it returns a truthy value (returned); the last failure is reported."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as e:  # noqa: BLE001 - the condition is not true yet
            last = e
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not true after {deadline_s} s (last: {last!r})")


class HttpError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class Node:
    def __init__(self, cluster, index):
        self.cluster = cluster
        self.index = index
        self.name = f"n{index + 1}"
        self.ns = f"{cluster.prefix}-{self.name}"
        self.cluster_ip = f"{CLUSTER_NET}.{index + 1}"
        self.host = f"n{index + 1}.warren.test"
        # Which build runs the node (a rolling upgrade changes it between restarts).
        self.binary = WARREN_BIN
        self.client_ip = "127.0.0.1"
        self.data = os.path.join(cluster.dir, self.name)
        self.log_path = os.path.join(cluster.dir, f"{self.name}.log")
        self.proc = None
        self.paused = False
        self.partitioned = False
        self.cut_from = set()

    # ---- the process -------------------------------------------------------------------------

    def start(self, wait=True):
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} already runs"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log)
        log.close()
        self.paused = False
        if wait:
            eventually(lambda: self.api("/api/overview"), f"{self.name} serves its API")

    def command(self, *extra, seeds=None, advertise=None, name=None):
        """The node's command line: by IP, or by name listening on every interface."""
        cluster = self.cluster
        if cluster.named:
            seeds = seeds or ",".join(f"{n.host}:{CLUSTER_PORT}" for n in cluster.nodes)
            addresses = ["--cluster-listen", f"0.0.0.0:{CLUSTER_PORT}",
                         "--cluster-advertise", advertise or f"{self.host}:{CLUSTER_PORT}"]
        else:
            seeds = seeds or ",".join(f"{n.cluster_ip}:{CLUSTER_PORT}" for n in cluster.nodes)
            addresses = ["--cluster-listen", f"{self.cluster_ip}:{CLUSTER_PORT}"]
        return (["ip", "netns", "exec", self.ns, self.binary, "server", "--node-name",
                 name or self.name,
                 "--listen", f"{self.client_ip}:{AMQP_PORT}"] + addresses
                + ["--cluster-seeds", seeds, "--data-dir", self.data,
                   "--management-listen", f"{self.client_ip}:{HTTP_PORT}"]
                + cluster.extra_args + list(extra))

    def run_until_exit(self, *extra, seeds=None, advertise=None, name=None, timeout_s=60):
        """Runs the node in the foreground with `extra` arguments until it exits by itself:
        (exit code, what it printed). For starts that must be refused."""
        r = subprocess.run(self.command(*extra, seeds=seeds, advertise=advertise, name=name),
                           capture_output=True, text=True, timeout=timeout_s)
        return r.returncode, r.stdout + r.stderr

    def readdress(self, last_octet):
        """Gives the node's cluster interface another address (as a machine or pod rescheduled
        elsewhere would get); its name follows in every hosts file. Call while it is stopped."""
        new_ip = f"{CLUSTER_NET}.{last_octet}"
        run("ip", "-n", self.ns, "addr", "del", f"{self.cluster_ip}/24", "dev", "cl")
        run("ip", "-n", self.ns, "addr", "add", f"{new_ip}/24", "dev", "cl")
        for other in self.cluster.nodes:
            for ip in (self.cluster_ip,):
                with contextlib.suppress(Exception):
                    run("ip", "-n", other.ns, "neigh", "flush", "to", ip)
        self.cluster_ip = new_ip
        self.cluster.write_hosts()

    def kill(self):
        """kill -9 (a paused process dies too: SIGKILL needs no SIGCONT)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=15)
        self.proc = None
        self.paused = False

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None
        self.paused = False

    def restart(self, wait=True):
        """Starts the node again on its data dir, killing it first if it still runs."""
        self.kill()
        self.start(wait=wait)

    def pause(self):
        """SIGSTOP: the process keeps its sockets but answers nothing, as in a long stall."""
        assert self.running(), f"{self.name} is not running"
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    # ---- the network -------------------------------------------------------------------------

    def partition(self):
        """Cuts the node off from every other node (clients still reach it)."""
        run("ip", "-n", self.cluster.hub, "link", "set", f"c{self.index + 1}", "down")
        self.partitioned = True

    def heal(self):
        """Ends this node's partition and every cut between it and another node."""
        run("ip", "-n", self.cluster.hub, "link", "set", f"c{self.index + 1}", "up")
        self.partitioned = False
        for other in [n for n in self.cluster.nodes if n.name in self.cut_from]:
            self.uncut(other)

    def cut(self, other):
        """Cuts the link between this node and `other` only, each still reaching the rest (a
        bridge partition: the third node sees both sides). Blackhole routes on both sides:
        packets vanish, and a sender's own connect() fails at once."""
        for a, b in ((self, other), (other, self)):
            run("ip", "-n", a.ns, "route", "add", "blackhole", f"{b.cluster_ip}/32")
            a.cut_from.add(b.name)

    def uncut(self, other):
        for a, b in ((self, other), (other, self)):
            run("ip", "-n", a.ns, "route", "del", "blackhole", f"{b.cluster_ip}/32", check=False)
            a.cut_from.discard(b.name)

    # ---- clients -----------------------------------------------------------------------------

    def api_status(self, path, method="GET", body=None, timeout=10):
        """(status, parsed body) of a management API call; HTTP errors are answers too."""
        req = urllib.request.Request(f"http://{self.client_ip}:{HTTP_PORT}{path}", method=method)
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            req.add_header("content-type", "application/json")
        try:
            with in_namespace(self.ns):
                # The socket is made (and connected) here; reading it may happen anywhere.
                resp = _http.open(req, data=data, timeout=timeout)
            with resp:
                text = resp.read()
                return resp.status, (json.loads(text) if text else {})
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text.decode(errors="replace")

    def api(self, path, method="GET", body=None, timeout=10):
        status, parsed = self.api_status(path, method, body, timeout)
        if status >= 400:
            raise HttpError(status, parsed)
        return parsed

    def connection(self, user="guest", password="guest", vhost="/", timeout_s=10):
        import pika  # only the tests need it; the tool runs without

        params = pika.ConnectionParameters(
            host=self.client_ip, port=AMQP_PORT, virtual_host=vhost,
            credentials=pika.PlainCredentials(user, password),
            socket_timeout=timeout_s, stack_timeout=timeout_s,
            blocked_connection_timeout=timeout_s, connection_attempts=1)
        with in_namespace(self.ns):
            return pika.BlockingConnection(params)

    def status(self):
        return self.api("/api/warren/cluster", timeout=5)

    def definitions(self):
        return self.api("/api/definitions", timeout=5)

    def log_tail(self, chars=4000):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-chars:]


class NetnsCluster:
    """N warren nodes in namespaces; use as a context manager or call close()."""

    def __init__(self, size=3, extra_args=(), workdir=None, named=False):
        global _instances
        _instances += 1
        self.prefix = f"{NS_PREFIX}{os.getpid()}-{_instances}"
        self.hub = f"{self.prefix}-hub"
        self.extra_args = list(extra_args)
        self.named = named
        self.dir = workdir or tempfile.mkdtemp(prefix="warren-netns-")
        self.nodes = [Node(self, i) for i in range(size)]
        self.namespaces = []
        self.closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def node(self, name):
        return next(n for n in self.nodes if n.name == name)

    def create_network(self):
        remove_stale_namespaces()
        _clean_up_on_sigterm()
        with _live_lock:
            _live.add(self)
        self._netns_add(self.hub)
        hub = ["ip", "-n", self.hub]
        run(*hub, "link", "set", "lo", "up")
        run(*hub, "link", "add", "brc", "type", "bridge")
        run(*hub, "link", "set", "brc", "up")
        for n in self.nodes:
            self._netns_add(n.ns)
            me = ["ip", "-n", n.ns]
            run(*me, "link", "set", "lo", "up")
            hub_end = f"c{n.index + 1}"
            run(*hub, "link", "add", hub_end, "type", "veth", "peer", "name", "cl",
                "netns", n.ns)
            run(*hub, "link", "set", hub_end, "master", "brc")
            run(*hub, "link", "set", hub_end, "up")
            run(*me, "addr", "add", f"{n.cluster_ip}/24", "dev", "cl")
            run(*me, "link", "set", "cl", "up")
        if self.named:
            self.write_hosts()

    def write_hosts(self):
        """Every node's name at its current address, in each node's namespace. Written in place:
        `ip netns exec` bind-mounts the file, so a running node sees the new contents."""
        lines = ["127.0.0.1 localhost"] + [f"{n.cluster_ip} {n.host}" for n in self.nodes]
        for n in self.nodes:
            os.makedirs(f"/etc/netns/{n.ns}", exist_ok=True)
            with open(f"/etc/netns/{n.ns}/hosts", "w") as f:
                f.write("\n".join(lines) + "\n")

    def _netns_add(self, name):
        run("ip", "netns", "add", name)
        self.namespaces.append(name)

    def start(self):
        """Creates the network, starts every node and waits until the cluster formed."""
        self.create_network()
        return self.start_nodes()

    def start_nodes(self):
        """Starts every node on the network made already and waits until the cluster formed."""
        for n in self.nodes:
            n.start(wait=False)
        for n in self.nodes:
            eventually(lambda n=n: n.api("/api/overview"), f"{n.name} serves its API")
        self.wait_formed()
        return self

    def wait_formed(self, nodes=None, deadline_s=DEADLINE_S):
        nodes = nodes or self.nodes
        eventually(lambda: all(self.formed(n) for n in nodes), "the cluster formed", deadline_s)

    def formed(self, node):
        """A leader, every member up, and each one's name known, as `node` sees it."""
        status = node.status()
        return (status["metadata"]["leader"] != 0
                and all(m["running"] for m in status["members"])
                and len(status["metadata"]["members"]) == len(status["members"]))

    def leader(self, among=None, deadline_s=DEADLINE_S):
        """The node that the given nodes (default: the running, unpaused ones) agree leads."""
        among = among or [n for n in self.nodes if n.running() and not n.paused]
        by_id = {}

        def agreed():
            leaders = set()
            for n in among:
                s = n.status()
                by_id[s["id"]] = n
                leaders.add(s["metadata"]["leader"])
            if len(leaders) == 1 and 0 not in leaders:
                return next(iter(leaders))
            return None

        leader_id = eventually(agreed, f"{[n.name for n in among]} agree on a leader", deadline_s)
        return by_id.get(leader_id) or next(n for n in self.nodes if self._id(n) == leader_id)

    def _id(self, node):
        return self.nodes.index(node) + 1

    def close(self):
        """Stops every node and removes every namespace; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for n in self.nodes:
            with contextlib.suppress(Exception):
                n.kill()
        for name in reversed(self.namespaces):
            run("ip", "netns", "del", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        self.namespaces = []
        with _live_lock:
            _live.discard(self)
        shutil.rmtree(self.dir, ignore_errors=True)


def _close_all():
    with _live_lock:
        live = list(_live)
    for c in live:
        c.close()


atexit.register(_close_all)


def _on_sigterm(signum, _frame):
    _close_all()
    sys.exit(128 + signum)


def _clean_up_on_sigterm():
    """A SIGTERM (a CI timeout, a Ctrl-C'd parent) would skip atexit: clean up first. Only
    where nobody else handles SIGTERM, and only once a cluster exists."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _on_sigterm)


def main():
    import argparse

    p = argparse.ArgumentParser(description="a warren cluster in network namespaces, with faults")
    p.add_argument("--nodes", type=int, default=3)
    args = p.parse_args()
    ok, why = available()
    if not ok:
        sys.exit(f"cannot run: {why}")
    with NetnsCluster(args.nodes) as c:
        c.start()
        for n in c.nodes:
            print(f"{n.name}: amqp://{n.client_ip}:{AMQP_PORT} in namespace {n.ns} "
                  f"(ip netns exec {n.ns} ...), log {n.log_path}")
        print("commands: partition|heal|pause|resume|kill|restart NODE, cut|uncut NODE NODE, "
              "status, quit")
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "quit":
                break
            try:
                if words[0] == "status":
                    for n in c.nodes:
                        state = ("down" if not n.running() else "paused" if n.paused else "up")
                        state += ", partitioned" if n.partitioned else ""
                        state += "".join(f", cut from {o}" for o in sorted(n.cut_from))
                        detail = ""
                        if n.running() and not n.paused:
                            with contextlib.suppress(Exception):
                                md = n.status()["metadata"]
                                detail = (f" role={md['role']} leader={md['leader']} "
                                          f"term={md['term']} applied={md['applied']}")
                        print(f"{n.name}: {state}{detail}")
                    continue
                getattr(c.node(words[1]), words[0])(*[c.node(w) for w in words[2:]])
                print("ok")
            except Exception as e:  # noqa: BLE001 - a tool: report and read the next command
                print(f"error: {e}")


if __name__ == "__main__":
    main()
