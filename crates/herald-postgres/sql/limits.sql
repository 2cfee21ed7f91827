-- Concurrency limits (ADR 0017): the claim of limited events, the settle's
-- release of their slots, and the wake of the events a full limit holds.
--
-- A scope is (kind, handler, tenant, key) as limit_slots and limit_waits
-- name it. Whoever counts a scope's slots to decide, or looks for its
-- waiters to wake, first takes the scope's transaction-scoped advisory
-- lock (scope_lock), several in one order (by the lock's key), so that a
-- claim that parks an event because its scope is full and a release that
-- frees a slot of the scope cannot miss each other: whichever comes
-- second sees the other's work. The key is a hash of the scope; two
-- scopes that share one only wait for each other. Each function locks
-- rows of `events` before scopes and never waits for an event row while
-- it holds a scope (the wake skips events another transaction holds), so
-- claims, settles and wakes do not deadlock.

-- The advisory lock key of a scope: the two-integer form, first half
-- herald's ('hera'), which no single-bigint lock (the migrate lock) can
-- take.
CREATE OR REPLACE FUNCTION scope_lock_key(smallint, text, text, text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$SELECT hashtext($1::text || '/' || $2 || '/' || $3 || '/' || $4)$$;

-- The limits row of a scope now, if any: the scope's own row (a
-- tenant's or a key's) before the default of every tenant or key.
CREATE OR REPLACE FUNCTION scope_row(smallint, text, text, text) RETURNS limits
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$SELECT l.* FROM limits AS l
     WHERE l.handler = $2 AND l.kind = $1
       AND (l.tenant = $3 OR l.tenant = '') AND (l.key = $4 OR l.key = '')
     ORDER BY l.tenant DESC, l.key DESC LIMIT 1$$;

-- The claim of the events of the handlers of $4 that a limit names
-- (arguments as claim's, which calls it): takes their leases as claim
-- does; then, under the locks of the scopes the claimed events count in,
-- reads each scope's live slots and rate state, and goes through the
-- events in id order:
--
-- - one with a full concurrency scope has its claim undone (attempt,
--   lease) and is parked, with a row in limit_waits for the first full
--   scope;
-- - else one over a rate (its scope's GCRA says its turn is later) has
--   its claim undone and is given its turn: run_at and notified_at move
--   there, and the turn is booked for it (rate_turn, and each rate
--   scope's tat moves one interval past it), so that the claim at that
--   turn starts it without charging again, and no other event takes it;
-- - any other keeps its claim, takes a slot in each concurrency scope
--   (expiring with its lease) and advances each rate scope's tat.
--
-- A booked event claimed within one interval of its turn is not charged
-- again; one claimed later (its workers were busy) is charged as new, so
-- that late starts cannot bunch past the rate.
CREATE OR REPLACE FUNCTION claim_limited(uuid[], bigint, uuid[], text[], text[]) RETURNS SETOF events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE
  got events[];
  now_ms bigint := floor(date_part('epoch', now()) * 1000)::bigint;
  now_us bigint := floor(date_part('epoch', now()) * 1000000)::bigint;
  -- The claimed events' limited scopes, one row per (event, scope).
  s_id uuid[]; s_kind int2[]; s_handler text[]; s_tenant text[]; s_key text[];
  s_token uuid[]; s_expires int8[]; s_name text[]; s_booked int8[];
  -- The distinct scopes, by name: room (NULL: no concurrency limit), and
  -- the rate's interval and tolerance (NULL: no rate) and tat.
  q_name text[]; q_kind int2[]; q_handler text[]; q_tenant text[]; q_key text[];
  q_room int8[]; q_interval int8[]; q_tau int8[]; q_tat int8[];
  ev record;
  i integer;
  full_at integer;
  turn bigint;
  charged boolean[];
  -- Per row of the s_ arrays: whether its event keeps its claim.
  keep boolean[];
  kept uuid[] := '{}';
  r_id uuid[] := '{}';
  r_at int4[] := '{}';
  d_id uuid[] := '{}';
  d_turn int8[] := '{}';
  lock_key integer;
BEGIN
  -- The leases, as claim takes them (claim.sql), of the events of the
  -- limited handlers among $4, in any leaf.
  WITH c AS (
    UPDATE events AS e
       SET attempt = e.attempt + 1, lease_token = $1[array_position($3, e.id)],
           lease_expires_at = now_ms + $2, updated_at = now_ms
     WHERE e.id = ANY($3)
       AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty)
            OR e.leaf = 0)
       AND (e.state + 0) = 0
       AND e.run_at <= now_ms
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= now_ms)
       AND e.attempt < e.max_attempts
       AND (e.handler || '') = ANY($4)
       AND EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = e.handler)
       AND NOT EXISTS (SELECT 1 FROM rules AS r
                       WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0)
    RETURNING e.*)
  SELECT coalesce(array_agg(c), '{}') INTO got FROM c;
  SELECT array_agg(g.id), array_agg(x.kind), array_agg(g.handler), array_agg(x.tenant),
         array_agg(x.key), array_agg(g.lease_token), array_agg(g.lease_expires_at),
         array_agg(x.kind::text || '/' || g.handler || '/' || x.tenant || '/' || x.key),
         array_agg(g.rate_turn)
    INTO s_id, s_kind, s_handler, s_tenant, s_key, s_token, s_expires, s_name, s_booked
    FROM unnest(got) AS g
    CROSS JOIN LATERAL (VALUES (0::int2, ''::text, ''::text), (1::int2, g.tenant, ''::text),
                               (2::int2, g.tenant, g.concurrency_key)) AS x(kind, tenant, key)
   WHERE x.key IS NOT NULL
     AND (g.handler, x.kind) IN (SELECT DISTINCT l.handler, l.kind FROM limits AS l
                                  WHERE l.handler = ANY($4));
  IF s_id IS NULL THEN
    RETURN QUERY SELECT * FROM unnest(got);
    RETURN;
  END IF;
  FOR lock_key IN SELECT DISTINCT scope_lock_key(s.kind, s.handler, s.tenant, s.key)
                    FROM unnest(s_kind, s_handler, s_tenant, s_key) AS s(kind, handler, tenant, key)
                   ORDER BY 1 LOOP
    PERFORM pg_advisory_xact_lock(1751478881, lock_key);
  END LOOP;
  SELECT array_agg(q.name ORDER BY q.name), array_agg(q.kind ORDER BY q.name),
         array_agg(q.handler ORDER BY q.name), array_agg(q.tenant ORDER BY q.name),
         array_agg(q.key ORDER BY q.name),
         array_agg((q.l).running
                   - coalesce((SELECT c.held FROM limit_counts AS c
                               WHERE c.handler = q.handler AND c.kind = q.kind
                                 AND c.tenant = q.tenant AND c.key = q.key), 0) ORDER BY q.name),
         array_agg(CASE WHEN (q.l).starts IS NOT NULL
                        THEN greatest((q.l).period_ms * 1000 / (q.l).starts, 1) END ORDER BY q.name),
         array_agg(CASE WHEN (q.l).starts IS NOT NULL
                        THEN ((q.l).burst - 1) * greatest((q.l).period_ms * 1000 / (q.l).starts, 1)
                   END ORDER BY q.name),
         array_agg(coalesce((SELECT r.tat FROM rate_state AS r
                             WHERE r.handler = q.handler AND r.kind = q.kind
                               AND r.tenant = q.tenant AND r.key = q.key), 0) ORDER BY q.name)
    INTO q_name, q_kind, q_handler, q_tenant, q_key, q_room, q_interval, q_tau, q_tat
    -- OFFSET 0: each distinct scope's row is looked up once, not once per
    -- event (the planner would pull the function below the DISTINCT).
    FROM (SELECT d.*, scope_row(d.kind, d.handler, d.tenant, d.key) AS l
            FROM (SELECT DISTINCT s.name, s.kind, s.handler, s.tenant, s.key
                    FROM unnest(s_name, s_kind, s_handler, s_tenant, s_key)
                         AS s(name, kind, handler, tenant, key) OFFSET 0) AS d
          OFFSET 0) AS q
   WHERE (q.l).handler IS NOT NULL;
  IF q_name IS NULL THEN
    RETURN QUERY SELECT * FROM unnest(got);
    RETURN;
  END IF;
  charged := array_fill(false, ARRAY[cardinality(q_name)]);
  keep := array_fill(false, ARRAY[cardinality(s_id)]);
  FOR ev IN SELECT s.id,
                   coalesce(array_agg(array_position(q_name, s.name) ORDER BY s.kind)
                              FILTER (WHERE s.name = ANY(q_name)), '{}') AS at,
                   array_agg(s.ord) AS rows,
                   max(s.booked) AS booked
              FROM unnest(s_id, s_name, s_kind, s_booked) WITH ORDINALITY
                   AS s(id, name, kind, booked, ord)
             GROUP BY s.id ORDER BY s.id LOOP
    full_at := NULL;
    FOREACH i IN ARRAY ev.at LOOP
      IF q_room[i] <= 0 THEN
        full_at := i;
        EXIT;
      END IF;
    END LOOP;
    IF full_at IS NOT NULL THEN
      r_id := r_id || ev.id;
      r_at := r_at || full_at;
      CONTINUE;
    END IF;
    -- The rate: the latest turn any of its rate scopes gives it, unless
    -- this claim is its booked turn (within one interval of it).
    turn := NULL;
    FOREACH i IN ARRAY ev.at LOOP
      IF q_interval[i] IS NOT NULL
         AND NOT (ev.booked IS NOT NULL AND now_us < ev.booked * 1000 + q_interval[i])
         AND q_tat[i] > now_us + q_tau[i] THEN
        turn := greatest(turn, q_tat[i] - q_tau[i]);
      END IF;
    END LOOP;
    IF turn IS NOT NULL THEN
      FOREACH i IN ARRAY ev.at LOOP
        IF q_interval[i] IS NOT NULL THEN
          q_tat[i] := greatest(q_tat[i], turn) + q_interval[i];
          charged[i] := true;
        END IF;
      END LOOP;
      d_id := d_id || ev.id;
      d_turn := d_turn || ((turn + 999) / 1000);
      CONTINUE;
    END IF;
    FOREACH i IN ARRAY ev.at LOOP
      q_room[i] := q_room[i] - 1;
      IF q_interval[i] IS NOT NULL
         AND NOT (ev.booked IS NOT NULL AND now_us < ev.booked * 1000 + q_interval[i]) THEN
        q_tat[i] := greatest(q_tat[i], now_us) + q_interval[i];
        charged[i] := true;
      END IF;
    END LOOP;
    FOREACH i IN ARRAY ev.rows LOOP
      keep[i] := true;
    END LOOP;
    kept := kept || ev.id;
  END LOOP;
  IF cardinality(r_id) > 0 THEN
    UPDATE events AS e
       SET attempt = e.attempt - 1, lease_token = NULL, lease_expires_at = NULL,
           notified_at = 9223372036854775807
     WHERE e.id = ANY(r_id) AND e.lease_token = ANY(s_token) AND (e.state + 0) = 0;
    INSERT INTO limit_waits (handler, kind, tenant, key, event_id)
    SELECT q_handler[w.at], q_kind[w.at], q_tenant[w.at], q_key[w.at], w.id
      FROM unnest(r_id, r_at) AS w(id, at);
  END IF;
  IF cardinality(d_id) > 0 THEN
    UPDATE events AS e
       SET attempt = e.attempt - 1, lease_token = NULL, lease_expires_at = NULL,
           run_at = d.turn, notified_at = d.turn, rate_turn = d.turn
      FROM unnest(d_id, d_turn) AS d(id, turn)
     WHERE e.id = ANY(d_id) AND e.id = d.id AND e.lease_token = ANY(s_token)
       AND (e.state + 0) = 0;
  END IF;
  IF true = ANY(charged) THEN
    INSERT INTO rate_state AS r (handler, kind, tenant, key, tat)
    SELECT q_handler[c.i], q_kind[c.i], q_tenant[c.i], q_key[c.i], q_tat[c.i]
      FROM generate_subscripts(charged, 1) AS c(i) WHERE charged[c.i]
    ON CONFLICT (handler, kind, tenant, key) DO UPDATE SET tat = excluded.tat;
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(s_booked) AS b WHERE b IS NOT NULL) THEN
    UPDATE events AS e SET rate_turn = NULL
     WHERE e.id = ANY(kept) AND e.rate_turn IS NOT NULL;
  END IF;
  INSERT INTO limit_slots (token, kind, handler, tenant, key, event_id, expires_at)
  SELECT s.token, s.kind, s.handler, s.tenant, s.key, s.id, s.expires
    FROM unnest(s_id, s_kind, s_handler, s_tenant, s_key, s_token, s_expires, s_name, keep)
         AS s(id, kind, handler, tenant, key, token, expires, name, keep)
   WHERE s.keep AND q_room[array_position(q_name, s.name)] IS NOT NULL;
  INSERT INTO limit_counts AS c (handler, kind, tenant, key, held)
  SELECT s.handler, s.kind, s.tenant, s.key, count(*)
    FROM unnest(s_id, s_kind, s_handler, s_tenant, s_key, s_name, keep)
         AS s(id, kind, handler, tenant, key, name, keep)
   WHERE s.keep AND q_room[array_position(q_name, s.name)] IS NOT NULL
   GROUP BY s.handler, s.kind, s.tenant, s.key
  ON CONFLICT (handler, kind, tenant, key) DO UPDATE SET held = c.held + excluded.held;
  RETURN QUERY SELECT * FROM unnest(got) AS g
   WHERE (cardinality(r_id) = 0 OR g.id <> ALL(r_id))
     AND (cardinality(d_id) = 0 OR g.id <> ALL(d_id));
