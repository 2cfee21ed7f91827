//! herald benchmark peer: the plain `FOR UPDATE SKIP LOCKED` baseline.
//!
//! One table, `jobs(id, run_at, payload)`; claim loops delete a batch of due
//! rows (`DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)
//! RETURNING`), run the no-op handler on each and are done: the claim is the
//! completion, there is no lease, heartbeat or retry. A loop whose claim
//! returns nothing sleeps the poll interval (polling only, no LISTEN/NOTIFY).
//!
//! Follows the contract in `bench/peers/README.md`:
//! `skip-locked-peer --url URL --scenario drain|latency|idle [--events N]
//!  [--backlog N] [--rate R] [--seconds S] [--hook CMD]`; logs on stderr, one
//! JSON object as the last line on stdout.

use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Parser, ValueEnum};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

const SYSTEM: &str = "skip-locked";
const SQLX_VERSION: &str = "sqlx 0.8.6";

/// A drain that has not finished by then is a failure (the contract's 600 s).
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// run-end comes at the last offered job, or this long after offering ended.
const LATENCY_GRACE: Duration = Duration::from_secs(60);
/// The contract's cap on concurrent insert calls in the latency scenario.
const MAX_IN_FLIGHT_INSERTS: usize = 32;
/// Producer pool: one connection per in-flight insert call.
const PRODUCER_POOL_SIZE: u32 = MAX_IN_FLIGHT_INSERTS as u32;
/// Rows per `INSERT ... SELECT FROM unnest($1)` in the (untimed) bulk insert.
const INSERT_CHUNK: usize = 5_000;

const SCHEMA: &str = r#"
CREATE TABLE jobs (
    id bigserial PRIMARY KEY,
    run_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL
);
CREATE INDEX jobs_run_at_idx ON jobs (run_at);
"#;

const CLAIM: &str = r#"
DELETE FROM jobs
WHERE id IN (
    SELECT id FROM jobs
    WHERE run_at <= now()
    ORDER BY run_at, id
    FOR UPDATE SKIP LOCKED
    LIMIT $1
)
RETURNING id, payload
"#;

const INSERT_RUNNABLE: &str = "INSERT INTO jobs (payload) SELECT p FROM unnest($1::jsonb[]) AS p";
const INSERT_BACKLOG: &str = "INSERT INTO jobs (run_at, payload) \
     SELECT now() + interval '1 day', p FROM unnest($1::jsonb[]) AS p";
const INSERT_ONE: &str = "INSERT INTO jobs (payload) VALUES ($1)";

// ── CLI ───────────────────────────────────────────────────────────────────

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Drain,
    Latency,
    Idle,
}

#[derive(Parser, Debug)]
#[command(about = "herald benchmark peer: plain FOR UPDATE SKIP LOCKED baseline")]
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

    // The knobs (not part of the contract; the defaults are the measured
    // configuration, see README.md).
    /// Concurrent claim loops.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Rows claimed (deleted) per claim statement.
    #[arg(long, default_value_t = 500)]
    batch_size: i64,
    /// Connections in the workers' pool.
    #[arg(long, default_value_t = 4)]
    pool_size: u32,
    /// Sleep after a claim that returned nothing, milliseconds.
    #[arg(long, default_value_t = 50)]
    poll_interval_ms: u64,
}

impl Args {
    fn knobs(&self) -> serde_json::Value {
        json!({
            "workers": self.workers,
            "batch_size": self.batch_size,
            "pool_size": self.pool_size,
            "poll_interval_ms": self.poll_interval_ms,
            "wakeup": "poll",
            "producer_pool_size": PRODUCER_POOL_SIZE,
            "bulk_insert": "INSERT ... SELECT FROM unnest($1::jsonb[])",
            "bulk_insert_chunk": INSERT_CHUNK,
        })
    }
}

// ── The no-op handler ─────────────────────────────────────────────────────

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

    /// The no-op handler for one job.
    fn handle(&self, payload: &serde_json::Value) {
        let start_us = epoch_micros();
        let t_us = payload.get("t_us").and_then(|v| v.as_i64()).unwrap_or(0);
        if t_us > 0 {
            if let Ok(mut lat) = self.latencies_us.lock() {
                lat.push(start_us - t_us);
            }
        }
        let n = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.half_at.load(Ordering::SeqCst) {
            self.half.notify_one();
        }
        if n == self.done_at.load(Ordering::SeqCst) {
            self.done.notify_one();
        }
    }
}

