-- herald's PostgreSQL schema, version 11: retiring a ring leaf that
-- nothing was stored in since its last TRUNCATE skips the TRUNCATE.
--
-- The ring turns every 2 s by default whatever the load, so an idle
-- herald retired (TRUNCATEd) a leaf on every reconciler pass: new files
-- for the heap, its TOAST and every index, new pg_class row versions, and
-- the files' unlinking at commit: 3.0 ms a call and 97 kB of WAL a minute
-- on an idle worker (0.6 ms and 5 kB with this; bench/compare.sh, case
-- idle, docs/benchmarks.md). A leaf whose heap is zero
-- bytes holds no row at all, live or dead, so there is nothing to copy
-- and nothing to reclaim: it is only marked empty. The size is read
-- after the leaf's ACCESS EXCLUSIVE lock, as the count it replaces was,
-- so no emit can slip a row in between. The body is migration 6's
-- otherwise.

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