END$$;

-- Wakes up to $5 of the events parked in scope ($1 kind, $2 handler, $3
-- tenant, $4 key), oldest first: each is un-parked (notified now) and
-- returned for the caller to publish. The caller holds the scope's lock.
-- A waiter whose event is no longer parked (unpaused, retried, deleted)
-- is dropped without counting; an event that a claim holds at this
-- moment is dropped too (that claim keeps it or parks it again).
CREATE OR REPLACE FUNCTION wake_scope(smallint, text, text, text, integer)
RETURNS TABLE (tenant text, id uuid)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
DECLARE
  want integer := $5;
  asked integer;
  picked uuid[];
  woke uuid[];
  tenants text[];
BEGIN
  WHILE want > 0 LOOP
    asked := want;
    WITH p AS (
        DELETE FROM limit_waits AS w
         WHERE (w.handler, w.kind, w.tenant, w.key, w.seq) IN
               (SELECT x.handler, x.kind, x.tenant, x.key, x.seq FROM limit_waits AS x
                 WHERE x.handler = $2 AND x.kind = $1 AND x.tenant = $3 AND x.key = $4
                 ORDER BY x.seq LIMIT want)
        RETURNING w.event_id)
    SELECT coalesce(array_agg(p.event_id), '{}') INTO picked FROM p;
    EXIT WHEN cardinality(picked) = 0;
    WITH u AS (
      UPDATE events AS e
         SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', now()) * 1000)::bigint))
       WHERE e.id = ANY(ARRAY(SELECT x.id FROM events AS x
                              WHERE x.id = ANY(picked) AND x.state = 0
                                AND x.notified_at = 9223372036854775807
                              FOR UPDATE SKIP LOCKED))
         AND (e.state + 0) = 0
      RETURNING e.id, e.tenant)
    SELECT array_agg(u.id), array_agg(u.tenant) INTO woke, tenants FROM u;
    IF woke IS NOT NULL THEN
      RETURN QUERY SELECT t, i FROM unnest(tenants, woke) AS z(t, i);
      want := want - cardinality(woke);
    END IF;
    EXIT WHEN cardinality(picked) < asked;
  END LOOP;
