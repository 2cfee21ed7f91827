-- herald's PostgreSQL schema, version 6: a ring of two leaves
-- (ADR 0009, "What each leaf costs").
--
-- Every statement on `events` plans, locks and opens every leaf, so each
-- leaf costs every statement something: with two ring leaves instead of
-- three, a no-op drain took about 9% less PostgreSQL CPU per event, and no
-- more than with one. Two are enough to turn: on a turn the draining leaf
-- is retired (TRUNCATEd) and then takes new events in the same turn
-- (src/ring.rs), so a third leaf only ever waited.
--
-- events_3's rows are copied to events_cold first (as a retire does), so
-- nothing stored is lost; if events_3 was the filling leaf, leaf 1 fills
-- now, whatever its phase (a draining leaf that fills again is retired on
-- a later turn, as any other).

LOCK TABLE ring IN ACCESS EXCLUSIVE MODE;

INSERT INTO events_cold (id, run_at, notified_at, lease_expires_at, created_at, updated_at,
                         finished_at, attempt, max_attempts, state, leaf, lease_token, tenant,
                         handler, idempotency_key, last_error, payload, errors)
SELECT id, run_at, notified_at, lease_expires_at, created_at, updated_at, finished_at,
       attempt, max_attempts, state, 0, lease_token, tenant, handler, idempotency_key,
       last_error, payload, errors
FROM events_3
ON CONFLICT DO NOTHING;

ALTER TABLE events DETACH PARTITION events_3;
DROP TABLE events_3;

DELETE FROM ring WHERE leaf = 3;
UPDATE ring SET phase = 'filling', since = floor(date_part('epoch', now()) * 1000)::bigint
WHERE leaf = 1 AND NOT EXISTS (SELECT 1 FROM ring WHERE phase = 'filling');
ALTER TABLE ring DROP CONSTRAINT ring_leaf_check;
ALTER TABLE ring ADD CONSTRAINT ring_leaf_check CHECK (leaf BETWEEN 1 AND 2);
