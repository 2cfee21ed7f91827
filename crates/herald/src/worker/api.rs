//! The worker's public API: build, start, observe and stop a worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::settle::Ended;
use super::telemetry::Instruments;
use super::{admission, heartbeat, reconcile, schedule, settle, WorkerState};
use super::{RunSettled, StatsSnapshot, WorkerConfig, WorkerConfigError, WorkerStats};
use crate::backend::Store;
use crate::handler::{FnHandler, Handler, IntoOutcome, JobHandler};
use crate::queue::Queue;
use crate::retry::RetryPolicy;
use crate::{Context, Job};

/// Told about every run of a worker as it starts and as its end is written,
/// for statistics kept in the application (the `herald serve` stats
/// endpoint). Calls come from the worker's tasks: keep them short and
/// never block.
pub trait RunObserver: Send + Sync + 'static {
    /// A run of `handler` started, `waited` after the event's `run_at`
    /// (the emit-to-start latency; after a retry, the lateness against the
    /// backoff's due time).
    fn started(&self, handler: &str, waited: Duration) {
        let _ = (handler, waited);
    }

    /// A run of `handler` ended and the store accepted what it wrote.
    fn settled(&self, handler: &str, how: RunSettled) {
        let _ = (handler, how);
    }
}

/// Builds a [`Worker`]: register handlers, tune, then [`WorkerBuilder::start`].
///
/// ```no_run
/// # async fn demo(store: std::sync::Arc<dyn herald::Store>, queue: std::sync::Arc<dyn herald::Queue>) {
/// use std::time::Duration;
/// use herald::{Context, HandlerError, Worker};
///
/// let worker = Worker::builder(store, queue)
///     .handler("resize_image", |path: String, _cx: Context| async move {
///         if path.is_empty() {
///             return Err(HandlerError::fail("empty path"));
///         }
///         Ok(())
///     })
///     .concurrency(16)
///     .start();
/// // ...
/// worker.shutdown(Duration::from_secs(10)).await;
/// # }
/// ```
pub struct WorkerBuilder {
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    handlers: HashMap<String, Arc<dyn Handler>>,
    config: WorkerConfig,
    observer: Option<Arc<dyn RunObserver>>,
}

impl WorkerBuilder {
    /// Registers a typed job.
    pub fn job<J: Job>(mut self) -> Self {
        self.handlers
            .insert(J::NAME.to_string(), Arc::new(JobHandler::<J>::new()));
        self
    }

    /// Registers an async function for events of handler `name` whose payload
    /// deserializes to `T` (use `serde_json::Value` for any JSON).
    pub fn handler<T, F, Fut, O>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(T, Context) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = O> + Send + 'static,
        T: DeserializeOwned + Send + 'static,
        O: IntoOutcome + 'static,
    {
        self.handlers
            .insert(name.into(), Arc::new(FnHandler::new(f)));
        self
    }

    /// Tells `observer` about every run's start and end (see [`RunObserver`]).
    pub fn observer(mut self, observer: Arc<dyn RunObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Registers a name-erased [`Handler`].
    pub fn raw_handler(mut self, name: impl Into<String>, handler: Arc<dyn Handler>) -> Self {
        self.handlers.insert(name.into(), handler);
        self
    }

    /// Most handlers running at once, at least 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n;
        self
    }

    /// Most events claimed ahead of free handler slots (see
    /// [`WorkerConfig::claim_ahead`]); 0 claims only for free slots.
    pub fn claim_ahead(mut self, n: usize) -> Self {
        self.config.claim_ahead = Some(n);
        self
    }

    /// How long a claim lasts without renewal, at least [`MIN_LEASE`](super::MIN_LEASE).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Backoff between failed attempts.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.config.policy.retry = retry;
        self
    }

    /// Replaces the whole configuration (handlers stay).
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Edits the configuration in place.
    pub fn configure(mut self, f: impl FnOnce(&mut WorkerConfig)) -> Self {
        f(&mut self.config);
        self
    }

    /// Starts the worker's tasks on the current tokio runtime. Its metric
    /// handles are registered now: install a `metrics` recorder before.
    ///
    /// # Panics
    ///
    /// If the configuration is one a worker cannot run with (see
    /// [`WorkerConfig::validate`]); [`WorkerBuilder::try_start`] returns the
    /// error instead.
    pub fn start(self) -> Worker {
        self.try_start()
            .unwrap_or_else(|e| panic!("cannot start a worker: {e}"))
    }

    /// Starts the worker as [`WorkerBuilder::start`] does, or says which
    /// configuration value it cannot run with.
    pub fn try_start(self) -> Result<Worker, WorkerConfigError> {
        self.config.validate()?;
        let mut config = self.config;
        config.policy.max_queue_delay =
            match (config.policy.max_queue_delay, self.queue.max_delay()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        config.policy.keep_done = config.done_retention.is_some();
        let mut names: Vec<String> = self.handlers.keys().cloned().collect();
        names.sort();
        let instruments = names
            .iter()
            .map(|n| (n.clone(), Arc::new(Instruments::new(n))))
            .collect();
        let (settle_tx, settle_rx) = mpsc::unbounded_channel();
        let store = self.store;
        let shared = Arc::new(WorkerState {
            events: store.clone(),
            election: store.clone(),
            reconciliation: store.clone(),
            schedules: store,
            queue: self.queue,
            handlers: self.handlers,
            handler_names: names,
            instruments,
            observer: self.observer,
            claims: Arc::new(Semaphore::new(
                config
                    .concurrency
                    .saturating_add(config.claim_ahead())
                    .min(Semaphore::MAX_PERMITS),
            )),
            slots: Arc::new(Semaphore::new(
                config.concurrency.min(Semaphore::MAX_PERMITS),
            )),
            runs: Mutex::new(HashMap::new()),
            stats: WorkerStats::default(),
            stop_receiving: CancellationToken::new(),
            cancel_runs: CancellationToken::new(),
            stop_background: CancellationToken::new(),
            tasks: TaskTracker::new(),
            config,
        });
        let receive = tokio::spawn(admission::receive_loop(shared.clone(), settle_tx.clone()));
        let settle = tokio::spawn(settle::settle_loop(shared.clone(), settle_rx));
        let heartbeat = tokio::spawn(heartbeat::heartbeat_loop(shared.clone()));
        let reconcile = shared
            .config
            .reconcile
            .then(|| tokio::spawn(reconcile::reconcile_loop(shared.clone())));
        let scheduler = shared
            .config
            .schedules
            .then(|| tokio::spawn(schedule::schedule_loop(shared.clone())));
        tracing::info!(worker = %shared.config.name, handlers = ?shared.handler_names, "worker started");
        Ok(Worker {
            shared,
            receive,
            settle,
            heartbeat,
            reconcile,
            scheduler,
            settle_tx,
        })
    }
}

