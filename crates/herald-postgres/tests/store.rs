//! The PostgreSQL store alone, on a fresh schema per test, with exact
//! results. Without a reachable PostgreSQL each test says SKIPPED (and fails
//! with CI=true).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use herald::store::{EventFilter, Finish, LeaseRef, Scheduled, Settle};
use herald::{
    Emitted, EventId, EventState, LeaseToken, Millis, NewEvent, Rule, RuleKind, RuleMatch, Store,
    StoreError,
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

    async fn notified_at(&self, id: EventId) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT notified_at FROM {} WHERE id = $1",
            self.table("events")
        ))
        .bind(id.0)
        .fetch_one(self.store.pool())
        .await
        .unwrap()
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
        id: EventId::new(),
        tenant: tenant.into(),
        handler: handler.into(),
        payload: r#"{"n":1}"#.into(),
        run_at: Millis::now(),
        max_attempts: 3,
        idempotency_key: None,
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
        .claim(&[id], &handlers(&["h"]), token, lease)
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

fn block(tenant: &str, handler: &str) -> Rule {
    Rule {
        kind: RuleKind::Block,
        ..pause(tenant, handler)
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
        .connect_with(herald_postgres::tune(testing::connect_options()))
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

#[tokio::test]
async fn emit_stores_the_event_as_given() {
    let f = fixture!();
    let mut e = new_event("acme", "send_email");
    e.run_at = Millis(Millis::now().0 + 5_000);
    e.max_attempts = 7;
    e.idempotency_key = Some("k1".into());
    e.payload = r#"{"b": 1,   "a": [1, 2], "b": 2}"#.into();
    let before = Millis::now();
    let id = emit_one(&f.store, e.clone()).await;
    let got = f.store.get(id).await.unwrap().unwrap();
    assert_eq!(got.id, e.id);
    assert_eq!(got.tenant, "acme");
    assert_eq!(got.handler, "send_email");
    assert_eq!(got.payload, e.payload, "the payload exactly as emitted");
    assert_eq!(got.state, EventState::Pending);
    assert_eq!(got.run_at, e.run_at);
    assert_eq!(got.attempt, 0);
    assert_eq!(got.max_attempts, 7);
    assert_eq!(got.lease, None);
    assert_eq!(got.last_error, None);
    assert_eq!(got.idempotency_key.as_deref(), Some("k1"));
    assert!(got.created_at >= before.minus(Duration::from_millis(50)));
    assert!(got.created_at <= Millis::now().plus(Duration::from_millis(50)));
    assert_eq!(got.updated_at, got.created_at);
    assert_eq!(f.notified_at(id).await, e.run_at.0);
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
    let counts = f.store.counts().await.unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!((counts[0].tenant.as_str(), counts[0].count), (odd, 1000));
    assert!(f.store.emit(&[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn emitting_the_same_id_twice_reports_existing() {
    let f = fixture!();
    let e = new_event("t", "h");
    assert_eq!(
        f.store.emit(std::slice::from_ref(&e)).await.unwrap(),
        vec![Emitted::Created(e.id)]
    );
    assert_eq!(
        f.store.emit(std::slice::from_ref(&e)).await.unwrap(),
        vec![Emitted::Existing(e.id)]
    );
    // Twice within one batch, too.
    let g = new_event("t", "h");
    assert_eq!(
        f.store.emit(&[g.clone(), g.clone()]).await.unwrap(),
        vec![Emitted::Created(g.id), Emitted::Existing(g.id)]
    );
}

#[tokio::test]
async fn idempotency_key_is_one_live_event_per_key() {
    let f = fixture!();
    let keyed = |key: &str| NewEvent {
        idempotency_key: Some(key.into()),
        ..new_event("t", "h")
    };
    // Within one batch.
    let a = keyed("k");
    let b = keyed("k");
    assert_eq!(
        f.store.emit(&[a.clone(), b]).await.unwrap(),
        vec![Emitted::Created(a.id), Emitted::Existing(a.id)]
    );
    // In a later batch, while live (even while running), mixed with new ones.
    let token = claim_one(&f.store, a.id, LEASE).await.unwrap();
    let fresh = new_event("t", "h");
    assert_eq!(
        f.store
            .emit(&[keyed("k"), fresh.clone(), keyed("k")])
            .await
            .unwrap(),
        vec![
            Emitted::Existing(a.id),
            Emitted::Created(fresh.id),
            Emitted::Existing(a.id)
        ]
    );
    // Same key, other handler or tenant: independent.
    let other_handler = NewEvent {
        handler: "h2".into(),
        ..keyed("k")
    };
    let other_tenant = NewEvent {
        tenant: "t2".into(),
        ..keyed("k")
    };
    assert_eq!(
        f.store
            .emit(&[other_handler.clone(), other_tenant.clone()])
            .await
            .unwrap(),
        vec![
            Emitted::Created(other_handler.id),
            Emitted::Created(other_tenant.id)
        ]
    );
    // Re-emitting the same keyed event (a retried emit) is Existing.
    assert_eq!(
        f.store.emit(std::slice::from_ref(&a)).await.unwrap(),
        vec![Emitted::Existing(a.id)]
    );
    // Once it went dead, the key is free again.
    let bury = Settle {
        id: a.id,
        token: Some(token),
        finish: Finish::Bury {
            error: "boom".into(),
        },
    };
    assert_eq!(f.store.settle(&[bury]).await.unwrap(), vec![true]);
    let c = keyed("k");
    assert_eq!(
        f.store.emit(std::slice::from_ref(&c)).await.unwrap(),
        vec![Emitted::Created(c.id)]
    );
    // Reviving the dead one now would make two live events with one key.
    match f.store.revive(a.id).await {
        Err(StoreError::Invalid(msg)) => assert!(msg.contains(&c.id.to_string()), "{msg}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    // Once deleted, the key is free again too.
    assert!(f.store.delete(c.id).await.unwrap());
    let d = keyed("k");
    assert_eq!(
        f.store.emit(std::slice::from_ref(&d)).await.unwrap(),
        vec![Emitted::Created(d.id)]
    );
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
    assert_eq!(f.store.counts().await.unwrap()[0].count, 5);
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
    assert!(f.store.counts().await.unwrap().is_empty());
    assert!(sweep(&f.store, Duration::ZERO, 100).await.is_empty());

    let g = NewEvent {
        idempotency_key: Some("k".into()),
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
        .claim(&[id], &handlers(&["h"]), token, LEASE)
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
    assert_eq!(f.store.settle(&[late]).await.unwrap(), vec![false]);
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

#[tokio::test]
async fn claim_skips_an_event_that_is_not_due() {
    let f = fixture!();
    let mut e = new_event("t", "h");
    e.run_at = Millis(Millis::now().0 + 60_000);
    let id = emit_one(&f.store, e).await;
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);
    assert_eq!(f.store.get(id).await.unwrap().unwrap().attempt, 0);
}

#[tokio::test]
async fn claim_skips_a_paused_or_blocked_event() {
    let f = fixture!();
    let id = emit_one(&f.store, new_event("t", "h")).await;
    assert!(f.store.add_rule(&pause("t", "h")).await.unwrap());
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);
    assert!(f.store.remove_rule(&pause("t", "h")).await.unwrap());
    assert!(f.store.add_rule(&block("t", "h")).await.unwrap());
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);
    assert!(f.store.remove_rule(&block("t", "h")).await.unwrap());
    // Another tenant's pause does not hold it.
    assert!(f.store.add_rule(&pause("other", "h")).await.unwrap());
    assert!(claim_one(&f.store, id, LEASE).await.is_some());
}

#[tokio::test]
async fn claim_skips_an_event_with_no_attempts_left() {
    let f = fixture!();
    let mut e = new_event("t", "h");
    e.max_attempts = 1;
    let id = emit_one(&f.store, e).await;
    claim_one(&f.store, id, Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Expired, but attempt 1 of 1 was used: the worker must bury it instead.
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);
    let mut zero = new_event("t", "h");
    zero.max_attempts = 0;
    let zero = emit_one(&f.store, zero).await;
    assert_eq!(claim_one(&f.store, zero, LEASE).await, None);
    // A huge max_attempts is stored as "unlimited" (i32::MAX).
    let mut many = new_event("t", "h");
    many.max_attempts = u32::MAX;
    let many = emit_one(&f.store, many).await;
    assert_eq!(
        f.store.get(many).await.unwrap().unwrap().max_attempts,
        i32::MAX as u32
    );
}

#[tokio::test]
async fn claim_skips_a_handler_the_worker_does_not_have() {
    let f = fixture!();
    let id = emit_one(&f.store, new_event("t", "other")).await;
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);
    let none = f
        .store
        .claim(&[id], &[], LeaseToken::new(), LEASE)
        .await
        .unwrap();
    assert!(none.is_empty());
    let got = f
        .store
        .claim(&[id], &handlers(&["h", "other"]), LeaseToken::new(), LEASE)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
}

/// Every claim condition at once: the ids to claim and the ones that may be
/// claimed.
async fn claim_scenario(store: &PgStore) -> (Vec<EventId>, HashSet<EventId>) {
    let ok1 = emit_one(store, new_event("t", "h")).await;
    let ok2 = emit_one(store, new_event("t", "h")).await;
    let mut late = new_event("t", "h");
    late.run_at = Millis(Millis::now().0 + 60_000);
    let late = emit_one(store, late).await;
    let paused = emit_one(store, new_event("p", "h")).await;
    store.add_rule(&pause("p", "h")).await.unwrap();
    let blocked = emit_one(store, new_event("b", "h")).await;
    store.add_rule(&block("b", "h")).await.unwrap();
    let foreign = emit_one(store, new_event("t", "x")).await;
    let live = emit_one(store, new_event("t", "h")).await;
    claim_one(store, live, LEASE).await.unwrap();
    let expired = emit_one(store, new_event("t", "h")).await;
    claim_one(store, expired, Duration::from_millis(1))
        .await
        .unwrap();
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(store, spent).await;
    claim_one(store, spent, Duration::from_millis(1))
        .await
        .unwrap();
    let dead = emit_one(store, new_event("t", "h")).await;
    let bury = Settle {
        id: dead,
        token: None,
        finish: Finish::Bury { error: "x".into() },
    };
    store.settle(&[bury]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let ids = vec![
        ok1,
        late,
        EventId::new(),
        paused,
        blocked,
        foreign,
        live,
        expired,
        spent,
        dead,
        ok2,
        ok1,
    ];
    (ids, HashSet::from([ok1, ok2, expired]))
}

#[tokio::test]
async fn claim_of_a_batch_returns_only_the_claimable() {
    let f = fixture!();
    let (ids, claimable) = claim_scenario(&f.store).await;
    let token = LeaseToken::new();
    let got = f
        .store
        .claim(&ids, &handlers(&["h"]), token, LEASE)
        .await
        .unwrap();
    let got_ids: HashSet<EventId> = got.iter().map(|e| e.id).collect();
    assert_eq!(
        got.len(),
        claimable.len(),
        "each once, though ok1 is asked twice"
    );
    assert_eq!(got_ids, claimable);
    assert!(got.iter().all(|e| e.lease.unwrap().token == token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_claims_of_one_event_have_one_winner() {
    let f = fixture!();
    for round in 0..10 {
        let id = emit_one(&f.store, new_event("t", "h")).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let store = f.store.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    let token = LeaseToken::new();
                    let got = store
                        .claim(&[id], &handlers(&["h"]), token, LEASE)
                        .await
                        .unwrap();
                    (got.len(), token)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            let (n, token) = t.await.unwrap();
            if n == 1 {
                winners.push(token);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}");
        let e = f.store.get(id).await.unwrap().unwrap();
        assert_eq!(e.attempt, 1);
        assert_eq!(e.lease.unwrap().token, winners[0]);
    }
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
                    .claim(c, &handlers(&["h"]), LeaseToken::new(), LEASE)
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

#[tokio::test]
async fn inspect_loads_events_and_their_rules() {
    let f = fixture!();
    let plain = emit_one(&f.store, new_event("t", "h")).await;
    let paused = emit_one(&f.store, new_event("p", "h")).await;
    let both = emit_one(&f.store, new_event("b", "h")).await;
    f.store.add_rule(&pause("p", "h")).await.unwrap();
    f.store.add_rule(&pause("b", "h")).await.unwrap();
    f.store.add_rule(&block("b", "h")).await.unwrap();
    let before = Millis::now();
    let got = f
        .store
        .inspect(&[plain, EventId::new(), paused, both])
        .await
        .unwrap();
    assert!(got.now >= before.minus(Duration::from_millis(50)));
    assert!(got.now <= Millis::now().plus(Duration::from_millis(50)));
    assert_eq!(got.found.len(), 3);
    let rules_of = |id: EventId| got.found.iter().find(|i| i.event.id == id).unwrap().rules;
    assert_eq!(rules_of(plain), RuleMatch::default());
    assert_eq!(
        rules_of(paused),
        RuleMatch {
            blocked: false,
            paused: true
        }
    );
    assert_eq!(
        rules_of(both),
        RuleMatch {
            blocked: true,
            paused: true
        }
    );
    // Nothing found: still the clock.
    let none = f.store.inspect(&[EventId::new()]).await.unwrap();
    assert!(none.found.is_empty());
    assert!(none.now >= before.minus(Duration::from_millis(50)));
}

// ---------------------------------------------------------------- settle

#[tokio::test]
async fn settle_delete_archive_and_bury() {
    let f = fixture!();
    let ids: Vec<EventId> = f
        .store
        .emit(&[
            new_event("t", "h"),
            new_event("t", "h"),
            new_event("t", "h"),
        ])
        .await
        .unwrap()
        .into_iter()
        .map(Emitted::id)
        .collect();
    let token = LeaseToken::new();
    let claimed = f
        .store
        .claim(&ids, &handlers(&["h"]), token, LEASE)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    let before = Millis::now();
    let out = f
        .store
        .settle(&[
            Settle {
                id: ids[0],
                token: Some(token),
                finish: Finish::Delete,
            },
            Settle {
                id: ids[1],
                token: Some(token),
                finish: Finish::Archive,
            },
            Settle {
                id: EventId::new(),
                token: Some(token),
                finish: Finish::Delete,
            },
            Settle {
                id: ids[2],
                token: Some(token),
                finish: Finish::Bury {
                    error: "failed for good".into(),
                },
            },
        ])
        .await
        .unwrap();
    assert_eq!(out, vec![true, true, false, true]);
    assert_eq!(f.store.get(ids[0]).await.unwrap(), None);
    let done = f.store.get(ids[1]).await.unwrap().unwrap();
    assert_eq!(done.state, EventState::Done);
    assert_eq!(done.lease, None);
    assert!(done.updated_at >= before.minus(Duration::from_millis(50)));
    let dead = f.store.get(ids[2]).await.unwrap().unwrap();
    assert_eq!(dead.state, EventState::Dead);
    assert_eq!(dead.lease, None);
    assert_eq!(dead.last_error.as_deref(), Some("failed for good"));
    assert_eq!(dead.attempt, 1);
    let unfinished = f
        .scalar_i64("SELECT count(*) FROM {events} WHERE state <> 0 AND finished_at IS NULL")
        .await;
    assert_eq!(unfinished, 0);
    // A finished event has no run to end, even fenced on "no lease".
    let again = Settle {
        id: ids[2],
        token: None,
        finish: Finish::Delete,
    };
    assert_eq!(f.store.settle(&[again]).await.unwrap(), vec![false]);
    assert!(f.store.settle(&[]).await.unwrap().is_empty());
}

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
        .claim(&ids, &handlers(&["h"]), token, LEASE)
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
    assert_eq!(f.store.settle(&batch).await.unwrap(), expect);
}

#[tokio::test]
async fn release_arithmetic() {
    let f = fixture!();
    let id = emit_one(&f.store, new_event("t", "h")).await;

    // A failure: attempt kept, error recorded, run_at = now + wait.
    let t1 = claim_one(&f.store, id, LEASE).await.unwrap();
    let before = Millis::now();
    let fail = Settle {
        id,
        token: Some(t1),
        finish: Finish::Release {
            wait: Duration::from_secs(30),
            error: Some("attempt 1/3 failed: boom".into()),
            give_back: false,
        },
    };
    assert_eq!(f.store.settle(&[fail]).await.unwrap(), vec![true]);
    let e = f.store.get(id).await.unwrap().unwrap();
    assert_eq!(e.attempt, 1);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    let slack = Duration::from_millis(50);
    assert!(e.run_at >= before.plus(Duration::from_secs(30)).minus(slack));
    assert!(e.run_at <= Millis::now().plus(Duration::from_secs(30)).plus(slack));
    assert_eq!(e.updated_at, e.run_at.minus(Duration::from_secs(30)));
    assert_eq!(f.notified_at(id).await, e.run_at.0);
    // Not due now.
    assert_eq!(claim_one(&f.store, id, LEASE).await, None);

    // A snooze: the attempt is given back; the last error is kept.
    let release_now = |token: Option<LeaseToken>, give_back: bool| Settle {
        id,
        token,
        finish: Finish::Release {
            wait: Duration::ZERO,
            error: None,
            give_back,
        },
    };
    // Fenced on "no lease": the event is not leased now.
    assert_eq!(
        f.store.settle(&[release_now(None, false)]).await.unwrap(),
        vec![true]
    );
    let t2 = claim_one(&f.store, id, LEASE).await.unwrap();
    assert_eq!(f.store.get(id).await.unwrap().unwrap().attempt, 2);
    assert_eq!(
        f.store
            .settle(&[release_now(Some(t2), true)])
            .await
            .unwrap(),
        vec![true]
    );
    let e = f.store.get(id).await.unwrap().unwrap();
    assert_eq!(e.attempt, 1);
    assert_eq!(e.last_error.as_deref(), Some("attempt 1/3 failed: boom"));
    assert!(e.run_at <= Millis::now().plus(slack));

    // Giving back never goes below zero; an endless wait is capped, never parked.
    let fresh = emit_one(&f.store, new_event("t", "h")).await;
    let give = Settle {
        id: fresh,
        token: None,
        finish: Finish::Release {
            wait: Duration::MAX,
            error: None,
            give_back: true,
        },
    };
    assert_eq!(f.store.settle(&[give]).await.unwrap(), vec![true]);
    let e = f.store.get(fresh).await.unwrap().unwrap();
    assert_eq!(e.attempt, 0);
    assert!(e.run_at.0 < i64::MAX && e.run_at > Millis::now());
}

#[tokio::test]
async fn a_stale_token_can_neither_settle_nor_renew() {
    let f = fixture!();
    let finishes = [
        Finish::Delete,
        Finish::Archive,
        Finish::Release {
            wait: Duration::ZERO,
            error: Some("late".into()),
            give_back: true,
        },
        Finish::Bury {
            error: "late".into(),
        },
    ];
    for finish in finishes {
        let id = emit_one(&f.store, new_event("t", "h")).await;
        let stale = claim_one(&f.store, id, Duration::from_millis(1))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let fresh = claim_one(&f.store, id, LEASE).await.unwrap();
        let held = f.store.get(id).await.unwrap().unwrap();

        let late = Settle {
            id,
            token: Some(stale),
            finish: finish.clone(),
        };
        assert_eq!(
            f.store.settle(&[late]).await.unwrap(),
            vec![false],
            "{finish:?}"
        );
        let no_lease = Settle {
            id,
            token: None,
            finish: finish.clone(),
        };
        assert_eq!(
            f.store.settle(&[no_lease]).await.unwrap(),
            vec![false],
            "{finish:?}"
        );
        assert_eq!(
            f.store
                .renew(&[LeaseRef { id, token: stale }], LEASE)
                .await
                .unwrap(),
            vec![false]
        );
        assert_eq!(f.store.get(id).await.unwrap().unwrap(), held, "{finish:?}");

        // The holder still can.
        let own = Settle {
            id,
            token: Some(fresh),
            finish,
        };
        assert_eq!(f.store.settle(&[own]).await.unwrap(), vec![true]);
    }
}

// ---------------------------------------------------------------- renew

#[tokio::test]
async fn renew_extends_held_leases_only() {
    let f = fixture!();
    let a = emit_one(&f.store, new_event("t", "h")).await;
    let b = emit_one(&f.store, new_event("t", "h")).await;
    let ta = claim_one(&f.store, a, Duration::from_secs(1))
        .await
        .unwrap();
    let tb = claim_one(&f.store, b, Duration::from_secs(1))
        .await
        .unwrap();
    let before = Millis::now();
    let out = f
        .store
        .renew(
            &[
                LeaseRef { id: a, token: ta },
                LeaseRef { id: b, token: ta },
                LeaseRef {
                    id: EventId::new(),
                    token: ta,
                },
                LeaseRef { id: b, token: tb },
            ],
            LEASE,
        )
        .await
        .unwrap();
    assert_eq!(out, vec![true, false, false, true]);
    for id in [a, b] {
        let lease = f.store.get(id).await.unwrap().unwrap().lease.unwrap();
        assert!(lease.expires_at >= before.plus(LEASE).minus(Duration::from_millis(50)));
    }
    // A settled event's lease is gone.
    let done = Settle {
        id: a,
        token: Some(ta),
        finish: Finish::Archive,
    };
    f.store.settle(&[done]).await.unwrap();
    assert_eq!(
        f.store
            .renew(&[LeaseRef { id: a, token: ta }], LEASE)
            .await
            .unwrap(),
        vec![false]
    );
    assert!(f.store.renew(&[], LEASE).await.unwrap().is_empty());
}

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
        .claim(&ids, &handlers(&["h"]), token, LEASE)
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
        settled += out.iter().filter(|b| **b).count();
    }
    renewer.await.unwrap();
    assert_eq!(settled, 300);
    assert!(f.store.counts().await.unwrap().is_empty());
}

// ---------------------------------------------------------------- rules

#[tokio::test]
async fn rules_add_remove_and_list() {
    let f = fixture!();
    assert!(f.store.add_rule(&pause("t", "h")).await.unwrap());
    assert!(!f.store.add_rule(&pause("t", "h")).await.unwrap());
    assert!(f.store.add_rule(&block("t", "h")).await.unwrap());
    assert!(f.store.add_rule(&block("a", "z")).await.unwrap());
    assert_eq!(
        f.store.rules_for("t", "h").await.unwrap(),
        RuleMatch {
            blocked: true,
            paused: true
        }
    );
    assert_eq!(
        f.store.rules_for("t", "other").await.unwrap(),
        RuleMatch::default()
    );
    assert_eq!(
        f.store.rules().await.unwrap(),
        vec![block("a", "z"), block("t", "h"), pause("t", "h")]
    );
    assert!(f.store.remove_rule(&pause("t", "h")).await.unwrap());
    assert!(!f.store.remove_rule(&pause("t", "h")).await.unwrap());
    assert_eq!(
        f.store.rules_for("t", "h").await.unwrap(),
        RuleMatch {
            blocked: true,
            paused: false
        }
    );
}

// ---------------------------------------------------------------- renotify

#[tokio::test]
async fn renotify_pages_through_2500_events_without_duplicates_or_gaps() {
    let f = fixture!();
    let mut expected = Vec::new();
    for chunk in 0..5 {
        let batch: Vec<NewEvent> = (0..500)
            .map(|i| {
                let mut e = new_event("t", "h");
                if chunk == 4 && i == 499 {
                    e.run_at = Millis(Millis::now().0 + 120_000);
                }
                e
            })
            .collect();
        expected.extend(batch.iter().map(|e| e.id));
        f.store.emit(&batch).await.unwrap();
    }
    // Not part of the page set: other handler, other tenant, finished.
    emit_one(&f.store, new_event("t", "other")).await;
    emit_one(&f.store, new_event("u", "h")).await;
    let dead = emit_one(&f.store, new_event("t", "h")).await;
    let bury = Settle {
        id: dead,
        token: None,
        finish: Finish::Bury { error: "x".into() },
    };
    assert_eq!(f.store.settle(&[bury]).await.unwrap(), vec![true]);
    expected.sort();

    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = Vec::new();
    let start = Millis::now().minus(Duration::from_millis(50));
    loop {
        let page = f.store.renotify_page("t", "h", after, 1000).await.unwrap();
        if page.is_empty() {
            break;
        }
        pages.push(page.len());
        after = Some(page.last().unwrap().notification.event_id);
        for s in page {
            assert_eq!(s.notification.tenant, "t");
            seen.push(s.notification.event_id);
            if s.delay > Duration::ZERO {
                assert!(s.delay > Duration::from_secs(100), "{s:?}");
            }
        }
    }
    assert_eq!(pages, vec![1000, 1000, 500]);
    assert_eq!(seen, expected, "every pending event once, in id order");
    // Stamped: due ones at now, the delayed one at its run_at.
    let late_equal = f
        .scalar_i64(&format!(
            "SELECT count(*) FROM {{events}} WHERE run_at > {} AND run_at = notified_at",
            Millis::now().0 + 60_000
        ))
        .await;
    assert_eq!(late_equal, 1);
    let stale = f
        .scalar_i64(&format!(
            "SELECT count(*) FROM {{events}} WHERE tenant = 't' AND handler = 'h' AND state = 0 \
             AND notified_at < {}",
            start.0
        ))
        .await;
    assert_eq!(stale, 0);
    assert!(f
        .store
        .renotify_page("t", "h", None, 0)
        .await
        .unwrap()
        .is_empty());
}

// ---------------------------------------------------------------- sweep

#[tokio::test]
async fn sweep_pages_through_due_events_and_skips_held_ones() {
    let f = fixture!();
    let quiet = Duration::from_secs(10);
    let long_ago = || Millis(Millis::now().0 - 60_000);
    let old = |tenant: &str| NewEvent {
        run_at: long_ago(),
        ..new_event(tenant, "h")
    };

    // 2,500 due events, not notified for a minute.
    let mut due: Vec<EventId> = Vec::new();
    for _ in 0..5 {
        let batch: Vec<NewEvent> = (0..500).map(|_| old("t")).collect();
        due.extend(batch.iter().map(|e| e.id));
        f.store.emit(&batch).await.unwrap();
    }
    // Held by rules: parked, not returned.
    let paused: Vec<NewEvent> = (0..5).map(|_| old("paused")).collect();
    let blocked = old("blocked");
    let mut held = paused.clone();
    held.push(blocked.clone());
    f.store.emit(&held).await.unwrap();
    f.store.add_rule(&pause("paused", "h")).await.unwrap();
    f.store.add_rule(&block("blocked", "h")).await.unwrap();
    // Running under a live lease: skipped.
    let running = emit_one(&f.store, old("t")).await;
    claim_one(&f.store, running, LEASE).await.unwrap();
    // Not due.
    let mut later = new_event("t", "h");
    later.run_at = Millis(Millis::now().0 + 60_000);
    let later = emit_one(&f.store, later).await;
    // Recently notified (emitted just now): not yet.
    let fresh = emit_one(&f.store, new_event("t", "h")).await;
    // A dead worker's event: emitted and claimed just now (so notified
    // recently), its lease already expired. Returned at once, no quiet needed.
    let orphan = emit_one(&f.store, new_event("t", "h")).await;
    claim_one(&f.store, orphan, Duration::from_millis(1))
        .await
        .unwrap();
    // Out of attempts but expired: returned too (the worker buries it).
    let mut spent = new_event("t", "h");
    spent.max_attempts = 1;
    let spent = emit_one(&f.store, spent).await;
    claim_one(&f.store, spent, Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut pages = Vec::new();
    let mut seen = Vec::new();
    loop {
        let page = sweep(&f.store, quiet, 1000).await;
        if page.is_empty() {
            break;
        }
        pages.push(page.len());
        for s in page {
            assert_eq!(s.delay, Duration::ZERO);
            seen.push(s.notification.event_id);
        }
        assert!(pages.len() < 10, "the sweep does not end");
    }
    assert_eq!(pages, vec![1000, 1000, 502]);
    // The dead workers' events come first.
    let first_two: HashSet<EventId> = seen[..2].iter().copied().collect();
    assert_eq!(first_two, HashSet::from([orphan, spent]));
    let unique: HashSet<EventId> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates");
    let mut expected: HashSet<EventId> = due.iter().copied().collect();
    expected.insert(orphan);
    expected.insert(spent);
    assert_eq!(unique, expected);
    for skipped in [running, later, fresh] {
        assert!(!unique.contains(&skipped));
    }
    // Parked: the sweep will not read them again.
    for e in held.iter() {
        assert_eq!(f.notified_at(e.id).await, i64::MAX);
    }
    // Returned ones were stamped now, so a second sweep finds nothing.
    assert!(sweep(&f.store, quiet, 1000).await.is_empty());

    // Unpause re-notifies the parked ones.
    f.store.remove_rule(&pause("paused", "h")).await.unwrap();
    let page = f
        .store
        .renotify_page("paused", "h", None, 100)
        .await
        .unwrap();
    let mut sorted: Vec<EventId> = paused.iter().map(|e| e.id).collect();
    sorted.sort();
    assert_eq!(
        page.iter()
            .map(|s| s.notification.event_id)
            .collect::<Vec<_>>(),
        sorted
    );
    for id in &sorted {
        assert!(f.notified_at(*id).await <= Millis::now().0 + 50);
    }
}

#[tokio::test]
async fn a_dead_workers_event_notified_long_ago_is_swept_too() {
    // The expired-lease source walks only the quiet window; an event
    // notified before the cutoff is the quiet source's.
    let f = fixture!();
    let quiet = Duration::from_secs(10);
    let e = NewEvent {
        run_at: Millis(Millis::now().0 - 60_000),
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
        .map(|s| s.notification.event_id)
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
                run_at: Millis(Millis::now().0 - 1_000),
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
            assert!(seen.insert(s.notification.event_id), "returned twice");
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
async fn events_parked_under_a_rule_that_is_gone_are_swept_again() {
    let f = fixture!();
    let quiet = Duration::from_secs(10);
    let old = |tenant: &str| NewEvent {
        run_at: Millis(Millis::now().0 - 60_000),
        ..new_event(tenant, "h")
    };
    let held: Vec<NewEvent> = (0..3).map(|_| old("p")).collect();
    f.store.emit(&held).await.unwrap();
    let still_held = old("b");
    f.store
        .emit(std::slice::from_ref(&still_held))
        .await
        .unwrap();
    f.store.add_rule(&pause("p", "h")).await.unwrap();
    f.store.add_rule(&pause("b", "h")).await.unwrap();
    f.store.add_rule(&block("b", "h")).await.unwrap();
    assert!(sweep(&f.store, quiet, 100).await.is_empty());
    for e in held.iter().chain([&still_held]) {
        assert_eq!(f.notified_at(e.id).await, i64::MAX);
    }
    // Unpause "p" and crash before paging; unpause "b", still blocked.
    f.store.remove_rule(&pause("p", "h")).await.unwrap();
    f.store.remove_rule(&pause("b", "h")).await.unwrap();
    let got: HashSet<EventId> = sweep(&f.store, quiet, 100)
        .await
        .into_iter()
        .map(|s| s.notification.event_id)
        .collect();
    assert_eq!(got, held.iter().map(|e| e.id).collect());
    assert_eq!(f.notified_at(still_held.id).await, i64::MAX);
    let pairs: Vec<(String, String)> = sqlx::query_as(&format!(
        "SELECT tenant, handler FROM {}",
        f.table("parked")
    ))
    .fetch_all(f.store.pool())
    .await
    .unwrap();
    assert_eq!(pairs, vec![("b".to_string(), "h".to_string())]);
    assert!(sweep(&f.store, quiet, 100).await.is_empty());
}

#[tokio::test]
async fn sweep_limits_parking_per_call_and_goes_on() {
    let f = fixture!();
    let old = |tenant: &str| NewEvent {
        run_at: Millis(Millis::now().0 - 60_000),
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

#[tokio::test]
async fn lead_and_resign_with_two_holders() {
    let f = fixture!();
    let role = "reconciler";
    assert!(f.store.lead(role, "a", LEASE).await.unwrap());
    assert!(!f.store.lead(role, "b", LEASE).await.unwrap());
    assert!(f.store.lead(role, "a", LEASE).await.unwrap(), "renewal");
    // Another role is independent.
    assert!(f.store.lead("purger", "b", LEASE).await.unwrap());
    // Resigning someone else's lease does nothing.
    f.store.resign(role, "b").await.unwrap();
    assert!(!f.store.lead(role, "b", LEASE).await.unwrap());
    f.store.resign(role, "a").await.unwrap();
    assert!(f
        .store
        .lead(role, "b", Duration::from_millis(300))
        .await
        .unwrap());
    assert!(!f.store.lead(role, "a", LEASE).await.unwrap());
    // b's lease lapses (by the database's clock): a takes over.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(f.store.lead(role, "a", LEASE).await.unwrap());
    assert!(!f.store.lead(role, "b", LEASE).await.unwrap());
}

// ---------------------------------------------------------------- purge

#[tokio::test]
async fn purge_deletes_old_dead_and_done_events_up_to_the_limit() {
    let f = fixture!();
    let mut dead = Vec::new();
    let mut done = Vec::new();
    for i in 0..5 {
        let id = emit_one(&f.store, new_event("t", "h")).await;
        let finish = if i < 3 {
            dead.push(id);
            Finish::Bury { error: "x".into() }
        } else {
            done.push(id);
            Finish::Archive
        };
        let s = Settle {
            id,
            token: None,
            finish,
        };
        assert_eq!(f.store.settle(&[s]).await.unwrap(), vec![true]);
    }
    let pending = emit_one(&f.store, new_event("t", "h")).await;
    let past = Millis(Millis::now().0 - 60_000);
    let future = Millis(Millis::now().0 + 60_000);
    assert_eq!(f.store.purge(past, past, 100).await.unwrap(), 0);
    assert_eq!(f.store.purge(future, past, 2).await.unwrap(), 2);
    assert_eq!(f.store.purge(future, past, 2).await.unwrap(), 1);
    assert_eq!(f.store.purge(future, past, 2).await.unwrap(), 0);
    for id in &dead {
        assert_eq!(f.store.get(*id).await.unwrap(), None);
    }
    assert_eq!(f.store.purge(past, future, 0).await.unwrap(), 0);
    assert_eq!(f.store.purge(past, future, 100).await.unwrap(), 2);
    for id in &done {
        assert_eq!(f.store.get(*id).await.unwrap(), None);
    }
    assert!(f.store.get(pending).await.unwrap().is_some());
}

// ---------------------------------------------------------------- admin

#[tokio::test]
async fn list_filters_and_pages_by_id() {
    let f = fixture!();
    let mut all = Vec::new();
    for (tenant, handler) in [("a", "x"), ("a", "y"), ("b", "x")] {
        for _ in 0..4 {
            all.push((
                emit_one(&f.store, new_event(tenant, handler)).await,
                tenant,
                handler,
            ));
        }
    }
    // Bury two of a/x.
    let ax: Vec<EventId> = all
        .iter()
        .filter(|(_, t, h)| *t == "a" && *h == "x")
        .map(|(id, _, _)| *id)
        .collect();
    for id in &ax[1..3] {
        let s = Settle {
            id: *id,
            token: None,
            finish: Finish::Bury { error: "e".into() },
        };
        f.store.settle(&[s]).await.unwrap();
    }
    let ids = |events: Vec<herald::Event>| events.into_iter().map(|e| e.id).collect::<Vec<_>>();

    let every = ids(f.store.list(&EventFilter::default(), 100).await.unwrap());
    let mut sorted: Vec<EventId> = all.iter().map(|(id, _, _)| *id).collect();
    sorted.sort();
    assert_eq!(every, sorted);

    // Paging with a cursor.
    let mut paged = Vec::new();
    let mut filter = EventFilter::default();
    loop {
        let page = ids(f.store.list(&filter, 5).await.unwrap());
        if page.is_empty() {
            break;
        }
        filter.after = page.last().copied();
        paged.extend(page);
    }
    assert_eq!(paged, sorted);

    // One handler, all states merged in id order, paged.
    let one = EventFilter {
        tenant: Some("a".into()),
        handler: Some("x".into()),
        ..EventFilter::default()
    };
    assert_eq!(ids(f.store.list(&one, 100).await.unwrap()), ax);
    assert_eq!(ids(f.store.list(&one, 3).await.unwrap()), ax[..3]);
    let rest = EventFilter {
        after: Some(ax[1]),
        ..one.clone()
    };
    assert_eq!(ids(f.store.list(&rest, 100).await.unwrap()), ax[2..]);
    let dead_only = EventFilter {
        state: Some(EventState::Dead),
        ..one.clone()
    };
    assert_eq!(ids(f.store.list(&dead_only, 100).await.unwrap()), ax[1..3]);

    // Tenant only, handler only, state only.
    let tenant_b = EventFilter {
        tenant: Some("b".into()),
        ..EventFilter::default()
    };
    assert_eq!(f.store.list(&tenant_b, 100).await.unwrap().len(), 4);
    let handler_x = EventFilter {
        handler: Some("x".into()),
        ..EventFilter::default()
    };
    assert_eq!(f.store.list(&handler_x, 100).await.unwrap().len(), 8);
    let dead = EventFilter {
        state: Some(EventState::Dead),
        ..EventFilter::default()
    };
    assert_eq!(ids(f.store.list(&dead, 100).await.unwrap()), ax[1..3]);
    assert!(f.store.list(&dead, 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn counts_by_tenant_handler_and_state() {
    let f = fixture!();
    for _ in 0..3 {
        emit_one(&f.store, new_event("a", "x")).await;
    }
    let d = emit_one(&f.store, new_event("a", "x")).await;
    emit_one(&f.store, new_event("b", "y")).await;
    let s = Settle {
        id: d,
        token: None,
        finish: Finish::Bury { error: "e".into() },
    };
    f.store.settle(&[s]).await.unwrap();
    let got: Vec<(String, String, EventState, u64)> = f
        .store
        .counts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.tenant, c.handler, c.state, c.count))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".into(), "x".into(), EventState::Pending, 3),
            ("a".into(), "x".into(), EventState::Dead, 1),
            ("b".into(), "y".into(), EventState::Pending, 1),
        ]
    );
}

#[tokio::test]
async fn revive_moves_a_dead_event_back_to_pending() {
    let f = fixture!();
    let id = emit_one(&f.store, new_event("t", "h")).await;
    let token = claim_one(&f.store, id, LEASE).await.unwrap();
    // Not dead yet.
    assert_eq!(f.store.revive(id).await.unwrap(), None);
    let bury = Settle {
        id,
        token: Some(token),
        finish: Finish::Bury {
            error: "gave up".into(),
        },
    };
    f.store.settle(&[bury]).await.unwrap();
    let before = Millis::now().minus(Duration::from_millis(50));
    let s = f.store.revive(id).await.unwrap().unwrap();
    assert_eq!(s.notification.event_id, id);
    assert_eq!(s.notification.tenant, "t");
    assert_eq!(s.delay, Duration::ZERO);
    let e = f.store.get(id).await.unwrap().unwrap();
    assert_eq!(e.state, EventState::Pending);
    assert_eq!(e.attempt, 0);
    assert_eq!(e.lease, None);
    assert_eq!(e.last_error.as_deref(), Some("gave up"));
    assert!(e.run_at >= before && e.run_at <= Millis::now().plus(Duration::from_millis(50)));
    assert_eq!(f.notified_at(id).await, e.run_at.0);
    assert!(claim_one(&f.store, id, LEASE).await.is_some());
    assert_eq!(f.store.revive(EventId::new()).await.unwrap(), None);
}

#[tokio::test]
async fn delete_refuses_only_a_running_event() {
    let f = fixture!();
    let idle = emit_one(&f.store, new_event("t", "h")).await;
    assert!(f.store.delete(idle).await.unwrap());
    assert!(!f.store.delete(idle).await.unwrap());

    let running = emit_one(&f.store, new_event("t", "h")).await;
    claim_one(&f.store, running, LEASE).await.unwrap();
    assert!(!f.store.delete(running).await.unwrap());

    let expired = emit_one(&f.store, new_event("t", "h")).await;
    claim_one(&f.store, expired, Duration::from_millis(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(f.store.delete(expired).await.unwrap());

    let dead = emit_one(&f.store, new_event("t", "h")).await;
    let s = Settle {
        id: dead,
        token: None,
        finish: Finish::Bury { error: "e".into() },
    };
    f.store.settle(&[s]).await.unwrap();
    assert!(f.store.delete(dead).await.unwrap());
}

#[tokio::test]
async fn the_store_works_through_a_trait_object() {
    let f = fixture!();
    let store: Arc<dyn Store> = Arc::new(f.store.clone());
    let id = store.emit(&[new_event("t", "h")]).await.unwrap()[0].id();
    assert!(store.get(id).await.unwrap().is_some());
}
