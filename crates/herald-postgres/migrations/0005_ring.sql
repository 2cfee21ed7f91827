-- herald's PostgreSQL schema, version 5: events in a ring of leaves
-- (ADR 0009, docs/postgres.md "Storage: the ring of leaves").
--
-- Every finished event leaves a dead row, and at thousands of events a
-- second autovacuum cannot keep up (it wakes once per naptime), nor can any
-- vacuum remove a row that an open transaction might still see. So
-- `events` is partitioned by `leaf`:
--   * three ring leaves, events_1 to events_3: new events go into the one
--     whose phase is 'filling'. On the elected reconciler's pass, the
--     filling leaf becomes 'draining' and the next (emptied) one 'filling';
--     a leaf that has drained is retired: its remaining events (delayed,
--     paused, running long, dead or kept done) are copied to events_cold and
--     the leaf is TRUNCATEd. Its dead rows go with it, whatever snapshot an
--     open transaction holds;
--   * events_cold (leaf 0): the events that outlived their leaf, vacuumed
--     by autovacuum as before (migration 3's settings). Inserts that name no
--     leaf land here too.
-- Statements find an event by id in whichever leaf holds it: `id = ANY`
-- probes each leaf's primary key (four probes per id, each bounded).
--
-- An id, and a live idempotency key, is still stored at most once across
-- the leaves: emit() looks in every leaf before it inserts into the filling
-- one, and a leaf's unique indexes catch two emits racing into the same
-- leaf. Two racing into different leaves cannot happen: emit reads `ring`,
-- so it holds `ring` (ACCESS SHARE) until its transaction ends, and
-- ring_flip() takes ACCESS EXCLUSIVE on `ring` to change the filling leaf,
-- so a flip waits for every emit in flight, and an emit that starts after
-- it sees the new filling leaf and every row emitted before (its snapshot
-- is taken after its locks).
--
-- Upgrading from schema 4 copies every stored event into events_cold, under
-- the migration's transaction (docs/postgres.md: when to run it).

ALTER TABLE events RENAME TO events_v4;
-- claim() returns the table's row type, which the new table replaces.
DROP FUNCTION claim(uuid, bigint, uuid[], text[]);

CREATE TABLE events (
    id               uuid     NOT NULL,
    run_at           bigint   NOT NULL,
    notified_at      bigint   NOT NULL,
    lease_expires_at bigint,
    created_at       bigint   NOT NULL,
    updated_at       bigint   NOT NULL,
    finished_at      bigint,
    attempt          integer  NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer  NOT NULL CHECK (max_attempts >= 0),
    state            smallint NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),
    -- Which leaf holds the row: 0 events_cold, 1-3 the ring's.
    leaf             smallint NOT NULL DEFAULT 0,
    lease_token      uuid,
    tenant           text     NOT NULL,
    handler          text     NOT NULL,
    idempotency_key  text,
    last_error       text,
    payload          text     NOT NULL,
    errors           jsonb,
    id_key           uuid     GENERATED ALWAYS AS (id) STORED,
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) PARTITION BY LIST (leaf);

-- fillfactor 45 as in migration 1 (claims stay HOT), and migration 3's
-- autovacuum settings on every leaf: while the ring turns, a ring leaf is
-- TRUNCATEd before autovacuum (once per naptime) finds much to do; when it
-- cannot turn (a backlog that keeps a leaf from draining, a transaction
-- that holds it), vacuum is what keeps the filling leaf in bounds, as
-- before this migration.
CREATE TABLE events_cold PARTITION OF events FOR VALUES IN (0) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
CREATE TABLE events_1 PARTITION OF events FOR VALUES IN (1) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
CREATE TABLE events_2 PARTITION OF events FOR VALUES IN (2) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
CREATE TABLE events_3 PARTITION OF events FOR VALUES IN (3) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);

INSERT INTO events (id, run_at, notified_at, lease_expires_at, created_at, updated_at,
                    finished_at, attempt, max_attempts, state, leaf, lease_token, tenant,
                    handler, idempotency_key, last_error, payload, errors)
SELECT id, run_at, notified_at, lease_expires_at, created_at, updated_at, finished_at,
       attempt, max_attempts, state, 0, lease_token, tenant, handler, idempotency_key,
       last_error, payload, errors
FROM events_v4;

DROP TABLE events_v4;

