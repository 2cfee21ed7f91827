//! herald benchmark peer: awa 0.6.9 (PostgreSQL job queue, queue-storage
//! engine). The contract (flags, scenarios, hooks) is `peer-contract`'s.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use awa::{
    InsertOpts, InsertParams, JobArgs, JobContext, JobError, JobResult, QueueConfig, QueueStorage,
    QueueStorageConfig, Worker,
};
use peer_contract::{anyhow, json, Context as _, Due, Job, Peer, Result, Tally, Value};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

const QUEUE: &str = "bench";

// ── The knobs (README.md gives the documentation for each value) ──────────

/// `QueueConfig::max_workers`: in-flight worker permits for the queue.
const MAX_WORKERS: u32 = 1024;
/// `QueueConfig::claimers`: dispatcher/claimer loops for the queue.
const CLAIMERS: u16 = 1;
/// `QueueConfig::claim_batch_size`: jobs claimed per round trip.
const CLAIM_BATCH_SIZE: usize = 512;
/// `QueueConfig::poll_interval`: fallback poll when no NOTIFY arrives (the
/// public cross-queue benchmark's 50 ms; awa's default is 200 ms).
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// `QueueConfig::deadline_duration`: per-attempt deadline (rescue stays on).
const DEADLINE: Duration = Duration::from_secs(300);
/// Worker runtime's connection pool: the public benchmark's
/// `max(4 * workers + 48, 80)` floor of 80 (4 × 1,024 + 48 would exceed the
/// cluster's 200 connections; a no-op handler holds none).
const POOL_SIZE: u32 = 80;
/// Observability refreshes, set as the public benchmark sets them so that
/// they cost nothing during a run (defaults 30 s and 10 s).
const QUEUE_STATS_INTERVAL: Duration = Duration::from_secs(300);
const RUNTIME_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(300);
/// Producer pool: one connection per in-flight insert call.
const PRODUCER_POOL_SIZE: u32 = 32;
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
/// Not set, awa's defaults (awa-worker 0.6.9 `src/maintenance.rs`,
/// `MaintenanceService::new`): the maintenance leader rescues a running job
/// whose heartbeat is older than `heartbeat_staleness` (90 s), sweeping every
/// `heartbeat_rescue_interval` (30 s); workers heartbeat every 30 s
/// (`ClientBuilder::heartbeat_interval`), and a new leader is elected within
/// `leader_election_interval` (10 s) of the dead one's session ending.
const RESCUE_AFTER: Duration = Duration::from_secs(90);
const RESCUE_SETTING: &str = "awa heartbeat_staleness default 90 s, swept every heartbeat_rescue_interval (default 30 s) by the maintenance leader (leader_election_interval default 10 s)";

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

#[derive(Debug, Serialize, Deserialize, JobArgs)]
struct BenchJob {
    seq: u64,
    /// Epoch microseconds taken just before the insert call (latency), else 0.
    t_us: i64,
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
        let args = &ctx.job.args;
        self.tally.ran(
            args.get("seq").and_then(|v| v.as_u64()).unwrap_or(0),
            args.get("t_us").and_then(|v| v.as_i64()).unwrap_or(0),
        );
        self.tally.work().await;
        Ok(JobResult::Completed)
    }
}

struct Awa {
    pool: PgPool,
    producer: PgPool,
    store: QueueStorage,
    tally: Arc<Tally>,
    client: Option<awa::Client>,
}

async fn connect(url: &str, max: u32) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .with_context(|| format!("connecting to {url}"))
}

fn opts(run_at: Option<chrono::DateTime<chrono::Utc>>) -> InsertOpts {
    InsertOpts {
        queue: QUEUE.into(),
        run_at,
        ..InsertOpts::default()
    }
}

impl Peer for Awa {
    const SYSTEM: &'static str = "awa";
    const VERSION: &'static str = "0.6.9";

