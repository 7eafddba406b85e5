#!/usr/bin/env python3
"""A randomised fault schedule against a 3-node warren cluster in network namespaces: clients
declare, bind and delete while nodes are partitioned, paused (SIGSTOP), killed with SIGKILL and
restarted; then every fault is healed and the run checks that

  1. every node holds the same definitions (GET /api/definitions), within a deadline;
  2. every acknowledged declare (and its binding) exists, unless an acknowledged or uncertain
     delete of it followed;
  3. every acknowledged delete stuck: the queue exists nowhere;
  4. nothing refused for want of a majority ("this node reaches 1 of ...") ever took effect;
  5. each client's user has the last password it set and was acknowledged.

Outcomes a client cannot know (the node died mid-request, "timed out ... waiting for a majority")
are uncertain: either answer is allowed for them. Not run in CI (minutes, random); run it by hand:

  sudo .venv/bin/python scripts/cluster-faults.py --duration 300 [--seed N] [--clients 3]
      [--snapshot-entries 500]

Exits 1 on any violation, after printing what was violated and the seed to replay the schedule
(the faults' order replays; the interleaving with clients does not).
"""

import argparse
import base64
import hashlib
import os
import random
import sys
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "interop", "python"))
import netns_cluster  # noqa: E402
from netns_cluster import NetnsCluster, eventually  # noqa: E402

EXCHANGE = "faults"
# A fault lasts this long; long enough for failure detection (1 s) and an election (1-2 s).
FAULT_HOLD_S = (0.5, 6.0)
FAULT_GAP_S = (0.5, 3.0)


