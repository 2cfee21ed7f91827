//! What an operator sees at the default log level: one line per failed
//! attempt, with the event, tenant, handler, attempt and reason.

use herald::backend::Operator;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald::{Client, Context, EmitOptions, HandlerError, MemoryQueue, RetryPolicy, Worker};
use herald_sqlite::SqliteStore;
use tracing_subscriber::fmt::MakeWriter;

/// Log output kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[tokio::test]
async fn every_failed_attempt_is_logged_at_the_default_level() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(logs.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("logs.db")).unwrap());
    let queue = Arc::new(MemoryQueue::default());
    let worker = Worker::builder(store.clone(), queue.clone())
        .handler("flaky", |_: serde_json::Value, cx: Context| async move {
            if cx.attempt == 1 {
                Err(HandlerError::retry("upstream answered 503"))
            } else {
                Ok(())
            }
        })
        .handler("broken", |_: serde_json::Value, _cx: Context| async move {
            Err::<(), _>(HandlerError::retry("connection refused"))
        })
        .retry(RetryPolicy {
            base: Duration::from_millis(10),
            ..RetryPolicy::default()
        })
        .start();
    let client = Client::new(store.clone(), queue);
    let flaky = client
        .emit_json("acme", "flaky", "{}", EmitOptions::default())
        .await
        .unwrap()
        .id();
    let broken = client
        .emit_json(
            "globex",
            "broken",
            "{}",
            EmitOptions::default().max_attempts(1),
        )
        .await
        .unwrap()
        .id();

    // Done when the flaky event is gone and the broken one is dead.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let flaky_gone = store.get(flaky).await.unwrap().is_none();
        let broken_dead = store
            .get(broken)
            .await
            .unwrap()
            .is_some_and(|e| e.state == herald::EventState::Dead);
        if flaky_gone && broken_dead {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the events did not settle in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.shutdown(Duration::from_secs(5)).await;

    let lines = logs.lines();
    let line_for = |id: herald::EventId| {
        lines
            .iter()
            .find(|l| l.contains(&id.to_string()) && l.contains("attempt failed"))
            .unwrap_or_else(|| panic!("no failed-attempt line for {id} in:\n{}", lines.join("\n")))
            .clone()
    };
    let retried = line_for(flaky);
    for part in [
        " INFO ",
        "tenant=\"acme\"",
        "handler=\"flaky\"",
        "attempt=1",
        "upstream answered 503",
        "will retry",
    ] {
        assert!(retried.contains(part), "{part:?} missing from {retried:?}");
    }
    let dead = line_for(broken);
    for part in [
        " WARN ",
        "tenant=\"globex\"",
        "handler=\"broken\"",
        "attempt=1",
        "connection refused",
        "dead",
    ] {
        assert!(dead.contains(part), "{part:?} missing from {dead:?}");
    }
}
