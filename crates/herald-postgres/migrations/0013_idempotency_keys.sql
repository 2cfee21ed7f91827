-- herald's PostgreSQL schema, version 13: idempotency keys that outlive
-- their events (ADR 0013).
--
-- Until now a key was held only by the partial unique index on live
-- events (state 0): once the event finished (deleted, done or dead) an
-- emit with the same key created a second event, so a client that retried
-- an emit after a timeout could run the work twice.
--
-- An emit with a key now also writes a row here, in the statement that
-- inserts the event, naming the event it created; a later emit with the
-- same (tenant, handler, key) finds the row and returns that event,
-- whether it is still stored or has finished. The elected reconciler's
-- upkeep looks at rows older than the window (24 h by default), oldest
-- first by `stored_at`, a bounded page at a time: a row whose event is
-- still live gets `stored_at` reset; one whose event is no longer live is
-- marked `gone` with `stored_at` reset the first time, and deleted the
-- next (a window later). So a key names its event for at least the window
-- after the emit and at least the window after the event finished (it had
-- finished when it was first seen gone). The live-key index stays:
-- it still holds the key of a live event without a row (emitted before
-- this version, or revived).
CREATE TABLE idempotency_keys (
    tenant     text   NOT NULL,
    handler    text   NOT NULL,
    key        text   NOT NULL,
    event_id   uuid   NOT NULL,
    stored_at  bigint NOT NULL,
    -- Its event was seen no longer live at `stored_at`.
    gone       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (tenant, handler, key)
);

CREATE INDEX idempotency_keys_by_age ON idempotency_keys (stored_at);
