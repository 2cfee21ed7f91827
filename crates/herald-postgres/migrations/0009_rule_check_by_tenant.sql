-- herald's PostgreSQL schema, version 9: the claim's rule check, once per
-- claim for the tenants its notifications named too.
--
-- Schema 8 skipped the per-row probe of `rules` only when no rule, for any
-- tenant, named one of the claim's handlers: one tenant's pause of a
-- handler sent every claim of that handler, for every other tenant, back
-- to a probe per row (the paused backlog of bench/compare.sh: 1,000
-- tenants' pauses of the drained handler, about a tenth of its claim).
-- The claim now also takes the tenants its notifications named ($5, a
-- hint). When schema 8's question finds a rule, a second one asks, by
-- rules_pkey (a descent per tenant, the handler a filter), whether a rule
-- names one of those tenants with one of the claim's handlers; when none
-- does, a row of one of those tenants is claimed without a probe, and a
-- row of any other tenant (a notification that named the wrong one) is
-- probed as before: a wrong or empty hint costs probes, never a rule.
-- Schema 8's question stays first because it is cheaper when it answers:
-- it needs no per-row test of the row's tenant against the hint (a
-- linear scan of the array, about 0.2 us a row for 16 tenants). Both are
-- InitPlans of the same statement, evaluated at most once and only when
-- reached: they read the rows' snapshot, and a pause committed before the
-- claim's statement began is seen either way.

DROP FUNCTION claim(uuid, bigint, uuid[], text[]);

CREATE FUNCTION claim(uuid, bigint, uuid[], text[], text[]) RETURNS SETOF events
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
            OR ((SELECT NOT EXISTS (SELECT 1 FROM rules AS t
                                    WHERE t.tenant = ANY($5) AND (t.handler || '') = ANY($4)))
                AND e.tenant = ANY($5))
            OR NOT EXISTS (SELECT 1 FROM rules AS r
                           WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0))
     RETURNING e.*; END$$;
