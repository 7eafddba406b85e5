#!/usr/bin/env bash
# Seed 004's persister test side by side: warren perf persister against a fresh warren node and
# against the real RabbitMQ 3.10, same machine, one run: publish N persistent messages of SIZE
# bytes with confirms into a durable queue with no consumer, then drain it.
#
#   scripts/compare-persister.sh [N] [SIZE] [extra persister flags, e.g. --lazy]
#   default: 1000000 1024
#
# Prints per broker and phase: rate and bytes the broker wrote per payload byte (its
# /proc/PID/io), then the ratios warren/RabbitMQ. Reports land in target/compare-persister/.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}; SIZE=${2:-1024}; shift 2 || shift $#
WPORT=${WARREN_PORT:-5698}
OUT=target/compare-persister

. scripts/side-by-side.sh

echo "persister: $N x $SIZE B; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "started: $WSESSION"
./target/release/warren perf persister -h "amqp://guest:guest@127.0.0.1:$WPORT" --broker-pid "$WPID" \
  -C "$N" -s "$SIZE" --out "$OUT/warren" "$@" >/dev/null
./target/release/warren perf persister -h "amqp://guest:guest@127.0.0.1:5680" --broker-pid "$RPID" \
  -C "$N" -s "$SIZE" --out "$OUT/rabbitmq" "$@" >/dev/null
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
r = {b: {p["name"]: p for p in json.load(open(f"{out}/{b}/persister.json"))["phases"]}
     for b in ("warren", "rabbitmq")}
for b in r:
    for name, p in r[b].items():
        print(f"{b:8} {name:8} {p['messages']:>9} msgs {p['rate_msg_s']:>10,.0f} msg/s "
              f"wrote {p['write_bytes_per_payload_byte']:.2f} B/payload B, "
              f"read {p['read_bytes_per_payload_byte']:.2f}")
for name in r["warren"]:
    if name in r["rabbitmq"]:
        w, q = r["warren"][name], r["rabbitmq"][name]
        print(f"ratio {name}: rate warren/rabbitmq = {w['rate_msg_s'] / q['rate_msg_s']:.2f}x, "
              f"write amplification {w['write_bytes_per_payload_byte']:.2f} vs "
              f"{q['write_bytes_per_payload_byte']:.2f}")
PY
