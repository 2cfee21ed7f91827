-- herald's PostgreSQL schema: its tables, indexes and their storage
-- settings. The functions that read and write them are in ../sql/, one file
-- per concern, applied after the migrations on every migrate (README.md).
--
-- Applied by `PgStore::migrate` (the `herald migrate` command) in one
-- transaction, with `search_path` set to herald's schema (`herald` by
-- default), so every name below lives in that schema. The runner records
-- the version in `meta` in the same transaction.
--
-- Times are bigint milliseconds since the Unix epoch, judged by the
-- database's clock (`now()`); ids and lease tokens are uuid.
-- docs/postgres.md explains the index set, the fillfactor and the ring.

-- Marks the schema as herald's; holds the schema version and the release
-- whose baseline the migrations start from.
CREATE TABLE meta (
    key   text NOT NULL PRIMARY KEY,
    value text NOT NULL
);

INSERT INTO meta (key, value) VALUES ('format', 'herald event store'), ('baseline', '0.1.0');

-- Events, partitioned by `leaf` into a ring of three leaves (events_1 to
-- events_3) and events_cold (leaf 0). New events due within the ring's
-- turn go into the filling leaf; a leaf that has drained is emptied by
-- TRUNCATE, which frees its dead rows whatever snapshot an open
-- transaction holds (ADR 0009, ring.sql). events_cold holds the events
-- that outlive their leaf, and is vacuumed.
--
-- Fixed-width columns come first, so that the row has no alignment
-- padding. Do not index attempt, lease_token, lease_expires_at or
-- updated_at (not even in a partial index's WHERE): a claim changes only
-- those, so it is a HOT update that writes no index entry.
CREATE TABLE events (
    id               uuid     NOT NULL,
    run_at           bigint   NOT NULL,
    -- When a notification was last sent (or is due to be delivered) for it.
    -- 9223372036854775807 means "parked": a rule holds it, and removing the
    -- rule re-notifies it (renotify), or a full limit holds it, and the
    -- slot freed next wakes it (limit_waits); the sweep does not read it.
    notified_at      bigint   NOT NULL,
    -- The lease, live or expired; both NULL when there is none.
    lease_expires_at bigint,
    created_at       bigint   NOT NULL,
    updated_at       bigint   NOT NULL,
    -- When it became dead or done; NULL while pending.
    finished_at      bigint,
    -- Claims so far; snoozes and shutdown give one back.
    attempt          integer  NOT NULL DEFAULT 0,
    max_attempts     integer  NOT NULL,
    -- 0 pending (waiting, or running under a lease), 1 dead, 2 done.
    state            smallint NOT NULL DEFAULT 0,
    -- Which leaf holds the row: 0 events_cold, 1-3 the ring's.
    leaf             smallint NOT NULL DEFAULT 0,
    lease_token      uuid,
    tenant           text     NOT NULL,
    handler          text     NOT NULL,
    idempotency_key  text,
    last_error       text,
    -- The JSON exactly as emitted (validated by the client; `jsonb` would
    -- reorder keys and drop duplicates).
    payload          text     NOT NULL,
    -- The error history: a JSON array of {attempt, at, error}, appended by
    -- the settles of a failed attempt, never by a claim (claims stay HOT).
    errors           jsonb,
    -- A stored copy of `id` for the indexes that page in id order: only
    -- events_pkey holds `id` itself, so that no other index can look like
    -- a cheap way to find a batch's ids under wrong statistics (ADR 0007).
    id_key           uuid     GENERATED ALWAYS AS (id) STORED,
    -- The topic the event was emitted to; NULL for a direct emit.
    topic            text,
    -- The concurrency key it was emitted with (limits.sql): NULL for none.
    concurrency_key  text,
    -- Its singleton key (emit.rs): at most one waiting event per
    -- (tenant, handler, singleton_key). NULL for none.
    singleton_key    text,
    -- The turn a rate limit booked for it (ms, the database's clock), when
    -- a claim found it over the rate and moved its run_at there; the claim
    -- at that turn starts it without charging the rate again.
    rate_turn        bigint,
    CONSTRAINT events_attempt_check1 CHECK (attempt >= 0),
    CONSTRAINT events_max_attempts_check1 CHECK (max_attempts >= 0),
    CONSTRAINT events_state_check1 CHECK (state IN (0, 1, 2)),
    CONSTRAINT events_check1 CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) PARTITION BY LIST (leaf);

-- fillfactor 45: inserts leave 55% of each heap page free, so that the
-- claim of every row on the page can put the row's new version on the same
-- page, as a HOT update, and the old version is pruned without vacuum. The
-- claimed version is 24 bytes wider than the emitted one (the lease's
-- token and expiry were NULL), so room for one claim per row needs
-- fillfactor <= 1 / (2 + 24 / row bytes): 45 for rows of 110 bytes and up.
--
-- Autovacuum by row counts, not fractions of the table, and unthrottled:
-- every finished event leaves a dead row, and the server's defaults (20%
-- of the table, throttled) let them pile up for minutes. With these, each
-- visit cleans what the last naptime left. A ring leaf is usually
-- TRUNCATEd first; vacuum is what bounds a leaf the ring cannot turn
-- (a backlog, a transaction that holds it) and events_cold.
CREATE TABLE events_cold PARTITION OF events FOR VALUES IN (0) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
CREATE TABLE events_1 PARTITION OF events FOR VALUES IN (1) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
CREATE TABLE events_2 PARTITION OF events FOR VALUES IN (2) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);
CREATE TABLE events_3 PARTITION OF events FOR VALUES IN (3) WITH (
    fillfactor = 45,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 50000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_cost_limit = 10000
);

