//! herald benchmark peer: apalis 1.0.0 with apalis-postgres 1.0.0.
//!
//! Follows the contract in `bench/peers/README.md`: `--scenario
//! drain|latency|idle`, hooks at each phase, one JSON object as the last line
//! on stdout, logs on stderr, non-zero exit with the reason on any failure.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;

const SYSTEM: &str = "apalis";
const VERSION: &str = "1.0.0";

// Knobs, every one set explicitly; README.md beside this file gives the
// source of each value.
const QUEUE: &str = "bench";
/// `Config::batch_size`: jobs claimed per `apalis.get_jobs` call.
const BATCH_SIZE: usize = 100;
/// `Config::lock_tasks`: false skips the extra per-task 'Running' UPDATE
/// (jobs are already claimed, status 'Queued', by `get_jobs`).
const LOCK_TASKS: bool = false;
/// `Config::persist_results`: must stay true, it is the completion write.
const PERSIST_RESULTS: bool = true;
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
const MISSED_HEARTBEATS: usize = 10;
/// Fallback poll beside LISTEN/NOTIFY (`with_pubsub`).
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// In-flight limit (`WorkerBuilderExt::concurrency`), one fetched batch.
const CONCURRENCY: usize = 100;
/// Workers (WorkerBuilder instances) on the queue, each with its own fetch loop.
const WORKERS: usize = 1;
const POOL_MAX_CONNECTIONS: u32 = 50;
/// Tasks per `push_all` call (one INSERT ... SELECT unnest(...) each) for the
/// untimed bulk inserts of the drain scenario.
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
#[command(about = "herald benchmark peer: apalis 1.0.0 + apalis-postgres 1.0.0")]
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

/// Handed to every handler as `Data<State>`.
#[derive(Clone, Debug)]
struct State(Arc<Shared>);

/// The no-op handler: takes the time, counts, returns.
async fn bench_noop(job: BenchJob, state: Data<State>) -> Result<(), BoxDynError> {
    let start_us = now_us();
    state.0.on_run(job.t_us, start_us);
    Ok(())
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
        "queue": QUEUE,
        "batch_size": BATCH_SIZE,
        "lock_tasks": LOCK_TASKS,
        "persist_results": PERSIST_RESULTS,
        "heartbeat_interval_s": HEARTBEAT_INTERVAL.as_secs(),
        "missed_heartbeats": MISSED_HEARTBEATS,
        "pubsub": true,
        "poll_interval_ms": POLL_INTERVAL.as_millis() as u64,
        "concurrency": CONCURRENCY,
        "parallelize": "tokio::spawn",
        "workers": WORKERS,
        "pool_max_connections": POOL_MAX_CONNECTIONS,
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

// ---------------------------------------------------------------- storage and workers

/// Connects and runs apalis-postgres's migrations (`PostgresStorage::setup`).
async fn storage(url: &str) -> Result<PostgresStorage<BenchJob>, String> {
    let pool = PgPoolOptions::new()
        .max_connections(POOL_MAX_CONNECTIONS)
        .connect(url)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    PostgresStorage::setup(&pool)
        .await
        .map_err(|e| format!("migrations (PostgresStorage::setup) failed: {e}"))?;
    let config = Config::default()
        .queue(QUEUE)
        .batch_size(BATCH_SIZE)
        .lock_tasks(LOCK_TASKS)
        .persist_results(PERSIST_RESULTS)
        .heartbeat_interval(HEARTBEAT_INTERVAL)
        .missed_heartbeats(MISSED_HEARTBEATS);
    Ok(PostgresStorage::new(&pool).with_config(config))
}

/// Running workers: their contexts (to stop them) and their tasks.
struct Workers {
    contexts: Vec<WorkerContext>,
    handles: Vec<JoinHandle<Result<(), String>>>,
}

/// Builds and starts the workers; `started` is notified once per worker on
/// its `Event::Start`.
fn start_workers(storage: &PostgresStorage<BenchJob>, state: &State, started: &Arc<Notify>) -> Workers {
    let mut contexts = Vec::with_capacity(WORKERS);
    let mut handles = Vec::with_capacity(WORKERS);
    for i in 0..WORKERS {
        let ctx = WorkerContext::new(&format!("peer-apalis-{}-{i}", std::process::id()));
        let backend = storage
            .clone()
            .with_pubsub()
            .poll_with_interval(POLL_INTERVAL);
        let started = started.clone();
        let worker = WorkerBuilder::new(&ctx)
            .backend(backend)
            .data(state.clone())
            .concurrency(CONCURRENCY)
            .parallelize(tokio::spawn)
            .on_event(move |_ctx, ev| {
                if matches!(ev, Event::Start) {
                    started.notify_one();
                }
            })
            .build(bench_noop);
        handles.push(tokio::spawn(async move {
            worker.run().await.map_err(|e| format!("worker failed: {e}"))
        }));
        contexts.push(ctx);
    }
    Workers { contexts, handles }
}

impl Workers {
    /// Resolves (with the reason) if any worker task ends; pends otherwise.
    async fn ended(&mut self) -> String {
        let (res, _idx, _rest) = futures::future::select_all(self.handles.iter_mut()).await;
        match res {
            Ok(Ok(())) => "worker stopped unexpectedly".to_string(),
            Ok(Err(e)) => e,
            Err(e) => format!("worker task panicked: {e}"),
        }
    }

    fn any_finished(&self) -> bool {
        self.handles.iter().any(|h| h.is_finished())
    }

    async fn wait_started(&mut self, started: &Notify) -> Result<(), String> {
        for _ in 0..WORKERS {
            tokio::select! {
                _ = started.notified() => {}
                e = self.ended() => return Err(e),
                _ = tokio::time::sleep(START_TIMEOUT) => return Err("worker did not start within 60 s".into()),
            }
        }
        // Let registration, the LISTEN connection and the first fetch happen.
        tokio::select! {
            _ = tokio::time::sleep(SETTLE) => Ok(()),
            e = self.ended() => Err(e),
        }
    }

    async fn stop(self) -> Result<(), String> {
        for ctx in &self.contexts {
            ctx.stop().map_err(|e| format!("cannot stop worker: {e}"))?;
        }
        for h in self.handles {
            match tokio::time::timeout(SHUTDOWN_TIMEOUT, h).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => return Err(e),
                Ok(Err(e)) => return Err(format!("worker task panicked: {e}")),
                Err(_) => return Err("worker did not shut down within 60 s".into()),
            }
        }
        Ok(())
    }
}

