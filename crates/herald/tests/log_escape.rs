//! Untrusted text reaches the worker's log escaped: a message body or a
//! handler's error carrying a newline and terminal escapes cannot forge a
//! record or drive the operator's terminal. Through a real worker (SQLite
//! store, in-process queue) and tracing-subscriber's fmt layer.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald::{Client, Context, EventState, HandlerError, Job, MemoryQueue, Queue, Store, Worker};
use serde::{Deserialize, Serialize};

/// A body that, logged raw, ends its record and writes one of its own,
/// then clears the terminal.
const FORGED: &str = "x\n2026-12-07T00:00:00Z ERROR herald: forged\x1b[2J";

/// What the fmt layer writes, kept for the test to read.
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

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Every record holding `needle` is one line with the forged text on
    /// it; no line starts with the forged timestamp; no ESC anywhere.
    fn assert_escaped(&self, needle: &str) {
        let log = self.text();
        assert!(!log.contains('\x1b'), "an ESC reached the log:\n{log}");
        assert!(!log.contains('\r'), "a CR reached the log:\n{log}");
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
        assert!(!lines.is_empty(), "no record says {needle:?}:\n{log}");
        for line in lines {
            assert!(line.contains("ERROR herald: forged"), "{line}");
        }
        assert!(
            !log.lines().any(|l| l.starts_with("2026-12-07T00:00:00Z")),
            "a forged record starts a line:\n{log}"
        );
    }
}

/// The worker's tasks run on this test's single thread, so a thread's
/// default subscriber sees all of them.
fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    (out, tracing::subscriber::set_default(subscriber))
}

fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
    Arc::new(herald_sqlite::SqliteStore::open(dir.path().join("h.db")).unwrap())
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Serialize, Deserialize)]
struct Failing;

impl Job for Failing {
    const NAME: &'static str = "failing";
    const MAX_ATTEMPTS: u32 = 1;
    async fn run(self, _cx: Context) -> Result<(), HandlerError> {
        Err(HandlerError::fail(FORGED))
    }
}

#[tokio::test]
async fn a_garbage_message_cannot_forge_a_log_record() {
    let (log, _guard) = capture();
    let dir = tempfile::tempdir().unwrap();
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(3)));
    let worker = Worker::builder(store(&dir), queue.clone() as Arc<dyn Queue>)
        .job::<Failing>()
        .start();
    queue.publish_raw(FORGED.as_bytes().to_vec());
    until("the garbage is dropped", || worker.stats().garbage >= 1).await;
    worker.shutdown(Duration::from_secs(5)).await;
    log.assert_escaped("not a notification");
}

#[tokio::test]
async fn a_handlers_error_cannot_forge_a_log_record() {
    let (log, _guard) = capture();
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(3)));
    let worker = Worker::builder(store.clone(), queue.clone() as Arc<dyn Queue>)
        .job::<Failing>()
        .start();
    let id = Client::new(store.clone(), queue.clone())
        .emit("acme", &Failing)
        .await
        .unwrap();
    let dead = || async { store.get(id).await.unwrap().unwrap().state == EventState::Dead };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !dead().await {
        assert!(tokio::time::Instant::now() < deadline, "the event dies");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown(Duration::from_secs(5)).await;
    log.assert_escaped("event is dead");
}
