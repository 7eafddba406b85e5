#!/usr/bin/env bash
# A local warren cluster on loopback, for trying it out and for tests.
#
#   scripts/cluster.sh start [N] [--tls]
#                                    build, then start N nodes (default 3): node i is n<i>, AMQP on
#                                    5671+i, cluster links on 25671+i, management on 15671+i,
#                                    data in $WARREN_CLUSTER_DIR/n<i> (default ./warren-cluster);
#                                    --tls: links over TLS with mutual authentication, with a CA and
#                                    a certificate per node made in $WARREN_CLUSTER_DIR/tls (openssl;
#                                    restart and add use them too)
#   scripts/cluster.sh stop          stop every node (SIGTERM)
#   scripts/cluster.sh kill NODE     kill -9 one node (n1, n2, ...)
#   scripts/cluster.sh restart NODE  start one node again with its data
#   scripts/cluster.sh status        warren ctl cluster_status against each node
#   scripts/cluster.sh add           start one more node, n<next>, which joins the running cluster
#   scripts/cluster.sh forget NODE   forget_cluster_node NODE (stop it first), run on n1 or $VIA
# WARREN_CLUSTER_PORT_OFFSET (default 0) moves every port up by that much, for a cluster beside
# another one (AMQP on 5671+OFFSET+i, and so on).
# Each node runs in a session of its own (`setsid`), as ../shared/rabbitmq/rabbitmq.sh starts
# RabbitMQ's: with the kernel's autogroup scheduling, a node left in the caller's session shares
# one CPU group with whatever else runs there (a load generator, say), which flatters a benchmark
# (issue 37). WARREN_SESSION=shared keeps the nodes in the caller's session, to measure that.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${WARREN_CLUSTER_DIR:-./warren-cluster}
BIN=${WARREN_BIN:-./target/release/warren}
O=${WARREN_CLUSTER_PORT_OFFSET:-0}
# Backgrounded without job control, a command is no process group leader, so setsid execs in
# place and $! stays the node's own PID.
case "${WARREN_SESSION:-own}" in
  own) SESSION=setsid ;;
  shared) SESSION= ;;
  *) echo "WARREN_SESSION is own or shared, not '$WARREN_SESSION'" >&2; exit 2 ;;
esac

seeds() {
  local n=$1 out=""
  for i in $(seq 1 "$n"); do out+="${out:+,}127.0.0.1:$((25671 + O + i))"; done
  echo "$out"
}

# A CA and one certificate per node (both TLS usages: a node accepts links and opens them).
node_cert() {
  local i=$1 tls=$DIR/tls
  mkdir -p "$tls"
  if [ ! -f "$tls/ca.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
      -subj "/CN=warren cluster CA" -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
  fi
  if [ ! -f "$tls/n$i.pem" ]; then
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=n$i" \
      -keyout "$tls/n$i.key" -out "$tls/n$i.csr" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' >"$tls/ext"
    openssl x509 -req -in "$tls/n$i.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
      -CAcreateserial -days 30 -extfile "$tls/ext" -out "$tls/n$i.pem" 2>/dev/null
    rm -f "$tls/n$i.csr"
  fi
}

tls_args() {
  local i=$1
  [ -f "$DIR/tls-on" ] || return 0
  node_cert "$i"
  echo "--cluster-tls-cert $DIR/tls/n$i.pem --cluster-tls-key $DIR/tls/n$i.key --cluster-tls-ca $DIR/tls/ca.pem"
}

start_node() {
  local i=$1 n=$2 tls
  mkdir -p "$DIR"
  # Here, not inside the backgrounded command: nodes' certificates are made one at a time.
  tls=$(tls_args "$i")
  # shellcheck disable=SC2086 # the TLS arguments are words
  $SESSION "$BIN" server $tls --node-name "n$i" --listen "127.0.0.1:$((5671 + O + i))" \
    --cluster-listen "127.0.0.1:$((25671 + O + i))" --cluster-seeds "$(seeds "$n")" \
    --data-dir "$DIR/n$i" --management-listen "127.0.0.1:$((15671 + O + i))" \
    ${WARREN_EXTRA_ARGS:-} >>"$DIR/n$i.log" 2>&1 &
  echo $! >"$DIR/n$i.pid"
  echo "$n" >"$DIR/size"
  echo "n$i: amqp://127.0.0.1:$((5671 + O + i)) (pid $!, log $DIR/n$i.log)"
}

case "${1:-}" in
  start)
    n=3 tls=0
    for a in "${@:2}"; do
      case "$a" in --tls) tls=1 ;; *) n=$a ;; esac
    done
    mkdir -p "$DIR"
    if [ "$tls" = 1 ]; then touch "$DIR/tls-on"; else rm -f "$DIR/tls-on"; fi
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
    "$BIN" ctl --uri "http://guest:guest@127.0.0.1:$((15671 + O + ${via#n}))" forget_cluster_node "$node"
    ;;
  status)
    for f in "$DIR"/n*.pid; do
      i=$(basename "$f" .pid); i=${i#n}
      "$BIN" ctl --uri "http://guest:guest@127.0.0.1:$((15671 + O + i))" cluster_status || true
    done
    ;;
  *)
    sed -n '2,23p' "$0"; exit 2
    ;;
esac
