//! The migrated schema is the one checked in as `schema.sql`: its tables
//! (columns, defaults, partitions, storage options), constraints, indexes,
//! triggers, functions and `meta` rows, read from the catalog (not by
//! pg_dump, whose output moves between PostgreSQL releases), with the test
//! schema's name written `herald` and SQL comments left out.
//!
//! A change to the migrations or to `sql/*.sql` changes the dump: when the
//! change is intended, regenerate it and commit it with the change:
//!
//! ```sh
//! UPDATE_SCHEMA=1 cargo test -p herald-postgres --test schema
//! ```

use herald_postgres::testing;
use sqlx::{PgConnection, Row};

/// The checked-in dump.
const DUMP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/schema.sql");

/// The command that regenerates it.
const REGENERATE: &str = "UPDATE_SCHEMA=1 cargo test -p herald-postgres --test schema";

/// One catalog query per kind of object, each returning one text per
/// object, in a stable order. `$1` is the schema.
const QUERIES: &[(&str, &str)] = &[
    (
        "tables",
        "SELECT format(E'CREATE TABLE %I (\\n%s\\n)%s%s%s;', c.relname,
                (SELECT string_agg(format('    %I %s%s%s', a.attname,
                          format_type(a.atttypid, a.atttypmod),
                          CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
                          CASE WHEN a.attgenerated = 's'
                                 THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid) || ') STORED'
                               WHEN d.adbin IS NOT NULL
                                 THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid)
                               ELSE '' END), E',\\n' ORDER BY a.attnum)
                 FROM pg_attribute a
                 LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                CASE WHEN c.relkind = 'p' THEN ' PARTITION BY ' || pg_get_partkeydef(c.oid) ELSE '' END,
                CASE WHEN c.relispartition
                     THEN ' PARTITION OF ' || quote_ident(p.relname) || ' ' || pg_get_expr(c.relpartbound, c.oid)
                     ELSE '' END,
                CASE WHEN c.reloptions IS NOT NULL
                     THEN ' WITH (' || array_to_string(c.reloptions, ', ') || ')' ELSE '' END)
         FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
         LEFT JOIN pg_class p ON p.oid = i.inhparent
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'f')
         ORDER BY c.relname",
    ),
    (
        "views, sequences and types",
        "SELECT CASE c.relkind
                  WHEN 'S' THEN format('CREATE SEQUENCE %I;', c.relname)
                  ELSE format('CREATE VIEW %I AS %s', c.relname, pg_get_viewdef(c.oid)) END
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind IN ('v', 'm', 'S')
         UNION ALL
         SELECT format('CREATE TYPE %I (%s, %s);', t.typname, t.typtype,
                       format_type(t.typbasetype, t.typtypmod))
         FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE n.nspname = $1 AND t.typtype IN ('d', 'e', 'r', 'm')
            OR (n.nspname = $1 AND t.typtype = 'c'
                AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
         ORDER BY 1",
    ),
    (
        "constraints",
        "SELECT format('ALTER TABLE %I ADD CONSTRAINT %I %s;', c.relname, k.conname,
                       pg_get_constraintdef(k.oid))
         FROM pg_constraint k
         JOIN pg_class c ON c.oid = k.conrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1
         ORDER BY c.relname, k.conname",
    ),
    (
        "indexes",
        "SELECT pg_get_indexdef(x.indexrelid) || ';'
         FROM pg_index x
         JOIN pg_class i ON i.oid = x.indexrelid
         JOIN pg_namespace n ON n.oid = i.relnamespace
         WHERE n.nspname = $1
         ORDER BY i.relname",
    ),
    (
        "triggers",
        "SELECT pg_get_triggerdef(t.oid) || ';'
         FROM pg_trigger t
         JOIN pg_class c ON c.oid = t.tgrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND NOT t.tgisinternal
         ORDER BY c.relname, t.tgname",
    ),
    (
        "functions",
        "SELECT pg_get_functiondef(p.oid) || ';'
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = $1
         ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)",
    ),
];

/// The schema as text: each kind's objects, with `schema` written
/// `herald` and comments and blank lines left out.
async fn dump(conn: &mut PgConnection, schema: &str) -> String {
    let mut out = String::from(
        "-- herald's PostgreSQL schema as `herald migrate` leaves it: a catalog\n\
         -- dump, checked by tests/schema.rs. Regenerate it with\n",
    );
    out.push_str(&format!("-- {REGENERATE}\n"));
    for (kind, query) in QUERIES {
        out.push_str(&format!("\n-- {kind}\n"));
        let rows = sqlx::query(query)
            .bind(schema)
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("the catalog query for {kind}: {e}"));
        for r in rows {
            let text: String = r.get(0);
            out.push_str(&without_comments(&text.replace(schema, "herald")));
        }
    }
    out.push_str("\n-- meta\n");
    let rows: Vec<(String, String)> = sqlx::query_as(&format!(
        "SELECT key, value FROM \"{schema}\".meta ORDER BY key"
    ))
    .fetch_all(&mut *conn)
    .await
    .expect("the meta rows");
    for (key, value) in rows {
        out.push_str(&format!("INSERT INTO meta VALUES ('{key}', '{value}');\n"));
    }
    out
}

/// `text` without `--` comments, trailing spaces and blank lines, each
/// line ending in a newline. (No string literal of the schema holds `--`.)
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("--").map_or(l, |at| &l[..at]).trim_end())
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

#[tokio::test]
async fn the_migrated_schema_is_the_checked_in_dump() {
    let Some((store, _guard)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    let mut conn = store.pool().acquire().await.expect("a connection");
    let found = dump(&mut conn, store.schema()).await;
    herald::testkit::schema_dump::check(&found, DUMP, REGENERATE);
}
