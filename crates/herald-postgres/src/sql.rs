//! The statements, as text for one schema. Templates name the schema `{s}`,
//! the database's clock `{now}` and the event columns `{cols}`; [`Sql::new`]
//! fills them in once per store.
//!
//! docs/postgres.md shows the plan of each hot and sweep statement on a
//! million stored events (`bench/pg-explain.sh` prints them).

use herald::backend::Finish;

use crate::rows::EVENT_COLUMNS;

/// The database's clock in milliseconds since the Unix epoch: the start of
/// the current transaction (for a single statement, the statement's start).
/// `date_part` (a double) rather than `extract` (a numeric) since it is
/// cheaper and exact to the microsecond for this century.
pub(crate) const NOW_EXPR: &str = "floor(date_part('epoch', now()) * 1000)::bigint";

/// Every hot statement reaches `events` only through the batch's ids on
/// `events_pkey`, so that its plan stays bounded by the batch whatever the
/// statistics say (`tests/plans.rs` checks it). They call the schema's
/// functions (`sql/*.sql`; `migrations/README.md`, "Bounded plans"), which
/// carry their own planner settings.
///
/// The happy path in one statement: for each id, take the lease if the event
/// is pending, due, unleased or expired (by the database's clock), has
/// attempts left, has a handler in `$4`, and no rule matches. Changes only
/// columns that no index covers, so it is a HOT update when the page has
/// room. `$1` tokens (one per id of `$3`, in its order), `$2` lease in ms,
/// `$3` ids (sorted), `$4` handlers,
/// `$5` the tenants the notifications named (a hint: when a rule names one
/// of `$4`, the claim checks the rules once per claim for these tenants and
/// per row for any other; `sql/claim.sql`).
const CLAIM: &str = "SELECT {cols} FROM {s}.claim($1, $2, $3, $4, $5) AS e{nowait}";

/// Events by id with their rules, and the clock (one row with a NULL event
/// when none is found). `$1` ids.
const INSPECT: &str = "SELECT * FROM {s}.inspect($1)";

/// The settle statements share their fence: the event is pending and its
/// lease token is the one given (`IS NOT DISTINCT FROM`, so NULL fences on
/// "no lease"). Each returns the batch positions (`ord`) whose fence held.
/// `$1` ids (sorted), `$2` tokens, `$3` positions.
const SETTLE_DELETE: &str = "SELECT s.ord FROM {s}.settle_delete($1, $2, $3) AS s(ord){nowait}";

const SETTLE_ARCHIVE: &str = "SELECT s.ord FROM {s}.settle_archive($1, $2, $3) AS s(ord){nowait}";

/// `$4` wait in ms, `$5` 1 to give the attempt back, `$6` error (NULL keeps
/// the last one).
const SETTLE_RELEASE: &str =
    "SELECT s.ord FROM {s}.settle_release($1, $2, $3, $4, $5, $6) AS s(ord){nowait}";

/// `$4` error.
const SETTLE_BURY: &str = "SELECT s.ord FROM {s}.settle_bury($1, $2, $3, $4) AS s(ord){nowait}";

/// Added to the statements that commit without waiting for their WAL
/// flush (the claim's by default, the settles' too with
/// [`RunCommits::Unflushed`]): `set_config`'s
/// third argument makes the setting last to the end of the statement's own
/// transaction, so it is in force when that transaction commits and
/// nowhere else. Evaluated once, whichever side of the join the planner
/// puts it on; a statement that returns no row changed no row, so it has
/// nothing to flush either way.
const NOWAIT: &str = ", set_config('synchronous_commit', 'off', true) AS nowait";

