#!/usr/bin/env bash
# A replicated stream beside a quorum queue on a local 3-node cluster, each node in a session of
# its own (scripts/cluster.sh's setsid), measured by warren perf with the same workload: 2
# confirming producers (500 unconfirmed at most each), persistent, 12 B and 1 KB, 20 s each.
# Prints each run's rate and confirm latency percentiles, then the first node's disk use.
#
#   scripts/stream-cluster-bench.sh
#
# Ports: scripts/cluster.sh's moved up by WARREN_CLUSTER_PORT_OFFSET (default 30000 here: AMQP
# 35672-35674, management 45672-45674); data in $WARREN_CLUSTER_DIR (a fresh temporary dir by
# default), deleted at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
export WARREN_BIN=${WARREN_BIN:-$PWD/target/release/warren}
export WARREN_CLUSTER_PORT_OFFSET=${WARREN_CLUSTER_PORT_OFFSET:-30000}
export WARREN_CLUSTER_DIR=${WARREN_CLUSTER_DIR:-$(mktemp -d /tmp/warren-stream-bench.XXXXXX)}
O=$WARREN_CLUSTER_PORT_OFFSET
AMQP=$((5672 + O)) HTTP=$((15672 + O))
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in .venv/bin/python ../main/.venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY=$candidate; break; fi
  done
fi
[ -x "$WARREN_BIN" ] || cargo build --release -p warren
trap 'scripts/cluster.sh stop; sleep 2; rm -rf "$WARREN_CLUSTER_DIR"' EXIT
scripts/cluster.sh start 3 >/dev/null
formed=0
for _ in $(seq 1 120); do
  if curl -s -u guest:guest "http://127.0.0.1:$HTTP/api/warren/cluster" | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
ok = s["metadata"]["leader"] and all(m["running"] for m in s["members"]) \
    and len(s["metadata"]["members"]) == 3
sys.exit(0 if ok else 1)' 2>/dev/null; then formed=1; break; fi
  sleep 0.5
done
[ "$formed" = 1 ] || { echo "the cluster did not form" >&2; exit 1; }

declare_queue() {
  "$PY" - "$AMQP" "$1" "$2" <<'PYEOF'
import sys, pika
c = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=int(sys.argv[1])))
c.channel().queue_declare(sys.argv[2], durable=True, arguments={"x-queue-type": sys.argv[3]})
c.close()
PYEOF
}

run() { # queue type producers size
  declare_queue "$1" "$2"
  echo "== $2, producers=$3, size=$4 B"
  "$WARREN_BIN" perf -h "amqp://127.0.0.1:$AMQP" -u "$1" -p -x "$3" -y 0 -s "$4" -c 500 \
    -f persistent -z 20 2>&1 | grep -E "sending rate avg|confirm latency"
}
run s12 stream 2 12
run q12 quorum 2 12
run s1k stream 2 1000
run q1k quorum 2 1000
du -sh "$WARREN_CLUSTER_DIR"/n1/wal "$WARREN_CLUSTER_DIR"/n1/streams