END$$;

-- Under the locks of the scopes ($1 kinds, $2 handlers, $3 tenants, $4
-- keys; one entry per slot freed when $6, each scope once otherwise):
-- takes the freed slots off each scope's count (limit_counts) when $6,
-- and, in each scope that holds waiters, wakes as many as it has room for
-- now (up to $5 in a scope whose limit is gone). Returns the events woken.
CREATE OR REPLACE FUNCTION wake_scopes(int2[], text[], text[], text[], integer, boolean)
RETURNS TABLE (tenant text, id uuid)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
DECLARE
  sc record;
  room bigint;
BEGIN
  FOR sc IN SELECT DISTINCT scope_lock_key(s.kind, s.handler, s.tenant, s.key) AS lock_key
              FROM unnest($1, $2, $3, $4) AS s(kind, handler, tenant, key) ORDER BY 1 LOOP
    PERFORM pg_advisory_xact_lock(1751478881, sc.lock_key);
  END LOOP;
  FOR sc IN SELECT s.kind, s.handler, s.tenant, s.key, count(*) AS n
              FROM unnest($1, $2, $3, $4) AS s(kind, handler, tenant, key)
             GROUP BY s.kind, s.handler, s.tenant, s.key LOOP
    IF $6 THEN
      UPDATE limit_counts AS c SET held = greatest(c.held - sc.n, 0)
       WHERE c.handler = sc.handler AND c.kind = sc.kind AND c.tenant = sc.tenant
         AND c.key = sc.key;
    END IF;
    IF EXISTS (SELECT 1 FROM limit_waits AS w
               WHERE w.handler = sc.handler AND w.kind = sc.kind AND w.tenant = sc.tenant
                 AND w.key = sc.key) THEN
      room := coalesce((scope_row(sc.kind, sc.handler, sc.tenant, sc.key)).running, $5)
              - coalesce((SELECT c.held FROM limit_counts AS c
                          WHERE c.handler = sc.handler AND c.kind = sc.kind
                            AND c.tenant = sc.tenant AND c.key = sc.key), 0);
      IF room > 0 THEN
        RETURN QUERY SELECT * FROM wake_scope(sc.kind, sc.handler, sc.tenant, sc.key,
                                              least(room, $5)::integer);
      END IF;
    END IF;
  END LOOP;
