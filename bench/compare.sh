#!/usr/bin/env bash
# herald beside the other queues (bench/peers/), in one sitting, on a
# throwaway PostgreSQL configured like a production server
# (bench/lib/cluster.sh) with pg_stat_statements. Every system runs every
# case in a fresh database of its own, one after another, through the
# contract of bench/peers/README.md (herald's peer is `herald-peer`,
# bench/src/peer); the hook bench/lib/mark.sh reads PostgreSQL's CPU, the
# statements and each process's CPU at the same phases for all. Then
# `report` (bench/src/report) writes OUT/report.md and its SVG charts.
#
#   bench/compare.sh                                  # everything (about an hour)
#   SYSTEMS="herald-memory skip-locked" CASES="clean latency" bench/compare.sh
#   EVENTS=50000 BACKLOG=1000000 RATES="500 2000" bench/compare.sh
#
# SYSTEMS: herald-memory herald-nats herald-pubsub herald-sqlite skip-locked
#   awa graphile-worker-rs apalis graphile-worker-js pg-boss. herald-sqlite
#   runs on its own file (only drain, latency and emit mean anything);
#   nats-server and the Pub/Sub emulator are started when missing.
# CASES: clean (drain EVENTS); delayed, stale, mid-analyze (BACKLOG_EVENTS
#   behind BACKLOG delayed a day; stale: statistics taken on the backlog
#   alone; mid-analyze: an ANALYZE half-way); paused (herald only: behind
#   BACKLOG paused over 1,000 tenants); hold-tx (clean while a transaction
#   holds an xid); latency (each of RATES for LATENCY_SECONDS); idle
#   (IDLE_SECONDS); long-horizon (LH_RATE/s of a LH_WORK_MS handler for
#   LH_SECONDS, the tables sampled every LH_SAMPLE s; with LH_HOLD, a
#   transaction holds an xid for LH_HOLD s from LH_HOLD_AT); rescue (a victim
#   holding RESCUE_EVENTS is SIGKILLed, a second process runs them within
#   RESCUE_TIMEOUT s); emit (herald only: single emits, then batches).
# HERALD_WORKER_CONCURRENCY (512), HERALD_WORKER_CLAIM_AHEAD (4096) and any
#   other HERALD_ variable: herald's settings.
# FULL_SYSTEMS/OTHER_CASES: systems not in FULL_SYSTEMS run OTHER_CASES.
# REPEAT (1): runs of each drain case, in rounds across systems; the report
#   gives median and range. REPEAT_CASES and REPEAT_SYSTEMS narrow it.
# PUBSUB_PULL (unary): how herald-pubsub pulls from the emulator
#   (docs/pubsub.md). OUT (bench-results/compare-DATE), PORT (54331),
#   PG_CPU, PEERS_TARGET (target/peers), BUILD=0 (use the binaries built),
#   WARM=0 (skip bench/lib/warm-memory.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SYSTEMS=${SYSTEMS:-"herald-memory herald-nats skip-locked awa graphile-worker-rs apalis graphile-worker-js pg-boss herald-pubsub"}
CASES=${CASES:-"clean delayed paused hold-tx stale mid-analyze latency idle long-horizon rescue"}
EVENTS=${EVENTS:-200000}
BACKLOG_EVENTS=${BACKLOG_EVENTS:-50000}
BACKLOG=${BACKLOG:-1000000}
RATES=${RATES:-"1000 2000 4000 8000"}
LATENCY_SECONDS=${LATENCY_SECONDS:-15}
IDLE_SECONDS=${IDLE_SECONDS:-60}
LH_RATE=${LH_RATE:-1000}
LH_SECONDS=${LH_SECONDS:-600}
LH_WORK_MS=${LH_WORK_MS:-1}
LH_SAMPLE=${LH_SAMPLE:-5}
LH_HOLD=${LH_HOLD:-0}
LH_HOLD_AT=${LH_HOLD_AT:-$((LH_SECONDS / 3))}
# herald sized for short handlers, as every peer is sized by its own
# throughput advice (docs/serve.md, "Sizing"); knobs land in each result.
export HERALD_WORKER_CONCURRENCY=${HERALD_WORKER_CONCURRENCY:-512}
export HERALD_WORKER_CLAIM_AHEAD=${HERALD_WORKER_CLAIM_AHEAD:-4096}
REPEAT=${REPEAT:-1}
REPEAT_CASES=${REPEAT_CASES:-"clean delayed paused hold-tx stale mid-analyze"}
REPEAT_SYSTEMS=${REPEAT_SYSTEMS:-$SYSTEMS}
RESCUE_EVENTS=${RESCUE_EVENTS:-2000}
RESCUE_TIMEOUT=${RESCUE_TIMEOUT:-120}
PORT=${PORT:-54331}
OUT=${OUT:-bench-results/compare-$(date +%Y%m%d-%H%M%S)}
PG_CPU=${PG_CPU:-$ROOT/../shared/tools/pg-cpu}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ -x "$PG_CPU" ] || { echo "no pg-cpu at $PG_CPU: set PG_CPU=PATH" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

echo "== building (load $(cut -d' ' -f1-3 /proc/loadavg))"
BIN=$CARGO_TARGET_DIR/release
PEERS_TARGET=${PEERS_TARGET:-$CARGO_TARGET_DIR/peers}
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p herald-bench --bin herald-peer --bin report
for s in $SYSTEMS; do
  [ "${BUILD:-1}" = 0 ] && break
  dir=bench/peers/$s
  if [ -f "$dir/Cargo.toml" ]; then
    CARGO_TARGET_DIR=$PEERS_TARGET cargo build --release -q --manifest-path "$dir/Cargo.toml"
  elif [ -f "$dir/package.json" ]; then
    (cd "$dir" && npm ci --silent --no-audit --no-fund)
  fi
done

# Every page of memory touched once before the first run, so that no
# run pays the VM's once-per-boot first-touch faults
# (bench/lib/warm-memory.sh says why). WARM=0 skips it.
WARMED="not touched (WARM=0)"
if [ "${WARM:-1}" != 0 ]; then
  echo "== touching the available memory once (bench/lib/warm-memory.sh)"
  # A touch that did nothing (no python3, killed for memory) is written
  # down, not fatal: the sitting is still valid, its first rounds dearer.
  if read -r gib secs < <(bash bench/lib/warm-memory.sh); then
    WARMED="$gib GiB touched in $secs s before the first run"
  else
    WARMED="not touched (bench/lib/warm-memory.sh said why on stderr)"
  fi
fi

NATS_PID=
NATS_DIR=
PUBSUB_PID=
stop_all() {
  if [ -n "$NATS_PID" ]; then kill "$NATS_PID" 2>/dev/null || true; wait "$NATS_PID" 2>/dev/null || true; rm -rf "$NATS_DIR"; fi
  if [ -n "$PUBSUB_PID" ]; then kill -- -"$PUBSUB_PID" 2>/dev/null || true; wait "$PUBSUB_PID" 2>/dev/null || true; fi
  cluster_stop
}
# shellcheck source=lib/cluster.sh
source bench/lib/cluster.sh
trap stop_all EXIT
case " $SYSTEMS " in
  *" herald-nats "*)
    if ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
      NATS_DIR=$(mktemp -d /tmp/herald-compare-nats.XXXXXX)
      nats-server -js -sd "$NATS_DIR" -a 127.0.0.1 -p 4222 >"$OUT/nats.log" 2>&1 &
      NATS_PID=$!
      sleep 1
    fi ;;
