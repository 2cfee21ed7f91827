-- The settles: delete (done, not kept), archive (done, kept), release
-- (back to pending, after a wait) and bury (dead).
--
-- They share their fence: the event is pending and its lease token is
-- the one given (IS NOT DISTINCT FROM: NULL fences on "no lease"). Each
-- returns the batch positions whose fence held. $1 ids (sorted), $2
-- tokens, $3 positions. They join their unnest arrays by hash join only
-- (nested loops and merge joins off): both sides are at most the batch,
-- and a nested loop could rescan one per row of the other. Two
-- statements each, as the claim (claim.sql says why).

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

-- $4 wait in ms, $5 1 to give the attempt back, $6 error (NULL keeps the
-- last one). A release with an error appends it to `errors`.
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

-- $4 error, appended to `errors`.
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
