#!/usr/bin/env bash
# Builds the web UI (ui/) into crates/server/assets/ui, which the warren binary embeds; the
# built files are committed, so building warren never needs node or the network.
#
#   scripts/ui-build.sh           install ui/'s locked dependencies (npm ci) and rebuild
#   scripts/ui-build.sh --check   rebuild into a temporary directory and fail if the committed
#                                 files differ (someone changed ui/src without rebuilding)
#
# The versions are pinned by ui/package-lock.json and esbuild's output is deterministic, so the
# same sources give the same bytes on any machine. Needs node and npm (Debian's nodejs/npm).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=crates/server/assets/ui
if ! command -v npm >/dev/null; then
  echo "[ui-build] installing nodejs and npm" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
# Reinstall only when the lock file changed.
if ! cmp -s ui/package-lock.json ui/node_modules/.ui-build-lock 2>/dev/null; then
  echo "[ui-build] npm ci" >&2
  (cd ui && npm ci --no-audit --no-fund --loglevel=error)
  cp ui/package-lock.json ui/node_modules/.ui-build-lock
fi
if [ "${1:-}" = --check ]; then
  tmp=$(mktemp -d -t warren-ui-build.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  (cd ui && node build.mjs --out "$tmp" >/dev/null)
  if ! diff -r "$tmp" "$OUT" >/dev/null; then
    diff -rq "$tmp" "$OUT" >&2 || true
    echo "[ui-build] $OUT is stale: run scripts/ui-build.sh and commit the result" >&2
    exit 1
  fi
  echo "[ui-build] $OUT matches ui/src" >&2
else
  (cd ui && node build.mjs)
fi
