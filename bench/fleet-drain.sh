#!/usr/bin/env bash
# No-op drain by 1, 2 and 3 `herald serve` worker processes on PostgreSQL +
# a queue (bench/src/fleet_drain.rs): RUNS runs of each (default 3), each
# run's line, then a table of medians per queue. QUEUES: nats, pubsub (the
# emulator at PUBSUB, default 127.0.0.1:8085) or both; default nats.
#
#   bench/fleet-drain.sh
#   QUEUES="nats pubsub" WORKERS="1 3" bench/fleet-drain.sh
#   RUNS=5 EVENTS=100000 WORKERS="1 3" EXTRA="--concurrency 256" bench/fleet-drain.sh
#   EXTRA="--notify-max-ids 1" bench/fleet-drain.sh   # one message per event, as before batching
#   STORE=postgres://… NATS=nats://… HERALD=/path/to/herald bench/fleet-drain.sh
#   QUIET=1.0 bench/fleet-drain.sh   # before each run, wait (up to 30 min) for
#                                    # the 1-minute load average to drop below 1.0
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
EVENTS=${EVENTS:-200000}
WORKERS=${WORKERS:-"1 2 3"}
EXTRA=${EXTRA:-}
STORE=${STORE:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
NATS=${NATS:-${NATS_URL:-nats://127.0.0.1:4222}}
PUBSUB=${PUBSUB:-${PUBSUB_EMULATOR_HOST:-127.0.0.1:8085}}
QUEUES=${QUEUES:-nats}
# pg-cpu lives beside the repository, in ../shared/tools (the script's own
# "$(dirname "$0")/../../shared/tools/pg-cpu"; this line runs from the
# repository's root); PG_CPU=PATH overrides.
PG_CPU=${PG_CPU:-$PWD/../shared/tools/pg-cpu}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# HERALD=PATH: a herald binary of your own (the shared target directory's
# may be rebuilt by someone else from other sources while this runs).
if [ -n "${HERALD:-}" ]; then
  cargo build --release -q -p herald-bench --bin fleet-drain
else
  cargo build --release -q -p herald-server -p herald-bench --bin herald --bin fleet-drain
fi
BIN=$CARGO_TARGET_DIR/release
HERALD=${HERALD:-$BIN/herald}
pg_cpu=()
[ -x "$PG_CPU" ] && pg_cpu=(--pg-cpu "$PG_CPU")
# The broker's CPU: the nats-server, or the emulator's java process.
broker_pid() {
  local pid
  case "$1" in
    nats) pid=$(pgrep -xo nats-server || true) ;;
    pubsub) pid=$(pgrep -fo 'cloud-pubsub-emulator.*--port='"${PUBSUB##*:}" || true) ;;
  esac
  [ -n "$pid" ] && echo "--broker-pid $pid"
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
QUIET=${QUIET:-}
wait_quiet() {
  [ -n "$QUIET" ] || return 0
  local waited=0
  until awk -v q="$QUIET" '{ exit !($1 < q) }' /proc/loadavg; do
    if [ "$waited" -ge 1800 ]; then
      echo "load average still $(cut -d' ' -f1 /proc/loadavg) after 30 min; running anyway"
      return 0
    fi
    sleep 10
    waited=$((waited + 10))
  done
}
for queue in $QUEUES; do
  for n in $WORKERS; do
    for run in $(seq 1 "$RUNS"); do
      wait_quiet
      echo "== queue=$queue workers=$n run $run"
      # shellcheck disable=SC2086
      "$BIN/fleet-drain" --herald "$HERALD" --store "$STORE" --queue "$queue" --nats "$NATS" --pubsub "$PUBSUB" \
        --workers "$n" --events "$EVENTS" "${pg_cpu[@]}" $(broker_pid "$queue") $EXTRA | tee -a "$out"
    done
  done
done
echo
echo "medians of $RUNS runs, $EVENTS events each"
awk '
  function field(name,   i, kv) {
    for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == name) return kv[2] }
    return ""
  }
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    if (n == 0) return "-"
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  /^fleet-drain / {
    w = field("queue") " " field("workers"); seen[w] = 1; order[++nseen] = w
    for (k = 1; k <= ncols; k++) { v = field(cols[k]); if (v != "") vals[w, k] = vals[w, k] " " v }
  }
  BEGIN {
    ncols = split("events_per_s steady_events_per_s startup_s drain_s max_unacked lease_renewals pg_cpu_ms_per_1000 workers_cpu_ms_per_1000 broker_cpu_ms_per_1000 machine_busy_pct load_before", cols, " ")
  }
  END {
    printf "%-14s", "queue workers"; for (k = 1; k <= ncols; k++) printf " %s", cols[k]; printf "\n"
    for (i = 1; i <= nseen; i++) {
      w = order[i]; if (w in printed) continue; printed[w] = 1
      printf "%-14s", w
      for (k = 1; k <= ncols; k++) printf " %*s", length(cols[k]), median(vals[w, k])
      printf "\n"
    }
  }' "$out"
