#!/usr/bin/env bash
# A local warren cluster on loopback, for trying it out and for tests.
#
#   scripts/cluster.sh start [N]     build, then start N nodes (default 3): node i is n<i>, AMQP on
#                                    5671+i, cluster links on 25671+i, management on 15671+i,
#                                    data in $WARREN_CLUSTER_DIR/n<i> (default ./warren-cluster)
#   scripts/cluster.sh stop          stop every node (SIGTERM)
#   scripts/cluster.sh kill NODE     kill -9 one node (n1, n2, ...)
#   scripts/cluster.sh restart NODE  start one node again with its data
#   scripts/cluster.sh status        warren ctl cluster_status against each node
#   scripts/cluster.sh add           start one more node, n<next>, which joins the running cluster
#   scripts/cluster.sh forget NODE   forget_cluster_node NODE (stop it first), run on n1 or $VIA
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${WARREN_CLUSTER_DIR:-./warren-cluster}
BIN=${WARREN_BIN:-./target/release/warren}

seeds() {
  local n=$1 out=""
  for i in $(seq 1 "$n"); do out+="${out:+,}127.0.0.1:$((25671 + i))"; done
  echo "$out"
}

start_node() {
  local i=$1 n=$2
  mkdir -p "$DIR"
  "$BIN" server --node-name "n$i" --listen "127.0.0.1:$((5671 + i))" \
    --cluster-listen "127.0.0.1:$((25671 + i))" --cluster-seeds "$(seeds "$n")" \
    --data-dir "$DIR/n$i" --management-listen "127.0.0.1:$((15671 + i))" \
    ${WARREN_EXTRA_ARGS:-} >>"$DIR/n$i.log" 2>&1 &
  echo $! >"$DIR/n$i.pid"
  echo "$n" >"$DIR/size"
  echo "n$i: amqp://127.0.0.1:$((5671 + i)) (pid $!, log $DIR/n$i.log)"
}

case "${1:-}" in
  start)
    n=${2:-3}
    [ -n "${WARREN_BIN:-}" ] || cargo build --release -q
    for i in $(seq 1 "$n"); do start_node "$i" "$n"; done
    ;;
  stop)
    for f in "$DIR"/n*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; rm -f "$f"; done
    ;;
  kill)
    node=${2:?which node? e.g. n2}
    kill -9 "$(cat "$DIR/$node.pid")" && rm -f "$DIR/$node.pid"
    ;;
  restart)
    node=${2:?which node? e.g. n2}
    start_node "${node#n}" "$(cat "$DIR/size")"
    ;;
  add)
    # Its cluster address is not among the founders' seeds: it asks them to add it.
    i=$(( $(ls "$DIR"/n*.log | sed 's/.*\/n\([0-9]*\)\.log/\1/' | sort -n | tail -1) + 1 ))
    start_node "$i" "$(cat "$DIR/size")"
    ;;
  forget)
    node=${2:?which node? e.g. n3}
    via=${VIA:-n1}
    "$BIN" ctl --uri "http://guest:guest@127.0.0.1:$((15671 + ${via#n}))" forget_cluster_node "$node"
    ;;
  status)
    for f in "$DIR"/n*.pid; do
      i=$(basename "$f" .pid); i=${i#n}
      "$BIN" ctl --uri "http://guest:guest@127.0.0.1:$((15671 + i))" cluster_status || true
    done
    ;;
  *)
    sed -n '2,13p' "$0"; exit 2
    ;;
esac
