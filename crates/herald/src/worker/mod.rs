//! The worker runtime: the imperative shell around [`crate::decision`].
//!
//! Tasks of one worker:
//! - `receive` takes notifications in batches, claims them in one store
//!   call, and answers the ones it could not claim (`admission.rs`);
//! - one task per claimed event runs its handler (`run.rs`);
//! - `settle` group-commits the ends of runs and answers their
//!   notifications (`settle.rs`);
//! - `heartbeat` renews every lease in one call every `lease / 3` and
//!   cancels runs whose lease was lost (`heartbeat.rs`);
//! - `reconcile`, when elected, re-notifies what the queue lost and purges
//!   expired dead events (`reconcile.rs`).
//!
//! Telemetry: the runtime reports through the [`metrics`] facade (a no-op
//! until the application installs a recorder), per handler name:
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `herald_events_emitted_total` | counter | events stored as new by a [`crate::Client`] |
//! | `herald_events_done_total` | counter | runs that finished done (settled) |
//! | `herald_events_failed_total` | counter | failed attempts (retried, or moved to dead) |
//! | `herald_events_dead_total` | counter | runs that moved their event to dead |
//! | `herald_runs_in_flight` | gauge | handlers running now |
//! | `herald_lease_renewals_total` | counter | lease renewals that succeeded |
//! | `herald_lease_losses_total` | counter | leases lost while running |
//! | `herald_emit_to_start_seconds` | histogram | run start minus the event's `run_at` |
//! | `herald_handler_duration_seconds` | histogram | how long handlers ran |
//!
//! A worker registers its handles when it starts: install the recorder
//! before [`WorkerBuilder::start`]. A [`RunObserver`] sees the same events
//! as plain calls, for live statistics kept in the application.

mod admission;
mod heartbeat;
mod reconcile;
mod run;
mod settle;
mod stats;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::decision::{Policy, Tally};
use crate::handler::{FnHandler, Handler, IntoOutcome, JobHandler};
use crate::model::Millis;
use crate::queue::{DeliveryTag, Queue};
use crate::retry::RetryPolicy;
use crate::store::{LeaseRef, Store};
use crate::{Context, Job};

use metrics::{Counter, Gauge, Histogram};

pub use crate::decision::RunSettled;
pub use stats::{StatsSnapshot, WorkerStats};

use settle::Ended;

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

/// One handler's metric handles, registered once when the worker starts.
pub(crate) struct Instruments {
    name: String,
    done: Counter,
    failed: Counter,
    dead: Counter,
    in_flight: Gauge,
    renewals: Counter,
    losses: Counter,
    emit_to_start: Histogram,
    duration: Histogram,
}

impl Instruments {
    fn new(handler: &str) -> Self {
        let label = || [("handler", handler.to_string())];
        Instruments {
            name: handler.to_string(),
            done: metrics::counter!("herald_events_done_total", &label()),
            failed: metrics::counter!("herald_events_failed_total", &label()),
            dead: metrics::counter!("herald_events_dead_total", &label()),
            in_flight: metrics::gauge!("herald_runs_in_flight", &label()),
            renewals: metrics::counter!("herald_lease_renewals_total", &label()),
            losses: metrics::counter!("herald_lease_losses_total", &label()),
            emit_to_start: metrics::histogram!("herald_emit_to_start_seconds", &label()),
            duration: metrics::histogram!("herald_handler_duration_seconds", &label()),
        }
    }
}

/// How a worker behaves. Every field has a documented default.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Most handlers running at once. Default 64.
    pub concurrency: usize,
    /// Most notifications taken from the queue (and claimed) per batch. Default 512.
    pub batch: usize,
    /// How long a claim lasts without renewal. Renewed every `lease / 3`
    /// (the heartbeat). Default 9 s: a killed worker's events run again
    /// about 9 s after the kill, and a store that stalls for up to two
    /// heartbeats (6 s) loses no lease. Peers default to 30 s because they
    /// cannot renew; see docs/adr/0006-rescue-by-any-worker.md.
    pub lease: Duration,
    /// The decision's knobs (retry backoff, delays).
    pub policy: Policy,
    /// How often the elected reconciler sweeps. Default 3 s. It sweeps at
    /// least once per heartbeat (`lease / 3`) whatever this says, so an
    /// expired lease is found within a heartbeat of its expiry.
    pub sweep_every: Duration,
    /// An event counts as "not notified recently" after this long. Default 60 s.
    pub sweep_quiet: Duration,
    /// How long dead events are kept. Default 7 days.
    pub dead_retention: Duration,
    /// How long done events are kept; `None` (default) deletes them at once.
    pub done_retention: Option<Duration>,
    /// Whether this worker may run the reconciler. Default true.
    pub reconcile: bool,
    /// This worker's name in logs and in the leader row. Default: a random
    /// id. A name that stays the same across restarts (`herald serve` uses
    /// `HOST@ADDRESS`) lets a restarted process take its own leader row at
    /// once instead of waiting out its dead predecessor's lease; two live
    /// workers must not share one.
    pub name: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 64,
            batch: 512,
            lease: Duration::from_secs(9),
            policy: Policy::default(),
            sweep_every: Duration::from_secs(3),
            sweep_quiet: Duration::from_secs(60),
            dead_retention: Duration::from_secs(7 * 24 * 3600),
            done_retention: None,
            reconcile: true,
            name: format!("worker-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        }
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

    /// Most handlers running at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.config.concurrency = n.max(1);
        self
    }

    /// How long a claim lasts without renewal.
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
    pub fn start(self) -> Worker {
        let mut config = self.config;
        config.concurrency = config.concurrency.max(1);
        config.batch = config.batch.max(1);
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
        let shared = Arc::new(Shared {
            store: self.store,
            queue: self.queue,
            handlers: self.handlers,
            handler_names: names,
            instruments,
            observer: self.observer,
            slots: Arc::new(Semaphore::new(config.concurrency)),
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
        tracing::info!(worker = %shared.config.name, handlers = ?shared.handler_names, "worker started");
        Worker {
            shared,
            receive,
            settle,
            heartbeat,
            reconcile,
            settle_tx,
        }
    }
}

/// A running worker. Stop it with [`Worker::shutdown`].
pub struct Worker {
    shared: Arc<Shared>,
    receive: JoinHandle<()>,
    settle: JoinHandle<()>,
    heartbeat: JoinHandle<()>,
    reconcile: Option<JoinHandle<()>>,
    settle_tx: mpsc::UnboundedSender<Ended>,
}

/// What [`Worker::shutdown`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Runs in flight when shutdown began.
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

    /// Runs in flight now.
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
        let cancelled = (shared.stats.snapshot().cancelled - cancelled_before) as usize;
        tracing::info!(worker = %shared.config.name, in_flight, cancelled, "worker stopped");
        ShutdownReport {
            in_flight,
            cancelled,
        }
    }
}

