"""A Jepsen-style message-safety test of a warren cluster (issue 11's Proof): confirming
publishers and acking consumers on every node of a 3-node cluster in network namespaces
(netns_cluster.py) while a nemesis kills -9, partitions, cuts and pauses nodes; then everything is
healed, every queue drained, and a checker (Jepsen's total-queue) judges the message sets.

Workload, for `--duration` seconds or until `--faults` faults were done:
- K durable queues (`--queues`, default 4), queue i declared through node i % N so that they are
  spread over the nodes (classic: client-local placement; quorum: `x-queue-type=quorum` with
  `x-queue-leader-locator=client-local`);
- a publisher per node: its own connection (pika SelectConnection) in that node's namespace,
  confirms on, persistent messages with a unique id and the body's SHA-256 in headers, at most
  `--window` unconfirmed and `--rate` per second. Each message ends confirmed, nacked, returned
  (mandatory, unroutable) or indeterminate (the connection died, or no confirm within
  CONFIRM_TIMEOUT_S); after a failure the publisher reconnects to its node or another one;
- a consumer per node over all queues (a channel per queue, manual acks): every delivery is
  recorded with its redelivered flag; acks go in transactions (tx.select, basic.ack each
  delivery of a batch, tx.commit), and the ids whose tx.commit-ok arrived are "ack confirmed";
  a basic.cancel from the server (the queue's node went down) is followed by a new consume;
- a nemesis, seeded (`--seed` replays its choices, not the clients' interleaving): after a gap of
  `--gap` seconds (default 1-3) one fault held for `--hold` seconds: kill -9 a node (then
  restart it on its data), partition a node from the others, cut two nodes from each other (the
  third reaches both), SIGSTOP a node (then SIGCONT). One fault at a time (one node down, cut or
  paused); `--two` adds faults on two nodes at once (two killed, or two partitioned).

Then every fault is healed, every node started, the cluster formed and every queue reachable;
publishers wait for their last confirms, consumers commit and close; each queue is drained with
basic.get + ack through random nodes until every queue stayed empty for DRAIN_QUIET_S.

Checker, over what the clients recorded:
- lost: confirmed (and not returned) but never delivered, during the run or the drain: a
  violation;
- unexpected: delivered but never published; corrupt: the body does not match its SHA-256, or
  came from another queue than it was published to: violations;
- duplicates (deliveries of an id beyond its first), nacked-but-delivered and
  indeterminate-but-delivered: counted, allowed (at-least-once);
- redelivered after a confirmed ack (a delivery of an id whose tx.commit-ok had arrived before
  it): counted; a violation only with `--strict-acks` (meant for replicated quorum queues; a
  classic queue's ack of a remote delivery may be lost with its link).

`--plant-bug` starts the nodes with `--fault-injection` and turns on, on the node hosting the
first queue, the planted bug `POST /api/warren/faults/confirm-without-storing?on=true`: that node
confirms publishes forwarded from other nodes without storing them. The checker must report them
lost (test_queue_faults.py proves it does).

The verdict is about message sets only, never timings; waits poll to generous deadlines.

  sudo .venv/bin/python tests/interop/python/queue_jepsen.py --duration 300 [--seed N]
      [--queue-type classic|quorum] [--faults N] [--strict-acks] [--plant-bug] [--two]

Prints a summary line (`[queue-jepsen] summary: ...`) and exits 1 on any violation.
"""

import argparse
import collections
import contextlib
import hashlib
import logging
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster  # noqa: E402
from netns_cluster import AMQP_PORT, NetnsCluster, eventually, in_namespace  # noqa: E402

ID_HEADER = "jepsen-id"
SHA_HEADER = "jepsen-sha256"
HEARTBEAT_S = 4                 # a silent (paused, cut) node's connection dies within ~2x this
CONNECT_TIMEOUT_S = 5
CONFIRM_TIMEOUT_S = 10.0        # no confirm this long: the publisher gives up on its connection
COMMIT_TIMEOUT_S = 15.0         # a tx.commit this long: the consumer's socket is shut down
CONSUMER_PREFETCH = 50
CONSUMER_BATCH = 20             # acks per transaction at most
RECONSUME_AFTER_S = 1.0         # after a basic.cancel or a closed channel
STOP_CONFIRMS_S = 15.0          # at the end, how long publishers wait for outstanding confirms
JOIN_S = 30.0
HEALTHY_DEADLINE_S = 120.0      # after the faults, until the cluster is whole again
DRAIN_QUIET_S = 5.0             # every queue empty this long: drained
DRAIN_DEADLINE_S = 180.0
PROGRESS_EVERY_S = 10.0


def body_sha(body):
    return hashlib.sha256(body).hexdigest()


