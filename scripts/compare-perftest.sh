#!/usr/bin/env bash
# Side-by-side: the official RabbitMQ PerfTest against warren and against the real RabbitMQ 3.10,
# same workload, same machine, one run, with each broker's CPU per message from /proc.
#
#   scripts/compare-perftest.sh [SECONDS] [PerfTest flags...]
#   default workload: -x 1 -y 1 -s 1024 -c 1000 -q 1000 (confirms, acks, 1 KB transient)
#   e.g.  scripts/compare-perftest.sh 30 -x 1 -y 1 -s 1024 -c 1000 -q 1000 -f persistent
#   WARREN_SESSION=shared: warren in this script's session (see scripts/side-by-side.sh)
#
# Prints one line per broker: rates, consumer latency percentiles, broker CPU seconds and CPU
# microseconds per message, write amplification (bytes the broker wrote to disk, /proc/PID/io,
# over the body bytes published), then the ratios warren/RabbitMQ.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN=${1:-20}; shift || true
FLAGS=("$@"); [ ${#FLAGS[@]} -gt 0 ] || FLAGS=(-x 1 -y 1 -s 1024 -c 1000 -q 1000)
WPORT=${WARREN_PORT:-5699}
TICKS=$(getconf CLK_TCK)

. scripts/side-by-side.sh

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
written() { awk '/^write_bytes/ {print $2}' "/proc/$1/io"; }
SIZE=12  # PerfTest's default body size
for ((i = 0; i < ${#FLAGS[@]} - 1; i++)); do
  [ "${FLAGS[$i]}" = -s ] || [ "${FLAGS[$i]}" = --size ] && SIZE=${FLAGS[$((i + 1))]}
done

run() {  # name pid port
  local name=$1 pid=$2 port=$3 out t0 t1 w0 w1
  t0=$(cpu_ticks "$pid"); w0=$(written "$pid")
  out=$("$RMQ" perftest -h "amqp://guest:guest@127.0.0.1:$port" -z "$SECONDS_RUN" "${FLAGS[@]}" 2>&1 | tail -5)
  t1=$(cpu_ticks "$pid")
  sleep 3; w1=$(written "$pid")  # writes a broker defers (index, segments) count too
  local sent recv lat cpu
  sent=$(echo "$out" | sed -nE 's/.*sending rate avg: ([0-9]+) msg\/s.*/\1/p')
  recv=$(echo "$out" | sed -nE 's/.*receiving rate avg: ([0-9]+) msg\/s.*/\1/p')
  lat=$(echo "$out" | sed -nE 's/.*consumer latency min\/median\/75th\/95th\/99th ([0-9\/]+) .*/\1/p')
  cpu=$(awk -v a="$t0" -v b="$t1" -v t="$TICKS" 'BEGIN { printf "%.2f", (b - a) / t }')
  local per_msg
  per_msg=$(awk -v c="$cpu" -v s="$sent" -v d="$SECONDS_RUN" 'BEGIN { printf "%.2f", c * 1000000 / (s * d) }')
  local wa
  wa=$(awk -v a="$w0" -v b="$w1" -v s="$sent" -v d="$SECONDS_RUN" -v z="$SIZE" 'BEGIN { printf "%.3f", (b - a) / (s * d * z) }')
  echo "$name sent=$sent recv=$recv latency_us(min/p50/p75/p95/p99)=$lat broker_cpu_s=$cpu cpu_us_per_msg=$per_msg write_amplification=$wa"
  eval "${name}_sent=$sent ${name}_cpu=$per_msg ${name}_wa=$wa"
}

echo "workload: ${FLAGS[*]} for ${SECONDS_RUN}s; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "started: $WSESSION"
run warren "$WPID" "$WPORT"
run rabbitmq "$RPID" 5680
awk -v ws="$warren_sent" -v rs="$rabbitmq_sent" -v wc="$warren_cpu" -v rc="$rabbitmq_cpu" \
  -v ww="$warren_wa" -v rw="$rabbitmq_wa" \
  'BEGIN { printf "ratio: rate warren/rabbitmq = %.2fx, CPU per message warren/rabbitmq = %.3f, write amplification %.3f vs %.3f\n", ws / rs, wc / rc, ww, rw }'
