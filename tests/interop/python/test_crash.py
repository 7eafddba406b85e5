"""Crash recovery under load (issue 3): publishers with confirms keep many persistent messages in
flight against the warren binary, a consumer acks (and requeues) some of them, and the broker is
killed with SIGKILL at random moments, then restarted on the same data dir. After every restart
a checker reads both queues (a durable classic queue and a quorum queue) without acking and
asserts that

* every message whose confirm arrived, and that no ack was sent for, is there (lost = 0);
* every message seen after an earlier restart, and not acked since, is still there (a message
  the broker recovered once must not vanish at a later crash);
* every body matches the SHA-256 in its headers and the one the publisher recorded, in the queue
  it was published to, still persistent (corrupt = 0);
* nothing appears that was never published (phantom = 0);
* nothing confirmed was returned as unroutable, and no confirm names a sequence number that was
  never published or was already settled.

Acks are not confirmed to the client, so an acked message may come back (counted, allowed; those
whose ack was followed by a round trip long before the kill are listed apart), and so may
unconfirmed ones (at-least-once). Duplicates within one queue are reported, confirmed ones apart,
without failing the test. The run ends with a SIGTERM restart and one more full check.

What SIGKILL cannot show: the kernel keeps the page cache of a killed process, so a confirm sent
after write() but before fdatasync() passes here; only a confirm sent before the write (or a
recovery that drops or mangles what is on disk) fails. Power loss is not simulated.

Kills land while publishers have a window of unconfirmed messages outstanding, sometimes while a
consumer is acking, and sometimes a second time within moments of the restart (while the store
is replaying its WAL and the segment writer is flushing it).

The broker runs with 1 MiB WAL files (instead of 256 MiB), so that most cycles roll the WAL
several times and kills also land while the segment writer settles rolled files: adopting a
backlog in place (sidecar, then checkpoint), copying a sparse one into segments, deleting an
emptied file, compacting.

Knobs: WARREN_CRASH_CYCLES (default 50), WARREN_CRASH_WAL_FILE_BYTES (default 1 MiB), WARREN_CRASH_SEED (random by default; printed, so a run's
choices can be replayed, though the kill timing itself never repeats exactly).

warren only: RabbitMQ is not a process the suite owns, so it cannot be SIGKILLed (skipped there,
as the SIGKILL variants of test_restart.py are).
"""

import collections
import hashlib
import logging
import os
import random
import signal
import threading
import time

import pika
import pytest

from helpers import metric

CYCLES = int(os.environ.get("WARREN_CRASH_CYCLES", "50"))
WAL_FILE_BYTES = int(os.environ.get("WARREN_CRASH_WAL_FILE_BYTES", str(1 << 20)))
# Summed over the broker's lives (each counts from its start), sampled just before each kill.
STORE_COUNTERS = ("wal_files_adopted_total", "wal_files_copied_total",
                  "adopted_files_deleted_total")
SEED = int(os.environ.get("WARREN_CRASH_SEED", str(random.SystemRandom().randrange(2**32))))

PUBLISHERS_PER_QUEUE = 2
WINDOW = 300                      # unconfirmed messages each publisher keeps outstanding
PUBLISHES_PER_CYCLE_MAX = 4000    # per publisher: bounds a cycle's work when the kill comes late
KILL_DELAY_MAX_S = 0.5            # after the publishers' first confirms
LONG_DELAY_PROBABILITY = 0.1      # now and then the store runs long enough to compact (2 s GC)
LONG_DELAY_S = (2.0, 3.5)
BACKLOG_MAX = 12000               # above this many messages in both queues, ack down to half
ACK_CYCLE_PROBABILITY = 0.4
SECOND_KILL_PROBABILITY = 0.15    # kill again right after the restart, during recovery
SECOND_KILL_DELAY_MAX_S = 0.15
CONSUMER_PREFETCH = 200
THREAD_JOIN_S = 15.0
READY_TIMEOUT_S = 15.0
BROWSE_TIMEOUT_S = 30.0
TEST_TIMEOUT_S = 600              # the whole test; the run is expected to take 2-3 minutes

