-- The ring of leaves (ADR 0009, docs/postgres.md "Storage: the ring of
-- leaves"): the elected reconciler turns it, making the filling leaf
-- draining and the next empty one filling (ring_flip), and retiring a
-- drained leaf: its remaining events are copied to events_cold and it is
-- TRUNCATEd, its dead rows with it (ring_retire). lock_timeout keeps a
-- turn that cannot have its lock soon from stalling the statements queued
-- behind it: it fails with 55P03 and the next pass tries again.

-- Makes leaf $2 the filling one and $1 (the filling one now) draining, if
-- they still are what the caller saw (two reconcilers for a moment: the
-- second finds them changed and does nothing). ACCESS EXCLUSIVE on ring
-- waits for every emit in flight (emit.sql).
CREATE OR REPLACE FUNCTION ring_flip(smallint, smallint) RETURNS boolean
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
-- stragglers never finish is emptied in steps. A leaf whose heap is zero
-- bytes has held no row since its last TRUNCATE and is only marked empty:
-- an idle herald turns the ring every few seconds, and a TRUNCATE makes new
-- files for the leaf and its indexes. Returns the events moved, those
-- dropped as copies of one already in events_cold, and whether the leaf
-- is empty now; no row if it was not draining or not yet drained.
--
-- A copy is an id stored twice, which emit prevents except inside a
-- REPEATABLE READ or SERIALIZABLE transaction whose snapshot predates a
-- turn: the copy in events_cold is kept, rather than the ring stopping for
-- good.
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
    'idempotency_key, last_error, payload, errors, topic, concurrency_key, rate_turn, singleton_key';
  copied text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, 0, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors, topic, concurrency_key, rate_turn, singleton_key';
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
  -- A heap of zero bytes has held no row since its last TRUNCATE (none
  -- live, none dead), and the lock above keeps a late emit out: marking
  -- it empty is all there is to do.
  IF pg_relation_size(leaf_table::regclass) = 0 THEN
    UPDATE ring AS r SET phase = 'empty', since = floor(date_part('epoch', now()) * 1000)::bigint
    WHERE r.leaf = $1;
    RETURN QUERY SELECT 0::bigint, 0::bigint, true;
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

-- Copies each ring leaf's phase into ring_empty, which the hot statements
-- read to skip the empty leaves (claim.sql). Not `ring` itself: ring_flip
-- holds ACCESS EXCLUSIVE on `ring` while emits in flight finish, and
-- claims and settles would queue behind it. A leaf is marked empty in the
-- transaction that TRUNCATEs it and copies its events to events_cold, and
-- not empty by the flip that makes it filling, which commits before any
-- emit into it begins: a snapshot that sees a leaf empty sees no event in
-- it, and the moved ones in events_cold.
CREATE OR REPLACE FUNCTION ring_empty_copy() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$BEGIN
  UPDATE ring_empty SET empty = (NEW.phase = 'empty') WHERE leaf = NEW.leaf;
  RETURN NULL;
END$$;
CREATE OR REPLACE TRIGGER ring_empty_copy AFTER UPDATE OF phase ON ring
FOR EACH ROW EXECUTE FUNCTION ring_empty_copy();
