#!/usr/bin/env bash
# Installs what the coverage-guided fuzzers need (idempotent; safe before every run):
#   a nightly Rust toolchain   libFuzzer's instrumentation (-Zsanitizer) needs nightly; taken from
#                              rustup if it is there, installed by rustup otherwise when it can be
#   .tools/bin/cargo-fuzz      cargo-fuzz from crates.io, version pinned below, built --locked once
#                              (a few minutes on 1 core; its target dir is target/cargo-fuzz)
# Exits 0 having printed "fuzzing unavailable: WHY" when the toolchain cannot be had, so callers
# (scripts/fuzz.sh, CI) skip fuzzing on such a machine rather than fail.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2

if ! rustc +nightly --version >/dev/null 2>&1; then
  echo "[fuzz-setup] installing the nightly toolchain with rustup" >&2
  if ! rustup toolchain install nightly --profile minimal >/dev/null 2>&1; then
    echo "fuzzing unavailable: no nightly toolchain (rustup could not install one)"
    exit 0
  fi
fi
if ! .tools/bin/cargo-fuzz --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
  echo "[fuzz-setup] building cargo-fuzz $CARGO_FUZZ_VERSION from crates.io" >&2
  if ! CARGO_TARGET_DIR=target/cargo-fuzz cargo install --quiet --locked --root .tools \
      --version "$CARGO_FUZZ_VERSION" cargo-fuzz; then
    echo "fuzzing unavailable: cargo-fuzz $CARGO_FUZZ_VERSION did not build"
    exit 0
  fi
fi
echo "[fuzz-setup] ready: $(rustc +nightly --version), $(.tools/bin/cargo-fuzz --version)" >&2
