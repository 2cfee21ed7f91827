//! The PostgreSQL store alone, on a fresh schema per test, with exact
//! results. Without a reachable PostgreSQL each test says SKIPPED (and fails
//! with CI=true).

use herald::backend::{EventStore, Operator, Reconciliation, Rules, Topics};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use herald::backend::{Finish, LeaseRef, Scheduled, Settle};
use herald::{
    Emitted, EventId, EventState, LeaseToken, Millis, NewEvent, Rule, RuleKind, Store, StoreError,
};
use herald_postgres::testing::{self, TestSchema};
use herald_postgres::{PgStore, SCHEMA_VERSION};
use sqlx::postgres::PgPoolOptions;

const LEASE: Duration = Duration::from_secs(60);

struct Fixture {
    store: PgStore,
    _schema: TestSchema,
}

impl Fixture {
    /// A qualified table name in this fixture's schema.
    fn table(&self, name: &str) -> String {
        format!("\"{}\".{name}", self.store.schema())
    }

    async fn scalar_i64(&self, sql: &str) -> i64 {
        sqlx::query_scalar(&sql.replace("{events}", &self.table("events")))
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }
}

/// A fresh schema, or `None` after saying SKIPPED.
async fn fixture() -> Option<Fixture> {
    let (store, schema) = testing::fresh_schema(&testing::test_name()).await?;
    Some(Fixture {
        store,
        _schema: schema,
    })
}

macro_rules! fixture {
    () => {
        match fixture().await {
            Some(f) => f,
            None => return,
        }
    };
}

