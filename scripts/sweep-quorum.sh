#!/usr/bin/env bash
# Seed 000's increasing-intensity test, scaled to this machine, against a 3-node warren cluster
# and RabbitMQ 3.10's 3-node cluster (one at a time, each fresh), then their leaderboard:
#
#   scripts/sweep-quorum.sh [OUT_DIR]     (default docs/benchmarks/quorum-sweep)
#
# The seed's workload with its shape kept and its size cut to two cores: quorum queues placed
# by the balanced locator, producers and consumers spread over every node with -H, 1 KB
# persistent messages, confirms (-c 1000) and acks (-q 1000), and consumers that take 1 ms per
# message (the seed's 10 ms with 200 consumers). Steps of 30 s after 5 s of warm-up; a step
# passes when it reaches its rate within 5 % and its p99 stays under 1 s.
#
# Writes OUT_DIR/warren and OUT_DIR/rabbitmq (each sweep's report.html, CSV, charts, JSON) and
# OUT_DIR/leaderboard.{md,html,json} with the overlay charts. About 12 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/benchmarks/quorum-sweep}
RATES=${SWEEP_RATES:-2000,5000,10000,15000,20000,25000,30000,40000}
BIN=${WARREN_BIN:-./target/release/warren}
RMQ=../shared/rabbitmq/rabbitmq.sh
[ -n "${WARREN_BIN:-}" ] || cargo build --release -q -p warren
mkdir -p "$OUT"

sweep() {  # name config-name first-port
  local name=$1 config=$2 port=$3
  local uris="amqp://guest:guest@127.0.0.1:$port/%2f,amqp://guest:guest@127.0.0.1:$((port + 1))/%2f,amqp://guest:guest@127.0.0.1:$((port + 2))/%2f"
  rm -rf "${OUT:?}/$name"
  "$BIN" perf sweep -H "$uris" -x 20 -y 100 -L 1000 -s 1024 -c 1000 -q 1000 -f persistent \
    --auto-delete false --queue-args "x-queue-type=quorum,x-queue-leader-locator=balanced" \
    --queue-pattern sweep-%d --queue-pattern-from 1 --queue-pattern-to 10 \
    --rates "$RATES" --step-seconds 30 --warmup-seconds 5 --slo-ms 1000 --nodes 3 \
    --config-name "$config" --out "$OUT/$name" --quiet
}

WDIR=$(mktemp -d -t warren-sweep.XXXXXX)
export WARREN_CLUSTER_DIR=$WDIR WARREN_BIN=$BIN
trap 'scripts/cluster.sh stop >/dev/null 2>&1 || true; rm -rf "$WDIR"' EXIT
scripts/cluster.sh start 3 >/dev/null
for _ in $(seq 1 300); do
  curl -sf -u guest:guest http://127.0.0.1:15672/api/warren/cluster 2>/dev/null \
    | grep -q '"running":true.*"running":true.*"running":true' && break
  sleep 0.2
done
sweep warren "warren, 3 nodes" 5672
scripts/cluster.sh stop >/dev/null
sleep 2

export RMQ_STATE=/tmp/warren-rabbitmq-sweep RMQ_PORT=5700 RMQ_DIST_PORT=25700
trap '"$RMQ" stop >/dev/null 2>&1 || true; rm -rf "$WDIR"' EXIT
"$RMQ" start 3
sweep rabbitmq "RabbitMQ 3.10, 3 nodes" 5700
"$RMQ" stop >/dev/null

"$BIN" perf leaderboard "$OUT/warren/sweep.json" "$OUT/rabbitmq/sweep.json" \
  --out "$OUT"
