-- herald's PostgreSQL schema as `herald migrate` leaves it: a catalog
-- dump, checked by tests/schema.rs. Regenerate it with
-- UPDATE_SCHEMA=1 cargo test -p herald-postgres --test schema

-- tables
CREATE TABLE events (
    id uuid NOT NULL,
    run_at bigint NOT NULL,
    notified_at bigint NOT NULL,
    lease_expires_at bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    finished_at bigint,
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    leaf smallint NOT NULL DEFAULT 0,
    lease_token uuid,
    tenant text NOT NULL,
    handler text NOT NULL,
    idempotency_key text,
    last_error text,
    payload text NOT NULL,
    errors jsonb,
    id_key uuid GENERATED ALWAYS AS (id) STORED,
    topic text
) PARTITION BY LIST (leaf);
CREATE TABLE events_1 (
    id uuid NOT NULL,
    run_at bigint NOT NULL,
    notified_at bigint NOT NULL,
    lease_expires_at bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    finished_at bigint,
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    leaf smallint NOT NULL DEFAULT 0,
    lease_token uuid,
    tenant text NOT NULL,
    handler text NOT NULL,
    idempotency_key text,
    last_error text,
    payload text NOT NULL,
    errors jsonb,
    id_key uuid GENERATED ALWAYS AS (id) STORED,
    topic text
) PARTITION OF events FOR VALUES IN ('1') WITH (fillfactor=45, autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=10000, autovacuum_vacuum_insert_scale_factor=0, autovacuum_vacuum_insert_threshold=10000, autovacuum_analyze_scale_factor=0, autovacuum_analyze_threshold=50000, autovacuum_vacuum_cost_delay=0, autovacuum_vacuum_cost_limit=10000);
CREATE TABLE events_2 (
    id uuid NOT NULL,
    run_at bigint NOT NULL,
    notified_at bigint NOT NULL,
    lease_expires_at bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    finished_at bigint,
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    leaf smallint NOT NULL DEFAULT 0,
    lease_token uuid,
    tenant text NOT NULL,
    handler text NOT NULL,
    idempotency_key text,
    last_error text,
    payload text NOT NULL,
    errors jsonb,
    id_key uuid GENERATED ALWAYS AS (id) STORED,
    topic text
) PARTITION OF events FOR VALUES IN ('2') WITH (fillfactor=45, autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=10000, autovacuum_vacuum_insert_scale_factor=0, autovacuum_vacuum_insert_threshold=10000, autovacuum_analyze_scale_factor=0, autovacuum_analyze_threshold=50000, autovacuum_vacuum_cost_delay=0, autovacuum_vacuum_cost_limit=10000);
CREATE TABLE events_3 (
    id uuid NOT NULL,
    run_at bigint NOT NULL,
    notified_at bigint NOT NULL,
    lease_expires_at bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    finished_at bigint,
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    leaf smallint NOT NULL DEFAULT 0,
    lease_token uuid,
    tenant text NOT NULL,
    handler text NOT NULL,
    idempotency_key text,
    last_error text,
    payload text NOT NULL,
    errors jsonb,
    id_key uuid GENERATED ALWAYS AS (id) STORED,
    topic text
) PARTITION OF events FOR VALUES IN ('3') WITH (fillfactor=45, autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=10000, autovacuum_vacuum_insert_scale_factor=0, autovacuum_vacuum_insert_threshold=10000, autovacuum_analyze_scale_factor=0, autovacuum_analyze_threshold=50000, autovacuum_vacuum_cost_delay=0, autovacuum_vacuum_cost_limit=10000);
CREATE TABLE events_cold (
    id uuid NOT NULL,
    run_at bigint NOT NULL,
    notified_at bigint NOT NULL,
    lease_expires_at bigint,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    finished_at bigint,
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    leaf smallint NOT NULL DEFAULT 0,
    lease_token uuid,
    tenant text NOT NULL,
    handler text NOT NULL,
    idempotency_key text,
    last_error text,
    payload text NOT NULL,
    errors jsonb,
    id_key uuid GENERATED ALWAYS AS (id) STORED,
    topic text
) PARTITION OF events FOR VALUES IN ('0') WITH (fillfactor=45, autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=10000, autovacuum_vacuum_insert_scale_factor=0, autovacuum_vacuum_insert_threshold=10000, autovacuum_analyze_scale_factor=0, autovacuum_analyze_threshold=50000, autovacuum_vacuum_cost_delay=0, autovacuum_vacuum_cost_limit=10000);
CREATE TABLE idempotency_keys (
    tenant text NOT NULL,
    handler text NOT NULL,
    key text NOT NULL,
    event_id uuid NOT NULL,
    stored_at bigint NOT NULL,
    gone boolean NOT NULL DEFAULT false
);
CREATE TABLE leaders (
    role text NOT NULL,
    holder text NOT NULL,
    expires_at bigint NOT NULL
);
CREATE TABLE meta (
    key text NOT NULL,
    value text NOT NULL
);
CREATE TABLE parked (
    tenant text NOT NULL,
    handler text NOT NULL
);
CREATE TABLE ring (
    leaf smallint NOT NULL,
    phase text NOT NULL,
    since bigint NOT NULL
);
CREATE TABLE ring_empty (
    leaf smallint NOT NULL,
    empty boolean NOT NULL
);
CREATE TABLE rules (
    tenant text NOT NULL,
    handler text NOT NULL,
    kind text NOT NULL,
    created_at bigint NOT NULL
);
CREATE TABLE schedules (
    tenant text NOT NULL,
    name text NOT NULL,
    handler text NOT NULL,
    cron text,
    every_ms bigint,
    timezone text NOT NULL,
    payload text NOT NULL,
    max_attempts integer NOT NULL,
    missed text NOT NULL,
    missed_cap bigint,
    paused boolean NOT NULL DEFAULT false,
    source text NOT NULL,
    next_at bigint NOT NULL,
    last_occurrence bigint,
    last_event_id uuid,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);
