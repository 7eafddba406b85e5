#!/usr/bin/env bash
# The container image, tested as an operator uses it (CI runs it from scripts/test.sh):
#   1. builds the image with scripts/image.sh from a release binary (WARREN_BIN, default
#      target/release/warren; built first if missing);
#   2. one container with WARREN_DEFAULT_USER/_PASS: a pika round trip from the host through
#      a published port (so from outside the container's loopback), guest refused, `warren ctl
#      status` and `warren perf` inside it, then a stop (SIGTERM) and a start that keep a
#      persistent message in the data volume; with WARREN_LOOPBACK_USERS=guest, guest refused
#      from outside and let in by `warren ctl` inside;
#   3. one container as the image comes: guest/guest from outside, as in RabbitMQ's image;
#   4. three containers on a podman network the test creates, clustered by container names
#      (WARREN_NODE_NAME, WARREN_CLUSTER_SEEDS) with a default user: a quorum queue's round
#      trip through each node, guest refused through each, and `warren ctl cluster_status`
#      inside one showing three running members with their names as cluster addresses.
# Every container, network, volume and image it made is removed at the end, failed or not.
# Installs podman, runc and busybox-static with apt-get when missing (as root, as CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${WARREN_BIN:-target/release/warren}
[ -x "$bin" ] || cargo build --release -p warren

# One run's names, so that two runs on one machine (or a run beside an engineer's own
# containers) never touch each other's.
run="wct$$"
tag="localhost/warren-container-test:$run"
network="$run-net"
containers=()
log() { echo "[container-test] $*" >&2; }

# Here podman runs with runc and cgroupfs (crun refuses this kernel's hybrid cgroups), and
# containers get the limits a broker needs.
pod() { podman --runtime runc --cgroup-manager=cgroupfs "$@"; }
run_args=(--ulimit nofile=16384:16384 --ulimit nproc=4096:4096)

cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    for c in "${containers[@]}"; do
      log "logs of $c (the test failed):"
      pod logs --tail 40 "$c" >&2 2>&1 || true
    done
  fi
  for c in "${containers[@]}"; do pod rm -f -v -t 2 "$c" >/dev/null 2>&1 || true; done
  pod network rm -f "$network" >/dev/null 2>&1 || true
  pod rmi -f "$tag" >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT

scripts/image.sh --binary "$bin" --tag "$tag"

# pika, pinned as the interop suite pins it, in the venv that suite uses.
if ! .venv/bin/python -c "import pika" 2>/dev/null; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check "$(grep '^pika==' tests/interop/python/requirements.txt)"
fi
roundtrip() { .venv/bin/python tests/container/roundtrip.py "$@"; }

# The host port podman picked for a container's port.
host_port() { pod port "$1" "$2/tcp" | head -n1 | sed 's/.*://'; }

# Waits until the node in container $1 answers `warren ctl status` from inside.
await_node() {
  for _ in $(seq 1 60); do
    if pod exec "$1" warren ctl status >/dev/null 2>&1; then return 0; fi
    if [ "$(pod inspect -f '{{.State.Running}}' "$1")" != true ]; then
      log "container $1 stopped"; return 1
    fi
    sleep 1
  done
  log "container $1 never answered warren ctl status"; return 1
}

log "one container, default user from WARREN_DEFAULT_USER/_PASS"
single="$run-single"
containers+=("$single")
pod run -d --name "$single" "${run_args[@]}" -p 127.0.0.1::5672 \
  -e WARREN_DEFAULT_USER=operator -e WARREN_DEFAULT_PASS=container-secret "$tag" >/dev/null
await_node "$single"
amqp="127.0.0.1:$(host_port "$single" 5672)"
roundtrip operator container-secret classic "$amqp"
roundtrip --refused guest guest "$amqp"
# Captured first: `grep -q` stops reading at its match, and pipefail would count the writer's
# closed pipe against it.
status=$(pod exec "$single" warren ctl status)
grep -q '"node"' <<<"$status" || { log "warren ctl status printed no node"; exit 1; }
pod exec "$single" warren perf -h amqp://operator:container-secret@127.0.0.1:5672 \
  -x 1 -y 1 -s 100 -z 2 >/dev/null
log "warren ctl status and warren perf ran inside $single"

# A persistent message left in a durable queue survives a stop and a start: the volume holds
# the data and SIGTERM stops the node in time (podman would SIGKILL it after 20 s).
.venv/bin/python - "$amqp" <<'PY'
import sys, pika
host, port = sys.argv[1].rsplit(":", 1)
conn = pika.BlockingConnection(pika.ConnectionParameters(host, int(port),
    credentials=pika.PlainCredentials("operator", "container-secret")))