async fn insert_bulk(
    storage: &PostgresStorage<BenchJob>,
    count: u64,
    delay: Option<Duration>,
) -> Result<(), String> {
    let mut sink = storage.clone();
    let mut left = count;
    while left > 0 {
        let n = left.min(INSERT_BATCH as u64) as usize;
        let tasks: Vec<Task<BenchJob>> = (0..n)
            .map(|_| {
                let b = TaskBuilder::new(BenchJob { t_us: 0 });
                match delay {
                    Some(d) => b.run_after(d).build(),
                    None => b.build(),
                }
            })
            .collect();
        sink.push_all(futures::stream::iter(tasks))
            .await
            .map_err(|e| format!("push_all failed: {e}"))?;
        left -= n as u64;
    }
    Ok(())
}

// ---------------------------------------------------------------- scenarios

async fn drain(args: &Args) -> Result<Value, String> {
    let events = args.events;
    let half_at = if events == 0 { 0 } else { events.div_ceil(2) };
    let shared = Arc::new(Shared::new(half_at, events, false, 0));
    let storage = storage(&args.url).await?;

    let t = Instant::now();
    insert_bulk(&storage, args.backlog, Some(Duration::from_secs(24 * 3600))).await?;
    log(format!("stored {} backlog jobs in {:.1}s", args.backlog, t.elapsed().as_secs_f64()));
    hook(&args.hook, "after-backlog").await?;

    let t = Instant::now();
    insert_bulk(&storage, events, None).await?;
    log(format!("stored {events} runnable jobs in {:.1}s", t.elapsed().as_secs_f64()));
    hook(&args.hook, "drain-start").await?;

    let t0 = Instant::now();
    let deadline = tokio::time::Instant::from_std(t0 + DRAIN_DEADLINE);
    let started = Arc::new(Notify::new());
    let mut workers = start_workers(&storage, &State(shared.clone()), &started);

    if events > 0 {
        tokio::select! {
            _ = shared.half.notified() => {}
            e = workers.ended() => return Err(e),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(format!("drain not done within 600 s: {} of {events} jobs ran", shared.completed()));
            }
        }
    }
    let mid_child = hook_background(&args.hook, "mid-drain")?;
    if events > 0 {
        tokio::select! {
            _ = shared.done.notified() => {}
            e = workers.ended() => return Err(e),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(format!("drain not done within 600 s: {} of {events} jobs ran", shared.completed()));
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    log(format!("drained {events} jobs in {secs:.3}s"));
    hook(&args.hook, "drain-end").await?;
    workers.stop().await?;
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

async fn latency(args: &Args) -> Result<Value, String> {
    let seconds = args.seconds.unwrap_or(20.0);
    let rate = args.rate;
    if !(rate > 0.0) || !(seconds > 0.0) {
        return Err("--rate and --seconds must be positive".into());
    }
    let offered = (rate * seconds).round() as u64;
    let shared = Arc::new(Shared::new(0, offered, true, offered as usize));
    let storage = storage(&args.url).await?;
    let started = Arc::new(Notify::new());
    let mut workers = start_workers(&storage, &State(shared.clone()), &started);
    workers.wait_started(&started).await?;
    hook(&args.hook, "run-start").await?;

    // Offer: one push call per job, paced at --rate, at most 32 in flight.
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
        let mut sink = storage.clone();
        let first_error = first_error.clone();
        tokio::spawn(async move {
            let t_us = now_us();
            if let Err(e) = sink.push(BenchJob { t_us }).await {
                if let Ok(mut slot) = first_error.lock() {
                    slot.get_or_insert(format!("push failed: {e}"));
                }
            }
            drop(permit);
        });
        if workers.any_finished() {
            return Err(workers.ended().await);
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
            e = workers.ended() => return Err(e),
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
    workers.stop().await?;

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
    let storage = storage(&args.url).await?;
    let started = Arc::new(Notify::new());
    let mut workers = start_workers(&storage, &State(shared.clone()), &started);
    workers.wait_started(&started).await?;
    tokio::select! {
        _ = tokio::time::sleep(IDLE_WARMUP.saturating_sub(SETTLE)) => {}
        e = workers.ended() => return Err(e),
    }
    hook(&args.hook, "idle-start").await?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {}
        e = workers.ended() => return Err(e),
    }
    hook(&args.hook, "idle-end").await?;
    workers.stop().await?;
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
