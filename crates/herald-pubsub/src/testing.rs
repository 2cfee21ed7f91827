//! Test helpers (feature `testing`): a fresh topic and subscription per
//! test on the emulator (random names), deleted when the test ends, so that
//! tests run in parallel on one emulator; an emulator of a test's own for
//! tests that restart it; and the one place that decides what a test does
//! when the emulator can't be reached.
//!
//! The emulator is `PUBSUB_EMULATOR_HOST`, or [`DEFAULT_HOST`]. When it
//! can't be reached, a test prints `SKIPPED <test>: Pub/Sub emulator
//! unreachable at <host>: <error>` and passes; with `CI=true` it fails.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use herald::queue::{Publish, Queue, QueueResult};
use herald::testkit::queue::{QueueBackdoor, TestQueue, ACK_WAIT};

use crate::{PubsubConfig, PubsubQueue};

/// The emulator tests use when `PUBSUB_EMULATOR_HOST` is not set.
pub const DEFAULT_HOST: &str = "127.0.0.1:8085";

/// The project every test topic lives in.
pub const TEST_PROJECT: &str = "herald-test";

/// Where the Debian package `google-cloud-cli-pubsub-emulator` puts the
/// emulator; `cloud-pubsub-emulator` on `PATH` is tried first.
pub const EMULATOR_PATH: &str =
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

pub use herald::testkit::{in_ci, test_name};

/// The test emulator's `HOST:PORT`.
pub fn emulator_host() -> String {
    std::env::var("PUBSUB_EMULATOR_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| DEFAULT_HOST.to_string())
}

/// Says loudly that `test` can't reach the emulator: a skip, or with
/// `CI=true` a failure (panics).
pub fn unreachable(test: &str, host: &str, error: &dyn std::fmt::Display) {
    herald::testkit::service_unreachable("Pub/Sub emulator", test, host, error);
}

/// Whether something answers at `host` within 2 s.
pub async fn reachable(host: &str) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(host)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 2 s".into()),
    }
}

/// New random topic and subscription ids (nothing created).
pub fn random_names() -> (String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    (
        format!("herald-test-{id}"),
        format!("herald-test-{id}-workers"),
    )
}

/// A config for a fresh topic and subscription on the emulator at `host`.
pub fn fresh_config(host: &str, ack_wait: Duration) -> PubsubConfig {
    let (topic, subscription) = random_names();
    PubsubConfig {
        emulator: Some(host.to_string()),
        ..PubsubConfig::new(TEST_PROJECT, topic, subscription, ack_wait)
    }
}

/// Deletes a test topic and its subscription when dropped.
#[derive(Debug)]
pub struct TestTopic {
    config: PubsubConfig,
}

impl TestTopic {
    /// Takes over the topic and subscription of `config`.
    pub fn adopt(config: &PubsubConfig) -> TestTopic {
        TestTopic {
            config: config.clone(),
        }
    }
}

impl Drop for TestTopic {
    fn drop(&mut self) {
        // Drop may run inside a tokio runtime: do the async work on a
        // thread of its own with a runtime of its own.
        let config = self.config.clone();
        let deleted = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let Some(host) = config.emulator.clone() else {
                    return Ok(());
                };
                delete(&host, &config.project, &config.topic, &config.subscription).await
            })
        })
        .join();
        if let Ok(Err(e)) = deleted {
            eprintln!("cannot delete test topic {}: {e}", self.config.topic);
        }
    }
}