-- The primary key and the live-key index hold `leaf` because a partitioned
-- table's unique indexes must; emit stores an id, and a live key, once
-- across the leaves (emit.sql).
ALTER TABLE events ADD PRIMARY KEY (id, leaf);

-- Per (tenant, handler, state): unpause/unblock paging (renotify),
-- listing and counts.
CREATE INDEX events_by_handler ON events (tenant, handler, state, id_key);

-- One live (pending) event per idempotency key.
CREATE UNIQUE INDEX events_live_key ON events (tenant, handler, idempotency_key, leaf)
    WHERE idempotency_key IS NOT NULL AND state = 0;

-- A singleton key's pending events, for the emit that keeps or replaces
-- the waiting one (running ones are told apart by their lease, which no
-- index may hold).
CREATE INDEX events_singleton ON events (tenant, handler, singleton_key, id_key)
    WHERE singleton_key IS NOT NULL AND state = 0;

-- The sweep: pending events by notified_at, with id_key as the keyset
-- tie-breaker. Parked events are left out, so a million paused events cost
-- the sweep nothing. Both of the sweep's sources walk it (the dead-worker
-- source only its last `quiet` window).
CREATE INDEX events_to_notify ON events (notified_at, id_key)
    WHERE state = 0 AND notified_at < 9223372036854775807;

-- Parked events by handler, in id order, for un-parking a handler whose
-- rule is gone. Holds only parked rows.
CREATE INDEX events_parked ON events (tenant, handler, id_key)
    WHERE state = 0 AND notified_at = 9223372036854775807;

-- Purge of dead and done events by age. finished_at is set exactly when the
-- state is not pending; `finished_at < $x` implies the predicate.
CREATE INDEX events_finished ON events (state, finished_at)
    WHERE finished_at IS NOT NULL;

