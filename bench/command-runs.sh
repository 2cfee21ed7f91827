#!/usr/bin/env bash
# Command handler runs per second through `herald serve` (SQLite, memory
# queue, a /bin/true command): bench/src/command_runs.rs. EVENTS per round
# (default 5000), ROUNDS (default 3); one line per round, then the median.
#
#   bench/command-runs.sh
#   HERALD=/tmp/herald-before bench/command-runs.sh    # another build, to compare
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${EVENTS:-5000}
ROUNDS=${ROUNDS:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# HERALD=PATH: a herald binary of your own (e.g. one built before a change).
if [ -n "${HERALD:-}" ]; then
  cargo build --release -q -p herald-bench --bin command-runs
else
  cargo build --release -q -p herald-server -p herald-bench --bin herald --bin command-runs
fi
BIN=$CARGO_TARGET_DIR/release
HERALD=${HERALD:-$BIN/herald}
"$BIN/command-runs" --herald "$HERALD" --events "$EVENTS" --rounds "$ROUNDS"
