#!/usr/bin/env bash
# The chaos soak (bench/src/chaos/): `herald serve` processes running
# command handlers that write a ledger, a producer emitting over HTTP with
# idempotency keys, faults at random (seeded, printed), then invariants.
# Ends with `N passed, M failed`; exits 1 if an invariant failed.
#
#   bench/chaos.sh                         # CI mode: PostgreSQL + NATS, ~4 min of faults
#   bench/chaos.sh --store sqlite          # one embedded server (SQLite + in-process queue)
#   bench/chaos.sh --queue pubsub          # PostgreSQL + the Pub/Sub emulator (or --queue both)
#   bench/chaos.sh --long                  # 50,000 events, 20 min of faults
#   bench/chaos.sh --seed 1234             # replay one seed's choices; other flags go to the program
#
# Everything runs on its own: a private PostgreSQL cluster (bench/lib/cluster.sh)
# on PG_PORT (default 25432), a private nats-server on NATS_PORT (24222) with its
# own store, the emulator on PUBSUB_PORT (28085). All of it is stopped by PID on
# exit. The ledger, configs and logs stay in the work directory it prints
# (KEEP=0 removes it when every invariant passed).
# PROFILE=release builds and runs release binaries (default debug).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib/cluster.sh

LONG=0
QUEUE=nats
STORE=postgres
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --long) LONG=1 ;;
    --queue) QUEUE=$2; shift ;;
    --store) STORE=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) PASS+=("$1") ;;
  esac
  shift
done
case "$QUEUE" in nats) QUEUES=(nats) ;; pubsub) QUEUES=(pubsub) ;; both) QUEUES=(nats pubsub) ;;
  *) echo "chaos.sh: --queue nats|pubsub|both" >&2; exit 2 ;; esac
case "$STORE" in postgres|sqlite) ;; *) echo "chaos.sh: --store postgres|sqlite" >&2; exit 2 ;; esac

PG_PORT=${PG_PORT:-25432}
NATS_PORT=${NATS_PORT:-24222}
PUBSUB_PORT=${PUBSUB_PORT:-28085}
PROFILE=${PROFILE:-debug}
KEEP=${KEEP:-1}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
release=()
[ "$PROFILE" = release ] && release=(--release)
cargo build -q "${release[@]}" -p herald-server -p herald-bench --bin herald --bin chaos
BIN=$CARGO_TARGET_DIR/$PROFILE

if [ "$LONG" = 1 ]; then
  SIZE=(--events 50000 --fault-secs 1200 --settle-secs 300)
elif [ "$STORE" = sqlite ]; then
  SIZE=(--events 1500 --fault-secs 150 --settle-secs 60)
else
  SIZE=(--events 2500 --fault-secs 210 --settle-secs 90)
fi

WORK=$(mktemp -d /tmp/herald-chaos.XXXXXX)
EMULATOR_PID=
cleanup() {
  local status=$? pid
  # Whatever the program started (servers, nats-server), if it died first.
  for f in "$WORK"/*/pids; do
    [ -f "$f" ] || continue
    while read -r pid; do
      if [ -n "$pid" ] && grep -qa -e herald -e nats-server "/proc/$pid/cmdline" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done <"$f"
  done
  # The emulator runs in a process group of its own (setsid): its Java child too.
  if [ -n "$EMULATOR_PID" ]; then kill -TERM -- "-$EMULATOR_PID" 2>/dev/null || true; fi
  cluster_stop
  if [ "$status" = 0 ] && [ "$KEEP" = 0 ]; then rm -rf "$WORK"; else echo "chaos: work directory $WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() {
  for _ in $(seq 1 240); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}

failed=0
if [ "$STORE" = sqlite ]; then
  "$BIN/chaos" --herald "$BIN/herald" --store sqlite --workdir "$WORK/sqlite" "${SIZE[@]}" "${PASS[@]}" || failed=1
else
  cluster_start "$PG_PORT" "$WORK"
  for queue in "${QUEUES[@]}"; do
    if [ "$queue" = pubsub ] && [ -z "$EMULATOR_PID" ]; then
      setsid /usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator \
        --host=127.0.0.1 --port="$PUBSUB_PORT" >"$WORK/pubsub-emulator.log" 2>&1 &
      EMULATOR_PID=$!
      wait_port "$PUBSUB_PORT" || { echo "chaos: the Pub/Sub emulator did not start" >&2; exit 1; }
    fi
    "$BIN/chaos" --herald "$BIN/herald" --store postgres --queue "$queue" \
      --pg-url "$CLUSTER_URL" --pg-data "$CLUSTER_DATA/db" --pg-bin "$PG_BIN" \
      --nats-port "$NATS_PORT" --pubsub "127.0.0.1:$PUBSUB_PORT" \
      --workdir "$WORK/$queue" "${SIZE[@]}" "${PASS[@]}" || failed=1
  done
fi
exit "$failed"
