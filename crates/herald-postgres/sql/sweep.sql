-- The reconciler's sweep: it finds pending events whose notification may
-- have been lost (never published, or their worker died) and notifies
-- them again, parks those a rule holds, and un-parks those whose rule is
-- gone. Its reads walk events_to_notify by keyset on (notified_at,
-- id_key); its writes take ids sorted, by primary key.

-- The dead-worker source: events notified within the last quiet window
-- ($2 the cutoff, $1 now) whose lease expired after that notification.
-- $3/$4 the cursor, $5 the chunk size. There is no index on the lease (a
-- claim would then not be HOT): the walk is bounded by the window.
CREATE OR REPLACE FUNCTION sweep_expired(bigint, bigint, bigint, uuid, bigint)
RETURNS TABLE (id uuid, tenant text, handler text, ruled boolean, notified_at bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET jit = off
AS $$#variable_conflict use_column
BEGIN RETURN QUERY SELECT e.id, e.tenant, e.handler,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant AND r.handler = e.handler),
       e.notified_at
     FROM events AS e
     WHERE e.state = 0 AND e.notified_at < 9223372036854775807
       AND e.notified_at >= $2 AND e.notified_at < $1
       AND (e.notified_at, e.id_key) > ($3, $4)
       AND e.lease_expires_at <= $1 AND e.notified_at < e.lease_expires_at
       AND e.run_at <= $1
     ORDER BY e.notified_at, e.id_key LIMIT $5; END$$;

-- The quiet source: events not notified since the cutoff $2, due and not
-- under a live lease. Same parameters.
CREATE OR REPLACE FUNCTION sweep_quiet(bigint, bigint, bigint, uuid, bigint)
RETURNS TABLE (id uuid, tenant text, handler text, ruled boolean, notified_at bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET jit = off
AS $$#variable_conflict use_column
BEGIN RETURN QUERY SELECT e.id, e.tenant, e.handler,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant AND r.handler = e.handler),
       e.notified_at
     FROM events AS e
     WHERE e.state = 0 AND e.notified_at < 9223372036854775807
       AND e.notified_at < $2
       AND (e.notified_at, e.id_key) > ($3, $4)
       AND e.run_at <= $1 AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= $1)
     ORDER BY e.notified_at, e.id_key LIMIT $5; END$$;

-- Stamps returned events notified: $1 now, $2 ids (sorted).
CREATE OR REPLACE FUNCTION sweep_stamp(bigint, uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET jit = off
AS $$BEGIN UPDATE events AS e SET notified_at = $1 WHERE e.id = ANY($2) AND (e.state + 0) = 0; END$$;

-- Parks events held by a rule: $1 ids (sorted).
CREATE OR REPLACE FUNCTION sweep_park(uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET jit = off
AS $$BEGIN UPDATE events AS e SET notified_at = 9223372036854775807
     WHERE e.id = ANY($1) AND (e.state + 0) = 0; END$$;

-- Un-parks up to $3 parked events of one handler ($1 tenant, $2 handler):
-- found through events_parked in id order, updated by primary key. Returns
-- how many.
CREATE OR REPLACE FUNCTION sweep_unpark(text, text, bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off
SET enable_hashjoin = off SET enable_mergejoin = off
SET search_path FROM CURRENT
SET jit = off
AS $$DECLARE n bigint; BEGIN UPDATE events AS e SET notified_at = least(e.run_at, 9223372036854775806)
     WHERE e.id = ANY(ARRAY(SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2
                            AND x.state = 0 AND x.notified_at = 9223372036854775807
                            ORDER BY x.id_key LIMIT $3))
       AND (e.state + 0) = 0; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END$$;
