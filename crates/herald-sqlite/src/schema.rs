//! Opening a database file: recognizing it, migrating it, configuring the
//! connection.

use std::path::Path;
use std::time::Duration;

use herald::backend::StoreError;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};

/// The embedded migrations, in order; the schema version after applying the
/// `n`-th is `n` (1-based). The first is the baseline: the schema as of
/// herald 0.1.0 (migrations/README.md).
const MIGRATIONS: &[&str] = &[include_str!("../migrations/0001_baseline.sql")];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The key and value of the marker row in `herald_meta`.
const MARKER_KEY: &str = "format";
const MARKER_VALUE: &str = "herald event store";
/// The baseline row in `herald_meta`: the release whose baseline migration
/// made the file. A herald file without it was made by a pre-release
/// herald, whose migrations the baseline replaced.
const BASELINE_KEY: &str = "baseline";
const BASELINE_VALUE: &str = "0.1.0";

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_millis(5000);

/// What the file holds, as found before any write.
enum Found {
    /// No tables at all: a new file (or an empty database).
    Empty,
    /// A herald database at this schema version.
    Herald(i64),
    /// A herald database that a pre-release herald made, at this version of
    /// the migrations that the baseline replaced: it cannot be upgraded.
    PreRelease(i64),
}

/// The error for a file that a pre-release herald made.
fn pre_release(location: &str, version: i64) -> StoreError {
    open_error(
        location,
        format!(
            "the file was made by a pre-release herald (schema version {version} of the \
             migrations that herald {BASELINE_VALUE}'s baseline replaced) and cannot be \
             upgraded; move it away and open the path again for a new one"
        ),
    )
}

fn open_error(location: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        location: location.to_string(),
        reason: e.to_string(),
    }
}

/// Maps an error met while reading an existing file: "not a database" is a
/// [`StoreError::NotHerald`], anything else an [`StoreError::Open`].
fn read_error(location: &str, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::NotHerald {
            location: location.to_string(),
            reason: format!("the file is not an SQLite database ({e})"),
        },
        _ => open_error(location, e),
    }
}

/// Opens `path` (creating it if missing), checks that it is herald's (or
/// empty), applies pending migrations and configures the connection.
pub(crate) fn open(path: &Path) -> Result<Connection, StoreError> {
    let location = path.display().to_string();
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| open_error(&location, e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| open_error(&location, e))?;

    // Look before writing anything (even the journal mode): a foreign
    // database must be left exactly as it was.
    match inspect(&conn, &location)? {
        Found::Herald(v) if v > SCHEMA_VERSION => {
            return Err(StoreError::TooNew {
                location,
                found: v,
                known: SCHEMA_VERSION,
            });
        }
        Found::PreRelease(v) => return Err(pre_release(&location, v)),
        Found::Herald(_) | Found::Empty => {}
    }

    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| read_error(&location, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(open_error(
            &location,
            format!("cannot switch to WAL journal mode (got {mode})"),
        ));
    }
    // synchronous = NORMAL: in WAL mode a commit is durable once the WAL is
    // synced at checkpoint; a power loss may lose the last transactions but
    // never corrupts. temp_store = MEMORY keeps the savepoints' sub-journal
    // (undo data for the current transaction only, never needed after a
    // crash) off the disk: about 10% faster group commits, no durability cost.
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA temp_store = MEMORY;")
        .map_err(|e| open_error(&location, e))?;
    conn.set_prepared_statement_cache_capacity(64);
    rusqlite::vtab::array::load_module(&conn).map_err(|e| open_error(&location, e))?;

    migrate(&conn, &location)?;
    Ok(conn)
}

/// Reads the schema version and decides whether the file is herald's.
fn inspect(conn: &Connection, location: &str) -> Result<Found, StoreError> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| read_error(location, e))?;
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .map_err(|e| read_error(location, e))?;
    if tables == 0 {
        if version != 0 {
            return Err(StoreError::NotHerald {
                location: location.to_string(),
                reason: format!("it has no tables but schema version {version}"),
            });
        }
        return Ok(Found::Empty);
    }
    let has_meta: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'herald_meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| read_error(location, e))?
        > 0;
    let meta = |key: &str| -> Result<Option<String>, StoreError> {
        if !has_meta {
            return Ok(None);
        }
        conn.query_row("SELECT value FROM herald_meta WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| read_error(location, e))
    };
    let marker = meta(MARKER_KEY)?;
    match marker {
        Some(m) if m == MARKER_VALUE && version >= 1 => match meta(BASELINE_KEY)? {
            Some(b) if b == BASELINE_VALUE => Ok(Found::Herald(version)),
            Some(b) => Err(StoreError::NotHerald {
                location: location.to_string(),
                reason: format!("it has herald's marker but an unknown baseline {b:?}"),
            }),
            None => Ok(Found::PreRelease(version)),
        },
        Some(m) if m == MARKER_VALUE => Err(StoreError::NotHerald {
            location: location.to_string(),
            reason: format!("it has herald's marker but schema version {version}"),
        }),
        _ => {
            let names: Vec<String> = conn
                .prepare(
                    "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name LIMIT 5",
                )
                .and_then(|mut s| {
                    s.query_map([], |r| r.get(0))?
                        .collect::<rusqlite::Result<_>>()
                })
                .map_err(|e| read_error(location, e))?;
            Err(StoreError::NotHerald {
                location: location.to_string(),
                reason: format!(
                    "it is an SQLite database with {tables} other table(s) ({}) and no herald marker",
                    names.join(", ")
                ),
            })
        }
    }
}

/// Applies the migrations newer than the file's version, in one immediate
/// transaction (so two processes opening a new file at once migrate once).
fn migrate(conn: &Connection, location: &str) -> Result<(), StoreError> {
    let fail = |what: &str, e: rusqlite::Error| open_error(location, format!("{what}: {e}"));
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| fail("cannot start the migration transaction", e))?;
    let result = (|| {
        // Look again under the write lock: another process may have migrated
        // (or, in theory, replaced the file's contents) meanwhile.
        let current = match inspect(conn, location)? {
            Found::Empty => 0,
            Found::Herald(v) if v > SCHEMA_VERSION => {
                return Err(StoreError::TooNew {
                    location: location.to_string(),
                    found: v,
                    known: SCHEMA_VERSION,
                })
            }
            Found::Herald(v) => v,
            Found::PreRelease(v) => return Err(pre_release(location, v)),
        };
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
            let version = i as i64 + 1;
            tracing::info!(location, version, "herald-sqlite: applying migration");
            conn.execute_batch(sql)
                .map_err(|e| fail(&format!("migration {version} failed"), e))?;
            conn.pragma_update(None, "user_version", version)
                .map_err(|e| fail("cannot record the schema version", e))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn
            .execute_batch("COMMIT")
            .map_err(|e| fail("cannot commit the migration", e)),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
