#!/usr/bin/env bash
# The PostgreSQL drain measurements of docs/postgres.md: each case RUNS times
# (default 3), each run under pg-cpu. Prints the drain's own line (events/s,
# the drain's PostgreSQL CPU per 1,000 events) and pg-cpu's total for the
# whole command (which includes the untimed emit).
#
#   bench/pg-drain.sh [URL]          # default postgres://postgres@127.0.0.1:5432/test
#   RUNS=5 EVENTS=200000 bench/pg-drain.sh
#   CASES="plain hold-tx" EXTRA="--fillfactor 100" bench/pg-drain.sh
set -euo pipefail
cd "$(dirname "$0")/.."
URL=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
RUNS=${RUNS:-3}
EVENTS=${EVENTS:-200000}
CASES=${CASES:-"plain paused hold-tx"}
EXTRA=${EXTRA:-}
# pg-cpu lives beside the repository, in ../shared/tools (the script's own
# "$(dirname "$0")/../../shared/tools/pg-cpu"; this line runs from the
# repository's root); PG_CPU=PATH overrides.
PG_CPU=${PG_CPU:-$PWD/../shared/tools/pg-cpu}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
[ -x "$PG_CPU" ] || { echo "no pg-cpu at $PG_CPU: set PG_CPU=PATH" >&2; exit 2; }
cargo build --release -q -p herald-bench --bin drain
DRAIN=$CARGO_TARGET_DIR/release/drain
for case in $CASES; do
  case $case in
    plain) flags="" ;;
    paused) flags="--paused 1000000" ;;
    hold-tx) flags="--hold-tx" ;;
    *) echo "unknown case $case" >&2; exit 2 ;;
  esac
  for run in $(seq 1 "$RUNS"); do
    echo "== $case run $run: drain --store $URL --events $EVENTS $flags $EXTRA"
    # shellcheck disable=SC2086
    "$PG_CPU" -- "$DRAIN" --store "$URL" --events "$EVENTS" --pg-cpu "$PG_CPU" $flags $EXTRA
  done
done
