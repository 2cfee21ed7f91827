-- herald's PostgreSQL schema, version 2: the error history of each event, a
-- JSON array of {attempt, at, error} appended by the statements that settle
-- a failed attempt (release with an error, bury). A column rather than a
-- table, so that deleting a done event stays one statement; it is written
-- only on failures, never by claims, so claims stay HOT.
ALTER TABLE events ADD COLUMN errors jsonb;