/// Which of the run's commits (the claim's, the settle's) wait for their
/// WAL flush.
///
/// Emits, renewals, rules and the sweep always commit as the connection
/// is configured: an emit's flush is a promise to its caller. A claim or
/// settle whose unflushed commit a crash of the PostgreSQL server loses
/// leaves the event as it was before: it is claimed and run again, a
/// duplicate run that at-least-once delivery already allows, never a lost
/// event. docs/adr/0014-emit-path-defaults.md says what each choice
/// saves and costs, and why claims skip the flush by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunCommits {
    /// Claims and settles commit as the connection is configured
    /// (PostgreSQL's default waits for the flush): a crash of the
    /// PostgreSQL server loses no claim or settle that returned.
    Flushed,
    /// The default: claims commit with `synchronous_commit = off`, settles
    /// as the connection is configured. A claim returns before the WAL
    /// writer flushes it (at most three `wal_writer_delay`s later, 600 ms
    /// by default, and at the next flushed commit of any session, which
    /// flushes everything before it), which takes a flush wait off every
    /// event's way from emit to start. A crash of the PostgreSQL server can
    /// lose a claim whose handler already started: the event is pending
    /// again, the running handler loses its lease at its next renewal, and
    /// the event runs again. A finished run stays finished.
    #[default]
    UnflushedClaims,
    /// Claims and settles commit with `synchronous_commit = off`: the
    /// settles' flushes leave the WAL to the WAL writer too, and a crash
    /// can also lose settles of its last moments, whose events then run
    /// again once their leases lapse.
    Unflushed,
}

impl RunCommits {
    /// Every choice, from the most flushes to the fewest.
    pub const ALL: [RunCommits; 3] = [
        RunCommits::Flushed,
        RunCommits::UnflushedClaims,
        RunCommits::Unflushed,
    ];

    /// The name `herald serve`'s `pg_run_commits` takes.
    pub fn name(self) -> &'static str {
        match self {
            RunCommits::Flushed => "flushed",
            RunCommits::UnflushedClaims => "unflushed-claims",
            RunCommits::Unflushed => "unflushed",
        }
    }

    /// The suffix of the claim statement, and of the settle statements.
    fn suffixes(self) -> (&'static str, &'static str) {
        match self {
            RunCommits::Flushed => ("", ""),
            RunCommits::UnflushedClaims => (NOWAIT, ""),
            RunCommits::Unflushed => (NOWAIT, NOWAIT),
        }
    }
}

impl std::str::FromStr for RunCommits {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(runs) = RunCommits::ALL.into_iter().find(|r| r.name() == s) {
            return Ok(runs);
        }
        let names: Vec<String> = RunCommits::ALL
            .iter()
            .map(|r| {
                let default = if *r == RunCommits::default() {
                    " (the default)"
                } else {
                    ""
                };
                format!("{:?}{default}", r.name())
            })
            .collect();
        Err(format!(
            "{s:?} is not a way to commit runs: write one of {}",
            names.join(", ")
        ))
    }
}

/// Extends held leases. `$1` lease in ms, `$2` ids, `$3` tokens, `$4`
/// positions. Another HOT update.
const RENEW: &str = "SELECT * FROM {s}.renew($1, $2, $3, $4)";

/// New events, into the ring's filling leaf; conflicts (an id already
/// stored in any leaf, or a live event with the same idempotency key)
/// insert nothing. Each event's `run_at` is `$5` (absolute, by the
/// database's clock) or, where that is NULL, the database's now plus `$9`
/// ms; `$10` the concurrency keys, `$11` the singleton keys. `notified_at` is `run_at` (the caller publishes with that delay),
/// kept below the parked mark. `sql/emit.sql` says how an id stays unique
/// across the leaves.
const EMIT: &str = "SELECT * FROM {s}.emit($1::uuid[], $2::text[], $3::text[], $4::text[], \
     $5::int8[], $6::int4[], $7::text[], $8::text[], $9::int8[], $10::text[], $11::text[])";

/// [`EMIT`] for a batch with idempotency keys: the same insert, and in the
/// same statement a key row for each keyed event it created, naming it
/// (`idempotency_keys`). A key that has a row already keeps it (two emits that
/// raced past the look-up below: the first one's row stays).
const EMIT_KEYED: &str = "WITH ins AS (SELECT * FROM {s}.emit($1::uuid[], $2::text[], \
     $3::text[], $4::text[], $5::int8[], $6::int4[], $7::text[], $8::text[], \
     $9::int8[], $10::text[], $11::text[]) AS i(id)), \
     keys AS (INSERT INTO {s}.idempotency_keys (tenant, handler, key, event_id, stored_at) \
     SELECT u.tenant, u.handler, u.key, u.id, {now} \
     FROM unnest($1::uuid[], $2::text[], $3::text[], $7::text[]) AS u(id, tenant, handler, key) \
     WHERE u.key IS NOT NULL AND u.id IN (SELECT ins.id FROM ins) \
     ON CONFLICT DO NOTHING) \
     SELECT ins.id FROM ins";