esac
case " $SYSTEMS " in
  *" herald-pubsub "*)
    export PUBSUB_EMULATOR_HOST=127.0.0.1:8085
    export HERALD_PUBSUB_PULL=${PUBSUB_PULL:-unary}
    if ! (exec 3<>/dev/tcp/127.0.0.1/8085) 2>/dev/null; then
      emulator=$(command -v cloud-pubsub-emulator || echo /usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator)
      [ -x "$emulator" ] || { echo "no Pub/Sub emulator (google-cloud-cli-pubsub-emulator; test.sh installs it)" >&2; exit 2; }
      setsid "$emulator" --host=127.0.0.1 --port=8085 >"$OUT/pubsub.log" 2>&1 &
      PUBSUB_PID=$!
      for _ in $(seq 1 60); do (exec 3<>/dev/tcp/127.0.0.1/8085) 2>/dev/null && break; sleep 0.5; done
    fi ;;
esac
cluster_start "$PORT" "$OUT" "shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.max = 10000"
export ADMIN_URL=$CLUSTER_URL PG_CPU
psql -qX "$ADMIN_URL" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB, $WARMED"
  echo "postgres: $("$PG_BIN/postgres" --version)"
  echo "node: $(node --version 2>/dev/null || echo none)"
  echo "nats: $(nats-server --version 2>/dev/null || echo none)"
  echo "settings: events=$EVENTS backlog_events=$BACKLOG_EVENTS backlog=$BACKLOG rates=\"$RATES\" latency_seconds=$LATENCY_SECONDS idle_seconds=$IDLE_SECONDS"
  echo "cases: $CASES; systems running other cases: ${FULL_SYSTEMS:+all but $FULL_SYSTEMS run $OTHER_CASES}"
  # Only the cases that run: a header naming a long horizon that did not
  # run reads as if it had.
  case " $CASES ${OTHER_CASES:-} " in
    *" long-horizon "*) echo "long horizon: rate=$LH_RATE seconds=$LH_SECONDS work_ms=$LH_WORK_MS sample=$LH_SAMPLE hold=$LH_HOLD hold_at=$LH_HOLD_AT" ;;
  esac
  case " $CASES ${OTHER_CASES:-} " in
    *" rescue "*) echo "rescue: events=$RESCUE_EVENTS timeout=$RESCUE_TIMEOUT" ;;
  esac
  [ "$REPEAT" -le 1 ] || echo "repeat: $REPEAT runs of $REPEAT_CASES for $REPEAT_SYSTEMS"
} >"$OUT/machine.txt"
# What the cluster costs with no client at all (checkpointer, WAL writer,
# autovacuum launcher, statistics): the floor under every idle figure.
hz=$(getconf CLK_TCK)
before=$("$PG_CPU" --now)
sleep "$IDLE_SECONDS"
echo "idle cluster, no client: $(( ($("$PG_CPU" --now) - before) * 1000 / hz )) ms PG CPU in $IDLE_SECONDS s" >>"$OUT/machine.txt"
cat "$OUT/machine.txt"

