//! herald's distributed store: PostgreSQL 15+.
//!
//! [`PgStore`] implements [`herald::Store`] on a connection pool (sqlx).
//! Everything lives in herald's own schema (`herald` by default), created
//! and upgraded by [`migrate`] (the `herald migrate` command); connecting
//! checks the schema's version and says which command to run when it does
//! not match.
//!
//! Every hot-path call is one statement on a batch, looked up by primary
//! key: a claim is one conditional `UPDATE … WHERE id = ANY($ids) …
//! RETURNING`, a batch of completions one `DELETE … USING unnest(…)` fenced
//! by the lease tokens. Lease expiry and `run_at` are judged by the
//! database's clock (`now()`). No transaction, row lock or advisory lock is
//! held while a handler runs: each call is one statement or one short
//! transaction. `docs/postgres.md` (at the repository root) describes the schema, the
//! indexes and the plans.
//!
//! ```no_run
//! # async fn demo() -> Result<(), herald::StoreError> {
//! use herald::Store;
//! herald_postgres::migrate("postgres://postgres@127.0.0.1/app", "herald").await?;
//! let store = herald_postgres::PgStore::connect("postgres://postgres@127.0.0.1/app").await?;
//! let counts = store.counts(&herald::CountsQuery::all()).await?;
//! # Ok(()) }
//! ```
//!
//! Transactional emit: store events inside the application's own
//! transaction with [`PgStore::emit_in`], commit, then publish their
//! notifications with [`herald::Client::notify_emitted`]. If the process dies
//! between the commit and the publish, the reconciler notifies them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod rows;
mod schema;
mod sql;
#[cfg(feature = "testing")]
pub mod testing;

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald::store::{
    CappedCount, CountsQuery, EventFilter, Finish, HandlerCounts, Inspected, Inspection, LeaseRef,
    PendingSample, Scheduled, Settle, StoreResult, SweepPage, SweepPass,
};
use herald::sweep::{Candidate, Source, Step, Sweep, Writes};
use herald::{
    AttemptError, Emitted, Event, EventId, EventState, Leadership, LeaseToken, Millis, NewEvent,
    Notification, Rule, RuleKind, RuleMatch, Store, StoreError,
};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, Row};
use uuid::Uuid;

use crate::rows::{event, event_row, Ctx, DbError, EVENT_COLUMN_COUNT};
use crate::schema::SchemaName;
use crate::sql::{SettleKind, Sql};

pub use crate::schema::{SchemaNameError, DEFAULT_SCHEMA, SCHEMA_VERSION};

/// herald's store on PostgreSQL. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    schema: Arc<SchemaName>,
    sql: Arc<Sql>,
    location: Arc<str>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.location)
            .field("schema", &self.schema.name)
            .finish_non_exhaustive()
    }
}

/// Applies herald's migrations to `schema` in the database at `url`,
/// creating the schema if needed: the `herald migrate` command. Safe to run
/// again, and from several processes at once. Returns the schema version
/// before and after.
///
/// # Errors
///
/// [`StoreError::Open`] if the database can't be reached or a migration
/// fails, [`StoreError::NotHerald`] if the schema holds someone else's
/// tables, [`StoreError::TooNew`] if a newer herald migrated it.
pub async fn migrate(url: &str, schema: &str) -> StoreResult<(i64, i64)> {
    let location = schema::redact(url);
    let name = schema_name(schema, &location)?;
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| open_error(&location, &e))?;
    let out = schema::migrate(&mut conn, &name, &location).await;
    let _ = conn.close().await;
    out
}

fn open_error(location: &str, e: &sqlx::Error) -> StoreError {
    StoreError::Open {
        location: location.to_string(),
        reason: e.to_string(),
    }
}

fn schema_name(schema: &str, location: &str) -> StoreResult<SchemaName> {
    SchemaName::new(schema).map_err(|e| StoreError::Open {
        location: location.to_string(),
        reason: e.to_string(),
    })
}

/// A `Duration` in milliseconds for SQL, capped at a century so that adding
/// it to a time can neither overflow nor reach the parked mark.
fn ms(d: Duration) -> i64 {
    const CENTURY_MS: u128 = 100 * 365 * 24 * 3600 * 1000;
    d.as_millis().min(CENTURY_MS) as i64
}

fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn uuids(ids: &[EventId]) -> Vec<Uuid> {
    ids.iter().map(|id| id.0).collect()
}

/// `max_attempts` as stored (an `integer`): values beyond `i32::MAX` are
/// stored as `i32::MAX`, which is as good as unlimited.
fn max_attempts(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Results inside the store.
type DbResult<T> = Result<T, DbError>;

/// Runs `attempt` again when it failed transiently (a deadlock victim or a
/// serialization failure: the statement or transaction wrote nothing), up
/// to four times in all. Concurrent batches that write overlapping rows
/// (an unpause re-notifying events that workers are claiming) may lock
/// them in different orders; PostgreSQL then cancels one statement.
async fn retry<T, F, Fut>(op: &'static str, mut attempt: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = DbResult<T>>,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(e) if e.transient() && tries < 4 => {
                tracing::debug!(op, error = %e, tries, "herald-postgres: transient failure, trying again");
                tries += 1;
                let pause = Duration::from_millis(rand_millis(5 * tries));
                tokio::time::sleep(pause).await;
            }
            other => return other.map_err(StoreError::from),
        }
    }
}

