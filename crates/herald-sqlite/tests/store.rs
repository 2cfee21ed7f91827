//! The SQLite store alone, on real files, with exact results: what only
//! SQLite has (opening files, pragmas, several connections to one file, the
//! busy timeout) and the columns the `Store` trait does not expose
//! (`notified_at`, `finished_at`, the `parked` table), read with raw SQL.
//!
//! Everything the trait alone can check lives in herald's store conformance
//! suite (`herald::store_suite!`, run by `tests/store_suite.rs`).

use herald::backend::{EventStore, Operator, Reconciliation, Rules, Topics};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use herald::backend::{Finish, Settle};
use herald::{
    Emitted, EventId, EventState, LeaseToken, Millis, NewEvent, Rule, RuleKind, Store, StoreError,
};
use herald_sqlite::{SqliteStore, SCHEMA_VERSION};

const LEASE: Duration = Duration::from_secs(60);

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: SqliteStore,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.db");
    let store = SqliteStore::open(&path).unwrap();
    Fixture {
        _dir: dir,
        path,
        store,
    }
}

/// One page of a new sweep pass.
async fn sweep(
    store: &SqliteStore,
    quiet: Duration,
    limit: usize,
) -> Vec<herald::backend::Scheduled> {
    store.sweep(quiet, None, limit).await.unwrap().due
}

fn new_event(tenant: &str, handler: &str) -> NewEvent {
    NewEvent {
        singleton: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: tenant.into(),
        handler: handler.into(),
        payload: r#"{"n":1}"#.into(),
        run_at: herald::RunAt::NOW,
        max_attempts: 3,
        idempotency_key: None,
        topic: None,
    }
}

/// An event due, and last notified, a minute ago.
fn old(tenant: &str) -> NewEvent {
    NewEvent {
        run_at: herald::RunAt::At(Millis(Millis::now().0 - 60_000)),
        ..new_event(tenant, "h")
    }
}

fn handlers(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn emit_one(store: &SqliteStore, e: NewEvent) -> EventId {
    let out = store.emit(&[e]).await.unwrap();
    match out[..] {
        [Emitted::Created(id)] => id,
        ref other => panic!("expected one Created, got {other:?}"),
    }
}

/// Claims one id with a fresh token; the token if it was claimed.
async fn claim_one(store: &SqliteStore, id: EventId, lease: Duration) -> Option<LeaseToken> {
    let token = LeaseToken::new();
    let got = store
        .claim(
            &herald::testkit::leases(&[id], token),
            &handlers(&["h"]),
            &["t".into()],
            lease,
        )
        .await
        .unwrap();
    match got.len() {
        0 => None,
        1 => {
            assert_eq!(got[0].id, id);
            Some(token)
        }
        n => panic!("claimed {n} events for one id"),
    }
}

async fn settle_one(
    store: &SqliteStore,
    id: EventId,
    token: Option<LeaseToken>,
    finish: Finish,
) -> bool {
    let out = store.settle(&[Settle { id, token, finish }]).await.unwrap();
    out.held == vec![true]
}

/// A plain connection to the same file, to look at columns the trait does not
/// expose (notified_at, finished_at).
fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

fn notified_at(path: &Path, id: EventId) -> i64 {
    raw(path)
        .query_row(
            "SELECT notified_at FROM events WHERE id = ?1",
            [id.0.as_bytes()],
            |r| r.get(0),
        )
        .unwrap()
}

fn finished_at(path: &Path, id: EventId) -> Option<i64> {
    raw(path)
        .query_row(
            "SELECT finished_at FROM events WHERE id = ?1",
            [id.0.as_bytes()],
            |r| r.get(0),
        )
        .unwrap()
}

fn parked_pairs(path: &Path) -> Vec<(String, String)> {
    let conn = raw(path);
    let mut st = conn.prepare("SELECT tenant, handler FROM parked").unwrap();
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

fn pause(tenant: &str, handler: &str) -> Rule {
    Rule {
        tenant: tenant.into(),
        handler: handler.into(),
        kind: RuleKind::Pause,
    }
}

fn block(tenant: &str, handler: &str) -> Rule {
    Rule {
        kind: RuleKind::Block,
        ..pause(tenant, handler)
    }
}

// ---------------------------------------------------------------- opening

#[tokio::test]
async fn open_creates_the_file_and_reopening_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    assert!(!path.exists());
    let store = SqliteStore::open(&path).unwrap();
    assert!(path.exists());
    assert_eq!(store.path(), path.as_path());
    let id = emit_one(&store, new_event("t", "h")).await;
    drop(store);
    for _ in 0..3 {
        let again = SqliteStore::open(&path).unwrap();
        assert_eq!(again.get(id).await.unwrap().unwrap().id, id);
    }
    let conn = raw(&path);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let marker: String = conn
        .query_row(
            "SELECT value FROM herald_meta WHERE key = 'format'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(marker, "herald event store");
}

#[test]
fn open_in_a_missing_directory_is_an_open_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no/such/dir/herald.db");
    match SqliteStore::open(&path) {
        Err(StoreError::Open { location, reason }) => {
            assert_eq!(location, path.display().to_string());
            assert!(!reason.is_empty());
        }
        other => panic!("expected Open, got {other:?}"),
    }
}

#[test]
fn open_of_a_directory_is_an_open_error() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        SqliteStore::open(dir.path()),
        Err(StoreError::Open { .. })
    ));
}