class Ledger:
    """What the clients were told, per queue name (names are never reused)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.declared = {}   # name -> "acked" | "uncertain" | "refused"
        self.deleted = {}    # name -> "acked" | "uncertain" | "refused"
        self.vhosts = {}     # name -> "acked" | "uncertain" | "refused"
        self.unbound = {}    # declared, but its bind failed: "uncertain" | "refused"
        self.passwords = {}  # user -> [(password, outcome)] in the order they were set
        self.ops = Counter()

    def note(self, table, name, outcome, kind):
        with self.lock:
            getattr(self, table)[name] = outcome
            self.ops[(kind, outcome)] += 1

    def note_password(self, user, password, outcome):
        with self.lock:
            self.passwords.setdefault(user, []).append((password, outcome))
            self.ops[("password", outcome)] += 1

    def expected_password(self, user):
        """The password that must hold, or None when an uncertain change came after the last
        acknowledged one (either may hold) or none was acknowledged."""
        changes = self.passwords.get(user, [])
        acked = [i for i, (_, o) in enumerate(changes) if o == "acked"]
        if not acked or any(o == "uncertain" for _, o in changes[acked[-1] + 1:]):
            return None
        return changes[acked[-1]][0]

    def deletable(self, rng):
        with self.lock:
            live = [n for n, o in self.declared.items()
                    if o == "acked" and n not in self.deleted and n not in self.unbound]
        return rng.choice(live) if live else None


def outcome_of(error):
    """A refusal before the change entered the log is definite; anything else may have
    happened."""
    text = str(getattr(error, "reply_text", "")) + str(error)
    if getattr(error, "reply_code", None) == 541 and "reaches" in text:
        return "refused"
    if getattr(error, "status", None) == 503 and "reaches" in str(getattr(error, "body", "")):
        return "refused"
    return "uncertain"


class Client(threading.Thread):
    def __init__(self, cluster, ledger, index, seed, stopping):
        super().__init__(daemon=True)
        self.cluster, self.ledger, self.index = cluster, ledger, index
        self.rng = random.Random(seed * 1000 + index)
        self.stopping = stopping
        self.seq = 0

    def run(self):
        while not self.stopping.is_set():
            node = self.rng.choice(self.cluster.nodes)
            try:
                self.session(node)
            except Exception:  # noqa: BLE001 - connecting failed: the node is down or paused
                time.sleep(0.2)

    def session(self, node):
        conn = node.connection(timeout_s=5)
        try:
            ch = conn.channel()
            for _ in range(self.rng.randint(1, 20)):
                if self.stopping.is_set():
                    return
                r = self.rng.random()
                if r < 0.65:
                    self.seq += 1
                    name = f"c{self.index}-q{self.seq}"
                    # The queue's fate is the declare's; its binding's, the bind's: a
                    # refused bind after an acknowledged declare leaves the queue there.
                    declared = False
                    try:
                        ch.exchange_declare(EXCHANGE, "topic", durable=True)
                        ch.queue_declare(name, durable=True)
                        declared = True
                        ch.queue_bind(name, EXCHANGE, name)
                        self.ledger.note("declared", name, "acked", "declare+bind")
                    except Exception as e:
                        outcome = outcome_of(e)
                        if declared:
                            self.ledger.note("unbound", name, outcome, "bind")
                            self.ledger.note("declared", name, "acked", "declare")
                        else:
                            self.ledger.note("declared", name, outcome, "declare")
                        raise
                elif r < 0.9:
                    name = self.ledger.deletable(self.rng)
                    if name is None:
                        continue
                    try:
                        ch.queue_delete(name)
                        self.ledger.note("deleted", name, "acked", "delete")
                    except Exception as e:
                        self.ledger.note("deleted", name, outcome_of(e), "delete")
                        raise
                elif r < 0.95:
                    # This client's own user: its changes are ordered, so the last one
                    # acknowledged (with none uncertain after it) is the password that holds.
                    self.seq += 1
                    user, password = f"c{self.index}-user", f"pw{self.seq}"
                    try:
                        node.api(f"/api/users/{user}", "PUT", {"password": password, "tags": ""})
                        self.ledger.note_password(user, password, "acked")
                    except Exception as e:
                        self.ledger.note_password(user, password, outcome_of(e))
                else:
                    self.seq += 1
                    name = f"c{self.index}-v{self.seq}"
                    try:
                        node.api(f"/api/vhosts/{name}", "PUT")
                        self.ledger.note("vhosts", name, "acked", "vhost")
                    except Exception as e:
                        self.ledger.note("vhosts", name, outcome_of(e), "vhost")
        finally:
            if conn.is_open:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass


def fault_schedule(cluster, rng, deadline, log):
    faults = Counter()
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(*FAULT_GAP_S))
        up = [n for n in cluster.nodes if n.running() and not n.paused and not n.partitioned]
        kind = rng.choice(["partition", "partition", "pause", "kill", "two-partitioned",
                           "pause-leader", "kill-leader", "bridge"])
        victims = []
        try:
            if kind in ("pause-leader", "kill-leader"):
                victims = [cluster.leader(among=up, deadline_s=10)]
            elif kind in ("two-partitioned", "bridge"):
                victims = rng.sample(up, min(2, len(up)))
            else:
                victims = [rng.choice(up)]
        except AssertionError:
            kind, victims = "no-leader-found", []
        hold = rng.uniform(*FAULT_HOLD_S)
        log(f"{kind} {[v.name for v in victims]} for {hold:.1f} s")
        faults[kind] += 1
        if kind == "bridge" and len(victims) == 2:
            # The two lose each other only; the third still reaches both.
            victims[0].cut(victims[1])
        for v in victims:
            if kind == "bridge":
                pass
            elif kind.startswith("partition") or kind == "two-partitioned":
                v.partition()
            elif kind.startswith("pause"):
                v.pause()
            elif kind.startswith("kill"):
                v.kill()
        time.sleep(hold)
        for v in victims:
            if v.partitioned or v.cut_from:
                v.heal()
            if v.paused:
                v.resume()
            if not v.running():
                v.start(wait=False)
    return faults


def password_matches(password_hash, password):
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt ++ SHA-256(salt ++ password))."""
    if not password_hash:
        return False
    raw = base64.b64decode(password_hash)
    return hashlib.sha256(raw[:4] + password.encode()).digest() == raw[4:]


