# shellcheck shell=bash
# A throwaway PostgreSQL 15 cluster configured like a production server
# (autovacuum on, naptime 60 s, cost delay 2 ms, cost limit 200, scale
# factors 0.2 / 0.1, shared_buffers 256MB, synchronous_commit on), for the
# benchmarks that must not run on this machine's shared server (which runs
# with autovacuum off): initdb in a temporary directory, its own port,
# stopped by the postmaster's PID. Sourced by long-horizon.sh and compare.sh:
#
#   source bench/lib/cluster.sh
#   trap cluster_stop EXIT
#   cluster_start PORT LOGDIR [EXTRA_CONF_LINES]   # sets CLUSTER_URL, CLUSTER_DATA
#   statements_cluster PORT LOGDIR DB              # …with pg_stat_statements and
#                                                  # database DB; sets DB_URL too
#
# PG_BIN (default /usr/lib/postgresql/15/bin) names the server's binaries.

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
CLUSTER_DATA=
CLUSTER_URL=

cluster_start() {
  local port=$1 logdir=$2 extra=${3:-}
  local as=()
  CLUSTER_DATA=$(mktemp -d /tmp/herald-cluster.XXXXXX)
  # initdb refuses to run as root: the cluster belongs to postgres then.
  if [ "$(id -u)" = 0 ]; then
    chown postgres "$CLUSTER_DATA"
    as=(runuser -u postgres --)
  fi
  "${as[@]}" "$PG_BIN/initdb" -D "$CLUSTER_DATA/db" -U postgres --auth=trust -E UTF8 >"$logdir/initdb.log"
  cat >>"$CLUSTER_DATA/db/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$CLUSTER_DATA'
max_connections = 200
shared_buffers = 256MB
synchronous_commit = on
autovacuum = on
autovacuum_naptime = 60s
autovacuum_vacuum_cost_delay = 2ms
autovacuum_vacuum_cost_limit = 200
autovacuum_vacuum_scale_factor = 0.2
autovacuum_analyze_scale_factor = 0.1
log_autovacuum_min_duration = 0
logging_collector = off
CONF
  if [ -n "$extra" ]; then printf '%s\n' "$extra" >>"$CLUSTER_DATA/db/postgresql.conf"; fi
  "${as[@]}" "$PG_BIN/postgres" -D "$CLUSTER_DATA/db" >"$logdir/postgres.log" 2>&1 &
  for _ in $(seq 1 60); do
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres && break
    sleep 0.5
  done
  "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres || {
    echo "the cluster in $CLUSTER_DATA did not start; see $logdir/postgres.log" >&2
    return 1
  }
  CLUSTER_URL=postgres://postgres@127.0.0.1:$port/postgres
}

cluster_stop() {
  local pid=
  [ -n "$CLUSTER_DATA" ] || return 0
  # The postmaster's own PID (not runuser's, which does not pass signals on).
  if [ -f "$CLUSTER_DATA/db/postmaster.pid" ]; then pid=$(head -1 "$CLUSTER_DATA/db/postmaster.pid"); fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -INT "$pid"  # fast shutdown
    for _ in $(seq 1 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    echo "postmaster $pid still running; leaving $CLUSTER_DATA" >&2
  else
    rm -rf "$CLUSTER_DATA"
  fi
}

# cluster_start with pg_stat_statements loaded and a database DB (for
# compare.sh's hook, bench/lib/mark.sh, to read); sets DB_URL to it.
statements_cluster() {
  local port=$1 logdir=$2 db=$3
  cluster_start "$port" "$logdir" "shared_preload_libraries = 'pg_stat_statements'"
  psql -qX "$CLUSTER_URL" -c "CREATE EXTENSION pg_stat_statements" -c "CREATE DATABASE $db"
  DB_URL=${CLUSTER_URL%/*}/$db
}