CREATE TABLE subscriptions (
    topic text NOT NULL,
    tenant text NOT NULL,
    handler text NOT NULL,
    source text NOT NULL,
    created_at bigint NOT NULL
);

-- views, sequences and types

-- constraints
ALTER TABLE events ADD CONSTRAINT events_attempt_check1 CHECK ((attempt >= 0));
ALTER TABLE events ADD CONSTRAINT events_check1 CHECK (((lease_token IS NULL) = (lease_expires_at IS NULL)));
ALTER TABLE events ADD CONSTRAINT events_max_attempts_check1 CHECK ((max_attempts >= 0));
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (id, leaf);
ALTER TABLE events ADD CONSTRAINT events_state_check1 CHECK ((state = ANY (ARRAY[0, 1, 2])));
ALTER TABLE events_1 ADD CONSTRAINT events_1_pkey PRIMARY KEY (id, leaf);
ALTER TABLE events_1 ADD CONSTRAINT events_attempt_check1 CHECK ((attempt >= 0));
ALTER TABLE events_1 ADD CONSTRAINT events_check1 CHECK (((lease_token IS NULL) = (lease_expires_at IS NULL)));
ALTER TABLE events_1 ADD CONSTRAINT events_max_attempts_check1 CHECK ((max_attempts >= 0));
ALTER TABLE events_1 ADD CONSTRAINT events_state_check1 CHECK ((state = ANY (ARRAY[0, 1, 2])));
ALTER TABLE events_2 ADD CONSTRAINT events_2_pkey PRIMARY KEY (id, leaf);
ALTER TABLE events_2 ADD CONSTRAINT events_attempt_check1 CHECK ((attempt >= 0));
ALTER TABLE events_2 ADD CONSTRAINT events_check1 CHECK (((lease_token IS NULL) = (lease_expires_at IS NULL)));
ALTER TABLE events_2 ADD CONSTRAINT events_max_attempts_check1 CHECK ((max_attempts >= 0));
ALTER TABLE events_2 ADD CONSTRAINT events_state_check1 CHECK ((state = ANY (ARRAY[0, 1, 2])));
ALTER TABLE events_3 ADD CONSTRAINT events_3_pkey PRIMARY KEY (id, leaf);
ALTER TABLE events_3 ADD CONSTRAINT events_attempt_check1 CHECK ((attempt >= 0));
ALTER TABLE events_3 ADD CONSTRAINT events_check1 CHECK (((lease_token IS NULL) = (lease_expires_at IS NULL)));
ALTER TABLE events_3 ADD CONSTRAINT events_max_attempts_check1 CHECK ((max_attempts >= 0));
ALTER TABLE events_3 ADD CONSTRAINT events_state_check1 CHECK ((state = ANY (ARRAY[0, 1, 2])));
ALTER TABLE events_cold ADD CONSTRAINT events_attempt_check1 CHECK ((attempt >= 0));
ALTER TABLE events_cold ADD CONSTRAINT events_check1 CHECK (((lease_token IS NULL) = (lease_expires_at IS NULL)));
ALTER TABLE events_cold ADD CONSTRAINT events_cold_pkey PRIMARY KEY (id, leaf);
ALTER TABLE events_cold ADD CONSTRAINT events_max_attempts_check1 CHECK ((max_attempts >= 0));
ALTER TABLE events_cold ADD CONSTRAINT events_state_check1 CHECK ((state = ANY (ARRAY[0, 1, 2])));
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (tenant, handler, key);
ALTER TABLE leaders ADD CONSTRAINT leaders_pkey PRIMARY KEY (role);
ALTER TABLE meta ADD CONSTRAINT meta_pkey PRIMARY KEY (key);
ALTER TABLE parked ADD CONSTRAINT parked_pkey PRIMARY KEY (tenant, handler);
ALTER TABLE ring ADD CONSTRAINT ring_leaf_check CHECK (((leaf >= 1) AND (leaf <= 3)));
ALTER TABLE ring ADD CONSTRAINT ring_phase_check CHECK ((phase = ANY (ARRAY['filling'::text, 'draining'::text, 'empty'::text])));
ALTER TABLE ring ADD CONSTRAINT ring_pkey PRIMARY KEY (leaf);
ALTER TABLE ring_empty ADD CONSTRAINT ring_empty_leaf_check CHECK (((leaf >= 1) AND (leaf <= 3)));
ALTER TABLE ring_empty ADD CONSTRAINT ring_empty_pkey PRIMARY KEY (leaf);
ALTER TABLE rules ADD CONSTRAINT rules_kind_check CHECK ((kind = ANY (ARRAY['pause'::text, 'block'::text])));
ALTER TABLE rules ADD CONSTRAINT rules_pkey PRIMARY KEY (tenant, handler, kind);
ALTER TABLE schedules ADD CONSTRAINT schedules_check CHECK (((cron IS NULL) <> (every_ms IS NULL)));
ALTER TABLE schedules ADD CONSTRAINT schedules_pkey PRIMARY KEY (tenant, name);
ALTER TABLE subscriptions ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (topic, tenant, handler);
ALTER TABLE subscriptions ADD CONSTRAINT subscriptions_source_check CHECK ((source = ANY (ARRAY['config'::text, 'api'::text])));

