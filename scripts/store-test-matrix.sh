#!/usr/bin/env bash
# Runs tests under the conditions their verdict must not depend on, and tables the outcome.
# A test that passes in one cell and fails in another is counting on the machine (how many
# appends share an fsync, how fast a disk or a core is): see crates/store/tests/common/mod.rs.
#
#   scripts/store-test-matrix.sh [--rounds N] [--slow-sync-us US] [--one-core] [cargo test args]
#
# Cells: the engine's directories on tmpfs (/dev/shm) and on the real disk (/tmp), each with the
# WAL commit window at 0 and at its default; --slow-sync-us adds the same four with every WAL
# fdatasync made US microseconds slower. --one-core runs everything on CPU 0 (taskset), as on a
# loaded machine. Each cell runs --rounds times (default 1). The cargo test arguments default to
# `-p warren-store`; the knobs reach only the tests that build their config with the store
# tests' `store_config`, but TMPDIR reaches every test that makes its directories there.
# Exits non-zero if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=1
slow_sync_us=
one_core=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --slow-sync-us) slow_sync_us=${2:?--slow-sync-us needs microseconds}; shift 2 ;;
    --one-core) one_core=1; shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || set -- -p warren-store

export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1}
cargo test "$@" --no-run

wrap=()
[ -z "$one_core" ] || wrap=(taskset -c 0)

cells=()
for delay in 0 ${slow_sync_us:+$slow_sync_us}; do
  for dir in /dev/shm /tmp; do
    for window in 0 default; do
      cells+=("$dir $window $delay")
    done
  done
done

logs=$(mktemp -d -t warren-test-matrix.XXXXXX)
status=0
summary=()
for cell in "${cells[@]}"; do
  read -r dir window delay <<<"$cell"
  for round in $(seq 1 "$rounds"); do
    name="TMPDIR=$dir window=$window sync_delay_us=$delay round=$round"
    log="$logs/$(echo "$name" | tr ' =/' '_-_').log"
    env_args=(TMPDIR="$dir" WARREN_TEST_WAL_SYNC_DELAY_US="$delay")
    [ "$window" = default ] || env_args+=(WARREN_TEST_WAL_COMMIT_WINDOW_US="$window")
    start=$(date +%s)
    echo "[matrix] $name" >&2
    if env "${env_args[@]}" "${wrap[@]}" cargo test --no-fail-fast "$@" >"$log" 2>&1; then ok=1; else ok=0; status=1; fi
    # (grep finding nothing is no error here: awk reads an empty input)
    passed=$( (grep -o '[0-9]* passed' "$log" || true) | awk '{s+=$1} END {print s+0}')
    failed=$( (grep -o '[0-9]* failed' "$log" || true) | awk '{s+=$1} END {print s+0}')
    which=$( (grep -E '^test .* \.\.\. FAILED$' "$log" || true) | awk '{print $2}' | sort -u | tr '\n' ' ')
    [ "$ok" = 1 ] || [ -n "$which" ] || which="(did not finish: see $log)"
    summary+=("$(printf '%-9s %-8s %6s %5s %6s %6s %5ss  %s' "$dir" "$window" "$delay" "$round" "$passed" "$failed" "$(( $(date +%s) - start ))" "$which")")
  done
done

printf '\n%-9s %-8s %6s %5s %6s %6s %6s  %s\n' TMPDIR window delay round passed failed time failing
printf '%s\n' "${summary[@]}"
echo "logs: $logs"
exit $status
