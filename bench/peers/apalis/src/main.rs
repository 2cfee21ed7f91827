//! herald benchmark peer: apalis 1.0.0 with apalis-postgres 1.0.0. The
//! contract (flags, scenarios, hooks) is `peer-contract`'s.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use peer_contract::{anyhow, bail, json, Context as _, Due, Job, Peer, Result, Tally, Value};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use tokio::sync::Notify;

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
/// `Config::heartbeat_interval` and `Config::missed_heartbeats`, at
/// `Config::default()`'s 30 s and 10 (apalis-postgres 1.0.0 `src/config.rs`;
/// its doc comment says 2, which is only the serde default). They decide the
/// rescue: `Config::orphaned_duration()` = interval × missed = 300 s after a
/// worker's last heartbeat, its `Running`/`Queued` tasks go back to
/// `Pending` (`reenqueue_orphaned`, run by every live worker at its
/// registration and at each of its heartbeats).
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
const MISSED_HEARTBEATS: usize = 10;
/// Fallback poll beside LISTEN/NOTIFY (`with_pubsub`).
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// In-flight limit (`WorkerBuilderExt::concurrency`), one fetched batch.
const CONCURRENCY: usize = 100;
/// Workers (WorkerBuilder instances) on the queue, each with its own fetch loop.
const WORKERS: usize = 1;
const POOL_MAX_CONNECTIONS: u32 = 50;

/// The no-op job. `t_us` is the epoch time in microseconds taken just before
/// the insert call (latency), 0 otherwise.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct BenchJob {
    seq: u64,
    t_us: i64,
}

/// Handed to every handler as `Data<State>`.
#[derive(Clone, Debug)]
struct State(Arc<Tally>);

/// The handler: reports the run, does the contract's work, returns.
async fn bench_noop(job: BenchJob, state: Data<State>) -> Result<(), BoxDynError> {
    let State(tally) = &*state;
    tally.ran(job.seq, job.t_us);
    tally.work().await;
    Ok(())
}

struct Apalis {
    storage: PostgresStorage<BenchJob>,
    tally: Arc<Tally>,
    contexts: Vec<WorkerContext>,
    runs: Vec<tokio::task::JoinHandle<()>>,
}

impl Peer for Apalis {
    const SYSTEM: &'static str = "apalis";
    const VERSION: &'static str = "1.0.0";

    /// Connects and runs apalis-postgres's migrations (`PostgresStorage::setup`).
    async fn install(url: &str, tally: Arc<Tally>) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(POOL_MAX_CONNECTIONS)
            .connect(url)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        PostgresStorage::setup(&pool)
            .await
            .context("migrations (PostgresStorage::setup)")?;
        let config = Config::default()
            .queue(QUEUE)
            .batch_size(BATCH_SIZE)
            .lock_tasks(LOCK_TASKS)
            .persist_results(PERSIST_RESULTS)
            .heartbeat_interval(HEARTBEAT_INTERVAL)
            .missed_heartbeats(MISSED_HEARTBEATS);
        Ok(Self {
            storage: PostgresStorage::new(&pool).with_config(config),
            tally,
            contexts: Vec::new(),
            runs: Vec::new(),
        })
    }

    fn knobs(&self) -> Value {
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
            "bulk_insert": "TaskSink::push_all",
            "latency_insert": "TaskSink::push",
            "rescue_after_s": (HEARTBEAT_INTERVAL * MISSED_HEARTBEATS as u32).as_secs(),
            "rescue_setting": "apalis-postgres Config::orphaned_duration = heartbeat_interval 30 s x missed_heartbeats 10 (defaults), re-enqueued at a live worker's next heartbeat (every 30 s)",
        })
    }

    async fn store(&self, jobs: Range<u64>, due: Due) -> Result<()> {
        let tasks: Vec<Task<BenchJob>> = jobs
            .map(|seq| {
                let task = TaskBuilder::new(BenchJob { seq, t_us: 0 });
                match due {
                    Due::Now => task.build(),
                    Due::InADay => task.run_after(Duration::from_secs(24 * 3600)).build(),
                }
            })
            .collect();
        let mut sink = self.storage.clone();
        sink.push_all(futures::stream::iter(tasks))
            .await
            .map_err(|e| anyhow!("push_all failed: {e}"))?;
        Ok(())
    }

    async fn start(&mut self) -> Result<()> {
        let started = Arc::new(Notify::new());
        for i in 0..WORKERS {
            let ctx = WorkerContext::new(&format!("peer-apalis-{}-{i}", std::process::id()));
            let backend = self
                .storage
                .clone()
                .with_pubsub()
                .poll_with_interval(POLL_INTERVAL);
            let on_start = started.clone();
            let (state, worker_ctx) = (State(self.tally.clone()), ctx.clone());
            // The worker's future cannot be proven `Send` for `tokio::spawn`
            // (a higher-ranked lifetime in apalis' executor bound), so it
            // runs on a runtime of its own, on its own thread: `block_on`
            // needs no `Send`. Its handlers still run on that runtime's
            // threads (`parallelize`).
            self.runs.push(self.tally.watch("worker", async move {
                tokio::task::spawn_blocking(move || {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .enable_all()
                        .build()?;
                    let worker = WorkerBuilder::new(&worker_ctx)
                        .backend(backend)
                        .data(state)
                        .concurrency(CONCURRENCY)
                        .parallelize(tokio::spawn)
                        .on_event(move |_ctx: &WorkerContext, ev: &Event| {
                            if matches!(ev, Event::Start) {
                                on_start.notify_one();
                            }
                        })
                        .build(bench_noop);
                    runtime.block_on(worker.run()).map_err(|e| anyhow!("{e}"))
                })
                .await?
            }));
            self.contexts.push(ctx);
        }
        for _ in 0..WORKERS {
            tokio::select! {
                _ = started.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(60)) => bail!("worker did not start within 60 s"),
            }
        }
        Ok(())
    }

    async fn insert(&self, job: Job) -> Result<()> {
        let mut sink = self.storage.clone();
        sink.push(BenchJob {
            seq: job.seq,
            t_us: job.t_us,
        })
        .await
        .map_err(|e| anyhow!("push failed: {e}"))?;
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        for ctx in &self.contexts {
            ctx.stop()
                .map_err(|e| anyhow!("cannot stop a worker: {e}"))?;
        }
        for run in self.runs {
            tokio::time::timeout(Duration::from_secs(60), run)
                .await
                .map_err(|_| anyhow!("worker did not shut down within 60 s"))??;
        }
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    peer_contract::main::<Apalis>()
}
