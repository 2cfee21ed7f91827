//! herald benchmark peer: the `graphile_worker` crate (Rust port of
//! graphile-worker) with its local queue on.
//!
//! Follows the contract in `bench/peers/README.md`: `--scenario
//! drain|latency|idle`, hooks at each phase, one JSON object as the last line
//! on stdout, logs on stderr, non-zero exit with the reason on any failure.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, TaskHandler, Worker, WorkerContext,
    WorkerOptions, WorkerStart,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

const SYSTEM: &str = "graphile-worker-rs";
const VERSION: &str = "0.14.1";

// Throughput knobs, every one set explicitly. Values from the crate's guide,
// "Throughput-oriented worker" (docs/src/configuration/worker-options.md),
// see README.md beside this file for the quotes.
const SCHEMA: &str = "graphile_worker";
const CONCURRENCY: usize = 16;
const POLL_INTERVAL: Duration = Duration::from_millis(500);
const USE_NOTIFICATION_DELIVERY: bool = true;
const COMPLETE_JOB_BATCH_DELAY: Duration = Duration::from_millis(5);
const FAIL_JOB_BATCH_DELAY: Duration = Duration::from_millis(5);
const LOCAL_QUEUE_SIZE: usize = 100;
const LOCAL_QUEUE_TTL: Duration = Duration::from_secs(60);
const LOCAL_QUEUE_COUNT: usize = 1;
const MAX_PG_CONN: u32 = 20;
/// Jobs per `add_jobs` call (one SQL statement each) for the untimed bulk
/// inserts of the drain scenario.
const INSERT_BATCH: usize = 10_000;

// Contract constants.
const LATENCY_IN_FLIGHT: usize = 32;
const DRAIN_DEADLINE: Duration = Duration::from_secs(600);
const LATENCY_GRACE: Duration = Duration::from_secs(60);
const IDLE_WARMUP: Duration = Duration::from_secs(5);
const START_TIMEOUT: Duration = Duration::from_secs(60);
const SETTLE: Duration = Duration::from_secs(1);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Drain,
    Latency,
    Idle,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Drain => "drain",
            Scenario::Latency => "latency",
            Scenario::Idle => "idle",
        }
    }
}

#[derive(Parser, Debug)]
#[command(about = "herald benchmark peer: graphile_worker 0.14.1 (local queue on)")]
struct Args {
    /// PostgreSQL URL of this peer's own, fresh database.
    #[arg(long)]
    url: String,
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// Runnable jobs for drain.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Jobs stored a day ahead before the runnable ones (drain).
    #[arg(long, default_value_t = 0)]
    backlog: u64,
    /// Jobs offered per second (latency).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Offering time (latency, default 20) or idle time (idle, default 60).
    #[arg(long)]
    seconds: Option<f64>,
    /// Run `sh -c "CMD PHASE"` at each phase.
    #[arg(long)]
    hook: Option<String>,
}

/// The no-op job. `t_us` is the epoch time in microseconds taken just before
/// the insert call (latency), 0 otherwise.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct BenchJob {
    t_us: i64,
}

/// What the handlers share with the driver loop.
#[derive(Debug)]
struct Shared {
    completed: AtomicU64,
    /// Count at which `half` is notified (0: never).
    half_at: u64,
    /// Count at which `done` is notified (0: never).
    done_at: u64,
    half: Notify,
    done: Notify,
    record_latency: bool,
    latencies_us: Mutex<Vec<i64>>,
}

impl Shared {
    fn new(half_at: u64, done_at: u64, record_latency: bool, capacity: usize) -> Self {
        Shared {
            completed: AtomicU64::new(0),
            half_at,
            done_at,
            half: Notify::new(),
            done: Notify::new(),
            record_latency,
            latencies_us: Mutex::new(Vec::with_capacity(capacity)),
        }
    }

    fn on_run(&self, t_us: i64, start_us: i64) {
        if self.record_latency {
            if let Ok(mut v) = self.latencies_us.lock() {
                v.push(start_us - t_us);
            }
        }
        let n = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.half_at {
            self.half.notify_one();
        }
        if n == self.done_at {
            self.done.notify_one();
        }
    }

    fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }
}

/// Extension handed to every handler through the worker context.
#[derive(Clone, Debug)]
struct State(Arc<Shared>);

impl TaskHandler for BenchJob {
    const IDENTIFIER: &'static str = "bench_noop";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        let start_us = now_us();
        if let Some(state) = ctx.get_ext::<State>() {
            state.0.on_run(self.t_us, start_us);
        }
        Ok::<(), String>(())
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[{SYSTEM}] {}", msg.as_ref());
}

fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

fn knobs() -> Value {
    json!({
        "schema": SCHEMA,
        "concurrency": CONCURRENCY,
        "poll_interval_ms": POLL_INTERVAL.as_millis() as u64,
        "use_notification_delivery": USE_NOTIFICATION_DELIVERY,
        "complete_job_batch_delay_ms": COMPLETE_JOB_BATCH_DELAY.as_millis() as u64,
        "fail_job_batch_delay_ms": FAIL_JOB_BATCH_DELAY.as_millis() as u64,
        "local_queue_size": LOCAL_QUEUE_SIZE,
        "local_queue_ttl_s": LOCAL_QUEUE_TTL.as_secs(),
        "local_queue_count": LOCAL_QUEUE_COUNT,
        "local_queue_refetch_delay": Value::Null,
        "max_pg_conn": MAX_PG_CONN,
        "insert_batch": INSERT_BATCH,
    })
}

// ---------------------------------------------------------------- hooks

/// Runs `sh -c "CMD PHASE"` and waits for it; a failing hook is an error.
async fn hook(cmd: &Option<String>, phase: &'static str) -> Result<(), String> {
    let Some(cmd) = cmd.clone() else {
        return Ok(());
    };
    log(format!("hook {phase}"));
    let status = tokio::task::spawn_blocking(move || {
        Command::new("sh")
            .arg("-c")
            .arg(format!("{cmd} {phase}"))
            .status()
    })
    .await
    .map_err(|e| format!("hook {phase}: {e}"))?
    .map_err(|e| format!("hook {phase}: cannot run sh: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("hook {phase} failed: {status}"))
    }
}

/// Starts `sh -c "CMD PHASE"` in the background.
fn hook_background(cmd: &Option<String>, phase: &'static str) -> Result<Option<Child>, String> {
    let Some(cmd) = cmd else {
        return Ok(None);
    };
    log(format!("hook {phase} (background)"));
    Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} {phase}"))
        .spawn()
        .map(Some)
        .map_err(|e| format!("hook {phase}: cannot run sh: {e}"))
}

/// Waits for a background hook and checks how it ended.
async fn reap(child: Option<Child>, phase: &'static str) -> Result<(), String> {
    let Some(mut child) = child else {
        return Ok(());
    };
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .map_err(|e| format!("hook {phase}: {e}"))?
        .map_err(|e| format!("hook {phase}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("hook {phase} failed: {status}"))
    }
}

// ---------------------------------------------------------------- worker

type RunHandle = JoinHandle<Result<(), String>>;

/// Connects, runs the crate's migrations (`init`) and returns a worker that
/// is not yet running, plus a notifier fired on its `WorkerStart` hook.
async fn build_worker(url: &str, state: State) -> Result<(Arc<Worker>, Arc<Notify>), String> {
    let started = Arc::new(Notify::new());
    let started_hook = started.clone();
    let worker = WorkerOptions::default()
        .database_url(url)
        .max_pg_conn(MAX_PG_CONN)
        .schema(SCHEMA)
        .concurrency(CONCURRENCY)
        .poll_interval(POLL_INTERVAL)
        .use_notification_delivery(USE_NOTIFICATION_DELIVERY)
        .complete_job_batch_delay(COMPLETE_JOB_BATCH_DELAY)
        .fail_job_batch_delay(FAIL_JOB_BATCH_DELAY)
        .local_queue(
            LocalQueueConfig::default()
                .with_size(LOCAL_QUEUE_SIZE)
                .with_ttl(LOCAL_QUEUE_TTL)
                .with_queue_count(LOCAL_QUEUE_COUNT),
        )
        .add_extension(state)
        .on(WorkerStart, move |_ctx| {
            let started = started_hook.clone();
            async move {
                started.notify_one();
            }
        })
        .define_job::<BenchJob>()
        .init()
        .await
        .map_err(|e| format!("worker init (connect + migrations) failed: {e}"))?;
    Ok((Arc::new(worker), started))
}

fn start_worker(worker: &Arc<Worker>) -> RunHandle {
    let w = worker.clone();
    tokio::spawn(async move { w.run().await.map_err(|e| format!("worker failed: {e}")) })
}

/// Turns an early end of the worker task into an error.
fn worker_ended(res: Result<Result<(), String>, tokio::task::JoinError>) -> String {
    match res {
        Ok(Ok(())) => "worker stopped unexpectedly".to_string(),
        Ok(Err(e)) => e,
        Err(e) => format!("worker task panicked: {e}"),
    }
}

async fn wait_started(started: &Notify, handle: &mut RunHandle) -> Result<(), String> {
    tokio::select! {
        _ = started.notified() => {}
        res = &mut *handle => return Err(worker_ended(res)),
        _ = tokio::time::sleep(START_TIMEOUT) => return Err("worker did not start within 60 s".into()),
    }
    // Let the LISTEN connection and the local queue come up.
    tokio::select! {
        _ = tokio::time::sleep(SETTLE) => Ok(()),
        res = &mut *handle => Err(worker_ended(res)),
    }
}

async fn stop_worker(worker: &Arc<Worker>, handle: RunHandle) -> Result<(), String> {
    worker.request_shutdown();
    match tokio::time::timeout(SHUTDOWN_TIMEOUT, handle).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(e)) => Err(format!("worker task panicked: {e}")),
        Err(_) => Err("worker did not shut down within 60 s".into()),
    }
}

