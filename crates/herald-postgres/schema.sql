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
    topic text,
    concurrency_key text,
    singleton_key text,
    rate_turn bigint
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
    topic text,
    concurrency_key text,
    singleton_key text,
    rate_turn bigint
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
    topic text,
    concurrency_key text,
    singleton_key text,
    rate_turn bigint
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
    topic text,
    concurrency_key text,
    singleton_key text,
    rate_turn bigint
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
    topic text,
    concurrency_key text,
    singleton_key text,
    rate_turn bigint
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
CREATE TABLE limit_counts (
    handler text NOT NULL,
    kind smallint NOT NULL,
    tenant text NOT NULL,
    key text NOT NULL,
    held integer NOT NULL
);
CREATE TABLE limit_slots (
    token uuid NOT NULL,
    kind smallint NOT NULL,
    handler text NOT NULL,
    tenant text NOT NULL,
    key text NOT NULL,
    event_id uuid NOT NULL,
    expires_at bigint NOT NULL
);
CREATE TABLE limit_waits (
    handler text NOT NULL,
    kind smallint NOT NULL,
    tenant text NOT NULL,
    key text NOT NULL,
    seq bigint NOT NULL,
    event_id uuid NOT NULL
);
CREATE TABLE limits (
    handler text NOT NULL,
    kind smallint NOT NULL,
    tenant text NOT NULL,
    key text NOT NULL,
    running integer,
    starts integer,
    period_ms bigint,
    burst integer,
    source text NOT NULL,
    created_at bigint NOT NULL
);
CREATE TABLE meta (
    key text NOT NULL,
    value text NOT NULL
);
CREATE TABLE parked (
    tenant text NOT NULL,
    handler text NOT NULL
);
CREATE TABLE rate_state (
    handler text NOT NULL,
    kind smallint NOT NULL,
    tenant text NOT NULL,
    key text NOT NULL,
    tat bigint NOT NULL
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
CREATE SEQUENCE limit_waits_seq_seq;

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
ALTER TABLE limit_counts ADD CONSTRAINT limit_counts_held_check CHECK ((held >= 0));
ALTER TABLE limit_counts ADD CONSTRAINT limit_counts_pkey PRIMARY KEY (handler, kind, tenant, key);
ALTER TABLE limit_slots ADD CONSTRAINT limit_slots_pkey PRIMARY KEY (token, kind);
ALTER TABLE limit_waits ADD CONSTRAINT limit_waits_pkey PRIMARY KEY (handler, kind, tenant, key, seq);
ALTER TABLE limits ADD CONSTRAINT limits_burst_check CHECK ((burst > 0));
ALTER TABLE limits ADD CONSTRAINT limits_check CHECK (((kind > 0) OR (tenant = ''::text)));
ALTER TABLE limits ADD CONSTRAINT limits_check1 CHECK (((kind = 2) OR (key = ''::text)));
ALTER TABLE limits ADD CONSTRAINT limits_check2 CHECK ((((tenant = ''::text) = (key = ''::text)) OR (kind < 2)));
ALTER TABLE limits ADD CONSTRAINT limits_check3 CHECK (((running IS NOT NULL) OR (starts IS NOT NULL)));
ALTER TABLE limits ADD CONSTRAINT limits_check4 CHECK ((((starts IS NULL) = (period_ms IS NULL)) AND ((starts IS NULL) = (burst IS NULL))));
ALTER TABLE limits ADD CONSTRAINT limits_kind_check CHECK ((kind = ANY (ARRAY[0, 1, 2])));
ALTER TABLE limits ADD CONSTRAINT limits_period_ms_check CHECK ((period_ms > 0));
ALTER TABLE limits ADD CONSTRAINT limits_pkey PRIMARY KEY (handler, kind, tenant, key);
ALTER TABLE limits ADD CONSTRAINT limits_running_check CHECK ((running > 0));
ALTER TABLE limits ADD CONSTRAINT limits_source_check CHECK ((source = ANY (ARRAY['config'::text, 'api'::text])));
ALTER TABLE limits ADD CONSTRAINT limits_starts_check CHECK ((starts > 0));
ALTER TABLE meta ADD CONSTRAINT meta_pkey PRIMARY KEY (key);
ALTER TABLE parked ADD CONSTRAINT parked_pkey PRIMARY KEY (tenant, handler);
ALTER TABLE rate_state ADD CONSTRAINT rate_state_pkey PRIMARY KEY (handler, kind, tenant, key);
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
CREATE INDEX events_1_tenant_handler_singleton_key_id_key_idx ON herald.events_1 USING btree (tenant, handler, singleton_key, id_key) WHERE ((singleton_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_1_tenant_handler_state_id_key_idx ON herald.events_1 USING btree (tenant, handler, state, id_key);
CREATE INDEX events_2_notified_at_id_key_idx ON herald.events_2 USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_2_pkey ON herald.events_2 USING btree (id, leaf);
CREATE INDEX events_2_state_finished_at_idx ON herald.events_2 USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX events_2_tenant_handler_id_key_idx ON herald.events_2 USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_2_tenant_handler_idempotency_key_leaf_idx ON herald.events_2 USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_2_tenant_handler_singleton_key_id_key_idx ON herald.events_2 USING btree (tenant, handler, singleton_key, id_key) WHERE ((singleton_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_2_tenant_handler_state_id_key_idx ON herald.events_2 USING btree (tenant, handler, state, id_key);
CREATE INDEX events_3_notified_at_id_key_idx ON herald.events_3 USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_3_pkey ON herald.events_3 USING btree (id, leaf);
CREATE INDEX events_3_state_finished_at_idx ON herald.events_3 USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX events_3_tenant_handler_id_key_idx ON herald.events_3 USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_3_tenant_handler_idempotency_key_leaf_idx ON herald.events_3 USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_3_tenant_handler_singleton_key_id_key_idx ON herald.events_3 USING btree (tenant, handler, singleton_key, id_key) WHERE ((singleton_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_3_tenant_handler_state_id_key_idx ON herald.events_3 USING btree (tenant, handler, state, id_key);
CREATE INDEX events_by_handler ON ONLY herald.events USING btree (tenant, handler, state, id_key);
CREATE INDEX events_cold_notified_at_id_key_idx ON herald.events_cold USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_cold_pkey ON herald.events_cold USING btree (id, leaf);
CREATE INDEX events_cold_state_finished_at_idx ON herald.events_cold USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX events_cold_tenant_handler_id_key_idx ON herald.events_cold USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_cold_tenant_handler_idempotency_key_leaf_idx ON herald.events_cold USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_cold_tenant_handler_singleton_key_id_key_idx ON herald.events_cold USING btree (tenant, handler, singleton_key, id_key) WHERE ((singleton_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_cold_tenant_handler_state_id_key_idx ON herald.events_cold USING btree (tenant, handler, state, id_key);
CREATE INDEX events_finished ON ONLY herald.events USING btree (state, finished_at) WHERE (finished_at IS NOT NULL);
CREATE UNIQUE INDEX events_live_key ON ONLY herald.events USING btree (tenant, handler, idempotency_key, leaf) WHERE ((idempotency_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_parked ON ONLY herald.events USING btree (tenant, handler, id_key) WHERE ((state = 0) AND (notified_at = '9223372036854775807'::bigint));
CREATE UNIQUE INDEX events_pkey ON ONLY herald.events USING btree (id, leaf);
CREATE INDEX events_singleton ON ONLY herald.events USING btree (tenant, handler, singleton_key, id_key) WHERE ((singleton_key IS NOT NULL) AND (state = 0));
CREATE INDEX events_to_notify ON ONLY herald.events USING btree (notified_at, id_key) WHERE ((state = 0) AND (notified_at < '9223372036854775807'::bigint));
CREATE INDEX idempotency_keys_by_age ON herald.idempotency_keys USING btree (stored_at);
CREATE UNIQUE INDEX idempotency_keys_pkey ON herald.idempotency_keys USING btree (tenant, handler, key);
CREATE UNIQUE INDEX leaders_pkey ON herald.leaders USING btree (role);
CREATE UNIQUE INDEX limit_counts_pkey ON herald.limit_counts USING btree (handler, kind, tenant, key);
CREATE INDEX limit_slots_by_expiry ON herald.limit_slots USING btree (expires_at);
CREATE INDEX limit_slots_by_scope ON herald.limit_slots USING btree (handler, kind, tenant, key, expires_at);
CREATE UNIQUE INDEX limit_slots_pkey ON herald.limit_slots USING btree (token, kind);
CREATE INDEX limit_waits_by_event ON herald.limit_waits USING btree (event_id);
CREATE UNIQUE INDEX limit_waits_pkey ON herald.limit_waits USING btree (handler, kind, tenant, key, seq);
CREATE UNIQUE INDEX limits_pkey ON herald.limits USING btree (handler, kind, tenant, key);
CREATE UNIQUE INDEX meta_pkey ON herald.meta USING btree (key);
CREATE UNIQUE INDEX parked_pkey ON herald.parked USING btree (tenant, handler);
CREATE UNIQUE INDEX rate_state_pkey ON herald.rate_state USING btree (handler, kind, tenant, key);
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
AS $function$DECLARE taken bigint; more bigint;
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
         AND ((SELECT NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = ANY($4)))
              OR NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = e.handler OFFSET 0))
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
           AND ((SELECT NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = ANY($4)))
                OR NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = e.handler OFFSET 0))
         RETURNING e.*;
    GET DIAGNOSTICS more = ROW_COUNT;
    taken := taken + more;
  END IF;
  IF taken < cardinality($3) AND EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = ANY($4)) THEN
    RETURN QUERY SELECT * FROM claim_limited($1, $2, $3, $4, $5);
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.claim_limited(uuid[], bigint, uuid[], text[], text[])
 RETURNS SETOF herald.events
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE
  got events[];
  now_ms bigint := floor(date_part('epoch', now()) * 1000)::bigint;
  now_us bigint := floor(date_part('epoch', now()) * 1000000)::bigint;
  s_id uuid[]; s_kind int2[]; s_handler text[]; s_tenant text[]; s_key text[];
  s_token uuid[]; s_expires int8[]; s_name text[]; s_booked int8[];
  q_name text[]; q_kind int2[]; q_handler text[]; q_tenant text[]; q_key text[];
  q_room int8[]; q_interval int8[]; q_tau int8[]; q_tat int8[];
  ev record;
  i integer;
  full_at integer;
  turn bigint;
  charged boolean[];
  keep boolean[];
  kept uuid[] := '{}';
  r_id uuid[] := '{}';
  r_at int4[] := '{}';
  d_id uuid[] := '{}';
  d_turn int8[] := '{}';
  lock_key integer;
BEGIN
  WITH c AS (
    UPDATE events AS e
       SET attempt = e.attempt + 1, lease_token = $1[array_position($3, e.id)],
           lease_expires_at = now_ms + $2, updated_at = now_ms
     WHERE e.id = ANY($3)
       AND (e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 1 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 2 AND NOT l.empty)
            OR e.leaf = (SELECT l.leaf FROM ring_empty AS l WHERE l.leaf = 3 AND NOT l.empty)
            OR e.leaf = 0)
       AND (e.state + 0) = 0
       AND e.run_at <= now_ms
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= now_ms)
       AND e.attempt < e.max_attempts
       AND (e.handler || '') = ANY($4)
       AND EXISTS (SELECT 1 FROM limits AS l WHERE l.handler = e.handler)
       AND NOT EXISTS (SELECT 1 FROM rules AS r
                       WHERE r.tenant = e.tenant AND r.handler = e.handler OFFSET 0)
    RETURNING e.*)
  SELECT coalesce(array_agg(c), '{}') INTO got FROM c;
  SELECT array_agg(g.id), array_agg(x.kind), array_agg(g.handler), array_agg(x.tenant),
         array_agg(x.key), array_agg(g.lease_token), array_agg(g.lease_expires_at),
         array_agg(x.kind::text || '/' || g.handler || '/' || x.tenant || '/' || x.key),
         array_agg(g.rate_turn)
    INTO s_id, s_kind, s_handler, s_tenant, s_key, s_token, s_expires, s_name, s_booked
    FROM unnest(got) AS g
    CROSS JOIN LATERAL (VALUES (0::int2, ''::text, ''::text), (1::int2, g.tenant, ''::text),
                               (2::int2, g.tenant, g.concurrency_key)) AS x(kind, tenant, key)
   WHERE x.key IS NOT NULL
     AND (g.handler, x.kind) IN (SELECT DISTINCT l.handler, l.kind FROM limits AS l
                                  WHERE l.handler = ANY($4));
  IF s_id IS NULL THEN
    RETURN QUERY SELECT * FROM unnest(got);
    RETURN;
  END IF;
  FOR lock_key IN SELECT DISTINCT scope_lock_key(s.kind, s.handler, s.tenant, s.key)
                    FROM unnest(s_kind, s_handler, s_tenant, s_key) AS s(kind, handler, tenant, key)
                   ORDER BY 1 LOOP
    PERFORM pg_advisory_xact_lock(1751478881, lock_key);
  END LOOP;
  SELECT array_agg(q.name ORDER BY q.name), array_agg(q.kind ORDER BY q.name),
         array_agg(q.handler ORDER BY q.name), array_agg(q.tenant ORDER BY q.name),
         array_agg(q.key ORDER BY q.name),
         array_agg((q.l).running
                   - coalesce((SELECT c.held FROM limit_counts AS c
                               WHERE c.handler = q.handler AND c.kind = q.kind
                                 AND c.tenant = q.tenant AND c.key = q.key), 0) ORDER BY q.name),
         array_agg(CASE WHEN (q.l).starts IS NOT NULL
                        THEN greatest((q.l).period_ms * 1000 / (q.l).starts, 1) END ORDER BY q.name),
         array_agg(CASE WHEN (q.l).starts IS NOT NULL
                        THEN ((q.l).burst - 1) * greatest((q.l).period_ms * 1000 / (q.l).starts, 1)
                   END ORDER BY q.name),
         array_agg(coalesce((SELECT r.tat FROM rate_state AS r
                             WHERE r.handler = q.handler AND r.kind = q.kind
                               AND r.tenant = q.tenant AND r.key = q.key), 0) ORDER BY q.name)
    INTO q_name, q_kind, q_handler, q_tenant, q_key, q_room, q_interval, q_tau, q_tat
    FROM (SELECT d.*, scope_row(d.kind, d.handler, d.tenant, d.key) AS l
            FROM (SELECT DISTINCT s.name, s.kind, s.handler, s.tenant, s.key
                    FROM unnest(s_name, s_kind, s_handler, s_tenant, s_key)
                         AS s(name, kind, handler, tenant, key) OFFSET 0) AS d
          OFFSET 0) AS q
   WHERE (q.l).handler IS NOT NULL;
  IF q_name IS NULL THEN
    RETURN QUERY SELECT * FROM unnest(got);
    RETURN;
  END IF;
  charged := array_fill(false, ARRAY[cardinality(q_name)]);
  keep := array_fill(false, ARRAY[cardinality(s_id)]);
  FOR ev IN SELECT s.id,
                   coalesce(array_agg(array_position(q_name, s.name) ORDER BY s.kind)
                              FILTER (WHERE s.name = ANY(q_name)), '{}') AS at,
                   array_agg(s.ord) AS rows,
                   max(s.booked) AS booked
              FROM unnest(s_id, s_name, s_kind, s_booked) WITH ORDINALITY
                   AS s(id, name, kind, booked, ord)
             GROUP BY s.id ORDER BY s.id LOOP
    full_at := NULL;
    FOREACH i IN ARRAY ev.at LOOP
      IF q_room[i] <= 0 THEN
        full_at := i;
        EXIT;
      END IF;
    END LOOP;
    IF full_at IS NOT NULL THEN
      r_id := r_id || ev.id;
      r_at := r_at || full_at;
      CONTINUE;
    END IF;
    turn := NULL;
    FOREACH i IN ARRAY ev.at LOOP
      IF q_interval[i] IS NOT NULL
         AND NOT (ev.booked IS NOT NULL AND now_us < ev.booked * 1000 + q_interval[i])
         AND q_tat[i] > now_us + q_tau[i] THEN
        turn := greatest(turn, q_tat[i] - q_tau[i]);
      END IF;
    END LOOP;
    IF turn IS NOT NULL THEN
      FOREACH i IN ARRAY ev.at LOOP
        IF q_interval[i] IS NOT NULL THEN
          q_tat[i] := greatest(q_tat[i], turn) + q_interval[i];
          charged[i] := true;
        END IF;
      END LOOP;
      d_id := d_id || ev.id;
      d_turn := d_turn || ((turn + 999) / 1000);
      CONTINUE;
    END IF;
    FOREACH i IN ARRAY ev.at LOOP
      q_room[i] := q_room[i] - 1;
      IF q_interval[i] IS NOT NULL
         AND NOT (ev.booked IS NOT NULL AND now_us < ev.booked * 1000 + q_interval[i]) THEN
        q_tat[i] := greatest(q_tat[i], now_us) + q_interval[i];
        charged[i] := true;
      END IF;
    END LOOP;
    FOREACH i IN ARRAY ev.rows LOOP
      keep[i] := true;
    END LOOP;
    kept := kept || ev.id;
  END LOOP;
  IF cardinality(r_id) > 0 THEN
    UPDATE events AS e
       SET attempt = e.attempt - 1, lease_token = NULL, lease_expires_at = NULL,
           notified_at = 9223372036854775807
     WHERE e.id = ANY(r_id) AND e.lease_token = ANY(s_token) AND (e.state + 0) = 0;
    INSERT INTO limit_waits (handler, kind, tenant, key, event_id)
    SELECT q_handler[w.at], q_kind[w.at], q_tenant[w.at], q_key[w.at], w.id
      FROM unnest(r_id, r_at) AS w(id, at);
  END IF;
  IF cardinality(d_id) > 0 THEN
    UPDATE events AS e
       SET attempt = e.attempt - 1, lease_token = NULL, lease_expires_at = NULL,
           run_at = d.turn, notified_at = d.turn, rate_turn = d.turn
      FROM unnest(d_id, d_turn) AS d(id, turn)
     WHERE e.id = ANY(d_id) AND e.id = d.id AND e.lease_token = ANY(s_token)
       AND (e.state + 0) = 0;
  END IF;
  IF true = ANY(charged) THEN
    INSERT INTO rate_state AS r (handler, kind, tenant, key, tat)
    SELECT q_handler[c.i], q_kind[c.i], q_tenant[c.i], q_key[c.i], q_tat[c.i]
      FROM generate_subscripts(charged, 1) AS c(i) WHERE charged[c.i]
    ON CONFLICT (handler, kind, tenant, key) DO UPDATE SET tat = excluded.tat;
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(s_booked) AS b WHERE b IS NOT NULL) THEN
    UPDATE events AS e SET rate_turn = NULL
     WHERE e.id = ANY(kept) AND e.rate_turn IS NOT NULL;
  END IF;
  INSERT INTO limit_slots (token, kind, handler, tenant, key, event_id, expires_at)
  SELECT s.token, s.kind, s.handler, s.tenant, s.key, s.id, s.expires
    FROM unnest(s_id, s_kind, s_handler, s_tenant, s_key, s_token, s_expires, s_name, keep)
         AS s(id, kind, handler, tenant, key, token, expires, name, keep)
   WHERE s.keep AND q_room[array_position(q_name, s.name)] IS NOT NULL;
  INSERT INTO limit_counts AS c (handler, kind, tenant, key, held)
  SELECT s.handler, s.kind, s.tenant, s.key, count(*)
    FROM unnest(s_id, s_kind, s_handler, s_tenant, s_key, s_name, keep)
         AS s(id, kind, handler, tenant, key, name, keep)
   WHERE s.keep AND q_room[array_position(q_name, s.name)] IS NOT NULL
   GROUP BY s.handler, s.kind, s.tenant, s.key
  ON CONFLICT (handler, kind, tenant, key) DO UPDATE SET held = c.held + excluded.held;
  RETURN QUERY SELECT * FROM unnest(got) AS g
   WHERE (cardinality(r_id) = 0 OR g.id <> ALL(r_id))
     AND (cardinality(d_id) = 0 OR g.id <> ALL(d_id));
END$function$
;
CREATE OR REPLACE FUNCTION herald.emit(uuid[], text[], text[], text[], bigint[], integer[], text[], text[], bigint[], text[], text[])
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
        created_at, updated_at, leaf, topic, concurrency_key, singleton_key)
     SELECT u.id, u.tenant, u.handler, u.payload, t.run_at, u.max_attempts,
            least(t.run_at, 9223372036854775806), u.key, c.now, c.now,
            CASE WHEN t.run_at > c.now + 10000
                      OR EXISTS (SELECT 1 FROM rules AS r
                                 WHERE r.tenant = u.tenant AND r.handler = u.handler)
                 THEN 0 ELSE c.leaf END,
            u.topic, u.concurrency_key, u.singleton_key
     FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
            AS u(id, tenant, handler, payload, at, max_attempts, key, topic, after_ms,
                 concurrency_key, singleton_key),
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
CREATE OR REPLACE FUNCTION herald.free_slots(uuid[])
 RETURNS TABLE(tenant text, id uuid)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE
  f_kind int2[]; f_handler text[]; f_tenant text[]; f_key text[];
BEGIN
  IF NOT EXISTS (SELECT 1 FROM limit_slots AS t WHERE t.token = ANY($1)) THEN
    RETURN;
  END IF;
  PERFORM set_config('synchronous_commit', 'off', true);
  WITH d AS (DELETE FROM limit_slots AS t WHERE t.token = ANY($1)
             RETURNING t.kind, t.handler, t.tenant, t.key)
  SELECT array_agg(d.kind), array_agg(d.handler), array_agg(d.tenant), array_agg(d.key)
    INTO f_kind, f_handler, f_tenant, f_key FROM d;
  RETURN QUERY SELECT * FROM wake_scopes(f_kind, f_handler, f_tenant, f_key, 1000, true);
END$function$
;
CREATE OR REPLACE FUNCTION herald.inspect(uuid[])
 RETURNS TABLE(now bigint, id uuid, tenant text, handler text, payload text, state smallint, run_at bigint, attempt integer, max_attempts integer, lease_token uuid, lease_expires_at bigint, last_error text, idempotency_key text, created_at bigint, updated_at bigint, topic text, concurrency_key text, rate_turn bigint, blocked boolean, paused boolean, wait_kind smallint, wait_tenant text, wait_key text, wait_running bigint, wait_limit integer)
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
       e.idempotency_key, e.created_at, e.updated_at, e.topic, e.concurrency_key, e.rate_turn,
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'block'),
       EXISTS (SELECT 1 FROM rules AS r WHERE r.tenant = e.tenant
               AND r.handler = e.handler AND r.kind = 'pause'),
       w.kind, w.tenant, w.key,
       (SELECT t.held::bigint FROM limit_counts AS t
        WHERE t.handler = w.handler AND t.kind = w.kind AND t.tenant = w.tenant
          AND t.key = w.key),
       (scope_row(w.kind, w.handler, w.tenant, w.key)).running
     FROM (SELECT floor(date_part('epoch', pg_catalog.now()) * 1000)::bigint AS now) AS c
     LEFT JOIN events AS e ON e.id = ANY($1)
     LEFT JOIN LATERAL (SELECT x.handler, x.kind, x.tenant, x.key FROM limit_waits AS x
                        WHERE x.event_id = e.id AND e.notified_at = 9223372036854775807
                        ORDER BY x.seq DESC LIMIT 1) AS w ON true; END$function$
;
CREATE OR REPLACE FUNCTION herald.lapse_slots(integer)
 RETURNS TABLE(tenant text, id uuid)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$DECLARE
  f_kind int2[]; f_handler text[]; f_tenant text[]; f_key text[];
BEGIN
  WITH d AS (DELETE FROM limit_slots AS t
              WHERE (t.token, t.kind) IN (SELECT x.token, x.kind FROM limit_slots AS x
                                           WHERE x.expires_at <= floor(date_part('epoch', now()) * 1000)::bigint
                                           ORDER BY x.expires_at LIMIT $1)
             RETURNING t.kind, t.handler, t.tenant, t.key)
  SELECT array_agg(d.kind), array_agg(d.handler), array_agg(d.tenant), array_agg(d.key)
    INTO f_kind, f_handler, f_tenant, f_key FROM d;
  IF f_kind IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT * FROM wake_scopes(f_kind, f_handler, f_tenant, f_key, 1000, true);
END$function$
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
  IF EXISTS (SELECT 1 FROM limit_slots AS t WHERE t.token = ANY($3)) THEN
    UPDATE limit_slots AS t
       SET expires_at = (SELECT floor(date_part('epoch', now()) * 1000)::bigint) + $1
     WHERE t.token = ANY($3)
       AND EXISTS (SELECT 1 FROM events AS e
                   WHERE e.id = t.event_id AND e.lease_token = t.token AND e.state = 0);
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
    'idempotency_key, last_error, payload, errors, topic, concurrency_key, rate_turn, singleton_key';
  copied text := 'id, run_at, notified_at, lease_expires_at, created_at, updated_at, '
    'finished_at, attempt, max_attempts, state, 0, lease_token, tenant, handler, '
    'idempotency_key, last_error, payload, errors, topic, concurrency_key, rate_turn, singleton_key';
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
CREATE OR REPLACE FUNCTION herald.scope_lock_key(smallint, text, text, text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$SELECT hashtext($1::text || '/' || $2 || '/' || $3 || '/' || $4)$function$
;
CREATE OR REPLACE FUNCTION herald.scope_row(smallint, text, text, text)
 RETURNS herald.limits
 LANGUAGE sql
 STABLE
 SET search_path TO 'herald', 'pg_catalog'
AS $function$SELECT l.* FROM limits AS l
     WHERE l.handler = $2 AND l.kind = $1
       AND (l.tenant = $3 OR l.tenant = '') AND (l.key = $4 OR l.key = '')
     ORDER BY l.tenant DESC, l.key DESC LIMIT 1$function$
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
CREATE OR REPLACE FUNCTION herald.wake_limit(text, smallint, integer, text, text)
 RETURNS TABLE(tenant text, id uuid, last_tenant text, last_key text)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$#variable_conflict use_column
DECLARE
  w_tenant text[]; w_key text[];
BEGIN
  SELECT array_agg(s.tenant), array_agg(s.key) INTO w_tenant, w_key FROM (
    WITH RECURSIVE s(tenant, key) AS (
      (SELECT x.tenant, x.key FROM limit_waits AS x
        WHERE x.handler = $1 AND x.kind = $2
          AND ($4 IS NULL OR (x.tenant, x.key) > ($4, $5))
        ORDER BY x.tenant, x.key LIMIT 1)
      UNION ALL
      SELECT n.tenant, n.key FROM s CROSS JOIN LATERAL
        (SELECT x.tenant, x.key FROM limit_waits AS x
          WHERE x.handler = $1 AND x.kind = $2 AND (x.tenant, x.key) > (s.tenant, s.key)
          ORDER BY x.tenant, x.key LIMIT 1) AS n)
    SELECT s.tenant, s.key FROM s LIMIT $3) AS s;
  IF w_tenant IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT w.tenant, w.id, NULL::text, NULL::text
    FROM wake_scopes(array_fill($2, ARRAY[cardinality(w_tenant)]),
                     array_fill($1, ARRAY[cardinality(w_tenant)]), w_tenant, w_key, 1000,
                     false) AS w;
  IF cardinality(w_tenant) >= $3 THEN
    RETURN QUERY SELECT NULL::text, NULL::uuid, w_tenant[cardinality(w_tenant)],
                        w_key[cardinality(w_key)];
  END IF;
END$function$
;
CREATE OR REPLACE FUNCTION herald.wake_scope(smallint, text, text, text, integer)
 RETURNS TABLE(tenant text, id uuid)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$#variable_conflict use_column
DECLARE
  want integer := $5;
  asked integer;
  picked uuid[];
  woke uuid[];
  tenants text[];
BEGIN
  WHILE want > 0 LOOP
    asked := want;
    WITH p AS (
        DELETE FROM limit_waits AS w
         WHERE (w.handler, w.kind, w.tenant, w.key, w.seq) IN
               (SELECT x.handler, x.kind, x.tenant, x.key, x.seq FROM limit_waits AS x
                 WHERE x.handler = $2 AND x.kind = $1 AND x.tenant = $3 AND x.key = $4
                 ORDER BY x.seq LIMIT want)
        RETURNING w.event_id)
    SELECT coalesce(array_agg(p.event_id), '{}') INTO picked FROM p;
    EXIT WHEN cardinality(picked) = 0;
    WITH u AS (
      UPDATE events AS e
         SET notified_at = greatest(e.run_at, (SELECT floor(date_part('epoch', now()) * 1000)::bigint))
       WHERE e.id = ANY(ARRAY(SELECT x.id FROM events AS x
                              WHERE x.id = ANY(picked) AND x.state = 0
                                AND x.notified_at = 9223372036854775807
                              FOR UPDATE SKIP LOCKED))
         AND (e.state + 0) = 0
      RETURNING e.id, e.tenant)
    SELECT array_agg(u.id), array_agg(u.tenant) INTO woke, tenants FROM u;
    IF woke IS NOT NULL THEN
      RETURN QUERY SELECT t, i FROM unnest(tenants, woke) AS z(t, i);
      want := want - cardinality(woke);
    END IF;
    EXIT WHEN cardinality(picked) < asked;
  END LOOP;
END$function$
;
CREATE OR REPLACE FUNCTION herald.wake_scopes(smallint[], text[], text[], text[], integer, boolean)
 RETURNS TABLE(tenant text, id uuid)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
 SET search_path TO 'herald', 'pg_catalog'
AS $function$#variable_conflict use_column
DECLARE
  sc record;
  room bigint;
BEGIN
  FOR sc IN SELECT DISTINCT scope_lock_key(s.kind, s.handler, s.tenant, s.key) AS lock_key
              FROM unnest($1, $2, $3, $4) AS s(kind, handler, tenant, key) ORDER BY 1 LOOP
    PERFORM pg_advisory_xact_lock(1751478881, sc.lock_key);
  END LOOP;
  FOR sc IN SELECT s.kind, s.handler, s.tenant, s.key, count(*) AS n
              FROM unnest($1, $2, $3, $4) AS s(kind, handler, tenant, key)
             GROUP BY s.kind, s.handler, s.tenant, s.key LOOP
    IF $6 THEN
      UPDATE limit_counts AS c SET held = greatest(c.held - sc.n, 0)
       WHERE c.handler = sc.handler AND c.kind = sc.kind AND c.tenant = sc.tenant
         AND c.key = sc.key;
    END IF;
    IF EXISTS (SELECT 1 FROM limit_waits AS w
               WHERE w.handler = sc.handler AND w.kind = sc.kind AND w.tenant = sc.tenant
                 AND w.key = sc.key) THEN
      room := coalesce((scope_row(sc.kind, sc.handler, sc.tenant, sc.key)).running, $5)
              - coalesce((SELECT c.held FROM limit_counts AS c
                          WHERE c.handler = sc.handler AND c.kind = sc.kind
                            AND c.tenant = sc.tenant AND c.key = sc.key), 0);
      IF room > 0 THEN
        RETURN QUERY SELECT * FROM wake_scope(sc.kind, sc.handler, sc.tenant, sc.key,
                                              least(room, $5)::integer);
      END IF;
    END IF;
  END LOOP;
END$function$
;

-- meta
INSERT INTO meta VALUES ('baseline', '0.1.0');
INSERT INTO meta VALUES ('format', 'herald event store');
INSERT INTO meta VALUES ('schema_version', '1');