# The command line of SYSTEM for SCENARIO with extra contract flags;
# herald's adds its store and queue.
command_of() {
  local system=$1 scenario=$2 url=$3; shift 3
  case $system in
    herald-*)
      local queue=memory
      [ "$system" = herald-sqlite ] && url=sqlite
      [ "$system" = herald-nats ] && queue=nats://127.0.0.1:4222
      # The emulator keeps topics until it stops: one of its own per run.
      [ "$system" = herald-pubsub ] && queue="pubsub://herald-bench/compare-$RUN_ID?subscription=compare-$RUN_ID-workers"
      echo "$BIN/herald-peer" --url "$url" --scenario "$scenario" --queue "$queue" --dir "$OUT" "$@" ;;
    *)
      local dir=bench/peers/$system
      if [ -f "$dir/package.json" ]; then
        echo node "$dir/main.mjs" --url "$url" --scenario "$scenario" "$@"
      else
        echo "$PEERS_TARGET/release/$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/Cargo.toml" | head -1)" \
          --url "$url" --scenario "$scenario" "$@"
      fi ;;
  esac
}

# The database's dead and live tuples, total size (tables, indexes, TOAST)
# and autovacuum/autoanalyze runs, every LH_SAMPLE s into CSV $2, until
# killed. $1 the database.
sample_tables() {
  local url=${ADMIN_URL%/*}/$1 out=$2 t0
  t0=$(date +%s%3N)
  echo "t_s,dead_tuples,live_tuples,bytes,autovacuums,autoanalyzes" >"$out"
  while :; do
    local row
    row=$(psql -qXtA -F, "$url" -c "SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_live_tup), 0),
        coalesce(sum(pg_total_relation_size(relid)), 0), coalesce(sum(autovacuum_count), 0),
        coalesce(sum(autoanalyze_count), 0) FROM pg_stat_user_tables" 2>/dev/null) || row=
    [ -n "$row" ] && echo "$(( ($(date +%s%3N) - t0) / 1000 )),$row" >>"$out"
    sleep "$LH_SAMPLE"
  done
}

# A transaction that holds an xid in database $1 for LH_HOLD s from
# LH_HOLD_AT s on (vacuum can clean nothing behind it); ended at the
# run's end by release_hold if it still runs.
hold_tx() {
  sleep "$LH_HOLD_AT"
  PGAPPNAME=bench-hold-tx psql -qX "${ADMIN_URL%/*}/$1" \
    -c "BEGIN; SELECT txid_current(); SELECT pg_sleep($LH_HOLD); COMMIT;" >/dev/null 2>&1 || true
}
release_hold() {
  psql -qXtA "$ADMIN_URL" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE application_name = 'bench-hold-tx'" >/dev/null
}

# begin_run SYSTEM CASE NAME: a fresh database and run directory; sets
# dir, db, url, RUN_ID and broker.
begin_run() {
  local system=$1 case=$2 name=$3
  dir=$OUT/runs/$name
  mkdir -p "$dir"
  db=bench_$(echo "$system" | tr -c 'a-z0-9\n' '_')
  RUN_ID=$(echo "$name" | tr -c 'a-z0-9\n' '-')
  psql -qX "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  url=${ADMIN_URL%/*}/$db
  : >"$dir/marks"
  broker=none
  case $system in herald-nats) broker=nats ;; herald-pubsub) broker=pubsub ;; esac
}

# start_process CASE CMD…: one system process in the background with the
# hook, its output in $dir/stdout and stderr, its PID in $dir/pid.
start_process() {
  local case=$1; shift
  MARKS=$dir/marks CASE=$case DB=$db PEER_PID_FILE=$dir/pid BROKER=$broker \
    "$@" --hook "$ROOT/bench/lib/mark.sh" >"$dir/stdout" 2>"$dir/stderr" &
  echo $! >"$dir/pid"
}

# end_run RC: the run's outcome, then its database dropped.
end_run() {
  local rc=$1
  if [ "$rc" -ne 0 ]; then
    echo "   failed (exit $rc): $(tail -3 "$dir/stderr")"
    echo "$rc" >"$dir/failed"
  else
    tail -1 "$dir/stdout"
  fi
  psql -qX "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
}

# run SYSTEM CASE SCENARIO ARGS…: one run in a fresh database; the
# second and later of a repeated case are SYSTEM.CASE.runK (RUN_SUFFIX), a
# latency run's SYSTEM.latency.RATE.runK.
run() {
  local system=$1 case=$2 scenario=$3; shift 3
  local name=$system.$case dir db url broker sampler= holder=
  [ "$scenario" = latency ] && name=$name.$(echo "$@" | sed -n 's/.*--rate \([0-9]*\).*/\1/p')
  name=$name${RUN_SUFFIX:-}
  begin_run "$system" "$case" "$name"
  # shellcheck disable=SC2207
  local cmd=($(command_of "$system" "$scenario" "$url" "$@"))
  echo "== $name: ${cmd[*]} (load $(cut -d' ' -f1 /proc/loadavg))"
  printf '%s\n' "$system" "$case" "${cmd[*]}" >"$dir/run.txt"
  if [ "$scenario" = long-horizon ]; then
    sample_tables "$db" "$dir/samples.csv" &
    sampler=$!
    if [ "$LH_HOLD" != 0 ]; then hold_tx "$db" & holder=$!; fi
  fi
  start_process "$case" "${cmd[@]}"
  local rc=0
  wait "$(cat "$dir/pid")" || rc=$?
  [ -z "$sampler" ] || { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true; }
  [ -z "$holder" ] || { kill "$holder" 2>/dev/null || true; release_hold; wait "$holder" 2>/dev/null || true; }
  end_run $rc
}

# repeated SYSTEM CASE SCENARIO ARGS…: the run of this round ($ROUND)
# if the cell repeats or this is the first round; the second and later
# as SYSTEM.CASE.runK.
repeated() {
  local reps=1
  case " $REPEAT_SYSTEMS " in *" $1 "*) case " $REPEAT_CASES " in *" $2 "*) reps=$REPEAT ;; esac ;; esac
  [ "$ROUND" -le "$reps" ] || return 0
  RUN_SUFFIX=
  [ "$ROUND" = 1 ] || RUN_SUFFIX=.run$ROUND
  run "$@"
  RUN_SUFFIX=
}