/// Deletes a subscription and a topic on the emulator at `host`, if they
/// exist.
pub async fn delete(
    host: &str,
    project: &str,
    topic: &str,
    subscription: &str,
) -> Result<(), String> {
    use gcloud_gax::conn::Environment;
    use gcloud_gax::grpc::Code;
    use gcloud_pubsub::client::{Client, ClientConfig};
    reachable(host).await?;
    let client = Client::new(ClientConfig {
        project_id: Some(project.to_string()),
        environment: Environment::Emulator(host.to_string()),
        ..ClientConfig::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let gone = |r: Result<(), gcloud_gax::grpc::Status>, what: &str| match r {
        Err(e) if e.code() != Code::NotFound => Err(format!("delete {what}: {e}")),
        _ => Ok(()),
    };
    gone(
        client.subscription(subscription).delete(None).await,
        subscription,
    )?;
    gone(client.topic(topic).delete(None).await, topic)
}

/// A queue on a fresh topic and subscription with the ack wait
/// `ack_wait`, and the guard that deletes them; `None` (after saying so)
/// when the emulator is unreachable outside CI.
pub async fn fresh_queue(test: &str, ack_wait: Duration) -> Option<(PubsubQueue, TestTopic)> {
    let host = emulator_host();
    if let Err(e) = reachable(&host).await {
        unreachable(test, &host, &e);
        return None;
    }
    let config = fresh_config(&host, ack_wait);
    let guard = TestTopic::adopt(&config);
    let queue = PubsubQueue::connect(config)
        .await
        .expect("create the test topic and subscription");
    Some((queue, guard))
}

#[async_trait]
impl QueueBackdoor for PubsubQueue {
    async fn publish_raw(&self, payload: Vec<u8>) -> QueueResult<()> {
        PubsubQueue::publish_raw(self, payload).await
    }
    /// Pub/Sub has no publish deduplication.
    fn dedups(&self) -> bool {
        false
    }
    async fn publish_with_id(&self, p: &Publish, _id: &str) -> QueueResult<()> {
        self.publish(std::slice::from_ref(p)).await
    }
}

/// The queue suite's fixture: a [`TestQueue`] on a fresh topic (ack wait
/// [`ACK_WAIT`]) that is deleted when the test ends; `None` (after the
/// SKIPPED line) when the emulator is unreachable outside CI.
pub async fn fresh_pubsub_queue() -> Option<TestQueue> {
    let (queue, guard) = fresh_queue(&test_name(), ACK_WAIT).await?;
    let queue = Arc::new(queue);
    Some(TestQueue {
        queue: queue.clone(),
        backdoor: queue,
        keep: Box::new(guard),
    })
}

/// How long [`OwnEmulator::start`] and [`OwnEmulator::restart`] wait for
/// the emulator to accept connections.
const OWN_EMULATOR_READY: Duration = Duration::from_secs(30);

/// An emulator of the caller's own on a free port of 127.0.0.1, for tests
/// that restart it without touching the shared one. The emulator keeps
/// nothing across a restart: topics, subscriptions and messages are gone.
/// Dropping it kills it.
#[derive(Debug)]
pub struct OwnEmulator {
    child: Option<Child>,
    port: u16,
}

/// The emulator's executable: `cloud-pubsub-emulator` on `PATH`, else
/// [`EMULATOR_PATH`].
pub fn emulator_program() -> String {
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("cloud-pubsub-emulator"))
            .collect::<Vec<_>>()
    });
    on_path
        .into_iter()
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| EMULATOR_PATH.to_string())
}

impl OwnEmulator {
    /// Starts an emulator on a free port and waits (up to 30 s) until it
    /// accepts connections. `Err` when it can't be run: pass the message
    /// to [`unreachable`].
    pub async fn start() -> Result<OwnEmulator, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port: {e}"))?
            .port();
        let mut e = OwnEmulator { child: None, port };
        e.spawn().await?;
        Ok(e)
    }

    /// The emulator's `HOST:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the emulator (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the emulator if it runs and starts it again on the same port
    /// (empty: it keeps nothing).
    pub async fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn().await
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let program = emulator_program();
        let child = Command::new(&program)
            .arg("--host=127.0.0.1")
            .arg(format!("--port={}", self.port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "{program} on port {} exited at start: {status}",
                    self.port
                ));
            }
            match reachable(&self.host()).await {
                Ok(()) => return Ok(()),
                Err(e) if start.elapsed() > OWN_EMULATOR_READY => {
                    self.stop();
                    return Err(format!(
                        "the emulator on port {} did not answer within {OWN_EMULATOR_READY:?}: {e}",
                        self.port
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

impl Drop for OwnEmulator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The engine suite's queue maker (`engine_suite!(store, queue =
/// fresh_rig_queue)`): a queue on a fresh topic with the given ack wait,
/// deleted with the rig; `None` (after the SKIPPED line) when the emulator
/// is unreachable outside CI.
pub async fn fresh_rig_queue(ack_wait: Duration) -> Option<TestQueue> {
    let (queue, guard) = fresh_queue(&test_name(), ack_wait).await?;
    let queue = Arc::new(queue);
    Some(TestQueue {
        queue: queue.clone(),
        backdoor: queue,
        keep: Box::new(guard),
    })
}