END$$;

-- Ends the slots of runs that ended: $1 the runs' lease tokens (those
-- whose settle held). Wakes, in each scope that lost a slot, as many
-- waiters as it has room for now. Returns the events woken. Costs one
-- probe of limit_slots_pkey per token when no run of the batch held one.
-- Its transaction commits without waiting for the WAL flush: the scope's
-- lock and count row are held only while it runs, not through a flush,
-- and a crash that loses the commit leaves the slots to lapse with their
-- leases (the reconciler frees them), never a run counted twice.
CREATE OR REPLACE FUNCTION free_slots(uuid[])
RETURNS TABLE (tenant text, id uuid)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE
  f_kind int2[]; f_handler text[]; f_tenant text[]; f_key text[];
BEGIN
  IF NOT EXISTS (SELECT 1 FROM limit_slots AS t WHERE t.token = ANY($1)) THEN
    RETURN;
  END IF;
  PERFORM set_config('synchronous_commit', 'off', true);
  WITH d AS (DELETE FROM limit_slots AS t WHERE t.token = ANY($1)
             RETURNING t.kind, t.handler, t.tenant, t.key)
  SELECT array_agg(d.kind), array_agg(d.handler), array_agg(d.tenant), array_agg(d.key)
    INTO f_kind, f_handler, f_tenant, f_key FROM d;
  RETURN QUERY SELECT * FROM wake_scopes(f_kind, f_handler, f_tenant, f_key, 1000, true);
