#!/usr/bin/env bash
# herald's no-op drain on the production-like cluster (bench/lib/cluster.sh,
# autovacuum on, synchronous_commit on) at several worker sizes: how much
# of herald's drain rate and PostgreSQL CPU is its claim size. Each size
# runs twice; PostgreSQL CPU is read by ../shared/tools/pg-cpu between
# drain-start (after an ANALYZE) and drain-end, as bench/compare.sh does.
#
#   bench/worker-sizes.sh
#   EVENTS=200000 SIZES="64/64 512/4096" bench/worker-sizes.sh   # concurrency/claim_ahead
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
EVENTS=${EVENTS:-100000}
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
cluster_start "$PORT" "$work"
url=${CLUSTER_URL%/*}/postgres
cat >"$work/hook" <<HOOK
#!/usr/bin/env bash
[ "\$1" = drain-start ] && psql -qX "$url" -c ANALYZE >/dev/null
echo "\$1 \$("$PG_CPU" --now)" >>"\$MARKS"
HOOK
chmod +x "$work/hook"
hz=$(getconf CLK_TCK)
echo "load $(cut -d' ' -f1-3 /proc/loadavg); $EVENTS events a drain"
echo "concurrency claim_ahead  events/s  PG CPU ms per 1,000"
for size in $SIZES; do
  for _ in 1 2; do
    export MARKS=$work/marks.$RANDOM
    out=$(HERALD_WORKER_CONCURRENCY=${size%/*} HERALD_WORKER_CLAIM_AHEAD=${size#*/} \
      "$HERALD" bench drain --store "$url" --events "$EVENTS" --hook "$work/hook" 2>"$work/stderr" | tail -1) \
      || { cat "$work/stderr" >&2; exit 1; }
    a=$(awk '$1 == "drain-start" {print $2}' "$MARKS")
    b=$(awk '$1 == "drain-end" {print $2}' "$MARKS")
    rate=$(echo "$out" | python3 -c "import sys, json; print(round(json.load(sys.stdin)['events_per_s']))")
    printf '%11s %11s  %8s  %s\n' "${size%/*}" "${size#*/}" "$rate" "$(( (b - a) * 1000 * 1000 / hz / EVENTS ))"
  done
done
