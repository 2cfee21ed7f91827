//! herald's schema in PostgreSQL: its name, its version, and the migrations
//! that bring it up to date.

use herald::StoreError;
use sqlx::{Connection, Executor, PgConnection, Row};

/// The embedded migrations, in order; the schema version after applying the
/// `n`-th is `n` (1-based). Each runs with `search_path` set to herald's
/// schema, so it names tables without a schema.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_error_history.sql"),
    include_str!("../migrations/0003_bounded_plans.sql"),
    include_str!("../migrations/0004_id_key.sql"),
    include_str!("../migrations/0005_ring.sql"),
    include_str!("../migrations/0006_topics.sql"),
    include_str!("../migrations/0007_schedules.sql"),
    include_str!("../migrations/0008_rule_check_once.sql"),
    include_str!("../migrations/0009_rule_check_by_tenant.sql"),
    include_str!("../migrations/0010_skip_empty_leaves.sql"),
    include_str!("../migrations/0011_retire_untouched_leaves.sql"),
    include_str!("../migrations/0012_cold_only_when_missing.sql"),
    include_str!("../migrations/0013_idempotency_keys.sql"),
    include_str!("../migrations/0014_token_per_event.sql"),
    include_str!("../migrations/0015_run_at_by_store_clock.sql"),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The schema herald uses unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "herald";

/// The marker row in `meta`.
const MARKER_KEY: &str = "format";
const MARKER_VALUE: &str = "herald event store";
/// The version row in `meta`.
const VERSION_KEY: &str = "schema_version";

/// Why a schema name was refused.
#[derive(Debug, thiserror::Error)]
pub enum SchemaNameError {
    /// The name is empty.
    #[error("the schema name is empty")]
    Empty,
    /// PostgreSQL truncates identifiers to 63 bytes.
    #[error("the schema name {0:?} is longer than 63 bytes")]
    TooLong(String),
    /// A NUL byte cannot be part of an identifier.
    #[error("the schema name {0:?} contains a NUL byte")]
    Nul(String),
}

/// A checked schema name and its quoted form for SQL text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SchemaName {
    /// As given (the catalog's spelling).
    pub(crate) name: String,
    /// As an SQL identifier: in double quotes, inner quotes doubled.
    pub(crate) quoted: String,
}

impl SchemaName {
    pub(crate) fn new(name: &str) -> Result<Self, SchemaNameError> {
        if name.is_empty() {
            return Err(SchemaNameError::Empty);
        }
        if name.len() > 63 {
            return Err(SchemaNameError::TooLong(name.into()));
        }
        if name.contains('\0') {
            return Err(SchemaNameError::Nul(name.into()));
        }
        Ok(SchemaName {
            name: name.to_string(),
            quoted: format!("\"{}\"", name.replace('"', "\"\"")),
        })
    }
}

/// What a schema holds, as found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// No such schema, or one without tables.
    Empty,
    /// herald's, at this version.
    Herald(i64),
}

fn open_error(location: &str, what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        location: location.to_string(),
        reason: format!("{what}: {e}"),
    }
}

/// Looks at the schema without changing anything.
pub(crate) async fn inspect(
    conn: &mut PgConnection,
    schema: &SchemaName,
    location: &str,
) -> Result<Found, StoreError> {
    let fail = |e: sqlx::Error| open_error(location, "cannot read the schema", e);
    let tables: Vec<String> = sqlx::query(
        "SELECT c.relname FROM pg_catalog.pg_class c \
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
          ORDER BY c.relname",
    )
    .bind(&schema.name)
    .fetch_all(&mut *conn)
    .await
    .map_err(fail)?
    .iter()
    .map(|r| r.get::<String, _>(0))
    .collect();
    if tables.is_empty() {
        return Ok(Found::Empty);
    }
    if !tables.iter().any(|t| t == "meta") {
        let names: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
        return Err(StoreError::NotHerald {
            location: location.to_string(),
            reason: format!(
                "schema {:?} has {} other table(s) ({}) and no herald marker",
                schema.name,
                tables.len(),
                names.join(", ")
            ),
        });
    }
    let rows = sqlx::query(&format!(
        "SELECT key, value FROM {}.meta WHERE key IN ($1, $2)",
        schema.quoted
    ))
    .bind(MARKER_KEY)
    .bind(VERSION_KEY)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| StoreError::NotHerald {
        location: location.to_string(),
        reason: format!(
            "schema {:?} has a table `meta` that is not herald's: {e}",
            schema.name
        ),
    })?;
    let mut marker = None;
    let mut version = None;
    for r in &rows {
        let key: String = r.try_get(0).map_err(fail)?;
        let value: String = r.try_get(1).map_err(fail)?;
        match key.as_str() {
            MARKER_KEY => marker = Some(value),
            _ => version = Some(value),
        }
    }
    if marker.as_deref() != Some(MARKER_VALUE) {
        return Err(StoreError::NotHerald {
            location: location.to_string(),
            reason: format!("schema {:?} has no herald marker in `meta`", schema.name),
        });
    }
    match version.as_deref().map(str::parse::<i64>) {
        Some(Ok(v)) if v >= 1 => Ok(Found::Herald(v)),
        other => Err(StoreError::NotHerald {
            location: location.to_string(),
            reason: format!(
                "schema {:?} has herald's marker but no valid schema version ({other:?})",
                schema.name
            ),
        }),
    }
}

