#!/usr/bin/env bash
# Rescue time after SIGKILL with 3 `herald serve` workers on PostgreSQL +
# NATS JetStream (bench/src/rescue.rs): KILLS rounds (default 20), lease
# LEASE seconds (default 3); one line per kill, then the summary.
#
#   bench/rescue.sh
#   KILLS=40 LEASE=6 EXTRA="--verbose" bench/rescue.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS=${KILLS:-20}
LEASE=${LEASE:-3}
EXTRA=${EXTRA:-}
STORE=${STORE:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
NATS=${NATS:-${NATS_URL:-nats://127.0.0.1:4222}}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# HERALD=PATH: a herald binary of your own (the shared target directory's
# may be rebuilt by someone else from other sources while this runs).
if [ -n "${HERALD:-}" ]; then
  cargo build --release -q -p herald-bench --bin rescue
else
  cargo build --release -q -p herald-server -p herald-bench --bin herald --bin rescue
fi
BIN=$CARGO_TARGET_DIR/release
HERALD=${HERALD:-$BIN/herald}
# shellcheck disable=SC2086
"$BIN/rescue" --herald "$HERALD" --store "$STORE" --nats "$NATS" \
  --kills "$KILLS" --lease-secs "$LEASE" $EXTRA
