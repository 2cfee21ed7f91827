-- herald's SQLite schema, version 5: idempotency keys that outlive their
-- events (ADR 0013). An emit with a key writes a row naming the event it
-- created; a later emit with the same (tenant, handler, key) returns that
-- event, whether it is still stored or has finished, until the row is
-- purged. The elected reconciler's upkeep looks at rows older than the
-- window (24 h by default), oldest first by `stored_at`: a row whose event
-- is still live gets `stored_at` reset; one whose event is no longer live
-- is marked `gone` with `stored_at` reset the first time, and deleted the
-- next, so a key outlives its event's end by at least the window.
CREATE TABLE idempotency_keys (
    tenant     TEXT    NOT NULL,
    handler    TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    event_id   BLOB    NOT NULL,
    stored_at  INTEGER NOT NULL,
    gone       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, handler, key)
) WITHOUT ROWID;

CREATE INDEX idempotency_keys_by_age ON idempotency_keys (stored_at);
