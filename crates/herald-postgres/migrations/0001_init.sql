-- herald's PostgreSQL schema, version 1.
--
-- Applied by `PgStore::migrate` (the `herald migrate` command) inside one
-- transaction, with `search_path` set to herald's own schema (`herald` by
-- default), so every name below lives in that schema. The runner records the
-- version in `meta` in the same transaction.
--
-- Times are bigint milliseconds since the Unix epoch, judged by the
-- database's clock (`now()`); ids and lease tokens are uuid.
-- docs/postgres.md explains the index set and the fillfactor.

-- Marks the schema as herald's; holds the schema version.
CREATE TABLE meta (
    key   text NOT NULL PRIMARY KEY,
    value text NOT NULL
);

INSERT INTO meta (key, value) VALUES ('format', 'herald event store');

-- Fixed-width columns first, so that the row has no alignment padding.
--
-- fillfactor 45: inserts leave 55% of each heap page free, so that the
-- claim of every row on the page can put the row's new version on the same
-- page, as a HOT update: a claim changes only columns that no index covers
-- (attempt, lease_token, lease_expires_at, updated_at), so it writes no
-- index entry, and the old version is pruned without vacuum. The claimed
-- version is 24 bytes wider than the emitted one (the lease's token and
-- expiry were NULL), so room for one claim per row needs
-- fillfactor <= 1 / (2 + 24 / row bytes): 45 for rows of 110 bytes and up.
-- Measured with bench/drain (docs/postgres.md): 100% HOT claims and about
-- half the PostgreSQL CPU per event of fillfactor 100.
--
-- Do not index those four columns (not even in a partial index's WHERE):
-- every claim and renewal would then write a new entry into every index.
CREATE TABLE events (
    id               uuid     NOT NULL PRIMARY KEY,
    run_at           bigint   NOT NULL,
    -- When a notification was last sent (or is due to be delivered) for it.
    -- 9223372036854775807 means "parked": a rule holds it, and removing the
    -- rule re-notifies it (renotify_page), so the sweep does not read it.
    notified_at      bigint   NOT NULL,
    -- The lease, live or expired; both NULL when there is none.
    lease_expires_at bigint,
    created_at       bigint   NOT NULL,
    updated_at       bigint   NOT NULL,
    -- When it became dead or done; NULL while pending.
    finished_at      bigint,
    -- Claims so far; snoozes and shutdown give one back.
    attempt          integer  NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts     integer  NOT NULL CHECK (max_attempts >= 0),
    -- 0 pending (waiting, or running under a lease), 1 dead, 2 done.
    state            smallint NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),
    lease_token      uuid,
    tenant           text     NOT NULL,
    handler          text     NOT NULL,
    idempotency_key  text,
    last_error       text,
    -- The JSON exactly as emitted (validated by the client; `jsonb` would
    -- reorder keys and drop duplicates).
    payload          text     NOT NULL,
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 45);

-- Per (tenant, handler, state): unpause/unblock paging (renotify_page),
-- listing and counts, as in the SQLite store.
CREATE INDEX events_by_handler ON events (tenant, handler, state, id);

-- One live (pending) event per idempotency key.
CREATE UNIQUE INDEX events_live_key ON events (tenant, handler, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state = 0;

-- The sweep: pending events by notified_at, with id as the keyset
-- tie-breaker. Parked events are left out, so a million paused events cost
-- the sweep nothing. Both of the sweep's sources walk it (the dead-worker
-- source only its last `quiet` window; see docs/postgres.md).
CREATE INDEX events_to_notify ON events (notified_at, id)
    WHERE state = 0 AND notified_at < 9223372036854775807;

-- Parked events by handler, in id order, for un-parking a handler whose
-- rule is gone. Holds only parked rows.
CREATE INDEX events_parked ON events (tenant, handler, id)
    WHERE state = 0 AND notified_at = 9223372036854775807;

-- Purge of dead and done events by age. finished_at is set exactly when the
-- state is not pending; `finished_at < $x` implies the predicate.
CREATE INDEX events_finished ON events (state, finished_at)
    WHERE finished_at IS NOT NULL;

-- The (tenant, handler) pairs whose events the sweep parked. If removing the
-- rule is not followed by its re-notification (a crash in between), the
-- sweep finds the pair without a rule and un-parks its events.
CREATE TABLE parked (
    tenant  text NOT NULL,
    handler text NOT NULL,
    PRIMARY KEY (tenant, handler)
);

CREATE TABLE rules (
    tenant     text   NOT NULL,
    handler    text   NOT NULL,
    kind       text   NOT NULL CHECK (kind IN ('pause', 'block')),
    created_at bigint NOT NULL,
    PRIMARY KEY (tenant, handler, kind)
);

-- Named leader leases (the reconciler's election): a row, not an advisory
-- lock, so that no session holds anything while it leads.
CREATE TABLE leaders (
    role       text   NOT NULL PRIMARY KEY,
    holder     text   NOT NULL,
    expires_at bigint NOT NULL
);