-- indexes
CREATE INDEX events_1_notified_at_id_key_idx ON herald.events_1 USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_1_pkey ON herald.events_1 USING btree (id, leaf);
CREATE INDEX events_1_state_finished_at_idx ON herald.events_1 USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX events_1_tenant_handler_id_key_idx ON herald.events_1 USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_1_tenant_handler_idempotency_key_leaf_idx ON herald.events_1 USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_1_tenant_handler_state_id_key_idx ON herald.events_1 USING btree (tenant, handler, state, id_key);
CREATE INDEX events_2_notified_at_id_key_idx ON herald.events_2 USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_2_pkey ON herald.events_2 USING btree (id, leaf);
CREATE INDEX events_2_state_finished_at_idx ON herald.events_2 USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX events_2_tenant_handler_id_key_idx ON herald.events_2 USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_2_tenant_handler_idempotency_key_leaf_idx ON herald.events_2 USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_2_tenant_handler_state_id_key_idx ON herald.events_2 USING btree (tenant, handler, state, id_key);
CREATE INDEX events_3_notified_at_id_key_idx ON herald.events_3 USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_3_pkey ON herald.events_3 USING btree (id, leaf);
CREATE INDEX events_3_state_finished_at_idx ON herald.events_3 USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX events_3_tenant_handler_id_key_idx ON herald.events_3 USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_3_tenant_handler_idempotency_key_leaf_idx ON herald.events_3 USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_3_tenant_handler_state_id_key_idx ON herald.events_3 USING btree (tenant, handler, state, id_key);
CREATE INDEX events_by_handler ON ONLY herald.events USING btree (tenant, handler, state, id_key);
CREATE INDEX events_cold_notified_at_id_key_idx ON herald.events_cold USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_cold_pkey ON herald.events_cold USING btree (id, leaf);
CREATE INDEX events_cold_state_finished_at_idx ON herald.events_cold USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX events_cold_tenant_handler_id_key_idx ON herald.events_cold USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_cold_tenant_handler_idempotency_key_leaf_idx ON herald.events_cold USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_cold_tenant_handler_state_id_key_idx ON herald.events_cold USING btree (tenant, handler, state, id_key);
CREATE INDEX events_finished ON ONLY herald.events USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE UNIQUE INDEX events_live_key ON ONLY herald.events USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_parked ON ONLY herald.events USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_pkey ON ONLY herald.events USING btree (id, leaf);
CREATE INDEX events_to_notify ON ONLY herald.events USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE INDEX idempotency_keys_by_age ON herald.idempotency_keys USING btree (stored_at);
CREATE UNIQUE INDEX idempotency_keys_pkey ON herald.idempotency_keys USING btree (tenant, handler, key);
CREATE UNIQUE INDEX leaders_pkey ON herald.leaders USING btree (role);
CREATE UNIQUE INDEX meta_pkey ON herald.meta USING btree (key);
CREATE UNIQUE INDEX parked_pkey ON herald.parked USING btree (tenant, handler);
CREATE UNIQUE INDEX ring_empty_pkey ON herald.ring_empty USING btree (leaf);
CREATE UNIQUE INDEX ring_pkey ON herald.ring USING btree (leaf);
CREATE INDEX rules_by_handler ON herald.rules USING btree (handler);
CREATE UNIQUE INDEX rules_pkey ON herald.rules USING btree (tenant, handler, kind);
CREATE INDEX schedules_due ON herald.schedules USING btree (next_at) WHERE (NOT paused);
CREATE UNIQUE INDEX schedules_pkey ON herald.schedules USING btree (tenant, name);
CREATE UNIQUE INDEX subscriptions_pkey ON herald.subscriptions USING btree (topic, tenant, handler);

