//! herald benchmark peer: awa 0.6.9 (PostgreSQL job queue, queue-storage engine).
//!
//! Follows the contract in `bench/peers/README.md`:
//! `awa-peer --url URL --scenario drain|latency|idle [--events N] [--backlog N]
//!  [--rate R] [--seconds S] [--hook CMD]`; logs on stderr, one JSON object as
//! the last line on stdout.

use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context as _, Result};
use awa::{
    InsertOpts, InsertParams, JobArgs, JobContext, JobError, JobResult, QueueConfig, QueueStorage,
    QueueStorageConfig, Worker,
};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

const SYSTEM: &str = "awa";
const AWA_VERSION: &str = "0.6.9";
const QUEUE: &str = "bench";

/// A drain that has not finished by then is a failure (the contract's 600 s).
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// run-end comes at the last offered job, or this long after offering ended.
const LATENCY_GRACE: Duration = Duration::from_secs(60);
/// The contract's cap on concurrent insert calls in the latency scenario.
const MAX_IN_FLIGHT_INSERTS: usize = 32;

// ── The knobs (README.md gives the documentation for each value) ──────────

/// `QueueConfig::max_workers`: in-flight worker permits for the queue.
const MAX_WORKERS: u32 = 1024;
/// `QueueConfig::claimers`: dispatcher/claimer loops for the queue.
const CLAIMERS: u16 = 1;
/// `QueueConfig::claim_batch_size`: jobs claimed per round trip.
const CLAIM_BATCH_SIZE: usize = 512;
/// `QueueConfig::poll_interval`: fallback poll when no NOTIFY arrives.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// `QueueConfig::deadline_duration`: per-attempt deadline (rescue stays on).
const DEADLINE: Duration = Duration::from_secs(300);
/// Worker runtime's connection pool (`num_queues * 4 + 20`, one queue).
const POOL_SIZE: u32 = 24;
/// Producer pool: one connection per in-flight insert call.
const PRODUCER_POOL_SIZE: u32 = MAX_IN_FLIGHT_INSERTS as u32;
/// Queue-storage ring rotation cadences (the builder's defaults).
const QUEUE_ROTATE: Duration = Duration::from_millis(1_000);
const LEASE_ROTATE: Duration = Duration::from_millis(1_000);
const CLAIM_ROTATE: Duration = Duration::from_millis(1_000);
/// Completion batcher, read by awa-worker from the environment.
const COMPLETION_BATCH_SIZE: usize = 512;
const COMPLETION_FLUSH_MS: u64 = 1;
const COMPLETION_SHARDS: usize = 4;
/// Hard cap on claimers per queue, read by awa-worker from the environment.
const MAX_CLAIMERS_PER_QUEUE: u16 = 4;
/// Rows per `QueueStorage::enqueue_params_copy` call in the (untimed) bulk insert.
const COPY_CHUNK: usize = 5_000;

fn queue_storage_config() -> QueueStorageConfig {
    QueueStorageConfig {
        schema: "awa".to_string(),
        queue_slot_count: 16,
        lease_slot_count: 8,
        claim_slot_count: 8,
        queue_stripe_count: 1,
        lease_claim_receipts: true,
    }
}

fn knobs() -> serde_json::Value {
    let qs = queue_storage_config();
    json!({
        "storage": "queue_storage",
        "max_workers": MAX_WORKERS,
        "claimers": CLAIMERS,
        "claim_batch_size": CLAIM_BATCH_SIZE,
        "poll_interval_ms": POLL_INTERVAL.as_millis() as u64,
        "deadline_duration_s": DEADLINE.as_secs(),
        "pool_size": POOL_SIZE,
        "producer_pool_size": PRODUCER_POOL_SIZE,
        "queue_slot_count": qs.queue_slot_count,
        "lease_slot_count": qs.lease_slot_count,
        "claim_slot_count": qs.claim_slot_count,
        "queue_stripe_count": qs.queue_stripe_count,
        "lease_claim_receipts": qs.lease_claim_receipts,
        "queue_rotate_ms": QUEUE_ROTATE.as_millis() as u64,
        "lease_rotate_ms": LEASE_ROTATE.as_millis() as u64,
        "claim_rotate_ms": CLAIM_ROTATE.as_millis() as u64,
        "completion_batch_size": COMPLETION_BATCH_SIZE,
        "completion_flush_ms": COMPLETION_FLUSH_MS,
        "completion_shards": COMPLETION_SHARDS,
        "max_claimers_per_queue": MAX_CLAIMERS_PER_QUEUE,
        "enqueue_shards": 1,
        "bulk_insert": "QueueStorage::enqueue_params_copy",
        "bulk_insert_chunk": COPY_CHUNK,
        "latency_insert": "awa::insert_with",
    })
}