/// The events stored idempotency keys name, one primary-key probe per key:
/// `$1` tenants, `$2` handlers, `$3` keys, `$4` positions.
const STORED_KEYS: &str = "SELECT u.pos, k.event_id \
     FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[]) AS u(tenant, handler, key, pos) \
     JOIN {s}.idempotency_keys AS k \
       ON k.tenant = u.tenant AND k.handler = u.handler AND k.key = u.key";

/// [`herald::backend::Reconciliation::purge_keys`]: up to `$2` keys stored more than `$1` ms
/// before the database's now, oldest first. Whether a live event holds the key is one probe of the
/// live-key index. A key whose event is live, or was not yet seen gone,
/// is kept: `stored_at` reset to now, `gone` set to whether its event is
/// no longer live. A key already seen gone a window ago is deleted.
/// Returns the number deleted.
const PURGE_KEYS: &str = "WITH due AS (\
       SELECT k.tenant, k.handler, k.key, k.gone, EXISTS (SELECT 1 FROM {s}.events AS e \
         WHERE e.tenant = k.tenant AND e.handler = k.handler \
           AND e.idempotency_key = k.key AND e.state = 0) AS live \
       FROM {s}.idempotency_keys AS k WHERE k.stored_at < {now} - $1 \
       ORDER BY k.stored_at LIMIT $2 FOR UPDATE OF k SKIP LOCKED), \
     kept AS (UPDATE {s}.idempotency_keys AS k SET stored_at = {now}, gone = NOT due.live \
       FROM due \
       WHERE (due.live OR NOT due.gone) AND k.tenant = due.tenant \
         AND k.handler = due.handler AND k.key = due.key RETURNING 1), \
     gone AS (DELETE FROM {s}.idempotency_keys AS k USING due \
       WHERE NOT due.live AND due.gone AND k.tenant = due.tenant \
         AND k.handler = due.handler AND k.key = due.key RETURNING 1) \
     SELECT count(*) FROM gone";

/// The live events holding idempotency keys, one index probe per key. `$4`
/// positions.
const EXISTING_KEYS: &str = "SELECT * FROM {s}.existing_keys($1, $2, $3, $4)";

const EXISTING_IDS: &str = "SELECT id FROM {s}.events WHERE id = ANY($1)";

/// The statements below that touch events call the schema's functions too
/// (`sql/rules.sql`, `sql/sweep.sql`), for the same reasons: bounded plans, rows taken in id
/// order.
///
/// One page of a handler's pending events, stamped notified: `$1` tenant,
/// `$2` handler, `$3` page size, `$4` the cursor (the `_AFTER` form).
const RENOTIFY: &str = "SELECT * FROM {s}.renotify($1, $2, $3)";

const RENOTIFY_AFTER: &str = "SELECT * FROM {s}.renotify_after($1, $2, $3, $4)";

/// The sweep's dead-worker source: pending, due events whose lease expired
/// after their last notification. It walks `events_to_notify` over the
/// pass's quiet window only, `cutoff <= notified_at < now`: an event
/// notified before the cutoff is the quiet source's. (No index on the lease
/// columns: see docs/postgres.md.) `$1` now, `$2` the cutoff, `$3`/`$4`
/// the cursor, `$5` the chunk size. The cursor starts at the cutoff too
/// (just below it): the index scan starts at whichever lower bound the
/// btree picks, and the row comparison alone would make it the index's
/// start.
const SWEEP_EXPIRED: &str = "SELECT * FROM {s}.sweep_expired($1, $2, $3, $4, $5)";

/// The sweep's quiet source: pending, due events not notified since the
/// cutoff, without a live lease. Same parameters.
const SWEEP_QUIET: &str = "SELECT * FROM {s}.sweep_quiet($1, $2, $3, $4, $5)";

/// Stamps returned events notified: `$1` now, `$2` ids.
const STAMP: &str = "SELECT {s}.sweep_stamp($1, $2)";

/// Parks events held by a rule: `$1` ids.
const PARK: &str = "SELECT {s}.sweep_park($1)";

const NOTE_PARKED: &str = "INSERT INTO {s}.parked (tenant, handler) \
     SELECT DISTINCT t, h FROM unnest($1::text[], $2::text[]) AS p(t, h) \
     ON CONFLICT DO NOTHING";

