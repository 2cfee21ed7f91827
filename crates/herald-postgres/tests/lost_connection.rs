//! An emit whose connection is cut mid-batch: the store tries again (the
//! ids are the client's, so a retry inserts what is missing and finds what
//! exists), and fails with `StoreError::Unavailable` only when the database
//! stays away.
//!
//! A connection that dies while idle in the pool is pinged and replaced
//! before its next use ([`herald_postgres::IDLE_PING`]).
//!
//! The cut is not timed: a trigger on the test schema's `events` makes the
//! inserting backend terminate itself (`pg_terminate_backend(pg_backend_pid())`)
//! when it reaches the batch's marked row, as long as a sequence (which a
//! rollback does not undo) says there are cuts left.

use herald::backend::{EventStore, Operator};
use std::collections::HashSet;
use std::time::Duration;

use herald::{CountsQuery, Emitted, EventId, EventState, Millis, NewEvent, StoreError};
use herald_postgres::testing::{self, TestSchema};
use herald_postgres::PgStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};

/// Events per batch; the marked one is in the middle.
const BATCH: usize = 400;

fn batch(key_every: Option<usize>) -> Vec<NewEvent> {
    let now = Millis::now();
    (0..BATCH)
        .map(|i| NewEvent {
            singleton: None,
            concurrency_key: None,
            id: EventId::new(),
            tenant: "acme".into(),
            handler: "cut".into(),
            payload: if i == BATCH / 2 {
                "\"cut here\"".into()
            } else {
                format!("{{\"n\":{i}}}")
            },
            run_at: herald::RunAt::At(now),
            max_attempts: 3,
            idempotency_key: key_every.filter(|k| i % k == 0).map(|_| format!("k{i}")),
            topic: None,
        })
        .collect()
}

/// Makes the next `cuts` inserts of a marked row kill their own backend.
async fn arm(store: &PgStore, schema: &TestSchema, cuts: i64) {
    let s = format!("\"{}\"", schema.name());
    sqlx::raw_sql(&format!(
        "CREATE SEQUENCE {s}.cuts; \
         CREATE FUNCTION {s}.cut() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF NEW.payload = '\"cut here\"' AND nextval('{s}.cuts') <= {cuts} THEN \
             PERFORM pg_terminate_backend(pg_backend_pid()); \
             PERFORM pg_sleep(60); \
           END IF; \
           RETURN NEW; \
         END $$; \
         CREATE TRIGGER cut BEFORE INSERT ON {s}.events \
           FOR EACH ROW EXECUTE FUNCTION {s}.cut();"
    ))
    .execute(store.pool())
    .await
    .expect("arm the cut");
}

/// How many times the trigger fired.
async fn fired(store: &PgStore, schema: &TestSchema) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM \"{}\".cuts",
        schema.name()
    ))
    .fetch_one(store.pool())
    .await
    .expect("read the sequence")
}

/// Every event of the batch is stored exactly once, as emitted.
async fn assert_stored_once(store: &PgStore, events: &[NewEvent], emitted: &[Emitted]) {
    assert_eq!(emitted.len(), events.len());
    for (e, out) in events.iter().zip(emitted) {
        assert_eq!(
            *out,
            Emitted::Created(e.id),
            "a retried emit reports its own events as created"
        );
        let got = store.get(e.id).await.unwrap().expect("stored");
        assert_eq!(got.payload, e.payload);
        assert_eq!(got.state, EventState::Pending);
    }
    let n: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{}\".events",
        store.schema()
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(n as usize, events.len(), "no event stored twice");
    let ids: HashSet<EventId> = emitted.iter().map(|e| e.id()).collect();
    assert_eq!(ids.len(), events.len());
}

#[tokio::test]
async fn an_emit_cut_mid_batch_is_retried_and_stores_each_event_once() {
    let Some((store, schema)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    arm(&store, &schema, 2).await;
    let events = batch(None);
    let emitted = store
        .emit(&events)
        .await
        .expect("the emit survives two cuts");
    assert_eq!(
        fired(&store, &schema).await,
        3,
        "cut twice, then let through"
    );
    assert_stored_once(&store, &events, &emitted).await;
}

#[tokio::test]
async fn a_keyed_emit_cut_mid_batch_is_retried_and_stores_each_event_once() {
    let Some((store, schema)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    arm(&store, &schema, 1).await;
    // Keyed events go through a transaction (insert, then look-ups).
    let events = batch(Some(7));
    let emitted = store.emit(&events).await.expect("the emit survives a cut");
    assert_eq!(fired(&store, &schema).await, 2);
    assert_stored_once(&store, &events, &emitted).await;
}

#[tokio::test]
async fn an_emit_cut_every_time_fails_as_unavailable_and_stores_nothing() {
    let Some((store, schema)) = testing::fresh_schema(&testing::test_name()).await else {
        return;
    };
    arm(&store, &schema, i64::MAX).await;
    let events = batch(None);
    match store.emit(&events).await {
        Err(StoreError::Unavailable { source, .. }) => {
            assert!(
                source.to_string().contains("terminat") || source.to_string().contains("closed"),
                "the source is kept: {source}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(fired(&store, &schema).await, 6, "six tries");
    for e in &events {
        assert!(store.get(e.id).await.unwrap().is_none());
    }
}

#[tokio::test]
async fn an_emit_to_a_closed_port_fails_as_unavailable() {
    // Borrow the test schema's name rules; nothing listens on port 1.
    let options = testing::connect_options().port(1);
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(100))
        .connect_lazy_with(options);
    let store = PgStore::from_pool_unchecked(pool, "herald").unwrap();
    match store.emit(&batch(None)).await {
        Err(e @ StoreError::Unavailable { .. }) => {
            assert!(e.to_string().contains("unavailable"), "{e}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// Terminates the one connection of `store`'s pool (a pool of one) from
/// another connection, and waits until it is gone, as after a server
/// restart or a proxy's idle timeout.
async fn kill_the_idle_connection(store: &PgStore) {
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("the pool's backend");
    let mut other = PgConnection::connect_with(&testing::connect_options())
        .await
        .expect("a second connection");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pid)
        .fetch_one(&mut other)
        .await
        .expect("terminate the pool's backend");
    assert!(killed, "backend {pid} was terminated");
    other.close().await.ok();
}

#[tokio::test]
async fn a_connection_killed_while_idle_is_replaced_before_use() {
    let pool = herald_postgres::pool_options().max_connections(1);
    let Some((store, _schema)) = testing::fresh_schema_with(&testing::test_name(), pool).await
    else {
        return;
    };
    kill_the_idle_connection(&store).await;
    tokio::time::sleep(herald_postgres::IDLE_PING + Duration::from_millis(200)).await;
    store
        .counts(&CountsQuery::all())
        .await
        .expect("the dead connection was pinged and replaced");
}

/// What the ping is for: the same without it fails the call.
#[tokio::test]
async fn without_the_idle_ping_a_connection_killed_while_idle_fails_its_next_call() {
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(1);
    let Some((store, _schema)) = testing::fresh_schema_with(&testing::test_name(), pool).await
    else {
        return;
    };
    kill_the_idle_connection(&store).await;
    tokio::time::sleep(herald_postgres::IDLE_PING + Duration::from_millis(200)).await;
    match store.counts(&CountsQuery::all()).await {
        Err(StoreError::Unavailable { .. }) => {}
        other => panic!("expected Unavailable on the dead connection, got {other:?}"),
    }
}