/// A running worker. Stop it with [`Worker::shutdown`].
pub struct Worker {
    shared: Arc<WorkerState>,
    receive: JoinHandle<()>,
    settle: JoinHandle<()>,
    heartbeat: JoinHandle<()>,
    reconcile: Option<JoinHandle<()>>,
    scheduler: Option<JoinHandle<()>>,
    settle_tx: mpsc::UnboundedSender<Ended>,
}

/// What [`Worker::shutdown`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Runs in flight when shutdown began (events claimed ahead and
    /// waiting for a handler slot count).
    pub in_flight: usize,
    /// Runs cancelled after the grace period (or by a second signal) and
    /// released: snoozed for 0, attempt given back.
    pub cancelled: usize,
}

/// Cancels a shutdown's grace period from elsewhere: the "second signal".
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    stop_receiving: CancellationToken,
    cancel_runs: CancellationToken,
}

impl ShutdownHandle {
    /// Stops receiving and cancels every running handler now, without
    /// waiting for a grace period. [`Worker::shutdown`] still has to be
    /// called (or be running) to settle the cancelled runs and stop.
    pub fn cancel_now(&self) {
        self.stop_receiving.cancel();
        self.cancel_runs.cancel();
    }
}

impl Worker {
    /// Starts building a worker on a store and a queue.
    pub fn builder(store: Arc<dyn Store>, queue: Arc<dyn Queue>) -> WorkerBuilder {
        WorkerBuilder {
            store,
            queue,
            handlers: HashMap::new(),
            config: WorkerConfig::default(),
            observer: None,
        }
    }

    /// Counters of what this worker did so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// Runs in flight now: events this worker holds claimed, running or
    /// claimed ahead and waiting for a handler slot, until they are settled.
    pub fn in_flight(&self) -> usize {
        self.shared.runs.lock().expect("runs lock").len()
    }

    /// This worker's configuration (after defaults were applied).
    pub fn config(&self) -> &WorkerConfig {
        &self.shared.config
    }

    /// A handle that cuts the grace period of a shutdown short.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            stop_receiving: self.shared.stop_receiving.clone(),
            cancel_runs: self.shared.cancel_runs.clone(),
        }
    }

    /// Stops the worker: stop receiving; wait up to `grace` for running
    /// handlers; cancel the rest (each is released as a snooze of 0 with its
    /// attempt given back, and its notification nacked without delay, so
    /// another worker takes it at once); settle everything; then return.
    pub async fn shutdown(self, grace: Duration) -> ShutdownReport {
        let shared = self.shared;
        shared.stop_receiving.cancel();
        let _ = self.receive.await;
        tracing::debug!(worker = %shared.config.name, "shutdown: receiving stopped");
        let in_flight = shared.runs.lock().expect("runs lock").len();
        shared.tasks.close();
        let cancelled_before = shared.stats.snapshot().cancelled;
        tokio::select! {
            _ = shared.tasks.wait() => {}
            _ = tokio::time::sleep(grace) => {
                tracing::info!("grace period over: cancelling running handlers");
            }
            _ = shared.cancel_runs.cancelled() => {
                tracing::info!("cancelling running handlers at once");
            }
        }
        shared.cancel_runs.cancel();
        shared.tasks.wait().await;
        tracing::debug!(worker = %shared.config.name, "shutdown: every run has ended");
        // Every run has handed its end to the settler: let it drain and stop.
        drop(self.settle_tx);
        let _ = self.settle.await;
        tracing::debug!(worker = %shared.config.name, "shutdown: every run is settled");
        shared.stop_background.cancel();
        let _ = self.heartbeat.await;
        tracing::debug!(worker = %shared.config.name, "shutdown: heartbeat stopped");
        if let Some(r) = self.reconcile {
            let _ = r.await;
            tracing::debug!(worker = %shared.config.name, "shutdown: reconciler stopped");
        }
        if let Some(s) = self.scheduler {
            let _ = s.await;
            tracing::debug!(worker = %shared.config.name, "shutdown: scheduler stopped");
        }
        let cancelled = (shared.stats.snapshot().cancelled - cancelled_before) as usize;
        tracing::info!(worker = %shared.config.name, in_flight, cancelled, "worker stopped");
        ShutdownReport {
            in_flight,
            cancelled,
        }
    }
}