const ORPHANS: &str = "SELECT p.tenant, p.handler FROM {s}.parked AS p \
     WHERE NOT EXISTS (SELECT 1 FROM {s}.rules AS r \
                       WHERE r.tenant = p.tenant AND r.handler = p.handler)";

/// Un-parks up to `$3` parked events of one handler, found through
/// `events_parked` in id order and updated by primary key: `notified_at =
/// run_at`, so the quiet source returns them.
const UNPARK: &str = "SELECT {s}.sweep_unpark($1, $2, $3)";

const FORGET_PARKED: &str = "DELETE FROM {s}.parked WHERE tenant = $1 AND handler = $2";

/// Takes or keeps the leader row; answers whether `$2` leads and how many
/// milliseconds the row's lease has left (the current holder's when not).
/// The outer read sees the row as it was before the statement, which is
/// the holder's row exactly when the upsert changed nothing.
const LEAD: &str = "WITH taken AS (INSERT INTO {s}.leaders AS l (role, holder, expires_at) \
     VALUES ($1, $2, {now} + $3) \
     ON CONFLICT (role) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
     WHERE l.holder = excluded.holder OR l.expires_at <= {now} \
     RETURNING expires_at) \
     SELECT EXISTS (SELECT 1 FROM taken), \
            greatest(0, coalesce((SELECT expires_at FROM taken), \
                                 (SELECT expires_at FROM {s}.leaders WHERE role = $1), {now}) - {now})";

const RESIGN: &str = "DELETE FROM {s}.leaders WHERE role = $1 AND holder = $2";

/// Old dead or done events through `events_finished`: `$1` state, `$2`
/// the retention in ms (finished more than that before the database's
/// now), `$3` limit.
const PURGE: &str = "DELETE FROM {s}.events WHERE id IN (SELECT id FROM {s}.events \
     WHERE state = $1 AND finished_at < {now} - $2 LIMIT $3)";

const GET: &str = "SELECT {cols} FROM {s}.events AS e WHERE e.id = $1";

/// The error history as JSON text (`NULL` when there is none). `$1` id.
const HISTORY: &str = "SELECT e.errors::text FROM {s}.events AS e WHERE e.id = $1";

/// The `(tenant, handler)` pairs with events, by a skip scan of
/// events_by_handler (one index seek per pair). `$1` the tenant to start
/// at ('' for all).
const COUNT_PAIRS: &str = "WITH RECURSIVE p AS ( \
       (SELECT tenant, handler FROM {s}.events WHERE (tenant, handler) > ($1, '') \
        ORDER BY tenant, handler LIMIT 1) \
       UNION ALL \
       SELECT n.tenant, n.handler FROM p, LATERAL ( \
         SELECT e.tenant, e.handler FROM {s}.events AS e \
         WHERE (e.tenant, e.handler) > (p.tenant, p.handler) \
         ORDER BY e.tenant, e.handler LIMIT 1) AS n) \
     SELECT tenant, handler FROM p";

/// [`COUNT_PAIRS`] of one tenant: the scan stops at its last handler.
/// `$1` tenant.
const COUNT_PAIRS_OF: &str = "WITH RECURSIVE p AS ( \
       (SELECT tenant, handler FROM {s}.events WHERE tenant = $1 \
        ORDER BY tenant, handler LIMIT 1) \
       UNION ALL \
       SELECT n.tenant, n.handler FROM p, LATERAL ( \
         SELECT e.tenant, e.handler FROM {s}.events AS e \
         WHERE e.tenant = $1 AND e.handler > p.handler \
         ORDER BY e.handler LIMIT 1) AS n) \
     SELECT tenant, handler FROM p";

/// One pair's counts: per state (pending, dead, done), at most `$3`
/// entries of events_by_handler counted, with the first, the `$3`-th and
/// the last id for the extrapolation beyond; whether a rule holds it; and
/// up to `$4` of its pending events split into running and delayed (by the
/// database's clock). `$1` tenant, `$2` handler.
const COUNT_PAIR: &str = "SELECT p0.*, p1.*, p2.*, \
       EXISTS (SELECT 1 FROM {s}.rules WHERE tenant = $1 AND handler = $2), \
       x.read, x.running, x.delayed \
     FROM {capped0} AS p0, {capped1} AS p1, {capped2} AS p2, \
          (SELECT count(*) AS read, \
             count(*) FILTER (WHERE lease_expires_at > c.now) AS running, \
             count(*) FILTER (WHERE (lease_expires_at IS NULL OR lease_expires_at <= c.now) \
                              AND run_at > c.now) AS delayed \
           FROM (SELECT {nowexpr} AS now) AS c, \
                LATERAL (SELECT run_at, lease_expires_at FROM {s}.events \
                         WHERE tenant = $1 AND handler = $2 AND state = 0 \
                         ORDER BY id_key LIMIT $4) AS s \
          ) AS x";