def check(cluster, ledger, agree_deadline_s):
    violations = []
    start = time.monotonic()
    seen = {}

    def agree():
        for n in cluster.nodes:
            d = n.definitions()
            seen[n.name] = {k: d[k] for k in ("users", "vhosts", "permissions", "queues",
                                              "exchanges", "bindings")}
        first = next(iter(seen.values()))
        return all(d == first for d in seen.values())

    try:
        eventually(agree, "every node has the same definitions", agree_deadline_s, 0.5)
    except AssertionError as e:
        violations.append(f"nodes disagree: {e}")
        for name, d in seen.items():
            print(f"  {name}: {len(d['queues'])} queues, {len(d['bindings'])} bindings, "
                  f"{len(d['vhosts'])} vhosts")
    agree_s = time.monotonic() - start
    for node_name, d in seen.items():
        queues = {q["name"] for q in d["queues"]}
        bound = {b["destination"] for b in d["bindings"] if b["source"] == EXCHANGE
                 and b["routing_key"] == b["destination"]}
        vhosts = {v["name"] for v in d["vhosts"]}
        for name, outcome in ledger.declared.items():
            deleted = ledger.deleted.get(name)
            if outcome == "acked" and deleted in (None, "refused"):
                if name not in queues:
                    violations.append(f"{node_name}: acknowledged queue {name} is missing")
                elif name not in bound and name not in ledger.unbound:
                    violations.append(f"{node_name}: acknowledged binding of {name} is missing")
            if ledger.unbound.get(name) == "refused" and name in bound:
                violations.append(f"{node_name}: refused binding of {name} exists")
            if outcome == "refused" and name in queues:
                violations.append(f"{node_name}: refused queue {name} exists")
        for name, outcome in ledger.deleted.items():
            if outcome == "acked" and name in queues:
                violations.append(f"{node_name}: deleted queue {name} exists")
        hashes = {u["name"]: u["password_hash"] for u in d["users"]}
        for user in ledger.passwords:
            expected = ledger.expected_password(user)
            if expected is not None and not password_matches(hashes.get(user), expected):
                violations.append(f"{node_name}: {user}'s password is not the last acknowledged "
                                  f"one ({expected})")
        for name, outcome in ledger.vhosts.items():
            if outcome == "acked" and name not in vhosts:
                violations.append(f"{node_name}: acknowledged vhost {name} is missing")
            if outcome == "refused" and name in vhosts:
                violations.append(f"{node_name}: refused vhost {name} exists")
    return violations, agree_s


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300, help="seconds of faults")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--agree-deadline", type=float, default=90)
    p.add_argument("--snapshot-entries", type=int, default=None,
                   help="snapshot (and compact) the metadata log this often, so that nodes the "
                        "faults left behind catch up from snapshots")
    p.add_argument("--keep", action="store_true", help="keep the node logs (printed path)")
    args = p.parse_args()
    ok, why = netns_cluster.available()
    if not ok:
        sys.exit(f"cannot run: {why}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    rng = random.Random(seed)
    t0 = time.monotonic()

    def log(msg):
        print(f"[{time.monotonic() - t0:7.1f} s] {msg}", flush=True)

    log(f"seed {seed}, {args.duration:.0f} s of faults, {args.clients} clients")
    ledger = Ledger()
    keep_dir = None
    extra = ([] if args.snapshot_entries is None
             else ["--cluster-snapshot-entries", str(args.snapshot_entries)])
    with NetnsCluster(3, extra_args=extra) as cluster:
        cluster.start()
        stopping = threading.Event()
        clients = [Client(cluster, ledger, i, seed, stopping) for i in range(args.clients)]
        for c in clients:
            c.start()
        faults = fault_schedule(cluster, rng, time.monotonic() + args.duration, log)
        stopping.set()
        for c in clients:
            c.join(timeout=30)
        log("faults over: healing, resuming, starting every node")
        for n in cluster.nodes:
            if n.partitioned or n.cut_from:
                n.heal()
            if n.paused:
                n.resume()
            if not n.running():
                n.start(wait=False)
        violations, agree_s = check(cluster, ledger, args.agree_deadline)
        dead = [n.name for n in cluster.nodes if n.proc is not None and n.proc.poll() is not None]
        for name in dead:
            violations.append(f"{name} exited on its own: {cluster.node(name).log_tail(2000)}")
        if args.keep or violations:
            keep_dir = cluster.dir + "-kept"
            os.system(f"cp -r {cluster.dir} {keep_dir}")
    print(f"\nseed {seed}; faults: {dict(faults)}")
    print(f"{'operation':<14}{'acked':>8}{'refused':>9}{'uncertain':>11}")
    for kind in ("declare+bind", "declare", "bind", "delete", "password", "vhost"):
        row = [ledger.ops[(kind, o)] for o in ("acked", "refused", "uncertain")]
        print(f"{kind:<14}{row[0]:>8}{row[1]:>9}{row[2]:>11}")
    print(f"agreement reached {agree_s:.1f} s after the last fault healed")
    if keep_dir:
        print(f"node logs and data kept in {keep_dir}")
    if violations:
        print(f"\n{len(violations)} VIOLATIONS:")
        for v in violations[:50]:
            print(f"  {v}")
        sys.exit(1)
    print("no violations")


if __name__ == "__main__":
    main()