/// Checks that the schema is herald's at exactly this build's version.
pub(crate) async fn check(
    conn: &mut PgConnection,
    schema: &SchemaName,
    location: &str,
) -> Result<(), StoreError> {
    match inspect(conn, schema, location).await? {
        Found::Herald(v) if v == SCHEMA_VERSION => Ok(()),
        Found::Herald(v) if v > SCHEMA_VERSION => Err(StoreError::TooNew {
            location: location.to_string(),
            found: v,
            known: SCHEMA_VERSION,
        }),
        Found::Herald(v) => Err(StoreError::Open {
            location: location.to_string(),
            reason: format!(
                "schema {:?} is at version {v}, older than this herald's {SCHEMA_VERSION}; \
                 run `herald migrate` to upgrade it",
                schema.name
            ),
        }),
        Found::Empty => Err(StoreError::Open {
            location: location.to_string(),
            reason: format!(
                "schema {:?} has no herald tables (not migrated); \
                 run `herald migrate` to create them",
                schema.name
            ),
        }),
    }
}

/// Creates the schema if needed and applies the migrations newer than its
/// version, in one transaction. Concurrent migrations of the same schema
/// wait for each other (a transaction-scoped advisory lock, held only while
/// migrating), so the second finds the work done. Returns the version before
/// and after.
pub(crate) async fn migrate(
    conn: &mut PgConnection,
    schema: &SchemaName,
    location: &str,
) -> Result<(i64, i64), StoreError> {
    let mut tx = conn
        .begin()
        .await
        .map_err(|e| open_error(location, "cannot start the migration transaction", e))?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('herald migrate ' || $1, 0))")
        .bind(&schema.name)
        .execute(&mut *tx)
        .await
        .map_err(|e| open_error(location, "cannot take the migration lock", e))?;
    let current = match inspect(&mut tx, schema, location).await? {
        Found::Empty => 0,
        Found::Herald(v) if v > SCHEMA_VERSION => {
            return Err(StoreError::TooNew {
                location: location.to_string(),
                found: v,
                known: SCHEMA_VERSION,
            })
        }
        Found::Herald(v) => v,
    };
    if current < SCHEMA_VERSION {
        let prelude = format!(
            "CREATE SCHEMA IF NOT EXISTS {q}; SET LOCAL search_path TO {q}, pg_catalog",
            q = schema.quoted
        );
        tx.execute(prelude.as_str())
            .await
            .map_err(|e| open_error(location, "cannot create the schema", e))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
            let version = i as i64 + 1;
            tracing::info!(location, schema = %schema.name, version, "herald-postgres: applying migration");
            tx.execute(*sql)
                .await
                .map_err(|e| open_error(location, &format!("migration {version} failed"), e))?;
        }
        sqlx::query(&format!(
            "INSERT INTO {}.meta (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            schema.quoted
        ))
        .bind(VERSION_KEY)
        .bind(SCHEMA_VERSION.to_string())
        .execute(&mut *tx)
        .await
        .map_err(|e| open_error(location, "cannot record the schema version", e))?;
    }
    tx.commit()
        .await
        .map_err(|e| open_error(location, "cannot commit the migration", e))?;
    Ok((current, SCHEMA_VERSION))
}

/// The URL without its password, for messages (a user name is not a
/// secret: it stays).
pub(crate) use herald::redact::redact_password as redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_quoted_and_checked() {
        assert_eq!(SchemaName::new("herald").unwrap().quoted, "\"herald\"");
        assert_eq!(SchemaName::new("a\"b").unwrap().quoted, "\"a\"\"b\"");
        assert!(matches!(SchemaName::new(""), Err(SchemaNameError::Empty)));
        assert!(matches!(
            SchemaName::new(&"x".repeat(64)),
            Err(SchemaNameError::TooLong(_))
        ));
        assert!(matches!(
            SchemaName::new("a\0b"),
            Err(SchemaNameError::Nul(_))
        ));
    }
}
