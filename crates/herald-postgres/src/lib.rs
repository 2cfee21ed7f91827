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
//! use herald::backend::Operator;
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

// The backend role traits are in `store`, each with its guards and retries,
// delegating one try to the module of its role.
mod admin;
mod claim;
mod emit;
mod leaders;
mod limits;
mod pool;
mod reads;
mod retry;
mod ring;
mod rows;
mod rules;
mod schedules;
mod schema;
mod settle;
mod sql;
mod store;
mod sweep;
#[cfg(feature = "testing")]
pub mod testing;
mod topics;

use std::sync::Arc;
use std::time::Duration;

use herald::backend::StoreResult;
use herald::{Emitted, NewEvent, StoreError};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

use crate::rows::{Ctx, DbResult};
use crate::schema::SchemaName;
use crate::sql::Sql;

pub use crate::emit::{EMIT_FIRST_PAUSE, EMIT_TRIES};
pub use crate::pool::{pool_options, ACQUIRE_TIMEOUT, IDLE_PING};
pub use crate::ring::RingTimes;
pub use crate::schema::{SchemaNameError, DEFAULT_SCHEMA, SCHEMA_VERSION};
pub use crate::sql::RunCommits;

/// herald's store on PostgreSQL. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    schema: Arc<SchemaName>,
    sql: Arc<Sql>,
    location: Arc<str>,
    ring_times: RingTimes,
    /// How long an idempotency key names its event at least
    /// ([`PgStore::with_idempotency_window`]).
    idempotency_window: Duration,
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

impl PgStore {
    /// Connects to the database at `url` and uses herald's schema `herald`,
    /// with [`pool_options`] (10 connections, a ping only for connections
    /// idle a second or more), waiting up to 10 s for the server.
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
        Self::connect_with(pool_options(), options, DEFAULT_SCHEMA).await
    }

    /// Connects with explicit pool and connection options, using `schema`
    /// for herald's tables. Checks the schema like [`PgStore::connect`].
    /// A server that cannot be reached (refused, or no answer at all) is
    /// tried again, 0.1 s apart doubling up to 1 s, for the pool's acquire
    /// timeout; the error then says why the last attempt failed.
    /// herald sets nothing on the connections (the statements carry their
    /// own planner settings).
    pub async fn connect_with(
        pool: PgPoolOptions,
        options: PgConnectOptions,
        schema: &str,
    ) -> StoreResult<PgStore> {
        let location = describe(&options);
        // The pool's own failure to connect says only "pool timed out".
        pool::first_connection(&options, pool.get_acquire_timeout(), &location).await?;
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
            sql: Arc::new(Sql::new(&name.quoted, RunCommits::default())),
            schema: Arc::new(name),
            location: location.into(),
            pool,
            ring_times: RingTimes::default(),
            idempotency_window: herald::DEFAULT_IDEMPOTENCY_WINDOW,
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

    /// How fast the ring of leaves turns ([`RingTimes`]; the default turns
    /// on every reconciler pass). Only the store of the elected reconciler
    /// turns it.
    pub fn with_ring_times(mut self, times: RingTimes) -> PgStore {
        self.ring_times = times;
        self
    }

    /// Sets how long an idempotency key keeps naming its event, at least,
    /// after the emit that stored it and after the event finished (default
    /// [`herald::DEFAULT_IDEMPOTENCY_WINDOW`], 24 h): an emit with the key
    /// within it returns that event, even if it has finished.
    /// [`herald::backend::Reconciliation::upkeep`] (the elected reconciler's pass) purges the
    /// keys past it ([`herald::backend::Reconciliation::purge_keys`]).
    pub fn with_idempotency_window(mut self, window: Duration) -> PgStore {
        self.idempotency_window = window;
        self
    }

    /// The idempotency window ([`PgStore::with_idempotency_window`]).
    pub fn idempotency_window(&self) -> Duration {
        self.idempotency_window
    }

    /// Which of claims and settles wait for their commit's WAL flush
    /// ([`RunCommits`]; by default settles do and claims do not).
    pub fn with_run_commits(mut self, runs: RunCommits) -> PgStore {
        self.sql = Arc::new(Sql::new(&self.schema.quoted, runs));
        self
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
    /// the same as [`EventStore::emit`](herald::backend::EventStore::emit), but nothing is
    /// visible, and nothing will run, unless the caller commits. After the commit, publish with
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
