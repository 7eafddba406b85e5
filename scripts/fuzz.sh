#!/usr/bin/env bash
# Runs every coverage-guided fuzz target (fuzz/fuzz_targets, libFuzzer via cargo-fuzz) for
# SECONDS each (default 60), one after another, single-threaded, in this process (so runs of
# different targets may go side by side: each writes only its own log), and prints a table of
# each target's executions and coverage. Exits non-zero when a target crashed; the input that did it
# is in target/fuzz-artifacts/TARGET/ (make it a regression test in the crate's own tests).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Seeds are fuzz/corpus/TARGET (kept in the repo, read only here); what a run finds goes to
# target/fuzz-corpus/TARGET, so later runs on the machine start from there. Without a nightly
# toolchain (scripts/fuzz-setup.sh says why) it prints that and exits 0.
# FUZZ_SANITIZER (default none: the targets are safe Rust, and without ASan each runs about
# twice the inputs) may be address. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

SECONDS_EACH=${1:-60}
[ $# -gt 0 ] && shift
setup=$(./scripts/fuzz-setup.sh)
if grep -q "^fuzzing unavailable" <<<"$setup"; then
  echo "[fuzz] $setup: skipped"
  exit 0
fi
export PATH=$ROOT/.tools/bin:$PATH
SANITIZER=${FUZZ_SANITIZER:-none}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
echo "[fuzz] building ${#targets[@]} targets (nightly, sanitizer $SANITIZER)" >&2
cargo +nightly fuzz build --sanitizer "$SANITIZER" >&2

failed=0
summary=()
for t in "${targets[@]}"; do
  corpus=$ROOT/target/fuzz-corpus/$t
  artifacts=$ROOT/target/fuzz-artifacts/$t
  mkdir -p "$corpus" "$artifacts" "fuzz/corpus/$t"
  log=$ROOT/target/fuzz-$t.log
  echo "[fuzz] $t for ${SECONDS_EACH}s" >&2
  # -timeout: an input that takes 10 s is a hang; -rss_limit_mb: bounded memory is a property.
  if cargo +nightly fuzz run --sanitizer "$SANITIZER" "$t" "$corpus" "fuzz/corpus/$t" -- \
      -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
    verdict=ok
  else
    verdict=CRASHED
    failed=1
    tail -40 "$log" >&2
  fi
  # -a: a crash's log may hold binary input; a log without the lines is "?", not an exit.
  execs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  cov=$(grep -aEo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  summary+=("$(printf '%-16s %-8s %12s execs  %s' "$t" "$verdict" "${execs:-?}" "${cov:-?}")")
done
echo "target           verdict         executions  coverage (edges, features)"
printf '%s\n' "${summary[@]}"
exit $failed
