#!/usr/bin/env bash
# Runs the warren perf toolkit's tests against a real warren broker started here, so the
# broker-dependent tests (counted run, rate-limited run, sweep, scale grid, persister, Ctrl-C)
# run in CI instead of skipping.
#
#   scripts/perf-tests.sh [extra cargo test args after --]
#
# Uses target/release/warren (built if missing, or $WARREN_BIN), on a free loopback port with a
# fresh data directory and no management listener; the broker is killed on exit. Tests run one
# at a time (--test-threads=1) so their rates and /proc samples are not disturbed by each other.
# The sweep and persister tests find the broker's pid by its listening port through /proc;
# WARREN_PERF_TEST_BROKER_PID makes them check that they found this one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
start=$(date +%s)

if [ -z "${WARREN_BIN:-}" ]; then
  if [ ! -x target/release/warren ]; then
    echo "[perf-tests] building warren (release)" >&2
  fi
  # A no-op when up to date; rebuilds when the sources changed since the last build.
  cargo build --release -p warren
  WARREN_BIN=$ROOT/target/release/warren
fi

# A port nothing listens on: bind port 0, read what the kernel chose, release it.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
data_dir=$(mktemp -d -t warren-perf-tests.XXXXXX)
log=$data_dir.log
pid=

cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$data_dir"
  rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# `warren perf stream`'s tests run too once warren serves the stream protocol (--stream-listen).
stream_args=()
stream_uri=
if "$WARREN_BIN" server --help 2>/dev/null | grep -q -- '--stream-listen'; then
  stream_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  stream_args=(--stream-listen "127.0.0.1:$stream_port")
  stream_uri="rabbitmq-stream://guest:guest@127.0.0.1:$stream_port/%2f"
fi

"$WARREN_BIN" server --listen "127.0.0.1:$port" --data-dir "$data_dir" \
  --management-listen none --log warn "${stream_args[@]}" >"$log" 2>&1 &
pid=$!

broker_died() {
  echo "[perf-tests] warren (pid $pid) exited $1; its log:" >&2
  cat "$log" >&2
  exit 1
}

# Wait until the port accepts a connection (at most 30 s), failing at once if warren dies.
for _ in $(seq 300); do
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" && rc=0 || rc=$?
    broker_died "with code $rc before listening"
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    break
  fi
  sleep 0.1
done
if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "[perf-tests] warren (pid $pid) did not accept connections on 127.0.0.1:$port within 30 s" >&2
  cat "$log" >&2
  exit 1
fi
echo "[perf-tests] warren pid $pid listening on 127.0.0.1:$port, data in $data_dir" >&2

status=0
WARREN_PERF_TEST_URI="amqp://guest:guest@127.0.0.1:$port/%2f" WARREN_PERF_TEST_BROKER_PID=$pid \
  WARREN_PERF_TEST_STREAM_URI="$stream_uri" cargo test -p warren-perf "$@" -- --test-threads=1 || status=$?

# A broker that died under the tests explains their failures better than the tests do.
if ! kill -0 "$pid" 2>/dev/null; then
  wait "$pid" && rc=0 || rc=$?
  broker_died "with code $rc during the tests"
fi
echo "[perf-tests] done in $(($(date +%s) - start)) s" >&2
exit $status
