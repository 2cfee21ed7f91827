//! `herald serve`: a worker, the HTTP API and `/metrics` in one process,
//! configured by `herald.toml`, `HERALD_…` variables and flags; graceful
//! shutdown on SIGTERM or SIGINT (a second signal cancels running handlers
//! at once); SIGHUP reads the file again and applies its `[[schedules]]`.

pub mod api;
pub mod auth;
pub mod error;
pub mod recent;
mod schedules;
pub mod telemetry;
mod ui;

#[cfg(test)]
mod api_fuzz_tests;
#[cfg(test)]
mod api_tests;

use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use herald::backend::{Schedules, Topics};
use herald::escape::escaped;
use herald::{Client, Context, Handler, MemoryQueue, Queue, Store, StoreError, Worker};
use herald_postgres::PgStore;

use crate::runners::{self, HandlerConfig};
use herald_sqlite::SqliteStore;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::config::{self, ConfigError, QueueConfig, ServeConfig, StoreLocation};

/// Options of `herald serve`. Each flag overrides the config file and the
/// environment.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// The config file [default: ./herald.toml if it exists].
    #[arg(long, env = "HERALD_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// The store: `sqlite://PATH` (or a plain path) or `postgres://…`
    /// [config: store; env: HERALD_STORE; default: sqlite://herald.db].
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The PostgreSQL schema of herald's tables
    /// [config: pg_schema; env: HERALD_PG_SCHEMA; default: herald].
    #[arg(long, value_name = "NAME")]
    schema: Option<String>,
    /// The queue: `memory`, the in-process queue; NATS JetStream at
    /// `nats://[USER:PASSWORD@]HOST:PORT` (or `tls://…`); or Google Cloud
    /// Pub/Sub at `pubsub://PROJECT/TOPIC?subscription=NAME` (the emulator
    /// when PUBSUB_EMULATOR_HOST is set)
    /// [config: queue; env: HERALD_QUEUE; default: memory].
    #[arg(long, value_name = "KIND")]
    queue: Option<String>,
    /// The HTTP API's address [config: listen; env: HERALD_LISTEN;
    /// default: 127.0.0.1:7878]. Port 0 picks a free port (printed at start).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Also run a handler of this name that does nothing and succeeds:
    /// for smoke tests of a deployment and for benchmarks. Repeatable.
    #[arg(long = "noop-handler", value_name = "NAME")]
    noop_handlers: Vec<String>,
}

/// Errors of `herald serve`.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The queue could not be reached or is misconfigured.
    #[error("queue {location}: {error}")]
    Queue {
        /// The queue's URL, without its credentials.
        location: String,
        /// What went wrong.
        error: herald::QueueError,
    },
    /// The metrics recorder could not be installed.
    #[error(transparent)]
    Telemetry(#[from] telemetry::TelemetryError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {reason}; pick another address or port with --listen")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        reason: std::io::Error,
    },
    /// The run watchdog could not be started.
    #[error("cannot start the run watchdog (herald watch-runs): {0}")]
    Watchdog(std::io::Error),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The HTTP server stopped by itself.
    #[error("the HTTP server failed: {0}")]
    Http(String),
}

/// Handlers by name, as the worker registers them.
pub type NamedHandlers = Vec<(String, Arc<dyn Handler>)>;

/// The handlers of the `[handlers.NAME]` tables, built from each table as
/// written (the kinds, webhook and command, are in the `handlers` module).
/// Every error names the table (`handlers.NAME`). Command runs are
/// reported to `watch`.
pub fn build_handlers(
    config: &ServeConfig,
    watch: &runners::RunWatch,
) -> Result<NamedHandlers, ConfigError> {
    let mut built = Vec::with_capacity(config.handlers.len());
    for (name, value) in &config.handlers {
        let handler = HandlerConfig::from_toml(name, value.clone())
            .and_then(|h| h.build(name, watch))
            .map_err(|e| match e {
                runners::ConfigError::Key { key, message } => {
                    ConfigError::invalid(config.origin(), key, message)
                }
                // Only the handlers module's tests parse whole documents.
                #[cfg(test)]
                runners::ConfigError::Toml(message) => {
                    ConfigError::invalid(config.origin(), format!("handlers.{name}"), message)
                }
            })?;
        built.push((name.clone(), handler));
    }
    Ok(built)
}

