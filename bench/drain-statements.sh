#!/usr/bin/env bash
# What herald's no-op drain costs PostgreSQL, per queue and worker size:
# `herald-peer --scenario drain` on a throwaway production-like cluster
# (bench/lib/cluster.sh: autovacuum on, synchronous_commit on) with
# pg_stat_statements, read by compare.sh's hook (bench/lib/mark.sh): an
# ANALYZE as the drain starts (after the untimed emits), the statements
# forgotten then and the costliest written when it ends, with PostgreSQL's
# CPU over the drain (../shared/tools/pg-cpu). Each run prints its rate,
# PostgreSQL CPU and herald's process CPU per 1,000 events and statements
# per event, then its statements. Queues and sizes alternate, RUNS times, so that a slow
# minute of the machine does not land on one of them.
#
#   bench/drain-statements.sh                                     # memory and NATS, 200,000 events, twice
#   QUEUES=memory EVENTS=50000 RUNS=1 bench/drain-statements.sh
#   EVENTS=50000 DRAIN_ARGS="--backlog 1000000 --backlog-kind paused" bench/drain-statements.sh
#   QUEUES=memory SIZES="64/64 64/512 256/1024 512/4096" STATEMENTS=0 bench/drain-statements.sh
#
# SIZES: worker sizes, CONCURRENCY/CLAIM_AHEAD (default 512/4096, as in
# compare.sh): how much of the drain's rate and PostgreSQL CPU is the claim
# size. DRAIN_ARGS: more `herald-peer` drain flags (a backlog, as
# compare.sh's hard cases have); CASE (clean) what the hook does besides,
# as in compare.sh (stale: VACUUM ANALYZE after the backlog, no ANALYZE at
# drain-start). STATEMENTS=0 prints the summary lines alone. BUILD=0 uses
# the binary already built, PEER=PATH another one. PERF=DIR profiles
# herald's own process over each drain (bench/lib/perf-mark.sh) into
# DIR/RUN.QUEUE.SIZE.data, for `perf report -i FILE --no-children`
# (PERF_ALL=1: every process on the machine, PostgreSQL's backends too).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
EVENTS=${EVENTS:-200000}
QUEUES=${QUEUES:-"memory nats://127.0.0.1:4222"}
SIZES=${SIZES:-512/4096}
RUNS=${RUNS:-2}
PORT=${PORT:-54333}
PG_CPU=${PG_CPU:-$ROOT/../shared/tools/pg-cpu}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ -x "$PG_CPU" ] || { echo "no pg-cpu at $PG_CPU: set PG_CPU=PATH" >&2; exit 2; }
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p herald-bench --bin herald-peer
PEER=${PEER:-$CARGO_TARGET_DIR/release/herald-peer}
work=$(mktemp -d /tmp/herald-drain-statements.XXXXXX)
# shellcheck source=lib/cluster.sh
source bench/lib/cluster.sh
trap 'cluster_stop; rm -rf "$work"' EXIT
statements_cluster "$PORT" "$work" drain
export ADMIN_URL=$CLUSTER_URL PG_CPU CASE=${CASE:-clean} DB=drain
echo "load $(cut -d' ' -f1-3 /proc/loadavg); $EVENTS events a drain"
for run in $(seq 1 "$RUNS"); do
  for queue in $QUEUES; do
    for size in $SIZES; do
      name=$run.$(echo "$queue.$size" | tr -c 'a-z0-9\n' '_')
      out=$work/$name
      mkdir -p "$out"
      hook=$ROOT/bench/lib/mark.sh
      if [ -n "${PERF:-}" ]; then
        mkdir -p "$PERF"
        hook=$ROOT/bench/lib/perf-mark.sh
        export PERF_DATA=$PERF/$name.data
      fi
      broker=none
      case $queue in nats://*) broker=nats ;; pubsub://*) broker=pubsub ;; esac
      # DRAIN_ARGS is split into flags on purpose.
      # shellcheck disable=SC2086
      MARKS=$out/marks BROKER=$broker PEER_PID_FILE=$out/pid \
        HERALD_WORKER_CONCURRENCY=${size%/*} HERALD_WORKER_CLAIM_AHEAD=${size#*/} \
        "$PEER" --scenario drain --url "$DB_URL" --queue "$queue" --events "$EVENTS" ${DRAIN_ARGS:-} \
        --hook "$hook" >"$out/stdout" 2>"$out/stderr" &
      echo $! >"$out/pid"
      wait $! || { cat "$out/stderr" >&2; exit 1; }
      # marks: PHASE WALL_MS PG_CPU_MS STATEMENTS …
      read -r pg statements < <(awk '$1 == "drain-start" {p = $3; s = $4} $1 == "drain-end" {print $3 - p, $4 - s}' "$out/marks")
      read -r rate proc < <(tail -1 "$out/stdout" | python3 -c "
import sys, json
r = json.load(sys.stdin)
print(round(r['events_per_s']), round(r['process_cpu_ms'] * 1000 / $EVENTS, 1))")
      echo
      echo "== $queue at $size, run $run: $rate events/s, PostgreSQL CPU $pg ms ($(( pg * 1000 / EVENTS )) per 1,000 events), herald's process $proc ms per 1,000, $(python3 -c "print(round($statements / $EVENTS, 3))") statements per event"
      [ "${STATEMENTS:-1}" = 0 ] || cat "$out/statements.txt"
    done
  done
done
