#!/usr/bin/env bash
# The web UI's tests: the committed build matches ui/src (scripts/ui-build.sh --check), then
# ui/test/ui.test.mjs drives the UI in Debian's headless chromium (installed here with apt if
# missing) against the warren binary: log in, declare a queue, publish, the rate chart moves,
# get, a policy takes effect, purge, delete. About 20 s once installed.
#
#   scripts/ui-test.sh                        uses target/release/warren (built if missing) or $WARREN_BIN
#   SCREENSHOT_DIR=docs/ui scripts/ui-test.sh also refreshes the screenshots of docs/ui.md
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/ui-build.sh --check
if [ ! -x /usr/bin/chromium ]; then
  echo "[ui-test] installing chromium" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if [ -z "${WARREN_BIN:-}" ]; then
  cargo build --release -p warren
  export WARREN_BIN=$PWD/target/release/warren
fi
node ui/test/ui.test.mjs
