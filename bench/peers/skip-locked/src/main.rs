//! herald benchmark peer: the plain `FOR UPDATE SKIP LOCKED` baseline.
//!
//! One table, `jobs(id, run_at, payload)`; claim loops delete a batch of due
//! rows (`DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)
//! RETURNING`), run the no-op handler on each and are done: the claim is the
//! completion, there is no lease, heartbeat or retry. A loop whose claim
//! returns nothing sleeps the poll interval (polling only, no LISTEN/NOTIFY).
//! A job whose process dies is gone with it: nothing rescues it.
//! The contract (flags, scenarios, hooks) is `peer-contract`'s.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use peer_contract::{json, Context as _, Due, Job, Peer, Result, Tally, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

// The knobs (README.md says why each value).
/// Concurrent claim loops.
const WORKERS: usize = 4;
/// Rows claimed (deleted) per claim statement.
const BATCH_SIZE: i64 = 500;
/// Connections in the workers' pool: one per claim loop.
const POOL_SIZE: u32 = 4;
/// Sleep after a claim that returned nothing.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Producer pool: one connection per in-flight insert call.
const PRODUCER_POOL_SIZE: u32 = 32;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS jobs (
    id bigserial PRIMARY KEY,
    run_at timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_run_at_idx ON jobs (run_at);
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
RETURNING payload
"#;

struct SkipLocked {
    workers: PgPool,
    producer: PgPool,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

async fn connect(url: &str, max: u32) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .with_context(|| format!("connecting to {url}"))
}

fn payload(job: Job) -> Value {
    json!({ "seq": job.seq, "t_us": job.t_us })
}

impl Peer for SkipLocked {
    const SYSTEM: &'static str = "skip-locked";
    const VERSION: &'static str = "sqlx 0.8.6";

    async fn install(url: &str, tally: Arc<Tally>) -> Result<Self> {
        let workers = connect(url, POOL_SIZE).await?;
        sqlx::raw_sql(SCHEMA)
            .execute(&workers)
            .await
            .context("creating the jobs table")?;
        Ok(Self {
            producer: connect(url, PRODUCER_POOL_SIZE).await?,
            workers,
            tally,
            stop: Arc::default(),
            loops: Vec::new(),
        })
    }

    fn knobs(&self) -> Value {
        json!({
            "workers": WORKERS,
            "batch_size": BATCH_SIZE,
            "pool_size": POOL_SIZE,
            "poll_interval_ms": POLL_INTERVAL.as_millis() as u64,
            "wakeup": "poll",
            "producer_pool_size": PRODUCER_POOL_SIZE,
            "bulk_insert": "INSERT ... SELECT FROM unnest($1::jsonb[])",
            "rescue_after_s": null,
            "rescue_setting": "none: claim deletes the row",
        })
    }

    async fn store(&self, jobs: Range<u64>, due: Due) -> Result<()> {
        let run_at = match due {
            Due::Now => "now()",
            Due::InADay => "now() + interval '1 day'",
        };
        let payloads: Vec<Value> = jobs.map(|seq| payload(Job { seq, t_us: 0 })).collect();
        sqlx::query(&format!(
            "INSERT INTO jobs (run_at, payload) SELECT {run_at}, p FROM unnest($1::jsonb[]) AS p"
        ))
        .bind(&payloads)
        .execute(&self.workers)
        .await
        .context("bulk insert")?;
        Ok(())
    }

    async fn start(&mut self) -> Result<()> {
        for _ in 0..WORKERS {
            let (pool, tally, stop) = (self.workers.clone(), self.tally.clone(), self.stop.clone());
            self.loops.push(self.tally.watch("claim loop", async move {
                while !stop.load(Ordering::SeqCst) {
                    let rows: Vec<(Value,)> = sqlx::query_as(CLAIM)
                        .bind(BATCH_SIZE)
                        .fetch_all(&pool)
                        .await
                        .context("claim")?;
                    if rows.is_empty() {
                        tokio::time::sleep(POLL_INTERVAL).await;
                    }
                    for (payload,) in &rows {
                        tally.ran(
                            payload["seq"].as_u64().unwrap_or(0),
                            payload["t_us"].as_i64().unwrap_or(0),
                        );
                        tally.work().await;
                    }
                }
                Ok(())
            }));
        }
        Ok(())
    }

    async fn insert(&self, job: Job) -> Result<()> {
        sqlx::query("INSERT INTO jobs (payload) VALUES ($1)")
            .bind(payload(job))
            .execute(&self.producer)
            .await
            .context("insert")?;
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        for l in self.loops {
            l.await.context("claim loop")?;
        }
        Ok(())
    }

    async fn left_runnable(&self) -> Result<Option<u64>> {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM jobs WHERE run_at <= now()")
            .fetch_one(&self.workers)
            .await
            .context("counting what is left")?;
        Ok(Some(n as u64))
    }
}

fn main() -> std::process::ExitCode {
    peer_contract::main::<SkipLocked>()
}