// ── CLI ───────────────────────────────────────────────────────────────────

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Drain,
    Latency,
    Idle,
}

#[derive(Parser, Debug)]
#[command(about = "herald benchmark peer: awa 0.6.9")]
struct Args {
    /// The peer's own PostgreSQL database, fresh and empty.
    #[arg(long)]
    url: String,
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// drain: runnable no-op jobs.
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// drain: jobs stored a day ahead, before the runnable ones.
    #[arg(long, default_value_t = 0)]
    backlog: u64,
    /// latency: jobs offered per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// latency: seconds of offering (default 20); idle: seconds idle (default 60).
    #[arg(long)]
    seconds: Option<u64>,
    /// Run `sh -c "CMD PHASE"` at each phase.
    #[arg(long)]
    hook: Option<String>,
}

// ── Jobs and the no-op handler ───────────────────────────────────────────

#[derive(Debug, Serialize, Deserialize, JobArgs)]
struct BenchJob {
    seq: u64,
    /// Epoch microseconds taken just before the insert call (latency), else 0.
    t_us: i64,
}

fn epoch_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What the handlers share with the driver loop.
struct Tally {
    completed: AtomicU64,
    /// The count at which `half` is signalled (0: never).
    half_at: AtomicU64,
    /// The count at which `done` is signalled (0: never).
    done_at: AtomicU64,
    half: Notify,
    done: Notify,
    /// Handler start minus the payload's timestamp, microseconds.
    latencies_us: Mutex<Vec<i64>>,
}

impl Tally {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            completed: AtomicU64::new(0),
            half_at: AtomicU64::new(0),
            done_at: AtomicU64::new(0),
            half: Notify::new(),
            done: Notify::new(),
            latencies_us: Mutex::new(Vec::new()),
        })
    }
}

struct NoopWorker {
    tally: Arc<Tally>,
}

#[async_trait::async_trait]
impl Worker for NoopWorker {
    fn kind(&self) -> &'static str {
        "bench_job"
    }

    async fn perform(&self, ctx: &JobContext) -> Result<JobResult, JobError> {
        let start_us = epoch_micros();
        let t_us = ctx.job.args.get("t_us").and_then(|v| v.as_i64()).unwrap_or(0);
        if t_us > 0 {
            if let Ok(mut lat) = self.tally.latencies_us.lock() {
                lat.push(start_us - t_us);
            }
        }
        let n = self.tally.completed.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.tally.half_at.load(Ordering::SeqCst) {
            self.tally.half.notify_one();
        }
        if n == self.tally.done_at.load(Ordering::SeqCst) {
            self.tally.done.notify_one();
        }
        Ok(JobResult::Completed)
    }
}

// ── Hooks ─────────────────────────────────────────────────────────────────

fn hook_command(hook: &str, phase: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("{hook} {phase}"))
        .stdin(Stdio::null());
    cmd
}

/// Run the hook for `phase` and wait for it.
async fn hook_sync(hook: &Option<String>, phase: &'static str) -> Result<()> {
    let Some(hook) = hook.clone() else {
        return Ok(());
    };
    eprintln!("awa-peer: hook {phase}");
    let status = tokio::task::spawn_blocking(move || hook_command(&hook, phase).status())
        .await
        .context("hook task")?
        .with_context(|| format!("running hook for phase {phase}"))?;
    if !status.success() {
        bail!("hook for phase {phase} exited with {status}");
    }
    Ok(())
}

