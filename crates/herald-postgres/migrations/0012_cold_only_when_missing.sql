-- herald's PostgreSQL schema, version 12: the hot statements look in
-- events_cold only for what the ring's leaves did not have.
--
-- Schema 10 left every empty ring leaf out of the claim, the settles and
-- the renewal, but probed events_cold for every id of every batch: it
-- holds the events that outlived their leaf (delayed by more than the
-- ring's turn, those of paused or blocked handlers, stragglers of a
-- retired leaf), so behind a million parked events each claimed and
-- settled id also descended a million-entry primary key, and found
-- nothing there (bench/compare.sh, case paused: the claim's statement
-- 13.5-19 us per event against 11.5-13.4 clean, docs/benchmarks.md).
--
-- Each of them is now two statements in its function: the first over the
-- ring's leaves that are not empty (as schema 10), the second over
-- events_cold alone, run only when the first took fewer rows than the
-- batch has ids. An event emitted due within the turn is in a ring leaf
-- until it finishes or its leaf is retired, so a drain's batches are
-- taken whole by the first statement and never reach events_cold; an
-- event that is there (due late, un-parked, a straggler) costs its batch
-- a second statement, as does an id whose claim or fence fails (already
-- claimed, finished, its lease lost), which probes where schema 11 did.
--
-- Why this is safe: an id is stored in one leaf (emit, migration 5). The
-- first statement finds what a ring leaf holds at its snapshot; events
-- move from a ring leaf to events_cold only under the leaf's ACCESS
-- EXCLUSIVE lock (ring_retire), which waits for the first statement's
-- transaction, so an event the first statement could not see in its leaf
-- was moved before it began and the second statement, with a later
-- snapshot, sees it in events_cold. When the first took every id, none is
-- left to look for. Rows are locked leaf by leaf, in id order within
-- each, as the one statement of schema 10 did: the same order for every
-- caller.
--
-- Why two statements and not one with a condition: schema 12 as first
-- tried (the seventeenth sitting of docs/benchmarks.md, reverted) was one
-- WITH of both parts, the second behind a filter on the first's count:
-- the first part's rows were materialized twice, and the claim took 7 %
-- longer with events_cold empty. Here the second statement is not planned
-- into the first and runs only when needed; ROW_COUNT after RETURN QUERY
-- is the first's count. The second repeats the first but for the leaf
-- condition, written out rather than built with EXECUTE: plpgsql keeps
-- each written statement's plan, and EXECUTE would plan it on every call.

CREATE OR REPLACE FUNCTION claim(uuid, bigint, uuid[], text[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET attempt = e.attempt + 1, lease_token = $1,
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
       RETURNING e.*;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($3) THEN
    RETURN QUERY UPDATE events AS e
         SET attempt = e.attempt + 1, lease_token = $1,
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
         RETURNING e.*;
  END IF;
END$$;

CREATE OR REPLACE FUNCTION settle_delete(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint;
BEGIN
  RETURN QUERY DELETE FROM events AS e
       USING unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY DELETE FROM events AS e
         USING unnest($1, $2, $3) AS s(id, token, ord)
         WHERE e.id = ANY($1) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$$;

CREATE OR REPLACE FUNCTION settle_archive(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           lease_token = NULL, lease_expires_at = NULL
       FROM unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY UPDATE events AS e
         SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             lease_token = NULL, lease_expires_at = NULL
         FROM unnest($1, $2, $3) AS s(id, token, ord)
         WHERE e.id = ANY($1) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$$;

CREATE OR REPLACE FUNCTION settle_release(uuid[], uuid[], int4[], int8[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
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
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY UPDATE events AS e
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
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$$;

CREATE OR REPLACE FUNCTION settle_bury(uuid[], uuid[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET state = 1, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           last_error = s.error, lease_token = NULL, lease_expires_at = NULL,
           errors = coalesce(e.errors, '[]'::jsonb)
               || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                    'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                    'error', s.error))
       FROM unnest($1, $2, $3, $4) AS s(id, token, ord, error)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY UPDATE events AS e
         SET state = 1, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             last_error = s.error, lease_token = NULL, lease_expires_at = NULL,
             errors = coalesce(e.errors, '[]'::jsonb)
                 || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                      'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                      'error', s.error))
         FROM unnest($1, $2, $3, $4) AS s(id, token, ord, error)
         WHERE e.id = ANY($1) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$$;

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
END$$;
