//! Graceful shutdown as a service would do it: on the first Ctrl-C, stop
//! taking events and give running handlers up to 30 s; on a second Ctrl-C,
//! cancel them at once (they are released, attempt given back, for the next
//! worker to run).
//!
//! `cargo run -p herald-sqlite --example graceful`, then press Ctrl-C (twice).

use std::sync::Arc;
use std::time::Duration;

use herald::{Client, Context, EmitOptions, MemoryQueue, Worker};
use herald_sqlite::SqliteStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(SqliteStore::open("graceful-example.db")?);
    let queue = Arc::new(MemoryQueue::default());
    let worker = Worker::builder(store.clone(), queue.clone())
        .handler("render_video", |frames: u64, cx: Context| async move {
            for frame in 0..frames {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = cx.cancelled() => {
                        println!("event {}: cancelled at frame {frame}", cx.event_id);
                        return;
                    }
                }
            }
            println!("event {}: rendered {frames} frames", cx.event_id);
        })
        .start();

    let client = Client::new(store, queue);
    for frames in [10, 50, 600] {
        client
            .emit_json(
                "studio",
                "render_video",
                &frames.to_string(),
                EmitOptions::default(),
            )
            .await?;
    }
    println!("rendering; press Ctrl-C to stop gracefully, twice to cancel");

    tokio::signal::ctrl_c().await?;
    println!("stopping: running handlers get up to 30 s (Ctrl-C again cancels them)");
    let second_signal = worker.shutdown_handle();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            second_signal.cancel_now();
        }
    });
    let report = worker.shutdown(Duration::from_secs(30)).await;
    println!(
        "stopped: {} running at the signal, {} cancelled and released",
        report.in_flight, report.cancelled
    );
    Ok(())
}
