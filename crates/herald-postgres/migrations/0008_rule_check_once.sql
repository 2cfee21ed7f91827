-- herald's PostgreSQL schema, version 8: the claim's rule check, once per
-- claim when no rule names the worker's handlers.
--
-- The claim checked every row it took against `rules` (a probe of
-- rules_pkey per row, about a tenth of the claim's cost: bench/claim-sql.sh),
-- though most stores hold no rule for most handlers. Now it first asks,
-- once per statement, whether any rule names one of the handlers it may
-- take ($4: a claim takes only those), by the new index on
-- `rules (handler)`: as many probes as the worker has handlers, whatever
-- the batch. Only when one does is every row probed as before. The check
-- is an InitPlan of the same statement, so it reads the same snapshot as
-- the rows: a pause committed before the claim's statement began is seen
-- either way.

CREATE INDEX rules_by_handler ON rules (handler);

CREATE OR REPLACE FUNCTION claim(uuid, bigint, uuid[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
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
       AND ((SELECT NOT EXISTS (SELECT 1 FROM rules AS h WHERE h.handler = ANY($4)))
            OR NOT EXISTS (SELECT 1 FROM rules AS r
                           WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0))
     RETURNING e.*; END$$;