-- triggers
CREATE TRIGGER ring_empty_copy AFTER UPDATE OF phase ON herald.ring FOR EACH ROW EXECUTE FUNCTION herald.ring_empty_copy();

-- functions
CREATE OR REPLACE FUNCTION herald.claim(uuid[], bigint, uuid[], text[], text[])
 RETURNS SETOF herald.events
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET attempt = e.attempt + 1, lease_token = $1[array_position($3, e.id)],
           lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $2,
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
       WHERE e.id = ANY($3)
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND (e.state + 0) = 0
         AND e.run_at <= (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
         AND (e.lease_expires_at IS NULL
              OR e.lease_expires_at <= (SELECT floor(date_part('epoch', now()) * 1000)::bigint))
         AND e.attempt < e.max_attempts
         AND (e.handler || '') = ANY($4)
         AND ((SELECT NOT EXISTS (SELECT 1 FROM rules AS h WHERE h.handler = ANY($4)))
              OR ((SELECT NOT EXISTS (SELECT 1 FROM rules AS t
                                      WHERE t.tenant = ANY($5) AND (t.handler || '') = ANY($4)))
                  AND e.tenant = ANY($5))
              OR NOT EXISTS (SELECT 1 FROM rules AS r
                             WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0))
       RETURNING e.*;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($3) THEN
    RETURN QUERY UPDATE events AS e
         SET attempt = e.attempt + 1, lease_token = $1[array_position($3, e.id)],
             lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $2,
             updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
         WHERE e.id = ANY($3)
           AND e.leaf = 0
           AND (e.state + 0) = 0
           AND e.run_at <= (SELECT floor(date_part('epoch', now()) * 1000)::bigint)
           AND (e.lease_expires_at IS NULL
                OR e.lease_expires_at <= (SELECT floor(date_part('epoch', now()) * 1000)::bigint))
           AND e.attempt < e.max_attempts
           AND (e.handler || '') = ANY($4)
           AND ((SELECT NOT EXISTS (SELECT 1 FROM rules AS h WHERE h.handler = ANY($4)))
                OR ((SELECT NOT EXISTS (SELECT 1 FROM rules AS t
                                        WHERE t.tenant = ANY($5) AND (t.handler || '') = ANY($4)))
                    AND e.tenant = ANY($5))
                OR NOT EXISTS (SELECT 1 FROM rules AS r
                               WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0))
         RETURNING e.*;
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.emit(uuid[], text[], text[], text[], bigint[], integer[], text[], text[], bigint[])
 RETURNS SETOF uuid
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$BEGIN RETURN QUERY INSERT INTO events AS e
       (id, tenant, handler, payload, run_at, max_attempts, notified_at, idempotency_key,
        created_at, updated_at, leaf, topic)
     SELECT u.id, u.tenant, u.handler, u.payload, t.run_at, u.max_attempts,
            least(t.run_at, 9223372036854775806), u.key, c.now, c.now,
            CASE WHEN t.run_at > c.now + 10000
                      OR EXISTS (SELECT 1 FROM rules AS r
                                 WHERE r.tenant = u.tenant AND r.handler = u.handler)
                 THEN 0 ELSE c.leaf END,
            u.topic
     FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9)
            AS u(id, tenant, handler, payload, at, max_attempts, key, topic, after_ms),
          (SELECT floor(date_part('epoch', now()) * 1000)::bigint AS now,
                  coalesce((SELECT r.leaf FROM ring AS r WHERE r.phase = 'filling'), 0) AS leaf)
            AS c,
          LATERAL (SELECT coalesce(u.at,
                     CASE WHEN u.after_ms > 9223372036854775807 - c.now
                          THEN 9223372036854775807
                          ELSE c.now + greatest(u.after_ms, 0) END) AS run_at) AS t
     WHERE (SELECT 1 FROM events AS x WHERE x.id = u.id LIMIT 1) IS NULL
       AND (u.key IS NULL
            OR (SELECT 1 FROM events AS x
                WHERE x.tenant = u.tenant AND x.handler = u.handler
                  AND x.idempotency_key = u.key AND x.state = 0 LIMIT 1) IS NULL)
     ON CONFLICT DO NOTHING
     RETURNING e.id; END$function$
