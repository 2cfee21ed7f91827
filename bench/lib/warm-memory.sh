#!/usr/bin/env bash
# Touches the machine's available memory once, all of it at the same time,
# before a sitting (bench/compare.sh calls it; WARM=0 skips it). Prints
# `GIB SECONDS` of the touch.
#
# Why: on these VMs (Firecracker, KVM) a guest page's first touch after
# boot costs about 7x a later one (2026-12-07: writing 4 GiB to tmpfs took
# 15-16 s, 10-11 s of it system time, the first time, 2 s every time
# after, the pages freed in between). A sitting's first rounds grow the
# page cache (every backlog's load and WAL) into memory never touched
# since boot, and the process that writes pays the fault in system time:
# PostgreSQL's backends and WAL writer, herald, each peer. Rounds then cost
# 15-35 % more per event than later ones at the same buffers
# (docs/benchmarks.md, "Who spends the drain's PostgreSQL CPU, and the
# rounds' drift"). Touched once here, every run pays the same.
#
#   WARM_MARGIN_MB (2048): memory left untouched, so that nothing else on
#   the machine runs out while the touch holds the rest.
set -euo pipefail
margin_kb=$(( ${WARM_MARGIN_MB:-2048} * 1024 ))
avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if [ "$avail_kb" -le "$margin_kb" ]; then
  echo "0 0"
  exit 0
fi
command -v python3 >/dev/null || { echo "warm-memory: no python3, memory not touched" >&2; echo "0 0"; exit 0; }
python3 - $(( (avail_kb - margin_kb) * 1024 )) <<'PY'
import mmap, sys, time
page = mmap.PAGESIZE
n = int(sys.argv[1]) // page * page
t = time.monotonic()
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, n, page):
    m[off] = 1
m.close()
print(f"{n / 2**30:.1f} {time.monotonic() - t:.1f}")
PY
