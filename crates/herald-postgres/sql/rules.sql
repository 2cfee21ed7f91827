-- Re-notifying a handler's pending events when its rule (pause or block)
-- is removed: one page at a time, in id order through events_by_handler,
-- each row stamped notified and returned for the caller to publish. The
-- rows are updated by primary key in id order, as every writer takes
-- them, so a re-notify and the claims of the same events wait for each
-- other rather than deadlock.

-- The first page: $1 tenant, $2 handler, $3 page size.
CREATE OR REPLACE FUNCTION renotify(text, text, bigint)
RETURNS TABLE (id uuid, run_at bigint, now bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET jit = off
AS $$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
           ORDER BY x.id_key LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$$;

-- A later page: $4 the last id of the previous one.
CREATE OR REPLACE FUNCTION renotify_after(text, text, bigint, uuid)
RETURNS TABLE (id uuid, run_at bigint, now bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET jit = off
AS $$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
             AND x.id_key > $4 ORDER BY x.id_key LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$$;