/// One state's capped count in [`COUNT_PAIR`], one read of at most `$3`
/// index entries: the `$3`-th id and, only when there is none, the exact
/// count below it; with the first and the last id.
const CAPPED: &str = "(SELECT CASE WHEN c.at_cap IS NULL \
           THEN (SELECT count(*) FROM {s}.events \
                 WHERE tenant = $1 AND handler = $2 AND state = {state}) \
           ELSE $3 END AS counted, \
         (SELECT id_key FROM {s}.events WHERE tenant = $1 AND handler = $2 AND state = {state} \
           ORDER BY id_key LIMIT 1) AS first, \
         c.at_cap, \
         (SELECT id_key FROM {s}.events WHERE tenant = $1 AND handler = $2 AND state = {state} \
           ORDER BY id_key DESC LIMIT 1) AS last \
       FROM (SELECT (SELECT id_key FROM {s}.events WHERE tenant = $1 AND handler = $2 \
                     AND state = {state} ORDER BY id_key OFFSET $3 - 1 LIMIT 1) AS at_cap) AS c)";

const REVIVE_CLASH: &str = "SELECT live.id FROM {s}.events AS dead JOIN {s}.events AS live \
       ON live.tenant = dead.tenant AND live.handler = dead.handler \
      AND live.idempotency_key = dead.idempotency_key AND live.state = 0 \
     WHERE dead.id = $1 AND dead.state = 1";

const REVIVE: &str = "UPDATE {s}.events SET state = 0, attempt = 0, run_at = {now}, \
       notified_at = {now}, lease_token = NULL, lease_expires_at = NULL, finished_at = NULL, \
       updated_at = {now} \
     WHERE id = $1 AND state = 1 RETURNING tenant";

/// Deletes an event that is not running (no live lease by the database's clock).
const DELETE: &str = "DELETE FROM {s}.events WHERE id = $1 \
     AND NOT (state = 0 AND lease_expires_at IS NOT NULL AND lease_expires_at > {now})";

const ADD_RULE: &str = "INSERT INTO {s}.rules (tenant, handler, kind, created_at) \
     VALUES ($1, $2, $3, {now}) ON CONFLICT DO NOTHING";

const REMOVE_RULE: &str = "DELETE FROM {s}.rules WHERE tenant = $1 AND handler = $2 AND kind = $3";

const RULES_FOR: &str = "SELECT kind FROM {s}.rules WHERE tenant = $1 AND handler = $2";

const RULES: &str = "SELECT tenant, handler, kind FROM {s}.rules ORDER BY tenant, handler, kind";

const NOW: &str = "SELECT {nowexpr}";

/// How a settle ends a run: one statement per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettleKind {
    Delete,
    Archive,
    Release,
    Bury,
}

impl SettleKind {
    /// Every kind, in the order a batch's statements run.
    pub(crate) const ALL: [SettleKind; 4] = [
        SettleKind::Delete,
        SettleKind::Archive,
        SettleKind::Release,
        SettleKind::Bury,
    ];

    /// The kind of `finish`.
    pub(crate) fn of(finish: &Finish) -> Self {
        match finish {
            Finish::Delete => SettleKind::Delete,
            Finish::Archive => SettleKind::Archive,
            Finish::Release { .. } => SettleKind::Release,
            Finish::Bury { .. } => SettleKind::Bury,
        }
    }
}

/// The ring's leaves and the database's clock.
const RING: &str = "SELECT leaf, phase, since, {nowexpr} AS now FROM {s}.ring ORDER BY leaf";

/// `$1` the filling leaf, `$2` the empty one to fill next.
const RING_FLIP: &str = "SELECT {s}.ring_flip($1, $2)";

