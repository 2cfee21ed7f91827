#!/usr/bin/env bash
# Touches the machine's available memory once, all of it at the same time,
# before a sitting (bench/compare.sh calls it; WARM=0 skips it). Prints
# `GIB SECONDS` of the touch, or nothing (and why, on stderr) when it
# touched nothing.
#
# Why: on these VMs (Firecracker, KVM) a page's first touch since boot
# costs about 3.8 s a GiB, twice what a page given back to the host by
# free page reporting costs (1.9 s) and six times one touched again at
# once (0.6 s). A
# sitting's first rounds grow the page cache (every backlog's load and
# WAL) into memory never touched since boot, and the process that writes
# pays the fault in system time: PostgreSQL's backends and WAL writer,
# herald, each peer. Touched once here, no run pays the once-per-boot
# part; the rest every run pays alike.
#
#   WARM_MARGIN_MB (2048): memory left untouched, so that nothing else on
#   the machine runs out while the touch holds the rest.
set -euo pipefail
margin_kb=$(( ${WARM_MARGIN_MB:-2048} * 1024 ))
avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if [ "$avail_kb" -le "$margin_kb" ]; then
  echo "warm-memory: only $((avail_kb / 1024)) MB available, within the margin: nothing touched" >&2
  exit 0
fi
command -v python3 >/dev/null || { echo "warm-memory: no python3: nothing touched" >&2; exit 0; }
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
