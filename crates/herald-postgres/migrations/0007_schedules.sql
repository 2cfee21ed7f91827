-- herald's PostgreSQL schema, version 7: schedules (docs/schedules.md). One
-- row per (tenant, name): the definition, where it came from (`source`:
-- 'config' for herald.toml's, replaced on reload, or 'api'), and the cursor
-- `next_at`, the next occurrence not yet emitted. The elected scheduler
-- moves the cursor by compare-and-set in the transaction that inserts the
-- occurrences' events, so each occurrence is emitted once.
CREATE TABLE schedules (
    tenant          text    NOT NULL,
    name            text    NOT NULL,
    handler         text    NOT NULL,
    cron            text,
    every_ms        bigint,
    timezone        text    NOT NULL,
    payload         text    NOT NULL,
    max_attempts    integer NOT NULL,
    missed          text    NOT NULL,
    missed_cap      bigint,
    paused          boolean NOT NULL DEFAULT false,
    source          text    NOT NULL,
    next_at         bigint  NOT NULL,
    last_occurrence bigint,
    last_event_id   uuid,
    created_at      bigint  NOT NULL,
    updated_at      bigint  NOT NULL,
    PRIMARY KEY (tenant, name),
    CHECK ((cron IS NULL) <> (every_ms IS NULL))
);

-- The scheduler's one query per tick: unpaused schedules by cursor.
CREATE INDEX schedules_due ON schedules (next_at) WHERE NOT paused;
