-- Storing new events, and the look-up of the events that hold a batch's
-- idempotency keys.

-- New events into the filling ring leaf: $1 ids, $2 tenants, $3 handlers,
-- $4 payloads, $5 run_at by the database's clock (a schedule's
-- occurrence) or NULL, $6 max attempts, $7 idempotency keys, $8 topics,
-- $9 delays in ms, added to now() here (so no process's clock moves a
-- due time), $10 concurrency keys, $11 singleton keys. Events that will
-- not run within the ring's turn go to events_cold, so that a leaf drains
-- by itself: those due more than 10 s from now, and those of a paused or
-- blocked handler (and all of them if no leaf fills). Returns the ids
-- inserted.
--
-- An id stored in any leaf, or a key held by a live event in any leaf,
-- inserts nothing (the caller looks the holder up); the probes are per
-- row (LIMIT 1 subqueries), each one index per leaf, and a leaf's unique
-- indexes catch two emits racing into the same leaf. Two cannot race into
-- different leaves: emit reads `ring`, so it holds `ring` (ACCESS SHARE)
-- until its transaction ends, and ring_flip takes ACCESS EXCLUSIVE on
-- `ring` to change the filling leaf, so a flip waits for every emit in
-- flight, and an emit that starts after it sees the new filling leaf and
-- every row emitted before. jit = off in every function here: a plan that
-- keeps a node the settings disable (the scan of the three-row ring)
-- carries its cost of 10^10, far above jit_above_cost, and compiling takes
-- hundreds of milliseconds; batches of a few hundred rows never gain.
CREATE OR REPLACE FUNCTION emit(uuid[], text[], text[], text[], int8[], int4[], text[], text[], int8[], text[], text[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY INSERT INTO events AS e
       (id, tenant, handler, payload, run_at, max_attempts, notified_at, idempotency_key,
        created_at, updated_at, leaf, topic, concurrency_key, singleton_key)
     SELECT u.id, u.tenant, u.handler, u.payload, t.run_at, u.max_attempts,
            least(t.run_at, 9223372036854775806), u.key, c.now, c.now,
            CASE WHEN t.run_at > c.now + 10000
                      OR EXISTS (SELECT 1 FROM rules AS r
                                 WHERE r.tenant = u.tenant AND r.handler = u.handler)
                 THEN 0 ELSE c.leaf END,
            u.topic, u.concurrency_key, u.singleton_key
     FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
            AS u(id, tenant, handler, payload, at, max_attempts, key, topic, after_ms,
                 concurrency_key, singleton_key),
          (SELECT floor(date_part('epoch', now()) * 1000)::bigint AS now,
                  coalesce((SELECT r.leaf FROM ring AS r WHERE r.phase = 'filling'), 0) AS leaf)
            AS c,
          -- Saturating: a delay of centuries is due never, not in the past.
          LATERAL (SELECT coalesce(u.at,
                     CASE WHEN u.after_ms > 9223372036854775807 - c.now
                          THEN 9223372036854775807
                          ELSE c.now + greatest(u.after_ms, 0) END) AS run_at) AS t
     WHERE (SELECT 1 FROM events AS x WHERE x.id = u.id LIMIT 1) IS NULL
       AND (u.key IS NULL
            OR (SELECT 1 FROM events AS x
                WHERE x.tenant = u.tenant AND x.handler = u.handler
                  AND x.idempotency_key = u.key AND x.state = 0 LIMIT 1) IS NULL)
     ON CONFLICT DO NOTHING
     RETURNING e.id; END$$;

-- The live events holding idempotency keys: one probe of events_live_key
-- per key, a LATERAL ... LIMIT 1 that the planner cannot turn around.
-- $1 tenants, $2 handlers, $3 keys, $4 positions.
CREATE OR REPLACE FUNCTION existing_keys(text[], text[], text[], int4[])
RETURNS TABLE (ord int4, id uuid)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan SET jit = off
AS $$BEGIN RETURN QUERY SELECT k.ord, x.id
     FROM unnest($1, $2, $3, $4) AS k(tenant, handler, key, ord)
     CROSS JOIN LATERAL (SELECT e.id FROM events AS e
                         WHERE e.tenant = k.tenant AND e.handler = k.handler
                           AND e.idempotency_key = k.key AND e.state = 0
                         LIMIT 1) AS x; END$$;
