#!/usr/bin/env bash
# The PostgreSQL drain measurements of docs/postgres.md: herald-peer's drain
# (bench/src/peer) on the in-process queue, each case RUNS times (default
# 3), each run under pg-cpu. Prints the drain's result line, its PostgreSQL
# CPU per 1,000 events (pg-cpu at drain-start and drain-end) and pg-cpu's
# total for the whole command (which includes the untimed emit).
#
#   bench/pg-drain.sh [URL]          # default postgres://postgres@127.0.0.1:5432/test
#   RUNS=5 EVENTS=200000 bench/pg-drain.sh
#   CASES="plain hold-tx" EXTRA="--tenants 64" bench/pg-drain.sh
#   RUNS=1 EVENTS=50000 CASES="plain limited keyed plain limited keyed" bench/pg-drain.sh
#
# Cases: plain; paused (behind 1,000,000 events of paused handlers); hold-tx
# (a transaction holds an xid for the whole drain, so vacuum can clean
# nothing); limited (the handler has a limit of 100,000 runs at once, which
# never binds: every claim goes through claim_limited and takes a slot, and
# every settle frees one, so it measures what the limit's bookkeeping costs
# per event against plain); keyed (the events carry 1,000 concurrency keys
# round robin, each limited to one run at once: an event claimed while its
# key's slot is taken is parked, and the settle that frees the slot wakes
# it, so it measures what a slot per key, parking and waking cost and how
# far one run at a time per key slows the drain; how many events park
# varies from run to run; with the default 16 tenants the keys fall into
# 2,000 tenant-key scopes, since a key counts within its tenant). Not in
# the default CASES. Each case runs RUNS times in a row: to alternate them,
# name them again, as above.
set -euo pipefail
cd "$(dirname "$0")/.."
URL=${1:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
RUNS=${RUNS:-3}
EVENTS=${EVENTS:-200000}
CASES=${CASES:-"plain paused hold-tx"}
EXTRA=${EXTRA:-}
# pg-cpu lives beside the repository, in ../shared/tools; PG_CPU=PATH
# overrides.
PG_CPU=${PG_CPU:-$PWD/../shared/tools/pg-cpu}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# The worker these measurements use: 1,024 handlers, claims of 512, a pool
# of 16 (any HERALD_ variable set overrides them).
export HERALD_WORKER_CONCURRENCY=${HERALD_WORKER_CONCURRENCY:-1024}
export HERALD_WORKER_BATCH=${HERALD_WORKER_BATCH:-512}
export HERALD_PG_MAX_CONNECTIONS=${HERALD_PG_MAX_CONNECTIONS:-16}
[ -x "$PG_CPU" ] || { echo "no pg-cpu at $PG_CPU: set PG_CPU=PATH" >&2; exit 2; }
cargo build --release -q -p herald-bench --bin herald-peer
PEER=$CARGO_TARGET_DIR/release/herald-peer
work=$(mktemp -d /tmp/herald-pg-drain.XXXXXX)
release_hold() {
  psql -qXtA "$URL" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE application_name = 'pg-drain-hold-tx'" >/dev/null
}
trap 'release_hold; rm -rf "$work"' EXIT
# The hook: PHASE and PostgreSQL's CPU ticks so far, one line per phase.
printf '#!/bin/sh\necho "$1 $("%s" --now)" >>"%s/ticks"\n' "$PG_CPU" "$work" >"$work/hook"
chmod +x "$work/hook"
hz=$(getconf CLK_TCK)
for case in $CASES; do
  case $case in
    plain|hold-tx) flags="" ;;
    paused) flags="--backlog 1000000 --backlog-kind paused" ;;
    limited) flags="--limit-running 100000" ;;
    keyed) flags="--limit-per-key 1 --keys 1000" ;;
    *) echo "unknown case $case" >&2; exit 2 ;;
  esac
  for run in $(seq 1 "$RUNS"); do
    : >"$work/ticks"
    if [ "$case" = hold-tx ]; then
      PGAPPNAME=pg-drain-hold-tx setsid psql -qX "$URL" \
        -c "BEGIN; SELECT txid_current(); SELECT pg_sleep(86400);" >/dev/null 2>&1 &
      sleep 1
    fi
    echo "== $case run $run: herald-peer --scenario drain --url $URL --events $EVENTS $flags $EXTRA"
    # shellcheck disable=SC2086
    "$PG_CPU" -- "$PEER" --scenario drain --url "$URL" --schema herald_drain --events "$EVENTS" \
      --hook "$work/hook" $flags $EXTRA | tail -2
    release_hold
    awk -v hz="$hz" -v n="$EVENTS" '$1 == "drain-start" {a = $2} $1 == "drain-end" {b = $2}
      END {printf "drain: %.0f ms PG CPU per 1,000 events\n", (b - a) * 1000 / hz * 1000 / n}' "$work/ticks"
  done
done