# rescue SYSTEM: a victim process takes RESCUE_EVENTS jobs and is SIGKILLed
# once its handlers are busy (it says so on stdout); then a rescuer process
# on the same database runs them. The rescuer's result is the run's.
rescue() {
  local system=$1 name=$1.rescue dir db url broker
  begin_run "$system" rescue "$name"
  # shellcheck disable=SC2207
  local victim=($(command_of "$system" rescue "$url" --role victim --events "$RESCUE_EVENTS"))
  echo "== $name: ${victim[*]} (load $(cut -d' ' -f1 /proc/loadavg))"
  start_process rescue "${victim[@]}"
  local pid rc=0
  pid=$(cat "$dir/pid")
  for _ in $(seq 1 600); do
    grep -q '"role": *"victim"' "$dir/stdout" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if ! grep -q '"role": *"victim"' "$dir/stdout" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    printf '%s\n' "$system" rescue "${victim[*]}" >"$dir/run.txt"
    end_run 1
    return
  fi
  local killed_at
  killed_at=$(date +%s%3N)
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  mv "$dir/stdout" "$dir/victim.stdout"
  mv "$dir/stderr" "$dir/victim.stderr"
  # shellcheck disable=SC2207
  local cmd=($(command_of "$system" rescue "$url" --role rescuer --events "$RESCUE_EVENTS" \
    --killed-at "$killed_at" --timeout "$RESCUE_TIMEOUT"))
  printf '%s\n' "$system" rescue "${cmd[*]}" >"$dir/run.txt"
  start_process rescue "${cmd[@]}"
  wait "$(cat "$dir/pid")" || rc=$?
  end_run $rc
}

