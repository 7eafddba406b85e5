#!/usr/bin/env bash
# Side-by-side on 3-node clusters: the official RabbitMQ PerfTest against a local warren cluster
# (scripts/cluster.sh, AMQP 5672-5674) and a RabbitMQ 3.10 cluster (../shared/rabbitmq/rabbitmq.sh
# start 3, AMQP 5700-5702), same workload, one run. The queue is declared on node 1; PerfTest
# connects to node 1 (local: the client on the queue's node) and then to node 2 (remote: every
# publish, delivery and ack crosses the cluster link), as seed 003 compares.
#
#   scripts/compare-cluster-perftest.sh [SECONDS] [PerfTest flags...]
#   default workload: -x 1 -y 1 -s 1024 -c 1000 -q 1000 -f persistent (confirms, acks, 1 KB)
#   QUEUE_ARGS='{"x-queue-type": "quorum"}' scripts/compare-cluster-perftest.sh   (quorum queues:
#   declared on node 1, which leads them with both brokers' client-local placement)
#
# Prints one line per broker and placement: rates, consumer latency percentiles, and the CPU
# seconds of all three nodes together per message; then warren/RabbitMQ ratios. Needs a free
# 5672-5674, 15672-15674, 25672-25674 and the interop venv (scripts/interop-setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN=${1:-20}; shift || true
FLAGS=("$@"); [ ${#FLAGS[@]} -gt 0 ] || FLAGS=(-x 1 -y 1 -s 1024 -c 1000 -q 1000 -f persistent)
RMQ=../shared/rabbitmq/rabbitmq.sh
TICKS=$(getconf CLK_TCK)
PY=.venv/bin/python
QUEUE_ARGS=${QUEUE_ARGS:-"{}"}
[ -x "$PY" ] || ./scripts/interop-setup.sh >/dev/null
export RMQ_STATE=/tmp/warren-rabbitmq-cluster RMQ_PORT=5700 RMQ_DIST_PORT=25700
export WARREN_CLUSTER_DIR
WARREN_CLUSTER_DIR=$(mktemp -d -t warren-compare-cluster.XXXXXX)

cargo build --release -q -p warren
cleanup() {
  ./scripts/cluster.sh stop >/dev/null 2>&1 || true
  "$RMQ" stop >/dev/null 2>&1 || true
  rm -rf "$WARREN_CLUSTER_DIR"
}
trap cleanup EXIT
WARREN_BIN=./target/release/warren ./scripts/cluster.sh start 3 >/dev/null
"$RMQ" start 3 >/dev/null

declare_on_node1() {  # port queue
  "$PY" - "$1" "$2" "$QUEUE_ARGS" <<'PY'
import json, sys, time, pika
port, queue, args = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
deadline = time.monotonic() + 60
while True:
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        conn.channel().queue_declare(queue, durable=True, arguments=args)
        conn.close()
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
PY
}

cpu_ticks() {  # pid...
  local total=0 p
  for p in "$@"; do total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$total"
}

# One PID per line (RabbitMQ's PID files end without a newline).
WPIDS=$(for i in 1 2 3; do echo "$(cat "$WARREN_CLUSTER_DIR/n$i.pid")"; done)
RPIDS=$(for i in 1 2 3; do echo "$(cat "$RMQ_STATE/rabbit$i.pid")"; done)

run() {  # name port pids...
  local name=$1 port=$2; shift 2
  local queue="perf-$name" out t0 t1 sent recv lat cpu
  declare_on_node1 "$((port - ${name##*_} + 1))" "$queue"
  t0=$(cpu_ticks "$@")
  out=$("$RMQ" perftest -h "amqp://guest:guest@127.0.0.1:$port" -z "$SECONDS_RUN" -u "$queue" -p \
    "${FLAGS[@]}" 2>&1 | tail -5)
  t1=$(cpu_ticks "$@")
  sent=$(echo "$out" | sed -nE 's/.*sending rate avg: ([0-9]+) msg\/s.*/\1/p')
  recv=$(echo "$out" | sed -nE 's/.*receiving rate avg: ([0-9]+) msg\/s.*/\1/p')
  lat=$(echo "$out" | sed -nE 's/.*consumer latency min\/median\/75th\/95th\/99th ([0-9\/]+) .*/\1/p')
  cpu=$(awk -v a="$t0" -v b="$t1" -v t="$TICKS" -v s="$sent" -v d="$SECONDS_RUN" \
    'BEGIN { printf "%.2f", (b - a) / t * 1000000 / (s * d) }')
  echo "${name%_*} node${name##*_} sent=$sent recv=$recv latency_us(min/p50/p75/p95/p99)=$lat cluster_cpu_us_per_msg=$cpu"
  eval "${name}_sent=$sent ${name}_cpu=$cpu"
}

echo "workload: ${FLAGS[*]} for ${SECONDS_RUN}s, queue on node 1; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "started: each node of both brokers in a session of its own (WARREN_SESSION=${WARREN_SESSION:-own})"
# shellcheck disable=SC2086
run warren_1 5672 $WPIDS
# shellcheck disable=SC2086
run rabbitmq_1 5700 $RPIDS
# shellcheck disable=SC2086
run warren_2 5673 $WPIDS
# shellcheck disable=SC2086
run rabbitmq_2 5701 $RPIDS
for n in 1 2; do
  eval "ws=\$warren_${n}_sent rs=\$rabbitmq_${n}_sent wc=\$warren_${n}_cpu rc=\$rabbitmq_${n}_cpu"
  # shellcheck disable=SC2154
  awk -v n="$n" -v ws="$ws" -v rs="$rs" -v wc="$wc" -v rc="$rc" 'BEGIN {
    printf "clients on node %d: warren/RabbitMQ rate %.2fx, CPU per message %.3fx\n", n, ws / rs, wc / rc }'
done