/// Runs `herald serve` until SIGTERM or SIGINT.
pub async fn run(args: ServeArgs) -> Result<(), ServeError> {
    let overrides = config::Overrides {
        config: args.config,
        store: args.store,
        pg_schema: args.schema,
        queue: args.queue,
        listen: args.listen,
    };
    let config = config::load(&overrides, &|k| std::env::var(k).ok())?;
    // Before any command runs: end what a dead server left running, then
    // make sure that this one's runs end with it, however it ends.
    let lock = runners::leftovers::start(std::env::var("XDG_RUNTIME_DIR").ok().as_deref());
    let server_id = lock.as_ref().map_or_else(
        || format!("{:016x}", rand::random::<u64>()),
        |l| l.id().to_string(),
    );
    let watch = runners::RunWatch::start(server_id).map_err(ServeError::Watchdog)?;
    let mut handlers: Vec<(String, Option<Arc<dyn Handler>>)> = build_handlers(&config, &watch)?
        .into_iter()
        .map(|(n, h)| (n, Some(h)))
        .collect();
    for name in args.noop_handlers {
        herald::client::check_name("handler", &name)
            .map_err(|e| ConfigError::invalid("--noop-handler", "handler", e.to_string()))?;
        if handlers.iter().any(|(n, _)| *n == name) {
            return Err(ConfigError::invalid(
                "--noop-handler",
                format!("handlers.{name}"),
                "is also configured; give the no-op handler another name",
            )
            .into());
        }
        handlers.push((name, None));
    }
    let names: Vec<String> = handlers.iter().map(|(n, _)| n.clone()).collect();

    let metrics = telemetry::install()?;
    let upkeep = telemetry::spawn_upkeep(metrics.clone());
    let mut signals = Signals::new().map_err(ServeError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(ServeError::Signals)?;
    let store = open_store(&config).await?;
    apply_declared(store.as_ref(), &config).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|reason| ServeError::Listen {
            addr: config.listen,
            reason,
        })?;
    let addr = listener.local_addr().map_err(|reason| ServeError::Listen {
        addr: config.listen,
        reason,
    })?;

    let queue = connect_queue(&config).await?;
    let mut worker_config = config.worker.clone();
    if !config.worker_named {
        worker_config.name = stable_name(addr);
    }
    let tracker = Arc::new(recent::Tracker::default());
    let mut builder = Worker::builder(store.clone(), queue.clone())
        .config(worker_config)
        .observer(tracker.clone());
    for (name, handler) in handlers {
        builder = match handler {
            Some(h) => builder.raw_handler(name, h),
            None => builder.handler(name, |_: serde::de::IgnoredAny, _cx: Context| async {}),
        };
    }
    let worker = builder.start();

    let tokens = auth::Tokens::new(&config.auth);
    if tokens.is_open() {
        tracing::warn!(%addr, "no API token is configured: anyone who can connect to this loopback address acts as the operator; set auth.operator_token_sha256 to require a token");
    }
    let client = Client::new(store.clone(), queue.clone())
        .max_payload(config.max_payload_bytes)
        .notify_linger(config.notify_linger)
        .notify_publishes(config.notify_publishes)
        .notify_wait(config.notify_wait)
        .emit_timeout(config.emit_timeout)
        .group_commit(config.group_commit_writes);
    apply_limits(&client, &config).await?;
    let state = Arc::new(api::AppState {
        schedules: store.clone(),
        client: client.clone(),
        tokens,
        tracker,
        metrics,
        max_batch: config.max_batch,
        max_request_bytes: config.max_request_bytes,
        handlers: names.clone(),
    });
    let app = api::router(state);
    let stop_http = CancellationToken::new();
    let mut server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(stop_http.clone().cancelled_owned())
            .into_future(),
    );
    // Tests and scripts read this line for the address (with port 0).
    println!(
        "herald serve: listening on http://{addr} (store {}, queue {}, handlers: {})",
        config.store,
        config.queue,
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    );
    tracing::info!(%addr, store = %config.store, queue = %config.queue, handlers = ?names, "herald serve started");

    let first = loop {
        tokio::select! {
            s = signals.next() => break s,
            _ = hangup.recv() => reload(store.as_ref(), &client, &overrides).await,
            r = &mut server => {
                let reason = match r {
                    Ok(Ok(())) => "it stopped".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                };
                worker.shutdown(Duration::ZERO).await;
                return Err(ServeError::Http(reason));
            }
        }
    };
    let grace = config.shutdown_grace;
    tracing::info!(signal = first, ?grace, "shutting down: no new requests; waiting for running handlers (send the signal again to cancel them now)");
    stop_http.cancel();
    let cut_short = worker.shutdown_handle();
    let shutdown = worker.shutdown(grace);
    tokio::pin!(shutdown);
    let report = tokio::select! {
        r = &mut shutdown => r,
        s = signals.next() => {
            tracing::warn!(signal = s, "second signal: cancelling running handlers now");
            cut_short.cancel_now();
            shutdown.await
        }
    };
    // Requests in progress had the grace period to finish as well.
    if tokio::time::timeout(Duration::from_secs(5), &mut server)
        .await
        .is_err()
    {
        tracing::warn!("HTTP requests still open after shutdown; closing them");
        server.abort();
    }
    queue.close().await;
    upkeep.abort();
    tracing::info!(
        in_flight = report.in_flight,
        cancelled = report.cancelled,
        "herald serve stopped"
    );
    drop(lock);
    Ok(())
}

