-- herald's SQLite schema as a new file holds it: sqlite_schema, checked
-- by tests/schema.rs. Regenerate it with
-- UPDATE_SCHEMA=1 cargo test -p herald-sqlite --test schema

CREATE TABLE events (
    id               BLOB    NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    tenant           TEXT    NOT NULL,
    handler          TEXT    NOT NULL,
    payload          TEXT    NOT NULL,
    state            INTEGER NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),
    run_at           INTEGER NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 0),
    lease_token      BLOB,
    lease_expires_at INTEGER,
    notified_at      INTEGER NOT NULL,
    idempotency_key  TEXT,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    errors           TEXT,
    topic            TEXT,
    concurrency_key  TEXT,
    singleton_key    TEXT,
    rate_turn        INTEGER
) STRICT;

CREATE INDEX events_by_handler ON events (tenant, handler, state, id);

CREATE INDEX events_by_lease ON events (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

CREATE INDEX events_finished ON events (state, finished_at)
    WHERE finished_at IS NOT NULL;

CREATE UNIQUE INDEX events_live_key ON events (tenant, handler, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state = 0;

CREATE INDEX events_singleton ON events (tenant, handler, singleton_key, id)
    WHERE singleton_key IS NOT NULL AND state = 0;

CREATE INDEX events_to_notify ON events (notified_at) WHERE state = 0;
-- index sqlite_autoindex_events_1 on events (automatic)

CREATE TABLE herald_meta (
    key   TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) STRICT, WITHOUT ROWID;

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

CREATE TABLE leaders (
    role       TEXT    NOT NULL PRIMARY KEY,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

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

CREATE INDEX limit_slots_by_expiry ON limit_slots (expires_at);

CREATE INDEX limit_slots_by_scope ON limit_slots (handler, kind, tenant, key, expires_at);
-- index sqlite_autoindex_limit_slots_1 on limit_slots (automatic)

CREATE TABLE limit_waits (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    handler  TEXT    NOT NULL,
    kind     INTEGER NOT NULL,
    tenant   TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    event_id BLOB    NOT NULL
) STRICT;

CREATE INDEX limit_waits_by_event ON limit_waits (event_id);

CREATE INDEX limit_waits_by_scope ON limit_waits (handler, kind, tenant, key, seq);

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

CREATE TABLE parked (
    tenant  TEXT NOT NULL,
    handler TEXT NOT NULL,
    PRIMARY KEY (tenant, handler)
) STRICT, WITHOUT ROWID;

CREATE TABLE rate_state (
    handler TEXT    NOT NULL,
    kind    INTEGER NOT NULL,
    tenant  TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    tat     INTEGER NOT NULL,
    PRIMARY KEY (handler, kind, tenant, key)
) STRICT, WITHOUT ROWID;

CREATE TABLE rules (
    tenant     TEXT    NOT NULL,
    handler    TEXT    NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('pause', 'block')),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, handler, kind)
) STRICT, WITHOUT ROWID;

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

CREATE INDEX schedules_due ON schedules (next_at) WHERE paused = 0;

CREATE TABLE sqlite_sequence(name,seq);

CREATE TABLE subscriptions (
    topic      TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    handler    TEXT    NOT NULL,
    source     TEXT    NOT NULL CHECK (source IN ('config', 'api')),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (topic, tenant, handler)
) STRICT, WITHOUT ROWID;

PRAGMA user_version = 1;
INSERT INTO herald_meta VALUES ('baseline', '0.1.0');
INSERT INTO herald_meta VALUES ('format', 'herald event store');
