//! `herald migrate`, through the real binary.

use std::process::Command;

use herald_postgres::testing::{database_url, unreachable, TestSchema};

fn migrate(store: &str, schema: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["migrate", "--store", store, "--schema", schema])
        .output()
        .expect("run herald migrate")
}

#[test]
fn migrate_creates_the_postgres_schema_once() {
    let url = database_url();
    let schema = TestSchema::adopt(TestSchema::random_name());
    let first = migrate(&url, schema.name());
    let stderr = String::from_utf8_lossy(&first.stderr);
    if !first.status.success() && stderr.contains("cannot open the store") {
        unreachable("migrate_creates_the_postgres_schema_once", &url, &stderr);
        return;
    }
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(first.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("migrated from version 0 to"), "{stdout}");
    let second = migrate(&url, schema.name());
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success(), "{stdout}");
    assert!(stdout.contains("is up to date"), "{stdout}");
}

#[test]
fn migrate_creates_an_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    let out = migrate(&format!("sqlite://{}", db.display()), "unused");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(db.exists());
    assert!(String::from_utf8_lossy(&out.stdout).contains("is up to date"));
}

#[test]
fn migrate_with_a_bad_url_says_where_it_could_not_connect() {
    let out = migrate("postgres://nobody@127.0.0.1:1/none", "herald");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot open the store at postgres://nobody@127.0.0.1:1/none"),
        "{stderr}"
    );
}