-- Limits (ADR 0017, ../sql/limits.sql) of `handler`'s events, counted by
-- `kind`: 0 all of them, 1 each tenant's, 2 each concurrency key's:
-- at most `running` runs at once, and at most `starts` starts per
-- `period_ms` with a `burst`. `tenant` (kinds 1 and 2) and `key` (kind 2)
-- name the one tenant or key the row is for, '' the default of every one
-- without a row of its own (names and keys are never empty). `source` as
-- for subscriptions: 'config' rows are replaced whenever herald.toml is
-- loaded, 'api' rows kept until removed.
CREATE TABLE limits (
    handler    text     NOT NULL,
    kind       smallint NOT NULL CHECK (kind IN (0, 1, 2)),
    tenant     text     NOT NULL,
    key        text     NOT NULL,
    running    integer  CHECK (running > 0),
    starts     integer  CHECK (starts > 0),
    period_ms  bigint   CHECK (period_ms > 0),
    burst      integer  CHECK (burst > 0),
    source     text     NOT NULL CHECK (source IN ('config', 'api')),
    created_at bigint   NOT NULL,
    PRIMARY KEY (handler, kind, tenant, key),
    CHECK (kind > 0 OR tenant = ''),
    CHECK (kind = 2 OR key = ''),
    CHECK ((tenant = '') = (key = '') OR kind < 2),
    CHECK (running IS NOT NULL OR starts IS NOT NULL),
    CHECK ((starts IS NULL) = (period_ms IS NULL) AND (starts IS NULL) = (burst IS NULL))
);

-- Each rate-limited scope's GCRA state: its theoretical arrival time, in
-- microseconds of the database's clock. A start conforms when `tat` is at
-- most now plus the burst's tolerance, and moves `tat` one interval
-- (period / starts) past the later of itself and now. Written by the
-- claim under the scope's lock.
CREATE TABLE rate_state (
    handler text     NOT NULL,
    kind    smallint NOT NULL,
    tenant  text     NOT NULL,
    key     text     NOT NULL,
    tat     bigint   NOT NULL,
    PRIMARY KEY (handler, kind, tenant, key)
);

-- The slots that runs of limited events hold: one row per run (its lease
-- token) and limit that counts it, naming the scope it counts in (the
-- event's own tenant and key, '' where the kind does not count them).
-- `expires_at` is the run's lease expiry, written by the claim and the
-- renewal with the lease: a slot whose run's worker died lapses with its
-- lease. The settle deletes its runs' slots; the reconciler deletes lapsed
-- ones. A scope's live slots are its rows with `expires_at` in the future.
CREATE TABLE limit_slots (
    token      uuid     NOT NULL,
    kind       smallint NOT NULL,
    handler    text     NOT NULL,
    tenant     text     NOT NULL,
    key        text     NOT NULL,
    event_id   uuid     NOT NULL,
    expires_at bigint   NOT NULL,
    PRIMARY KEY (token, kind)
);
CREATE INDEX limit_slots_by_scope ON limit_slots (handler, kind, tenant, key, expires_at);
CREATE INDEX limit_slots_by_expiry ON limit_slots (expires_at);

-- Each concurrency scope's slots held: its rows in limit_slots, counted
-- by whoever adds or deletes them, under the scope's lock (the claim adds,
-- the settle's free_slots and the reconciler's lapse_slots delete), so
-- that a claim reads one row rather than counting the scope's slots. A
-- lapsed slot counts until the reconciler deletes it.
CREATE TABLE limit_counts (
    handler text     NOT NULL,
    kind    smallint NOT NULL,
    tenant  text     NOT NULL,
    key     text     NOT NULL,
    held    integer  NOT NULL CHECK (held >= 0),
    PRIMARY KEY (handler, kind, tenant, key)
);

-- The events a full limit holds, parked (notified_at = the parked value),
-- in the order they arrived at the full scope: the settle that frees a
-- scope's slot wakes its oldest.
CREATE TABLE limit_waits (
    handler  text     NOT NULL,
    kind     smallint NOT NULL,
    tenant   text     NOT NULL,
    key      text     NOT NULL,
    seq      bigint   GENERATED ALWAYS AS IDENTITY,
    event_id uuid     NOT NULL,
    PRIMARY KEY (handler, kind, tenant, key, seq)
);
CREATE INDEX limit_waits_by_event ON limit_waits (event_id);