// ── Workers ───────────────────────────────────────────────────────────────

struct Workers {
    set: JoinSet<Result<()>>,
    stop: Arc<AtomicBool>,
}

fn start_workers(args: &Args, pool: &PgPool, tally: &Arc<Tally>) -> Workers {
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    let poll = Duration::from_millis(args.poll_interval_ms);
    for _ in 0..args.workers {
        let pool = pool.clone();
        let tally = tally.clone();
        let stop = stop.clone();
        let batch = args.batch_size;
        set.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let rows: Vec<(i64, serde_json::Value)> = sqlx::query_as(CLAIM)
                    .bind(batch)
                    .fetch_all(&pool)
                    .await
                    .context("claim")?;
                if rows.is_empty() {
                    tokio::time::sleep(poll).await;
                    continue;
                }
                for (_id, payload) in &rows {
                    tally.handle(payload);
                }
            }
            Ok(())
        });
    }
    Workers { set, stop }
}

impl Workers {
    /// Wait for `notify` until `deadline`: `Ok(true)` when notified,
    /// `Ok(false)` at the deadline, an error when a worker failed.
    async fn wait(&mut self, notify: &Notify, deadline: tokio::time::Instant) -> Result<bool> {
        tokio::select! {
            _ = notify.notified() => Ok(true),
            ended = self.set.join_next() => match ended {
                Some(Ok(Err(e))) => Err(e.context("worker failed")),
                Some(Err(e)) => Err(anyhow!("worker panicked: {e}")),
                _ => Err(anyhow!("workers ended early")),
            },
            _ = tokio::time::sleep_until(deadline) => Ok(false),
        }
    }

    async fn shutdown(mut self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        while let Some(ended) = self.set.join_next().await {
            ended.map_err(|e| anyhow!("worker panicked: {e}"))??;
        }
        Ok(())
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
    eprintln!("skip-locked-peer: hook {phase}");
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
    eprintln!("skip-locked-peer: hook {phase} (background)");
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

async fn install_schema(pool: &PgPool) -> Result<()> {
    sqlx::raw_sql(SCHEMA)
        .execute(pool)
        .await
        .context("creating the jobs table")?;
    Ok(())
}

async fn bulk_insert(pool: &PgPool, count: u64, sql: &str) -> Result<()> {
    let mut seq = 0u64;
    while seq < count {
        let n = (count - seq).min(INSERT_CHUNK as u64);
        let payloads: Vec<serde_json::Value> = (seq..seq + n)
            .map(|s| json!({ "seq": s, "t_us": 0 }))
            .collect();
        sqlx::query(sql)
            .bind(&payloads)
            .execute(pool)
            .await
            .context("bulk insert")?;
        seq += n;
    }
    Ok(())
}

// ── Scenarios ─────────────────────────────────────────────────────────────

async fn drain(args: &Args) -> Result<serde_json::Value> {
    let pool = connect(&args.url, args.pool_size).await?;
    install_schema(&pool).await?;

    bulk_insert(&pool, args.backlog, INSERT_BACKLOG).await?;
    eprintln!("skip-locked-peer: {} backlog jobs stored", args.backlog);
    hook_sync(&args.hook, "after-backlog").await?;

    bulk_insert(&pool, args.events, INSERT_RUNNABLE).await?;
    eprintln!("skip-locked-peer: {} runnable jobs stored", args.events);
    sqlx::query("ANALYZE jobs")
        .execute(&pool)
        .await
        .context("analyze")?;

    let tally = Tally::new();
    tally
        .half_at
        .store(args.events.div_ceil(2), Ordering::SeqCst);
    tally.done_at.store(args.events, Ordering::SeqCst);

    hook_sync(&args.hook, "drain-start").await?;
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + DRAIN_LIMIT;
    let mut workers = start_workers(args, &pool, &tally);
    let timeout = || {
        anyhow!(
            "drain not done in {} s: {} of {} jobs ran",
            DRAIN_LIMIT.as_secs(),
            tally.completed.load(Ordering::SeqCst),
            args.events
        )
    };

    let mid = if args.events == 0 {
        hook_background(&args.hook, "mid-drain")?
    } else {
        if !workers.wait(&tally.half, deadline).await? {
            return Err(timeout());
        }
        let mid = hook_background(&args.hook, "mid-drain")?;
        if !workers.wait(&tally.done, deadline).await? {
            return Err(timeout());
        }
        mid
    };
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "skip-locked-peer: {} jobs ran in {seconds:.3} s",
        tally.completed.load(Ordering::SeqCst)
    );

    hook_sync(&args.hook, "drain-end").await?;
    wait_background(mid, "mid-drain").await?;
    workers.shutdown().await?;

    let left: (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE run_at <= now()), count(*) FROM jobs",
    )
    .fetch_one(&pool)
    .await
    .context("counting what is left")?;
    eprintln!(
        "skip-locked-peer: left in the table: {} runnable, {} in all",
        left.0, left.1
    );