;
CREATE OR REPLACE FUNCTION herald.existing_keys(text[], text[], text[], integer[])
 RETURNS TABLE(ord integer, id uuid)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$BEGIN RETURN QUERY SELECT k.ord, x.id
     FROM unnest($1, $2, $3, $4) AS k(tenant, handler, key, ord)
     CROSS JOIN LATERAL (SELECT e.id FROM events AS e
                         WHERE e.tenant = k.tenant AND e.handler = k.handler
                           AND e.idempotency_key = k.key AND e.state = 0
                         LIMIT 1) AS x; END$function$
;
CREATE OR REPLACE FUNCTION herald.inspect(uuid[])
 RETURNS TABLE(now bigint, id uuid, tenant text, handler text, payload text, state smallint, run_at bigint, attempt integer, max_attempts integer, lease_token uuid, lease_expires_at bigint, last_error text, idempotency_key text, created_at bigint, updated_at bigint, topic text, blocked boolean, paused boolean)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$BEGIN RETURN QUERY SELECT c.now, e.id, e.tenant, e.handler, e.payload, e.state, e.run_at,
       e.attempt, e.max_attempts, e.lease_token, e.lease_expires_at, e.last_error,
       e.idempotency_key, e.created_at, e.updated_at, e.topic,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'block'),
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'pause')
     FROM (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint AS now) AS c
     LEFT JOIN events AS e ON e.id = ANY($1); END$function$
