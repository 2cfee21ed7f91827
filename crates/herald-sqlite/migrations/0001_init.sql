-- herald's SQLite schema, version 1. Applied once, inside a transaction, by
-- `SqliteStore::open`; `PRAGMA user_version` is set to 1 by the same
-- transaction. Times are INTEGER milliseconds since the Unix epoch; ids and
-- lease tokens are 16-byte UUID BLOBs.
--
-- Tables are STRICT (a wrongly typed value is an error, not a silent
-- conversion). The small tables are WITHOUT ROWID (clustered by their key).
-- `events` is an ordinary rowid table with a unique index on its 16-byte
-- UUIDv7 id: a lookup by id costs an index search plus a rowid search, but
-- payloads of a kilobyte or more stay on the row's own page instead of
-- spilling to overflow pages (a WITHOUT ROWID row keeps only about a quarter
-- of a page local). Measured with bench/drain: equal speed with tiny
-- payloads, 2.7x faster with 1 KB payloads (93,000 vs 34,000 events/s).

-- Marks the file as herald's: a database with tables but without this row is
-- someone else's, and herald refuses to touch it.
CREATE TABLE herald_meta (
    key   TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) STRICT, WITHOUT ROWID;

INSERT INTO herald_meta (key, value) VALUES ('format', 'herald event store');

CREATE TABLE events (
    id               BLOB    NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    tenant           TEXT    NOT NULL,
    handler          TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    -- 0 pending (waiting, or running under a lease), 1 dead, 2 done.
    state            INTEGER NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),
    run_at           INTEGER NOT NULL,
    -- Claims so far; snoozes and shutdown give one back.
    attempt          INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 0),
    -- The lease, live or expired; both NULL when there is none.
    lease_token      BLOB,
    lease_expires_at INTEGER,
    -- When a notification was last sent (or is due to be delivered) for it.
    -- 9223372036854775807 means "parked": a rule holds it, and removing the
    -- rule re-notifies it (renotify_page), so the sweep does not read it.
    notified_at      INTEGER NOT NULL,
    idempotency_key  TEXT,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    -- When it became dead or done; NULL while pending.
    finished_at      INTEGER
) STRICT;

-- Per (tenant, handler): unpause/unblock paging (renotify_page), listing, and
-- counts. `state` is in the key (the design note said (tenant, handler, id)):
-- renotify_page reads only the pending range instead of stepping over the
-- dead and done rows of a handler, and counts() becomes a covering scan of
-- this index. A listing of one handler across all states merges the three
-- state ranges, each read in id order.
CREATE INDEX events_by_handler ON events (tenant, handler, state, id);

-- One live (pending) event per idempotency key.
CREATE UNIQUE INDEX events_live_key ON events (tenant, handler, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state = 0;

-- The sweep's "not notified for a while": pending events by notified_at.
CREATE INDEX events_to_notify ON events (notified_at) WHERE state = 0;

-- The sweep's "lease expired, worker presumably dead".
CREATE INDEX events_by_lease ON events (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

-- Purge of dead and done events by age. finished_at is set exactly when the
-- state is not pending, so `finished_at IS NOT NULL` is the same set as
-- `state <> 0`; this form is implied by the purge query's
-- `finished_at < ?`, so the planner can use the index without a redundant
-- `state <> 0` term.
CREATE INDEX events_finished ON events (state, finished_at)
    WHERE finished_at IS NOT NULL;

-- The (tenant, handler) pairs whose events the sweep parked. Removing the
-- rule re-notifies them (renotify_page); if that never happens (a crash
-- between the two), the sweep finds the pair without a rule and unparks its
-- events, so that no event stays parked after its rule is gone.
CREATE TABLE parked (
    tenant  TEXT NOT NULL,
    handler TEXT NOT NULL,
    PRIMARY KEY (tenant, handler)
) STRICT, WITHOUT ROWID;

CREATE TABLE rules (
    tenant     TEXT    NOT NULL,
    handler    TEXT    NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('pause', 'block')),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, handler, kind)
) STRICT, WITHOUT ROWID;

-- Named leader leases (the reconciler's election).
CREATE TABLE leaders (
    role       TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
