#!/usr/bin/env bash
# The long-horizon run of issue 11 on a throwaway PostgreSQL 15 cluster
# configured like a production server (bench/lib/cluster.sh: autovacuum on,
# naptime 60 s, cost delay 2 ms, cost limit 200, scale factors 0.2 / 0.1,
# shared_buffers 256MB, synchronous_commit on): initdb in a temporary
# directory, its own port, stopped by its PID at the end (also on failure). Then bench/src/
# long_horizon.rs: a fixed-rate producer (emits of 128, 256-byte payloads),
# one worker with 32 handlers of 1 ms, phases clean / a transaction held
# open for HOLD seconds / recovery, sampled every 5 s into a CSV and an SVG.
#
#   bench/long-horizon.sh                       # 300 s at 9,000 events/s
#   DURATION=1800 RATE=9000 bench/long-horizon.sh   # the issue's target run
#   OUT=/tmp/lh-before LABEL=main DURATION=240 HOLD=60 bench/long-horizon.sh
#
# Environment: DURATION (s, default 300), RATE (events/s, 9000), HOLD (s,
# 120), HOLD_AT (s, a third in), HANDLERS (32), WORK_MS (1), CLAIM_AHEAD
# (events claimed ahead of free handler slots; default the worker's, as
# many as HANDLERS; 0 claims only for free slots), PORT (54329),
# OUT (directory for CSV, chart, log and the server log; default
# ./long-horizon-out), LABEL (for the chart's title), PG_BIN, BIN (a
# long-horizon binary built elsewhere, for example from an older commit),
# PG_EXTRA (lines added to the cluster's postgresql.conf, e.g. to catch a
# slow plan inside herald's functions:
#   PG_EXTRA=$'shared_preload_libraries = auto_explain\nauto_explain.log_min_duration = 30\nauto_explain.log_nested_statements = on'
# ).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-300}
RATE=${RATE:-9000}
HOLD=${HOLD:-120}
HOLD_AT=${HOLD_AT:-$((DURATION / 3))}
HANDLERS=${HANDLERS:-32}
WORK_MS=${WORK_MS:-1}
PORT=${PORT:-54329}
OUT=${OUT:-long-horizon-out}
LABEL=${LABEL:-$(git rev-parse --short HEAD 2>/dev/null || true)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p herald-bench --bin long-horizon
  BIN=$CARGO_TARGET_DIR/release/long-horizon
fi

# shellcheck source=lib/cluster.sh
source bench/lib/cluster.sh
trap cluster_stop EXIT
cluster_start "$PORT" "$OUT" "${PG_EXTRA:-}"
URL=$CLUSTER_URL
echo "cluster $CLUSTER_DATA on port $PORT; load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN" --store "$URL" --rate "$RATE" --duration "$DURATION" --hold "$HOLD" \
  --hold-at "$HOLD_AT" --handlers "$HANDLERS" --work-ms "$WORK_MS" \
  ${CLAIM_AHEAD:+--claim-ahead "$CLAIM_AHEAD"} \
  --csv "$OUT/long-horizon.csv" --chart "$OUT/long-horizon.svg" --label "$LABEL" \
  | tee "$OUT/long-horizon.log"
grep -E "automatic (vacuum|analyze)" "$OUT/postgres.log" | sed 's/^/server: /' | cut -c1-200 || true
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg); CSV, chart and logs in $OUT"