;
CREATE OR REPLACE FUNCTION herald.renew(bigint, uuid[], uuid[], integer[])
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_nestloop TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
       FROM unnest($2, $3, $4) AS s(id, token, ord)
       WHERE e.id = ANY($2) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token = s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($2) THEN
    RETURN QUERY UPDATE events AS e
         SET lease_expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
         FROM unnest($2, $3, $4) AS s(id, token, ord)
         WHERE e.id = ANY($2) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token = s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.renotify(text, text, bigint)
 RETURNS TABLE(id uuid, run_at bigint, now bigint)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET jit TO 'off'
AS $function$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
           ORDER BY x.id_key LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$function$
;
CREATE OR REPLACE FUNCTION herald.renotify_after(text, text, bigint, uuid)
 RETURNS TABLE(id uuid, run_at bigint, now bigint)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET jit TO 'off'
AS $function$#variable_conflict use_column
BEGIN RETURN QUERY UPDATE events AS e
     SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint))
     FROM (SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2 AND x.state = 0
             AND x.id_key > $4 ORDER BY x.id_key LIMIT $3) AS p
     WHERE e.id = p.id AND (e.state + 0) = 0
     RETURNING e.id, e.run_at, (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint); END$function$
;
CREATE OR REPLACE FUNCTION herald.ring_empty_copy()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'herald', 'pg_catalog'
AS $function$BEGIN
  UPDATE ring_empty SET empty = (NEW.phase = 'empty') WHERE leaf = NEW.leaf;
  RETURN NULL;
END$function$
;
CREATE OR REPLACE FUNCTION herald.ring_flip(smallint, smallint)
 RETURNS boolean
 LANGUAGE plpgsql
 SET lock_timeout TO '100ms'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE now_ms bigint := floor(date_part('epoch', now()) * 1000)::bigint;
BEGIN
  LOCK TABLE ring IN ACCESS EXCLUSIVE MODE;
  IF NOT EXISTS (SELECT 1 FROM ring WHERE leaf = $1 AND phase = 'filling')
     OR NOT EXISTS (SELECT 1 FROM ring WHERE leaf = $2 AND phase = 'empty') THEN
    RETURN false;
  END IF;
  UPDATE ring SET phase = 'draining', since = now_ms WHERE leaf = $1;
  UPDATE ring SET phase = 'filling', since = now_ms WHERE leaf = $2;
  RETURN true;
END$function$
;
CREATE OR REPLACE FUNCTION herald.ring_retire(smallint, bigint, boolean)
 RETURNS TABLE(moved bigint, dropped bigint, emptied boolean)
 LANGUAGE plpgsql
 SET lock_timeout TO '100ms'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$#variable_conflict use_column
DECLARE n_moved bigint; n_left bigint; leaf_table text := 'events_' || $1;
  columns text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, leaf, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors, topic';
  copied text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, 0, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors, topic';
