#!/usr/bin/env bash
# The claim's and the settle's SQL alone, without herald's process, to
# weigh a change to them before building it: 100,000 events emitted into
# the filling leaf of a throwaway production-like cluster
# (bench/lib/cluster.sh, schema by `herald migrate`), then claimed 500 at a
# time and settled (deleted) 500 at a time by one psql session, a
# transaction a statement, synchronous_commit off (so the time is the
# backend's CPU, not WAL flushes). The store also holds 1,000 pauses of
# the claimed handler for other tenants (the paused backlog's rules in
# bench/compare.sh); the claims name the events' tenant, as a worker's
# do from its notifications. Each variant is the schema's own
# function (pg_get_functiondef) with one edit; the variants alternate,
# ROUNDS times, and the medians are printed last:
#
#   schema    claim and settle_delete as migrated (they skip the ring
#             leaves marked empty, and events_cold unless the ring's
#             leaves lacked an id: here events_1 alone is probed)
#   cold_too  both also probe events_cold in their first statement, as
#             one statement over every non-empty leaf would
#   leaf      both probe only the leaf that holds the events (`e.leaf = 1`):
#             what knowing each event's leaf would save (one partition's
#             index probed per id)
#   all       both probe every leaf, empty or not, in one statement
#   no-rules  the claim without its rule check
#   rule-each the claim with its rule check probed per row
#   by-handler the claim's first check alone: once per claim, but only
#             when no rule names the claim's handlers for any tenant (here
#             1,000 do, so every row is probed); the schema's claim then
#             asks about the tenants the claim names
#   read      the claim's rows read and returned, not updated
#   harness   a claim that takes nothing: the cost of building the id
#             arrays, to subtract from the others
#   one_token the claim writing one token for the batch (`$1[1]`) rather
#             than each id's (`$1[array_position($3, e.id)]`):
#             what a token per event costs
#
# COLD=N first stores N events in events_cold that no claim takes (the
# paused backlog of bench/compare.sh: the handler paused for other
# tenants), kept across rounds: what the probe of events_cold costs when
# it holds a backlog (the rounds then TRUNCATE only the ring's leaves).
#
#   bench/claim-sql.sh
#   ROUNDS=3 BUILD=0 bench/claim-sql.sh
#   COLD=1000000 ROUNDS=3 BUILD=0 bench/claim-sql.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${ROUNDS:-5}
PORT=${PORT:-54334}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
[ "${BUILD:-1}" = 0 ] || cargo build --release -q -p herald-server --bin herald
HERALD=${HERALD:-$CARGO_TARGET_DIR/release/herald}
work=$(mktemp -d /tmp/herald-claim-sql.XXXXXX)
# shellcheck source=lib/cluster.sh
source bench/lib/cluster.sh
trap 'cluster_stop; rm -rf "$work"' EXIT
cluster_start "$PORT" "$work"
psql -qX "$CLUSTER_URL" -c "CREATE DATABASE claims"
url=${CLUSTER_URL%/*}/claims
"$HERALD" migrate --store "$url" >/dev/null
sql() { PGOPTIONS="-c synchronous_commit=off" psql -qXAt -v ON_ERROR_STOP=1 "$url" "$@"; }

# Each variant: the migrated function's text through one sed edit, under
# a new name.
# A variant whose edit matched nothing (the function's text has changed)
# is refused, rather than measured as the schema's own.
variant() {  # NAME FUNCTION [SED]
  sql -c "SELECT pg_get_functiondef('herald.$2'::regproc)" |
    sed -e "s/FUNCTION herald\.$2(/FUNCTION herald.${2}_$1(/" -e "${3:-}" | sql >/dev/null
  [ -z "${3:-}" ] || [ "$(sql -c "SELECT (SELECT prosrc FROM pg_proc WHERE proname = '${2}_$1')
                                  = (SELECT prosrc FROM pg_proc WHERE proname = '$2')")" = f ] ||
    { echo "the variant ${2}_$1 is the schema's $2: its edit matched nothing" >&2; exit 1; }
}
variant schema claim
variant schema settle_delete
variant leaf claim 's/WHERE e\.id = ANY(\$3)/WHERE e.id = ANY($3) AND e.leaf = 1/'
variant leaf settle_delete 's/WHERE e\.id = ANY(\$1)/WHERE e.id = ANY($1) AND e.leaf = 1/'
# The ring leaves' condition (it starts with events_cold's leaf in a
# one-statement form, with the ring's first leaf in the first of two).
unprune='/AND (e\.leaf = \(0$\|(SELECT l\.leaf FROM ring_empty AS l WHERE l\.leaf = 1 \)/,/l\.leaf = 3 AND NOT l\.empty))/d'
variant all claim "$unprune"
variant all settle_delete "$unprune"
variants="schema one_token leaf all no_rules rule_each by_handler read harness"
settles="settle_delete_schema settle_delete_leaf settle_delete_all"
if [ "$(sql -c "SELECT prosrc LIKE '%GET DIAGNOSTICS%' FROM pg_proc WHERE oid = 'herald.claim'::regproc")" = t ]; then
  cold_too='s/AND (e\.leaf = (SELECT l\.leaf FROM ring_empty AS l WHERE l\.leaf = 1 /AND (e.leaf = 0 OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 /'
  variant cold_too claim "$cold_too"
  variant cold_too settle_delete "$cold_too"
  variants="schema cold_too ${variants#schema }"
  settles="$settles settle_delete_cold_too"
fi
variant no_rules claim '/AND ((SELECT NOT EXISTS (SELECT 1 FROM rules/,/OFFSET 0))/d'
variant rule_each claim 's/(SELECT NOT EXISTS (SELECT 1 FROM rules AS h WHERE h\.handler = ANY(\$4)))/false/; s/AND e\.tenant = ANY(\$5))/AND false)/'
variant by_handler claim 's/AND e\.tenant = ANY(\$5))/AND false)/'
variant harness claim 's/WHERE e\.id = ANY(\$3)/WHERE e.id = ANY($3) AND false/'
variant one_token claim 's/\$1\[array_position(\$3, e\.id)\]/$1[1]/g'
sql <<'SQL' >/dev/null
CREATE FUNCTION herald.claim_read(uuid[], bigint, uuid[], text[], text[]) RETURNS SETOF herald.events
LANGUAGE plpgsql STABLE SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan SET jit = off SET search_path = herald, pg_catalog
AS $$BEGIN RETURN QUERY SELECT e.* FROM events AS e WHERE e.id = ANY($3); END$$;
SQL
# The paused backlog's rules: the claimed handler, paused for other tenants.
sql -c "INSERT INTO herald.rules (tenant, handler, kind, created_at)
        SELECT 'other-' || g, 'noop', 'pause', 0 FROM generate_series(1, 1000) AS g"
sql -c "SELECT proname FROM pg_proc WHERE proname ~ '^(claim|settle_delete)_' ORDER BY 1" >"$work/made"
for f in $(printf 'claim_%s ' $variants) $settles; do
  grep -qx "$f" "$work/made" || { echo "the variant $f was not made: has the function's text changed?" >&2; exit 1; }
done

# 100,000 ids in order, 500 to a statement, as a claim after a batch of
# notifications sees them.
ids() { echo "(SELECT array_agg(lpad(to_hex(g), 32, '0')::uuid ORDER BY g) FROM generate_series($1, $(($1 + 499))) AS g)"; }
token="'00000000-0000-0000-0000-0000000000aa'::uuid"
for b in $(seq 0 199); do
  echo "SELECT count(*) FROM herald.CLAIM(array_fill($token, ARRAY[500]), 30000, $(ids $((b * 500 + 1))), ARRAY['noop'], ARRAY['tenant']);" >>"$work/claims.sql"
  echo "SELECT count(*) FROM herald.SETTLE($(ids $((b * 500 + 1))), array_fill($token, ARRAY[500]), (SELECT array_agg(g) FROM generate_series(1, 500) AS g));" >>"$work/settles.sql"
done
COLD=${COLD:-0}
if [ "$COLD" -gt 0 ]; then
  sql -c "INSERT INTO herald.events (id, run_at, notified_at, created_at, updated_at, max_attempts,
                                     tenant, handler, payload, leaf)
          SELECT gen_random_uuid(), 0, 0, 0, 0, 3, 'other-' || (g % 1000 + 1), 'noop', '{\"n\":1}', 0
          FROM generate_series(1, $COLD) AS g"
fi
cat >"$work/load.sql" <<'SQL'
TRUNCATE herald.events_1, herald.events_2, herald.events_3;
SELECT count(*) FROM herald.emit(
  (SELECT array_agg(lpad(to_hex(g), 32, '0')::uuid ORDER BY g) FROM generate_series(1, 100000) AS g),
  array_fill('tenant'::text, ARRAY[100000]), array_fill('noop'::text, ARRAY[100000]),
  array_fill('{"n":1}'::text, ARRAY[100000]), array_fill(0::int8, ARRAY[100000]),
  array_fill(3, ARRAY[100000]), array_fill(NULL::text, ARRAY[100000]), array_fill(NULL::text, ARRAY[100000]),
  array_fill(NULL::int8, ARRAY[100000]));
VACUUM ANALYZE herald.events;
SQL
# Runs a file of statements; prints its ms and the rows its statements
# counted, so that a variant that took nothing cannot pass for a fast one.
ms() {
  local t0 t1
  t0=$(date +%s%N)
  sql -f "$1" >"$work/counts"
  t1=$(date +%s%N)
  echo "$(((t1 - t0) / 1000000)) $(awk '{n += $1} END {print n + 0}' "$work/counts")"
}

echo "load $(cut -d' ' -f1-3 /proc/loadavg); $COLD events in events_cold; 100,000 events, 200 claims and 200 settles of 500, ms"
echo "round variant claim settle"
for round in $(seq 1 "$ROUNDS"); do
  for v in $variants; do
    settle=settle_delete_schema
    case $v in leaf | all | cold_too) settle=settle_delete_$v ;; esac
    sql -f "$work/load.sql" >/dev/null
    sed "s/herald\.CLAIM(/herald.claim_$v(/" "$work/claims.sql" >"$work/c.sql"
    sed "s/herald\.SETTLE(/herald.$settle(/" "$work/settles.sql" >"$work/s.sql"
    read -r c claimed < <(ms "$work/c.sql")
    read -r s settled < <(ms "$work/s.sql")
    # The harness and the read take no lease, so their settles match none.
    want=100000
    case $v in read | harness) want=0 ;; esac
    if [ "$v" != read ] && [ "$claimed" != "$want" ] || [ "$settled" != "$want" ]; then
      echo "$v claimed $claimed and settled $settled of 100,000 (expected $want): the variant measures something else" >&2
      exit 1
    fi
    echo "$round $v $c $s" | tee -a "$work/times"
  done
done
echo "medians: variant claim settle"
for v in $variants; do
  awk -v v="$v" '$2 == v {print $3, $4}' "$work/times" | python3 -c "
import statistics, sys
rows = [list(map(int, l.split())) for l in sys.stdin]
print('$v', statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))"
done