-- The indexes of migrations 1 and 4, on every leaf. The primary key and the
-- live-key index hold `leaf` because a partitioned table's unique indexes
-- must; uniqueness across leaves is emit's (above).
ALTER TABLE events ADD PRIMARY KEY (id, leaf);
CREATE INDEX events_by_handler ON events (tenant, handler, state, id_key);
CREATE UNIQUE INDEX events_live_key ON events (tenant, handler, idempotency_key, leaf)
    WHERE idempotency_key IS NOT NULL AND state = 0;
CREATE INDEX events_to_notify ON events (notified_at, id_key)
    WHERE state = 0 AND notified_at < 9223372036854775807;
CREATE INDEX events_parked ON events (tenant, handler, id_key)
    WHERE state = 0 AND notified_at = 9223372036854775807;
CREATE INDEX events_finished ON events (state, finished_at)
    WHERE finished_at IS NOT NULL;

-- Each ring leaf's phase, and since when (ms, the database's clock):
-- exactly one is 'filling'; 'draining' ones are retired once they have
-- drained for the store's drain time; 'empty' ones have been TRUNCATEd.
CREATE TABLE ring (
    leaf  smallint NOT NULL PRIMARY KEY CHECK (leaf BETWEEN 1 AND 3),
    phase text     NOT NULL CHECK (phase IN ('filling', 'draining', 'empty')),
    since bigint   NOT NULL
);
INSERT INTO ring (leaf, phase, since)
SELECT l, CASE l WHEN 1 THEN 'filling' ELSE 'empty' END,
       floor(date_part('epoch', now()) * 1000)::bigint
FROM generate_series(1, 3) AS l;

