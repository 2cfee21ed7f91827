-- herald's PostgreSQL schema, version 14: each claimed event gets a lease
-- token of its own.
--
-- The claim took one token for its whole batch, so the runs of one claim
-- shared it (HERALD_LEASE_TOKEN, Context::lease_token), though a token
-- names one run. Its first argument is now the tokens, one per id of $3
-- and in the same order: each row takes the token at its id's position.
-- array_position scans $3 (a batch, at most a few hundred ids) once per
-- claimed row, in C; the statements and their plans are otherwise those
-- of schema 12.

DROP FUNCTION claim(uuid, bigint, uuid[], text[], text[]);

CREATE FUNCTION claim(uuid[], bigint, uuid[], text[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE taken bigint;
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
         RETURNING e.*;
  END IF;
END$$;
