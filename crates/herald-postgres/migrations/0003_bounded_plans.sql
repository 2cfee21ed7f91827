-- herald's PostgreSQL schema, version 3: the hot statements as functions
-- whose plans are bounded by their batch whatever the statistics say, and
-- per-table autovacuum settings for events (ADR 0007, docs/postgres.md).
--
-- Each function reaches events only through the batch's ids as an index
-- condition on events_pkey (`e.id = ANY($n)`), and carries the planner
-- settings it needs as its own (`SET` on the function: in force only while
-- it runs, never on the application's connections):
--   * enable_seqscan and enable_bitmapscan off: the only access left is an
--     index scan, which returns (and so locks) rows in id order, the order
--     every writer takes them in, so concurrent batches wait rather than
--     deadlock;
--   * for the settle and renew joins against their unnest arrays, nested
--     loops and merge joins off: a hash join of two inputs of at most the
--     batch's size, either way round (a nested loop could rescan one side
--     per row of the other);
--   * where a lookup is per row (the idempotency keys), a LATERAL ... LIMIT
--     1, which the planner cannot turn around.
-- Conditions that another index could serve as a scan (`state = 0`,
-- `handler = ANY`) are written `(e.state + 0) = 0` and `(e.handler || '')`:
-- under statistics that say the table holds one row, a scan of
-- events_by_handler on `state = 0` would otherwise look cheaper than
-- fetching the batch, and read every pending event.
--
-- The claim's rule check is `NOT EXISTS (… OFFSET 0)`, a probe of
-- rules_pkey per claimed row: as an anti join, an order by (tenant, handler)
-- would be worth having, and a full scan of events_by_handler could then
-- look cheap. The claim needs its function too, though it joins nothing:
-- without enable_bitmapscan off, `id = ANY` can drive a bitmap scan of any
-- index that holds id as a lower column (events_by_handler's fourth), which
-- under reltuples = 1 looks cheaper than the batch's probes of events_pkey
-- and reads the whole index (seen on a 200,000-row table).
--
-- plpgsql keeps each function's plan for the session; the bodies are
-- `BEGIN RETURN QUERY <statement>; END` with positional parameters, so that
-- tests/plans.rs can EXPLAIN the statement itself.

CREATE FUNCTION claim(uuid, bigint, uuid[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY UPDATE events AS e
     SET attempt = e.attempt + 1, lease_token = $1,
         lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $2,
         updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
     WHERE e.id = ANY($3)
       AND (e.state + 0) = 0
       AND e.run_at <= (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
       AND (e.lease_expires_at IS NULL
            OR e.lease_expires_at <= (SELECT floor(date_part('epoch', now()) * 1000)::bigint))
       AND e.attempt < e.max_attempts
       AND (e.handler || '') = ANY($4)
       AND NOT EXISTS (SELECT 1 FROM rules AS r
                       WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0)
     RETURNING e.*; END$$;


CREATE FUNCTION inspect(uuid[])
RETURNS TABLE (now bigint, id uuid, tenant text, handler text, payload text, state smallint,
               run_at bigint, attempt integer, max_attempts integer, lease_token uuid,
               lease_expires_at bigint, last_error text, idempotency_key text,
               created_at bigint, updated_at bigint, blocked boolean, paused boolean)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY SELECT c.now, e.id, e.tenant, e.handler, e.payload, e.state, e.run_at,
       e.attempt, e.max_attempts, e.lease_token, e.lease_expires_at, e.last_error,
       e.idempotency_key, e.created_at, e.updated_at,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'block'),
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'pause')
     FROM (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint AS now) AS c
     LEFT JOIN events AS e ON e.id = ANY($1); END$$;

-- The settle kinds share their fence: the event is pending and its lease
-- token is the one given (NULL fences on "no lease"). Each returns the batch
-- positions whose fence held. $1 ids (sorted), $2 tokens, $3 positions.
CREATE FUNCTION settle_delete(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY DELETE FROM events AS e
     USING unnest($1, $2, $3) AS s(id, token, ord)
     WHERE e.id = ANY($1) AND e.id = s.id
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

CREATE FUNCTION settle_archive(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY UPDATE events AS e
     SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
         updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
         lease_token = NULL, lease_expires_at = NULL
     FROM unnest($1, $2, $3) AS s(id, token, ord)
     WHERE e.id = ANY($1) AND e.id = s.id
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

-- $4 wait in ms, $5 1 to give the attempt back, $6 error (NULL keeps the
-- last one).
CREATE FUNCTION settle_release(uuid[], uuid[], int4[], int8[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY UPDATE events AS e
     SET lease_token = NULL, lease_expires_at = NULL,
         run_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + s.wait,
         notified_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + s.wait,
         attempt = greatest(e.attempt - s.give_back, 0),
         last_error = coalesce(s.error, e.last_error),
         updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
         errors = CASE WHEN s.error IS NULL THEN e.errors ELSE coalesce(e.errors, '[]'::jsonb)
             || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                  'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                  'error', s.error)) END
     FROM unnest($1, $2, $3, $4, $5, $6) AS s(id, token, ord, wait, give_back, error)
     WHERE e.id = ANY($1) AND e.id = s.id
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

-- $4 error.
CREATE FUNCTION settle_bury(uuid[], uuid[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY UPDATE events AS e
     SET state = 1, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
         updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
         last_error = s.error, lease_token = NULL, lease_expires_at = NULL,
         errors = coalesce(e.errors, '[]'::jsonb)
             || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                  'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                  'error', s.error))
     FROM unnest($1, $2, $3, $4) AS s(id, token, ord, error)
     WHERE e.id = ANY($1) AND e.id = s.id
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

-- Extends held leases: $1 lease in ms, $2 ids (sorted), $3 tokens, $4
-- positions. A HOT update.
CREATE FUNCTION renew(bigint, uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY UPDATE events AS e
     SET lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
     FROM unnest($2, $3, $4) AS s(id, token, ord)
     WHERE e.id = ANY($2) AND e.id = s.id AND e.lease_token = s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

-- The live events holding idempotency keys: one probe of events_live_key
-- per key. $4 positions.
CREATE FUNCTION existing_keys(text[], text[], text[], int4[])
RETURNS TABLE (ord int4, id uuid)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY SELECT k.ord, x.id
     FROM unnest($1, $2, $3, $4) AS k(tenant, handler, key, ord)
     CROSS JOIN LATERAL (SELECT e.id FROM events AS e
                         WHERE e.tenant = k.tenant AND e.handler = k.handler
                           AND e.idempotency_key = k.key AND e.state = 0
                         LIMIT 1) AS x; END$$;

-- The statements outside the hot path that write several events take them
-- in id order too (an unpause re-notifying events that workers are
-- claiming; the sweep's stamps and parks), and the sweep's reads walk
-- their index: the same settings, on their own functions.

-- One page of a handler's pending events, stamped notified: $1 tenant, $2
-- handler, $3 page size, $4 the cursor (renotify_after).
CREATE FUNCTION renotify(text, text, bigint)
RETURNS TABLE (id uuid, run_at bigint, now bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
           ORDER BY x.id LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$$;

CREATE FUNCTION renotify_after(text, text, bigint, uuid)
RETURNS TABLE (id uuid, run_at bigint, now bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
             AND x.id > $4 ORDER BY x.id LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$$;

-- The sweep's dead-worker source (see sql.rs): $1 now, $2 the cutoff,
-- $3/$4 the cursor, $5 the chunk size.
CREATE FUNCTION sweep_expired(bigint, bigint, bigint, uuid, bigint)
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
       AND (e.notified_at, e.id) > ($3, $4)
       AND e.lease_expires_at <= $1 AND e.notified_at < e.lease_expires_at
       AND e.run_at <= $1
     ORDER BY e.notified_at, e.id LIMIT $5; END$$;

-- The sweep's quiet source: same parameters.
CREATE FUNCTION sweep_quiet(bigint, bigint, bigint, uuid, bigint)
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
       AND (e.notified_at, e.id) > ($3, $4)
       AND e.run_at <= $1 AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= $1)
     ORDER BY e.notified_at, e.id LIMIT $5; END$$;

-- Stamps returned events notified: $1 now, $2 ids (sorted).
CREATE FUNCTION sweep_stamp(bigint, uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN UPDATE events AS e SET notified_at = $1 WHERE e.id = ANY($2) AND (e.state + 0) = 0; END$$;

-- Parks events held by a rule: $1 ids (sorted).
CREATE FUNCTION sweep_park(uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$BEGIN UPDATE events AS e SET notified_at = 9223372036854775807
     WHERE e.id = ANY($1) AND (e.state + 0) = 0; END$$;

-- Un-parks up to $3 parked events of one handler ($1 tenant, $2 handler):
-- found through events_parked in id order, updated by primary key. Returns
-- how many.
CREATE FUNCTION sweep_unpark(text, text, bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
AS $$DECLARE n bigint; BEGIN UPDATE events AS e SET notified_at = least(e.run_at, 9223372036854775806)
     WHERE e.id = ANY(ARRAY(SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2
                            AND x.state = 0 AND x.notified_at = 9223372036854775807
                            ORDER BY x.id LIMIT $3))
       AND (e.state + 0) = 0; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END$$;

-- Autovacuum for events by row counts, not fractions of the table, and
-- unthrottled: every finished event leaves a dead row (a delete, or an
-- archive's update), so at thousands of events a second the server's
-- defaults (20% of the table, 2 ms pauses every 200 cost units) let dead
-- rows pile up for minutes and then take a long, throttled pass over a
-- bloated table. With these, each worker visit (every autovacuum_naptime)
-- cleans what the last minute left, at full speed; ANALYZE follows the
-- same rhythm, which the plans above no longer care about. What bounds the
-- dead rows is then naptime × rate (ADR 0007).
ALTER TABLE events SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