/// One page of a new sweep pass.
async fn sweep(store: &PgStore, quiet: Duration, limit: usize) -> Vec<Scheduled> {
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

fn handlers(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

async fn emit_one(store: &PgStore, e: NewEvent) -> EventId {
    let out = store.emit(&[e]).await.unwrap();
    match out[..] {
        [Emitted::Created(id)] => id,
        ref other => panic!("expected one Created, got {other:?}"),
    }
}

/// Claims one id with a fresh token; the token if it was claimed.
async fn claim_one(store: &PgStore, id: EventId, lease: Duration) -> Option<LeaseToken> {
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

fn pause(tenant: &str, handler: &str) -> Rule {
    Rule {
        tenant: tenant.into(),
        handler: handler.into(),
        kind: RuleKind::Pause,
    }
}

/// A pool on the test database (for schemas the fixture does not make).
async fn pool() -> Option<sqlx::PgPool> {
    if let Err(e) = testing::reachable().await {
        testing::unreachable(&testing::test_name(), &testing::database_url(), &e);
        return None;
    }
    match PgPoolOptions::new()
        .max_connections(4)
        .connect_with(testing::connect_options())
        .await
    {
        Ok(p) => Some(p),
        Err(e) => {
            testing::unreachable(&testing::test_name(), &testing::database_url(), &e);
            None
        }
    }
}

// ---------------------------------------------------------------- schema

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_idempotent_and_concurrent_migrations_agree() {
    let Some(pool) = pool().await else { return };
    let name = TestSchema::random_name();
    let _guard = TestSchema::adopt(&name);
    // Four migrators at once on a schema that does not exist yet: one
    // creates it, the others find it done.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = PgStore::from_pool_unchecked(pool.clone(), &name).unwrap();
        tasks.push(tokio::spawn(async move { store.migrate().await.unwrap() }));
    }
    let mut froms = Vec::new();
    for t in tasks {
        let (from, to) = t.await.unwrap();
        assert_eq!(to, SCHEMA_VERSION);
        froms.push(from);
    }
    froms.sort();
    assert_eq!(
        froms,
        vec![0, SCHEMA_VERSION, SCHEMA_VERSION, SCHEMA_VERSION]
    );
    // Again, through the free function the CLI uses, and the store works.
    for _ in 0..2 {
        assert_eq!(
            herald_postgres::migrate(&testing::database_url(), &name)
                .await
                .unwrap(),
            (SCHEMA_VERSION, SCHEMA_VERSION)
        );
    }
    let store = PgStore::from_pool(pool.clone(), &name).await.unwrap();
    let id = emit_one(&store, new_event("t", "h")).await;
    assert!(store.get(id).await.unwrap().is_some());
    let version: String = sqlx::query_scalar(&format!(
        "SELECT value FROM \"{name}\".meta WHERE key = 'schema_version'"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(version, SCHEMA_VERSION.to_string());
}

/// A schema that a pre-release herald made (its marker and a schema version,
/// but no baseline row) is refused with an error that says what to do, by
/// both the check and the migration, and is left as it was.
#[tokio::test]
async fn a_pre_release_schema_is_refused_with_a_clear_error() {
    let Some(pool) = pool().await else { return };
    let name = TestSchema::random_name();
    let _guard = TestSchema::adopt(&name);
    let q = format!("\"{name}\"");
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {q}; \
         CREATE TABLE {q}.meta (key text NOT NULL PRIMARY KEY, value text NOT NULL); \
         INSERT INTO {q}.meta (key, value) \
         VALUES ('format', 'herald event store'), ('schema_version', '15');"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let store = PgStore::from_pool_unchecked(pool.clone(), &name).unwrap();
    for result in [
        store.check_schema().await,
        store.migrate().await.map(|_| ()),
    ] {
        match result {
            Err(StoreError::Open { reason, .. }) => {
                assert!(reason.contains("pre-release herald"), "{reason}");
                assert!(reason.contains("schema version 15"), "{reason}");
                assert!(reason.contains("DROP SCHEMA"), "{reason}");
                assert!(reason.contains("herald migrate"), "{reason}");
            }
            other => panic!("expected Open, got {other:?}"),
        }
    }
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = $1")
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tables, 1, "nothing was created");
}

/// Every migrate applies the function files, even on a schema at the
/// current version: a function dropped by hand is back afterwards.
#[tokio::test]
async fn every_migrate_applies_the_functions() {
    let f = fixture!();
    sqlx::query(&format!("DROP FUNCTION {}", f.table("sweep_park(uuid[])")))
        .execute(f.store.pool())
        .await
        .unwrap();
    assert_eq!(
        f.store.migrate().await.unwrap(),
        (SCHEMA_VERSION, SCHEMA_VERSION)
    );
    let back: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE n.nspname = $1 AND p.proname = 'sweep_park'",
    )
    .bind(f.store.schema())
    .fetch_one(f.store.pool())
    .await
    .unwrap();
    assert_eq!(back, 1);
}

#[tokio::test]
async fn an_unmigrated_schema_is_a_clear_error_naming_the_command() {
    let Some(pool) = pool().await else { return };
    let name = TestSchema::random_name();
    let _guard = TestSchema::adopt(&name);
    // No such schema, then an empty one.
    for round in 0..2 {
        match PgStore::from_pool(pool.clone(), &name).await {
            Err(StoreError::Open { location, reason }) => {
                assert!(location.starts_with("postgres://"), "{location}");
                assert!(reason.contains("not migrated"), "{reason}");
                assert!(reason.contains("herald migrate"), "{reason}");
                assert!(reason.contains(&name), "{reason}");
            }
            other => panic!("round {round}: expected Open, got {other:?}"),
        }
        if round == 0 {
            sqlx::query(&format!("CREATE SCHEMA \"{name}\""))
                .execute(&pool)
                .await
                .unwrap();
        }
    }
    // The same through connect_with.
    let err = PgStore::connect_with(
        PgPoolOptions::new().max_connections(1),
        testing::connect_options(),
        &name,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("herald migrate"), "{err}");
}

#[tokio::test]
async fn a_foreign_schema_is_not_herald_and_is_left_alone() {
    let Some(pool) = pool().await else { return };
    let name = TestSchema::random_name();
    let _guard = TestSchema::adopt(&name);
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA \"{name}\"; CREATE TABLE \"{name}\".customers (id int PRIMARY KEY)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let store = PgStore::from_pool_unchecked(pool.clone(), &name).unwrap();
    for result in [
        store.migrate().await.map(|_| ()),
        store.check_schema().await,
    ] {
        match result {
            Err(StoreError::NotHerald { reason, .. }) => {
                assert!(reason.contains("customers"), "{reason}");
                assert!(reason.contains("no herald marker"), "{reason}");
            }
            other => panic!("expected NotHerald, got {other:?}"),
        }
    }
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = $1")
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tables, 1, "nothing was created");
}

#[tokio::test]
async fn a_newer_schema_is_too_new() {
    let f = fixture!();
    sqlx::query(&format!(
        "UPDATE {} SET value = '99' WHERE key = 'schema_version'",
        f.table("meta")
    ))
    .execute(f.store.pool())
    .await
    .unwrap();
    for result in [
        f.store.check_schema().await,
        f.store.migrate().await.map(|_| ()),
        PgStore::from_pool(f.store.pool().clone(), f.store.schema())
            .await
            .map(|_| ()),
    ] {
        match result {
            Err(StoreError::TooNew { found, known, .. }) => {
                assert_eq!(found, 99);
                assert_eq!(known, SCHEMA_VERSION);
            }
            other => panic!("expected TooNew, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_unreachable_server_is_an_open_error() {
    let options = testing::connect_options().port(1);
    match PgStore::connect_with(
        PgPoolOptions::new().acquire_timeout(Duration::from_secs(2)),
        options,
        "herald",
    )
    .await
    {
        Err(StoreError::Open { location, reason }) => {
            assert!(location.contains(":1/"), "{location}");
            assert!(!reason.is_empty());
        }
        other => panic!("expected Open, got {other:?}"),
    }
}

#[tokio::test]
async fn the_schema_name_is_quoted_not_interpolated() {
    let Some(pool) = pool().await else { return };
    let name = format!("{}\"; DROP TABLE x; --", TestSchema::random_name());
    let name = &name[..name.len().min(63)];
    let _guard = TestSchema::adopt(name);
    let store = PgStore::from_pool_unchecked(pool, name).unwrap();
    store.migrate().await.unwrap();
    let id = emit_one(&store, new_event("t", "h")).await;
    assert_eq!(store.get(id).await.unwrap().unwrap().id, id);
}

// ---------------------------------------------------------------- emit

/// An emit's delay counts from the database's clock, in the statement
/// that stores the event, not from the emitting process's. Inside a
/// transaction `now()` is the transaction's start, so a transaction that
/// waits 1.5 s before its emit is a database clock 1.5 s behind the
/// process: `run_at` must be that `now()` plus the delay, exactly, and the
/// ring leaf follows from it (due within 10 s: the filling leaf; later:
/// the cold one). `notified_at` is `run_at`.
#[tokio::test]
async fn a_delay_counts_from_the_database_clock_of_the_emit() {
    let f = fixture!();
    let soon = NewEvent {
        run_at: herald::RunAt::After(Duration::from_secs(5)),
        ..new_event("t", "h")
    };
    let later = NewEvent {
        run_at: herald::RunAt::After(Duration::from_secs(60)),
        ..new_event("t", "h")
    };
    let exact = NewEvent {
        run_at: herald::RunAt::At(Millis(1_000)),
        ..new_event("t", "h")
    };
    let mut tx = f.store.pool().begin().await.unwrap();
    let db_now: i64 = sqlx::query_scalar("SELECT floor(date_part('epoch', now()) * 1000)::bigint")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let events = [soon.clone(), later.clone(), exact.clone()];
    let out = f.store.emit_in(&mut tx, &events).await.unwrap();
    assert_eq!(out.len(), 3);
    tx.commit().await.unwrap();
    let filling: i16 = sqlx::query_scalar(&format!(
        "SELECT leaf FROM {} WHERE phase = 'filling'",
        f.table("ring")
    ))
    .fetch_one(f.store.pool())
    .await
    .unwrap();
    for (e, want, leaf) in [
        (&soon, db_now + 5_000, filling),
        (&later, db_now + 60_000, 0),
        (&exact, 1_000, filling),
    ] {
        let (run_at, notified_at, got_leaf): (i64, i64, i16) = sqlx::query_as(&format!(
            "SELECT run_at, notified_at, leaf FROM {} WHERE id = $1",
            f.table("events")
        ))
        .bind(e.id.0)
        .fetch_one(f.store.pool())
        .await
        .unwrap();
        assert_eq!(
            run_at,
            want,
            "{:?}: the database's now ({db_now}) plus the delay, not the process's clock ({})",
            e.run_at,
            Millis::now().0
        );
        assert_eq!(notified_at, run_at);
        assert_eq!(got_leaf, leaf, "{:?}", e.run_at);
    }
}

#[tokio::test]
async fn emit_of_many_is_one_batch_and_names_survive_exactly() {
    let f = fixture!();
    let odd = "O'Brien/\"x\"; DROP TABLE events;--ü";
    let batch: Vec<NewEvent> = (0..1000).map(|_| new_event(odd, "h")).collect();
    let out = f.store.emit(&batch).await.unwrap();
    assert_eq!(out.len(), 1000);
    assert!(out
        .iter()
        .zip(&batch)
        .all(|(o, e)| *o == Emitted::Created(e.id)));
    let counts = f
        .store
        .counts(&herald::CountsQuery::totals())
        .await
        .unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!((counts[0].tenant.as_str(), counts[0].total()), (odd, 1000));
    assert!(f.store.emit(&[]).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_emits_of_one_key_store_one_event() {
    let f = fixture!();
    for round in 0..5 {
        let key = format!("key-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let store = f.store.clone();
                let barrier = barrier.clone();
                let e = NewEvent {
                    idempotency_key: Some(key.clone()),
                    topic: None,
                    ..new_event("t", "h")
                };
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.emit(&[e]).await.unwrap()[0]
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        let created: Vec<EventId> = results
            .iter()
            .filter_map(|r| match r {
                Emitted::Created(id) => Some(*id),
                Emitted::Existing(_) => None,
            })
            .collect();
        assert_eq!(created.len(), 1, "round {round}: {results:?}");
        assert!(results.iter().all(|r| r.id() == created[0]), "{results:?}");
    }
    assert_eq!(
        f.store
            .counts(&herald::CountsQuery::totals())
            .await
            .unwrap()[0]
            .total(),
        5
    );
}

#[tokio::test]
async fn emit_in_a_rolled_back_transaction_stores_nothing() {
    let f = fixture!();
    let e = new_event("t", "h");
    let mut tx = f.store.pool().begin().await.unwrap();
    assert_eq!(
        f.store
            .emit_in(&mut tx, std::slice::from_ref(&e))
            .await
            .unwrap(),
        vec![Emitted::Created(e.id)]
    );
    // Invisible outside the transaction until it commits.
    assert_eq!(f.store.get(e.id).await.unwrap(), None);
    tx.rollback().await.unwrap();
    assert_eq!(f.store.get(e.id).await.unwrap(), None);
    assert!(f
        .store
        .counts(&herald::CountsQuery::totals())
        .await
        .unwrap()
        .is_empty());
    assert!(sweep(&f.store, Duration::ZERO, 100).await.is_empty());

    let g = NewEvent {
        idempotency_key: Some("k".into()),
        topic: None,
        ..new_event("t", "h")
    };
    let mut tx = f.store.pool().begin().await.unwrap();
    f.store
        .emit_in(&mut tx, std::slice::from_ref(&g))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(f.store.get(g.id).await.unwrap().unwrap().id, g.id);
}

// ---------------------------------------------------------------- claim

#[tokio::test]
async fn claim_takes_the_lease_by_the_database_clock_and_increments_attempt() {
    let f = fixture!();
    let id = emit_one(&f.store, new_event("t", "h")).await;
    let token = LeaseToken::new();
    let db_before: i64 = f
        .scalar_i64("SELECT floor(date_part('epoch', clock_timestamp()) * 1000)::bigint")
        .await;
    let got = f
        .store
        .claim(
            &herald::testkit::leases(&[id], token),
            &handlers(&["h"]),
            &["t".into()],
            LEASE,
        )
        .await
        .unwrap();
    let db_after: i64 = f
        .scalar_i64("SELECT floor(date_part('epoch', clock_timestamp()) * 1000)::bigint")
        .await;
    assert_eq!(got.len(), 1);
    let e = &got[0];
    assert_eq!(e.id, id);
    assert_eq!(e.attempt, 1);
    assert_eq!(e.state, EventState::Pending);
    let lease = e.lease.unwrap();
    assert_eq!(lease.token, token);
    let lease_ms = LEASE.as_millis() as i64;
    assert!(
        lease.expires_at.0 >= db_before + lease_ms,
        "{lease:?} {db_before}"
    );
    assert!(
        lease.expires_at.0 <= db_after + lease_ms,
        "{lease:?} {db_after}"
    );
    assert_eq!(e.updated_at, Millis(lease.expires_at.0 - lease_ms));
    // As stored.
    assert_eq!(&f.store.get(id).await.unwrap().unwrap(), e);
}

#[tokio::test]
async fn a_lease_expires_by_the_database_clock_and_the_event_is_claimable_again() {
    let f = fixture!();
    let id = emit_one(&f.store, new_event("t", "h")).await;
    let first = claim_one(&f.store, id, Duration::from_millis(300))
        .await
        .unwrap();
    // Live: nobody else can take it, and the event can't be deleted.
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);
    assert!(!f.store.delete(id).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = claim_one(&f.store, id, LEASE).await.unwrap();
    assert_ne!(first, second);
    let e = f.store.get(id).await.unwrap().unwrap();
    assert_eq!(e.lease.unwrap().token, second);
    assert_eq!(e.attempt, 2);
    // The first holder is fenced out.
    let late = Settle {
        id,
        token: Some(first),
        finish: Finish::Delete,
    };
    assert_eq!(f.store.settle(&[late]).await.unwrap().held, vec![false]);
    // inspect reports the database's clock, which judged the expiry.
    let seen = f.store.inspect(&[id]).await.unwrap();
    let db_now: i64 = f
        .scalar_i64("SELECT floor(date_part('epoch', now()) * 1000)::bigint")
        .await;
    assert!(
        (db_now - seen.now.0).abs() < 1_000,
        "{db_now} {:?}",
        seen.now
    );
    assert!(seen.found[0].event.lease.unwrap().expires_at > seen.now);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_concurrent_batch_claims_claim_each_event_once() {
    let f = fixture!();
    let ids: Vec<EventId> = f
        .store
        .emit(&(0..400).map(|_| new_event("t", "h")).collect::<Vec<_>>())
        .await
        .unwrap()
        .into_iter()
        .map(Emitted::id)
        .collect();
    let mut tasks = Vec::new();
    for k in 0..8 {
        let store = f.store.clone();
        // Each task claims every id, in its own order and batch size.
        let mut mine = ids.clone();
        if k % 2 == 1 {
            mine.reverse();
        }
        let chunk = 7 + 13 * k;
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for c in mine.chunks(chunk) {
                let claimed = store
                    .claim(
                        &herald::testkit::leases(c, LeaseToken::new()),
                        &handlers(&["h"]),
                        &["t".into()],
                        LEASE,
                    )
                    .await
                    .unwrap();
                got.extend(claimed.into_iter().map(|e| e.id));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<EventId> = all.iter().copied().collect();
    assert_eq!(all.len(), 400, "each event claimed exactly once");
    assert_eq!(unique.len(), 400);
}

// ---------------------------------------------------------------- inspect

// ---------------------------------------------------------------- settle

#[tokio::test]
async fn settle_reports_each_item_of_a_mixed_batch_in_order() {
    let f = fixture!();
    let ids: Vec<EventId> = f
        .store
        .emit(&(0..40).map(|_| new_event("t", "h")).collect::<Vec<_>>())
        .await
        .unwrap()
        .into_iter()
        .map(Emitted::id)
        .collect();
    let token = LeaseToken::new();
    f.store
        .claim(
            &herald::testkit::leases(&ids, token),
            &handlers(&["h"]),
            &["t".into()],
            LEASE,
        )
        .await
        .unwrap();
    // Kinds interleaved, every third fenced by a wrong token, in reverse id order.
    let mut batch = Vec::new();
    let mut expect = Vec::new();
    for (i, id) in ids.iter().enumerate().rev() {
        let finish = match i % 4 {
            0 => Finish::Delete,
            1 => Finish::Archive,
            2 => Finish::Release {
                wait: Duration::from_secs(1),
                error: Some("e".into()),
                give_back: false,
            },
            _ => Finish::Bury { error: "x".into() },
        };
        let good = i % 3 != 0;
        batch.push(Settle {
            id: *id,
            token: Some(if good { token } else { LeaseToken::new() }),
            finish,
        });
        expect.push(good);
    }
    assert_eq!(f.store.settle(&batch).await.unwrap().held, expect);
}

// ---------------------------------------------------------------- renew

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_and_settles_of_the_same_runs_do_not_deadlock() {
    // A worker renews every lease it holds while it settles the finished
    // ones: two batches over the same rows, at the same time, forever.
    let f = fixture!();
    let events: Vec<NewEvent> = (0..300).map(|_| new_event("t", "h")).collect();
    f.store.emit(&events).await.unwrap();
    let token = LeaseToken::new();
    let ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    f.store
        .claim(
            &herald::testkit::leases(&ids, token),
            &handlers(&["h"]),
            &["t".into()],
            LEASE,
        )
        .await
        .unwrap();
    let leases: Vec<LeaseRef> = ids.iter().map(|&id| LeaseRef { id, token }).collect();
    let renewer = {
        let store = f.store.clone();
        let mut leases = leases.clone();
        tokio::spawn(async move {
            for round in 0..30 {
                if round % 2 == 1 {
                    leases.reverse();
                }
                store.renew(&leases, LEASE).await.unwrap();
            }
        })
    };
    let mut settled = 0;
    for chunk in leases.chunks(10).rev() {
        let batch: Vec<Settle> = chunk
            .iter()
            .rev()
            .map(|l| Settle {
                id: l.id,
                token: Some(l.token),
                finish: Finish::Delete,
            })
            .collect();
        let out = f.store.settle(&batch).await.unwrap();
        settled += out.held.iter().filter(|b| **b).count();
    }
    renewer.await.unwrap();
    assert_eq!(settled, 300);
    assert!(f
        .store
        .counts(&herald::CountsQuery::totals())
        .await
        .unwrap()
        .is_empty());
}

// ---------------------------------------------------------------- rules

// ---------------------------------------------------------------- renotify

// ---------------------------------------------------------------- sweep

#[tokio::test]
async fn a_dead_workers_event_notified_long_ago_is_swept_too() {
    // The expired-lease source walks only the quiet window; an event
    // notified before the cutoff is the quiet source's.
    let f = fixture!();
    let quiet = Duration::from_secs(10);
    let e = NewEvent {
        run_at: herald::RunAt::At(Millis(Millis::now().0 - 60_000)),
        ..new_event("t", "h")
    };
    let id = emit_one(&f.store, e).await;
    claim_one(&f.store, id, Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let got: Vec<EventId> = sweep(&f.store, quiet, 10)
        .await
        .into_iter()
        .map(|s| s.event_id)
        .collect();
    assert_eq!(got, vec![id]);
    assert!(sweep(&f.store, quiet, 10).await.is_empty());
}

#[tokio::test]
async fn a_sweep_pass_with_no_quiet_returns_each_due_event_once_and_ends() {
    let f = fixture!();
    let mut all = HashSet::new();
    for _ in 0..5 {
        let batch: Vec<NewEvent> = (0..500)
            .map(|_| NewEvent {
                run_at: herald::RunAt::At(Millis(Millis::now().0 - 1_000)),
                ..new_event("t", "h")
            })
            .collect();
        all.extend(batch.iter().map(|e| e.id));
        f.store.emit(&batch).await.unwrap();
    }
    let mut pages = Vec::new();
    let mut seen = HashSet::new();
    let mut pass = None;
    loop {
        // Let the clock move, as publishing a page would.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let page = f.store.sweep(Duration::ZERO, pass, 1000).await.unwrap();
        pass = Some(page.pass);
        pages.push(page.due.len());
        for s in &page.due {
            assert!(seen.insert(s.event_id), "returned twice");
        }
        if page.complete {
            break;
        }
        assert!(pages.len() < 10, "the pass does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 500]);
    assert_eq!(seen, all);
    // A new pass with no quiet: all of them again, since all were notified
    // before it began.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(sweep(&f.store, Duration::ZERO, 1000).await.len(), 1000);
}

#[tokio::test]
async fn sweep_limits_parking_per_call_and_goes_on() {
    let f = fixture!();
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
    let parked = f
        .scalar_i64("SELECT count(*) FROM {events} WHERE notified_at = 9223372036854775807")
        .await;
    assert_eq!(parked, 40);
}

// ---------------------------------------------------------------- leaders

// ---------------------------------------------------------------- purge

// ---------------------------------------------------------------- admin

// ---------------------------------------------------------------- topics

/// A topic emit whose insert fails mid-way (a trigger raises on the fourth
/// of five copies) stores none of them, and an emit grouped with it is
/// stored all the same. The trigger is on the partitioned table, so it
/// fires in whichever leaf the rows go to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_emit_that_fails_mid_insert_stores_none_of_its_copies() {
    use herald::{Client, ClientError, EmitOptions, MemoryQueue, Subscription};

    let f = fixture!();
    for i in 0..5 {
        let s = Subscription::every_tenant("user.signup", format!("h{i}"));
        assert!(f.store.subscribe(&s).await.unwrap());
    }
    let fail = f.table("fail_h3");
    sqlx::query(&format!(
        "CREATE FUNCTION {fail}() RETURNS trigger LANGUAGE plpgsql AS \
         $$BEGIN IF NEW.handler = 'h3' THEN RAISE EXCEPTION 'the test refuses h3'; END IF; \
         RETURN NEW; END$$"
    ))
    .execute(f.store.pool())
    .await
    .unwrap();
    sqlx::query(&format!(
        "CREATE TRIGGER fail_h3 BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {fail}()",
        f.table("events")
    ))
    .execute(f.store.pool())
    .await
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(f.store.clone());
    let client = Client::new(store.clone(), Arc::new(MemoryQueue::default()));
    for options in [
        EmitOptions::default(),
        // With a key the insert and the look-ups share a transaction.
        EmitOptions::default().idempotency_key("k"),
    ] {
        let (topic, direct) = tokio::join!(
            client.emit_topic_json("acme", "user.signup", "{}", options),
            client.emit_json("acme", "h1", "{}", EmitOptions::default()),
        );
        match topic {
            Err(ClientError::Store(StoreError::Backend { context, source })) => {
                assert_eq!(context, "emit");
                assert!(source.to_string().contains("refuses h3"), "{source}");
            }
            other => panic!("expected a store error, got {other:?}"),
        }
        direct.expect("the other emit is stored");
    }
    assert_eq!(
        f.scalar_i64("SELECT count(*) FROM {events}").await,
        2,
        "only the direct emits are stored"
    );
    assert_eq!(
        f.scalar_i64("SELECT count(*) FROM {events} WHERE topic IS NOT NULL")
            .await,
        0
    );
    sqlx::query(&format!("DROP TRIGGER fail_h3 ON {}", f.table("events")))
        .execute(f.store.pool())
        .await
        .unwrap();
    let out = client
        .emit_topic_json("acme", "user.signup", "{}", EmitOptions::default())
        .await
        .unwrap();
    assert_eq!(out.events.len(), 5);
    assert_eq!(
        f.scalar_i64("SELECT count(*) FROM {events} WHERE topic = 'user.signup'")
            .await,
        5
    );
}

/// The topic column reaches every leaf of the ring and events_cold.
#[tokio::test]
async fn every_leaf_has_the_topic_column() {
    let f = fixture!();
    for leaf in ["events_cold", "events_1", "events_2", "events_3"] {
        let n = f
            .scalar_i64(&format!(
                "SELECT count(*) FROM information_schema.columns \
                 WHERE table_schema = '{}' AND table_name = '{leaf}' AND column_name = 'topic'",
                f.store.schema()
            ))
            .await;
        assert_eq!(n, 1, "{leaf} has no topic column");
    }
}