BEGIN
  PERFORM 1 FROM ring AS r WHERE r.leaf = $1 AND r.phase = 'draining' FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %I LIMIT $1 + 1) AS l', leaf_table)
    INTO n_left USING $2;
  IF n_left > $2 AND NOT $3 THEN
    RETURN;
  END IF;
  EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', leaf_table);
  IF n_left > $2 THEN
    EXECUTE format(
      'WITH m AS (DELETE FROM %I WHERE ctid = ANY (ARRAY(SELECT ctid FROM %I LIMIT $1)) '
      'RETURNING %s), i AS (INSERT INTO events_cold (%s) SELECT %s FROM m '
      'ON CONFLICT DO NOTHING RETURNING 1) '
      'SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM i)',
      leaf_table, leaf_table, columns, columns, copied) INTO n_left, n_moved USING $2;
    RETURN QUERY SELECT n_moved, n_left - n_moved, false;
    RETURN;
  END IF;
  IF pg_relation_size(leaf_table::regclass) = 0 THEN
    UPDATE ring AS r SET phase = 'empty', since = floor(date_part('epoch', now()) * 1000)::bigint
    WHERE r.leaf = $1;
    RETURN QUERY SELECT 0::bigint, 0::bigint, true;
    RETURN;
  END IF;
  EXECUTE format('SELECT count(*) FROM %I', leaf_table) INTO n_left;
  EXECUTE format('INSERT INTO events_cold (%s) SELECT %s FROM %I ON CONFLICT DO NOTHING',
                 columns, copied, leaf_table);
  GET DIAGNOSTICS n_moved = ROW_COUNT;
  EXECUTE format('TRUNCATE %I', leaf_table);
  UPDATE ring AS r SET phase = 'empty', since = floor(date_part('epoch', now()) * 1000)::bigint
  WHERE r.leaf = $1;
  RETURN QUERY SELECT n_moved, n_left - n_moved, true;
END$function$
;
CREATE OR REPLACE FUNCTION herald.settle_archive(uuid[], uuid[], integer[])
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_nestloop TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           lease_token = NULL, lease_expires_at = NULL
       FROM unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY UPDATE events AS e
         SET state = 2, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             lease_token = NULL, lease_expires_at = NULL
         FROM unnest($1, $2, $3) AS s(id, token, ord)
         WHERE e.id = ANY($1) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.settle_bury(uuid[], uuid[], integer[], text[])
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_nestloop TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET state = 1, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           last_error = s.error, lease_token = NULL, lease_expires_at = NULL,
           errors = coalesce(e.errors, '[]'::jsonb)
               || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                    'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                    'error', s.error))
       FROM unnest($1, $2, $3, $4) AS s(id, token, ord, error)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY UPDATE events AS e
         SET state = 1, finished_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             last_error = s.error, lease_token = NULL, lease_expires_at = NULL,
             errors = coalesce(e.errors, '[]'::jsonb)
                 || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                      'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                      'error', s.error))
         FROM unnest($1, $2, $3, $4) AS s(id, token, ord, error)
         WHERE e.id = ANY($1) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.settle_delete(uuid[], uuid[], integer[])
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_nestloop TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE taken bigint;
BEGIN
  RETURN QUERY DELETE FROM events AS e
       USING unnest($1, $2, $3) AS s(id, token, ord)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY DELETE FROM events AS e
         USING unnest($1, $2, $3) AS s(id, token, ord)
         WHERE e.id = ANY($1) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.settle_release(uuid[], uuid[], integer[], bigint[], integer[], text[])
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_nestloop TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE taken bigint;
BEGIN
  RETURN QUERY UPDATE events AS e
       SET lease_token = NULL, lease_expires_at = NULL,
           run_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + s.wait,
           notified_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + s.wait,
           attempt = greatest(e.attempt - s.give_back, 0),
           last_error = coalesce(s.error, e.last_error),
           updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
           errors = CASE WHEN s.error IS NULL THEN e.errors ELSE coalesce(e.errors, '[]'::jsonb)
               || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                    'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                    'error', s.error)) END
       FROM unnest($1, $2, $3, $4, $5, $6) AS s(id, token, ord, wait, give_back, error)
       WHERE e.id = ANY($1) AND e.id = s.id
         AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
              OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty))
         AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
       RETURNING s.ord;
  GET DIAGNOSTICS taken = ROW_COUNT;
  IF taken < cardinality($1) THEN
    RETURN QUERY UPDATE events AS e
         SET lease_token = NULL, lease_expires_at = NULL,
             run_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + s.wait,
             notified_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + s.wait,
             attempt = greatest(e.attempt - s.give_back, 0),
             last_error = coalesce(s.error, e.last_error),
             updated_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
             errors = CASE WHEN s.error IS NULL THEN e.errors ELSE coalesce(e.errors, '[]'::jsonb)
                 || jsonb_build_array(jsonb_build_object('attempt', e.attempt,
                      'at', (SELECT floor(date_part('epoch', now()) * 1000)::bigint),
                      'error', s.error)) END
         FROM unnest($1, $2, $3, $4, $5, $6) AS s(id, token, ord, wait, give_back, error)
         WHERE e.id = ANY($1) AND e.id = s.id
           AND e.leaf = 0
           AND e.lease_token IS NOT DISTINCT FROM s.token AND (e.state + 0) = 0
         RETURNING s.ord;
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.sweep_expired(bigint, bigint, bigint, uuid, bigint)
 RETURNS TABLE(id uuid, tenant text, handler text, ruled boolean, notified_at bigint)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET jit TO 'off'