// ---------------------------------------------------------------- scenarios

async fn drain(args: &Args) -> Result<Value, String> {
    let events = args.events;
    let half_at = if events == 0 { 0 } else { events.div_ceil(2) };
    let shared = Arc::new(Shared::new(half_at, events, false, 0));
    let (worker, _started) = build_worker(&args.url, State(shared.clone())).await?;
    let utils = worker.create_utils();

    // Backlog: scheduled one day ahead, bulk inserted with add_jobs.
    let t = Instant::now();
    let later = JobSpec {
        run_at: Some(chrono::Utc::now() + chrono::Duration::days(1)),
        ..JobSpec::default()
    };
    insert_bulk(&utils, args.backlog, &later).await?;
    log(format!("stored {} backlog jobs in {:.1}s", args.backlog, t.elapsed().as_secs_f64()));
    hook(&args.hook, "after-backlog").await?;

    let t = Instant::now();
    let now = JobSpec::default();
    insert_bulk(&utils, events, &now).await?;
    log(format!("stored {events} runnable jobs in {:.1}s", t.elapsed().as_secs_f64()));
    hook(&args.hook, "drain-start").await?;

    let t0 = Instant::now();
    let deadline = tokio::time::Instant::from_std(t0 + DRAIN_DEADLINE);
    let mut handle = start_worker(&worker);

    if events > 0 {
        tokio::select! {
            _ = shared.half.notified() => {}
            res = &mut handle => return Err(worker_ended(res)),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(format!("drain not done within 600 s: {} of {events} jobs ran", shared.completed()));
            }
        }
    }
    let mid_child = hook_background(&args.hook, "mid-drain")?;
    if events > 0 {
        tokio::select! {
            _ = shared.done.notified() => {}
            res = &mut handle => return Err(worker_ended(res)),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(format!("drain not done within 600 s: {} of {events} jobs ran", shared.completed()));
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    log(format!("drained {events} jobs in {secs:.3}s"));
    hook(&args.hook, "drain-end").await?;
    stop_worker(&worker, handle).await?;
    reap(mid_child, "mid-drain").await?;

    Ok(json!({
        "system": SYSTEM,
        "version": VERSION,
        "scenario": "drain",
        "events": events,
        "backlog": args.backlog,
        "seconds": round(secs, 3),
        "events_per_s": round(if secs > 0.0 { events as f64 / secs } else { 0.0 }, 1),
        "knobs": knobs(),
    }))
}

async fn insert_bulk(
    utils: &graphile_worker::WorkerUtils,
    count: u64,
    spec: &JobSpec,
) -> Result<(), String> {
    let mut left = count;
    while left > 0 {
        let n = left.min(INSERT_BATCH as u64) as usize;
        let jobs: Vec<(BenchJob, &JobSpec)> = (0..n).map(|_| (BenchJob { t_us: 0 }, spec)).collect();
        utils
            .add_jobs::<BenchJob>(&jobs)
            .await
            .map_err(|e| format!("add_jobs failed: {e}"))?;
        left -= n as u64;
    }
    Ok(())
}

async fn latency(args: &Args) -> Result<Value, String> {
    let seconds = args.seconds.unwrap_or(20.0);
    let rate = args.rate;
    if !(rate > 0.0) || !(seconds > 0.0) {
        return Err("--rate and --seconds must be positive".into());
    }
    let offered = (rate * seconds).round() as u64;
    let shared = Arc::new(Shared::new(0, offered, true, offered as usize));
    let (worker, started) = build_worker(&args.url, State(shared.clone())).await?;
    let utils = worker.create_utils();
    let mut handle = start_worker(&worker);
    wait_started(&started, &mut handle).await?;
    hook(&args.hook, "run-start").await?;

    // Offer: one add_job call per job, paced at --rate, at most 32 in flight.
    let sem = Arc::new(Semaphore::new(LATENCY_IN_FLIGHT));
    let first_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let start = Instant::now();
    for i in 0..offered {
        let target = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(tokio::time::Instant::from_std(target)).await;
        let permit = sem
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| format!("semaphore: {e}"))?;
        let utils = utils.clone();
        let first_error = first_error.clone();
        tokio::spawn(async move {
            let t_us = now_us();
            if let Err(e) = utils.add_job(BenchJob { t_us }, JobSpec::default()).await {
                if let Ok(mut slot) = first_error.lock() {
                    slot.get_or_insert(format!("add_job failed: {e}"));
                }
            }
            drop(permit);
        });
        if handle.is_finished() {
            return Err(worker_ended(handle.await));
        }
    }
    let _all = sem
        .acquire_many(LATENCY_IN_FLIGHT as u32)
        .await
        .map_err(|e| format!("semaphore: {e}"))?;
    let offer_secs = start.elapsed().as_secs_f64();
    if let Some(e) = first_error.lock().ok().and_then(|s| s.clone()) {
        return Err(e);
    }
    log(format!("offered {offered} jobs in {offer_secs:.3}s"));

    if offered > 0 {
        tokio::select! {
            _ = shared.done.notified() => {}
            res = &mut handle => return Err(worker_ended(res)),
            _ = tokio::time::sleep(LATENCY_GRACE) => {
                log(format!("only {} of {offered} jobs ran within 60 s of the end of offering", shared.completed()));
            }
        }
    }
    let run_secs = start.elapsed().as_secs_f64();
    hook(&args.hook, "run-end").await?;
    let completed = shared.completed();
    let mut lat = shared
        .latencies_us
        .lock()
        .map_err(|_| "latency buffer poisoned".to_string())?
        .clone();
    stop_worker(&worker, handle).await?;

    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let rank = ((p * lat.len() as f64).ceil() as usize).clamp(1, lat.len());
        round(lat[rank - 1] as f64 / 1000.0, 3)
    };
    Ok(json!({
        "system": SYSTEM,
        "version": VERSION,
        "scenario": "latency",
        "events": completed,
        "backlog": 0,
        "seconds": round(offer_secs, 3),
        "events_per_s": round(if run_secs > 0.0 { completed as f64 / run_secs } else { 0.0 }, 1),
        "knobs": knobs(),
        "offered": offered,
        "completed": completed,
        "rate": rate,
        "achieved_rate": round(if offer_secs > 0.0 { offered as f64 / offer_secs } else { 0.0 }, 1),
        "latency_ms": { "p50": pct(0.50), "p99": pct(0.99), "max": pct(1.0) },
    }))
}

