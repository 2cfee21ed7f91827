#!/usr/bin/env bash
# Loads 1,000,000 events into a scratch schema (herald_explain, dropped
# afterwards) and prints EXPLAIN (ANALYZE, BUFFERS) of every hot, sweep and
# re-notify statement of the PostgreSQL store, as docs/postgres.md shows them.
#
#   bench/pg-explain.sh [URL]      # default postgres://postgres@127.0.0.1:5432/test
set -euo pipefail
cd "$(dirname "$0")/.."
URL=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p herald-bench --bin pg-explain
"$CARGO_TARGET_DIR/release/pg-explain" --store "$URL"