CREATE FUNCTION claim(uuid, bigint, uuid[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
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
       AND NOT EXISTS (SELECT 1 FROM rules AS r
                       WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0)
     RETURNING e.*; END$$;

-- New events into the filling leaf: $1 ids,
-- $2 tenants, $3 handlers, $4 payloads, $5 run_at, $6 max attempts, $7
-- idempotency keys. Events that will not run within the ring's turn go
-- straight to events_cold, so that a leaf drains by itself: those due more
-- than 10 s from now, and those of a paused or blocked handler (and all of
-- them if no leaf fills). An id stored in any leaf, or a key held by a live event
-- in any leaf, inserts nothing (the caller looks the holder up); the
-- probes are per row (LIMIT 1 subqueries, nested loops only), each a probe
-- of one index per leaf. Returns the ids inserted.
CREATE FUNCTION emit(uuid[], text[], text[], text[], int8[], int4[], text[]) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET jit = off
SET search_path FROM CURRENT
AS $$BEGIN RETURN QUERY INSERT INTO events AS e
       (id, tenant, handler, payload, run_at, max_attempts, notified_at, idempotency_key,
        created_at, updated_at, leaf)
     SELECT u.id, u.tenant, u.handler, u.payload, u.run_at, u.max_attempts,
            least(u.run_at, 9223372036854775806), u.key, c.now, c.now,
            CASE WHEN u.run_at > c.now + 10000
                      OR EXISTS (SELECT 1 FROM rules AS r
                                 WHERE r.tenant = u.tenant AND r.handler = u.handler)
                 THEN 0 ELSE c.leaf END
     FROM unnest($1, $2, $3, $4, $5, $6, $7)
            AS u(id, tenant, handler, payload, run_at, max_attempts, key),
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

-- Makes leaf $2 the filling one and $1 (the filling one now) draining, if
-- they still are what the caller saw (two reconcilers for a moment: the
-- second finds them changed and does nothing). ACCESS EXCLUSIVE on ring
-- waits for every emit in flight (see the top); lock_timeout keeps a flip
-- that cannot have it soon from stalling emits behind it: it fails with
-- 55P03 and the next pass tries again.
CREATE FUNCTION ring_flip(smallint, smallint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '100ms'
SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE now_ms bigint := floor(date_part('epoch', now()) * 1000)::bigint;
BEGIN
  LOCK TABLE ring IN ACCESS EXCLUSIVE MODE;
  IF NOT EXISTS (SELECT 1 FROM ring WHERE leaf = $1 AND phase = 'filling')
     OR NOT EXISTS (SELECT 1 FROM ring WHERE leaf = $2 AND phase = 'empty') THEN
    RETURN false;
  END IF;
  UPDATE ring SET phase = 'draining', since = now_ms WHERE leaf = $1;
  UPDATE ring SET phase = 'filling', since = now_ms WHERE leaf = $2;
  RETURN true;
END$$;

-- Retires draining leaf $1 once it has drained: if at most $2 events are
-- left in it, then under ACCESS EXCLUSIVE on the leaf (no statement is
-- inside it, and those that want it wait: the wait is bounded by moving at
-- most $2 rows), copies them to events_cold and TRUNCATEs it. If more are
-- left (a backlog not yet run, events emitted then paused), it waits for a
-- later pass, unless $3: then it moves $2 of them, so that a leaf whose
-- stragglers never finish is emptied in steps. Returns the events moved,
-- those dropped as copies of one already in events_cold, and whether the
-- leaf is empty now; no row if it was not draining or not yet drained.
--
-- A copy is an id stored twice, which emit prevents except inside a
-- REPEATABLE READ or SERIALIZABLE transaction whose snapshot predates a
-- turn: the copy in events_cold is kept, rather than the ring stopping for
-- good. lock_timeout as for ring_flip: a leaf held by a long transaction
-- waits for a later pass.
CREATE FUNCTION ring_retire(smallint, bigint, boolean)
RETURNS TABLE (moved bigint, dropped bigint, emptied boolean)
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '100ms'
SET jit = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
DECLARE n_moved bigint; n_left bigint; leaf_table text := 'events_' || $1;
  columns text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, leaf, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors';
  copied text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, 0, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors';
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

-- The functions that read events were STABLE, and a STABLE function reads
-- with its caller's snapshot, which can predate a turn's TRUNCATE: it
-- would then find the retired leaf empty and not yet see the events moved
-- to events_cold. VOLATILE, each statement takes its snapshot after its
-- locks, so after the turn that it waited for.
ALTER FUNCTION inspect(uuid[]) VOLATILE;
ALTER FUNCTION existing_keys(text[], text[], text[], int4[]) VOLATILE;
ALTER FUNCTION sweep_expired(bigint, bigint, bigint, uuid, bigint) VOLATILE;
ALTER FUNCTION sweep_quiet(bigint, bigint, bigint, uuid, bigint) VOLATILE;

-- No JIT in any of them. A plan that keeps a node the settings disable
-- (the sequential scan of the three-row ring above; any scan the planner
-- has no other way to do) carries the disabled node's cost of 10^10, far
-- above jit_above_cost, and compiling it took 450-650 ms per emit (seen on
-- this migration's first draft). Batches of a few hundred rows never gain
-- from JIT.
-- And generic plans for the hot ones: a custom plan of a statement on four
-- leaves is planned anew on every call, which cost more than the
-- statement; the generic plan is bounded like the custom one
-- (tests/plans.rs checks both).
ALTER FUNCTION claim(uuid, bigint, uuid[], text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION inspect(uuid[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION settle_delete(uuid[], uuid[], int4[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION settle_archive(uuid[], uuid[], int4[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION settle_release(uuid[], uuid[], int4[], int8[], int4[], text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION settle_bury(uuid[], uuid[], int4[], text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION renew(bigint, uuid[], uuid[], int4[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION existing_keys(text[], text[], text[], int4[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION emit(uuid[], text[], text[], text[], int8[], int4[], text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION claim(uuid, bigint, uuid[], text[]) SET jit = off;
ALTER FUNCTION inspect(uuid[]) SET jit = off;
ALTER FUNCTION settle_delete(uuid[], uuid[], int4[]) SET jit = off;
ALTER FUNCTION settle_archive(uuid[], uuid[], int4[]) SET jit = off;
ALTER FUNCTION settle_release(uuid[], uuid[], int4[], int8[], int4[], text[]) SET jit = off;
ALTER FUNCTION settle_bury(uuid[], uuid[], int4[], text[]) SET jit = off;
ALTER FUNCTION renew(bigint, uuid[], uuid[], int4[]) SET jit = off;
ALTER FUNCTION existing_keys(text[], text[], text[], int4[]) SET jit = off;
ALTER FUNCTION renotify(text, text, bigint) SET jit = off;
ALTER FUNCTION renotify_after(text, text, bigint, uuid) SET jit = off;
ALTER FUNCTION sweep_expired(bigint, bigint, bigint, uuid, bigint) SET jit = off;
ALTER FUNCTION sweep_quiet(bigint, bigint, bigint, uuid, bigint) SET jit = off;
ALTER FUNCTION sweep_stamp(bigint, uuid[]) SET jit = off;
ALTER FUNCTION sweep_park(uuid[]) SET jit = off;
ALTER FUNCTION sweep_unpark(text, text, bigint) SET jit = off;
