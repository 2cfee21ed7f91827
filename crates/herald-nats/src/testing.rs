//! Test helpers (feature `testing`): a fresh stream and consumer per test
//! (random names), deleted when the test ends, so that tests run in parallel
//! on one server; and the one place that decides what a test does when NATS
//! can't be reached.
//!
//! The server is `NATS_URL`, or [`DEFAULT_URL`]. When it can't be reached, a
//! test prints `SKIPPED <test>: NATS unreachable at <url>: <error>` and
//! passes; with `CI=true` it fails instead.
//!
//! A test that must stop or restart NATS runs an [`OwnServer`]: a
//! `nats-server` of its own on a free port, never the shared one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    connect_to(&nats_url()).await
}

/// Connects to the server at `url` with JetStream, once per call; `Err`
/// when it does not answer within 5 s or has no JetStream.
pub async fn connect_to(url: &str) -> Result<async_nats::Client, String> {
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(url),
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

/// How long [`OwnServer::start`] and [`OwnServer::restart`] wait for the
/// server to answer with JetStream.
const OWN_SERVER_READY: Duration = Duration::from_secs(20);

/// A `nats-server` of the caller's own, with JetStream: on a free port of
/// 127.0.0.1, with a store directory of its own (a new temporary
/// directory), for tests that stop or restart NATS without touching the
/// shared server. Dropping it kills the server and removes the directory.
///
/// The executable is `nats-server`, found on `PATH`. When it can't be run,
/// [`OwnServer::start`] returns `Err`: pass the message to [`unreachable`]
/// (a skip, or with `CI=true` a failure).
#[derive(Debug)]
pub struct OwnServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    /// More `nats-server` arguments (`--user`, `--pass`, `-c FILE`…).
    args: Vec<String>,
}

impl OwnServer {
    /// Starts a server on a free port with a new store directory, and waits
    /// (up to 20 s) until it answers with JetStream.
    pub async fn start() -> Result<OwnServer, String> {
        OwnServer::start_with(&[]).await
    }

    /// [`OwnServer::start`] with more `nats-server` arguments, such as
    /// `["--user", "u", "--pass", "p"]`. With arguments, the server is
    /// ready once its port opens (it may refuse an anonymous client).
    pub async fn start_with(args: &[&str]) -> Result<OwnServer, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port: {e}"))?
            .port();
        OwnServer::start_on(port, args).await
    }

    /// [`OwnServer::start_with`] on a given port.
    pub async fn start_on(port: u16, args: &[&str]) -> Result<OwnServer, String> {
        let dir = std::env::temp_dir().join(format!(
            "herald-nats-server-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        // From here on the guard removes the directory, whatever happens.
        let mut server = OwnServer {
            child: None,
            port,
            dir,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn().await?;
        Ok(server)
    }

    /// The server's URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's store directory (`-sd`): its streams live there across restarts.
    pub fn store_dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the server process was started and not stopped since.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL: no clean shutdown) and waits for it to
    /// exit. Does nothing if it is not running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, then starts it again on the same port
    /// with the same store directory (what was stored survives), and waits
    /// (up to 20 s) until it answers with JetStream.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn().await
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run nats-server: {e}"))?;
        self.child = Some(child);
        let start = Instant::now();
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(format!(
                    "nats-server on port {} exited at start: {status}",
                    self.port
                ));
            }
            let ready = if self.args.is_empty() {
                connect_to(&self.url()).await.map(drop)
            } else {
                tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            };
            let last = match ready {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if start.elapsed() > OWN_SERVER_READY {
                self.stop();
                return Err(format!(
                    "nats-server on port {} did not answer within {OWN_SERVER_READY:?}: {last}",
                    self.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
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
    fresh_rig_queue(ACK_WAIT).await
}

/// The engine suite's queue maker: a [`TestQueue`] on a fresh stream whose
/// ack wait is the rig's lease, deleted when the test ends; `None` (after
/// the SKIPPED line) when NATS is unreachable outside CI.
pub async fn fresh_rig_queue(ack_wait: Duration) -> Option<TestQueue> {
    let (queue, guard) = fresh_stream(&test_name(), ack_wait).await?;
    let queue = Arc::new(queue);
    Some(TestQueue {
        queue: queue.clone(),
        backdoor: queue,
        keep: Box::new(guard),
    })
}
