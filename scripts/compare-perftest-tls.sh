#!/usr/bin/env bash
# Side-by-side over TLS: the official RabbitMQ PerfTest with amqps:// against warren and against
# the real RabbitMQ 3.10, both serving the same freshly made certificate, same workload, one run,
# with each broker's CPU per message from /proc.
#
#   scripts/compare-perftest-tls.sh [SECONDS] [PerfTest flags...]
#   default workload: -x 1 -y 1 -s 1024 -c 1000 -q 1000 -f persistent -u perf-tls -ad false
#   (1 KB persistent messages to a durable queue, publisher confirms, consumer acks)
#
# The certificates (a CA and a server certificate for 127.0.0.1, EC P-256) are made with the
# openssl CLI in a temporary directory and removed at exit. Neither broker asks for a client
# certificate (PerfTest's amqps:// trusts any server certificate). warren listens on
# $WARREN_TLS_PORT (default 5698); RabbitMQ is a node of its own on $RMQ_TLS_PERF_PORT+1 (default
# 5687, plain on 5686), stopped at exit. Prints one line per broker, then the ratios
# warren/RabbitMQ: message rate and broker CPU per message. With PLAIN_TOO=1 the same workload
# also runs over plain AMQP on both (warren on $WARREN_PORT, default 5699), to show what TLS
# costs each broker.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SECONDS_RUN=${1:-20}; shift || true
FLAGS=("$@"); [ ${#FLAGS[@]} -gt 0 ] || FLAGS=(-x 1 -y 1 -s 1024 -c 1000 -q 1000 -f persistent -u perf-tls -ad false)
WTLS=${WARREN_TLS_PORT:-5698}
WPORT=${WARREN_PORT:-5699}
RPORT=${RMQ_TLS_PERF_PORT:-5686}
RTLS=$((RPORT + 1))
RMQ=$ROOT/../shared/rabbitmq/rabbitmq.sh
TICKS=$(getconf CLK_TCK)

WORK=$(mktemp -d)
export RMQ_PORT=$RPORT RMQ_DIST_PORT=$((RPORT + 20000)) RMQ_STATE=$WORK/rabbitmq
cleanup() {
  [ -n "${WPID:-}" ] && kill "$WPID" 2>/dev/null || true
  "$RMQ" stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# Certificates: a CA, and a server certificate for 127.0.0.1 / localhost signed by it.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=warren perf CA" -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -keyout "$WORK/server.key" -out "$WORK/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$WORK/san.ext"
openssl x509 -req -in "$WORK/server.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial \
  -days 2 -extfile "$WORK/san.ext" -out "$WORK/server.pem" 2>/dev/null

cargo build --release -p warren >/dev/null 2>&1
# In a session of its own, as rabbitmq.sh starts RabbitMQ (autogroup scheduling: issue 37).
setsid ./target/release/warren server --listen "127.0.0.1:$WPORT" --tls-listen "127.0.0.1:$WTLS" \
  --tls-cert "$WORK/server.pem" --tls-key "$WORK/server.key" \
  --data-dir "$WORK/warren" --management-listen none >"$WORK/warren.log" 2>&1 &
WPID=$!
for _ in $(seq 50); do ss -ltn | grep -q ":$WTLS " && break; sleep 0.1; done

RMQ_EXTRA_CONF="listeners.ssl.default = 127.0.0.1:$RTLS
ssl_options.cacertfile = $WORK/ca.pem
ssl_options.certfile = $WORK/server.pem
ssl_options.keyfile = $WORK/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false" "$RMQ" start >/dev/null
RPID=$(ss -ltnp | grep ":$RTLS " | sed -E 's/.*pid=([0-9]+).*/\1/' | head -1)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

run() {  # name pid port [scheme]
  local name=$1 pid=$2 port=$3 scheme=${4:-amqps} out t0 t1 sent recv lat cpu per_msg
  t0=$(cpu_ticks "$pid")
  out=$("$RMQ" perftest -h "$scheme://guest:guest@127.0.0.1:$port" -z "$SECONDS_RUN" "${FLAGS[@]}" 2>&1 | tail -5)
  t1=$(cpu_ticks "$pid")
  sent=$(echo "$out" | sed -nE 's/.*sending rate avg: ([0-9]+) msg\/s.*/\1/p')
  recv=$(echo "$out" | sed -nE 's/.*receiving rate avg: ([0-9]+) msg\/s.*/\1/p')
  lat=$(echo "$out" | sed -nE 's/.*consumer latency min\/median\/75th\/95th\/99th ([0-9\/]+) .*/\1/p')
  if [ -z "$sent" ]; then echo "$name: PerfTest failed:"; echo "$out"; exit 1; fi
  cpu=$(awk -v a="$t0" -v b="$t1" -v t="$TICKS" 'BEGIN { printf "%.2f", (b - a) / t }')
  per_msg=$(awk -v c="$cpu" -v s="$sent" -v d="$SECONDS_RUN" 'BEGIN { printf "%.2f", c * 1000000 / (s * d) }')
  echo "$name ($scheme) sent=$sent recv=$recv latency_us(min/p50/p75/p95/p99)=$lat broker_cpu_s=$cpu cpu_us_per_msg=$per_msg"
  eval "${name}_sent=$sent ${name}_cpu=$per_msg"
}

echo "workload over TLS: ${FLAGS[*]} for ${SECONDS_RUN}s; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
run warren "$WPID" "$WTLS"
run rabbitmq "$RPID" "$RTLS"
awk -v ws="$warren_sent" -v rs="$rabbitmq_sent" -v wc="$warren_cpu" -v rc="$rabbitmq_cpu" \
  'BEGIN { printf "ratio (TLS): rate warren/rabbitmq = %.2fx, CPU per message warren/rabbitmq = %.3f\n", ws / rs, wc / rc }'
if [ "${PLAIN_TOO:-0}" = 1 ]; then
  tls_warren_cpu=$warren_cpu tls_rabbitmq_cpu=$rabbitmq_cpu
  run warren "$WPID" "$WPORT" amqp
  run rabbitmq "$RPID" "$RPORT" amqp
  awk -v ws="$warren_sent" -v rs="$rabbitmq_sent" -v wc="$warren_cpu" -v rc="$rabbitmq_cpu" \
    -v tw="$tls_warren_cpu" -v tr="$tls_rabbitmq_cpu" \
    'BEGIN { printf "ratio (plain): rate warren/rabbitmq = %.2fx, CPU per message warren/rabbitmq = %.3f; TLS/plain CPU per message: warren %.2f, rabbitmq %.2f\n", ws / rs, wc / rc, tw / wc, tr / rc }'
fi