    let events_per_s = if seconds > 0.0 {
        args.events as f64 / seconds
    } else {
        0.0
    };
    Ok(json!({
        "system": SYSTEM,
        "version": SQLX_VERSION,
        "scenario": "drain",
        "events": args.events,
        "backlog": args.backlog,
        "seconds": round3(seconds),
        "events_per_s": events_per_s.round(),
        "knobs": args.knobs(),
    }))
}

async fn latency(args: &Args) -> Result<serde_json::Value> {
    let seconds = args.seconds.unwrap_or(20);
    if args.rate == 0 {
        bail!("--rate must be positive");
    }
    let pool = connect(&args.url, args.pool_size).await?;
    install_schema(&pool).await?;
    let producer_pool = connect(&args.url, PRODUCER_POOL_SIZE).await?;

    let total = args.rate * seconds;
    let tally = Tally::new();
    tally.done_at.store(total, Ordering::SeqCst);
    let mut workers = start_workers(args, &pool, &tally);
    // Every loop has made its first (empty) claim and is polling.
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
            sqlx::query(INSERT_ONE)
                .bind(json!({ "seq": seq, "t_us": t_us }))
                .execute(&producer_pool)
                .await
                .context("insert")?;
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
    eprintln!("skip-locked-peer: offered {total} jobs in {offering:.3} s ({achieved_rate:.1}/s)");

    if total > 0
        && tally.completed.load(Ordering::SeqCst) < total
        && !workers
            .wait(&tally.done, tokio::time::Instant::now() + LATENCY_GRACE)
            .await?
    {
        eprintln!(
            "skip-locked-peer: warning: {} of {total} offered jobs ran within {} s of offering's end",
            tally.completed.load(Ordering::SeqCst),
            LATENCY_GRACE.as_secs()
        );
    }
    hook_sync(&args.hook, "run-end").await?;
    let completed = tally.completed.load(Ordering::SeqCst);
    workers.shutdown().await?;

    let mut lat = tally
        .latencies_us
        .lock()
        .map_err(|_| anyhow!("latency list poisoned"))?
        .clone();
    lat.sort_unstable();
    Ok(json!({
        "system": SYSTEM,
        "version": SQLX_VERSION,
        "scenario": "latency",
        "seconds": seconds,
        "knobs": args.knobs(),
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
    let pool = connect(&args.url, args.pool_size).await?;
    install_schema(&pool).await?;
    let tally = Tally::new();
    let mut workers = start_workers(args, &pool, &tally);
    // Nothing is ever notified: these waits only end early on a worker error.
    let never = Notify::new();
    let up = tokio::time::Instant::now() + Duration::from_secs(5);
    wait_or_deadline(&mut workers, &never, up).await?;
    hook_sync(&args.hook, "idle-start").await?;
    let end = tokio::time::Instant::now() + Duration::from_secs(seconds);
    wait_or_deadline(&mut workers, &never, end).await?;
    hook_sync(&args.hook, "idle-end").await?;
    workers.shutdown().await?;
    Ok(json!({
        "system": SYSTEM,
        "version": SQLX_VERSION,
        "scenario": "idle",
        "seconds": seconds,
        "knobs": args.knobs(),
    }))
}

/// Sleep until `deadline`, failing early if a worker fails.
async fn wait_or_deadline(
    workers: &mut Workers,
    never: &Notify,
    deadline: tokio::time::Instant,
) -> Result<()> {
    workers.wait(never, deadline).await.map(|_| ())
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
    if args.workers == 0 || args.batch_size <= 0 || args.pool_size == 0 {
        bail!("--workers, --batch-size and --pool-size must be positive");
    }
    match args.scenario {
        Scenario::Drain => drain(&args).await,
        Scenario::Latency => latency(&args).await,
        Scenario::Idle => idle(&args).await,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skip-locked-peer: error: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(result) => {
            println!("{result}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("skip-locked-peer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
