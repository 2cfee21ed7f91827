//! `herald demo`: an embedded herald on a mix of events, with a progress
//! bar and a summary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald::{
    Client, Context, EmitOptions, EmitRequest, HandlerError, MemoryQueue, RetryPolicy, Worker,
};
use herald_sqlite::SqliteStore;
use indicatif::{ProgressBar, ProgressStyle};

/// Options of `herald demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// The database file; default: a temporary one, removed afterwards.
    #[arg(long)]
    db: Option<PathBuf>,
    /// How many events of the fast, always-succeeding kind to emit.
    #[arg(long, default_value_t = 50_000)]
    events: usize,
    /// Handlers running at once.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
}

const TENANT: &str = "demo";
/// Fails twice, then succeeds.
const FLAKY: usize = 200;
/// Runs two seconds after emit.
const DELAYED: usize = 100;
/// Emitted while their handler is paused; it is unpaused a second later.
const PAUSED: usize = 300;
/// Always fail: go dead after three attempts.
const DOOMED: usize = 20;

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] herald::StoreError),
    /// An emit or a rule change failed.
    #[error(transparent)]
    Client(#[from] herald::ClientError),
    /// The temporary directory could not be made.
    #[error("cannot create a temporary directory: {0}")]
    TempDir(std::io::Error),
    /// The run did not finish.
    #[error("the demo stalled: {0} events still pending after {1:?}")]
    Stalled(u64, Duration),
}

/// Runs the demo: an embedded herald in a temporary directory, a mix of
/// events through it, and a summary of what happened.
pub async fn run(args: DemoArgs) -> Result<(), DemoError> {
    let tmp = tempfile::tempdir().map_err(DemoError::TempDir)?;
    let path = args
        .db
        .clone()
        .unwrap_or_else(|| tmp.path().join("herald.db"));
    let store = Arc::new(SqliteStore::open(&path)?);
    let queue = Arc::new(MemoryQueue::default());
    let client = Client::new(store.clone(), queue.clone());

    let worker = Worker::builder(store.clone(), queue.clone())
        .handler("send_email", |_: serde_json::Value, _cx: Context| async {})
        .handler("sync_crm", |_: serde_json::Value, cx: Context| async move {
            if cx.attempt < 3 {
                return Err(HandlerError::retry("CRM answered 502"));
            }
            Ok(())
        })
        .handler("reminder", |_: serde_json::Value, _cx: Context| async {})
        .handler("report", |_: serde_json::Value, _cx: Context| async {})
        .handler("charge_card", |_: serde_json::Value, _cx: Context| async {
            Err::<(), _>(HandlerError::retry("card declined"))
        })
        .retry(RetryPolicy {
            base: Duration::from_millis(50),
            max: Duration::from_millis(500),
            ..RetryPolicy::default()
        })
        .concurrency(args.concurrency)
        .start();

    println!("herald demo: embedded store at {}", path.display());
    client.pause(TENANT, "report").await?;
    let total = args.events + FLAKY + DELAYED + PAUSED + DOOMED;
    let started = Instant::now();
    let mut batch = Vec::with_capacity(1000);
    let add = |handler: &str, n: usize, options: EmitOptions, batch: &mut Vec<EmitRequest>| {
        for i in 0..n {
            batch.push(EmitRequest {
                tenant: TENANT.into(),
                handler: handler.into(),
                payload: format!(r#"{{"n":{i}}}"#),
                options: options.clone(),
            });
        }
    };
    add("report", PAUSED, EmitOptions::default(), &mut batch);
    add(
        "reminder",
        DELAYED,
        EmitOptions::default().delay(Duration::from_secs(2)),
        &mut batch,
    );
    add("sync_crm", FLAKY, EmitOptions::default(), &mut batch);
    add(
        "charge_card",
        DOOMED,
        EmitOptions::default().max_attempts(3),
        &mut batch,
    );
    add(
        "send_email",
        args.events,
        EmitOptions::default(),
        &mut batch,
    );
    for chunk in batch.chunks(1000) {
        client.emit_batch(chunk.to_vec()).await?;
    }
    println!(
        "emitted {total} events: {} send_email, {FLAKY} sync_crm (fail twice), {DELAYED} reminder (in 2 s), {PAUSED} report (paused), {DOOMED} charge_card (always fail)",
        args.events
    );

    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} finished  {per_sec}  {msg}")
            .expect("a valid template"),
    );
    let mut unpaused = false;
    let deadline = Duration::from_secs(120);
    // The busiest second: the bulk drain, apart from the waits built into the mix.
    let mut window: std::collections::VecDeque<(Instant, u64)> = Default::default();
    let mut peak = 0.0f64;
    loop {
        let s = worker.stats();
        let finished = s.done + s.dead;
        let now = Instant::now();
        window.push_back((now, finished));
        while window.len() > 1 && now - window[0].0 > Duration::from_secs(1) {
            window.pop_front();
        }
        if let Some(&(t0, f0)) = window.front() {
            let span = (now - t0).as_secs_f64();
            if span >= 0.5 {
                peak = peak.max((finished - f0) as f64 / span);
            }
        }
        bar.set_position(finished);
        bar.set_message(format!("retried {}  dead {}", s.retried, s.dead));
        if !unpaused && started.elapsed() >= Duration::from_secs(1) {
            let r = client.unpause(TENANT, "report").await?;
            // `suspend`, not `bar.println`: that prints nothing when the bar is hidden (no terminal).
            bar.suspend(|| println!("unpaused report: {} events re-notified", r.notified));
            unpaused = true;
        }
        if finished >= total as u64 {
            break;
        }
        if started.elapsed() > deadline {
            bar.abandon();
            return Err(DemoError::Stalled(total as u64 - finished, deadline));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    bar.finish();
    let stats = worker.stats();
    worker.shutdown(Duration::from_secs(5)).await;
    let counts = client
        .handler_counts(&herald::CountsQuery::totals())
        .await?;
    let stored = |state: herald::EventState| -> u64 {
        counts
            .iter()
            .map(|c| match state {
                herald::EventState::Pending => c.pending(),
                herald::EventState::Dead => c.dead,
                herald::EventState::Done => c.done,
            })
            .sum()
    };
    println!();
    println!("done     {:>8}", stats.done);
    println!(
        "retried  {:>8}   failed attempts that ran again",
        stats.retried
    );
    println!(
        "dead     {:>8}   stored for inspection and manual retry",
        stored(herald::EventState::Dead)
    );
    println!("pending  {:>8}", stored(herald::EventState::Pending));
    println!(
        "duration {:>8.2} s (from the first emit; includes the 2 s delay and the 1 s pause)",
        elapsed.as_secs_f64()
    );
    println!(
        "rate     {:>8.0} events/s overall; {:.0} events/s in the busiest second",
        total as f64 / elapsed.as_secs_f64(),
        peak
    );
    Ok(())
}