# Round 1 runs every cell; rounds 2 to REPEAT run the repeated drains (and latency)
# again, every system in turn, so that the repeats of one system are
# minutes apart, as the other systems' are: a slow stretch of this shared
# machine then falls on every system's runs rather than on one system's
# three in a row.
for ROUND in $(seq 1 "$REPEAT"); do
  for system in $SYSTEMS; do
    cases=$CASES
    # A shortened sitting may run fewer cases for some systems (each run's
    # directory says what ran; the report leaves the others' cells empty).
    case " ${FULL_SYSTEMS:-$SYSTEMS} " in *" $system "*) ;; *) cases=${OTHER_CASES:-$CASES} ;; esac
    for case in $cases; do
      # Past the first round, only the repeated drains and latency.
      if [ "$ROUND" -gt 1 ]; then
        case $case in clean|hold-tx|delayed|stale|mid-analyze|paused|latency) ;; *) continue ;; esac
      fi
      case $case in
        clean|hold-tx) repeated "$system" "$case" drain --events "$EVENTS" ;;
        delayed|stale|mid-analyze) repeated "$system" "$case" drain --events "$BACKLOG_EVENTS" --backlog "$BACKLOG" ;;
        paused)
          case $system in
            herald-*) repeated "$system" "$case" drain --events "$BACKLOG_EVENTS" --backlog "$BACKLOG" --backlog-kind paused ;;
            *) ;;  # no per-tenant pause to compare with
          esac ;;
        latency) for r in $RATES; do repeated "$system" "$case" latency --rate "$r" --seconds "$LATENCY_SECONDS"; done ;;
        idle) run "$system" "$case" idle --seconds "$IDLE_SECONDS" ;;
        emit)
          case $system in herald-*) run "$system" "$case" emit ;; *) ;; esac ;;
        long-horizon)
          [ "$system" = herald-sqlite ] && continue  # its own file: no table samples
          run "$system" "$case" long-horizon --rate "$LH_RATE" --seconds "$LH_SECONDS" --work-ms "$LH_WORK_MS" ;;
        rescue)
          [ "$system" = herald-sqlite ] && continue
          rescue "$system" ;;
        *) echo "unknown case $case" >&2; exit 2 ;;
      esac
    done
  done
done
"$BIN/report" "$OUT"
echo "results: $OUT/report.md (and its charts, runs/ for every run's output)"