/// Connects to the configured queue.
pub async fn connect_queue(config: &ServeConfig) -> Result<Arc<dyn Queue>, ServeError> {
    let failed = |error| ServeError::Queue {
        location: config.queue.to_string(),
        error,
    };
    Ok(match &config.queue {
        QueueConfig::Memory(limits) => {
            Arc::new(MemoryQueue::new(config.worker.lease).with_message_limits(*limits))
        }
        QueueConfig::Nats(c) => Arc::new(
            herald_nats::NatsQueue::connect(c.clone())
                .await
                .map_err(failed)?,
        ),
        QueueConfig::Pubsub(c) => Arc::new(
            herald_pubsub::PubsubQueue::connect(c.clone())
                .await
                .map_err(failed)?,
        ),
    })
}

/// `HOST@ADDRESS`: the same for a process restarted on the same machine and
/// address, so that it takes back its own reconciler row at once; different
/// for every live server (two cannot bind one address).
fn stable_name(addr: std::net::SocketAddr) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}@{addr}")
}

/// Opens the configured store, as `herald serve` does.
pub async fn open_store(config: &ServeConfig) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match &config.store {
        StoreLocation::Sqlite(path) => {
            let path = path.clone();
            let context = format!("open {}", path.display());
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(path))
                .await
                .map_err(|e| StoreError::backend(context, e))??;
            Arc::new(store.with_idempotency_window(config.idempotency_window))
        }
        StoreLocation::Postgres(url) => {
            let location = config.store.to_string();
            let options: sqlx::postgres::PgConnectOptions =
                url.parse().map_err(|e: sqlx::Error| StoreError::Open {
                    location: location.clone(),
                    reason: e.to_string(),
                })?;
            let pool = herald_postgres::pool_options()
                .max_connections(config.pg_max_connections)
                .acquire_timeout(config.pg_acquire_timeout);
            let runs = config.pg_run_commits;
            tracing::info!(
                pg_run_commits = runs.name(),
                "which run commits skip their WAL flush (emits never do; ADR 0014)"
            );
            let store = PgStore::connect_with(pool, options, &config.pg_schema).await?;
            refuse_read_only(&store, &location).await?;
            Arc::new(
                store
                    .with_run_commits(runs)
                    .with_idempotency_window(config.idempotency_window),
            )
        }
    })
}

