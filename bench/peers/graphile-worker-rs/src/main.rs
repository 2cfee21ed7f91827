//! herald benchmark peer: the `graphile_worker` crate (Rust port of
//! graphile-worker) with its local queue on. The contract (flags,
//! scenarios, hooks) is `peer-contract`'s.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, RefetchDelayConfig, TaskHandler, Worker,
    WorkerContext, WorkerOptions, WorkerStart, WorkerUtils,
};
use peer_contract::{anyhow, bail, json, Due, Job, Peer, Result, Tally, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

// Throughput knobs, every one set explicitly. Values from the crate's own
// benchmark, `benches/perf_test.rs` ("Settings matching Node.js benchmark")
// and `benches/common/mod.rs` (its pool); README.md beside this file quotes
// them and the guide's smaller "Throughput-oriented worker".
const SCHEMA: &str = "graphile_worker";
const CONCURRENCY: usize = 96;
const POLL_INTERVAL: Duration = Duration::from_millis(100);
const USE_NOTIFICATION_DELIVERY: bool = true;
const COMPLETE_JOB_BATCH_DELAY: Duration = Duration::from_millis(5);
const FAIL_JOB_BATCH_DELAY: Duration = Duration::from_millis(5);
const LOCAL_QUEUE_SIZE: usize = 500;
const LOCAL_QUEUE_REFETCH_DELAY: Duration = Duration::from_millis(10);
const LOCAL_QUEUE_TTL: Duration = Duration::from_secs(60);
const LOCAL_QUEUE_COUNT: usize = 1;
const MAX_PG_CONN: u32 = 100;
/// Rescue, left at the crate's default: off. `WorkerRecoveryConfig`
/// (graphile_worker_recovery 0.1.6 `src/config.rs`) defaults to
/// `enabled: false` ("Recovery is opt-in", docs/src/guides/recovery.md);
/// jobs are claimed only while `is_available` (`locked_at IS NULL`), and
/// unlike graphile-worker in Node the crate runs no periodic 4-hour
/// `resetLockedAt`, so a dead worker's jobs stay locked.
const RESCUE_SETTING: &str = "none by default: graphile_worker WorkerRecoveryConfig enabled=false (opt-in heartbeat sweep); no 4-hour stale-lock reset in the crate";

/// The no-op job. `t_us` is the epoch time in microseconds taken just before
/// the insert call (latency), 0 otherwise.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct BenchJob {
    seq: u64,
    t_us: i64,
}

/// Handed to every handler through the worker context.
#[derive(Clone, Debug)]
struct State(Arc<Tally>);

impl TaskHandler for BenchJob {
    const IDENTIFIER: &'static str = "bench_noop";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        if let Some(state) = ctx.get_ext::<State>() {
            state.0.ran(self.seq, self.t_us);
            state.0.work().await;
        }
        Ok::<(), String>(())
    }
}

struct GraphileWorker {
    worker: Arc<Worker>,
    utils: WorkerUtils,
    started: Arc<Notify>,
    tally: Arc<Tally>,
    run: Option<tokio::task::JoinHandle<()>>,
}

impl Peer for GraphileWorker {
    const SYSTEM: &'static str = "graphile-worker-rs";
    const VERSION: &'static str = "0.14.1";

    /// Connects and runs the crate's migrations (`init`); the worker is not
    /// running yet.
    async fn install(url: &str, tally: Arc<Tally>) -> Result<Self> {
        let started = Arc::new(Notify::new());
        let on_start = started.clone();
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
                    .with_refetch_delay(
                        RefetchDelayConfig::default().with_duration(LOCAL_QUEUE_REFETCH_DELAY),
                    )
                    .with_queue_count(LOCAL_QUEUE_COUNT),
            )
            .add_extension(State(tally.clone()))
            .on(WorkerStart, move |_ctx| {
                let started = on_start.clone();
                async move { started.notify_one() }
            })
            .define_job::<BenchJob>()
            .init()
            .await
            .map_err(|e| anyhow!("worker init (connect + migrations) failed: {e}"))?;
        let worker = Arc::new(worker);
        Ok(Self {
            utils: worker.create_utils(),
            worker,
            started,
            tally,
            run: None,
        })
    }

    fn knobs(&self) -> Value {
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
            "local_queue_refetch_delay_ms": LOCAL_QUEUE_REFETCH_DELAY.as_millis() as u64,
            "max_pg_conn": MAX_PG_CONN,
            "bulk_insert": "WorkerUtils::add_jobs",
            "latency_insert": "WorkerUtils::add_job",
            "rescue_after_s": null,
            "rescue_setting": RESCUE_SETTING,
        })
    }

    async fn store(&self, jobs: Range<u64>, due: Due) -> Result<()> {
        let spec = JobSpec {
            run_at: match due {
                Due::Now => None,
                Due::InADay => Some(chrono::Utc::now() + chrono::Duration::days(1)),
            },
            ..JobSpec::default()
        };
        let jobs: Vec<(BenchJob, &JobSpec)> =
            jobs.map(|seq| (BenchJob { seq, t_us: 0 }, &spec)).collect();
        self.utils
            .add_jobs::<BenchJob>(&jobs)
            .await
            .map_err(|e| anyhow!("add_jobs failed: {e}"))?;
        Ok(())
    }

    async fn start(&mut self) -> Result<()> {
        let worker = self.worker.clone();
        self.run = Some(self.tally.watch("worker", async move {
            worker.run().await.map_err(|e| anyhow!("{e}"))
        }));
        tokio::select! {
            _ = self.started.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(60)) => bail!("worker did not start within 60 s"),
        }
        Ok(())
    }

    async fn insert(&self, job: Job) -> Result<()> {
        self.utils
            .add_job(
                BenchJob {
                    seq: job.seq,
                    t_us: job.t_us,
                },
                JobSpec::default(),
            )
            .await
            .map_err(|e| anyhow!("add_job failed: {e}"))?;
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        self.worker.request_shutdown();
        if let Some(run) = self.run {
            tokio::time::timeout(Duration::from_secs(60), run)
                .await
                .map_err(|_| anyhow!("worker did not shut down within 60 s"))??;
        }
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    peer_contract::main::<GraphileWorker>()
}
