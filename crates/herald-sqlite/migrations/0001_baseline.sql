-- herald's SQLite schema as of herald 0.1.0. Applied by `SqliteStore::open`
-- inside one immediate transaction, which also sets `PRAGMA user_version`
-- to the migration's number. Later changes add migrations (README.md).
-- Times are INTEGER milliseconds since the Unix epoch; ids and lease tokens
-- are 16-byte UUID BLOBs.
--
-- Tables are STRICT where they can be (a wrongly typed value is an error,
-- not a silent conversion). The small tables are WITHOUT ROWID (clustered
-- by their key). `events` is an ordinary rowid table with a unique index on
-- its 16-byte UUIDv7 id: a lookup by id costs an index search plus a rowid
-- search, but payloads of a kilobyte or more stay on the row's own page
-- instead of spilling to overflow pages (a WITHOUT ROWID row keeps only
-- about a quarter of a page local).

-- Marks the file as herald's: a database with tables but without the
-- `format` row is someone else's, and herald refuses to touch it. The
-- `baseline` row names the release whose baseline made the file.
CREATE TABLE herald_meta (
    key   TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) STRICT, WITHOUT ROWID;

INSERT INTO herald_meta (key, value) VALUES ('format', 'herald event store'), ('baseline', '0.1.0');

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
    -- rule re-notifies it (renotify_page), or a full limit holds it, and the
    -- slot freed next wakes it (limit_waits); the sweep does not read it.
    notified_at      INTEGER NOT NULL,
    idempotency_key  TEXT,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    -- When it became dead or done; NULL while pending.
    finished_at      INTEGER,
    -- The error history: a JSON array of {attempt, at, error} appended by
    -- the statements that settle a failed attempt (release with an error,
    -- bury). A column rather than a table, so that deleting a done event
    -- stays one statement.
    errors           TEXT,
    -- The topic the event was emitted to; NULL for a direct emit. No index:
    -- no hot statement filters on it.
    topic            TEXT,
    -- The concurrency key it was emitted with (limits.rs); NULL for none.
    concurrency_key  TEXT,
    -- Its singleton key (emit.rs): at most one waiting event per
    -- (tenant, handler, singleton_key). NULL for none.
    singleton_key    TEXT,
    -- The turn a rate limit booked for it (limits.rs), when a claim found
    -- it over the rate and moved its run_at there.
    rate_turn        INTEGER
) STRICT;

-- Per (tenant, handler, state): unpause/unblock paging (renotify_page),
-- listing, and counts. With `state` in the key, renotify_page reads only
-- the pending range instead of stepping over the dead and done rows of a
-- handler, and counts() is a covering scan of this index. A listing of one
-- handler across all states merges the three state ranges, each read in
-- id order.
CREATE INDEX events_by_handler ON events (tenant, handler, state, id);