/// Fails when the database takes no writes (a hot standby, or
/// `default_transaction_read_only`): otherwise the first write, some
/// statement of the start, fails with a message that names neither the
/// store nor the cause. Mid-run, writes fail one by one instead (503s,
/// failed claims) until the database takes writes again.
async fn refuse_read_only(store: &PgStore, location: &str) -> Result<(), StoreError> {
    let read_only: String = sqlx::query_scalar("SHOW transaction_read_only")
        .fetch_one(store.pool())
        .await
        .map_err(|e| StoreError::Open {
            location: location.to_string(),
            reason: e.to_string(),
        })?;
    if read_only == "on" {
        return Err(StoreError::Open {
            location: location.to_string(),
            reason: "the database is read-only (transaction_read_only is on: a hot standby, \
                     or default_transaction_read_only is set); herald writes to it, so point \
                     store at a writable primary"
                .to_string(),
        });
    }
    Ok(())
}

/// Writes what the configuration declares to the store, at start and on
/// SIGHUP: its `[[subscriptions]]` replace those an earlier start or
/// reload took from the file, its `[[schedules]]` likewise; the API's stay.
async fn apply_declared(store: &dyn Store, config: &ServeConfig) -> Result<(), ServeError> {
    let synced = Topics::sync_subscriptions(store, &config.subscriptions).await?;
    tracing::info!(
        declared = config.subscriptions.len(),
        added = synced.added,
        removed = synced.removed,
        "configuration's subscriptions applied"
    );
    apply_schedules(store, config).await
}

/// Writes the configuration's `[handlers.NAME.limit]` to the store,
/// replacing those an earlier start or reload took from the file, and
/// notifies the events that a raised or removed limit lets run.
async fn apply_limits(client: &Client, config: &ServeConfig) -> Result<(), ServeError> {
    client
        .sync_limits(&config.run_limits)
        .await
        .map_err(|e| match e {
            herald::ClientError::Store(e) => ServeError::Store(e),
            other => ServeError::Config(ConfigError::invalid(
                config.origin(),
                "handlers",
                other.to_string(),
            )),
        })?;
    tracing::info!(
        declared = config.run_limits.len(),
        "configuration's limits applied"
    );
    Ok(())
}

/// Writes the configuration's `[[schedules]]` to the store.
async fn apply_schedules(store: &dyn Schedules, config: &ServeConfig) -> Result<(), ServeError> {
    let applied = schedules::apply(store, &config.schedules, config.max_payload_bytes)
        .await
        .map_err(|e| match e {
            schedules::ApplyError::Store(e) => ServeError::Store(e),
            other => ServeError::Config(ConfigError::invalid(
                config.origin(),
                "schedules",
                other.to_string(),
            )),
        })?;
    tracing::info!(
        created = applied.created,
        updated = applied.updated,
        deleted = applied.deleted,
        "configuration's schedules applied"
    );
    Ok(())
}

/// SIGHUP: reads the configuration again and applies its subscriptions
/// and schedules. A configuration that is refused changes nothing (the
/// error is logged); other keys take effect on the next start.
async fn reload(store: &dyn Store, client: &Client, overrides: &config::Overrides) {
    tracing::info!(
        "SIGHUP: reading the configuration again for its subscriptions, schedules and limits"
    );
    match config::load(overrides, &|k| std::env::var(k).ok()) {
        Ok(config) => {
            if let Err(e) = apply_declared(store, &config).await {
                tracing::error!(error = %escaped(&e), "the configuration's subscriptions and schedules could not be applied");
            }
            if let Err(e) = apply_limits(client, &config).await {
                tracing::error!(error = %escaped(&e), "the configuration's limits could not be applied");
            }
        }
        Err(e) => {
            tracing::error!(error = %escaped(&e), "the configuration is refused; subscriptions and schedules stay as they were");
        }
    }
}

/// SIGTERM and SIGINT.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
