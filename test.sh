#!/usr/bin/env bash
# The whole test suite. Starts the services the tests need when they are
# installed but not running, and stops only what it started.
#
#   ./test.sh                 # everything
#   ./test.sh -p herald       # extra arguments go to `cargo test`
#
# Backend tests that cannot reach their service say so by name and skip;
# with CI=true they fail instead.
set -euo pipefail
cd "$(dirname "$0")"

started=()
cleanup() {
  for s in "${started[@]}"; do
    case "$s" in
      postgres:*) v=${s#postgres:}; echo "test.sh: stopping the PostgreSQL $v it started"
                  pg_ctlcluster --skip-systemctl-redirect "$v" main stop || true ;;
      nats:*) pid=${s#nats:}; echo "test.sh: stopping the nats-server (pid $pid) it started"
              kill "$pid" 2>/dev/null || true
              wait "$pid" 2>/dev/null || true
              rm -rf "$nats_dir" ;;
      pubsub:*) pid=${s#pubsub:}; echo "test.sh: stopping the Pub/Sub emulator (pid $pid) it started"
                kill "$pid" 2>/dev/null || true
                wait "$pid" 2>/dev/null || true ;;
    esac
  done
}
trap cleanup EXIT

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local port=$1 what=$2
  for _ in $(seq 1 100); do
    port_open "$port" && return 0
    sleep 0.1
  done
  echo "test.sh: $what did not open 127.0.0.1:$port" >&2
  return 1
}

# PostgreSQL on 127.0.0.1:5432 (trust auth, database `test`).
if [ -z "${DATABASE_URL:-}" ] && ! port_open 5432; then
  if command -v pg_lsclusters >/dev/null 2>&1; then
    v=$(pg_lsclusters --no-header | awk '$2 == "main" {print $1; exit}')
    if [ -n "$v" ]; then
      echo "test.sh: starting PostgreSQL $v"
      pg_ctlcluster --skip-systemctl-redirect "$v" main start
      started+=("postgres:$v")
      wait_port 5432 PostgreSQL
    fi
  else
    echo "test.sh: PostgreSQL is not installed; its tests will say so" >&2
  fi
fi
if port_open 5432 && command -v psql >/dev/null 2>&1; then
  psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE test"
fi

# NATS with JetStream on 127.0.0.1:4222 (a throwaway store directory).
nats_dir=
if [ -z "${NATS_URL:-}" ] && ! port_open 4222; then
  if command -v nats-server >/dev/null 2>&1; then
    nats_dir=$(mktemp -d -t herald-nats.XXXXXX)
    echo "test.sh: starting nats-server (JetStream in $nats_dir)"
    nats-server -a 127.0.0.1 -p 4222 -js -sd "$nats_dir" >"$nats_dir/server.log" 2>&1 &
    started+=("nats:$!")
    wait_port 4222 nats-server
  else
    echo "test.sh: nats-server is not installed; its tests will say so" >&2
  fi
fi

# The Pub/Sub emulator on 127.0.0.1:8085 (Java; keeps nothing on disk).
# Its Debian package comes from Google Cloud's apt repository, which is
# added when apt does not know the package.
emulator=/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else return 1; fi
}
if [ ! -x "$emulator" ] && ! command -v cloud-pubsub-emulator >/dev/null 2>&1; then
  echo "test.sh: installing google-cloud-cli-pubsub-emulator for the Pub/Sub tests"
  if ! apt-cache show google-cloud-cli-pubsub-emulator >/dev/null 2>&1 \
     && [ ! -e /etc/apt/sources.list.d/google-cloud-sdk.list ]; then
    as_root sh -c 'curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | gpg --dearmor -o /usr/share/keyrings/cloud.google.gpg \
      && echo "deb [signed-by=/usr/share/keyrings/cloud.google.gpg] https://packages.cloud.google.com/apt cloud-sdk main" > /etc/apt/sources.list.d/google-cloud-sdk.list' \
      || echo "test.sh: cannot add Google Cloud's apt repository" >&2
  fi
  as_root apt-get update || true
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y google-cloud-cli-pubsub-emulator default-jre-headless \
    || echo "test.sh: cannot install the Pub/Sub emulator; its tests will say so" >&2
fi
command -v cloud-pubsub-emulator >/dev/null 2>&1 && emulator=$(command -v cloud-pubsub-emulator)
if [ -z "${PUBSUB_EMULATOR_HOST:-}" ]; then
  export PUBSUB_EMULATOR_HOST=127.0.0.1:8085
  if ! port_open 8085 && [ -x "$emulator" ]; then
    pubsub_log=$(mktemp -t herald-pubsub.XXXXXX)
    echo "test.sh: starting the Pub/Sub emulator (log in $pubsub_log)"
    "$emulator" --host=127.0.0.1 --port=8085 >"$pubsub_log" 2>&1 &
    started+=("pubsub:$!")
    # Java: a few seconds.
    for _ in $(seq 1 3); do port_open 8085 && break; wait_port 8085 "the Pub/Sub emulator" || true; done
  fi
fi

# libfaketime for the skewed-clock tests (crates/herald-server/tests/hostile.rs).
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]; then
  echo "test.sh: installing faketime for the skewed-clock tests"
  { as_root apt-get update && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y faketime; } \
    || echo "test.sh: cannot install faketime; the skewed-clock tests will say SKIPPED" >&2
fi

# The dashboard's browser test: headless Chromium driven by playwright-core.
if [ ! -x /usr/bin/chromium ]; then
  echo "test.sh: installing chromium for the dashboard's browser test"
  if [ "$(id -u)" = 0 ]; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
  else
    echo "test.sh: cannot install chromium (not root, no sudo); the dashboard test will say SKIPPED" >&2
  fi
fi
browser=crates/herald-server/tests/browser
if [ ! -d "$browser/node_modules" ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "test.sh: npm ci in $browser"
    (cd "$browser" && npm ci --no-audit --no-fund)
  else
    echo "test.sh: npm is not installed; the dashboard test will say SKIPPED" >&2
  fi
fi

cargo test --workspace --all-features "$@"
# The benchmark peers' shared contract (its own workspace, bench/peers/contract).
cargo test --manifest-path bench/peers/contract/Cargo.toml
# Schemathesis against the server's OpenAPI document (needs python3 with venv/pip).
if command -v python3 >/dev/null 2>&1 && python3 -m venv --help >/dev/null 2>&1; then
  crates/herald-server/tests/schemathesis.sh
elif [ "${CI:-}" = true ]; then
  echo "test.sh: python3 with venv is required for the schemathesis run (CI=true)" >&2
  exit 1
else
  echo "test.sh: SKIPPED the schemathesis run: python3 with venv/pip is not installed" >&2
fi
