#!/usr/bin/env bash
# What TLS on the cluster links costs the quorum-queue path: a local 3-node cluster
# (scripts/cluster.sh) with plain links and one with --tls, alternated ROUNDS times, each run
# `warren perf` with 1 producer and 1 consumer on a quorum queue of group size 3 led by n1
# (1 KB persistent messages, confirms -c 1000, acks -q 1000) for SECONDS. Prints each run's
# rates, median latency and the three nodes' CPU per message, then the TLS/plain ratios of the
# means.
#
#   scripts/compare-cluster-tls.sh [SECONDS] [ROUNDS]      (default 20 s, 3 rounds)
#
# The cluster's ports are moved by WARREN_CLUSTER_PORT_OFFSET (default 300: AMQP 5972-5974) so
# that it runs beside another; data under $TMPDIR. Nodes are stopped on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-20}
ROUNDS=${2:-3}
export WARREN_CLUSTER_PORT_OFFSET=${WARREN_CLUSTER_PORT_OFFSET:-300}
O=$WARREN_CLUSTER_PORT_OFFSET
export WARREN_BIN=${WARREN_BIN:-./target/release/warren}
[ -x "$WARREN_BIN" ] || cargo build --release -q -p warren
WORK=$(mktemp -d "${TMPDIR:-/tmp}/warren-cluster-tls.XXXXXX")
export WARREN_CLUSTER_DIR=$WORK/cluster
cleanup() {
  scripts/cluster.sh stop >/dev/null 2>&1 || true
  sleep 1
  rm -rf "$WORK"
}
trap cleanup EXIT

# utime + stime of the three nodes, in clock ticks.
node_cpu_ticks() {
  local total=0
  for f in "$WARREN_CLUSTER_DIR"/n*.pid; do
    total=$(( total + $(awk '{print $14 + $15}' "/proc/$(cat "$f")/stat") ))
  done
  echo "$total"
}

# Formed: each node knows a leader and sees every member running.
formed() {
  for i in 1 2 3; do
    curl -sf -u guest:guest "http://127.0.0.1:$((15671 + O + i))/api/warren/cluster" 2>/dev/null |
      python3 -c 'import json, sys
s = json.load(sys.stdin)
sys.exit(0 if s["metadata"]["leader"] and len(s["members"]) == 3
         and all(m["running"] for m in s["members"]) else 1)' 2>/dev/null || return 1
  done
}

run() {
  local mode=$1 round=$2
  rm -rf "$WARREN_CLUSTER_DIR"
  if [ "$mode" = tls ]; then scripts/cluster.sh start 3 --tls >/dev/null; else scripts/cluster.sh start 3 >/dev/null; fi
  for _ in $(seq 1 300); do formed && break; sleep 0.2; done
  formed || { echo "the $mode cluster did not form" >&2; tail -20 "$WARREN_CLUSTER_DIR"/n1.log >&2; exit 1; }
  cpu0=$(node_cpu_ticks)
  "$WARREN_BIN" perf -h "amqp://guest:guest@127.0.0.1:$((5671 + O + 1))" -x 1 -y 1 -s 1024 \
    -c 1000 -q 1000 -f persistent -u "tls-cost-$round" --quorum-queue --auto-delete false \
    --queue-args x-quorum-initial-group-size=3 -z "$SECONDS_EACH" --warmup-seconds 3 --quiet \
    --json "$WORK/$mode-$round.json" >"$WORK/$mode-$round.out" 2>&1 || {
      cat "$WORK/$mode-$round.out" >&2; exit 1; }
  echo $(( $(node_cpu_ticks) - cpu0 )) >"$WORK/$mode-$round.cpu"
  if [ "$mode" = tls ]; then
    grep -q "cluster link up (TLS)" "$WARREN_CLUSTER_DIR"/n1.log || { echo "tls run without TLS links" >&2; exit 1; }
  fi
  scripts/cluster.sh stop >/dev/null
  sleep 1
  python3 - "$WORK/$mode-$round" "$mode" "$round" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1] + ".json"))
cpu_s = int(open(sys.argv[1] + ".cpu").read()) / int(sys.argv[4])
msgs = r["totals"]["received"] if isinstance(r["totals"], dict) and "received" in r["totals"] else r["receive_rate_avg"] * r["duration_s"]
print(f"{sys.argv[2]:5} round {sys.argv[3]}: sent {r['send_rate_avg']:.0f} msg/s, "
      f"received {r['receive_rate_avg']:.0f} msg/s, latency p50 {r['latency_us']['p50']} us, "
      f"nodes' CPU {cpu_s / max(msgs, 1) * 1e6:.1f} us/msg")
EOF
}

for round in $(seq 1 "$ROUNDS"); do
  # Alternate which goes first, so drift on the shared machine falls on both.
  if [ $((round % 2)) = 1 ]; then order="plain tls"; else order="tls plain"; fi
  for mode in $order; do run "$mode" "$round"; done
done
python3 - "$WORK" "$ROUNDS" <<'EOF'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def mean(mode, field):
    return sum(json.load(open(f"{work}/{mode}-{i}.json"))[field] for i in range(1, rounds + 1)) / rounds
for field in ("send_rate_avg", "receive_rate_avg"):
    p, t = mean("plain", field), mean("tls", field)
    print(f"{field}: plain {p:.0f}, tls {t:.0f} msg/s: tls/plain = {t / p:.3f}")
EOF
