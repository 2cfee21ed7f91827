#!/usr/bin/env bash
# herald's no-op drain on the production-like cluster (bench/lib/cluster.sh,
# autovacuum on, synchronous_commit on) at several worker sizes: how much
# of herald's drain rate and PostgreSQL CPU is its claim size. Each size
# runs twice, read by compare.sh's own hook (bench/lib/mark.sh: an ANALYZE
# at drain-start, PostgreSQL CPU and pg_stat_statements at each phase).
#
#   bench/worker-sizes.sh
#   EVENTS=200000 SIZES="64/64 512/4096" bench/worker-sizes.sh   # concurrency/claim_ahead
#   QUEUE=nats://127.0.0.1:4222 bench/worker-sizes.sh              # another queue (default memory)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
EVENTS=${EVENTS:-100000}
QUEUE=${QUEUE:-memory}
SIZES=${SIZES:-"64/64 64/512 256/1024 512/4096"}
PORT=${PORT:-54332}
PG_CPU=${PG_CPU:-$ROOT/../shared/tools/pg-cpu}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ -x "$PG_CPU" ] || { echo "no pg-cpu at $PG_CPU: set PG_CPU=PATH" >&2; exit 2; }
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p herald-server --bin herald
HERALD=${HERALD:-$CARGO_TARGET_DIR/release/herald}
work=$(mktemp -d /tmp/herald-worker-sizes.XXXXXX)
# shellcheck source=lib/cluster.sh
source bench/lib/cluster.sh
trap 'cluster_stop; rm -rf "$work"' EXIT
statements_cluster "$PORT" "$work" sizes
BROKER=none
case $QUEUE in nats://*) BROKER=nats ;; pubsub://*) BROKER=pubsub ;; esac
export ADMIN_URL=$CLUSTER_URL PG_CPU CASE=clean DB=sizes BROKER PEER_PID_FILE=$work/pid
echo "load $(cut -d' ' -f1-3 /proc/loadavg); $EVENTS events a drain on $QUEUE"
echo "concurrency claim_ahead  events/s  PG CPU ms per 1,000  statements per event"
for size in $SIZES; do
  for _ in 1 2; do
    export MARKS=$work/marks.$RANDOM
    HERALD_WORKER_CONCURRENCY=${size%/*} HERALD_WORKER_CLAIM_AHEAD=${size#*/} \
      "$HERALD" bench drain --store "$DB_URL" --queue "$QUEUE" --events "$EVENTS" --hook "$ROOT/bench/lib/mark.sh" \
      >"$work/stdout" 2>"$work/stderr" &
    echo $! >"$PEER_PID_FILE"
    wait $! || { cat "$work/stderr" >&2; exit 1; }
    # marks: PHASE WALL_MS PG_CPU_MS STATEMENTS …
    read -r pg statements < <(awk '$1 == "drain-start" {p = $3; s = $4} $1 == "drain-end" {print $3 - p, $4 - s}' "$MARKS")
    rate=$(tail -1 "$work/stdout" | python3 -c "import sys, json; print(round(json.load(sys.stdin)['events_per_s']))")
    printf '%11s %11s  %8s  %19s  %s\n' "${size%/*}" "${size#*/}" "$rate" "$(( pg * 1000 / EVENTS ))" \
      "$(python3 -c "print(round($statements / $EVENTS, 3))")"
  done
done