/// Start the hook for `phase` without waiting (mid-drain).
fn hook_background(hook: &Option<String>, phase: &'static str) -> Result<Option<Child>> {
    let Some(hook) = hook else {
        return Ok(None);
    };
    eprintln!("awa-peer: hook {phase} (background)");
    let child = hook_command(hook, phase)
        .spawn()
        .with_context(|| format!("starting hook for phase {phase}"))?;
    Ok(Some(child))
}

async fn wait_background(child: Option<Child>, phase: &'static str) -> Result<()> {
    let Some(mut child) = child else {
        return Ok(());
    };
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .context("hook task")?
        .with_context(|| format!("waiting for hook for phase {phase}"))?;
    if !status.success() {
        bail!("hook for phase {phase} exited with {status}");
    }
    Ok(())
}

// ── Setup ─────────────────────────────────────────────────────────────────

async fn connect(url: &str, max: u32) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .with_context(|| format!("connecting to {url}"))
}

/// awa's migrations, then the queue-storage engine installed and made the
/// active backend, so that inserts made before any worker starts already go
/// to queue storage (a client started on a database that holds canonical
/// jobs would otherwise stay on the canonical engine).
async fn install_schema(pool: &PgPool) -> Result<QueueStorage> {
    awa::migrations::run(pool)
        .await
        .context("running awa migrations")?;
    let store = QueueStorage::new(queue_storage_config()).context("queue storage config")?;
    store
        .install(pool)
        .await
        .context("installing awa queue storage")?;
    let status = awa::storage::status(pool)
        .await
        .context("reading awa storage status")?;
    eprintln!(
        "awa-peer: schema ready; storage state {} (active engine {})",
        status.state, status.active_engine
    );
    Ok(store)
}

fn build_client(pool: PgPool, tally: Arc<Tally>) -> Result<awa::Client> {
    awa::Client::builder(pool)
        .queue(
            QUEUE,
            QueueConfig {
                max_workers: MAX_WORKERS,
                poll_interval: POLL_INTERVAL,
                deadline_duration: DEADLINE,
                claimers: CLAIMERS,
                claim_batch_size: CLAIM_BATCH_SIZE,
                ..QueueConfig::default()
            },
        )
        .queue_storage(queue_storage_config(), QUEUE_ROTATE, LEASE_ROTATE)
        .claim_rotate_interval(CLAIM_ROTATE)
        .register_worker(NoopWorker { tally })
        .build()
        .map_err(|e| anyhow!("building the awa client: {e}"))
}

