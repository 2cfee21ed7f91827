//! Transactional emit end to end: events stored inside the application's
//! own transaction with `PgStore::emit_in`, notified after the commit with
//! `Client::notify_emitted`, run by a real worker on the in-process queue.

use herald::backend::Operator;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::testkit::{eventually, Ledger};
use herald::{
    Client, Context, EmitOptions, EmitRequest, Emitted, MemoryQueue, Queue, Store, Worker,
    WorkerConfig,
};
use herald_postgres::testing::{self, TestSchema};
use herald_postgres::PgStore;

const SOON: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_secs(1);
const SWEEP_EVERY: Duration = Duration::from_millis(200);

struct Rig {
    store: PgStore,
    queue: Arc<MemoryQueue>,
    client: Client,
    ledger: Ledger,
    worker: Worker,
    _schema: TestSchema,
}

async fn rig() -> Option<Rig> {
    let (store, schema) = testing::fresh_schema(&testing::test_name()).await?;
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(3)));
    let client = Client::new(Arc::new(store.clone()), queue.clone());
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = Worker::builder(
        Arc::new(store.clone()) as Arc<dyn Store>,
        queue.clone() as Arc<dyn Queue>,
    )
    .config(WorkerConfig {
        concurrency: 8,
        lease: Duration::from_secs(3),
        sweep_every: SWEEP_EVERY,
        sweep_quiet: QUIET,
        ..WorkerConfig::default()
    })
    .handler("record", move |_: serde_json::Value, cx: Context| {
        let l = l.clone();
        async move { l.record(cx.event_id, cx.attempt) }
    })
    .start();
    // Let the start-up sweep (the queue starts empty) pass, so that what
    // follows is the steady state.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Some(Rig {
        store,
        queue,
        client,
        ledger,
        worker,
        _schema: schema,
    })
}

macro_rules! rig {
    () => {
        match rig().await {
            Some(r) => r,
            None => return,
        }
    };
}

