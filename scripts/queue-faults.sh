#!/usr/bin/env bash
# The long message-safety run of issue 11's Proof: tests/interop/python/queue_jepsen.py on a
# 3-node cluster in network namespaces (needs root and `ip netns`), a fault every 2-6 s for an
# hour by default (at least one fault per 12 s of run is required: 300 in an hour), then heal,
# drain and check (lost, unexpected, corrupt; duplicates and redeliveries counted).
#
#   sudo scripts/queue-faults.sh [SECONDS (3600)] [queue_jepsen.py options...]
#   sudo scripts/queue-faults.sh 3600 --queue-type quorum --strict-acks
#   sudo scripts/queue-faults.sh 600 --seed 123 --two --keep
#
# Prints the seed first (--seed replays the fault schedule) and `[queue-jepsen] summary: ...`
# last; exits 1 on a violation, keeping the nodes' logs and data (path printed).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-3600}
shift || true
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in .venv/bin/python ../main/.venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY=$candidate; break; fi
  done
fi
[ -x "${WARREN_BIN:-target/release/warren}" ] || cargo build --release
# 40 msg/s per publisher keeps an hour's ledger (~430,000 messages) small in memory.
exec "$PY" tests/interop/python/queue_jepsen.py --duration "$duration" \
  --faults-min $((${duration%.*} / 12)) --rate 40 "$@"
