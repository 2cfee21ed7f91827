#!/usr/bin/env bash
# herald's long horizon alone: bench/compare.sh's long-horizon case for one
# herald system, on its throwaway cluster configured like a production
# server (bench/lib/cluster.sh: autovacuum on, synchronous_commit on).
# herald-peer offers RATE single emits a second for DURATION seconds to
# HANDLERS handlers that work WORK_MS each; emit-to-start latency per 10-s
# window; the tables' dead tuples and size sampled every 5 s; a transaction
# holds an xid for HOLD seconds from HOLD_AT (vacuum can clean nothing
# meanwhile). OUT/report.md gives the figures, long-horizon-*.svg the charts.
#
#   bench/long-horizon.sh                             # 300 s at 9,000 events/s
#   DURATION=1800 bench/long-horizon.sh
#   OUT=/tmp/lh SYSTEM=herald-nats DURATION=240 HOLD=60 bench/long-horizon.sh
#
# Environment: DURATION (s, 300), RATE (9000), HOLD (s, 120; 0: no hold),
# HOLD_AT (s, a third in), HANDLERS (32), WORK_MS (1), CLAIM_AHEAD (as many
# as HANDLERS), SYSTEM (herald-memory), and compare.sh's OUT, PORT, PG_CPU,
# BUILD, WARM.
set -euo pipefail
cd "$(dirname "$0")/.."
export SYSTEMS=${SYSTEM:-herald-memory} CASES=long-horizon
export LH_SECONDS=${DURATION:-300} LH_RATE=${RATE:-9000} LH_WORK_MS=${WORK_MS:-1}
export LH_HOLD=${HOLD:-120}
[ -z "${HOLD_AT:-}" ] || export LH_HOLD_AT=$HOLD_AT
export HERALD_WORKER_CONCURRENCY=${HANDLERS:-32}
export HERALD_WORKER_CLAIM_AHEAD=${CLAIM_AHEAD:-$HERALD_WORKER_CONCURRENCY}
export IDLE_SECONDS=${IDLE_SECONDS:-0}
exec bench/compare.sh
