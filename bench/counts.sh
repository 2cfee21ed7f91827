#!/usr/bin/env bash
# The cost of the dashboard's counts on EVENTS stored events (default
# 1,000,000), on SQLite and on PostgreSQL (bench/src/counts.rs):
# Store::counts as served, made exact, and the old whole-table GROUP BY.
#
#   bench/counts.sh
#   EVENTS=200000 bench/counts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${EVENTS:-1000000}
STORE=${STORE:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p herald-bench --bin counts
"$CARGO_TARGET_DIR/release/counts" --events "$EVENTS" --store sqlite --dir "${TMPDIR:-/tmp}"
"$CARGO_TARGET_DIR/release/counts" --events "$EVENTS" --store "$STORE"
