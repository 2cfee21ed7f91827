-- The claim, the look-up that tells a worker why a claim did not take an
-- event (inspect), and the lease's renewal.
--
-- Like every function here, each reaches `events` only through the
-- batch's ids on events_pkey and carries the planner settings that keep
-- its plan bounded by the batch (../migrations/README.md, "Bounded
-- plans"). plan_cache_mode = force_generic_plan: a custom plan of a
-- statement over four leaves is planned anew on every call, which costs
-- more than the statement; the generic plan is bounded too
-- (tests/plans.rs checks both).
--
-- The claim, the settles (settle.sql) and the renewal are two statements
-- each: the first over the ring's leaves that ring_empty marks not empty,
-- the second over events_cold alone, run only when the first took fewer
-- rows than the batch has ids. A drain's batches are taken whole by the
-- first; an event in events_cold (due late, un-parked, a retired leaf's
-- straggler) or an id whose claim or fence fails costs its batch the
-- second. Safe because an event moves from a ring leaf to events_cold
-- only under the leaf's ACCESS EXCLUSIVE lock (ring_retire), which waits
-- for the first statement's transaction: what the first could not see in
-- its leaf moved before it began, and the second, with a later snapshot,
-- sees it in events_cold. The leaves are named as equalities joined by OR,
-- each against its own subquery (an InitPlan, the statement's snapshot):
-- run-time partition pruning acts on that, and no index scan can use it
-- as an index condition (as `IN (...)` it can, and the primary key is
-- then descended once per id and leaf). The second statement repeats the
-- first but for the leaf, written out: plpgsql keeps each written
-- statement's plan, and EXECUTE would plan it on every call.

-- Takes the lease of each event of $3 (ids, sorted) that is pending, due,
-- unleased or expired (by the database's clock), has attempts left, has a
-- handler in $4, and no rule holds. $1 the tokens, one per id of $3 in its
-- order (each run has a token of its own), $2 the lease in ms, $5 the
-- tenants the notifications named (a hint). Changes only columns that no
-- index covers, so it is a HOT update when the page has room.
--
-- The rule check, cheapest first: an InitPlan asks once per claim, by
-- rules_by_handler, whether any rule names one of $4 (most stores hold
-- none); if one does, a second asks, by rules_pkey, whether a rule names
-- one of the hinted tenants with one of $4, and if none does a row of a
-- hinted tenant needs no probe; any other row probes rules_pkey
-- (`NOT EXISTS (... OFFSET 0)`, which the planner cannot turn into an
-- anti join that a scan of events_by_handler could serve). A wrong or
-- empty hint costs probes, never a rule. The questions read the rows'
-- snapshot, so a pause committed before the statement began is seen
-- either way.
--
-- The events of a handler that a concurrency limit names are left to
-- claim_limited (limits.sql), called last when the two statements did not
-- take every id and such a limit exists: a store without limits pays one
-- probe of limits_pkey per claim, as for the rules.
CREATE OR REPLACE FUNCTION claim(uuid[], bigint, uuid[], text[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint; more bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET attempt = e.attempt + 1, lease_token = $1[array_position($3, e.id)],
           lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $2,
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
       WHERE e.id = ANY($3)
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
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
         AND ((SELECT NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = ANY($4)))
              OR NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = e.handler OFFSET 0))
       RETURNING e.*;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($3) THEN
    RETURN QUERY UPDATE events AS e
         SET attempt = e.attempt + 1, lease_token = $1[array_position($3, e.id)],
             lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $2,
             updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
         WHERE e.id = ANY($3)
           AND e.leaf = 0
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
           AND ((SELECT NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = ANY($4)))
                OR NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = e.handler OFFSET 0))
         RETURNING e.*;
    GET DIAGNOSTICS more = ROW_COUNT;
    taken := taken + more;
  END IF;
  IF taken < cardinality($3) AND EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = ANY($4)) THEN
    RETURN QUERY SELECT * FROM claim_limited($1, $2, $3, $4, $5);
  END IF;
END$$;

-- Events by id with their rules, the clock (one row with a NULL event
-- when none is found), and, for an event that a full limit holds (parked,
-- with a row in limit_waits), the scope it waits for, the scope's slots
-- held and its limit now (NULL when the limit is gone). VOLATILE, as every
-- function here that reads events: a STABLE function reads with its
-- caller's snapshot, which can predate a turn of the ring, and would miss
-- the events the turn moved.
CREATE OR REPLACE FUNCTION inspect(uuid[])
RETURNS TABLE (now bigint, id uuid, tenant text, handler text, payload text, state smallint,
               run_at bigint, attempt integer, max_attempts integer, lease_token uuid,
               lease_expires_at bigint, last_error text, idempotency_key text,
               created_at bigint, updated_at bigint, topic text, concurrency_key text,
               rate_turn bigint, blocked boolean, paused boolean, wait_kind smallint, wait_tenant text,
               wait_key text, wait_running bigint, wait_limit integer)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY SELECT c.now, e.id, e.tenant, e.handler, e.payload, e.state, e.run_at,
       e.attempt, e.max_attempts, e.lease_token, e.lease_expires_at, e.last_error,
       e.idempotency_key, e.created_at, e.updated_at, e.topic, e.concurrency_key, e.rate_turn,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'block'),
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'pause'),
       w.kind, w.tenant, w.key,
       (SELECT t.held::bigint FROM limit_counts AS t
        WHERE t.handler = w.handler AND t.kind = w.kind AND t.tenant = w.tenant
          AND t.key = w.key),
       (scope_row(w.kind, w.handler, w.tenant, w.key)).running
     FROM (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint AS now) AS c
     LEFT JOIN events AS e ON e.id = ANY($1)
     LEFT JOIN LATERAL (SELECT x.handler, x.kind, x.tenant, x.key FROM limit_waits AS x
                        WHERE x.event_id = e.id AND e.notified_at = 9223372036854775807
                        ORDER BY x.seq DESC LIMIT 1) AS w ON true; END$$;

-- Extends held leases: $1 lease in ms, $2 ids (sorted), $3 tokens, $4
-- positions. A HOT update. Returns the positions whose lease was held.
-- The slots of limited runs (limit_slots) whose lease it extended get the
-- same expiry: a slot lasts as long as its run's lease. A store where no
-- run holds a slot pays one probe of limit_slots_pkey per token.
CREATE OR REPLACE FUNCTION renew(bigint, uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
       FROM unnest($2, $3, $4) AS s(id, token, ord)
       WHERE e.id = ANY($2) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token = s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($2) THEN
    RETURN QUERY UPDATE events AS e
         SET lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
         FROM unnest($2, $3, $4) AS s(id, token, ord)
         WHERE e.id = ANY($2) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token = s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
  IF EXISTS (SELECT 1 FROM limit_slots AS t WHERE t.token = ANY($3)) THEN
    UPDATE limit_slots AS t
       SET expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
     WHERE t.token = ANY($3)
       AND EXISTS (SELECT 1 FROM events AS e
                   WHERE e.id = t.event_id AND e.lease_token = t.token AND e.state = 0);
  END IF;
END$$;
