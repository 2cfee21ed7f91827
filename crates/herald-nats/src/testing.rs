//! Test helpers (feature `testing`): a fresh stream and consumer per test
//! (random names), deleted when the test ends, so that tests run in parallel
//! on one server; and the one place that decides what a test does when NATS
//! can't be reached.
//!
//! The server is `NATS_URL`, or [`DEFAULT_URL`]. When it can't be reached, a
//! test prints `SKIPPED <test>: NATS unreachable at <url>: <error>` and
//! passes; with `CI=true` it fails instead.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use herald::queue::{Publish, QueueResult};
use herald::testkit::queue::{QueueBackdoor, TestQueue, ACK_WAIT};

use crate::{NatsConfig, NatsQueue};

/// The server tests use when `NATS_URL` is not set.
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// The prefix of every test stream's name.
pub const STREAM_PREFIX: &str = "herald_test_";

/// The test server's URL.
pub fn nats_url() -> String {
    std::env::var("NATS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_URL.to_string())
}

pub use herald::testkit::{in_ci, test_name};

/// Says loudly that `test` can't reach NATS: a skip, or with
/// `CI=true` a failure (panics).
pub fn unreachable(test: &str, url: &str, error: &dyn std::fmt::Display) {
    herald::testkit::service_unreachable("NATS", test, url, error);
}

/// Connects to the test server with JetStream, once per call; `Err` when it
/// does not answer within 5 s or has no JetStream.
pub async fn connect() -> Result<async_nats::Client, String> {
    let url = nats_url();
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(&url),
    )
    .await
    .map_err(|_| "no answer within 5 s".to_string())?
    .map_err(|e| e.to_string())?;
    // A raw request: it works whatever the server version's reply looks like.
    let info = tokio::time::timeout(
        Duration::from_secs(5),
        client.request("$JS.API.INFO", "".into()),
    )
    .await
    .map_err(|_| "no JetStream: no answer within 5 s".to_string())?
    .map_err(|e| format!("no JetStream: {e}"))?;
    let body = String::from_utf8_lossy(&info.payload);
    if body.contains("\"error\"") {
        return Err(format!("no JetStream: {body}"));
    }
    Ok(client)
}

/// A new random stream prefix (nothing created).
pub fn random_prefix() -> String {
    format!("{STREAM_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Deletes a test stream (and with it its consumer) when dropped.
#[derive(Debug)]
pub struct TestStream {
    name: String,
}

impl TestStream {
    /// Takes over a stream: it is deleted with the guard.
    pub fn adopt(name: impl Into<String>) -> TestStream {
        TestStream { name: name.into() }
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        // Drop may run inside a tokio runtime: do the async work on a
        // thread of its own with a runtime of its own.
        let name = self.name.clone();
        let deleted = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let client = connect().await?;
                async_nats::jetstream::new(client)
                    .delete_stream(&name)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<(), String>(())
            })
        })
        .join();
        match deleted {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cannot delete test stream {}: {e}", self.name),
            Err(_) => eprintln!(
                "cannot delete test stream {}: the thread panicked",
                self.name
            ),
        }
    }
}

/// A queue on a fresh stream with the ack wait `ack_wait`, and the guard
/// that deletes the stream; `None` (after saying so) when NATS is
/// unreachable outside CI.
pub async fn fresh_stream(test: &str, ack_wait: Duration) -> Option<(NatsQueue, TestStream)> {
    let url = nats_url();
    let client = match connect().await {
        Ok(c) => c,
        Err(e) => {
            unreachable(test, &url, &e);
            return None;
        }
    };
    let prefix = random_prefix();
    let guard = TestStream::adopt(&prefix);
    let queue = NatsQueue::with_client(client, NatsConfig::new(url, &prefix, ack_wait))
        .await
        .expect("create the test stream and consumer");
    Some((queue, guard))
}

#[async_trait]
impl QueueBackdoor for NatsQueue {
    async fn publish_raw(&self, payload: Vec<u8>) -> QueueResult<()> {
        NatsQueue::publish_raw(self, payload).await
    }
    fn dedups(&self) -> bool {
        true
    }
    async fn publish_with_id(&self, p: &Publish, id: &str) -> QueueResult<()> {
        NatsQueue::publish_with_id(self, p, id).await
    }
}

/// The queue suite's fixture: a [`TestQueue`] on a fresh stream (ack wait
/// [`ACK_WAIT`]) that is deleted when the test ends; `None` (after the
/// SKIPPED line) when NATS is unreachable outside CI. With `CI=true` it
/// fails the test.
pub async fn fresh_nats_queue() -> Option<TestQueue> {
    let (queue, guard) = fresh_stream(&test_name(), ACK_WAIT).await?;
    let queue = Arc::new(queue);
    Some(TestQueue {
        queue: queue.clone(),
        backdoor: queue,
        keep: Box::new(guard),
    })
}
