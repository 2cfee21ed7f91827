#!/usr/bin/env bash
# Rescue time after SIGKILL (bench/src/rescue.rs): KILLS rounds per shape
# (default 20), one line per kill, then a summary line per shape.
#
# Shapes (SHAPES, default all three, one after another):
#   fleet           3 `herald serve` workers on PostgreSQL + a queue (QUEUES:
#                   nats, pubsub or both, default nats); the one holding the
#                   most events is killed
#   restart-sqlite  1 worker, SQLite + the in-process queue (the embedded
#                   default), killed and started again at once
#   restart-pg      the same on PostgreSQL
#
# LEASE (seconds) defaults to herald's own default lease.
#
#   bench/rescue.sh
#   SHAPES=fleet KILLS=40 LEASE=3 EXTRA="--verbose" bench/rescue.sh
#   SHAPES=fleet QUEUES="nats pubsub" bench/rescue.sh   # Pub/Sub: the emulator
#                   at PUBSUB (default 127.0.0.1:8085)
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS=${KILLS:-20}
LEASE=${LEASE:-}
EXTRA=${EXTRA:-}
SHAPES=${SHAPES:-fleet restart-sqlite restart-pg}
STORE=${STORE:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}
NATS=${NATS:-${NATS_URL:-nats://127.0.0.1:4222}}
PUBSUB=${PUBSUB:-${PUBSUB_EMULATOR_HOST:-127.0.0.1:8085}}
QUEUES=${QUEUES:-nats}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# HERALD=PATH: a herald binary of your own (the shared target directory's
# may be rebuilt by someone else from other sources while this runs).
if [ -n "${HERALD:-}" ]; then
  cargo build --release -q -p herald-bench --bin rescue
else
  cargo build --release -q -p herald-server -p herald-bench --bin herald --bin rescue
fi
BIN=$CARGO_TARGET_DIR/release
HERALD=${HERALD:-$BIN/herald}
lease_flag=()
[ -n "$LEASE" ] && lease_flag=(--lease-secs "$LEASE")
for shape in $SHAPES; do
  queues=nats
  case "$shape" in
    fleet) flags=(--shape fleet); queues=$QUEUES ;;
    restart-sqlite) flags=(--shape restart --sqlite) ;;
    restart-pg) flags=(--shape restart) ;;
    *) echo "rescue.sh: unknown shape $shape (fleet, restart-sqlite, restart-pg)" >&2; exit 2 ;;
  esac
  for queue in $queues; do
    # shellcheck disable=SC2086
    "$BIN/rescue" --herald "$HERALD" --store "$STORE" --queue "$queue" --nats "$NATS" --pubsub "$PUBSUB" \
      --kills "$KILLS" "${flags[@]}" "${lease_flag[@]}" $EXTRA
  done
done
