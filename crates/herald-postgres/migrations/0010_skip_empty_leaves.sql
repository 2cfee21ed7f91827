-- herald's PostgreSQL schema, version 10: the hot statements skip the
-- empty ring leaves.
--
-- A statement that finds events by id (`id = ANY($ids)`) probed every
-- partition's primary key for every id: the leaf that holds the events,
-- events_cold, and ring leaves that a retire had TRUNCATEd, which hold
-- nothing (PostgreSQL 15 descends each index once per array element,
-- however empty the index). The claim, the four settles and the renewal
-- now also ask, in the same statement, which ring leaves are not empty,
-- and run-time partition pruning leaves the others out ("never executed"
-- in EXPLAIN ANALYZE): a drain from a backlog in one leaf probes two
-- partitions instead of four (bench/claim-sql.sh, variant `all`, weighs
-- it). events_cold is always probed: whether it holds anything is not
-- known without reading it.
--
-- Why this is safe: the question is an InitPlan of the statement, so it
-- reads the statement's snapshot. A leaf is marked empty in the same
-- transaction as its TRUNCATE and the copy of its events into
-- events_cold (ring_retire), and marked not empty in the flip that makes
-- it filling, which commits before any emit into it can begin
-- (ring_flip's lock on `ring`). So a snapshot that sees a leaf empty sees
-- no event in it, and sees the moved events in events_cold.
--
-- Why a copy of `ring`'s phase and not `ring` itself: ring_flip takes
-- ACCESS EXCLUSIVE on `ring` (for up to its lock_timeout, while emits in
-- flight finish), and every statement that asked for a lock on `ring`
-- meanwhile would queue behind it: claims and settles would then stall
-- with the emits. ring_empty is written only by the trigger below (a row
-- update, which a read does not wait for).
--
-- The leaves are named as equalities joined by OR, each against its own
-- subquery. Run-time pruning acts on that (not on `= ANY(array)`), and no
-- plain index scan can use an OR, so the leaf stays out of the primary
-- key's index condition. As `IN (0, ...)` (an array to the planner) it
-- went in there on a leaf never analyzed with rows (bench/compare.sh's
-- stale case), and the index was then descended once per id and listed
-- leaf: four times the probes this migration saves (tests/plans.rs,
-- statistics `stale-leaves`, fails on that form).

CREATE TABLE ring_empty (
    leaf  smallint NOT NULL PRIMARY KEY CHECK (leaf BETWEEN 1 AND 3),
    empty boolean  NOT NULL
);
INSERT INTO ring_empty (leaf, empty) SELECT leaf, phase = 'empty' FROM ring;

CREATE FUNCTION ring_empty_copy() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$BEGIN
  UPDATE ring_empty SET empty = (NEW.phase = 'empty') WHERE leaf = NEW.leaf;
  RETURN NULL;
END$$;
CREATE TRIGGER ring_empty_copy AFTER UPDATE OF phase ON ring
FOR EACH ROW EXECUTE FUNCTION ring_empty_copy();

CREATE OR REPLACE FUNCTION claim(uuid, bigint, uuid[], text[], text[]) RETURNS SETOF events
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
       AND (e.leaf = 0
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
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
     RETURNING e.*; END$$;

CREATE OR REPLACE FUNCTION settle_delete(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY DELETE FROM events AS e
     USING unnest($1, $2, $3) AS s(id, token, ord)
     WHERE e.id = ANY($1) AND e.id = s.id
       AND (e.leaf = 0
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

CREATE OR REPLACE FUNCTION settle_archive(uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY UPDATE events AS e
     SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
         updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
         lease_token = NULL, lease_expires_at = NULL
     FROM unnest($1, $2, $3) AS s(id, token, ord)
     WHERE e.id = ANY($1) AND e.id = s.id
       AND (e.leaf = 0
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

CREATE OR REPLACE FUNCTION settle_release(uuid[], uuid[], int4[], int8[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
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
       AND (e.leaf = 0
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

CREATE OR REPLACE FUNCTION settle_bury(uuid[], uuid[], int4[], text[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
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
       AND (e.leaf = 0
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
       AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;

CREATE OR REPLACE FUNCTION renew(bigint, uuid[], uuid[], int4[]) RETURNS SETOF int4
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_nestloop = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY UPDATE events AS e
     SET lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
     FROM unnest($2, $3, $4) AS s(id, token, ord)
     WHERE e.id = ANY($2) AND e.id = s.id
       AND (e.leaf = 0
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
       AND e.lease_token = s.token AND (e.state + 0) = 0
     RETURNING s.ord; END$$;