/// `$1` a draining leaf, `$2` how many events may be moved under the leaf's
/// lock, `$3` whether to move that many of a leaf that holds more: the
/// events moved to events_cold, those dropped as copies, and whether the
/// leaf is empty now; no row if it was not draining or not yet drained.
const RING_RETIRE: &str = "SELECT * FROM {s}.ring_retire($1, $2, $3)";

/// Every statement, for one schema.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) schema: String,
    pub(crate) claim: String,
    pub(crate) inspect: String,
    pub(crate) settle_delete: String,
    pub(crate) settle_archive: String,
    pub(crate) settle_release: String,
    pub(crate) settle_bury: String,
    pub(crate) renew: String,
    pub(crate) emit: String,
    pub(crate) emit_keyed: String,
    pub(crate) stored_keys: String,
    pub(crate) purge_keys: String,
    pub(crate) existing_keys: String,
    pub(crate) existing_ids: String,
    pub(crate) renotify: String,
    pub(crate) renotify_after: String,
    pub(crate) sweep_expired: String,
    pub(crate) sweep_quiet: String,
    pub(crate) stamp: String,
    pub(crate) park: String,
    pub(crate) note_parked: String,
    pub(crate) orphans: String,
    pub(crate) unpark: String,
    pub(crate) forget_parked: String,
    pub(crate) lead: String,
    pub(crate) resign: String,
    pub(crate) purge: String,
    pub(crate) get: String,
    pub(crate) history: String,
    pub(crate) count_pairs: String,
    pub(crate) count_pairs_of: String,
    pub(crate) count_pair: String,
    pub(crate) revive_clash: String,
    pub(crate) revive: String,
    pub(crate) delete: String,
    pub(crate) add_rule: String,
    pub(crate) remove_rule: String,
    pub(crate) rules_for: String,
    pub(crate) rules: String,
    pub(crate) subscribe: String,
    pub(crate) unsubscribe: String,
    pub(crate) subscribers: String,
    pub(crate) subscriptions: String,
    pub(crate) now: String,
    pub(crate) ring: String,
    pub(crate) ring_flip: String,
    pub(crate) ring_retire: String,
    pub(crate) free_slots: String,
}

impl Sql {
    /// The statements for the schema whose quoted name is `quoted`, with
    /// claims and settles committing as `runs` says.
    pub(crate) fn new(quoted: &str, runs: RunCommits) -> Sql {
        let (claim, settle) = runs.suffixes();
        let f = |t: &str| fill(t, quoted);
        let settle = |t: &str| fill(&t.replace("{nowait}", settle), quoted);
        Sql {
            schema: quoted.to_string(),
            claim: fill(&CLAIM.replace("{nowait}", claim), quoted),
            inspect: f(INSPECT),
            settle_delete: settle(SETTLE_DELETE),
            settle_archive: settle(SETTLE_ARCHIVE),
            settle_release: settle(SETTLE_RELEASE),
            settle_bury: settle(SETTLE_BURY),
            renew: f(RENEW),
            emit: f(EMIT),
            emit_keyed: f(EMIT_KEYED),
            stored_keys: f(STORED_KEYS),
            purge_keys: f(PURGE_KEYS),
            existing_keys: f(EXISTING_KEYS),
            existing_ids: f(EXISTING_IDS),
            renotify: f(RENOTIFY),
            renotify_after: f(RENOTIFY_AFTER),
            sweep_expired: f(SWEEP_EXPIRED),
            sweep_quiet: f(SWEEP_QUIET),
            stamp: f(STAMP),
            park: f(PARK),
            note_parked: f(NOTE_PARKED),
            orphans: f(ORPHANS),
            unpark: f(UNPARK),
            forget_parked: f(FORGET_PARKED),
            lead: f(LEAD),
            resign: f(RESIGN),
            purge: f(PURGE),
            get: f(GET),
            history: f(HISTORY),
            count_pairs: f(COUNT_PAIRS),
            count_pairs_of: f(COUNT_PAIRS_OF),
            count_pair: f(&COUNT_PAIR
                .replace("{capped0}", &CAPPED.replace("{state}", "0"))
                .replace("{capped1}", &CAPPED.replace("{state}", "1"))
                .replace("{capped2}", &CAPPED.replace("{state}", "2"))),
            revive_clash: f(REVIVE_CLASH),
            revive: f(REVIVE),
            delete: f(DELETE),
            add_rule: f(ADD_RULE),
            remove_rule: f(REMOVE_RULE),
            rules_for: f(RULES_FOR),
            rules: f(RULES),
            subscribe: f(crate::topics::SUBSCRIBE),
            unsubscribe: f(crate::topics::UNSUBSCRIBE),
            subscribers: f(crate::topics::SUBSCRIBERS),
            subscriptions: f(crate::topics::SUBSCRIPTIONS),
            now: f(NOW),
            ring: f(RING),
            ring_flip: f(RING_FLIP),
            ring_retire: f(RING_RETIRE),
            free_slots: f(crate::limits::FREE_SLOTS),
        }
    }

