//! The query plans of the store's statements: the hot path searches by
//! primary key, the rest walk the index meant for them; no scan of `events`
//! except counts() (a covering index scan, by design).

use std::rc::Rc;

use rusqlite::types::Value;
use rusqlite::vtab::array::Array;
use rusqlite::Connection;

use crate::admin::PURGE_SQL;
use crate::claim::{CLAIM_BATCH_SQL, CLAIM_ONE_SQL, HANDLER_OF_SQL};
use crate::emit::EXISTING_KEY_SQL;
use crate::rules::RENOTIFY_SQL;
use crate::schema;
use crate::settle::{SETTLE_ARCHIVE_SQL, SETTLE_BURY_SQL, SETTLE_DELETE_SQL, SETTLE_RELEASE_SQL};
use crate::sweep::{SWEEP_EXPIRED_SQL, SWEEP_QUIET_SQL, UNPARK_SQL};

/// `EXPLAIN QUERY PLAN`'s detail lines, with rarray parameters bound.
pub(crate) fn plan(conn: &Connection, sql: &str) -> String {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    for i in 1..=stmt.parameter_count() {
        if sql.contains(&format!("rarray(?{i})")) {
            let v: Array = Rc::new(vec![Value::Blob(vec![0; 16])]);
            stmt.raw_bind_parameter(i, v).unwrap();
        }
    }
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(r) = rows.next().unwrap() {
        out.push(r.get::<_, String>(3).unwrap());
    }
    out.join("\n")
}

fn conn() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = schema::open(&dir.path().join("plan.db")).unwrap();
    (dir, conn)
}

fn assert_plan(conn: &Connection, name: &str, sql: &str, expect: &str) {
    let p = plan(conn, sql);
    assert!(
        p.contains(expect),
        "{name}: expected `{expect}` in plan:\n{p}"
    );
    assert!(
        !p.lines()
            .any(|l| l.starts_with("SCAN events") || l.starts_with("SCAN e ")),
        "{name}: scans events:\n{p}"
    );
}

#[test]
fn claim_searches_by_primary_key() {
    let (_dir, conn) = conn();
    // The batch loops over its leases (the rarray) and searches each id.
    for (sql, first) in [
        (CLAIM_ONE_SQL, ""),
        (CLAIM_BATCH_SQL, "SCAN rarray VIRTUAL TABLE INDEX 1:\n"),
    ] {
        let p = plan(&conn, sql);
        assert!(
            p.starts_with(&format!(
                "{first}SEARCH events USING INDEX sqlite_autoindex_events_1 (id=?)"
            )),
            "{p}"
        );
        assert!(
            p.contains("SEARCH r USING PRIMARY KEY (tenant=? AND handler=?)"),
            "{p}"
        );
        assert!(!p.contains("SCAN events"), "{p}");
    }
    assert_eq!(
        plan(&conn, HANDLER_OF_SQL),
        "SEARCH events USING INDEX sqlite_autoindex_events_1 (id=?)"
    );
}

#[test]
fn other_statements_use_their_indexes() {
    let (_dir, conn) = conn();
    let pk = "SEARCH events USING INDEX sqlite_autoindex_events_1 (id=?)";
    for (name, sql, expect) in [
        ("settle delete", SETTLE_DELETE_SQL, pk),
        ("settle archive", SETTLE_ARCHIVE_SQL, pk),
        ("settle release", SETTLE_RELEASE_SQL, pk),
        ("settle bury", SETTLE_BURY_SQL, pk),
        (
            "emit key check",
            EXISTING_KEY_SQL,
            "SEARCH events USING INDEX events_live_key (tenant=? AND handler=? AND idempotency_key=?)",
        ),
        (
            "renotify",
            RENOTIFY_SQL,
            "USING COVERING INDEX events_by_handler (tenant=? AND handler=? AND state=? AND id>?)",
        ),
        (
            "unpark",
            UNPARK_SQL,
            "USING INDEX events_by_handler (tenant=? AND handler=? AND state=?)",
        ),
        (
            "purge",
            PURGE_SQL,
            "USING COVERING INDEX events_finished (state=? AND finished_at<?)",
        ),
        (
            "sweep expired",
            SWEEP_EXPIRED_SQL,
            "SEARCH e USING INDEX events_by_lease (lease_expires_at>?",
        ),
        (
            "sweep quiet",
            SWEEP_QUIET_SQL,
            "SEARCH e USING INDEX events_to_notify (",
        ),
    ] {
        assert_plan(&conn, name, sql, expect);
    }
}
