//! herald's schema in PostgreSQL: its name, its version, and the migrations
//! that bring it up to date.

use herald::StoreError;
use sqlx::{Connection, Executor, PgConnection, Row};

/// The embedded migrations, in order; the schema version after applying the
/// `n`-th is `n` (1-based). Each runs with `search_path` set to herald's
/// schema, so it names tables without a schema. The first is the baseline:
/// the tables and indexes as of herald 0.1.0 (migrations/README.md).
const MIGRATIONS: &[&str] = &[include_str!("../migrations/0001_baseline.sql")];

/// The schema's functions, one file per concern, applied with `CREATE OR
/// REPLACE` after the migrations on every migrate, so that each file is
/// the one place that defines its functions.
const FUNCTIONS: &[(&str, &str)] = &[
    ("sql/emit.sql", include_str!("../sql/emit.sql")),
    ("sql/claim.sql", include_str!("../sql/claim.sql")),
    ("sql/settle.sql", include_str!("../sql/settle.sql")),
    ("sql/rules.sql", include_str!("../sql/rules.sql")),
    ("sql/sweep.sql", include_str!("../sql/sweep.sql")),
    ("sql/ring.sql", include_str!("../sql/ring.sql")),
    ("sql/limits.sql", include_str!("../sql/limits.sql")),
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
/// The baseline row in `meta`: the release whose baseline migration made
/// the schema. A schema with a version but without it was made by a
/// pre-release herald, whose migrations the baseline replaced.
const BASELINE_KEY: &str = "baseline";
const BASELINE_VALUE: &str = "0.1.0";

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
    /// herald's, made by a pre-release herald at this version of the
    /// migrations that the baseline replaced: it cannot be upgraded.
    PreRelease(i64),
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
        "SELECT key, value FROM {}.meta WHERE key IN ($1, $2, $3)",
        schema.quoted
    ))
    .bind(MARKER_KEY)
    .bind(VERSION_KEY)
    .bind(BASELINE_KEY)
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
    let mut baseline = None;
    for r in &rows {
        let key: String = r.try_get(0).map_err(fail)?;
        let value: String = r.try_get(1).map_err(fail)?;
        match key.as_str() {
            MARKER_KEY => marker = Some(value),
            BASELINE_KEY => baseline = Some(value),
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
        Some(Ok(v)) if v >= 1 && baseline.as_deref() == Some(BASELINE_VALUE) => {
            Ok(Found::Herald(v))
        }
        Some(Ok(v)) if v >= 1 && baseline.is_none() => Ok(Found::PreRelease(v)),
        other => Err(StoreError::NotHerald {
            location: location.to_string(),
            reason: format!(
                "schema {:?} has herald's marker but no valid schema version \
                 ({other:?}, baseline {baseline:?})",
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
        Found::PreRelease(v) => Err(pre_release(schema, location, v)),
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

/// The error for a schema that a pre-release herald made.
fn pre_release(schema: &SchemaName, location: &str, version: i64) -> StoreError {
    StoreError::Open {
        location: location.to_string(),
        reason: format!(
            "schema {:?} was made by a pre-release herald (schema version {version} of the \
             migrations that herald {BASELINE_VALUE}'s baseline replaced) and cannot be \
             upgraded; drop it (DROP SCHEMA {} CASCADE) and run `herald migrate`",
            schema.name, schema.quoted
        ),
    }
}

/// Creates the schema if needed, applies the migrations newer than its
/// version and then the functions (every time), in one transaction.
/// Concurrent migrations of the same schema wait for each other (a
/// transaction-scoped advisory lock, held only while migrating), so the
/// second finds the work done. Returns the version before and after.
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
        Found::PreRelease(v) => return Err(pre_release(schema, location, v)),
    };
    // The schema is created only when there is something to migrate: an
    // existing one needs no CREATE privilege on the database.
    let create = if current < SCHEMA_VERSION {
        format!("CREATE SCHEMA IF NOT EXISTS {}; ", schema.quoted)
    } else {
        String::new()
    };
    let prelude = format!(
        "{create}SET LOCAL search_path TO {q}, pg_catalog",
        q = schema.quoted
    );
    tx.execute(prelude.as_str())
        .await
        .map_err(|e| open_error(location, "cannot create the schema", e))?;
    if current < SCHEMA_VERSION {
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
    for (file, sql) in FUNCTIONS {
        tracing::debug!(location, schema = %schema.name, file, "herald-postgres: applying functions");
        tx.execute(*sql)
            .await
            .map_err(|e| open_error(location, &format!("{file} failed"), e))?;
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
