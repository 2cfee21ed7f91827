//! The README's example: a typed job, a worker and a client on the embedded
//! default (SQLite + the in-process queue).
//!
//! `cargo run -p herald-sqlite --example quickstart`

use std::sync::Arc;
use std::time::Duration;

use herald::{Client, Context, HandlerError, Job, MemoryQueue, Worker};
use herald_sqlite::SqliteStore;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl Job for SendEmail {
    const NAME: &'static str = "send_email";
    const MAX_ATTEMPTS: u32 = 5;

    async fn run(self, cx: Context) -> Result<(), HandlerError> {
        if self.to.is_empty() {
            // No retry will fix this one: dead now, kept for inspection.
            return Err(HandlerError::fail("no recipient"));
        }
        println!("attempt {}: mailing {}", cx.attempt, self.to);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path().join("herald.db"))?);
    let queue = Arc::new(MemoryQueue::default());

    let worker = Worker::builder(store.clone(), queue.clone())
        .job::<SendEmail>()
        // A plain async function works too; `?` on any error means "retry".
        .handler("resize", |size: u32, _cx: Context| async move {
            let _pixels = u64::from(size)
                .checked_mul(size.into())
                .ok_or_else(|| HandlerError::fail("too big"))?;
            Ok::<(), HandlerError>(())
        })
        .start();

    let client = Client::new(store, queue);
    client
        .emit(
            "acme",
            &SendEmail {
                to: "ada@example.com".into(),
            },
        )
        .await?;
    client
        .emit("acme", &SendEmail { to: String::new() })
        .await?;
    client
        .emit_json(
            "acme",
            "resize",
            "640",
            herald::EmitOptions::default().delay(Duration::from_millis(200)),
        )
        .await?;

    tokio::time::sleep(Duration::from_secs(1)).await;
    for c in client
        .handler_counts(&herald::CountsQuery::totals())
        .await?
    {
        println!(
            "{} {}: {} pending, {} dead, {} done",
            c.tenant,
            c.handler,
            c.pending(),
            c.dead,
            c.done
        );
    }
    worker.shutdown(Duration::from_secs(10)).await;
    Ok(())
}
