//! What a benchmark runs on: a fresh store and an empty queue, opened the
//! way `herald serve` opens them, and the worker settings it would use.

use std::sync::Arc;
use std::time::Duration;

use herald::{Client, Context, Queue, Store, Worker};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use sqlx::{Connection, Executor};

use super::{BenchError, Report, Target};
use herald_server::config::{self, QueueConfig, ServeConfig, StoreLocation};
use herald_server::serve::{connect_queue, open_store};

/// The stream (and subject prefix) of a benchmark on NATS: not `herald`,
/// whose messages belong to a real fleet.
const NATS_STREAM: &str = "herald_bench";

/// The no-op handler every scenario runs.
pub(super) const HANDLER: &str = "noop";

/// Whether a run starts from nothing or joins what another process of the
/// same run left (the rescue's rescuer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fresh {
    /// Drop the scratch schema and purge the NATS stream first.
    Empty,
    /// Keep both: the events and notifications are the run's subject.
    Keep,
}

/// A store and queue that belong to one benchmark run.
pub(super) struct Bench {
    pub(super) store: Arc<dyn Store>,
    pub(super) queue: Arc<dyn Queue>,
    pub(super) client: Client,
    pub(super) config: ServeConfig,
    pub(super) hook: super::hook::Hook,
    target: Target,
    // Holds the SQLite file until the end.
    _dir: Option<tempfile::TempDir>,
}

impl Bench {
    /// Opens the store and queue for `target`: fresh and empty, or as
    /// another process of the run left them.
    pub(super) async fn open(target: &Target, fresh: Fresh) -> Result<Bench, BenchError> {
        let postgres =
            target.url.starts_with("postgres://") || target.url.starts_with("postgresql://");
        let mut dir = None;
        let store = if postgres {
            if target.schema == "herald" {
                return Err(BenchError::Usage(
                    "the benchmark drops its schema before and after the run: give it one \
                     of its own with --schema (not `herald`, serve's default)"
                        .into(),
                ));
            }
            target.url.clone()
        } else if target.url == "sqlite" {
            let d = tempfile::Builder::new()
                .prefix("herald-bench.")
                .tempdir_in(&target.dir)
                .map_err(|e| BenchError::Write {
                    path: target.dir.clone(),
                    reason: e.to_string(),
                })?;
            let path = d.path().join("bench.db").display().to_string();
            dir = Some(d);
            format!("sqlite://{path}")
        } else {
            return Err(BenchError::Usage(format!(
                "--url {:?}: write a postgres:// URL or `sqlite` (a fresh file)",
                target.url
            )));
        };
        let overrides = config::Overrides {
            config: target.config.clone(),
            store: Some(store),
            pg_schema: Some(target.schema.clone()),
            queue: Some(target.queue.clone()),
            listen: None,
        };
        let mut config = config::load(&overrides, &|k| std::env::var(k).ok())?;
        if let QueueConfig::Nats(c) = &mut config.queue {
            c.stream = NATS_STREAM.into();
            c.subject = format!("{NATS_STREAM}.notify");
            c.consumer = format!("{NATS_STREAM}_workers");
        }
        if let StoreLocation::Postgres(url) = &config.store {
            if fresh == Fresh::Empty {
                drop_schema(url, &target.schema).await?;
            }
            herald_postgres::migrate(url, &target.schema).await?;
        }
        let store = open_store(&config).await?;
        if fresh == Fresh::Empty {
            // Before the run's own connection pulls anything.
            purge_nats(&config).await?;
        }
        let queue = connect_queue(&config).await?;
        let client = Client::new(store.clone(), queue.clone())
            .max_payload(config.max_payload_bytes)
            .notify_linger(config.notify_linger)
            .notify_publishes(config.notify_publishes)
            .notify_wait(config.notify_wait)
            .emit_timeout(config.emit_timeout)
            .group_commit(config.group_commit_writes);
        Ok(Bench {
            store,
            queue,
            client,
            config,
            hook: super::hook::Hook(target.hook.clone()),
            target: target.clone(),
            _dir: dir,
        })
    }

