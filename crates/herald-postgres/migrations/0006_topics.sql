-- herald's PostgreSQL schema, version 6: topics (fan-out, docs/semantics.md
-- "Fan-out"). A topic emit stores one event per subscribed handler, in one
-- emit() statement (all or none); each copy records the topic it came from.

-- Who is subscribed to what. `tenant` '' means every tenant: tenant names
-- are never empty (they are checked at emit), so '' cannot clash with one,
-- and the primary key stays a plain NOT NULL key. `source` is 'config' for
-- `[[subscriptions]]` of herald.toml (replaced as a whole on every load) or
-- 'api' for the API, the CLI and Client::subscribe (kept until removed).
CREATE TABLE subscriptions (
    topic      text   NOT NULL,
    tenant     text   NOT NULL,
    handler    text   NOT NULL,
    source     text   NOT NULL CHECK (source IN ('config', 'api')),
    created_at bigint NOT NULL,
    PRIMARY KEY (topic, tenant, handler)
);

-- The topic an event was emitted to; NULL for a direct emit. Added to the
-- partitioned table, so every leaf (events_cold, events_1 to events_3) has
-- it. No index: no hot statement filters on it.
ALTER TABLE events ADD COLUMN topic text;

-- emit() of migration 5 with $8, the topics.
DROP FUNCTION emit(uuid[], text[], text[], text[], int8[], int4[], text[]);
CREATE FUNCTION emit(uuid[], text[], text[], text[], int8[], int4[], text[], text[])
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
     SELECT u.id, u.tenant, u.handler, u.payload, u.run_at, u.max_attempts,
            least(u.run_at, 9223372036854775806), u.key, c.now, c.now,
            CASE WHEN u.run_at > c.now + 10000
                      OR EXISTS (SELECT 1 FROM rules AS r
                                 WHERE r.tenant = u.tenant AND r.handler = u.handler)
                 THEN 0 ELSE c.leaf END,
            u.topic
     FROM unnest($1, $2, $3, $4, $5, $6, $7, $8)
            AS u(id, tenant, handler, payload, run_at, max_attempts, key, topic),
          (SELECT floor(date_part('epoch', now()) * 1000)::bigint AS now,
                  coalesce((SELECT r.leaf FROM ring AS r WHERE r.phase = 'filling'), 0) AS leaf)
            AS c
     WHERE (SELECT 1 FROM events AS x WHERE x.id = u.id LIMIT 1) IS NULL
       AND (u.key IS NULL
            OR (SELECT 1 FROM events AS x
                WHERE x.tenant = u.tenant AND x.handler = u.handler
                  AND x.idempotency_key = u.key AND x.state = 0 LIMIT 1) IS NULL)
     ON CONFLICT DO NOTHING
     RETURNING e.id; END$$;

-- ring_retire() of migration 5, copying the topic too.
CREATE OR REPLACE FUNCTION ring_retire(smallint, bigint, boolean)
RETURNS TABLE (moved bigint, dropped bigint, emptied boolean)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '100ms'
SET jit = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
DECLARE n_moved bigint; n_left bigint; leaf_table text := 'events_' || $1;
  columns text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, leaf, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors, topic';
  copied text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, 0, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors, topic';
BEGIN
  PERFORM 1 FROM ring AS r WHERE r.leaf = $1 AND r.phase = 'draining' FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  -- Counted before the lock (rows only leave a draining leaf).
  EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %I LIMIT $1 + 1) AS l', leaf_table)
    INTO n_left USING $2;
  IF n_left > $2 AND NOT $3 THEN
    RETURN;
  END IF;
  EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', leaf_table);
  IF n_left > $2 THEN
    EXECUTE format(
      'WITH m AS (DELETE FROM %I WHERE ctid = ANY (ARRAY(SELECT ctid FROM %I LIMIT $1)) '
      'RETURNING %s), i AS (INSERT INTO events_cold (%s) SELECT %s FROM m '
      'ON CONFLICT DO NOTHING RETURNING 1) '
      'SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM i)',
      leaf_table, leaf_table, columns, columns, copied) INTO n_left, n_moved USING $2;
    RETURN QUERY SELECT n_moved, n_left - n_moved, false;
    RETURN;
  END IF;
  EXECUTE format('SELECT count(*) FROM %I', leaf_table) INTO n_left;
  EXECUTE format('INSERT INTO events_cold (%s) SELECT %s FROM %I ON CONFLICT DO NOTHING',
                 columns, copied, leaf_table);
  GET DIAGNOSTICS n_moved = ROW_COUNT;
  EXECUTE format('TRUNCATE %I', leaf_table);
  UPDATE ring AS r SET phase = 'empty', since = floor(date_part('epoch', now()) * 1000)::bigint
  WHERE r.leaf = $1;
  RETURN QUERY SELECT n_moved, n_left - n_moved, true;
END$$;

-- inspect() of migrations 3 and 5, returning the topic too (after
-- updated_at, as the store reads its event columns).
DROP FUNCTION inspect(uuid[]);
CREATE FUNCTION inspect(uuid[])
RETURNS TABLE (now bigint, id uuid, tenant text, handler text, payload text, state smallint,
               run_at bigint, attempt integer, max_attempts integer, lease_token uuid,
               lease_expires_at bigint, last_error text, idempotency_key text,
               created_at bigint, updated_at bigint, topic text, blocked boolean,
               paused boolean)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY SELECT c.now, e.id, e.tenant, e.handler, e.payload, e.state, e.run_at,
       e.attempt, e.max_attempts, e.lease_token, e.lease_expires_at, e.last_error,
       e.idempotency_key, e.created_at, e.updated_at, e.topic,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'block'),
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'pause')
     FROM (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint AS now) AS c
     LEFT JOIN events AS e ON e.id = ANY($1); END$$;