    /// awa's migrations, then the queue-storage engine installed and made
    /// the active backend, so that jobs stored before any worker starts
    /// already go to queue storage (a client started on a database that
    /// holds canonical jobs would otherwise stay on the canonical engine).
    async fn install(url: &str, tally: Arc<Tally>) -> Result<Self> {
        // awa-worker reads these from the environment when its client is
        // built; set here, before that, so the run does not depend on the
        // caller's environment.
        std::env::set_var(
            "AWA_COMPLETION_BATCH_SIZE",
            COMPLETION_BATCH_SIZE.to_string(),
        );
        std::env::set_var("AWA_COMPLETION_FLUSH_MS", COMPLETION_FLUSH_MS.to_string());
        std::env::set_var("AWA_COMPLETION_SHARDS", COMPLETION_SHARDS.to_string());
        std::env::set_var(
            "AWA_MAX_CLAIMERS_PER_QUEUE",
            MAX_CLAIMERS_PER_QUEUE.to_string(),
        );
        let pool = connect(url, POOL_SIZE).await?;
        awa::migrations::run(&pool)
            .await
            .context("running awa migrations")?;
        let store = QueueStorage::new(queue_storage_config()).context("queue storage config")?;
        store
            .install(&pool)
            .await
            .context("installing awa queue storage")?;
        let status = awa::storage::status(&pool)
            .await
            .context("reading awa storage status")?;
        peer_contract::log::<Self>(format_args!(
            "schema ready; storage state {} (active engine {})",
            status.state, status.active_engine
        ));
        Ok(Self {
            producer: connect(url, PRODUCER_POOL_SIZE).await?,
            pool,
            store,
            tally,
            client: None,
        })
    }

    fn knobs(&self) -> Value {
        let qs = queue_storage_config();
        json!({
            "storage": "queue_storage",
            "max_workers": MAX_WORKERS,
            "claimers": CLAIMERS,
            "claim_batch_size": CLAIM_BATCH_SIZE,
            "poll_interval_ms": POLL_INTERVAL.as_millis() as u64,
            "deadline_duration_s": DEADLINE.as_secs(),
            "pool_size": POOL_SIZE,
            "queue_stats_interval_s": QUEUE_STATS_INTERVAL.as_secs(),
            "runtime_snapshot_interval_s": RUNTIME_SNAPSHOT_INTERVAL.as_secs(),
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
            "bulk_insert": "QueueStorage::enqueue_params_copy",
            "latency_insert": "awa::insert_with",
            "rescue_after_s": RESCUE_AFTER.as_secs(),
            "rescue_setting": RESCUE_SETTING,
        })
    }

    async fn store(&self, jobs: Range<u64>, due: Due) -> Result<()> {
        let run_at = match due {
            Due::Now => None,
            Due::InADay => Some(chrono::Utc::now() + chrono::Duration::days(1)),
        };
        let params: Vec<InsertParams> = jobs
            .map(|seq| awa::insert::params_with(&BenchJob { seq, t_us: 0 }, opts(run_at)))
            .collect::<std::result::Result<_, _>>()
            .context("building insert params")?;
        self.store
            .enqueue_params_copy(&self.pool, &params)
            .await
            .context("bulk insert (enqueue_params_copy)")?;
        Ok(())
    }

    async fn start(&mut self) -> Result<()> {
        let client = awa::Client::builder(self.pool.clone())
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
            .queue_stats_interval(QUEUE_STATS_INTERVAL)
            .runtime_snapshot_interval(RUNTIME_SNAPSHOT_INTERVAL)
            .register_worker(NoopWorker {
                tally: self.tally.clone(),
            })
            .build()
            .map_err(|e| anyhow!("building the awa client: {e}"))?;
        client.start().await.context("starting the awa client")?;
        self.client = Some(client);
        Ok(())
    }

    async fn insert(&self, job: Job) -> Result<()> {
        awa::insert_with(
            &self.producer,
            &BenchJob {
                seq: job.seq,
                t_us: job.t_us,
            },
            opts(None),
        )
        .await
        .context("insert_with")?;
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        if let Some(client) = self.client {
            client.shutdown(Duration::from_secs(30)).await;
        }
        Ok(())
    }

    /// What the store says is runnable (the cheap count: the exact one
    /// scans the rings), read before the shutdown flushes completions.
    async fn left_runnable(&self) -> Result<Option<u64>> {
        let counts = self
            .store
            .queue_counts_fast(&self.pool, QUEUE)
            .await
            .context("reading awa's queue counts")?;
        Ok(Some(counts.available as u64))
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx::query=error")),
        )
        .init();
    peer_contract::main::<Awa>()
}
