-- herald's PostgreSQL schema, version 12: the claim and the four settles
-- look for their events in events_cold only when the ring leaves did not
-- hold them all.
--
-- Since schema 10 these statements skip the ring leaves marked empty, but
-- events_cold was probed for every id of every batch: whether it holds an
-- id is not known without reading it. A drain finds its events in the
-- ring (an event due within 10 s of its emit is stored in the filling
-- leaf), so the probe found nothing, and it cost the more the more
-- events_cold holds: behind a backlog of 1,000,000 paused or delayed
-- events (a btree of 1,000,000 entries), the claim's statement time per
-- event was 15-19 µs against 13-14 with events_cold empty
-- (bench/compare.sh, case paused, on PostgreSQL + NATS;
-- docs/benchmarks.md, "Sixteenth sitting"); and even empty, the probe was
-- about an eighth of the claim (bench/claim-sql.sh, variant `leaf`).
--
-- Each statement is now two, in one WITH: `hot` is the old statement over
-- the ring leaves not marked empty; `cold` is the same statement on the
-- partition events_cold itself, run only when `hot` took fewer rows than
-- the batch has ids (a one-time filter: "never executed" in EXPLAIN
-- ANALYZE otherwise). It names the partition rather than `events` with
-- `e.leaf = 0`, which the planner would put in the primary key's index
-- condition (tests/plans.rs refuses the leaf there). So a batch that the ring holds whole probes one or two
-- partitions, never events_cold; a batch with an id the ring does not
-- hold (a delayed event come due, an event a retire moved, a paused or
-- lost one) probes events_cold for every id, as before.
--
-- Why this is safe: both parts run in the statement's one snapshot, and an
-- id is stored in at most one leaf at a time (schema 5), so a row is found
-- in exactly one part or in none, as with the single statement. A
-- data-modifying WITH part is run to completion whether or not the outer
-- query reads it; `cold` reads `hot` (its row count), so it runs after.
-- The rule check, the fences and the plan settings are schema 10's.

CREATE OR REPLACE FUNCTION claim(uuid, bigint, uuid[], text[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY
  WITH hot AS (UPDATE events AS e
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
       RETURNING e.*),
  cold AS (UPDATE events_cold AS e
       SET attempt = e.attempt + 1, lease_token = $1,
           lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $2,
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
       WHERE e.id = ANY($3)
         AND (SELECT count(*) FROM hot) < cardinality($3)
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
       RETURNING e.*)
  SELECT * FROM hot UNION ALL SELECT * FROM cold; END$$;

CREATE OR REPLACE FUNCTION settle_delete(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY
  WITH hot AS (DELETE FROM events AS e
       USING unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord),
  cold AS (DELETE FROM events_cold AS e
       USING unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (SELECT count(*) FROM hot) < cardinality($1)
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord)
  SELECT ord FROM hot UNION ALL SELECT ord FROM cold; END$$;

CREATE OR REPLACE FUNCTION settle_archive(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY
  WITH hot AS (UPDATE events AS e
       SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           lease_token = NULL, lease_expires_at = NULL
       FROM unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord),
  cold AS (UPDATE events_cold AS e
       SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           lease_token = NULL, lease_expires_at = NULL
       FROM unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (SELECT count(*) FROM hot) < cardinality($1)
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord)
  SELECT ord FROM hot UNION ALL SELECT ord FROM cold; END$$;

CREATE OR REPLACE FUNCTION settle_release(uuid[], uuid[], int4[], int8[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY
  WITH hot AS (UPDATE events AS e
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
       RETURNING s.ord),
  cold AS (UPDATE events_cold AS e
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
         AND (SELECT count(*) FROM hot) < cardinality($1)
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord)
  SELECT ord FROM hot UNION ALL SELECT ord FROM cold; END$$;

CREATE OR REPLACE FUNCTION settle_bury(uuid[], uuid[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY
  WITH hot AS (UPDATE events AS e
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
       RETURNING s.ord),
  cold AS (UPDATE events_cold AS e
       SET state = 1, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           last_error = s.error, lease_token = NULL, lease_expires_at = NULL,
           errors = coalesce(e.errors, '[]'::jsonb)
               || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                    'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                    'error', s.error))
       FROM unnest($1, $2, $3, $4) AS s(id, token, ord, error)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (SELECT count(*) FROM hot) < cardinality($1)
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord)
  SELECT ord FROM hot UNION ALL SELECT ord FROM cold; END$$;