-- The (tenant, handler) pairs whose events the sweep parked. If removing the
-- rule is not followed by its re-notification (a crash in between), the
-- sweep finds the pair without a rule and un-parks its events.
CREATE TABLE parked (
    tenant  text NOT NULL,
    handler text NOT NULL,
    PRIMARY KEY (tenant, handler)
);

-- Pauses and blocks.
CREATE TABLE rules (
    tenant     text   NOT NULL,
    handler    text   NOT NULL,
    kind       text   NOT NULL CHECK (kind IN ('pause', 'block')),
    created_at bigint NOT NULL,
    PRIMARY KEY (tenant, handler, kind)
);

-- The claim's once-per-claim question whether any rule names one of its
-- handlers (claim.sql).
CREATE INDEX rules_by_handler ON rules (handler);

-- Named leader leases (the reconciler's election): a row, not an advisory
-- lock, so that no session holds anything while it leads.
CREATE TABLE leaders (
    role       text   NOT NULL PRIMARY KEY,
    holder     text   NOT NULL,
    expires_at bigint NOT NULL
);

-- Each ring leaf's phase, and since when (ms, the database's clock):
-- exactly one is 'filling'; 'draining' ones are retired once they have
-- drained for the store's drain time; 'empty' ones have been TRUNCATEd.
CREATE TABLE ring (
    leaf  smallint NOT NULL PRIMARY KEY CHECK (leaf BETWEEN 1 AND 3),
    phase text     NOT NULL CHECK (phase IN ('filling', 'draining', 'empty')),
    since bigint   NOT NULL
);
INSERT INTO ring (leaf, phase, since)
SELECT l, CASE l WHEN 1 THEN 'filling' ELSE 'empty' END,
       floor(date_part('epoch', now()) * 1000)::bigint
FROM generate_series(1, 3) AS l;

-- Whether each ring leaf is empty: `ring`'s phase, copied by a trigger
-- (ring.sql), so that the hot statements can skip the empty leaves without
-- reading `ring`, which a flip locks.
CREATE TABLE ring_empty (
    leaf  smallint NOT NULL PRIMARY KEY CHECK (leaf BETWEEN 1 AND 3),
    empty boolean  NOT NULL
);
INSERT INTO ring_empty (leaf, empty) SELECT leaf, phase = 'empty' FROM ring;

-- Who is subscribed to what (docs/semantics.md, "Fan-out"). `tenant` ''
-- means every tenant: tenant names are never empty (they are checked at
-- emit), so '' cannot clash with one, and the primary key stays a plain
-- NOT NULL key. `source` is 'config' for `[[subscriptions]]` of
-- herald.toml (replaced as a whole on every load) or 'api' for the API,
-- the CLI and Client::subscribe (kept until removed).
CREATE TABLE subscriptions (
    topic      text   NOT NULL,
    tenant     text   NOT NULL,
    handler    text   NOT NULL,
    source     text   NOT NULL CHECK (source IN ('config', 'api')),
    created_at bigint NOT NULL,
    PRIMARY KEY (topic, tenant, handler)
);

-- Schedules (docs/schedules.md): one row per (tenant, name), the
-- definition, where it came from (`source`: 'config' for herald.toml's,
-- replaced on reload, or 'api'), and the cursor `next_at`, the next
-- occurrence not yet emitted. The elected scheduler moves the cursor by
-- compare-and-set in the transaction that inserts the occurrences' events,
-- so each occurrence is emitted once.
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

-- Idempotency keys that outlive their events (ADR 0013). An emit with a
-- key writes a row here, in the statement that inserts the event, naming
-- the event it created; a later emit with the same (tenant, handler, key)
-- finds the row and returns that event, whether it is still stored or has
-- finished. The elected reconciler's upkeep pages through rows older than
-- the window, oldest first: a row whose event is still live gets
-- `stored_at` reset; one whose event is no longer live is marked `gone`
-- with `stored_at` reset the first time, and deleted the next. So a key
-- names its event for at least the window after the emit and at least the
-- window after the event finished. events_live_key still holds the key of
-- a live event without a row (a revived one).
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
