//! Test helpers (feature `testing`): a fresh, migrated schema per test,
//! dropped when the test ends, so that tests run in parallel on one
//! database; and the one place that decides what a test does when
//! PostgreSQL can't be reached.
//!
//! The database is `DATABASE_URL`, or [`DEFAULT_URL`]. When it can't be
//! reached, a test prints `SKIPPED <test>: PostgreSQL unreachable at <url>:
//! <error>` and passes; with `CI=true` it fails instead.

use std::sync::Arc;
use std::time::Duration;

use herald::testkit::TestStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, Row};

use crate::PgStore;

/// The database tests use when `DATABASE_URL` is not set.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The prefix of every test schema's name.
pub const SCHEMA_PREFIX: &str = "herald_test_";

/// The test database's URL.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_URL.to_string())
}

pub use herald::testkit::{in_ci, test_name};

/// Says loudly that `test` can't reach PostgreSQL: a skip, or with
/// `CI=true` a failure (panics).
pub fn unreachable(test: &str, url: &str, error: &dyn std::fmt::Display) {
    herald::testkit::service_unreachable("PostgreSQL", test, &crate::schema::redact(url), error);
}

/// Whether the test database answers, asked once per process (a refused
/// connection fails at once; a silent host after 5 s).
pub async fn reachable() -> Result<(), String> {
    static PROBE: tokio::sync::OnceCell<Result<(), String>> = tokio::sync::OnceCell::const_new();
    PROBE
        .get_or_init(|| async {
            let options = connect_options();
            match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect_with(&options))
                .await
            {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                    Ok(())
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer within 5 s".to_string()),
            }
        })
        .await
        .clone()
}

/// Connection options for the test database (panics on a malformed URL:
/// that is a mistake, not an absent server).
pub fn connect_options() -> PgConnectOptions {
    let url = database_url();
    url.parse()
        .unwrap_or_else(|e| panic!("DATABASE_URL {url:?} is not a PostgreSQL URL: {e}"))
}

/// A migrated schema of its own for one test; dropped (with everything in
/// it) when this guard is dropped.
#[derive(Debug)]
pub struct TestSchema {
    name: String,
}

impl TestSchema {
    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new random schema name (not created).
    pub fn random_name() -> String {
        format!("{SCHEMA_PREFIX}{}", uuid::Uuid::new_v4().simple())
    }

    /// Takes over an existing schema: it is dropped with the guard.
    pub fn adopt(name: impl Into<String>) -> TestSchema {
        TestSchema { name: name.into() }
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // Drop may run inside a tokio runtime: do the async work on a
        // thread of its own with a runtime of its own.
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let mut conn = PgConnection::connect_with(&connect_options())
                    .await
                    .map_err(|e| e.to_string())?;
                let quoted = format!("\"{}\"", name.replace('"', "\"\""));
                sqlx::raw_sql(&format!(
                    "SET lock_timeout = '30s'; DROP SCHEMA IF EXISTS {quoted} CASCADE"
                ))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
                let _ = conn.close().await;
                Ok::<(), String>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cannot drop test schema {}: {e}", self.name),
            Err(_) => eprintln!("cannot drop test schema {}: the thread panicked", self.name),
        }
    }
}

/// A store on a fresh, migrated schema, and the guard that drops it; `None`
/// (after saying so) when PostgreSQL is unreachable outside CI.
pub async fn fresh_schema(test: &str) -> Option<(PgStore, TestSchema)> {
    fresh_schema_with(test, crate::pool_options().max_connections(8)).await
}

/// [`fresh_schema`] with pool options of the caller's.
pub async fn fresh_schema_with(test: &str, pool: PgPoolOptions) -> Option<(PgStore, TestSchema)> {
    let url = database_url();
    if let Err(e) = reachable().await {
        unreachable(test, &url, &e);
        return None;
    }
    let pool = match pool
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(connect_options())
        .await
    {
        Ok(p) => p,
        Err(e) => {
            unreachable(test, &url, &e);
            return None;
        }
    };
    let name = TestSchema::random_name();
    let guard = TestSchema::adopt(&name);
    // The ring turns on every reconciler pass and retires a leaf at once,
    // so that every suite runs with events moving between leaves.
    let store = PgStore::from_pool_unchecked(pool, &name)
        .expect("a valid schema name")
        .with_ring_times(crate::RingTimes {
            turn_every: Duration::ZERO,
            drain: Duration::ZERO,
            move_at_most: 100,
            drain_at_most: Duration::ZERO,
        });
    store.migrate().await.expect("migrate the test schema");
    Some((store, guard))
}

/// The engine and store suites' fixture: a [`TestStore`] on a fresh schema
/// that is dropped when the test ends; `None` (after the SKIPPED line) when
/// PostgreSQL is unreachable outside CI. With `CI=true` it fails the test.
pub async fn fresh_pg_store() -> Option<TestStore> {
    let (store, guard) = fresh_schema(&test_name()).await?;
    Some(TestStore {
        store: Arc::new(store),
        keep: Box::new(guard),
    })
}

/// A statement a herald function runs: its body's statement, the
/// function's settings and its parameter types.
pub struct Routine {
    /// The function's name, and for a statement after its first, which one
    /// (`claim, statement 2`).
    pub name: String,
    /// The statement (`BEGIN [RETURN QUERY] <statement>; …`, and each later
    /// `RETURN QUERY <statement>;`).
    pub body: String,
    /// Its own settings (`proconfig`, as `name=value`).
    pub settings: Vec<String>,
    /// Its parameter types.
    pub types: Vec<String>,
}

/// The statements of the functions of `schema` (quoted as `q` in `sql`)
/// that `sql` calls, for EXPLAIN (tests/plans.rs, bench/pg-explain): each
/// function's first statement, then each later one it returns rows of
/// (the second statement over events_cold, `sql/claim.sql`).
pub async fn routines(conn: &mut PgConnection, schema: &str, q: &str, sql: &str) -> Vec<Routine> {
    let rows = sqlx::query(
        "SELECT p.proname::text, p.prosrc, coalesce(p.proconfig, '{}'), \
                ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t) \
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1",
    )
    .bind(schema)
    .fetch_all(&mut *conn)
    .await
    .expect("the schema's functions");
    let statement = |s: &str| s.split(';').next().unwrap_or(s).trim().to_string();
    let mut out = Vec::new();
    for r in rows
        .iter()
        .filter(|r| sql.contains(&format!("{q}.{}(", r.get::<String, _>(0))))
    {
        let name: String = r.get(0);
        let src: String = r.get(1);
        // plpgsql bodies are `[DECLARE …] BEGIN [RETURN QUERY] <statement>; …`.
        let rest = src.split_once("BEGIN").map_or(src.as_str(), |(_, r)| r);
        let rest = rest.trim_start().trim_start_matches("RETURN QUERY");
        let mut bodies = vec![statement(rest)];
        bodies.extend(rest.split("RETURN QUERY").skip(1).map(statement));
        for (i, body) in bodies.into_iter().enumerate() {
            out.push(Routine {
                name: if i == 0 {
                    name.clone()
                } else {
                    format!("{name}, statement {}", i + 1)
                },
                body,
                settings: r.get(2),
                types: r.get(3),
            });
        }
    }
    out
}
