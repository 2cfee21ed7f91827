//! What an idempotency key costs an emit (docs/postgres.md, "Idempotency
//! keys"): 10,000 single emits one after another, without keys and with a
//! key each, on a fresh schema of the shared PostgreSQL. A measurement,
//! not a check: run it with
//! `cargo test -p herald-postgres --test key_cost -- --ignored --nocapture`.

use herald::backend::EventStore;
use std::time::{Duration, Instant};

use herald::{EventId, NewEvent, Store};
use herald_postgres::testing::fresh_schema;

const EMITS: usize = 10_000;

fn event(key: Option<String>) -> NewEvent {
    NewEvent {
        singleton: None,
        concurrency_key: None,
        id: EventId::new(),
        tenant: "acme".into(),
        handler: "cost".into(),
        payload: "{}".into(),
        run_at: herald::RunAt::NOW,
        max_attempts: 3,
        idempotency_key: key,
        topic: None,
    }
}

async fn emits(store: &dyn Store, keyed: bool) -> Duration {
    let t = Instant::now();
    for i in 0..EMITS {
        let key = keyed.then(|| format!("order-{i}"));
        store.emit(&[event(key)]).await.expect("emit");
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it on its own"]
async fn time_of_10000_single_emits_with_and_without_keys() {
    let Some((store, _schema)) = fresh_schema("key_cost").await else {
        return;
    };
    // Warm the pool and the plans.
    for _ in 0..100 {
        store.emit(&[event(None)]).await.expect("emit");
        store
            .emit(&[event(Some(EventId::new().to_string()))])
            .await
            .expect("emit");
    }
    let plain = emits(&store, false).await;
    let keyed = emits(&store, true).await;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / EMITS as f64;
    eprintln!(
        "{EMITS} single emits, one after another: without keys {plain:.2?} ({:.0} us each), \
         with a key each {keyed:.2?} ({:.0} us each)",
        per(plain),
        per(keyed)
    );
}