def text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def shut_socket(conn):
    """Shuts the socket under a pika connection (blocking or not) from any thread: whatever waits
    on it wakes up with an error. Used only on a client stuck past its deadline."""
    impl = getattr(conn, "_impl", conn)
    with contextlib.suppress(Exception):
        impl._transport._sock.shutdown(socket.SHUT_RDWR)


def params(node):
    import pika

    return pika.ConnectionParameters(
        host=node.client_ip, port=AMQP_PORT, credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=HEARTBEAT_S, socket_timeout=CONNECT_TIMEOUT_S,
        stack_timeout=CONNECT_TIMEOUT_S * 2, blocked_connection_timeout=CONFIRM_TIMEOUT_S,
        connection_attempts=1)


class Ledger:
    """Everything the clients saw, under one lock. `now()` is seconds since the run started."""

    def __init__(self, t0=None):
        self.lock = threading.Lock()
        self.t0 = time.monotonic() if t0 is None else t0
        self.wall0 = time.time() - (time.monotonic() - self.t0)
        self.published = {}          # id -> (queue, sha, publisher's node, time sent)
        self.confirmed = {}          # id -> time of its confirm
        self.nacked = set()
        self.returned = set()
        self.timed_out = set()       # gave up waiting for the confirm (indeterminate)
        self.deliveries = collections.Counter()     # id -> deliveries (run and drain)
        self.redelivered_flag = 0    # deliveries that carried redelivered=true
        self.repeat_without_flag = 0
        self.last_delivery = {}      # id -> (who, time): the previous delivery, for examples
        self.repeat_examples = []
        self.drained = 0
        self.ack_confirmed = {}      # id -> time its tx.commit-ok arrived
        self.after_ack = []          # (id, who, time): delivered again after a confirmed ack
        self.unexpected = []
        self.corrupt = []
        self.anomalies = []          # protocol surprises (confirms of unknown tags, ...)
        self.acks_committed = 0
        self.commits_failed = 0
        self.cancels = 0
        self.sessions = collections.Counter()       # ("publisher"|"consumer", node) -> sessions

    def now(self):
        return time.monotonic() - self.t0

    def wall(self, t):
        """A run time as the UTC wall clock of the nodes' logs."""
        stamp = self.wall0 + t
        return time.strftime("%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp * 1000) % 1000:03d}Z"

    def anomaly(self, what):
        with self.lock:
            if len(self.anomalies) < 1000:
                self.anomalies.append(f"[{self.now():.1f} s] {what}")

    def deliver(self, who, queue, props, body, redelivered, drain=False):
        """Records one delivery (or get); returns its id, or None when it is not ours."""
        headers = props.headers or {}
        mid = text(headers.get(ID_HEADER))
        sha = body_sha(body)
        with self.lock:
            now = self.now()
            known = self.published.get(mid)
            if known is None:
                self.unexpected.append((mid, queue, who, len(body)))
                return None
            if sha != known[1] or text(headers.get(SHA_HEADER)) != known[1] or queue != known[0]:
                self.corrupt.append((mid, queue, known[0], who))
            if mid in self.ack_confirmed:
                self.after_ack.append((mid, who, now))
            if self.deliveries[mid] and not redelivered:
                self.repeat_without_flag += 1
                if len(self.repeat_examples) < 20:
                    prev_who, prev_t = self.last_delivery[mid]
                    self.repeat_examples.append(
                        f"{mid} from {queue} to {who} at {now:.2f} s ({self.wall(now)}) with "
                        f"redelivered=false, delivered before to {prev_who} at {prev_t:.2f} s")
            self.last_delivery[mid] = (who, now)
            self.deliveries[mid] += 1
            self.redelivered_flag += bool(redelivered)
            self.drained += drain
            return mid


class Publisher(threading.Thread):
    """Publishes with confirms from one home node; on any failure reconnects to it or another."""

    def __init__(self, cluster, ledger, index, queues, seed, rate, window):
        super().__init__(daemon=True, name=f"publisher-{index}")
        self.cluster, self.ledger, self.queues = cluster, ledger, queues
        self.home = cluster.nodes[index % len(cluster.nodes)]
        self.tag = f"p{index}"
        self.rng = random.Random(seed)
        self.rate, self.window = rate, window
        self.stopping = threading.Event()
        self.count = 0
        self.error = None
        self.conn = None

    def run(self):
        try:
            # The first session is at home, so publishers start on every node: a planted bug
            # on one node then always has publishes forwarded to it, whatever the seed.
            node = self.home
            while not self.stopping.is_set():
                with self.ledger.lock:
                    self.ledger.sessions[("publisher", node.name)] += 1
                self.session(node)
                if not self.stopping.is_set():
                    time.sleep(self.rng.uniform(0.1, 0.5))
                node = self.home if self.rng.random() < 0.6 else self.rng.choice(
                    self.cluster.nodes)
        except Exception as e:  # noqa: BLE001 - reported as an anomaly, never swallowed
            self.error = f"{type(e).__name__}: {e}"
            self.ledger.anomaly(f"{self.tag} crashed: {self.error}")

    def session(self, node):
        import pika

        s = _PublisherSession(self, node)
        try:
            with in_namespace(node.ns):
                self.conn = pika.SelectConnection(
                    params(node), on_open_callback=s.on_open,
                    on_open_error_callback=s.on_open_error, on_close_callback=s.on_close)
                self.conn.ioloop.start()
        except (pika.exceptions.AMQPError, OSError):
            pass    # a refused or broken connection: try again
        except Exception as e:  # noqa: BLE001 - a bug of this tool: reported, not hidden
            self.ledger.anomaly(f"{self.tag}@{node.name}: {type(e).__name__}: {e}")
            self.error = self.error or f"{type(e).__name__}: {e}"
            if self.conn is not None:
                shut_socket(self.conn)
        finally:
            # What is still pending is indeterminate: neither confirmed nor nacked.
            self.conn = None

    def next_id(self):
        self.count += 1
        return f"{self.tag}.{self.count}"

    def body(self):
        r = self.rng.random()
        size = (self.rng.randint(4_000, 40_000) if r < 0.05
                else 0 if r < 0.07 else self.rng.randint(1, 1_000))
        return self.rng.randbytes(size)


class _PublisherSession:
    """One connection's callbacks, all on the publisher's thread (the connection's ioloop)."""

    def __init__(self, pub, node):
        self.pub, self.node = pub, node
        self.conn = self.channel = None
        self.pending = {}            # delivery tag -> (id, time sent)
        self.next_tag = 1
        self.allowance = 0.0
        self.last_tick = time.monotonic()
        self.closing_since = None
        self.stop_deadline = None
        self.opened = None
        self.confirming = False     # confirm.select-ok arrived: publishing may start

    def on_open(self, conn):
        self.conn = conn
        self.opened = time.monotonic()
        conn.channel(on_open_callback=self.on_channel)
        conn.ioloop.call_later(0.05, self.tick)

    def on_open_error(self, conn, _err):
        conn.ioloop.stop()

    def on_close(self, conn, _reason):
        conn.ioloop.stop()

    def on_channel(self, channel):
        self.channel = channel
        channel.add_on_return_callback(self.on_return)
        channel.add_on_close_callback(lambda *_: self.close())
        channel.confirm_delivery(ack_nack_callback=self.on_confirm,
                                 callback=lambda _f: setattr(self, "confirming", True))

    def on_return(self, _channel, _method, props, _body):
        mid = text((props.headers or {}).get(ID_HEADER))
        with self.pub.ledger.lock:
            self.pub.ledger.returned.add(mid)

    def on_confirm(self, frame):
        import pika

        method = frame.method
        ok = isinstance(method, pika.spec.Basic.Ack)
        tag = method.delivery_tag
        if method.multiple:
            tags = [t for t in self.pending if t <= tag]
        elif tag in self.pending:
            tags = [tag]
        else:
            self.pub.ledger.anomaly(f"{self.pub.tag}@{self.node.name}: "
                                    f"{'ack' if ok else 'nack'} of unknown tag {tag}")
            return
        ledger = self.pub.ledger
        with ledger.lock:
            now = ledger.now()
            for t in tags:
                mid, _ = self.pending.pop(t)
                if ok:
                    ledger.confirmed[mid] = now
                else:
                    ledger.nacked.add(mid)
        self.pump()

    def tick(self):
        """Every 50 ms: the rate allowance, the confirm deadline, stopping."""
        if self.conn is None or self.conn.is_closed:
            return
        now = time.monotonic()
        self.allowance = min(self.allowance + (now - self.last_tick) * self.pub.rate,
                             max(1.0, self.pub.rate / 10))
        self.last_tick = now
        oldest = min((sent for _, sent in self.pending.values()), default=now)
        if self.pub.stopping.is_set() and self.stop_deadline is None:
            self.stop_deadline = now + STOP_CONFIRMS_S
        if not self.confirming and now - self.opened > CONFIRM_TIMEOUT_S:
            self.close()    # the channel or confirm.select is not answered
        elif now - oldest > CONFIRM_TIMEOUT_S or (
                self.stop_deadline is not None and (not self.pending or now > self.stop_deadline)):
            if now - oldest > CONFIRM_TIMEOUT_S:
                with self.pub.ledger.lock:
                    self.pub.ledger.timed_out.update(mid for mid, _ in self.pending.values())
            self.close()
        else:
            self.pump()
        if self.closing_since is not None and now - self.closing_since > 3:
            # close-ok does not come (the node is paused): drop the connection.
            with contextlib.suppress(Exception):
                self.conn._adapter_disconnect_stream()
            self.conn.ioloop.call_later(1.0, self.conn.ioloop.stop)
            return
        self.conn.ioloop.call_later(0.05, self.tick)

    def pump(self):
        import pika

        ch = self.channel
        pub = self.pub
        while (self.confirming and ch.is_open and self.closing_since is None
               and not pub.stopping.is_set() and len(self.pending) < pub.window
               and self.allowance >= 1):
            self.allowance -= 1
            mid = pub.next_id()
            queue = pub.rng.choice(pub.queues)
            body = pub.body()
            sha = body_sha(body)
            with pub.ledger.lock:
                pub.ledger.published[mid] = (queue, sha, self.node.name, pub.ledger.now())
            self.pending[self.next_tag] = (mid, time.monotonic())
            self.next_tag += 1
            # A third high priority: quorum queues keep those apart and take them two to one.
            priority = 9 if pub.rng.random() < 0.3 else None
            ch.basic_publish("", queue, body, pika.BasicProperties(
                delivery_mode=2, message_id=mid, priority=priority,
                headers={ID_HEADER: mid, SHA_HEADER: sha}),
                mandatory=True)

    def close(self):
        if self.closing_since is None:
            self.closing_since = time.monotonic()
            with contextlib.suppress(Exception):
                if self.conn.is_open:
                    self.conn.close()
            if self.conn.is_closed:
                self.conn.ioloop.stop()


class Consumer(threading.Thread):
    """Consumes every queue from one home node (a channel per queue, manual acks committed in
    transactions); reconnects to it or another node after a failure."""

    def __init__(self, cluster, ledger, index, queues, seed):
        super().__init__(daemon=True, name=f"consumer-{index}")
        self.cluster, self.ledger, self.queues = cluster, ledger, queues
        self.home = cluster.nodes[index % len(cluster.nodes)]
        self.tag = f"c{index}"
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.conn = None
        self.busy = None             # (what, since): a blocking call under way
        self.error = None

    def run(self):
        import pika

        try:
            while not self.stopping.is_set():
                node = self.home if self.rng.random() < 0.6 else self.rng.choice(
                    self.cluster.nodes)
                with self.ledger.lock:
                    self.ledger.sessions[("consumer", node.name)] += 1
                try:
                    self.session(node)
                except (pika.exceptions.AMQPError, OSError):
                    pass    # the node died, paused or was cut off
                except Exception as e:  # noqa: BLE001 - a bug of this tool: reported
                    self.ledger.anomaly(f"{self.tag}@{node.name}: {type(e).__name__}: {e}")
                    self.error = self.error or f"{type(e).__name__}: {e}"
                finally:
                    conn, self.conn = self.conn, None
                    if conn is not None:
                        shut_socket(conn)
                if not self.stopping.is_set():
                    time.sleep(self.rng.uniform(0.1, 0.5))
        except Exception as e:  # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}"
            self.ledger.anomaly(f"{self.tag} crashed: {self.error}")

    def session(self, node):
        import pika

        with in_namespace(node.ns):
            self.conn = pika.BlockingConnection(params(node))
        who = f"{self.tag}@{node.name}"
        subs = {q: _Subscription(q) for q in self.queues}
        while not self.stopping.is_set():
            for sub in subs.values():
                if sub.channel is None or not sub.channel.is_open:
                    if time.monotonic() >= sub.retry_at:
                        self.subscribe(sub, who)
                elif not sub.consuming and time.monotonic() >= sub.retry_at:
                    self.consume(sub, who)
            self.conn.process_data_events(time_limit=0.1)
            for sub in subs.values():
                if sub.pending and sub.channel is not None:
                    self.commit(sub, who)
        # Stopping: commit what was delivered, then close (the server requeues the rest).
        for sub in subs.values():
            if sub.pending and sub.channel is not None:
                self.commit(sub, who)
        with contextlib.suppress(Exception):
            self.conn.close()

    def subscribe(self, sub, who):
        import pika

        sub.channel, sub.consuming, sub.pending = None, False, []
        self.busy = ("channel.open, basic.qos, tx.select", time.monotonic())
        try:
            ch = self.conn.channel()
            ch.basic_qos(prefetch_count=CONSUMER_PREFETCH)
            ch.tx_select()
            ch.add_on_cancel_callback(lambda _f: self.cancelled(sub))
            sub.channel = ch
        except pika.exceptions.AMQPChannelError:
            sub.retry_at = time.monotonic() + RECONSUME_AFTER_S
            return
        finally:
            self.busy = None
        self.consume(sub, who)

    def consume(self, sub, who):
        import pika

        def on_message(ch, method, props, body):
            mid = self.ledger.deliver(who, sub.queue, props, body, method.redelivered)
            if mid is not None:
                sub.pending.append((method.delivery_tag, mid))
            else:
                # Not ours: settle it so it does not come back forever (it is reported).
                ch.basic_ack(method.delivery_tag)

        self.busy = ("basic.consume", time.monotonic())
        try:
            sub.channel.basic_consume(sub.queue, on_message, auto_ack=False)
            sub.consuming = True
        except pika.exceptions.AMQPChannelError:
            # 404: the queue's node is down. A new channel later.
            sub.channel = None
            sub.retry_at = time.monotonic() + RECONSUME_AFTER_S
        finally:
            self.busy = None

    def cancelled(self, sub):
        with self.ledger.lock:
            self.ledger.cancels += 1
        sub.consuming = False
        sub.retry_at = time.monotonic() + RECONSUME_AFTER_S

    def commit(self, sub, who):
        """Acks the batch in a transaction; the ids are ack-confirmed once commit-ok arrives."""
        import pika

        batch, sub.pending = sub.pending[:CONSUMER_BATCH], sub.pending[CONSUMER_BATCH:]
        self.busy = ("tx.commit", time.monotonic())
        try:
            for tag, _ in batch:
                sub.channel.basic_ack(tag)
            sub.channel.tx_commit()
        except pika.exceptions.AMQPChannelError:
            # E.g. 406 unknown delivery tag after the queue's node forgot the deliveries: the
            # server rolled the transaction back; those messages come again.
            with self.ledger.lock:
                self.ledger.commits_failed += 1
            sub.channel, sub.consuming, sub.pending = None, False, []
            sub.retry_at = time.monotonic() + RECONSUME_AFTER_S
            return
        except Exception:
            with self.ledger.lock:
                self.ledger.commits_failed += 1
            raise
        finally:
            self.busy = None
        with self.ledger.lock:
            now = self.ledger.now()
            for _, mid in batch:
                self.ledger.ack_confirmed.setdefault(mid, now)
            self.ledger.acks_committed += len(batch)

    def watchdog(self):
        """From the main thread: a blocking call (tx.commit above all) unanswered past its
        deadline costs its connection (the server requeues what the consumer held)."""
        busy, conn = self.busy, self.conn
        if busy is not None and conn is not None and time.monotonic() - busy[1] > COMMIT_TIMEOUT_S:
            self.busy = None
            self.ledger.anomaly(f"{self.tag}: {busy[0]} unanswered for {COMMIT_TIMEOUT_S} s")
            shut_socket(conn)


class _Subscription:
    def __init__(self, queue):
        self.queue = queue
        self.channel = None
        self.consuming = False
        self.pending = []            # (delivery tag, id) delivered, not yet acked
        self.retry_at = 0.0


class Nemesis(threading.Thread):
    """One fault at a time from a seeded RNG: kill, partition, cut, pause (and, with `two`, two
    nodes killed or partitioned)."""

    KINDS = ("kill", "partition", "cut", "pause")
    KINDS_TWO = ("kill-two", "partition-two")

    def __init__(self, cluster, rng, gap, hold, until, max_faults, two, log):
        super().__init__(daemon=True, name="nemesis")
        self.cluster, self.rng, self.gap, self.hold = cluster, rng, gap, hold
        self.until, self.max_faults, self.two, self.log = until, max_faults, two, log
        self.faults = collections.Counter()
        self.error = None

    def done(self):
        if self.max_faults is not None and sum(self.faults.values()) >= self.max_faults:
            return True
        return time.monotonic() >= self.until

    def run(self):
        try:
            while not self.done():
                time.sleep(self.rng.uniform(*self.gap))
                if self.done():
                    break
                self.one_fault()
        except Exception as e:  # noqa: BLE001 - reported: a nemesis that failed proves nothing
            self.error = f"{type(e).__name__}: {e}"
            self.log(f"nemesis failed: {self.error}")

    def one_fault(self):
        nodes = self.cluster.nodes
        kind = self.rng.choice(self.KINDS + (self.KINDS_TWO if self.two else ()))
        victims = self.rng.sample(nodes, 2) if kind in ("cut",) + self.KINDS_TWO else [
            self.rng.choice(nodes)]
        hold = self.rng.uniform(*self.hold)
        names = [v.name for v in victims]
        self.log(f"{kind} {' '.join(names)} for {hold:.1f} s")
        self.faults[kind.replace("-two", "")] += 1
        if kind == "cut":
            victims[0].cut(victims[1])
        for v in victims:
            if kind.startswith("kill"):
                v.kill()
            elif kind.startswith("partition"):
                v.partition()
            elif kind == "pause":
                v.pause()
        time.sleep(hold)
        heal(self.cluster, victims)
        for v in victims:
            eventually(lambda v=v: v.api("/api/overview", timeout=2),
                       f"{v.name} serves its API after {kind}", HEALTHY_DEADLINE_S, 0.2)


def heal(cluster, nodes=None):
    for n in nodes or cluster.nodes:
        if n.partitioned or n.cut_from:
            n.heal()
        if n.paused:
            n.resume()
        if not n.running():
            n.start(wait=False)


def queue_nodes(cluster, names):
    """{queue: (node, leader/members text)} from the management API of any answering node."""
    def read():
        for n in cluster.nodes:
            with contextlib.suppress(Exception):
                qs = {q["name"]: q for q in n.api("/api/queues", timeout=5)}
                if all(name in qs for name in names):
                    return qs
        return None

    qs = eventually(read, "a node lists every queue", HEALTHY_DEADLINE_S, 0.5)
    return {name: qs[name] for name in names}


def declare_queues(cluster, queue_type, count):
    names = [f"jepsen-{i}" for i in range(count)]
    for i, name in enumerate(names):
        node = cluster.nodes[i % len(cluster.nodes)]
        args = {"x-queue-type": queue_type}
        if queue_type == "quorum":
            args["x-queue-leader-locator"] = "client-local"
        conn = node.connection()
        try:
            conn.channel().queue_declare(name, durable=True, arguments=args)
        finally:
            with contextlib.suppress(Exception):
                conn.close()
    return names


def wait_healthy(cluster, names, log):
    """Every node runs and the cluster formed; every queue answers a passive declare through
    every node (its node is up and reachable)."""
    heal(cluster)
    cluster.wait_formed(deadline_s=HEALTHY_DEADLINE_S)

    def reachable():
        for n in cluster.nodes:
            conn = n.connection(timeout_s=CONNECT_TIMEOUT_S)
            try:
                ch = conn.channel()
                for q in names:
                    ch.queue_declare(q, passive=True)
            finally:
                with contextlib.suppress(Exception):
                    conn.close()
        return True

    eventually(reachable, "every queue is reachable through every node", HEALTHY_DEADLINE_S, 0.5)
    log("healed: every node up, the cluster formed, every queue reachable")


def drain(cluster, ledger, names, rng, log):
    """basic.get + ack through random nodes until every queue stayed empty for DRAIN_QUIET_S.
    Returns the ready counts the queues' nodes report at the end."""
    deadline = time.monotonic() + DRAIN_DEADLINE_S
    quiet_since = None
    while time.monotonic() < deadline:
        node = rng.choice(cluster.nodes)
        got = 0
        try:
            conn = node.connection(timeout_s=CONNECT_TIMEOUT_S)
            try:
                ch = conn.channel()
                for q in names:
                    while True:
                        method, props, body = ch.basic_get(q, auto_ack=False)
                        if method is None:
                            break
                        mid = ledger.deliver(f"drain@{node.name}", q, props, body,
                                             method.redelivered, drain=True)
                        ch.basic_ack(method.delivery_tag)
                        got += 1 if mid is not None else 0
                        if got % 2000 == 0:
                            log(f"drain: {got} from {node.name} so far")
            finally:
                with contextlib.suppress(Exception):
                    conn.close()
        except Exception as e:  # noqa: BLE001 - the cluster should be healthy: note, retry
            ledger.anomaly(f"drain through {node.name}: {type(e).__name__}: {e}")
            quiet_since = None
            time.sleep(0.5)
            continue
        if got:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= DRAIN_QUIET_S:
            break
        time.sleep(0.25)
    else:
        ledger.anomaly(f"the drain did not finish in {DRAIN_DEADLINE_S} s")
    counts = {}
    for name, q in queue_nodes(cluster, names).items():
        counts[name] = (q.get("messages"), q.get("node"))
    return counts


class Result:
    def __init__(self):
        self.summary = {}
        self.violations = []
        self.details = []

    @property
    def ok(self):
        return not self.violations

    def line(self):
        return "[queue-jepsen] summary: " + ", ".join(f"{k}={v}" for k, v in self.summary.items())


def check(ledger, faults, seed, args, counts, placement, stuck, nemesis_error, failed=()):
    r = Result()
    with ledger.lock:
        published = set(ledger.published)
        confirmed = set(ledger.confirmed) - ledger.returned
        nacked = ledger.nacked
        delivered = set(ledger.deliveries)
        lost = sorted(confirmed - delivered, key=lambda m: ledger.published[m][3])
        indeterminate = published - set(ledger.confirmed) - nacked - ledger.returned
        dup = sum(c - 1 for c in ledger.deliveries.values() if c > 1)
        r.summary = {
            "seed": seed,
            "queue-type": args.queue_type,
            "queues": len(counts),
            "seconds": round(ledger.now(), 1),
            "faults": sum(faults.values()),
            **{f"faults.{k}": v for k, v in sorted(faults.items())},
            "published": len(published),
            "confirmed": len(confirmed),
            "nacked": len(nacked),
            "returned": len(ledger.returned),
            "indeterminate": len(indeterminate),
            "of which confirm timed out": len(ledger.timed_out & indeterminate),
            "delivered (distinct)": len(delivered),
            "deliveries": sum(ledger.deliveries.values()),
            "drained": ledger.drained,
            "acks committed": ledger.acks_committed,
            "commits failed": ledger.commits_failed,
            "consumer cancels": ledger.cancels,
            "lost": len(lost),
            "unexpected": len(ledger.unexpected),
            "corrupt": len(ledger.corrupt),
            "duplicates": dup,
            "repeats without redelivered flag": ledger.repeat_without_flag,
            "redelivered after confirmed ack": len(ledger.after_ack),
            "nacked but delivered": len(nacked & delivered),
            "indeterminate but delivered": len(indeterminate & delivered),
            "left in queues": sum(c or 0 for c, _ in counts.values()),
            "anomalies": len(ledger.anomalies),
        }
        if lost:
            r.violations.append(f"{len(lost)} confirmed messages lost")
            for mid in lost[:20]:
                queue, _, via, sent = ledger.published[mid]
                r.details.append(
                    f"lost {mid}: to {queue} (on {placement.get(queue, '?')}) through {via}, "
                    f"sent at {sent:.2f} s ({ledger.wall(sent)}), confirmed at "
                    f"{ledger.confirmed[mid]:.2f} s ({ledger.wall(ledger.confirmed[mid])})")
        if ledger.unexpected:
            r.violations.append(f"{len(ledger.unexpected)} deliveries never published")
            r.details += [f"unexpected {u}" for u in ledger.unexpected[:20]]
        if ledger.corrupt:
            r.violations.append(f"{len(ledger.corrupt)} corrupt deliveries")
            r.details += [f"corrupt (id, from, published to, by) {c}"
                          for c in ledger.corrupt[:20]]
        if ledger.after_ack:
            what = f"{len(ledger.after_ack)} deliveries after their ack was confirmed (tx.commit-ok)"
            r.details += [f"after confirmed ack (id, by, at; ack at): {a} "
                          f"{ledger.ack_confirmed[a[0]]:.2f} s" for a in ledger.after_ack[:20]]
            if args.strict_acks:
                r.violations.append(what)
        r.details += [f"repeat without redelivered flag: {e}" for e in ledger.repeat_examples]
        if ledger.anomalies:
            r.details += ledger.anomalies[:20]
    left = {q: c for q, (c, _) in counts.items() if c}
    if left:
        r.violations.append(f"messages left in the queues after the drain: {left}")
    if stuck:
        r.violations.append(f"clients that did not stop: {stuck}")
    if failed:
        r.violations.append(f"clients that failed (a bug of the tool, not a verdict): {failed}")
    if nemesis_error:
        r.violations.append(f"the nemesis failed: {nemesis_error}")
    wanted = max(args.faults or 0, args.faults_min or 0)
    if sum(faults.values()) < wanted:
        r.violations.append(f"only {sum(faults.values())} of {wanted} faults were done")
    if not confirmed:
        r.violations.append("nothing was confirmed: the workload proved nothing")
    return r


def run(args, log=None, cluster_dir=None):
    """Runs the workload, the nemesis, the drain and the checker; returns a Result. The cluster
    (processes, namespaces) is gone when this returns, on every path."""
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    t0 = time.monotonic()

    def default_log(msg):
        print(f"[queue-jepsen {time.monotonic() - t0:7.1f} s] {msg}", flush=True)

    log = log or default_log
    # Connections die by design here; pika logs each death with a traceback.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    log(f"seed {seed}, started {time.strftime('%H:%M:%S', time.gmtime())}Z "
        f"({args.queue_type} queues x {args.queues}, "
        + (f"{args.faults} faults, " if args.faults is not None else "")
        + f"at most {args.duration:.0f} s{', planted bug' if args.plant_bug else ''})")
    extra = ["--fault-injection"] if args.plant_bug else []
    with NetnsCluster(3, extra_args=extra, workdir=cluster_dir) as cluster:
        cluster.start()
        names = declare_queues(cluster, args.queue_type, args.queues)
        qs = queue_nodes(cluster, names)
        placement = {}
        for name, q in qs.items():
            placement[name] = q.get("node")
            extra_info = (f" (leader {q['leader']}, members {q['members']})"
                          if "members" in q else "")
            log(f"{name} on {q.get('node')}{extra_info}")
        if args.plant_bug:
            bugged = cluster.node(placement[names[0]])
            bugged.api("/api/warren/faults/confirm-without-storing?on=true", "POST")
            log(f"planted bug on {bugged.name}: forwarded publishes confirmed, not stored")
        ledger = Ledger(t0)
        pubs = [Publisher(cluster, ledger, i, names, seed * 100 + i, args.rate, args.window)
                for i in range(len(cluster.nodes))]
        cons = [Consumer(cluster, ledger, i, names, seed * 100 + 50 + i)
                for i in range(len(cluster.nodes))]
        for c in pubs + cons:
            c.start()
        until = time.monotonic() + args.duration
        nemesis = Nemesis(cluster, rng, args.gap, args.hold, until,
                          args.faults, args.two, log)
        if args.faults != 0:
            nemesis.start()
        next_progress = time.monotonic() + PROGRESS_EVERY_S
        while (nemesis.is_alive() if args.faults != 0 else time.monotonic() < until):
            time.sleep(0.2)
            for c in cons:
                c.watchdog()
            if time.monotonic() >= next_progress:
                next_progress += PROGRESS_EVERY_S
                with ledger.lock:
                    log(f"published {len(ledger.published)}, confirmed {len(ledger.confirmed)}, "
                        f"nacked {len(ledger.nacked)}, delivered {len(ledger.deliveries)}, "
                        f"acks committed {ledger.acks_committed}, "
                        f"faults {sum(nemesis.faults.values())}")
        log(f"faults over ({dict(nemesis.faults)}): healing")
        wait_healthy(cluster, names, log)
        # The clients keep going on the healed cluster for a moment, then stop: publishers wait
        # for their last confirms, consumers commit their last acks and close.
        time.sleep(2)
        for p in pubs:
            p.stopping.set()
        stuck = []
        for p in pubs:
            p.join(STOP_CONFIRMS_S + JOIN_S)
            if p.is_alive():
                stuck.append(p.name)
                if p.conn is not None:
                    shut_socket(p.conn)
        for c in cons:
            c.stopping.set()
        end = time.monotonic() + JOIN_S
        for c in cons:
            while c.is_alive() and time.monotonic() < end:
                c.watchdog()
                c.join(0.5)
            if c.is_alive():
                stuck.append(c.name)
                if c.conn is not None:
                    shut_socket(c.conn)
        log("clients stopped: draining")
        counts = drain(cluster, ledger, names, rng, log)
        died = [n.name for n in cluster.nodes if n.proc is not None and n.proc.poll() is not None]
        failed = [f"{c.name}: {c.error}" for c in pubs + cons if c.error]
        result = check(ledger, nemesis.faults, seed, args, counts, placement, stuck,
                       nemesis.error, failed)
        for name in died:
            result.violations.append(f"{name} exited on its own: "
                                     f"{cluster.node(name).log_tail(1500)}")
        if args.keep or (result.violations and not args.plant_bug):
            keep = cluster.dir + "-kept"
            os.system(f"cp -r {cluster.dir} {keep} 2>/dev/null")
            result.details.append(f"node logs and data kept in {keep}")
    return result


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300,
                   help="seconds of workload and faults (with --faults: at most this long)")
    p.add_argument("--faults", type=int, default=None,
                   help="stop after this many faults (0: none, the workload alone)")
    p.add_argument("--faults-min", type=int, default=None,
                   help="fewer faults than this in --duration is a failure (the run proved less)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--queue-type", choices=("classic", "quorum"), default="classic")
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--rate", type=float, default=100, help="messages/s per publisher at most")
    p.add_argument("--window", type=int, default=50, help="unconfirmed messages per publisher")
    p.add_argument("--gap", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN", "MAX"),
                   help="seconds between faults")
    p.add_argument("--hold", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN", "MAX"),
                   help="seconds a fault lasts")
    p.add_argument("--two", action="store_true", help="also fault two nodes at once")
    p.add_argument("--strict-acks", action="store_true",
                   help="a delivery after its ack's tx.commit-ok is a violation")
    p.add_argument("--plant-bug", action="store_true",
                   help="the first queue's node confirms forwarded publishes without storing")
    p.add_argument("--keep", action="store_true", help="keep the node logs and data")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    ok, why = netns_cluster.available()
    if not ok:
        sys.exit(f"cannot run: {why}")
    result = run(args)
    for d in result.details:
        print(f"[queue-jepsen] {d}")
    print(result.line(), flush=True)
    if result.violations:
        print("[queue-jepsen] VIOLATIONS: " + "; ".join(result.violations), flush=True)
        sys.exit(1)
    print("[queue-jepsen] no violations", flush=True)


if __name__ == "__main__":
    main()
