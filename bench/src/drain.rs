//! No-op drain on the embedded default: emit N events (not timed), then
//! start a worker and time how long it takes to run them all.
//!
//! `cargo run --release -p herald-bench --bin drain -- --events 200000`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use herald::{Client, Context, EmitOptions, EmitRequest, MemoryQueue, Worker};
use herald_sqlite::SqliteStore;

#[derive(Parser)]
struct Args {
    /// Events to drain.
    #[arg(long, default_value_t = 200_000)]
    events: usize,
    /// Handlers running at once.
    #[arg(long, default_value_t = 1024)]
    concurrency: usize,
    /// Notifications claimed per batch.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Bytes of padding in each payload (0: a tiny payload).
    #[arg(long, default_value_t = 0)]
    payload_bytes: usize,
    /// Directory for the database file (on disk; default: the current directory).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HERALD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let dir = tempfile::tempdir_in(&args.dir).expect("a temporary directory");
    let path = dir.path().join("drain.db");
    let store = Arc::new(SqliteStore::open(&path).expect("open the store"));
    let queue = Arc::new(MemoryQueue::default());
    let client = Client::new(store.clone(), queue.clone());

    let pad = "x".repeat(args.payload_bytes);
    let t = Instant::now();
    let requests: Vec<EmitRequest> = (0..args.events)
        .map(|i| EmitRequest {
            tenant: format!("tenant-{}", i % 16),
            handler: "noop".into(),
            payload: if pad.is_empty() {
                format!(r#"{{"i":{i}}}"#)
            } else {
                format!(r#"{{"i":{i},"pad":"{pad}"}}"#)
            },
            options: EmitOptions::default(),
        })
        .collect();
    for chunk in requests.chunks(5000) {
        client.emit_batch(chunk.to_vec()).await.expect("emit");
    }
    let emit_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let worker = Worker::builder(store.clone(), queue.clone())
        .handler("noop", |_: serde_json::Value, _cx: Context| async {})
        .configure(|c| {
            c.concurrency = args.concurrency;
            c.batch = args.batch;
            // The drain measures the hot path only.
            c.reconcile = false;
        })
        .start();
    loop {
        let s = worker.stats();
        if s.done as usize >= args.events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let drain = t.elapsed().as_secs_f64();
    let stats = worker.stats();
    worker.shutdown(Duration::from_secs(5)).await;
    let left: u64 = client
        .counts()
        .await
        .expect("counts")
        .iter()
        .map(|c| c.count)
        .sum();
    assert_eq!(left, 0, "every event must be deleted after the drain");
    println!(
        "drain events={} payload_bytes={} emit_s={:.2} emit_per_s={:.0} drain_s={:.3} events_per_s={:.0} claimed={} requeued={}",
        args.events,
        args.payload_bytes,
        emit_secs,
        args.events as f64 / emit_secs,
        drain,
        args.events as f64 / drain,
        stats.claimed,
        stats.requeued
    );
}
