#!/usr/bin/env bash
# Single and batched emits over HTTP, then emit-to-start latency at a
# steady rate (bench/src/http_emit.rs), against a `herald serve` this script
# starts on PostgreSQL (a fresh schema, `herald_http_emit`) with no-op
# handlers, and stops (by PID) when it ends. PostgreSQL's CPU over the whole
# run is printed last (../shared/tools/pg-cpu).
#
#   bench/http-emit.sh                                   # NATS, the defaults
#   QUEUE=memory bench/http-emit.sh --single 20000 --batched 0 --rate 1000 --seconds 10
#   HERALD_GROUP_COMMIT_WRITES=0 bench/http-emit.sh …    # any HERALD_… setting of the server
#   STORE=postgres://… NATS=nats://… PORT=7979 bench/http-emit.sh
#
# Arguments go to http-emit (`http-emit --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
STORE=${STORE:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
NATS=${NATS:-${NATS_URL:-nats://127.0.0.1:4222}}
QUEUE=${QUEUE:-nats}
PORT=${PORT:-7979}
SCHEMA=herald_http_emit
PG_CPU=${PG_CPU:-$PWD/../shared/tools/pg-cpu}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p herald-server -p herald-bench --bin herald --bin http-emit
BIN=$CARGO_TARGET_DIR/release
case "$QUEUE" in
  nats) queue=$NATS ;;
  memory) queue=memory ;;
  *) echo "QUEUE is nats or memory, not $QUEUE" >&2; exit 2 ;;
esac
psql "$STORE" -q -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE"
"$BIN/herald" migrate --store "$STORE" --schema "$SCHEMA" >/dev/null
log=$(mktemp)
"$BIN/herald" serve --store "$STORE" --schema "$SCHEMA" --queue "$queue" \
  --listen "127.0.0.1:$PORT" --noop-handler http-emit-single \
  --noop-handler http-emit-batch --noop-handler http-emit-steady >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { echo "herald serve did not start:"; cat "$log"; exit 1; }
  sleep 0.1
done
before=$("$PG_CPU" --now)
rc=0
"$BIN/http-emit" --url "http://127.0.0.1:$PORT" "$@" || rc=$?
after=$("$PG_CPU" --now)
echo "server_cpu=$(ps -o cputime= -p "$server" | tr -d ' ') postgres_cpu_ms=$(( (after - before) * 1000 / $(getconf CLK_TCK) ))"
exit $rc
