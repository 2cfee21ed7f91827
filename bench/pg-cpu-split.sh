#!/usr/bin/env bash
# Who spent a run's PostgreSQL CPU between its timed part's two ends:
# the run's own connections, autovacuum, the checkpointer, the WAL writer,
# …, from the pg-cpu.drain-start and pg-cpu.drain-end files that
# bench/lib/mark.sh writes beside each run's marks (bench/compare.sh).
#
#   bench/pg-cpu-split.sh RUN_DIR...      # e.g. bench-results/compare-X/runs/*
#
# One line per run: its name, the milliseconds per role, and the total
# (which is what pg-cpu read; the machine's other clusters count too). A
# process that ended in between shows under `exited` with what it spent
# after the first end (its earlier CPU is taken off by its PID).
set -euo pipefail
hz=$(getconf CLK_TCK)
for dir in "$@"; do
  start=$dir/pg-cpu.drain-start end=$dir/pg-cpu.drain-end
  [ -f "$start" ] || { start=$dir/pg-cpu.run-start; end=$dir/pg-cpu.run-end; }
  [ -f "$start" ] && [ -f "$end" ] || continue
  awk -v hz="$hz" -v name="$(basename "$dir")" '
    function role(title) {
      if (title ~ /^exited children/) return "exited"
      if (title ~ /autovacuum worker/) return "autovacuum"
      if (title ~ /autovacuum launcher/) return "launcher"
      if (title ~ /checkpointer/) return "checkpointer"
      if (title ~ /walwriter/) return "walwriter"
      if (title ~ /background writer/) return "bgwriter"
      if (title ~ / -D /) return "postmaster"
      if (title ~ /^postgres: [^ ]+: /) return "other-cluster"
      if (title ~ /^postgres: [^ ]+ [^ ]+ ([0-9.]+\(|\[local\])/) return "connections"
      return "other"
    }
    /^#/ { next }  # the file'"'"'s `# hz N`: this machine'"'"'s rate is used
    { pid = $1; ticks = $2; $1 = ""; $2 = ""; sub(/^  /, ""); r = role($0)
      key = pid " " r }
    FNR == NR { before[key] = ticks; alive[pid] = ticks; next }
    { after[key] = ticks; seen[pid] = 1 }
    END {
      for (k in after) {
        split(k, f, " ")
        spent[f[2]] += after[k] - (k in before ? before[k] : 0)
      }
      # The processes of the first end that ended since: their CPU before
      # it sits in the exited count now, and is not the run'"'"'s.
      for (k in before) {
        split(k, f, " ")
        if (!(f[1] in seen) && f[2] != "exited") spent["exited"] -= before[k]
      }
      line = name; total = 0
      n = split("connections autovacuum checkpointer walwriter bgwriter launcher postmaster exited other-cluster other", order, " ")
      for (i = 1; i <= n; i++) {
        ms = spent[order[i]] * 1000 / hz; total += ms
        if (ms != 0) line = line sprintf(" %s=%d", order[i], ms)
      }
      print line sprintf(" total=%d", total)
    }' "$start" "$end"
done