END$$;

-- The reconciler's pass over lapsed slots: deletes up to $1 slots whose
-- run's lease lapsed (its worker died or lost the store) and wakes, in
-- their scopes, as many waiters as each has room for. Returns the events
-- woken.
CREATE OR REPLACE FUNCTION lapse_slots(integer)
RETURNS TABLE (tenant text, id uuid)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$DECLARE
  f_kind int2[]; f_handler text[]; f_tenant text[]; f_key text[];
BEGIN
  WITH d AS (DELETE FROM limit_slots AS t
              WHERE (t.token, t.kind) IN (SELECT x.token, x.kind FROM limit_slots AS x
                                           WHERE x.expires_at <= floor(date_part('epoch', now()) * 1000)::bigint
                                           ORDER BY x.expires_at LIMIT $1)
             RETURNING t.kind, t.handler, t.tenant, t.key)
  SELECT array_agg(d.kind), array_agg(d.handler), array_agg(d.tenant), array_agg(d.key)
    INTO f_kind, f_handler, f_tenant, f_key FROM d;
  IF f_kind IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT * FROM wake_scopes(f_kind, f_handler, f_tenant, f_key, 1000, true);
END$$;

-- After a limit of handler $1 and kind $2 is raised or removed: wakes the
-- waiters its scopes have room for, up to $3 scopes with waiters a call,
-- those after ($4 tenant, $5 key) in order (NULL: from the first).
-- Returns the events woken (tenant, id), then, when it looked at $3
-- scopes, one row with a NULL id naming the last (last_tenant, last_key),
-- the cursor of the next call.
CREATE OR REPLACE FUNCTION wake_limit(text, smallint, integer, text, text)
RETURNS TABLE (tenant text, id uuid, last_tenant text, last_key text)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan SET jit = off
SET search_path FROM CURRENT
AS $$#variable_conflict use_column
DECLARE
  w_tenant text[]; w_key text[];