    /// The statements by name, for [`crate::PgStore::statements`].
    pub(crate) fn named(&self) -> Vec<(&'static str, String)> {
        vec![
            ("claim", self.claim.clone()),
            ("inspect", self.inspect.clone()),
            ("settle_delete", self.settle_delete.clone()),
            ("settle_archive", self.settle_archive.clone()),
            ("settle_release", self.settle_release.clone()),
            ("settle_bury", self.settle_bury.clone()),
            ("renew", self.renew.clone()),
            ("emit", self.emit.clone()),
            ("subscribers", self.subscribers.clone()),
            ("existing_keys", self.existing_keys.clone()),
            ("renotify", self.renotify.clone()),
            ("renotify_after", self.renotify_after.clone()),
            ("sweep_expired", self.sweep_expired.clone()),
            ("sweep_quiet", self.sweep_quiet.clone()),
            ("sweep_stamp", self.stamp.clone()),
            ("sweep_park", self.park.clone()),
            ("sweep_orphans", self.orphans.clone()),
            ("sweep_unpark", self.unpark.clone()),
            ("lead", self.lead.clone()),
            ("purge", self.purge.clone()),
            ("get", self.get.clone()),
            ("delete", self.delete.clone()),
            ("ring", self.ring.clone()),
            ("ring_flip", self.ring_flip.clone()),
            ("ring_retire", self.ring_retire.clone()),
        ]
    }

    /// The statement that ends runs of `kind`.
    pub(crate) fn settle(&self, kind: SettleKind) -> &str {
        match kind {
            SettleKind::Delete => &self.settle_delete,
            SettleKind::Archive => &self.settle_archive,
            SettleKind::Release => &self.settle_release,
            SettleKind::Bury => &self.settle_bury,
        }
    }

    /// Fills in a template for this schema (for statements built at run
    /// time, such as listings).
    pub(crate) fn fill(&self, template: &str) -> String {
        fill(template, &self.schema)
    }
}

fn fill(template: &str, quoted: &str) -> String {
    template
        .replace("{s}", quoted)
        .replace("{cols}", EVENT_COLUMNS)
        .replace("{nowexpr}", NOW_EXPR)
        .replace("{now}", &format!("(SELECT {NOW_EXPR})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled() {
        let sql = Sql::new("\"x\"", RunCommits::Unflushed);
        for s in [
            &sql.claim,
            &sql.inspect,
            &sql.settle_release,
            &sql.sweep_quiet,
            &sql.lead,
        ] {
            assert!(!s.contains('{'), "{s}");
            assert!(s.contains("\"x\"."), "{s}");
        }
    }

    #[test]
    fn only_claims_and_settles_skip_the_flush() {
        let skips = |runs: RunCommits, name: &str| match runs {
            RunCommits::Flushed => false,
            RunCommits::UnflushedClaims => name == "claim",
            RunCommits::Unflushed => name == "claim" || name.starts_with("settle_"),
        };
        for runs in RunCommits::ALL {
            for (name, s) in Sql::new("\"x\"", runs).named() {
                assert!(!s.contains("{nowait}"), "{name}: {s}");
                assert_eq!(
                    s.contains("synchronous_commit"),
                    skips(runs, name),
                    "{runs:?} {name}: {s}"
                );
            }
        }
    }

    #[test]
    fn run_commits_read_their_names_and_refuse_others() {
        for runs in RunCommits::ALL {
            assert_eq!(runs.name().parse::<RunCommits>(), Ok(runs));
        }
        assert_eq!(RunCommits::default(), RunCommits::UnflushedClaims);
        let refused = "true".parse::<RunCommits>().unwrap_err();
        assert!(
            refused.contains("\"true\" is not a way to commit runs"),
            "{refused}"
        );
    }
}