/// One event being run by this worker.
pub(crate) struct RunEntry {
    tag: DeliveryTag,
    cancel: CancellationToken,
    lost: Arc<AtomicBool>,
    /// Set when the handler has returned (or was cancelled); the lease is
    /// still renewed until the run is settled.
    ended: Arc<AtomicBool>,
    /// When the store last confirmed the lease (local clock).
    renewed_at: Millis,
    /// The handler's metric handles.
    instruments: Arc<Instruments>,
}

/// State shared by a worker's tasks.
pub(crate) struct Shared {
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    handlers: HashMap<String, Arc<dyn Handler>>,
    handler_names: Vec<String>,
    /// Metric handles per handler name.
    instruments: HashMap<String, Arc<Instruments>>,
    observer: Option<Arc<dyn RunObserver>>,
    slots: Arc<Semaphore>,
    runs: Mutex<HashMap<LeaseRef, RunEntry>>,
    stats: WorkerStats,
    stop_receiving: CancellationToken,
    cancel_runs: CancellationToken,
    stop_background: CancellationToken,
    tasks: TaskTracker,
    config: WorkerConfig,
}

impl Shared {
    fn jitter() -> f64 {
        rand::random::<f64>()
    }

    /// Counts what an answer [tallies](Tally) as: in the stats, the
    /// handler's metrics (`instruments`) and the observer.
    fn tally(&self, tally: Tally, instruments: Option<&Instruments>) {
        let stats = &self.stats;
        let settled = |how| {
            if let (Some(observer), Some(i)) = (&self.observer, instruments) {
                observer.settled(&i.name, how);
            }
        };
        match tally {
            Tally::Nothing => {}
            Tally::Dropped => WorkerStats::add(&stats.dropped, 1),
            Tally::Requeued => WorkerStats::add(&stats.requeued, 1),
            Tally::LeaseLost => WorkerStats::add(&stats.lease_lost, 1),
            Tally::FencedOut => WorkerStats::add(&stats.fenced_out, 1),
            Tally::Buried => {
                // Its last attempt failed (its worker died): a failure and a death.
                if let Some(i) = instruments {
                    i.failed.increment(1);
                    i.dead.increment(1);
                }
                settled(RunSettled::Dead);
                WorkerStats::add(&stats.buried, 1);
                WorkerStats::add(&stats.dropped, 1);
            }
            Tally::Settled(how) => {
                let counter = match how {
                    RunSettled::Done => &stats.done,
                    RunSettled::Retried => &stats.retried,
                    RunSettled::Dead => &stats.dead,
                    RunSettled::Snoozed => &stats.snoozed,
                    RunSettled::Cancelled => &stats.cancelled,
                };
                WorkerStats::add(counter, 1);
                if let Some(i) = instruments {
                    match how {
                        RunSettled::Done => i.done.increment(1),
                        RunSettled::Retried => i.failed.increment(1),
                        RunSettled::Dead => {
                            i.failed.increment(1);
                            i.dead.increment(1);
                        }
                        RunSettled::Snoozed | RunSettled::Cancelled => {}
                    }
                }
                settled(how);
            }
        }
    }

    /// The metric handles of `handler` (registered at start; made on the
    /// spot for a name the worker does not have, which the claim excludes).
    fn instruments(&self, handler: &str) -> Arc<Instruments> {
        match self.instruments.get(handler) {
            Some(i) => i.clone(),
            None => Arc::new(Instruments::new(handler)),
        }
    }
}
