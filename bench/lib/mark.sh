#!/usr/bin/env bash
# The phase hook of bench/compare.sh: `mark.sh PHASE`, called by
# herald-peer and by every peer (bench/peers/README.md) at each phase of a run.
# It appends one line to $MARKS:
#
#   PHASE WALL_MS PG_CPU_MS STATEMENTS PEER_CPU_MS BROKER_CPU_MS BUFFERS
#
# (PostgreSQL's server CPU by ../shared/tools/pg-cpu, the statements
# pg_stat_statements has counted in the run's database, the peer's own
# process CPU, the broker's CPU (nats-server, or the Pub/Sub emulator's
# processes, as $BROKER says), the shared buffers the counted statements
# hit or read in; each a running total, so the report
# subtracts one phase from another) and does what the run's $CASE asks at
# that phase:
#
#   (every case) drain-start: CHECKPOINT, last (see below)
#   (every case but stale)
#                drain-start: ANALYZE, so every system starts its drain with
#                current statistics (as a steady autovacuum would give; no
#                peer runs its own ANALYZE)
#   stale        after-backlog: VACUUM ANALYZE (statistics taken while only
#                the backlog is stored), none at drain-start
#   mid-analyze  mid-drain: ANALYZE (what autovacuum does on a busy table),
#                its own backend's CPU written to analyze.txt
#   hold-tx      drain-start: open a transaction that holds an xid (vacuum
#                can clean nothing after it); drain-end: end it
#
# Environment (set by compare.sh): MARKS, CASE, DB (the run's database),
# ADMIN_URL (the cluster's postgres database), PEER_PID_FILE, PG_CPU,
# BROKER (nats, pubsub or none).
set -euo pipefail
phase=$1
hz=$(getconf CLK_TCK)
ticks_of() {  # utime + stime of a PID, in clock ticks
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  s=${s##*) }
  # shellcheck disable=SC2086
  set -- $s
  echo $(( ${12} + ${13} ))
}
db_url=${ADMIN_URL%/*}/$DB
case "$CASE:$phase" in
  stale:*) ;;
  *:drain-start) psql -qX "$db_url" -c "ANALYZE" >/dev/null ;;
esac
case "$CASE:$phase" in
  stale:after-backlog) psql -qX "$db_url" -c "VACUUM ANALYZE" >/dev/null ;;
  mid-analyze:mid-drain)
    # The ANALYZE's own backend CPU (analyze.txt: analyze_cpu_ms N),
    # so the report can tell the statistics' cost, which any queue pays,
    # from the queue's cost after them.
    ticks=$(psql -qXtA "$db_url" <<'SQL'
SELECT pg_backend_pid() AS pid \gset
\setenv BACKEND_PID :pid
\! awk '{print "before", $14 + $15}' /proc/$BACKEND_PID/stat
ANALYZE;
\! awk '{print "after", $14 + $15}' /proc/$BACKEND_PID/stat
SQL
)
    b=$(echo "$ticks" | awk '$1 == "before" {print $2}')
    a=$(echo "$ticks" | awk '$1 == "after" {print $2}')
    echo "analyze_cpu_ms $(( (a - b) * 1000 / hz ))" >"$(dirname "$MARKS")/analyze.txt" ;;
  hold-tx:drain-start)
    PGAPPNAME=bench-hold-tx setsid psql -qX "$db_url" \
      -c "BEGIN; SELECT txid_current(); SELECT pg_sleep(86400);" >/dev/null 2>&1 &
    # Until its xid is taken: the drain must start behind it.
    for _ in $(seq 1 100); do
      n=$(psql -qXtA "$ADMIN_URL" -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bench-hold-tx' AND backend_xid IS NOT NULL")
      [ "$n" -gt 0 ] && break
      sleep 0.05
    done ;;
  hold-tx:drain-end)
    psql -qXtA "$ADMIN_URL" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'bench-hold-tx'" >/dev/null ;;
esac
# mid-drain is a signal, not a reading: the report reads only the timed
# part's two ends, and a reading (pg-cpu walks /proc, forking readlink and
# cat per process, and two psql calls) costs a few hundred ms of CPU inside
# the timed drain: in a 2-s drain on two cores about a tenth of the
# machine (perf -a, 2026-12-06), more of a short drain than of a long one.
[ "$phase" != mid-drain ] || exit 0
# Every drain starts right after a checkpoint. A backlog's load (a
# million rows, about 1 GB of WAL) sets off a checkpoint by max_wal_size
# that was often still writing when the timed drain began, its writes (the
# checkpointer's CPU is PostgreSQL's) and full-page images landing in some
# drains and not in others. Forced here, the pending one ends before the
# drain, and every system's drain pays the same thing: a full-page image
# at the first change of each page, as any drain just after a checkpoint
# does.
case $phase in
  drain-start) psql -qX "$ADMIN_URL" -c "CHECKPOINT" >/dev/null ;;
esac
# The statements of the timed part alone, per run: forgotten as it starts
# (before its running total is read, so the totals stay consistent), the
# costliest written to statements.txt beside the marks as it ends, with
# the shared buffers each found (hit) and had to read in (read): a backlog
# larger than shared_buffers shows as reads.
dbid="(SELECT oid FROM pg_database WHERE datname = '$DB')"
case $phase in
  drain-start|run-start|idle-start|rescue-start)
    psql -qXtA "$ADMIN_URL" -c "SELECT pg_stat_statements_reset(0, $dbid, 0)" >/dev/null ;;
  drain-end|run-end|idle-end|rescue-end)
    psql -qX "$ADMIN_URL" -P pager=off -c "SELECT calls, rows, round(total_exec_time::numeric, 1) AS total_ms,
        round(mean_exec_time::numeric, 3) AS mean_ms, pg_size_pretty(wal_bytes) AS wal,
        shared_blks_hit AS hit, shared_blks_read AS read,
        left(regexp_replace(query, '\s+', ' ', 'g'), 140) AS query
      FROM pg_stat_statements WHERE dbid = $dbid ORDER BY total_exec_time DESC LIMIT 15" \
      >"$(dirname "$MARKS")/statements.txt" ;;
esac
pg_ms=$(( $("$PG_CPU" --now) * 1000 / hz ))
# The same CPU process by process at the timed part's two ends, so that a
# drain's PostgreSQL CPU can be told apart by who spent it (the run's
# connections, an autovacuum worker, the checkpointer, …): pg-cpu.PHASE
# holds `PID TICKS TITLE` per server process, and for the postmaster also
# `PID TICKS exited children` (what its ended children spent: an
# autovacuum worker's run ends so), after a first line `# hz N` (the
# ticks' clock rate); bench/pg-cpu-split.sh reads them.
case $phase in
  drain-start|drain-end|run-start|run-end)
    echo "# hz $hz" >"$(dirname "$MARKS")/pg-cpu.$phase"
    for p in /proc/[0-9]*; do
      exe=$(readlink "$p/exe" 2>/dev/null) || continue
      case "$exe" in */bin/postgres) ;; *) continue ;; esac
      s=$(cat "$p/stat" 2>/dev/null) || continue
      title=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
      s=${s##*) }
      # shellcheck disable=SC2086
      set -- $s
      echo "${p#/proc/} $(( ${12} + ${13} )) $title"
      case $title in *" -D "*) echo "${p#/proc/} $(( ${14} + ${15} )) exited children" ;; esac
    done >>"$(dirname "$MARKS")/pg-cpu.$phase" ;;
esac
# The statements and the shared buffers they touched (hit or read in):
# work that, unlike CPU time, does not move with the machine's speed.
read -r statements buffers < <(psql -qXtA -F ' ' "$ADMIN_URL" -c "SELECT coalesce(sum(calls), 0),
    coalesce(sum(shared_blks_hit + shared_blks_read), 0) FROM pg_stat_statements WHERE dbid = $dbid")
peer_ms=$(( $(ticks_of "$(cat "$PEER_PID_FILE")") * 1000 / hz ))
broker=0
case ${BROKER:-none} in
  nats) pids=$(pgrep -x nats-server || true) ;;
  pubsub) pids=$(pgrep -f 'cloud-pubsub-emulator' || true) ;;
  *) pids= ;;
esac
for p in $pids; do broker=$(( broker + $(ticks_of "$p") )); done
echo "$phase $(date +%s%3N) $pg_ms $statements $peer_ms $(( broker * 1000 / hz )) $buffers" >>"$MARKS"