    /// A worker with the configured settings and one handler, `f`, named
    /// [`HANDLER`].
    pub(super) fn worker<T, F, Fut>(&self, f: F) -> Worker
    where
        T: DeserializeOwned + Send + 'static,
        F: Fn(T, Context) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Worker::builder(self.store.clone(), self.queue.clone())
            .config(self.config.worker.clone())
            .handler(HANDLER, f)
            .start()
    }

    /// The events the store holds, in every state.
    pub(super) async fn stored(&self) -> Result<u64, BenchError> {
        let rows = self
            .client
            .handler_counts(&herald::CountsQuery::totals())
            .await?;
        Ok(rows.iter().map(|c| c.total()).sum())
    }

    /// A report for `scenario` with the target and the settings that
    /// shape every scenario.
    pub(super) fn report(&self, scenario: &str) -> Report {
        let w = &self.config.worker;
        let mut knobs = Map::new();
        let mut set = |k: &str, v: Value| {
            knobs.insert(k.to_string(), v);
        };
        set("concurrency", json!(w.concurrency));
        set("batch", json!(w.batch));
        set("claim_ahead", json!(w.claim_ahead.unwrap_or(w.concurrency)));
        set("lease_ms", json!(w.lease.as_millis() as u64));
        set("reconcile", json!(w.reconcile));
        set("sweep_every_ms", json!(w.sweep_every.as_millis() as u64));
        set(
            "group_commit_writes",
            json!(self.config.group_commit_writes),
        );
        set("notify_publishes", json!(self.config.notify_publishes));
        set(
            "notify_linger_ms",
            json!(self.config.notify_linger.as_secs_f64() * 1000.0),
        );
        if let StoreLocation::Postgres(_) = self.config.store {
            set("pg_max_connections", json!(self.config.pg_max_connections));
            set("pg_run_commits", json!(self.config.pg_run_commits.name()));
        }
        if let QueueConfig::Pubsub(c) = &self.config.queue {
            set("pubsub_pull", json!(c.pull.name()));
        }
        Report {
            system: "herald".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            scenario: scenario.into(),
            store: match self.config.store {
                StoreLocation::Sqlite(_) => "sqlite".into(),
                StoreLocation::Postgres(_) => "postgres".into(),
            },
            queue: match self.config.queue {
                QueueConfig::Memory(_) => "memory".into(),
                QueueConfig::Nats(_) => "nats".into(),
                QueueConfig::Pubsub(_) => "pubsub".into(),
            },
            knobs,
            out: self.target.out.clone(),
            ..Report::default()
        }
    }

    /// Stops the worker's queue and drops the scratch schema (unless
    /// `--keep`).
    pub(super) async fn close(self) -> Result<(), BenchError> {
        self.queue.close().await;
        if let StoreLocation::Postgres(url) = &self.config.store {
            if !self.target.keep {
                drop_schema(url, &self.target.schema).await?;
            }
        }
        Ok(())
    }
}

/// Drops a PostgreSQL schema and everything in it.
async fn drop_schema(url: &str, schema: &str) -> Result<(), BenchError> {
    let failed = |context: &str| {
        let context = format!("{context} (schema {schema:?})");
        move |source| BenchError::Postgres { context, source }
    };
    let mut c = sqlx::PgConnection::connect(url)
        .await
        .map_err(failed("connect"))?;
    let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
    c.execute(format!("DROP SCHEMA IF EXISTS {quoted} CASCADE").as_str())
        .await
        .map_err(failed("drop the scratch schema"))?;
    Ok(())
}

/// Empties the benchmark's NATS stream: what an earlier run left there
/// would be delivered to this one.
async fn purge_nats(config: &ServeConfig) -> Result<(), BenchError> {
    let QueueConfig::Nats(c) = &config.queue else {
        return Ok(());
    };
    let failed =
        |e: String| BenchError::Failed(format!("purge the NATS stream {NATS_STREAM}: {e}"));
    let queue = herald_nats::NatsQueue::connect(c.clone())
        .await
        .map_err(|e| failed(e.to_string()))?;
    let stream = queue
        .jetstream()
        .get_stream(NATS_STREAM)
        .await
        .map_err(|e| failed(e.to_string()))?;
    stream.purge().await.map_err(|e| failed(e.to_string()))?;
    queue.close().await;
    // Let the purge reach the consumer before the run's first publish.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}
