//! A new file's schema is the one checked in as `schema.sql`: every table
//! and index as `sqlite_schema` holds it (SQL comments, trailing spaces and
//! blank lines left out), `PRAGMA user_version` and the `herald_meta` rows.
//!
//! A change to the migrations changes the dump: when the change is
//! intended, regenerate it and commit it with the change:
//!
//! ```sh
//! UPDATE_SCHEMA=1 cargo test -p herald-sqlite --test schema
//! ```

use herald_sqlite::SqliteStore;

/// The checked-in dump.
const DUMP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/schema.sql");

/// The command that regenerates it.
const REGENERATE: &str = "UPDATE_SCHEMA=1 cargo test -p herald-sqlite --test schema";

/// The schema of the file at `path` as text.
fn dump(path: &std::path::Path) -> String {
    let conn = rusqlite::Connection::open(path).expect("open the file");
    let mut out = format!(
        "-- herald's SQLite schema as a new file holds it: sqlite_schema, checked\n\
         -- by tests/schema.rs. Regenerate it with\n-- {REGENERATE}\n"
    );
    let mut objects = conn
        .prepare("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY tbl_name, type DESC, name")
        .expect("the schema query");
    let rows = objects
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })
        .expect("the schema rows");
    for row in rows {
        let (kind, name, table, sql) = row.expect("a schema row");
        match sql {
            Some(sql) => {
                out.push('\n');
                out.push_str(&without_comments(&sql));
                out.push_str(";\n");
            }
            None => out.push_str(&format!("-- {kind} {name} on {table} (automatic)\n")),
        }
    }
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("the version");
    out.push_str(&format!("\nPRAGMA user_version = {version};\n"));
    let mut meta = conn
        .prepare("SELECT key, value FROM herald_meta ORDER BY key")
        .expect("the meta query");
    let rows = meta
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .expect("the meta rows");
    for row in rows {
        let (key, value) = row.expect("a meta row");
        out.push_str(&format!(
            "INSERT INTO herald_meta VALUES ('{key}', '{value}');\n"
        ));
    }
    out
}

/// `text` without `--` comments, trailing spaces and blank lines. (No
/// string literal of the schema holds `--`.)
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("--").map_or(l, |at| &l[..at]).trim_end())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_new_file_has_the_checked_in_schema() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("herald.db");
    drop(SqliteStore::open(&path).expect("open a new file"));
    let found = dump(&path);
    herald::testkit::schema_dump::check(&found, DUMP, REGENERATE);
}