-- One live (pending) event per idempotency key.
CREATE UNIQUE INDEX events_live_key ON events (tenant, handler, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state = 0;

-- A singleton key's pending events, for the emit that keeps or replaces
-- the waiting one.
CREATE INDEX events_singleton ON events (tenant, handler, singleton_key, id)
    WHERE singleton_key IS NOT NULL AND state = 0;

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

-- Pauses and blocks.
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

-- Who is subscribed to what (docs/semantics.md, "Fan-out"). `tenant` ''
-- means every tenant: tenant names are never empty (they are checked at
-- emit), so '' cannot clash with one, and the primary key stays a plain
-- NOT NULL key (a NULL would be distinct from every other NULL and let
-- duplicates in). `source` is 'config' for `[[subscriptions]]` of
-- herald.toml (replaced as a whole on every load) or 'api' for the API,
-- the CLI and Client::subscribe (kept until removed).
CREATE TABLE subscriptions (
    topic      TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    handler    TEXT    NOT NULL,
    source     TEXT    NOT NULL CHECK (source IN ('config', 'api')),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (topic, tenant, handler)
) STRICT, WITHOUT ROWID;

-- Schedules (docs/schedules.md): one row per (tenant, name), the
-- definition, where it came from (`source`: 'config' for herald.toml's,
-- replaced on reload, or 'api'), and the cursor `next_at`, the next
-- occurrence not yet emitted. The elected scheduler moves the cursor by
-- compare-and-set in the transaction that inserts the occurrences' events,
-- so each occurrence is emitted once.
CREATE TABLE schedules (
    tenant          TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    handler         TEXT    NOT NULL,
    cron            TEXT,
    every_ms        INTEGER,
    timezone        TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    max_attempts    INTEGER NOT NULL,
    missed          TEXT    NOT NULL,
    missed_cap      INTEGER,
    paused          INTEGER NOT NULL DEFAULT 0,
    source          TEXT    NOT NULL,
    next_at         INTEGER NOT NULL,
    last_occurrence INTEGER,
    last_event_id   BLOB,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (tenant, name),
    CHECK ((cron IS NULL) <> (every_ms IS NULL))
) WITHOUT ROWID;

-- The scheduler's one query per tick: unpaused schedules by cursor.
CREATE INDEX schedules_due ON schedules (next_at) WHERE paused = 0;

-- Idempotency keys that outlive their events (ADR 0013). An emit with a
-- key writes a row naming the event it created; a later emit with the
-- same (tenant, handler, key) returns that event, whether it is still
-- stored or has finished, until the row is purged. The elected
-- reconciler's upkeep looks at rows older than the window (24 h by
-- default), oldest first by `stored_at`: a row whose event is still live
-- gets `stored_at` reset; one whose event is no longer live is marked
-- `gone` with `stored_at` reset the first time, and deleted the next, so a
-- key outlives its event's end by at least the window.
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

-- Limits (ADR 0017, src/limits.rs) of `handler`'s events, counted by
-- `kind`: 0 all of them, 1 each tenant's, 2 each concurrency key's: at
-- most `running` runs at once, and at most `starts` starts per
-- `period_ms` with a `burst`. `tenant` (kinds 1 and 2) and `key` (kind 2)
-- name the one tenant or key the row is for, '' the default of every one
-- without a row of its own. `source`: 'config' rows are replaced whenever
-- herald.toml is loaded, 'api' rows kept until removed.
CREATE TABLE limits (
    handler    TEXT    NOT NULL,
    kind       INTEGER NOT NULL CHECK (kind IN (0, 1, 2)),
    tenant     TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    running    INTEGER CHECK (running > 0),
    starts     INTEGER CHECK (starts > 0),
    period_ms  INTEGER CHECK (period_ms > 0),
    burst      INTEGER CHECK (burst > 0),
    source     TEXT    NOT NULL CHECK (source IN ('config', 'api')),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (handler, kind, tenant, key),
    CHECK (running IS NOT NULL OR starts IS NOT NULL)
) STRICT, WITHOUT ROWID;

-- Each rate-limited scope's GCRA state: its theoretical arrival time in
-- microseconds of the store's clock (limits.rs).
CREATE TABLE rate_state (
    handler TEXT    NOT NULL,
    kind    INTEGER NOT NULL,
    tenant  TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    tat     INTEGER NOT NULL,
    PRIMARY KEY (handler, kind, tenant, key)
) STRICT, WITHOUT ROWID;

-- The slots that runs of limited events hold: one row per run (its lease
-- token) and limit that counts it, naming the scope it counts in. It
-- expires with the run's lease (the claim and the renewal write both);
-- the settle deletes its runs' slots, the reconciler lapsed ones.
CREATE TABLE limit_slots (
    token      BLOB    NOT NULL,
    kind       INTEGER NOT NULL,
    handler    TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    event_id   BLOB    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (token, kind)
) STRICT;
CREATE INDEX limit_slots_by_scope ON limit_slots (handler, kind, tenant, key, expires_at);
CREATE INDEX limit_slots_by_expiry ON limit_slots (expires_at);

-- The events a full limit holds, parked, in the order they arrived at the
-- full scope: the settle that frees a slot of the scope wakes its oldest.
CREATE TABLE limit_waits (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    handler  TEXT    NOT NULL,
    kind     INTEGER NOT NULL,
    tenant   TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    event_id BLOB    NOT NULL
) STRICT;
CREATE INDEX limit_waits_by_scope ON limit_waits (handler, kind, tenant, key, seq);
CREATE INDEX limit_waits_by_event ON limit_waits (event_id);
