#!/usr/bin/env bash
# What each of herald's statements costs PostgreSQL in a no-op drain, per
# queue: `herald bench drain` on a throwaway production-like cluster
# (bench/lib/cluster.sh) with pg_stat_statements, reset when the drain
# starts (after the untimed emits and an ANALYZE, as compare.sh's hook
# does) and read when it ends, with PostgreSQL's CPU over the drain
# (../shared/tools/pg-cpu). Queues alternate, RUNS times, so that a slow
# minute of the machine does not land on one queue.
#
#   bench/drain-statements.sh                                     # memory and NATS, 200,000 events, twice
#   QUEUES=memory EVENTS=50000 RUNS=1 bench/drain-statements.sh
#
# HERALD_WORKER_CONCURRENCY (512) and HERALD_WORKER_CLAIM_AHEAD (4096) as
# in compare.sh; BUILD=0 uses the binary already built, HERALD=PATH another one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
EVENTS=${EVENTS:-200000}
QUEUES=${QUEUES:-"memory nats://127.0.0.1:4222"}
RUNS=${RUNS:-2}
PORT=${PORT:-54333}
PG_CPU=${PG_CPU:-$ROOT/../shared/tools/pg-cpu}
export HERALD_WORKER_CONCURRENCY=${HERALD_WORKER_CONCURRENCY:-512}
export HERALD_WORKER_CLAIM_AHEAD=${HERALD_WORKER_CLAIM_AHEAD:-4096}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ -x "$PG_CPU" ] || { echo "no pg-cpu at $PG_CPU: set PG_CPU=PATH" >&2; exit 2; }
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p herald-server --bin herald
HERALD=${HERALD:-$CARGO_TARGET_DIR/release/herald}
work=$(mktemp -d /tmp/herald-drain-statements.XXXXXX)
# shellcheck source=lib/cluster.sh
source bench/lib/cluster.sh
trap 'cluster_stop; rm -rf "$work"' EXIT
cluster_start "$PORT" "$work" "shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all"
psql -qX "$CLUSTER_URL" -c "CREATE EXTENSION pg_stat_statements" -c "CREATE DATABASE drain"
url=${CLUSTER_URL%/*}/drain
# The hook: at drain-start an ANALYZE, the statements' counters reset and
# PostgreSQL's CPU read; at drain-end the CPU again and the statements of
# the drain's database, most expensive first (pg_stat_statements lives in
# the cluster's postgres database, $ADMIN).
cat >"$work/hook.sh" <<'HOOK'
#!/usr/bin/env bash
set -euo pipefail
case $1 in
  drain-start)
    psql -qXtA "$URL" -c "ANALYZE" >/dev/null
    psql -qXtA "$ADMIN" -c "SELECT pg_stat_statements_reset()" >/dev/null
    "$PG_CPU" --now >"$OUT.cpu" ;;
  drain-end)
    echo "$(( ($("$PG_CPU" --now) - $(cat "$OUT.cpu")) * 1000 / $(getconf CLK_TCK) ))" >"$OUT.cpu"
    psql -qXtA -F' | ' "$ADMIN" -c "SELECT s.calls, s.rows, round(s.total_exec_time::numeric, 1),
        round((s.total_exec_time / greatest(s.calls, 1))::numeric, 3),
        left(regexp_replace(s.query, '\s+', ' ', 'g'), 90)
      FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
      WHERE d.datname = 'drain' AND s.query NOT LIKE '%pg_stat_statements%'
      ORDER BY s.total_exec_time DESC LIMIT 25" >"$OUT.statements" ;;
esac
HOOK
chmod +x "$work/hook.sh"
echo "load $(cut -d' ' -f1-3 /proc/loadavg); $EVENTS events a drain, at $HERALD_WORKER_CONCURRENCY / $HERALD_WORKER_CLAIM_AHEAD"
for run in $(seq 1 "$RUNS"); do
  for queue in $QUEUES; do
    out=$work/$run.$(echo "$queue" | tr -c 'a-z0-9\n' '_')
    URL=$url ADMIN=$CLUSTER_URL PG_CPU=$PG_CPU OUT=$out "$HERALD" bench drain --store "$url" --queue "$queue" \
      --events "$EVENTS" --hook "$work/hook.sh" >"$out.stdout" 2>"$out.stderr" \
      || { cat "$out.stderr" >&2; exit 1; }
    rate=$(tail -1 "$out.stdout" | python3 -c "import sys, json; print(round(json.load(sys.stdin)['events_per_s']))")
    echo
    echo "== $queue, run $run: $rate events/s, PostgreSQL CPU $(cat "$out.cpu") ms ($(( $(cat "$out.cpu") * 1000 / EVENTS )) per 1,000 events)"
    echo "calls | rows | total ms | ms per call | statement"
    cat "$out.statements"
  done
done
