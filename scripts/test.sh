#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: installs what the tests need first.
#
#   1. formatting and lints (cargo fmt, clippy -D warnings)
#   2. the Rust tests of every crate (codec, routing, vhost state machines, store, perf), then
#      each coverage-guided fuzz target briefly (FUZZ_CI_SECONDS each, default 10; 0 skips; skipped
#      by itself where no nightly toolchain can be had): docs/fuzzing.md
#   3. the web UI in headless chromium (scripts/ui-test.sh: installs chromium with apt); the
#      Kubernetes manifests and Helm chart (scripts/helm-lint.sh: helm lint and template)
#   4. the interoperability suite: real clients (pika, amqp091-go, amqplib, the Java client)
#      against the warren binary, then again against node 2 of a local 3-node cluster
#   5. the container image with podman: one container, then a 3-container cluster
#      (scripts/container-test.sh)
#
# The same interop suite runs against the real RabbitMQ 3.10 with
#   scripts/interop.sh --broker rabbitmq
set -euo pipefail
cd "$(dirname "$0")/.."
# The kill -9 cycles of test_crash.py (50 by default, the longest test at 4-8 minutes): 30 here
# keep the whole suite well inside CI's time; the longer run is WARREN_CRASH_CYCLES=200.
export WARREN_CRASH_CYCLES=${WARREN_CRASH_CYCLES:-30}

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
if [ "${FUZZ_CI_SECONDS:-10}" -gt 0 ]; then
  ./scripts/fuzz.sh "${FUZZ_CI_SECONDS:-10}"
fi
./scripts/perf-tests.sh
# The web UI: its committed build is current, and it works in headless chromium (about 20 s).
./scripts/ui-test.sh

# The Kubernetes manifests and Helm chart: helm lint, helm template, and what docs/deploy.md
# promises of them (about 2 s; building helm from the Go module proxy the first time, minutes).
./scripts/helm-lint.sh

./scripts/interop.sh --broker warren ${INTEROP_PYTEST_ARGS:-}
# The same suites against node 2 of a 3-node cluster whose queues are spread over its nodes.
./scripts/interop.sh --broker warren-cluster ${INTEROP_PYTEST_ARGS:-}
# The container image, built from that release binary with podman: one container and a
# 3-container cluster, driven from the host (a few minutes; installs podman with apt-get).
WARREN_BIN=${WARREN_BIN:-target/release/warren} ./scripts/container-test.sh
