-- herald's SQLite schema, version 3: schedules (docs/schedules.md). One row
-- per (tenant, name): the definition, where it came from (`source`:
-- 'config' for herald.toml's, replaced on reload, or 'api'), and the cursor
-- `next_at`, the next occurrence not yet emitted. The elected scheduler
-- moves the cursor by compare-and-set in the transaction that inserts the
-- occurrences' events, so each occurrence is emitted once.
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