async fn bulk_insert(
    store: &QueueStorage,
    pool: &PgPool,
    count: u64,
    run_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<()> {
    let mut seq = 0u64;
    while seq < count {
        let n = (count - seq).min(COPY_CHUNK as u64);
        let params: Vec<InsertParams> = (seq..seq + n)
            .map(|s| {
                awa::insert::params_with(
                    &BenchJob { seq: s, t_us: 0 },
                    InsertOpts {
                        queue: QUEUE.into(),
                        run_at,
                        ..InsertOpts::default()
                    },
                )
            })
            .collect::<std::result::Result<_, _>>()
            .context("building insert params")?;
        store
            .enqueue_params_copy(pool, &params)
            .await
            .context("bulk insert (enqueue_params_copy)")?;
        seq += n;
    }
    Ok(())
}

// ── Scenarios ─────────────────────────────────────────────────────────────

async fn drain(args: &Args) -> Result<serde_json::Value> {
    let pool = connect(&args.url, POOL_SIZE).await?;
    let store = install_schema(&pool).await?;

    if args.backlog > 0 {
        let run_at = chrono::Utc::now() + chrono::Duration::days(1);
        bulk_insert(&store, &pool, args.backlog, Some(run_at)).await?;
    }
    eprintln!("awa-peer: {} backlog jobs stored", args.backlog);
    hook_sync(&args.hook, "after-backlog").await?;

    bulk_insert(&store, &pool, args.events, None).await?;
    eprintln!("awa-peer: {} runnable jobs stored", args.events);

    let tally = Tally::new();
    let half = args.events.div_ceil(2);
    tally.half_at.store(half, Ordering::SeqCst);
    tally.done_at.store(args.events, Ordering::SeqCst);
    let client = build_client(pool.clone(), tally.clone())?;

    hook_sync(&args.hook, "drain-start").await?;
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + DRAIN_LIMIT;
    client.start().await.context("starting the awa client")?;

    let mid = if args.events == 0 {
        hook_background(&args.hook, "mid-drain")?
    } else {
        if tokio::time::timeout_at(deadline, tally.half.notified())
            .await
            .is_err()
        {
            bail!(
                "drain not done in {} s: {} of {} jobs ran",
                DRAIN_LIMIT.as_secs(),
                tally.completed.load(Ordering::SeqCst),
                args.events
            );
        }
        let mid = hook_background(&args.hook, "mid-drain")?;
        if tokio::time::timeout_at(deadline, tally.done.notified())
            .await
            .is_err()
        {
            bail!(
                "drain not done in {} s: {} of {} jobs ran",
                DRAIN_LIMIT.as_secs(),
                tally.completed.load(Ordering::SeqCst),
                args.events
            );
        }
        mid
    };
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "awa-peer: {} jobs ran in {seconds:.3} s",
        tally.completed.load(Ordering::SeqCst)
    );

    hook_sync(&args.hook, "drain-end").await?;
    wait_background(mid, "mid-drain").await?;
    client.shutdown(Duration::from_secs(30)).await;

    // What the store itself says is left runnable, after the shutdown
    // flushed completions (the cheap count: the exact one scans the rings).
    match store.queue_counts_fast(&pool, QUEUE).await {
        Ok(c) => eprintln!("awa-peer: left runnable in the store: {}", c.available),
        Err(e) => eprintln!("awa-peer: could not read store counts: {e}"),
    }

    let events_per_s = if seconds > 0.0 {
        args.events as f64 / seconds
    } else {
        0.0
    };
    Ok(json!({
        "system": SYSTEM,
        "version": AWA_VERSION,
        "scenario": "drain",
        "events": args.events,
        "backlog": args.backlog,
        "seconds": round3(seconds),
        "events_per_s": events_per_s.round(),
        "knobs": knobs(),
    }))
}