BEGIN
  -- The next $3 scopes with waiters, by a skip scan of limit_waits_pkey.
  SELECT array_agg(s.tenant), array_agg(s.key) INTO w_tenant, w_key FROM (
    WITH RECURSIVE s(tenant, key) AS (
      (SELECT x.tenant, x.key FROM limit_waits AS x
        WHERE x.handler = $1 AND x.kind = $2
          AND ($4 IS NULL OR (x.tenant, x.key) > ($4, $5))
        ORDER BY x.tenant, x.key LIMIT 1)
      UNION ALL
      SELECT n.tenant, n.key FROM s CROSS JOIN LATERAL
        (SELECT x.tenant, x.key FROM limit_waits AS x
          WHERE x.handler = $1 AND x.kind = $2 AND (x.tenant, x.key) > (s.tenant, s.key)
          ORDER BY x.tenant, x.key LIMIT 1) AS n)
    SELECT s.tenant, s.key FROM s LIMIT $3) AS s;
  IF w_tenant IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT w.tenant, w.id, NULL::text, NULL::text
    FROM wake_scopes(array_fill($2, ARRAY[cardinality(w_tenant)]),
                     array_fill($1, ARRAY[cardinality(w_tenant)]), w_tenant, w_key, 1000,
                     false) AS w;
  IF cardinality(w_tenant) >= $3 THEN
    RETURN QUERY SELECT NULL::text, NULL::uuid, w_tenant[cardinality(w_tenant)],
                        w_key[cardinality(w_key)];
  END IF;
END$$;
