-- herald's PostgreSQL schema, version 15: an emit's delay is counted from
-- the database's clock.
--
-- emit() took each event's run_at as the emitting process computed it
-- (its own clock plus the delay), so a process whose clock was off moved
-- its events' due times by the difference. It now takes, per event, either
-- an absolute run_at ($5, by the database's clock: a schedule's
-- occurrence) or a delay in ms ($9), which it adds to now() here, in the
-- statement that inserts the row. The leaf is chosen from that run_at as
-- before: an event due more than 10 s after now, or held by a rule, goes to
-- the cold leaf (docs/postgres.md, "Storage: the ring of leaves").

DROP FUNCTION emit(uuid[], text[], text[], text[], int8[], int4[], text[], text[]);
CREATE FUNCTION emit(uuid[], text[], text[], text[], int8[], int4[], text[], text[], int8[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY INSERT INTO events AS e
       (id, tenant, handler, payload, run_at, max_attempts, notified_at, idempotency_key,
        created_at, updated_at, leaf, topic)
     SELECT u.id, u.tenant, u.handler, u.payload, t.run_at, u.max_attempts,
            least(t.run_at, 9223372036854775806), u.key, c.now, c.now,
            CASE WHEN t.run_at > c.now + 10000
                      OR EXISTS (SELECT 1 FROM rules AS r
                                 WHERE r.tenant = u.tenant AND r.handler = u.handler)
                 THEN 0 ELSE c.leaf END,
            u.topic
     FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9)
            AS u(id, tenant, handler, payload, at, max_attempts, key, topic, after_ms),
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