async fn latency(args: &Args) -> Result<serde_json::Value> {
    let seconds = args.seconds.unwrap_or(20);
    if args.rate == 0 {
        bail!("--rate must be positive");
    }
    let pool = connect(&args.url, POOL_SIZE).await?;
    install_schema(&pool).await?;
    let producer_pool = connect(&args.url, PRODUCER_POOL_SIZE).await?;

    let total = args.rate * seconds;
    let tally = Tally::new();
    tally.done_at.store(total, Ordering::SeqCst);
    let client = build_client(pool.clone(), tally.clone())?;
    client.start().await.context("starting the awa client")?;
    // Let the dispatcher reach its idle wait (LISTEN set up, first empty claim).
    tokio::time::sleep(Duration::from_secs(1)).await;
    hook_sync(&args.hook, "run-start").await?;

    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT_INSERTS));
    let mut inserts: JoinSet<Result<()>> = JoinSet::new();
    let offer_start = tokio::time::Instant::now();
    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    for seq in 0..total {
        tokio::time::sleep_until(offer_start + period.mul_f64(seq as f64)).await;
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .context("insert permit")?;
        let producer_pool = producer_pool.clone();
        inserts.spawn(async move {
            let _permit = permit;
            let t_us = epoch_micros();
            awa::insert_with(
                &producer_pool,
                &BenchJob { seq, t_us },
                InsertOpts {
                    queue: QUEUE.into(),
                    ..InsertOpts::default()
                },
            )
            .await
            .context("insert_with")?;
            Ok(())
        });
        while let Some(done) = inserts.try_join_next() {
            done.context("insert task")??;
        }
    }
    while let Some(done) = inserts.join_next().await {
        done.context("insert task")??;
    }
    let offering = offer_start.elapsed().as_secs_f64();
    let achieved_rate = total as f64 / offering;
    eprintln!("awa-peer: offered {total} jobs in {offering:.3} s ({achieved_rate:.1}/s)");

    if total > 0
        && tally.completed.load(Ordering::SeqCst) < total
        && tokio::time::timeout(LATENCY_GRACE, tally.done.notified())
            .await
            .is_err()
    {
        eprintln!(
            "awa-peer: warning: {} of {total} offered jobs ran within {} s of offering's end",
            tally.completed.load(Ordering::SeqCst),
            LATENCY_GRACE.as_secs()
        );
    }
    hook_sync(&args.hook, "run-end").await?;
    let completed = tally.completed.load(Ordering::SeqCst);
    client.shutdown(Duration::from_secs(30)).await;

    let mut lat = tally
        .latencies_us
        .lock()
        .map_err(|_| anyhow!("latency list poisoned"))?
        .clone();
    lat.sort_unstable();
    Ok(json!({
        "system": SYSTEM,
        "version": AWA_VERSION,
        "scenario": "latency",
        "seconds": seconds,
        "knobs": knobs(),
        "offered": total,
        "completed": completed,
        "rate": args.rate,
        "achieved_rate": round3(achieved_rate),
        "latency_ms": {
            "p50": percentile_ms(&lat, 0.50),
            "p99": percentile_ms(&lat, 0.99),
            "max": lat.last().map(|v| round3(*v as f64 / 1000.0)),
        },
    }))
}

async fn idle(args: &Args) -> Result<serde_json::Value> {
    let seconds = args.seconds.unwrap_or(60);
    let pool = connect(&args.url, POOL_SIZE).await?;
    install_schema(&pool).await?;
    let tally = Tally::new();
    let client = build_client(pool.clone(), tally.clone())?;
    client.start().await.context("starting the awa client")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    hook_sync(&args.hook, "idle-start").await?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    hook_sync(&args.hook, "idle-end").await?;
    client.shutdown(Duration::from_secs(30)).await;
    Ok(json!({
        "system": SYSTEM,
        "version": AWA_VERSION,
        "scenario": "idle",
        "seconds": seconds,
        "knobs": knobs(),
    }))
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Nearest-rank percentile of sorted microsecond values, in milliseconds.
fn percentile_ms(sorted_us: &[i64], q: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = (q * sorted_us.len() as f64).ceil() as usize;
    let idx = rank.clamp(1, sorted_us.len()) - 1;
    Some(round3(sorted_us[idx] as f64 / 1000.0))
}

async fn run(args: Args) -> Result<serde_json::Value> {
    match args.scenario {
        Scenario::Drain => drain(&args).await,
        Scenario::Latency => latency(&args).await,
        Scenario::Idle => idle(&args).await,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();

    // awa-worker reads these from the environment; set them to the values in
    // README.md before any thread exists (so nothing reads the environment
    // concurrently), making the run independent of the caller's environment.
    std::env::set_var("AWA_COMPLETION_BATCH_SIZE", COMPLETION_BATCH_SIZE.to_string());
    std::env::set_var("AWA_COMPLETION_FLUSH_MS", COMPLETION_FLUSH_MS.to_string());
    std::env::set_var("AWA_COMPLETION_SHARDS", COMPLETION_SHARDS.to_string());
    std::env::set_var(
        "AWA_MAX_CLAIMERS_PER_QUEUE",
        MAX_CLAIMERS_PER_QUEUE.to_string(),
    );

    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx::query=error")),
        )
        .init();

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("awa-peer: error: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(result) => {
            println!("{result}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("awa-peer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