async fn idle(args: &Args) -> Result<Value, String> {
    let seconds = args.seconds.unwrap_or(60.0);
    if !(seconds >= 0.0) {
        return Err("--seconds must not be negative".into());
    }
    let shared = Arc::new(Shared::new(0, 0, false, 0));
    let (worker, started) = build_worker(&args.url, State(shared.clone())).await?;
    let mut handle = start_worker(&worker);
    wait_started(&started, &mut handle).await?;
    tokio::select! {
        _ = tokio::time::sleep(IDLE_WARMUP.saturating_sub(SETTLE)) => {}
        res = &mut handle => return Err(worker_ended(res)),
    }
    hook(&args.hook, "idle-start").await?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {}
        res = &mut handle => return Err(worker_ended(res)),
    }
    hook(&args.hook, "idle-end").await?;
    stop_worker(&worker, handle).await?;
    Ok(json!({
        "system": SYSTEM,
        "version": VERSION,
        "scenario": "idle",
        "events": 0,
        "backlog": 0,
        "seconds": seconds,
        "knobs": knobs(),
    }))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    log(format!("scenario {}", args.scenario.name()));
    let res = match args.scenario {
        Scenario::Drain => drain(&args).await,
        Scenario::Latency => latency(&args).await,
        Scenario::Idle => idle(&args).await,
    };
    match res {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("[{SYSTEM}] error: {e}");
            std::process::exit(1);
        }
    }
}