ch = conn.channel()
ch.queue_declare("kept", durable=True)
ch.confirm_delivery()
ch.basic_publish("", "kept", b"across a restart", pika.BasicProperties(delivery_mode=2))
conn.close()
PY
started=$(date +%s)
pod stop -t 20 "$single" >/dev/null
log "stopped $single in $(( $(date +%s) - started )) s, exit code $(pod inspect -f '{{.State.ExitCode}}' "$single")"
[ "$(pod inspect -f '{{.State.ExitCode}}' "$single")" = 0 ] || { log "warren did not stop cleanly on SIGTERM"; exit 1; }
pod start "$single" >/dev/null
await_node "$single"
amqp="127.0.0.1:$(host_port "$single" 5672)"
.venv/bin/python - "$amqp" <<'PY'
import sys, time, pika
host, port = sys.argv[1].rsplit(":", 1)
conn = pika.BlockingConnection(pika.ConnectionParameters(host, int(port),
    credentials=pika.PlainCredentials("operator", "container-secret")))
ch = conn.channel()
method, _, body = ch.basic_get("kept", auto_ack=True)
assert body == b"across a restart", f"after the restart the queue gave {body!r}"
conn.close()
print("[container-test] the persistent message survived the stop and start", file=sys.stderr)
PY

log "guest/guest from outside the container, as in RabbitMQ's image"
open="$run-open"
containers+=("$open")
pod run -d --name "$open" "${run_args[@]}" -p 127.0.0.1::5672 "$tag" >/dev/null
await_node "$open"
roundtrip guest guest classic "127.0.0.1:$(host_port "$open" 5672)"
pod rm -f -v -t 2 "$open" >/dev/null

log "guest held to loopback again (WARREN_LOOPBACK_USERS=guest, RabbitMQ's own default)"
held="$run-held"
containers+=("$held")
pod run -d --name "$held" "${run_args[@]}" -p 127.0.0.1::5672 -e WARREN_LOOPBACK_USERS=guest \
  "$tag" >/dev/null
await_node "$held"   # warren ctl inside logs in as guest over the container's loopback
roundtrip --refused guest guest "127.0.0.1:$(host_port "$held" 5672)"
held_log=$(pod logs "$held" 2>&1)
grep -q "user 'guest' may only connect via localhost" <<<"$held_log" \
  || { log "no loopback refusal in $held's log"; exit 1; }
pod rm -f -v -t 2 "$held" >/dev/null

log "three containers clustered on network $network"
pod network create "$network" >/dev/null
names=("$run-n1" "$run-n2" "$run-n3")
seeds=$(printf '%s:25672,' "${names[@]}")
seeds=${seeds%,}
# Each node listens on every interface (the entrypoint's default once seeds are given) and
# advertises its host name, the container's name, which the network's DNS resolves.
for name in "${names[@]}"; do
  containers+=("$name")
  pod run -d --name "$name" --hostname "$name" --network "$network" "${run_args[@]}" \
    -p 127.0.0.1::5672 -e "WARREN_NODE_NAME=warren@$name" -e "WARREN_CLUSTER_SEEDS=$seeds" \
    -e WARREN_DEFAULT_USER=operator -e WARREN_DEFAULT_PASS=cluster-secret "$tag" >/dev/null
done
addrs=()
for name in "${names[@]}"; do
  await_node "$name"
  addrs+=("127.0.0.1:$(host_port "$name" 5672)")
done
roundtrip operator cluster-secret quorum "${addrs[@]}"
# Guest's deletion is replicated like any change: refused through every node, soon.
for addr in "${addrs[@]}"; do
  for attempt in $(seq 1 30); do
    if roundtrip --refused guest guest "$addr" >/dev/null 2>&1; then break; fi
    [ "$attempt" = 30 ] && { log "guest still logs in through $addr"; exit 1; }
    sleep 1
  done
done
log "the default user logs in through every node, guest through none"
status=$(pod exec "${names[0]}" warren ctl cluster_status)
echo "$status" >&2
# The members table only (the links table below it names the peers too).
running=$(echo "$status" | awk '/^Members/ { on = 1; next } /^$/ { on = 0 } on' \
  | grep -cE "^warren@($run-n[123])	true	true	\1:25672$" || true)
[ "$running" = 3 ] || { log "cluster_status shows $running running members, not 3"; exit 1; }
log "passed: one container and a 3-container cluster"
