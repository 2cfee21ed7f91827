//! With `RunCommits::Unflushed`, claims and settles commit without waiting
//! for their WAL flush while emits wait; by default only claims skip it;
//! with `RunCommits::Flushed` everything waits; and the setting never
//! outlives the statement's own transaction (ADR 0012).
//!
//! What is checked is the setting in force when each transaction commits:
//! a deferred constraint trigger on `events` fires at commit time and
//! writes `current_setting('synchronous_commit')` and the operation into a
//! table of the test schema. The store runs on a pool of one connection, so
//! a setting that leaked past its transaction would show on the next emit.

use herald::backend::EventStore;
use std::time::Duration;

use herald::backend::{Finish, Settle};
use herald::{EventId, LeaseToken, NewEvent};
use herald_postgres::testing::{self, TestSchema};
use herald_postgres::{PgStore, RunCommits};
use sqlx::postgres::PgPoolOptions;

fn event() -> NewEvent {
    NewEvent {
        singleton: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: "acme".into(),
        handler: "h".into(),
        payload: "{}".into(),
        run_at: herald::RunAt::NOW,
        max_attempts: 3,
        idempotency_key: None,
        topic: None,
    }
}

/// Records, at each commit that changed `events`, the operation and the
/// `synchronous_commit` in force (one row per changed event).
async fn watch_commits(store: &PgStore, schema: &TestSchema) {
    let s = format!("\"{}\"", schema.name());
    sqlx::raw_sql(&format!(
        "CREATE TABLE {s}.commits (n bigserial, op text, setting text); \
         CREATE FUNCTION {s}.note_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           INSERT INTO {s}.commits (op, setting) \
             VALUES (TG_OP, current_setting('synchronous_commit')); \
           RETURN NULL; \
         END $$; \
         CREATE CONSTRAINT TRIGGER note_commit AFTER INSERT OR UPDATE OR DELETE ON {s}.events \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {s}.note_commit();"
    ))
    .execute(store.pool())
    .await
    .expect("install the commit watch");
}

/// The operations and settings recorded since the last call, in order.
async fn commits(store: &PgStore, schema: &TestSchema) -> Vec<(String, String)> {
    let s = format!("\"{}\"", schema.name());
    sqlx::query_as(&format!(
        "WITH gone AS (DELETE FROM {s}.commits RETURNING n, op, setting) \
         SELECT op, setting FROM gone ORDER BY n"
    ))
    .fetch_all(store.pool())
    .await
    .expect("read the commits")
}

/// Emits four events, claims them, settles them in one batch of every kind
/// (delete, archive, release, bury), then emits once more on the same
/// connection; returns what each commit had in force, one entry per
/// changed event, sorted.
async fn one_round(store: &PgStore, schema: &TestSchema) -> Vec<(String, String)> {
    let events: Vec<NewEvent> = (0..4).map(|_| event()).collect();
    store.emit(&events).await.expect("emit");
    let mut ids: Vec<EventId> = events.iter().map(|e| e.id).collect();
    ids.sort();
    let token = LeaseToken::new();
    let claimed = store
        .claim(
            &herald::testkit::leases(&ids, token),
            &["h".into()],
            &["acme".into()],
            Duration::from_secs(30),
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 4, "every event is claimed");
    let finishes = [
        Finish::Delete,
        Finish::Archive,
        Finish::Release {
            wait: Duration::from_secs(60),
            error: Some("again".into()),
            give_back: false,
        },
        Finish::Bury {
            error: "no more".into(),
        },
    ];
    let batch: Vec<Settle> = ids
        .iter()
        .zip(finishes)
        .map(|(&id, finish)| Settle {
            id,
            token: Some(token),
            finish,
        })
        .collect();
    assert_eq!(
        store.settle(&batch).await.expect("settle").held,
        vec![true; 4]
    );
    store.emit(&[event()]).await.expect("emit after");
    let mut seen = commits(store, schema).await;
    seen.sort();
    seen
}

/// What [`one_round`] should see when claims commit with `claims` and
/// settles with `settles`: five inserts that waited, four claims and three
/// settles that update, one that deletes.
fn expected(claims: &str, settles: &str) -> Vec<(String, String)> {
    let mut all = vec![("INSERT".to_string(), "on".to_string()); 5];
    all.extend(vec![("UPDATE".to_string(), claims.to_string()); 4]);
    all.extend(vec![("UPDATE".to_string(), settles.to_string()); 3]);
    all.push(("DELETE".to_string(), settles.to_string()));
    all.sort();
    all
}

async fn store_on_one_connection(test: &str) -> Option<(PgStore, TestSchema)> {
    let (store, schema) =
        testing::fresh_schema_with(test, PgPoolOptions::new().max_connections(1)).await?;
    watch_commits(&store, &schema).await;
    Some((store, schema))
}

#[tokio::test]
async fn unflushed_claims_and_settles_skip_the_flush_emits_do_not() {
    let test = "unflushed_claims_and_settles_skip_the_flush_emits_do_not";
    let Some((store, schema)) = store_on_one_connection(test).await else {
        return;
    };
    let store = store.with_run_commits(RunCommits::Unflushed);
    assert_eq!(one_round(&store, &schema).await, expected("off", "off"));
}

#[tokio::test]
async fn by_default_only_claims_skip_the_flush() {
    let test = "by_default_only_claims_skip_the_flush";
    let Some((store, schema)) = store_on_one_connection(test).await else {
        return;
    };
    assert_eq!(one_round(&store, &schema).await, expected("off", "on"));
}

#[tokio::test]
async fn flushed_every_commit_waits_as_the_connection_says() {
    let test = "flushed_every_commit_waits_as_the_connection_says";
    let Some((store, schema)) = store_on_one_connection(test).await else {
        return;
    };
    let store = store.with_run_commits(RunCommits::Flushed);
    assert_eq!(one_round(&store, &schema).await, expected("on", "on"));
}