#[cfg(unix)]
#[test]
fn open_without_permission_is_an_open_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
    // root ignores permissions: then there is nothing to test here.
    if std::fs::write(locked.join("probe"), b"x").is_ok() {
        eprintln!("skipped: this user can write into a read-only directory (root)");
        return;
    }
    let result = SqliteStore::open(locked.join("herald.db"));
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(matches!(result, Err(StoreError::Open { .. })), "{result:?}");
}

#[test]
fn open_of_garbage_is_not_herald() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        ("short", b"hello, world\n".to_vec()),
        ("long", (0..8192u32).map(|i| (i * 7 % 251) as u8).collect()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        match SqliteStore::open(&path) {
            Err(StoreError::NotHerald { location, reason }) => {
                assert_eq!(location, path.display().to_string());
                assert!(reason.contains("not an SQLite database"), "{reason}");
            }
            other => panic!("{name}: expected NotHerald, got {other:?}"),
        }
        // Untouched.
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}");
    }
}

#[test]
fn open_of_a_foreign_sqlite_database_is_not_herald_and_leaves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    {
        let conn = raw(&path);
        conn.execute_batch("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    match SqliteStore::open(&path) {
        Err(StoreError::NotHerald { reason, .. }) => {
            assert!(reason.contains("customers"), "{reason}");
            assert!(reason.contains("no herald marker"), "{reason}");
        }
        other => panic!("expected NotHerald, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let mode: String = raw(&path)
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete", "the journal mode was changed");
}

#[test]
fn open_of_a_newer_schema_is_too_new() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.db");
    drop(SqliteStore::open(&path).unwrap());
    raw(&path).pragma_update(None, "user_version", 99).unwrap();
    match SqliteStore::open(&path) {
        Err(StoreError::TooNew {
            location,
            found,
            known,
        }) => {
            assert_eq!(location, path.display().to_string());
            assert_eq!(found, 99);
            assert_eq!(known, SCHEMA_VERSION);
        }
        other => panic!("expected TooNew, got {other:?}"),
    }
}

/// A file that a pre-release herald made (its marker and a schema version,
/// but no baseline row) is refused with an error that says what to do, and
/// left as it was.
#[test]
fn open_of_a_pre_release_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.db");
    let conn = raw(&path);
    conn.execute_batch(
        "CREATE TABLE herald_meta (key TEXT NOT NULL PRIMARY KEY, value TEXT NOT NULL) STRICT; \
         INSERT INTO herald_meta (key, value) VALUES ('format', 'herald event store'); \
         PRAGMA user_version = 5;",
    )
    .unwrap();
    drop(conn);
    let before = std::fs::read(&path).unwrap();
    match SqliteStore::open(&path) {
        Err(StoreError::Open { reason, .. }) => {
            assert!(reason.contains("pre-release herald"), "{reason}");
            assert!(reason.contains("schema version 5"), "{reason}");
            assert!(reason.contains("move it away"), "{reason}");
        }
        other => panic!("expected Open, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

// ---------------------------------------------------------------- several connections

#[tokio::test]
async fn a_second_open_of_the_same_file_sees_the_first_ones_writes() {
    let f = fixture();
    let other = SqliteStore::open(&f.path).unwrap();
    let id = emit_one(&f.store, new_event("t", "h")).await;
    let seen = other
        .get(id)
        .await
        .unwrap()
        .expect("visible to the other connection");
    assert_eq!(seen.state, EventState::Pending);
    // And the other way round, including a claim that fences the first.
    let token = claim_one(&other, id, LEASE).await.unwrap();
    assert_eq!(
        f.store.get(id).await.unwrap().unwrap().lease.unwrap().token,
        token
    );
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_write_concurrently_without_errors() {
    let f = fixture();
    let other = SqliteStore::open(&f.path).unwrap();
    let mut tasks = Vec::new();
    for store in [f.store.clone(), other.clone()] {
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let batch: Vec<NewEvent> = (0..20).map(|_| new_event("t", "h")).collect();
                store.emit(&batch).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let counts = f
        .store
        .counts(&herald::CountsQuery::totals())
        .await
        .unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!(counts[0].total(), 2 * 50 * 20);
}

#[tokio::test]
async fn a_write_lock_held_past_the_busy_timeout_is_a_backend_error() {
    let f = fixture();
    let locker = raw(&f.path);
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let start = std::time::Instant::now();
    match f.store.emit(&[new_event("t", "h")]).await {
        Err(e @ StoreError::Backend { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with("store failed: emit: "), "{msg}");
            assert!(msg.contains("locked"), "{msg}");
            let source = std::error::Error::source(&e).expect("SQLite's error is the source");
            assert!(source.to_string().contains("locked"), "{source}");
        }
        other => panic!("expected Backend, got {other:?}"),
    }
    assert!(
        start.elapsed() >= Duration::from_millis(4500),
        "waited the busy timeout"
    );
    locker.execute_batch("ROLLBACK").unwrap();
    // Nothing was written, and the store goes on.
    assert!(f
        .store
        .counts(&herald::CountsQuery::totals())
        .await
        .unwrap()
        .is_empty());
    emit_one(&f.store, new_event("t", "h")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_from_two_connections_have_one_winner() {
    let f = fixture();
    let other = SqliteStore::open(&f.path).unwrap();
    let ids: Vec<EventId> = f
        .store
        .emit(&(0..200).map(|_| new_event("t", "h")).collect::<Vec<_>>())
        .await
        .unwrap()
        .into_iter()
        .map(Emitted::id)
        .collect();
    let mut tasks = Vec::new();
    for store in [
        f.store.clone(),
        other.clone(),
        f.store.clone(),
        other.clone(),
    ] {
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for chunk in ids.chunks(10) {
                let got = store
                    .claim(
                        &herald::testkit::leases(chunk, LeaseToken::new()),
                        &handlers(&["h"]),
                        &["t".into()],
                        LEASE,
                    )
                    .await
                    .unwrap();
                mine.extend(got.into_iter().map(|e| e.id));
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<EventId> = all.iter().copied().collect();
    assert_eq!(all.len(), 200, "each event claimed exactly once");
    assert_eq!(unique.len(), 200);
}

// ---------------------------------------------------------------- notified_at and finished_at

#[tokio::test]
async fn emit_sets_notified_at_to_run_at() {
    let f = fixture();
    let mut e = new_event("acme", "send_email");
    e.run_at = herald::RunAt::After(Duration::from_secs(5));
    let id = emit_one(&f.store, e.clone()).await;
    let run_at = f.store.get(id).await.unwrap().unwrap().run_at;
    assert_eq!(notified_at(&f.path, id), run_at.0);
    assert_eq!(finished_at(&f.path, id), None);
}

#[tokio::test]
async fn archive_and_bury_write_finished_at() {
    let f = fixture();
    let done = emit_one(&f.store, new_event("t", "h")).await;
    let dead = emit_one(&f.store, new_event("t", "h")).await;
    let t1 = claim_one(&f.store, done, LEASE).await.unwrap();
    let t2 = claim_one(&f.store, dead, LEASE).await.unwrap();
    let before = Millis::now();
    assert!(settle_one(&f.store, done, Some(t1), Finish::Archive).await);
    let bury = Finish::Bury {
        error: "failed for good".into(),
    };
    assert!(settle_one(&f.store, dead, Some(t2), bury).await);
    let after = Millis::now();
    for id in [done, dead] {
        let t = finished_at(&f.path, id).expect("finished_at is set");
        assert!(t >= before.0 && t <= after.0, "{t}");
    }
}

#[tokio::test]
async fn release_sets_notified_at_to_the_new_run_at() {
    let f = fixture();
    let id = emit_one(&f.store, new_event("t", "h")).await;
    let token = claim_one(&f.store, id, LEASE).await.unwrap();
    let fail = Finish::Release {
        wait: Duration::from_secs(30),
        error: Some("attempt 1/3 failed: boom".into()),
        give_back: false,
    };
    assert!(settle_one(&f.store, id, Some(token), fail).await);
    let e = f.store.get(id).await.unwrap().unwrap();
    assert!(e.run_at > Millis::now());
    assert_eq!(notified_at(&f.path, id), e.run_at.0);
    assert_eq!(finished_at(&f.path, id), None);
}

#[tokio::test]
async fn revive_sets_notified_at_to_its_new_run_at_and_clears_finished_at() {
    let f = fixture();
    let id = emit_one(&f.store, new_event("t", "h")).await;
    let bury = Finish::Bury {
        error: "gave up".into(),
    };
    assert!(settle_one(&f.store, id, None, bury).await);
    assert!(finished_at(&f.path, id).is_some());
    f.store.revive(id).await.unwrap().unwrap();
    let e = f.store.get(id).await.unwrap().unwrap();
    assert_eq!(notified_at(&f.path, id), e.run_at.0);
    assert_eq!(finished_at(&f.path, id), None);
}

#[tokio::test]
async fn renotify_stamps_notified_at_as_the_later_of_run_at_and_now() {
    let f = fixture();
    for chunk in 0..5 {
        let batch: Vec<NewEvent> = (0..500)
            .map(|i| {
                let mut e = old("t");
                if chunk == 4 && i == 499 {
                    e.run_at = herald::RunAt::After(Duration::from_secs(120));
                }
                e
            })
            .collect();
        f.store.emit(&batch).await.unwrap();
    }
    let start = Millis::now();
    let mut after = None;
    loop {
        let page = f.store.renotify_page("t", "h", after, 1000).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.event_id);
    }
    // Stamped: due ones at now, the delayed one at its run_at.
    let conn = raw(&f.path);
    let late: (i64, i64) = conn
        .query_row(
            "SELECT run_at, notified_at FROM events WHERE run_at > ?1",
            [Millis::now().0 + 60_000],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(late.0, late.1);
    let stale: i64 = conn
        .query_row(
            "SELECT count(*) FROM events WHERE tenant = 't' AND handler = 'h' AND state = 0 \
             AND notified_at < ?1",
            [start.0],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stale, 0);
}

// ---------------------------------------------------------------- parking

#[tokio::test]
async fn sweep_parks_held_events_and_renotify_unparks_them() {
    let f = fixture();
    let quiet = Duration::from_secs(10);
    let paused: Vec<NewEvent> = (0..5).map(|_| old("paused")).collect();
    f.store.emit(&paused).await.unwrap();
    let blocked = emit_one(&f.store, old("blocked")).await;
    let runnable = emit_one(&f.store, old("t")).await;
    f.store.add_rule(&pause("paused", "h")).await.unwrap();
    f.store.add_rule(&block("blocked", "h")).await.unwrap();
    let got = sweep(&f.store, quiet, 1000).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].event_id, runnable);
    // Parked: the sweep will not read them again.
    for id in paused.iter().map(|e| e.id).chain([blocked]) {
        assert_eq!(notified_at(&f.path, id), i64::MAX);
    }
    let mut pairs = parked_pairs(&f.path);
    pairs.sort();
    assert_eq!(
        pairs,
        vec![
            ("blocked".to_string(), "h".to_string()),
            ("paused".to_string(), "h".to_string())
        ]
    );
    // Unpause re-notifies the parked ones.
    f.store.remove_rule(&pause("paused", "h")).await.unwrap();
    let page = f
        .store
        .renotify_page("paused", "h", None, 100)
        .await
        .unwrap();
    assert_eq!(page.len(), paused.len());
    for e in &paused {
        assert!(notified_at(&f.path, e.id) <= Millis::now().0);
    }
    assert_eq!(notified_at(&f.path, blocked), i64::MAX);
}

#[tokio::test]
async fn events_parked_under_a_rule_that_is_gone_are_unparked_by_the_sweep() {
    // A crash between removing a rule and re-notifying its events
    // (renotify_page) must not leave them parked for good; the suite's
    // `events_parked_under_a_rule_that_is_gone_are_swept_again` checks what
    // the sweep returns, this the columns and the `parked` table.
    let f = fixture();
    let quiet = Duration::from_secs(10);
    let held: Vec<NewEvent> = (0..3).map(|_| old("p")).collect();
    f.store.emit(&held).await.unwrap();
    let still_held = emit_one(&f.store, old("b")).await;
    f.store.add_rule(&pause("p", "h")).await.unwrap();
    f.store.add_rule(&pause("b", "h")).await.unwrap();
    f.store.add_rule(&block("b", "h")).await.unwrap();
    assert!(sweep(&f.store, quiet, 100).await.is_empty());
    for id in held.iter().map(|e| e.id).chain([still_held]) {
        assert_eq!(notified_at(&f.path, id), i64::MAX);
    }
    // Unpause "p" and crash before paging; unpause "b", still blocked.
    f.store.remove_rule(&pause("p", "h")).await.unwrap();
    f.store.remove_rule(&pause("b", "h")).await.unwrap();
    let got: HashSet<EventId> = sweep(&f.store, quiet, 100)
        .await
        .into_iter()
        .map(|s| s.event_id)
        .collect();
    assert_eq!(got, held.iter().map(|e| e.id).collect());
    for e in &held {
        assert!(notified_at(&f.path, e.id) <= Millis::now().0);
    }
    assert_eq!(notified_at(&f.path, still_held), i64::MAX);
    assert_eq!(
        parked_pairs(&f.path),
        vec![("b".to_string(), "h".to_string())]
    );
    assert!(sweep(&f.store, quiet, 100).await.is_empty());
    assert_eq!(notified_at(&f.path, still_held), i64::MAX);
}

#[tokio::test]
async fn sweep_limits_parking_per_call_and_goes_on() {
    let f = fixture();
    let old = |tenant: &str| NewEvent {
        run_at: herald::RunAt::At(Millis(Millis::now().0 - 60_000)),
        ..new_event(tenant, "h")
    };
    f.store.add_rule(&pause("p", "h")).await.unwrap();
    // 40 held events in front of 3 runnable ones, limit 2: at most 32 parked
    // per call.
    let held: Vec<NewEvent> = (0..40).map(|_| old("p")).collect();
    f.store.emit(&held).await.unwrap();
    let runnable: Vec<NewEvent> = (0..3).map(|_| old("t")).collect();
    f.store.emit(&runnable).await.unwrap();
    let quiet = Duration::from_secs(10);
    let mut total = 0;
    let mut calls = 0;
    while total < 3 {
        total += sweep(&f.store, quiet, 2).await.len();
        calls += 1;
        assert!(calls < 10);
    }
    assert_eq!(total, 3);
    assert!(sweep(&f.store, quiet, 2).await.is_empty());
    let parked: i64 = raw(&f.path)
        .query_row(
            "SELECT count(*) FROM events WHERE notified_at = 9223372036854775807",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(parked, 40);
}

// ---------------------------------------------------------------- topics

/// A topic emit whose insert fails mid-way (a trigger raises on the fourth
/// of five copies) stores none of them, and an emit grouped with it in the
/// same commit is stored all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_emit_that_fails_mid_insert_stores_none_of_its_copies() {
    use std::sync::Arc;

    use herald::{Client, ClientError, EmitOptions, MemoryQueue, Subscription};

    let f = fixture();
    for i in 0..5 {
        let s = Subscription::every_tenant("user.signup", format!("h{i}"));
        assert!(f.store.subscribe(&s).await.unwrap());
    }
    raw(&f.path)
        .execute_batch(
            "CREATE TRIGGER fail_h3 BEFORE INSERT ON events WHEN NEW.handler = 'h3' \
             BEGIN SELECT RAISE(ABORT, 'the test refuses h3'); END;",
        )
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(f.store.clone());
    let client = Client::new(store.clone(), Arc::new(MemoryQueue::default()));
    let (topic, direct) = tokio::join!(
        client.emit_topic_json("acme", "user.signup", "{}", EmitOptions::default()),
        client.emit_json("acme", "h1", "{}", EmitOptions::default()),
    );
    match topic {
        Err(ClientError::Store(StoreError::Backend { context, .. })) => {
            assert!(context.starts_with("emit"), "{context}")
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    let direct = direct.expect("the other emit is stored");
    let count: i64 = raw(&f.path)
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 1, "only the direct emit is stored");
    assert!(f.store.get(direct.id()).await.unwrap().is_some());
    // Without the trigger the same emit stores all five.
    raw(&f.path).execute_batch("DROP TRIGGER fail_h3").unwrap();
    let out = client
        .emit_topic_json("acme", "user.signup", "{}", EmitOptions::default())
        .await
        .unwrap();
    assert_eq!(out.events.len(), 5);
}
