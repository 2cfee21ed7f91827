//! A throwaway timing of the hot path: emit 200,000 events in batches of
//! 1,000, then claim batches of 512 ids and settle them as deleted.
//!
//! `cargo run --release -p herald-sqlite --example store_speed [-- TASKS [BATCH]]`
//! (TASKS concurrent claim/settle loops, default 1; more exercise group
//! commit. BATCH ids per claim, default 512).

use herald::backend::EventStore;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::backend::{Finish, Settle};
use herald::{EventId, LeaseToken, NewEvent};
use herald_sqlite::SqliteStore;

const EVENTS: usize = 200_000;
const EMIT_BATCH: usize = 1_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tasks: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let claim_batch: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("speed.db")).unwrap();
    let handlers = vec!["bench".to_string()];

    let mut ids: Vec<EventId> = Vec::with_capacity(EVENTS);
    let t = Instant::now();
    for _ in 0..EVENTS / EMIT_BATCH {
        let batch: Vec<NewEvent> = (0..EMIT_BATCH)
            .map(|i| NewEvent {
                singleton: None,
                concurrency_key: None,
                id: EventId::new(),
                tenant: format!("tenant-{}", i % 10),
                handler: "bench".into(),
                payload: r#"{"user":12345,"action":"send","n":1}"#.into(),
                run_at: herald::RunAt::NOW,
                max_attempts: 25,
                idempotency_key: None,
                topic: None,
            })
            .collect();
        ids.extend(batch.iter().map(|e| e.id));
        store.emit(&batch).await.unwrap();
    }
    let emit = t.elapsed();
    println!(
        "emit:           {EVENTS} events in {:.2?} = {:.0} events/s",
        emit,
        EVENTS as f64 / emit.as_secs_f64()
    );

    // Tasks take the next batch in id order, as a queue would deliver them.
    let chunks: Arc<Vec<Vec<EventId>>> =
        Arc::new(ids.chunks(claim_batch).map(|c| c.to_vec()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let mut joins = Vec::new();
    for _ in 0..tasks {
        let (chunks, next) = (chunks.clone(), next.clone());
        let store = store.clone();
        let handlers = handlers.clone();
        joins.push(tokio::spawn(async move {
            let mut done = 0usize;
            while let Some(chunk) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                let token = LeaseToken::new();
                let claimed = store
                    .claim(
                        &herald::testkit::leases(chunk, token),
                        &handlers,
                        &[],
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
                let settle: Vec<Settle> = claimed
                    .iter()
                    .map(|e| Settle {
                        id: e.id,
                        token: Some(token),
                        finish: Finish::Delete,
                    })
                    .collect();
                let ok = store.settle(&settle).await.unwrap();
                done += ok.held.iter().filter(|b| **b).count();
            }
            done
        }));
    }
    let mut done = 0;
    for j in joins {
        done += j.await.unwrap();
    }
    let run = t.elapsed();
    assert_eq!(done, EVENTS);
    println!(
        "claim+delete:   {done} events in {:.2?} = {:.0} events/s ({tasks} task(s), batches of {claim_batch})",
        run,
        done as f64 / run.as_secs_f64()
    );
}