AS $function$#variable_conflict use_column
BEGIN RETURN QUERY SELECT e.id, e.tenant, e.handler,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant AND r.handler = e.handler),
       e.notified_at
     FROM events AS e
     WHERE e.state = 0 AND e.notified_at < 9223372036854775807
       AND e.notified_at >= $2 AND e.notified_at < $1
       AND (e.notified_at, e.id_key) > ($3, $4)
       AND e.lease_expires_at <= $1 AND e.notified_at < e.lease_expires_at
       AND e.run_at <= $1
     ORDER BY e.notified_at, e.id_key LIMIT $5; END$function$
;
CREATE OR REPLACE FUNCTION herald.sweep_park(uuid[])
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET jit TO 'off'
AS $function$BEGIN UPDATE events AS e SET notified_at = 9223372036854775807
     WHERE e.id = ANY($1) AND (e.state + 0) = 0; END$function$
;
CREATE OR REPLACE FUNCTION herald.sweep_quiet(bigint, bigint, bigint, uuid, bigint)
 RETURNS TABLE(id uuid, tenant text, handler text, ruled boolean, notified_at bigint)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET jit TO 'off'
AS $function$#variable_conflict use_column
BEGIN RETURN QUERY SELECT e.id, e.tenant, e.handler,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant AND r.handler = e.handler),
       e.notified_at
     FROM events AS e
     WHERE e.state = 0 AND e.notified_at < 9223372036854775807
       AND e.notified_at < $2
       AND (e.notified_at, e.id_key) > ($3, $4)
       AND e.run_at <= $1 AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= $1)
     ORDER BY e.notified_at, e.id_key LIMIT $5; END$function$
;
CREATE OR REPLACE FUNCTION herald.sweep_stamp(bigint, uuid[])
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET jit TO 'off'
AS $function$BEGIN UPDATE events AS e SET notified_at = $1 WHERE e.id = ANY($2) AND (e.state + 0) = 0; END$function$
;
CREATE OR REPLACE FUNCTION herald.sweep_unpark(text, text, bigint)
 RETURNS bigint
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
 SET jit TO 'off'
AS $function$DECLARE n bigint; BEGIN UPDATE events AS e SET notified_at = least(e.run_at, 9223372036854775806)
     WHERE e.id = ANY(ARRAY(SELECT x.id FROM events AS x WHERE x.tenant = $1 AND x.handler = $2
                            AND x.state = 0 AND x.notified_at = 9223372036854775807
                            ORDER BY x.id_key LIMIT $3))
       AND (e.state + 0) = 0; GET DIAGNOSTICS n = ROW_COUNT; RETURN n; END$function$
;

-- meta
INSERT INTO meta VALUES ('baseline', '0.1.0');
INSERT INTO meta VALUES ('format', 'herald event store');
INSERT INTO meta VALUES ('schema_version', '1');