/// Tries of an emit whose connection was lost, and the pause before the
/// second: it doubles after each try (100, 200, 400, 800, 1600 ms, each
/// ±25%), about 3.1 s in all before [`StoreError::Unavailable`].
/// docs/postgres.md documents it.
pub const EMIT_TRIES: u32 = 6;
/// The pause after an emit's first lost connection; see [`EMIT_TRIES`].
pub const EMIT_FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The pause before try `tries + 1` of an emit (`tries` from 1), with
/// `jitter` in `[0, 1)` spreading it over ±25%.
fn emit_pause(tries: u32, jitter: f64) -> Duration {
    let base = EMIT_FIRST_PAUSE * 2u32.pow(tries.saturating_sub(1).min(16));
    base.mul_f64(0.75 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// What a retried emit returns: an event found under its own id was
/// stored by an earlier try of this same call (its ids are fresh), so it
/// counts as created, and its notification is published. A repeat of an
/// older emit would be notified twice, which is harmless.
fn after_retry(events: &[NewEvent], emitted: Vec<Emitted>) -> Vec<Emitted> {
    events
        .iter()
        .zip(emitted)
        .map(|(e, out)| match out {
            Emitted::Existing(id) if id == e.id => Emitted::Created(id),
            other => other,
        })
        .collect()
}

/// A small pseudo-random pause in `[0, max)` ms (no need for a real RNG).
fn rand_millis(max: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos() as u64;
    nanos % max.max(1)
}

fn rule_kind(kind: &str, op: &str) -> StoreResult<RuleKind> {
    RuleKind::parse(kind)
        .ok_or_else(|| StoreError::backend(op, format!("unknown rule kind {kind}")))
}

impl PgStore {
    /// Connects to the database at `url` and uses herald's schema `herald`,
    /// with sqlx's default pool (10 connections), waiting up to 10 s for the
    /// server.
    ///
    /// # Errors
    ///
    /// [`StoreError::Open`] if the database can't be reached or the schema
    /// is not migrated to this build's version (the message says to run
    /// `herald migrate`), [`StoreError::NotHerald`] if the schema holds
    /// someone else's tables, [`StoreError::TooNew`] if a newer herald
    /// migrated it.
    pub async fn connect(url: &str) -> StoreResult<PgStore> {
        let location = schema::redact(url);
        let options: PgConnectOptions = url.parse().map_err(|e| open_error(&location, &e))?;
        let pool = PgPoolOptions::new().acquire_timeout(Duration::from_secs(10));
        Self::connect_with(pool, options, DEFAULT_SCHEMA).await
    }

    /// Connects with explicit pool and connection options, using `schema`
    /// for herald's tables. Checks the schema like [`PgStore::connect`].
    /// The connections get [`tune`]'s settings.
    pub async fn connect_with(
        pool: PgPoolOptions,
        options: PgConnectOptions,
        schema: &str,
    ) -> StoreResult<PgStore> {
        let location = describe(&options);
        let pool = pool
            .connect_with(options)
            .await
            .map_err(|e| open_error(&location, &e))?;
        Self::from_pool(pool, schema).await
    }

    /// Uses an existing pool (for example the application's own, so that
    /// [`PgStore::emit_in`] shares its transactions). Checks the schema like
    /// [`PgStore::connect`]. herald sets nothing on the pool's connections,
    /// so the application's own transactions run as configured.
    pub async fn from_pool(pool: PgPool, schema: &str) -> StoreResult<PgStore> {
        let store = Self::from_pool_unchecked(pool, schema)?;
        store.check_schema().await?;
        Ok(store)
    }

    /// Uses an existing pool without looking at the schema: for
    /// [`PgStore::migrate`] before first use. Every other call fails until
    /// the schema is migrated.
    pub fn from_pool_unchecked(pool: PgPool, schema: &str) -> StoreResult<PgStore> {
        let location = describe(&pool.connect_options());
        let name = schema_name(schema, &location)?;
        Ok(PgStore {
            sql: Arc::new(Sql::new(&name.quoted)),
            schema: Arc::new(name),
            location: location.into(),
            pool,
        })
    }

    /// Applies pending migrations to this store's schema, creating it if
    /// needed (see [`migrate`]). Returns the versions before and after.
    pub async fn migrate(&self) -> StoreResult<(i64, i64)> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| open_error(&self.location, &e))?;
        schema::migrate(&mut conn, &self.schema, &self.location).await
    }

    /// Checks that the schema is herald's, at this build's version.
    pub async fn check_schema(&self) -> StoreResult<()> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| open_error(&self.location, &e))?;
        schema::check(&mut conn, &self.schema, &self.location).await
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// herald's schema name, as given.
    pub fn schema(&self) -> &str {
        &self.schema.name
    }

    /// The text of the statements this store runs, by name (`claim`,
    /// `settle_delete`, `sweep_quiet`, …), with `$n` parameters: for
    /// `EXPLAIN` and for finding them in `pg_stat_statements`.
    /// `bench/pg-explain.sh` prints their plans on a million events.
    pub fn statements(&self) -> Vec<(&'static str, String)> {
        self.sql.named()
    }

    /// Stores events inside the caller's transaction (or on any connection):
    /// the same as [`Store::emit`], but nothing is visible, and nothing will
    /// run, unless the caller commits. After the commit, publish with
    /// [`herald::Client::notify_emitted`]; if that never happens (a crash
    /// in between), the reconciler notifies them after its quiet period.
    ///
    /// ```no_run
    /// # async fn demo(store: herald_postgres::PgStore, client: herald::Client,
    /// #               batch: Vec<herald::EmitRequest>) -> Result<(), Box<dyn std::error::Error>> {
    /// let events = client.prepare(batch)?;
    /// let mut tx = store.pool().begin().await?;
    /// // ... the application's own writes on `tx` ...
    /// let emitted = store.emit_in(&mut tx, &events).await?;
    /// tx.commit().await?;
    /// client.notify_emitted(&events, &emitted).await;
    /// # Ok(()) }
    /// ```
    pub async fn emit_in(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> StoreResult<Vec<Emitted>> {
        Ok(self.emit_on(conn, events).await?)
    }

    /// Inserts a batch on one connection: one statement, plus look-ups for
    /// the keyed events that conflicted.
    async fn emit_on(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> DbResult<Vec<Emitted>> {
        const OP: &str = "emit";
        let mut out: Vec<Option<Emitted>> = vec![None; events.len()];
        // Repeats within the batch take the first one's result.
        let mut first_of_id: HashMap<EventId, usize> = HashMap::new();
        let mut first_of_key: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        let mut todo: Vec<usize> = Vec::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            if let Some(&j) = first_of_id.get(&e.id) {
                repeats.push((i, j));
                continue;
            }
            if let Some(key) = &e.idempotency_key {
                match first_of_key.entry((&e.tenant, &e.handler, key)) {
                    Entry::Occupied(o) => {
                        repeats.push((i, *o.get()));
                        continue;
                    }
                    Entry::Vacant(v) => {
                        v.insert(i);
                    }
                }
            }
            first_of_id.insert(e.id, i);
            todo.push(i);
        }
        // An idempotent hit can race with the live event's end (deleted
        // between our conflict and our look-up): try again, a few times.
        for _round in 0..5 {
            if todo.is_empty() {
                break;
            }
            let batch: Vec<&NewEvent> = todo.iter().map(|&i| &events[i]).collect();
            let inserted: HashSet<Uuid> = sqlx::query_scalar::<_, Uuid>(&self.sql.emit)
                .bind(batch.iter().map(|e| e.id.0).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| e.tenant.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| e.handler.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| e.payload.as_str()).collect::<Vec<_>>())
                .bind(batch.iter().map(|e| e.run_at.0).collect::<Vec<_>>())
                .bind(
                    batch
                        .iter()
                        .map(|e| max_attempts(e.max_attempts))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    batch
                        .iter()
                        .map(|e| e.idempotency_key.as_deref())
                        .collect::<Vec<_>>(),
                )
                .fetch_all(&mut *conn)
                .await
                .ctx(OP)?
                .into_iter()
                .collect();
            let mut keyed = Vec::new();
            for &i in &todo {
                let e = &events[i];
                if inserted.contains(&e.id.0) {
                    out[i] = Some(Emitted::Created(e.id));
                } else if e.idempotency_key.is_some() {
                    keyed.push(i);
                } else {
                    // Only the primary key can conflict: a retried emit
                    // whose first try committed.
                    out[i] = Some(Emitted::Existing(e.id));
                }
            }
            todo.clear();
            if keyed.is_empty() {
                break;
            }
            let rows: Vec<(i32, Uuid)> = sqlx::query_as(&self.sql.existing_keys)
                .bind(
                    keyed
                        .iter()
                        .map(|&i| events[i].tenant.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    keyed
                        .iter()
                        .map(|&i| events[i].handler.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    keyed
                        .iter()
                        .map(|&i| events[i].idempotency_key.as_deref().unwrap_or_default())
                        .collect::<Vec<_>>(),
                )
                .bind(keyed.iter().map(|&i| i as i32).collect::<Vec<_>>())
                .fetch_all(&mut *conn)
                .await
                .ctx(OP)?;
            for (i, id) in rows {
                out[i as usize] = Some(Emitted::Existing(EventId(id)));
            }
            let unresolved: Vec<usize> = keyed.into_iter().filter(|&i| out[i].is_none()).collect();
            if unresolved.is_empty() {
                break;
            }
            // No live event holds the key: the conflict was on the id (the
            // same event emitted again), or the live one just ended.
            let ids: Vec<Uuid> = unresolved.iter().map(|&i| events[i].id.0).collect();
            let stored: HashSet<Uuid> = sqlx::query_scalar::<_, Uuid>(&self.sql.existing_ids)
                .bind(&ids)
                .fetch_all(&mut *conn)
                .await
                .ctx(OP)?
                .into_iter()
                .collect();
            for i in unresolved {
                if stored.contains(&events[i].id.0) {
                    out[i] = Some(Emitted::Existing(events[i].id));
                } else {
                    todo.push(i);
                }
            }
        }
        if !todo.is_empty() {
            return Err(StoreError::backend(
                OP,
                format!(
                    "{} event(s) kept conflicting on their idempotency keys; try again",
                    todo.len()
                ),
            )
            .into());
        }
        for (i, j) in repeats {
            let first = out[j].expect("the first of a repeat is resolved");
            out[i] = Some(Emitted::Existing(first.id()));
        }
        Ok(out
            .into_iter()
            .map(|e| e.expect("every event is resolved"))
            .collect())
    }

    /// [`Store::emit`] once: a single statement when no event has a key,
    /// otherwise a transaction (the look-ups follow the insert, and a
    /// failure must store nothing).
    async fn emit_once(&self, events: &[NewEvent]) -> DbResult<Vec<Emitted>> {
        if events.iter().all(|e| e.idempotency_key.is_none()) {
            let mut conn = self.pool.acquire().await.ctx("emit")?;
            return self.emit_on(&mut conn, events).await;
        }
        let mut tx = self.pool.begin().await.ctx("emit")?;
        let out = self.emit_on(&mut tx, events).await?;
        tx.commit().await.ctx("emit")?;
        Ok(out)
    }

    /// [`Store::emit`]: tries again on a transient failure (as [`retry`])
    /// and on a lost connection ([`EMIT_TRIES`], with growing pauses), which
    /// is safe because the insert does nothing for ids that exist.
    async fn emit_retrying(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        let mut transient = 1;
        let mut lost = 1;
        loop {
            match self.emit_once(events).await {
                Ok(out) if lost > 1 => return Ok(after_retry(events, out)),
                Ok(out) => return Ok(out),
                Err(e) if e.transient() && transient < 4 => {
                    tracing::debug!(error = %e, tries = transient, "herald-postgres: transient failure, trying again");
                    transient += 1;
                    tokio::time::sleep(Duration::from_millis(rand_millis(5 * transient as u64)))
                        .await;
                }
                Err(e) if e.connection_lost() && lost < EMIT_TRIES => {
                    let pause = emit_pause(lost, rand_millis(1000) as f64 / 1000.0);
                    tracing::warn!(error = %e, tries = lost, ?pause, events = events.len(), "herald-postgres: emit lost its connection, trying again");
                    lost += 1;
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn claim_once(
        &self,
        ids: &[Uuid],
        handlers: &[String],
        token: LeaseToken,
        lease: Duration,
    ) -> DbResult<Vec<Event>> {
        const OP: &str = "claim";
        sqlx::query(&self.sql.claim)
            .bind(token.0)
            .bind(ms(lease))
            .bind(ids)
            .bind(handlers)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?
            .iter()
            .map(event_row)
            .collect::<Result<_, _>>()
            .ctx(OP)
    }

    async fn inspect_once(&self, ids: &[Uuid]) -> DbResult<Inspection> {
        const OP: &str = "inspect";
        let rows = sqlx::query(&self.sql.inspect)
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let mut now = Millis(0);
        let mut found = Vec::with_capacity(rows.len());
        for r in &rows {
            now = Millis(r.try_get(0).ctx(OP)?);
            let Some(ev) = event(r, 1).ctx(OP)? else {
                continue;
            };
            let blocked: bool = r.try_get(1 + EVENT_COLUMN_COUNT).ctx(OP)?;
            let paused: bool = r.try_get(2 + EVENT_COLUMN_COUNT).ctx(OP)?;
            found.push(Inspected {
                event: ev,
                rules: RuleMatch { blocked, paused },
            });
        }
        Ok(Inspection { found, now })
    }

    /// One settle statement: the items of one kind, at their batch
    /// positions, in id order. Returns the positions whose fence held.
    async fn settle_kind(
        &self,
        kind: SettleKind,
        batch: &[Settle],
        items: &[usize],
    ) -> DbResult<Vec<usize>> {
        const OP: &str = "settle";
        let ids: Vec<Uuid> = items.iter().map(|&i| batch[i].id.0).collect();
        let tokens: Vec<Option<Uuid>> =
            items.iter().map(|&i| batch[i].token.map(|t| t.0)).collect();
        let ords: Vec<i32> = items.iter().map(|&i| i as i32).collect();
        let mut q = sqlx::query_scalar::<_, i32>(self.sql.settle(kind))
            .bind(ids)
            .bind(tokens)
            .bind(ords);
        match kind {
            SettleKind::Release => {
                let mut waits = Vec::with_capacity(items.len());
                let mut give_backs = Vec::with_capacity(items.len());
                let mut errors = Vec::with_capacity(items.len());
                for &i in items {
                    if let Finish::Release {
                        wait,
                        error,
                        give_back,
                    } = &batch[i].finish
                    {
                        waits.push(ms(*wait));
                        give_backs.push(i32::from(*give_back));
                        errors.push(error.as_deref());
                    }
                }
                q = q.bind(waits).bind(give_backs).bind(errors);
            }
            SettleKind::Bury => {
                let errors: Vec<&str> = items
                    .iter()
                    .map(|&i| match &batch[i].finish {
                        Finish::Bury { error } => error.as_str(),
                        _ => "",
                    })
                    .collect();
                q = q.bind(errors);
            }
            SettleKind::Delete | SettleKind::Archive => {}
        }
        let held = q.fetch_all(&self.pool).await.ctx(OP)?;
        Ok(held.into_iter().map(|i| i as usize).collect())
    }

    async fn renew_once(
        &self,
        leases: &[LeaseRef],
        order: &[usize],
        lease: Duration,
    ) -> DbResult<Vec<usize>> {
        const OP: &str = "renew";
        let held = sqlx::query_scalar::<_, i32>(&self.sql.renew)
            .bind(ms(lease))
            .bind(order.iter().map(|&i| leases[i].id.0).collect::<Vec<_>>())
            .bind(order.iter().map(|&i| leases[i].token.0).collect::<Vec<_>>())
            .bind(order.iter().map(|&i| i as i32).collect::<Vec<_>>())
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        Ok(held.into_iter().map(|i| i as usize).collect())
    }

    async fn renotify_once(
        &self,
        tenant: &str,
        handler: &str,
        after: Option<EventId>,
        limit: usize,
    ) -> DbResult<Vec<Scheduled>> {
        const OP: &str = "renotify_page";
        let q = match after {
            None => sqlx::query_as::<_, (Uuid, i64, i64)>(&self.sql.renotify),
            Some(_) => sqlx::query_as(&self.sql.renotify_after),
        }
        .bind(tenant)
        .bind(handler)
        .bind(limit_i64(limit));
        let q = match after {
            Some(a) => q.bind(a.0),
            None => q,
        };
        let mut page = q.fetch_all(&self.pool).await.ctx(OP)?;
        page.sort_unstable_by_key(|&(id, _, _)| id);
        Ok(page
            .into_iter()
            .map(|(id, run_at, now)| Scheduled {
                notification: Notification {
                    tenant: tenant.to_string(),
                    event_id: EventId(id),
                },
                delay: Millis(now).until(Millis(run_at)),
            })
            .collect())
    }

    /// One sweep call, in one short transaction: carries out the
    /// [`Sweep`]'s steps.
    async fn sweep_once(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> DbResult<SweepPage> {
        const OP: &str = "sweep";
        let mut tx = self.pool.begin().await.ctx(OP)?;
        // The transaction's clock: the same for every statement of the call.
        let now = Millis(
            sqlx::query_scalar::<_, i64>(&self.sql.now)
                .fetch_one(&mut *tx)
                .await
                .ctx(OP)?,
        );
        let mut sweep = Sweep::<SweepCursor>::new(now, quiet, pass, limit);
        let mut step = sweep.start();
        let page = loop {
            step = match step {
                Step::ListOrphans => sweep.orphans(
                    sqlx::query_as(&self.sql.orphans)
                        .fetch_all(&mut *tx)
                        .await
                        .ctx(OP)?,
                ),
                Step::Unpark {
                    tenant,
                    handler,
                    limit,
                } => {
                    let n: i64 = sqlx::query_scalar(&self.sql.unpark)
                        .bind(&tenant)
                        .bind(&handler)
                        .bind(limit_i64(limit))
                        .fetch_one(&mut *tx)
                        .await
                        .ctx(OP)?;
                    sweep.unparked(n.max(0) as u64)
                }
                Step::ForgetParked { tenant, handler } => {
                    sqlx::query(&self.sql.forget_parked)
                        .bind(&tenant)
                        .bind(&handler)
                        .execute(&mut *tx)
                        .await
                        .ctx(OP)?;
                    sweep.resume()
                }
                Step::Read {
                    source,
                    after,
                    limit,
                    now,
                    cutoff,
                } => sweep.read(
                    self.sweep_read(&mut tx, source, after, limit, now, cutoff)
                        .await?,
                ),
                Step::Write(writes) => {
                    self.sweep_write(&mut tx, writes).await?;
                    sweep.resume()
                }
                Step::Done(page) => break page,
            };
        };
        tx.commit().await.ctx(OP)?;
        Ok(page)
    }

    /// Up to `limit` candidates of one source after `after`. Both walk
    /// `events_to_notify`: the dead-worker source over the pass's quiet
    /// window only (`cutoff <= notified_at < now`; its cursor starts just
    /// below the cutoff, see [`sql`]), the quiet source below the cutoff.
    async fn sweep_read(
        &self,
        conn: &mut PgConnection,
        source: Source,
        after: Option<SweepCursor>,
        limit: usize,
        now: Millis,
        cutoff: Millis,
    ) -> DbResult<Vec<Candidate<SweepCursor>>> {
        const OP: &str = "sweep";
        let (sql, start) = match source {
            Source::Expired => (
                &self.sql.sweep_expired,
                (cutoff.0.saturating_sub(1), Uuid::max()),
            ),
            Source::Quiet => (&self.sql.sweep_quiet, (i64::MIN, Uuid::nil())),
        };
        let after = after.unwrap_or(start);
        let rows: Vec<(Uuid, String, String, bool, i64)> = sqlx::query_as(sql)
            .bind(now.0)
            .bind(cutoff.0)
            .bind(after.0)
            .bind(after.1)
            .bind(limit_i64(limit))
            .fetch_all(&mut *conn)
            .await
            .ctx(OP)?;
        Ok(rows
            .into_iter()
            .map(|(id, tenant, handler, ruled, key)| Candidate {
                id: EventId(id),
                tenant,
                handler,
                ruled,
                cursor: (key, id),
            })
            .collect())
    }

    /// Stamps the notified ones, parks the parked ones and notes their
    /// pairs; rows in id order, as claims take them.
    async fn sweep_write(&self, conn: &mut PgConnection, writes: Writes) -> DbResult<()> {
        const OP: &str = "sweep";
        let Writes {
            notified,
            parked,
            parked_pairs,
            at,
        } = writes;
        if !notified.is_empty() {
            let mut ids = uuids(&notified);
            ids.sort_unstable();
            sqlx::query(&self.sql.stamp)
                .bind(at.0)
                .bind(&ids)
                .execute(&mut *conn)
                .await
                .ctx(OP)?;
        }
        if !parked.is_empty() {
            let mut ids = uuids(&parked);
            ids.sort_unstable();
            sqlx::query(&self.sql.park)
                .bind(&ids)
                .execute(&mut *conn)
                .await
                .ctx(OP)?;
            let (tenants, handlers): (Vec<String>, Vec<String>) = parked_pairs.into_iter().unzip();
            sqlx::query(&self.sql.note_parked)
                .bind(&tenants)
                .bind(&handlers)
                .execute(&mut *conn)
                .await
                .ctx(OP)?;
        }
        Ok(())
    }

    async fn purge_once(
        &self,
        dead_before: Millis,
        done_before: Millis,
        limit: usize,
    ) -> DbResult<u64> {
        const OP: &str = "purge";
        let dead = sqlx::query(&self.sql.purge)
            .bind(EventState::Dead.code())
            .bind(dead_before.0)
            .bind(limit_i64(limit))
            .execute(&self.pool)
            .await
            .ctx(OP)?
            .rows_affected();
        let done = if (dead as usize) < limit {
            sqlx::query(&self.sql.purge)
                .bind(EventState::Done.code())
                .bind(done_before.0)
                .bind(limit_i64(limit - dead as usize))
                .execute(&self.pool)
                .await
                .ctx(OP)?
                .rows_affected()
        } else {
            0
        };
        Ok(dead + done)
    }

    async fn list_once(&self, filter: &EventFilter, limit: usize) -> DbResult<Vec<Event>> {
        const OP: &str = "list";
        let lim = limit_i64(limit);
        let after = filter.after.map(|a| a.0);
        let read = |rows: Vec<PgRow>| -> DbResult<Vec<Event>> {
            rows.iter().map(event_row).collect::<Result<_, _>>().ctx(OP)
        };
        match (&filter.tenant, &filter.handler, filter.state) {
            // One handler: walk the (tenant, handler, state, id) index, one
            // state range at a time, and merge.
            (Some(tenant), Some(handler), state) => {
                let states = match state {
                    Some(s) => vec![s],
                    None => vec![EventState::Pending, EventState::Dead, EventState::Done],
                };
                let sql = self.sql.fill(if after.is_some() {
                    "SELECT {cols} FROM {s}.events AS e WHERE e.tenant = $1 AND e.handler = $2 \
                     AND e.state = $3 AND e.id > $5 ORDER BY e.id LIMIT $4"
                } else {
                    "SELECT {cols} FROM {s}.events AS e WHERE e.tenant = $1 AND e.handler = $2 \
                     AND e.state = $3 ORDER BY e.id LIMIT $4"
                });
                let mut out = Vec::new();
                for s in states {
                    let q = sqlx::query(&sql)
                        .bind(tenant)
                        .bind(handler)
                        .bind(s.code())
                        .bind(lim);
                    let q = match after {
                        Some(a) => q.bind(a),
                        None => q,
                    };
                    out.extend(read(q.fetch_all(&self.pool).await.ctx(OP)?)?);
                }
                out.sort_unstable_by_key(|e| e.id);
                out.truncate(limit);
                Ok(out)
            }
            // Otherwise walk the primary key from the cursor, filtering.
            (tenant, handler, state) => {
                let sql = self.sql.fill(if after.is_some() {
                    "SELECT {cols} FROM {s}.events AS e WHERE e.id > $5 \
                     AND ($1::text IS NULL OR e.tenant = $1) \
                     AND ($2::text IS NULL OR e.handler = $2) \
                     AND ($3::int2 IS NULL OR e.state = $3) ORDER BY e.id LIMIT $4"
                } else {
                    "SELECT {cols} FROM {s}.events AS e WHERE \
                     ($1::text IS NULL OR e.tenant = $1) \
                     AND ($2::text IS NULL OR e.handler = $2) \
                     AND ($3::int2 IS NULL OR e.state = $3) ORDER BY e.id LIMIT $4"
                });
                let q = sqlx::query(&sql)
                    .bind(tenant.as_deref())
                    .bind(handler.as_deref())
                    .bind(state.map(EventState::code))
                    .bind(lim);
                let q = match after {
                    Some(a) => q.bind(a),
                    None => q,
                };
                read(q.fetch_all(&self.pool).await.ctx(OP)?)
            }
        }
    }

    async fn revive_once(&self, id: EventId) -> DbResult<Option<Scheduled>> {
        const OP: &str = "revive";
        // Reviving must not make a second live event with the same
        // idempotency key (the unique index would refuse it anyway).
        let clash: Option<Uuid> = sqlx::query_scalar(&self.sql.revive_clash)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .ctx(OP)?;
        let refuse = |live: &dyn std::fmt::Display| -> DbError {
            StoreError::Invalid(format!(
                "cannot revive {id}: event {live} is live with the same idempotency key"
            ))
            .into()
        };
        if let Some(live) = clash {
            return Err(refuse(&live));
        }
        match sqlx::query_scalar::<_, String>(&self.sql.revive)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
        {
            Ok(t) => Ok(t.map(|tenant| Scheduled::due(tenant, id))),
            // A live event with the key appeared in between.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23505") => {
                Err(refuse(&"another"))
            }
            Err(e) => Err(e).ctx(OP),
        }
    }

    /// A statement that reports whether it wrote exactly one row.
    async fn exec_one<'q>(
        &self,
        op: &'static str,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> DbResult<bool> {
        query
            .execute(&self.pool)
            .await
            .map(|r| r.rows_affected() == 1)
            .ctx(op)
    }
}

/// The sweep's keyset cursor: `notified_at` and the id (the index's
/// tie-breaker).
type SweepCursor = (i64, Uuid);

/// Where a pool connects, for messages (no password).
fn describe(options: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default()
    )
}

#[async_trait]
impl Store for PgStore {
    async fn emit(&self, events: &[NewEvent]) -> StoreResult<Vec<Emitted>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.emit_retrying(events).await
    }

    async fn claim(
        &self,
        ids: &[EventId],
        handlers: &[String],
        token: LeaseToken,
        lease: Duration,
    ) -> StoreResult<Vec<Event>> {
        if ids.is_empty() || handlers.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids = uuids(ids);
        ids.sort_unstable();
        ids.dedup();
        retry("claim", || self.claim_once(&ids, handlers, token, lease)).await
    }

    async fn inspect(&self, ids: &[EventId]) -> StoreResult<Inspection> {
        let ids = uuids(ids);
        retry("inspect", || self.inspect_once(&ids)).await
    }

    async fn settle(&self, batch: &[Settle]) -> StoreResult<Vec<bool>> {
        let mut held = vec![false; batch.len()];
        // One statement per kind, each item at its batch position; rows are
        // taken in id order, as claims take them.
        for kind in SettleKind::ALL {
            let mut items: Vec<usize> = (0..batch.len())
                .filter(|&i| SettleKind::of(&batch[i].finish) == kind)
                .collect();
            if items.is_empty() {
                continue;
            }
            items.sort_by_key(|&i| batch[i].id);
            let items = &*items;
            for i in retry("settle", || self.settle_kind(kind, batch, items)).await? {
                held[i] = true;
            }
        }
        Ok(held)
    }

    async fn renew(&self, leases: &[LeaseRef], lease: Duration) -> StoreResult<Vec<bool>> {
        let mut held = vec![false; leases.len()];
        if leases.is_empty() {
            return Ok(held);
        }
        let mut order: Vec<usize> = (0..leases.len()).collect();
        order.sort_by_key(|&i| leases[i].id);
        for i in retry("renew", || self.renew_once(leases, &order, lease)).await? {
            held[i] = true;
        }
        Ok(held)
    }

    async fn add_rule(&self, rule: &Rule) -> StoreResult<bool> {
        retry("add_rule", || {
            self.exec_one(
                "add_rule",
                sqlx::query(&self.sql.add_rule)
                    .bind(&rule.tenant)
                    .bind(&rule.handler)
                    .bind(rule.kind.as_str()),
            )
        })
        .await
    }

    async fn remove_rule(&self, rule: &Rule) -> StoreResult<bool> {
        retry("remove_rule", || {
            self.exec_one(
                "remove_rule",
                sqlx::query(&self.sql.remove_rule)
                    .bind(&rule.tenant)
                    .bind(&rule.handler)
                    .bind(rule.kind.as_str()),
            )
        })
        .await
    }

    async fn rules_for(&self, tenant: &str, handler: &str) -> StoreResult<RuleMatch> {
        const OP: &str = "rules_for";
        let kinds: Vec<String> = sqlx::query_scalar(&self.sql.rules_for)
            .bind(tenant)
            .bind(handler)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        let mut m = RuleMatch::default();
        for k in kinds {
            match rule_kind(&k, OP)? {
                RuleKind::Block => m.blocked = true,
                RuleKind::Pause => m.paused = true,
            }
        }
        Ok(m)
    }

    async fn rules(&self) -> StoreResult<Vec<Rule>> {
        const OP: &str = "rules";
        let rows: Vec<(String, String, String)> = sqlx::query_as(&self.sql.rules)
            .fetch_all(&self.pool)
            .await
            .ctx(OP)?;
        rows.into_iter()
            .map(|(tenant, handler, kind)| {
                Ok(Rule {
                    tenant,
                    handler,
                    kind: rule_kind(&kind, OP)?,
                })
            })
            .collect()
    }

    async fn renotify_page(
        &self,
        tenant: &str,
        handler: &str,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<Scheduled>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        retry("renotify_page", || {
            self.renotify_once(tenant, handler, after, limit)
        })
        .await
    }

    async fn sweep(
        &self,
        quiet: Duration,
        pass: Option<SweepPass>,
        limit: usize,
    ) -> StoreResult<SweepPage> {
        retry("sweep", || self.sweep_once(quiet, pass, limit)).await
    }

    async fn lead(&self, role: &str, holder: &str, lease: Duration) -> StoreResult<Leadership> {
        let (leading, left_ms): (bool, i64) = retry("lead", || async {
            sqlx::query_as(&self.sql.lead)
                .bind(role)
                .bind(holder)
                .bind(ms(lease))
                .fetch_one(&self.pool)
                .await
                .ctx("lead")
        })
        .await?;
        Ok(Leadership {
            leading,
            left: Duration::from_millis(left_ms.max(0) as u64),
        })
    }

    async fn resign(&self, role: &str, holder: &str) -> StoreResult<()> {
        retry("resign", || {
            self.exec_one(
                "resign",
                sqlx::query(&self.sql.resign).bind(role).bind(holder),
            )
        })
        .await
        .map(|_| ())
    }

    async fn purge(
        &self,
        dead_before: Millis,
        done_before: Millis,
        limit: usize,
    ) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        retry("purge", || self.purge_once(dead_before, done_before, limit)).await
    }

    async fn get(&self, id: EventId) -> StoreResult<Option<Event>> {
        const OP: &str = "get";
        Ok(sqlx::query(&self.sql.get)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .ctx(OP)?
            .as_ref()
            .map(event_row)
            .transpose()
            .ctx(OP)?)
    }

    async fn history(&self, id: EventId) -> StoreResult<Vec<AttemptError>> {
        const OP: &str = "history";
        let text: Option<Option<String>> = sqlx::query_scalar(&self.sql.history)
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .ctx(OP)?;
        match text.flatten() {
            None => Ok(Vec::new()),
            Some(t) => serde_json::from_str(&t).map_err(|e| {
                StoreError::backend(format!("{OP}: event {id} has unreadable errors"), e)
            }),
        }
    }

    async fn list(&self, filter: &EventFilter, limit: usize) -> StoreResult<Vec<Event>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self.list_once(filter, limit).await?)
    }

    async fn counts(&self, query: &CountsQuery) -> StoreResult<Vec<HandlerCounts>> {
        const OP: &str = "counts";
        let pairs: Vec<(String, String)> = match &query.tenant {
            Some(t) => sqlx::query_as(&self.sql.count_pairs_of).bind(t),
            None => sqlx::query_as(&self.sql.count_pairs).bind(""),
        }
        .fetch_all(&self.pool)
        .await
        .ctx(OP)?;
        let cap = i64::try_from(query.exact_up_to.max(1)).unwrap_or(i64::MAX);
        let split = i64::try_from(query.split_up_to).unwrap_or(i64::MAX);
        let mut out = Vec::with_capacity(pairs.len());
        for (tenant, handler) in pairs {
            if query.handler.as_ref().is_some_and(|h| *h != handler) {
                continue;
            }
            let row = sqlx::query(&self.sql.count_pair)
                .bind(&tenant)
                .bind(&handler)
                .bind(cap)
                .bind(split)
                .fetch_one(&self.pool)
                .await
                .ctx(OP)?;
            let n = |i: usize| -> Result<u64, sqlx::Error> {
                Ok(row.try_get::<i64, _>(i)?.max(0) as u64)
            };
            let capped = |at: usize| -> Result<CappedCount, sqlx::Error> {
                let id = |i: usize| row.try_get::<Option<Uuid>, _>(i).map(|u| u.map(EventId));
                let span = match (id(at + 1)?, id(at + 2)?, id(at + 3)?) {
                    (Some(a), Some(b), Some(c)) => Some([a, b, c]),
                    _ => None,
                };
                Ok(CappedCount {
                    counted: n(at)?,
                    span,
                })
            };
            let parts = (|| {
                Ok::<_, sqlx::Error>((
                    [capped(0)?, capped(4)?, capped(8)?],
                    row.try_get::<bool, _>(12)?,
                    PendingSample {
                        read: n(13)?,
                        running: n(14)?,
                        delayed: n(15)?,
                    },
                ))
            })()
            .ctx(OP)?;
            out.push(HandlerCounts::from_parts(
                tenant, handler, parts.0, parts.1, parts.2,
            ));
        }
        Ok(out)
    }

    async fn revive(&self, id: EventId) -> StoreResult<Option<Scheduled>> {
        retry("revive", || self.revive_once(id)).await
    }

    async fn delete(&self, id: EventId) -> StoreResult<bool> {
        retry("delete", || {
            self.exec_one("delete", sqlx::query(&self.sql.delete).bind(id.0))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_pauses_double_from_100_ms_to_1600_ms_within_a_quarter() {
        let mids: Vec<u128> = (1..EMIT_TRIES)
            .map(|t| emit_pause(t, 0.5).as_millis())
            .collect();
        assert_eq!(mids, [100, 200, 400, 800, 1600]);
        assert_eq!(emit_pause(1, 0.0), Duration::from_millis(75));
        assert_eq!(emit_pause(5, 1.0), Duration::from_millis(2000));
    }

    #[test]
    fn after_a_retry_an_event_found_under_its_own_id_counts_as_created() {
        let e = |key: Option<&str>| NewEvent {
            id: EventId::new(),
            tenant: "t".into(),
            handler: "h".into(),
            payload: "1".into(),
            run_at: Millis(0),
            max_attempts: 1,
            idempotency_key: key.map(str::to_string),
        };
        let events = [e(None), e(Some("k")), e(None)];
        let other = EventId::new();
        let out = after_retry(
            &events,
            vec![
                Emitted::Existing(events[0].id),
                Emitted::Existing(other),
                Emitted::Created(events[2].id),
            ],
        );
        assert_eq!(
            out,
            [
                Emitted::Created(events[0].id),
                Emitted::Existing(other),
                Emitted::Created(events[2].id)
            ]
        );
    }
}
