//! A command's stderr and a webhook's response body are the receiving
//! side's text: when a failed attempt is logged, they are escaped, so a
//! newline and terminal escapes in them cannot forge a log record.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald::{Client, EmitOptions, EventState, MemoryQueue, Queue, Store, Worker};

use super::{CommandConfig, CommandHandler, WebhookConfig, WebhookHandler};

/// Text that, logged raw, ends its record and writes one of its own, then
/// clears the terminal.
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

/// Runs one event of `handler` (one attempt) through a real worker on a
/// single-threaded runtime, and returns the log of it, at debug.
async fn log_of_a_failed_run(handler: Arc<dyn herald::Handler>) -> String {
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(herald_sqlite::SqliteStore::open(dir.path().join("h.db")).unwrap());
    let queue = Arc::new(MemoryQueue::new(Duration::from_secs(3)));
    let worker = Worker::builder(store.clone(), queue.clone() as Arc<dyn Queue>)
        .raw_handler("hook", handler)
        .start();
    let id = Client::new(store.clone(), queue)
        .emit_json("acme", "hook", "{}", EmitOptions::default().max_attempts(1))
        .await
        .unwrap()
        .id();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.get(id).await.unwrap().unwrap().state != EventState::Dead {
        assert!(tokio::time::Instant::now() < deadline, "the event dies");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.shutdown(Duration::from_secs(5)).await;
    let log = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
    log
}

/// The failure's record holds the forged text on its own line; no line
/// starts with the forged timestamp; no ESC or CR anywhere.
fn assert_escaped(log: &str) {
    assert!(!log.contains('\x1b'), "an ESC reached the log:\n{log}");
    assert!(!log.contains('\r'), "a CR reached the log:\n{log}");
    let dead: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("event is dead"))
        .collect();
    assert_eq!(dead.len(), 1, "{log}");
    assert!(dead[0].contains("ERROR herald: forged"), "{}", dead[0]);
    assert!(
        !log.lines().any(|l| l.starts_with("2026-12-07T00:00:00Z")),
        "a forged record starts a line:\n{log}"
    );
}

#[tokio::test]
async fn a_commands_stderr_cannot_forge_a_log_record() {
    let config = CommandConfig {
        program: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            r#"printf '%s' "$1" >&2; exit 1"#.into(),
            "sh".into(),
            FORGED.into(),
        ],
        timeout: Duration::from_secs(20),
        snooze_exit_code: 75,
        snooze_for: Duration::from_secs(30),
        fail_exit_code: None,
    };
    let handler = CommandHandler::new("hook", &config).unwrap();
    assert_escaped(&log_of_a_failed_run(Arc::new(handler)).await);
}

#[tokio::test]
async fn a_webhooks_response_body_cannot_forge_a_log_record() {
    let server = super::webhook::tests::serve(|| async {
        axum::response::IntoResponse::into_response((
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            FORGED,
        ))
    })
    .await;
    let config = WebhookConfig {
        url: server.url.clone(),
        secret: Some(super::webhook::Secret("whsec_test".into())),
        secret_env: None,
        timeout: Duration::from_secs(10),
    };
    let handler = WebhookHandler::new("hook", &config).unwrap();
    assert_escaped(&log_of_a_failed_run(Arc::new(handler)).await);
}