ID_HEADER = "crash-id"
SHA_HEADER = "crash-sha256"


def body_sha(body):
    return hashlib.sha256(body).hexdigest()


class Ledger:
    """What the clients know, shared by every publisher and consumer thread.

    `must_have` is what the next restart must show: confirmed or recovered messages, minus the
    ones an ack was sent for since (an ack is not confirmed, so those may or may not be back)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.published = {}           # id -> (queue, sha256 hex, size)
        self.confirmed = set()
        self.nacked = set()
        self.returned = set()
        self.recovered = set()        # seen by the checker after a restart
        self.acked = set()            # ack sent since the message was last seen after a restart
        self.acked_settled = set()    # of those, acks the broker had processed (a round trip
                                      # followed) well before the kill
        self.acks_sent = 0
        self.requeues_sent = 0
        self.anomalies = []           # protocol-level surprises (bad confirms, bad deliveries)

    def record_publish(self, mid, queue, sha, size):
        with self.lock:
            self.published[mid] = (queue, sha, size)

    def record_confirm(self, mids, ok):
        with self.lock:
            (self.confirmed if ok else self.nacked).update(mids)

    def record_acks(self, mids):
        with self.lock:
            self.acked.update(mids)
            self.acks_sent += len(mids)

    def record_acks_settled(self, mids):
        with self.lock:
            self.acked_settled.update(mids)

    def anomaly(self, text):
        with self.lock:
            if len(self.anomalies) < 1000:
                self.anomalies.append(text)

    def must_have(self):
        with self.lock:
            return (self.confirmed | self.recovered) - self.acked


class Publisher(threading.Thread):
    """One connection with confirms on (pika's asynchronous SelectConnection), publishing to one
    queue and keeping up to WINDOW messages unconfirmed until its connection dies."""

    def __init__(self, broker, ledger, queue, tag, seed):
        super().__init__(daemon=True, name=f"publisher-{tag}")
        self.broker, self.ledger, self.queue, self.tag = broker, ledger, queue, tag
        self.rng = random.Random(seed)
        self.ready = threading.Event()
        self.conn = self.channel = None
        self.next_seq = 1
        self.pending = {}             # delivery tag -> message id
        self.lowest = 1               # lowest delivery tag not yet settled
        self.sent = 0
        self.confirmed = 0
        self.error = None
        self.closed_reason = None
        self.stopping = False

    # ------------------------------------------------------------ thread
    def run(self):
        try:
            self.conn = pika.SelectConnection(
                self.broker.params(),
                on_open_callback=self._on_open,
                on_open_error_callback=self._on_open_error,
                on_close_callback=self._on_close)
            self.conn.ioloop.start()
        except Exception as e:  # noqa: BLE001 - reported by the test, never swallowed
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.ready.set()

    def stop(self):
        """Closes the connection from another thread (when the broker is not being killed)."""
        self.stopping = True
        conn = self.conn
        if conn is not None and self.is_alive():
            try:
                conn.ioloop.add_callback_threadsafe(self._close)
            except Exception:  # noqa: BLE001 - the loop may be gone already
                pass

    def _close(self):
        if self.conn.is_open:
            self.conn.close()
        elif self.conn.is_closed:
            self.conn.ioloop.stop()

    # ------------------------------------------------------------ callbacks
    def _on_open(self, conn):
        conn.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, conn, err):
        self.error = f"cannot connect: {err!r}"
        conn.ioloop.stop()

    def _on_close(self, conn, reason):
        self.closed_reason = reason
        conn.ioloop.stop()

    def _on_channel(self, channel):
        self.channel = channel
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select_ok)

    def _on_select_ok(self, _frame):
        self._pump()

    def _on_return(self, _channel, _method, props, _body):
        mid = (props.headers or {}).get(ID_HEADER)
        with self.ledger.lock:
            self.ledger.returned.add(mid)

    def _on_confirm(self, frame):
        method = frame.method
        ok = isinstance(method, pika.spec.Basic.Ack)
        tag = method.delivery_tag
        if tag >= self.next_seq:
            self.ledger.anomaly(f"{self.tag}: confirm for tag {tag}, only {self.next_seq - 1} "
                                "were published")
            return
        if method.multiple:
            tags = [t for t in range(self.lowest, tag + 1) if t in self.pending]
        elif tag in self.pending:
            tags = [tag]
        else:
            self.ledger.anomaly(f"{self.tag}: {'ack' if ok else 'nack'} for tag {tag}, "
                                "already settled")
            return
        mids = [self.pending.pop(t) for t in tags]
        while self.lowest < self.next_seq and self.lowest not in self.pending:
            self.lowest += 1
        self.ledger.record_confirm(mids, ok)
        if ok:
            self.confirmed += len(mids)
            self.ready.set()
        self._pump()

    def _pump(self):
        ch = self.channel
        while (not self.stopping and ch.is_open and len(self.pending) < WINDOW
               and self.sent < PUBLISHES_PER_CYCLE_MAX):
            mid = f"{self.tag}.{self.sent}"
            body = self._body()
            sha = body_sha(body)
            self.ledger.record_publish(mid, self.queue, sha, len(body))
            props = pika.BasicProperties(delivery_mode=2, message_id=mid,
                                         headers={ID_HEADER: mid, SHA_HEADER: sha})
            self.pending[self.next_seq] = mid
            self.next_seq += 1
            self.sent += 1
            ch.basic_publish("", self.queue, body, props, mandatory=True)

    def _body(self):
        r = self.rng.random()
        if r < 0.01:
            size = self.rng.randint(100_000, 300_000)   # several frames (frame_max 131072)
        elif r < 0.1:
            size = self.rng.randint(4_000, 20_000)
        elif r < 0.12:
            size = 0
        else:
            size = self.rng.randint(1, 1_500)
        return self.rng.randbytes(size)

    @property
    def in_flight(self):
        return len(self.pending)


class Consumer(threading.Thread):
    """Consumes from both queues with manual acks until its connection dies: acks most
    deliveries (singly or several with multiple=true), requeues a few with basic.reject."""

    def __init__(self, broker, ledger, queues, seed):
        super().__init__(daemon=True, name="consumer")
        self.broker, self.ledger, self.queues = broker, ledger, queues
        self.rng = random.Random(seed)
        self.ready = threading.Event()
        self.stop_flag = threading.Event()
        self.delivered = 0
        self.error = None
        self.unacked = {}   # channel -> [(delivery tag, id)] waiting for a multiple ack

    def run(self):
        try:
            conn = self.broker.connect()
            for q in self.queues:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=CONSUMER_PREFETCH)
                self.unacked[ch] = []
                ch.basic_consume(q, self._on_message, auto_ack=False)
            self.ready.set()
            while not self.stop_flag.is_set():
                conn.process_data_events(time_limit=0.05)
            conn.close()
        except (pika.exceptions.AMQPError, OSError):
            pass    # the broker was killed under us: that is the point
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.ready.set()

    def _on_message(self, ch, method, props, body):
        self.delivered += 1
        mid = check_delivery(self.ledger, method.routing_key, props, body)
        if mid is None:
            return   # already reported; leave it unacked so the checker sees it again
        batch = self.unacked[ch]
        r = self.rng.random()
        if r < 0.05 and not batch:
            with self.ledger.lock:
                self.ledger.requeues_sent += 1
            ch.basic_reject(method.delivery_tag, requeue=True)
            return
        batch.append((method.delivery_tag, mid))
        if r < 0.6 or len(batch) >= 20:
            self.ledger.record_acks([m for _, m in batch])   # before the ack leaves
            ch.basic_ack(method.delivery_tag, multiple=len(batch) > 1)
            batch.clear()


def check_delivery(ledger, queue, props, body):
    """The id of a delivered message after checking it against the ledger, or None (and an
    anomaly recorded) when it is corrupt or was never published."""
    headers = props.headers or {}
    mid = headers.get(ID_HEADER)
    if isinstance(mid, bytes):
        mid = mid.decode(errors="replace")
    with ledger.lock:
        known = ledger.published.get(mid)
    if known is None:
        ledger.anomaly(f"phantom delivery from {queue}: headers {headers!r}, {len(body)} bytes")
        return None
    want_queue, want_sha, want_size = known
    sha = body_sha(body)
    problems = []
    if sha != want_sha or len(body) != want_size:
        problems.append(f"body sha {sha[:12]} ({len(body)} B), published {want_sha[:12]} "
                        f"({want_size} B)")
    if headers.get(SHA_HEADER) not in (want_sha, want_sha.encode()):
        problems.append(f"sha header {headers.get(SHA_HEADER)!r}")
    if queue != want_queue:
        problems.append(f"in queue {queue}, published to {want_queue}")
    if props.delivery_mode != 2:
        problems.append(f"delivery_mode {props.delivery_mode}")
    if problems:
        ledger.anomaly(f"corrupt delivery of {mid}: " + "; ".join(problems))
        return None
    return mid


def browse(broker, queue):
    """Every message of `queue`, read without acking (they go back when the connection
    closes): [(id or None, props, body)]. Bounded by BROWSE_TIMEOUT_S."""
    conn = broker.connect()
    try:
        ch = conn.channel()
        expected = ch.queue_declare(queue, passive=True).method.message_count
        got = []
        ch.basic_consume(queue, lambda c, m, p, b: got.append((p, b)), auto_ack=False)
        deadline = time.monotonic() + BROWSE_TIMEOUT_S
        while len(got) < expected and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        conn.process_data_events(time_limit=0.05)   # anything beyond the count shows up now
        assert len(got) >= expected, (f"{queue}: message_count said {expected}, only {len(got)} "
                                      f"delivered within {BROWSE_TIMEOUT_S}s")
        return expected, got
    finally:
        if conn.is_open:
            conn.close()


def drain(broker, ledger, queues, n):
    """Consumes and acks about n messages (half from each queue) with the broker running, to
    keep the backlog the checker reads bounded. Returns how many acks were sent."""
    conn = broker.connect()
    total = 0
    try:
        for q in queues:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=500)
            got, acked, mids = [], 0, []
            tag = ch.basic_consume(q, lambda c, m, p, b: got.append((m, p, b)), auto_ack=False)
            deadline = time.monotonic() + BROWSE_TIMEOUT_S
            while acked < n // len(queues) and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.05)
                batch, got[:] = got[:], []
                for m, p, b in batch:
                    mid = check_delivery(ledger, q, p, b)
                    if mid is not None:   # a bad one stays unacked (and is reported)
                        ledger.record_acks([mid])
                        ch.basic_ack(m.delivery_tag)
                        mids.append(mid)
                        acked += 1
            ch.basic_cancel(tag)   # a round trip: the broker has processed every ack above
            ledger.record_acks_settled(mids)
            ch.close()   # what it still held goes back to the queue
            total += acked
    finally:
        if conn.is_open:
            conn.close()
    return total


class Checker:
    def __init__(self, ledger, queues):
        self.ledger = ledger
        self.queues = queues
        self.lost = []                # (cycle, id, "confirmed" | "recovered earlier")
        self.duplicates_confirmed = collections.Counter()
        self.duplicates_unconfirmed = collections.Counter()
        self.resurrected_acked = 0
        self.resurrected_settled = []   # (cycle, id): acked, a round trip, then back after a kill
        self.unconfirmed_recovered = set()
        self.last_present = 0

    def check(self, broker, cycle):
        must_have = self.ledger.must_have()
        present = collections.Counter()
        for q in self.queues:
            _, got = browse(broker, q)
            for props, body in got:
                mid = check_delivery(self.ledger, q, props, body)
                if mid is not None:
                    present[mid] += 1
        with self.ledger.lock:
            for mid in present:
                if mid in self.ledger.acked:
                    self.resurrected_acked += 1
                    if mid in self.ledger.acked_settled:
                        self.resurrected_settled.append((cycle, mid))
                if mid not in self.ledger.confirmed:
                    self.unconfirmed_recovered.add(mid)
                if present[mid] > 1:
                    dups = (self.duplicates_confirmed if mid in self.ledger.confirmed
                            else self.duplicates_unconfirmed)
                    dups[mid] = max(dups[mid], present[mid])
            confirmed = set(self.ledger.confirmed)
            # Seen now: must be there at every later restart until an ack is sent for it.
            self.ledger.recovered.update(present)
            self.ledger.acked.difference_update(present)
            self.ledger.acked_settled.difference_update(present)
        for mid in sorted(must_have - present.keys()):
            self.lost.append((cycle, mid, "confirmed" if mid in confirmed else
                              "recovered at an earlier restart"))
        self.last_present = sum(present.values())
        return len(must_have), sum(present.values())


def declare(ch, queues):
    classic, quorum = queues
    ch.queue_declare(classic, durable=True)
    ch.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})


def stop_threads(threads):
    for t in threads:
        if isinstance(t, Publisher):
            t.stop()
        else:
            t.stop_flag.set()
    for t in threads:
        t.join(THREAD_JOIN_S)


@pytest.mark.restart
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_confirmed_messages_survive_repeated_sigkill_under_load(broker, name, capsys, caplog):
    if broker.is_rabbitmq or not broker.can_restart:
        pytest.skip("SIGKILL needs a warren process the suite started (see test_restart.py)")
    # Every kill makes pika log each dropped connection as an ERROR: expected here, and noise.
    caplog.set_level(logging.CRITICAL, logger="pika")
    broker.restart(signal.SIGTERM, extra_args=["--wal-file-bytes-max", str(WAL_FILE_BYTES)])
    try:
        run_crash_cycles(broker, name, capsys)
    finally:
        broker.restart(signal.SIGTERM, extra_args=[])


def run_crash_cycles(broker, name, capsys):
    rng = random.Random(SEED)
    queues = (name + ".classic", name + ".quorum")
    ledger = Ledger()
    checker = Checker(ledger, queues)
    c = broker.connect()
    declare(c.channel(), queues)
    c.close()

    started = time.monotonic()
    stats = collections.Counter()
    log = []
    threads = []
    try:
        for cycle in range(1, CYCLES + 1):
            ack_cycle = rng.random() < ACK_CYCLE_PROBABILITY
            threads.clear()
            if ack_cycle:
                consumer = Consumer(broker, ledger, queues, rng.randrange(2**32))
                consumer.start()
                threads.append(consumer)
                assert consumer.ready.wait(READY_TIMEOUT_S), "consumer did not start"
                assert consumer.error is None, consumer.error
            publishers = [Publisher(broker, ledger, q, f"c{cycle}.{q[-1]}{i}", rng.randrange(2**32))
                          for q in queues for i in range(PUBLISHERS_PER_QUEUE)]
            for p in publishers:
                p.start()
            threads += publishers
            for p in publishers:
                # Ready = its first confirm arrived (or it failed): the pipeline is full from here.
                assert p.ready.wait(READY_TIMEOUT_S), f"{p.name}: no confirm in {READY_TIMEOUT_S}s"
                assert p.error is None, f"{p.name}: {p.error}"
            delay = rng.choice([0.0, rng.uniform(0, 0.05), rng.uniform(0, KILL_DELAY_MAX_S),
                                rng.uniform(0, KILL_DELAY_MAX_S)])
            if rng.random() < LONG_DELAY_PROBABILITY:
                delay = rng.uniform(*LONG_DELAY_S)
            time.sleep(delay)

            in_flight = sum(p.in_flight for p in publishers)
            for counter in STORE_COUNTERS:
                stats[counter] += int(metric(broker, "warren_store_" + counter))
            broker.restart(signal.SIGKILL)
            stats["kills"] += 1
            if ack_cycle:
                stats["kills while acking"] += 1
            if in_flight:
                stats["kills with confirms outstanding"] += 1
            stats["unconfirmed at kill (approx)"] += in_flight
            for t in threads:
                t.join(THREAD_JOIN_S)
            stuck = [t.name for t in threads if t.is_alive()]
            assert not stuck, f"client threads still running {THREAD_JOIN_S}s after the kill: {stuck}"
            errors = [f"{t.name}: {t.error}" for t in threads if t.error]
            assert not errors, errors
            stats["published"] += sum(p.sent for p in publishers)
            if rng.random() < SECOND_KILL_PROBABILITY:
                time.sleep(rng.uniform(0, SECOND_KILL_DELAY_MAX_S))
                broker.restart(signal.SIGKILL)
                stats["kills during recovery"] += 1

            must, present = checker.check(broker, cycle)
            if present > BACKLOG_MAX:
                stats["acked between kills"] += drain(broker, ledger, queues, present - BACKLOG_MAX // 2)
            log.append(f"cycle {cycle:2}: {'ack ' if ack_cycle else 'pub '} kill after "
                       f"{delay * 1000:4.0f} ms, {in_flight:4} unconfirmed at kill, "
                       f"{sum(p.sent for p in publishers):5} published, must have {must:6}, "
                       f"present {present:6}, lost so far {len(checker.lost)}")
            if checker.lost or ledger.anomalies:
                break    # the ledger no longer describes the queues: report what is wrong now
    finally:
        stop_threads(threads)   # only on a failure are they still running

    # Last: a graceful restart, then everything must be there once more, and drain it all.
    if not (checker.lost or ledger.anomalies):
        broker.restart(signal.SIGTERM)
        checker.check(broker, "after SIGTERM")
    must_at_end = ledger.must_have()
    drained = 0
    c = broker.connect()
    ch = c.channel()
    for q in queues:
        drained += ch.queue_delete(q).method.message_count
    c.close()
    elapsed = time.monotonic() - started

    with ledger.lock:
        summary = {
            "seed": SEED,
            "cycles": len(log),
            "seconds": round(elapsed, 1),
            "published": len(ledger.published),
            "confirmed": len(ledger.confirmed),
            "nacked": len(ledger.nacked),
            "acks sent": ledger.acks_sent,
            "requeues sent": ledger.requeues_sent,
            "recovered (distinct ids seen after a restart)": len(ledger.recovered),
            "recovered unconfirmed (allowed)": len(checker.unconfirmed_recovered),
            "acked but back after a kill (allowed)": checker.resurrected_acked,
            "of which acked with the broker running long after": len(checker.resurrected_settled),
            "in the queues at the end": drained,
            "required at the end": len(must_at_end),
            "lost": len(checker.lost),
            "corrupt or phantom": len(ledger.anomalies),
            "duplicated confirmed": len(checker.duplicates_confirmed),
            "duplicated unconfirmed": len(checker.duplicates_unconfirmed),
            "returned unroutable": len(ledger.returned),
            **stats,
        }
    with capsys.disabled():
        print("\n[crash] " + "\n[crash] ".join(log))
        print("[crash] summary: " + ", ".join(f"{k}={v}" for k, v in summary.items()))
        if checker.resurrected_settled:
            print(f"[crash] acked (then a round trip) but back after a kill (cycle, id): "
                  f"{checker.resurrected_settled[:20]}")
        if checker.duplicates_confirmed:
            print(f"[crash] duplicated confirmed ids (id: copies): "
                  f"{dict(list(checker.duplicates_confirmed.items())[:20])}")
    assert not checker.lost, (
        f"{len(checker.lost)} messages lost (seed {SEED}); first: {checker.lost[:20]}")
    assert not ledger.anomalies, (
        f"{len(ledger.anomalies)} corrupt/phantom deliveries (seed {SEED}): {ledger.anomalies[:20]}")
    assert not ledger.returned, f"confirmed publishes came back unroutable: {ledger.returned}"
    assert len(log) >= CYCLES
    assert len(ledger.confirmed) > 0 and stats["kills with confirms outstanding"] > 0
    if WAL_FILE_BYTES <= 1 << 20:
        # Else the kills never met the segment writer's work on rolled files.
        assert stats["wal_files_adopted_total"] > 0 and stats["wal_files_copied_total"] > 0, stats
