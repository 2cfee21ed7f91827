#!/usr/bin/env bash
# A phase hook that profiles the drain: bench/lib/mark.sh's work, then
# `perf record` of the process in $PEER_PID_FILE from drain-start to
# drain-end (the emits before and the shutdown after left out), written to
# $PERF_DATA; with PERF_ALL=1, every process on the machine (PostgreSQL's
# backends too, by their own symbols). PERF_CG: perf's call-graph flags
# (default dwarf; set empty for none, which keeps a whole-machine profile
# small). Used by bench/drain-statements.sh when PERF=DIR is set.
set -euo pipefail
"$(dirname "$0")/mark.sh" "$1"
case $1 in
  drain-start)
    target=(-p "$(cat "$PEER_PID_FILE")")
    [ "${PERF_ALL:-0}" = 0 ] || target=(-a)
    # PERF_CG is split into flags on purpose.
    # shellcheck disable=SC2086
    perf record -q -F "${PERF_FREQ:-999}" ${PERF_CG---call-graph dwarf,16384} "${target[@]}" \
      -o "$PERF_DATA" >/dev/null 2>&1 &
    echo $! >"$PERF_DATA.pid"
    sleep 0.2 ;;  # perf attaches before the drain's first claim
  drain-end)
    kill -TERM "$(cat "$PERF_DATA.pid")" 2>/dev/null || true
    while kill -0 "$(cat "$PERF_DATA.pid")" 2>/dev/null; do sleep 0.1; done ;;
esac
