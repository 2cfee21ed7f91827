-- herald's PostgreSQL schema, version 4: no index but events_pkey holds
-- `id` as a key column (ADR 0007, "Open").
--
-- events_by_handler, events_to_notify and events_parked page in id order,
-- so they held `id` as a lower key column. Under statistics that say the
-- table is empty (reltuples = 0, which autovacuum and ANALYZE leave on a
-- busy table that was nearly empty at that moment), the planner took a
-- full scan of events_by_handler with the hot statements' `id = ANY($n)`
-- as its index condition for a cheaper plan than the batch's probes of
-- events_pkey: claims of 40-120 ms, completions from 3,000/s to 400/s for a
-- whole autovacuum naptime (bench/long-horizon.sh with auto_explain).
--
-- Those indexes now hold `id_key`, a stored copy of `id`: the same value
-- and the same order, written once at insert (a claim leaves it as it was,
-- so claims stay HOT). The hot statements say `id`, which only events_pkey
-- holds; the paging statements say `id_key`.
ALTER TABLE events ADD COLUMN id_key uuid GENERATED ALWAYS AS (id) STORED;

DROP INDEX events_by_handler;
CREATE INDEX events_by_handler ON events (tenant, handler, state, id_key);

DROP INDEX events_to_notify;
CREATE INDEX events_to_notify ON events (notified_at, id_key)
    WHERE state = 0 AND notified_at < 9223372036854775807;

DROP INDEX events_parked;
CREATE INDEX events_parked ON events (tenant, handler, id_key)
    WHERE state = 0 AND notified_at = 9223372036854775807;

-- The functions of migration 3 that page through those indexes, paging by
-- id_key now; the rest is as it was.

CREATE OR REPLACE FUNCTION renotify(text, text, bigint)
RETURNS TABLE (id uuid, run_at bigint, now bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
           ORDER BY x.id_key LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$$;

CREATE OR REPLACE FUNCTION renotify_after(text, text, bigint, uuid)
RETURNS TABLE (id uuid, run_at bigint, now bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
             AND x.id_key > $4 ORDER BY x.id_key LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$$;

CREATE OR REPLACE FUNCTION sweep_expired(bigint, bigint, bigint, uuid, bigint)
RETURNS TABLE (id uuid, tenant text, handler text, ruled boolean, notified_at bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
BEGIN RETURN QUERY SELECT e.id, e.tenant, e.handler,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant AND r.handler = e.handler),
       e.notified_at
     FROM events AS e
     WHERE e.state = 0 AND e.notified_at < 9223372036854775807
       AND e.notified_at >= $2 AND e.notified_at < $1
       AND (e.notified_at, e.id_key) > ($3, $4)
       AND e.lease_expires_at <= $1 AND e.notified_at < e.lease_expires_at
       AND e.run_at <= $1
     ORDER BY e.notified_at, e.id_key LIMIT $5; END$$;

CREATE OR REPLACE FUNCTION sweep_quiet(bigint, bigint, bigint, uuid, bigint)
RETURNS TABLE (id uuid, tenant text, handler text, ruled boolean, notified_at bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
BEGIN RETURN QUERY SELECT e.id, e.tenant, e.handler,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant AND r.handler = e.handler),
       e.notified_at
     FROM events AS e
     WHERE e.state = 0 AND e.notified_at < 9223372036854775807
       AND e.notified_at < $2
       AND (e.notified_at, e.id_key) > ($3, $4)
       AND e.run_at <= $1 AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= $1)
     ORDER BY e.notified_at, e.id_key LIMIT $5; END$$;

CREATE OR REPLACE FUNCTION sweep_unpark(text, text, bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$DECLARE n bigint; BEGIN UPDATE events AS e SET notified_at = least(e.run_at, 9223372036854775806)
     WHERE e.id = ANY(ARRAY(SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2
                            AND x.state = 0 AND x.notified_at = 9223372036854775807
                            ORDER BY x.id_key LIMIT $3))
       AND (e.state + 0) = 0; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END$$;
