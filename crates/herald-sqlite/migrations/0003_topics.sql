-- herald's SQLite schema, version 3: topics (fan-out, docs/semantics.md
-- "Fan-out"). A topic emit stores one event per subscribed handler; each
-- copy records the topic it came from.

-- Who is subscribed to what. `tenant` '' means every tenant: tenant names
-- are never empty (they are checked at emit), so '' cannot clash with one,
-- and the primary key stays a plain NOT NULL key (a NULL would be distinct
-- from every other NULL and let duplicates in). `source` is 'config' for
-- `[[subscriptions]]` of herald.toml (replaced as a whole on every load) or
-- 'api' for the API, the CLI and Client::subscribe (kept until removed).
CREATE TABLE subscriptions (
    topic      TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    handler    TEXT    NOT NULL,
    source     TEXT    NOT NULL CHECK (source IN ('config', 'api')),
    created_at INTEGER NOT NULL,
    PRIMARY KEY (topic, tenant, handler)
) STRICT, WITHOUT ROWID;

-- The topic an event was emitted to; NULL for a direct emit. No index: no
-- hot statement filters on it.
ALTER TABLE events ADD COLUMN topic TEXT;
