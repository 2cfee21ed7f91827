//! The webhook every worker's handler posts to: it records each run (which
//! worker, when, under which lease token) and holds an event's first run
//! until its round is released.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use tokio::sync::watch;

/// One run of an event: a webhook request.
pub(super) struct Run {
    pub(super) worker: String,
    pub(super) at: Instant,
    pub(super) token: String,
}

/// The runs of one event, in arrival order.
pub(super) struct Seen {
    pub(super) round: usize,
    pub(super) runs: Vec<Run>,
}

/// What the webhook server saw.
#[derive(Default)]
pub(super) struct Log {
    pub(super) round: usize,
    pub(super) events: HashMap<String, Seen>,
}

pub(super) struct App {
    pub(super) log: Mutex<Log>,
    /// The last round whose held requests were released.
    pub(super) released: watch::Sender<usize>,
}

/// The webhook: a first run waits for its round's release, later runs are
/// answered at once.
pub(super) async fn run(
    State(app): State<Arc<App>>,
    Path(worker): Path<String>,
    headers: HeaderMap,
) -> StatusCode {
    let at = Instant::now();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (first, round) = {
        let mut log = app.log.lock().expect("log lock");
        let round = log.round;
        let seen = log
            .events
            .entry(header("herald-event-id"))
            .or_insert_with(|| Seen {
                round,
                runs: Vec::new(),
            });
        seen.runs.push(Run {
            worker,
            at,
            token: header("herald-lease-token"),
        });
        (seen.runs.len() == 1, seen.round)
    };
    if first {
        let mut released = app.released.subscribe();
        let _ = released.wait_for(|r| *r >= round).await;
    }
    StatusCode::OK
}
