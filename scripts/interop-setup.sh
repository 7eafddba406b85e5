#!/usr/bin/env bash
# Installs what the interoperability suite needs (idempotent; safe to run before every run):
#   .venv/            Python venv with the pinned pika + pytest (tests/interop/python/requirements.txt)
#   Go module cache   github.com/rabbitmq/amqp091-go as pinned by tests/interop/go/go.sum
#   tests/interop/node/node_modules   amqplib as pinned by its package-lock.json (npm ci)
#   ~/.m2             the Java client (com.rabbitmq:amqp-client) and JUnit as tests/interop/java/pom.xml
#                     pins them, and the Maven plugins that build and run it
#   ~/.m2             the stream Java client (com.rabbitmq:stream-client) as tests/interop/java-stream/pom.xml
#                     pins it
#                     (the Rust stream client's suite, tests/interop/rust-stream, is built by its
#                     first run in interop.sh, only where a stream listener exists: about 65 s of
#                     CPU, 4 minutes on a busy 2-core machine). INTEROP_SKIP_STREAM=1 skips the
#                     stream suite's install.
#   .tools/bin/rabbitmqadmin   rabbitmqadmin v2 (the crate of that name, version pinned below), built
#                     from crates.io with --locked once (about 10 minutes on 1 core; its target dir
#                     is target/rabbitmqadmin); test_management_api.py drives it.
#                     INTEROP_SKIP_RABBITMQADMIN=1 skips the build (that test is then skipped).
# Go, Python 3.11, Node (npm) and Java 17 (Maven) are preinstalled on our machines; nothing here
# needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
REQUIREMENTS=tests/interop/python/requirements.txt
STAMP=.venv/.interop-requirements

if [ ! -x .venv/bin/python ]; then
  echo "[interop-setup] creating .venv with $PYTHON" >&2
  "$PYTHON" -m venv .venv
fi
# Reinstall only when the pins changed, so repeated runs cost nothing.
if ! cmp -s "$REQUIREMENTS" "$STAMP" 2>/dev/null; then
  echo "[interop-setup] installing $REQUIREMENTS" >&2
  .venv/bin/pip install -q --disable-pip-version-check -r "$REQUIREMENTS"
  cp "$REQUIREMENTS" "$STAMP"
fi

echo "[interop-setup] fetching Go modules" >&2
(cd tests/interop/go && go mod download)
STAMP_NODE=tests/interop/node/node_modules/.interop-lock
if ! cmp -s tests/interop/node/package-lock.json "$STAMP_NODE" 2>/dev/null; then
  echo "[interop-setup] installing amqplib (npm ci)" >&2
  (cd tests/interop/node && npm ci --no-audit --no-fund --loglevel=error)
  cp tests/interop/node/package-lock.json "$STAMP_NODE"
fi
echo "[interop-setup] fetching the Java client suite's dependencies (Maven)" >&2
# Compiles the suite, which resolves the client, JUnit and the plugins; surefire's JUnit
# provider is fetched by its first run.
(cd tests/interop/java && mvn -q -B test-compile)
if [ "${INTEROP_SKIP_STREAM:-0}" != 1 ]; then
  echo "[interop-setup] fetching the Java stream suite's dependencies (Maven)" >&2
  (cd tests/interop/java-stream && mvn -q -B test-compile)
fi
RABBITMQADMIN_VERSION=2.35.0
if [ "${INTEROP_SKIP_RABBITMQADMIN:-0}" != 1 ] \
    && ! .tools/bin/rabbitmqadmin --version 2>/dev/null | grep -q " $RABBITMQADMIN_VERSION\$"; then
  echo "[interop-setup] building rabbitmqadmin $RABBITMQADMIN_VERSION from crates.io" >&2
  CARGO_TARGET_DIR=target/rabbitmqadmin cargo install --quiet --locked --root .tools \
    --version "$RABBITMQADMIN_VERSION" rabbitmqadmin
fi
echo "[interop-setup] ready" >&2