fn request(n: usize) -> EmitRequest {
    EmitRequest {
        tenant: "acme".into(),
        handler: "record".into(),
        payload: format!(r#"{{"n":{n}}}"#),
        options: EmitOptions::default(),
    }
}

async fn stored(store: &PgStore) -> u64 {
    store
        .counts(&herald::CountsQuery::totals())
        .await
        .unwrap()
        .iter()
        .map(|c| c.total())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_in_a_rolled_back_transaction_never_runs_and_is_not_stored() {
    let r = rig!();
    let events = r.client.prepare(vec![request(1), request(2)]).unwrap();
    let mut tx = r.store.pool().begin().await.unwrap();
    let emitted = r.store.emit_in(&mut tx, &events).await.unwrap();
    assert!(emitted.iter().all(|e| matches!(e, Emitted::Created(_))));
    tx.rollback().await.unwrap();
    // Even a (wrong) notification after the rollback runs nothing: the
    // worker finds no event and drops it.
    r.client.notify_emitted(&events, &emitted).await;
    tokio::time::sleep(QUIET * 2 + SWEEP_EVERY * 2).await;
    assert_eq!(r.ledger.total(), 0, "a rolled-back event ran");
    assert_eq!(stored(&r.store).await, 0);
    for e in &events {
        assert_eq!(r.store.get(e.id).await.unwrap(), None);
    }
    assert!(r.worker.stats().dropped >= 2);
    r.worker.shutdown(SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_committed_but_never_notified_is_run_by_the_reconciler() {
    // A crash between the commit and the publish: nothing is published.
    let r = rig!();
    let events = r.client.prepare(vec![request(1), request(2)]).unwrap();
    let mut tx = r.store.pool().begin().await.unwrap();
    // The application's own write in the same transaction.
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    let emitted = r.store.emit_in(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    let committed = Instant::now();
    assert_eq!(emitted.len(), 2);
    assert!(r.queue.is_empty(), "nothing was published");
    let ledger = r.ledger.clone();
    eventually("both run", SOON, || {
        let n = ledger.distinct();
        async move { n == 2 }
    })
    .await;
    let took = committed.elapsed();
    println!("run by the reconciler {took:?} after the commit (quiet {QUIET:?})");
    assert!(
        took >= QUIET.saturating_sub(Duration::from_millis(100)),
        "{took:?}"
    );
    for e in &events {
        assert_eq!(r.ledger.runs_of(e.id), 1);
    }
    assert!(r.worker.stats().reconciled >= 2);
    let store = r.store.clone();
    eventually("both deleted", SOON, || {
        let store = store.clone();
        async move { stored(&store).await == 0 }
    })
    .await;
    r.worker.shutdown(SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emit_committed_then_notified_runs_at_once_and_once() {
    let r = rig!();
    let mut keyed = request(1);
    keyed.options = EmitOptions::default().idempotency_key("order-1");
    let events = r.client.prepare(vec![keyed.clone(), request(2)]).unwrap();
    let mut tx = r.store.pool().begin().await.unwrap();
    let emitted = r.store.emit_in(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    let start = Instant::now();
    r.client.notify_emitted(&events, &emitted).await;
    let ledger = r.ledger.clone();
    eventually("both run", SOON, || {
        let n = ledger.distinct();
        async move { n == 2 }
    })
    .await;
    assert!(
        start.elapsed() < QUIET,
        "ran by notification, not by the sweep"
    );
    // The same key again, in another transaction, while it may still be live:
    // an idempotent hit is Existing and publishes nothing, or (once the first
    // finished) a new event.
    let again = r.client.prepare(vec![keyed]).unwrap();
    let mut tx = r.store.pool().begin().await.unwrap();
    let second = r.store.emit_in(&mut tx, &again).await.unwrap();
    tx.commit().await.unwrap();
    r.client.notify_emitted(&again, &second).await;
    tokio::time::sleep(QUIET * 2 + SWEEP_EVERY * 2).await;
    let expected = match second[0] {
        Emitted::Existing(_) => 2,
        Emitted::Created(_) => 3,
    };
    assert_eq!(r.ledger.total(), expected);
    assert_eq!(stored(&r.store).await, 0);
    r.worker.shutdown(SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_emit_in_a_transaction_runs_after_the_commit_and_not_after_a_rollback() {
    let r = rig!();
    let s = herald::Subscription::every_tenant("user.signup", "record");
    assert!(r.client.subscribe(&s).await.unwrap());
    // Rolled back: nothing stored, nothing runs.
    let mut tx = r.store.pool().begin().await.unwrap();
    let rolled = r
        .store
        .emit_topic_in(
            &mut tx,
            &r.client,
            "acme",
            "user.signup",
            "{}",
            EmitOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(rolled.events.len(), 1);
    tx.rollback().await.unwrap();
    assert_eq!(stored(&r.store).await, 0);
    // Committed, then notified: it runs once, with its topic.
    let mut tx = r.store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    let done = r
        .store
        .emit_topic_in(
            &mut tx,
            &r.client,
            "acme",
            "user.signup",
            "{}",
            EmitOptions::default(),
        )
        .await
        .unwrap();
    let id = done.outcome().events[0].emitted.id();
    // Inside the transaction it is there, with its topic; outside, not yet.
    let topic: Option<String> = sqlx::query_scalar(&format!(
        "SELECT topic FROM \"{}\".events WHERE id = $1",
        r.store.schema()
    ))
    .bind(id.0)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(topic.as_deref(), Some("user.signup"));
    assert_eq!(r.store.get(id).await.unwrap(), None);
    tx.commit().await.unwrap();
    r.client.notify_topic(&done).await;
    let ledger = r.ledger.clone();
    eventually("the copy runs", SOON, || {
        let n = ledger.runs_of(id);
        async move { n == 1 }
    })
    .await;
    assert_eq!(r.ledger.runs_of(rolled.events[0].id), 0);
    // No subscriber: an error, nothing stored.
    let mut tx = r.store.pool().begin().await.unwrap();
    let none = r
        .store
        .emit_topic_in(
            &mut tx,
            &r.client,
            "acme",
            "nobody",
            "{}",
            EmitOptions::default(),
        )
        .await;
    assert!(
        matches!(none, Err(herald::ClientError::NoSubscribers { .. })),
        "{none:?}"
    );
    tx.rollback().await.unwrap();
    r.worker.shutdown(SOON).await;
}
