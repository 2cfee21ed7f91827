//! The worker runtime: the imperative shell around [`crate::decision`].
//!
//! The public API (builder, worker, shutdown, observer) is in `api.rs`, the
//! configuration and its checks in `config.rs`. Tasks of one worker:
//! - `receive` takes notifications in batches while claims are free,
//!   claims them in one store call, and answers the ones it could not claim
//!   (`admission.rs`);
//! - one task per claimed event waits for a handler slot and runs its
//!   handler (`run.rs`);
//! - `settle` group-commits the ends of runs, up to two calls in flight,
//!   and answers their notifications (`settle.rs`); a message of several events is answered
//!   once each of its events has its reply (`message.rs`);
//! - `heartbeat` renews every lease in one call every `lease / 3`, each
//!   call bounded by `lease / 3`, and cancels runs whose lease was lost or
//!   is about to lapse by the worker's own clock (`heartbeat.rs`);
//! - `reconcile`, when elected, re-notifies what the queue lost and purges
//!   expired dead events (`reconcile.rs`);
//! - `schedule`, when elected, emits the due occurrences of schedules
//!   (`schedule.rs`).
//!
//! Every task reports what it did as a run event; `telemetry.rs` turns them
//! into metrics, [`WorkerStats`] and [`RunObserver`] calls, and lists the
//! metrics.

mod admission;
mod api;
mod config;
mod heartbeat;
mod message;
mod reconcile;
mod run;
mod schedule;
mod settle;
mod stats;
mod telemetry;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::{EventStore, LeaderElection, LeaseRef, Reconciliation, Schedules};
use crate::handler::Handler;
use crate::queue::Queue;

pub use crate::decision::RunSettled;
pub use api::{RunObserver, ShutdownHandle, ShutdownReport, Worker, WorkerBuilder};
pub use config::{WorkerConfig, WorkerConfigError, DEFAULT_LEASE, MIN_LEASE};
pub use stats::{StatsSnapshot, WorkerStats};

use telemetry::Instruments;

/// One event being run by this worker.
pub(crate) struct RunEntry {
    /// The message that notified it (shared by the message's events).
    message: Arc<message::Message>,
    cancel: CancellationToken,
    lost: Arc<AtomicBool>,
    /// Set when the handler has returned (or was cancelled); the lease is
    /// still renewed until the run is settled.
    ended: Arc<AtomicBool>,
    /// When the run is given up unless its lease is renewed, by this
    /// worker's monotonic clock (`heartbeat::deadline`): before the lease
    /// can lapse in the store. The heartbeat's guard cancels the run then;
    /// the handler's context reads it.
    deadline: tokio::sync::watch::Sender<std::time::Instant>,
    /// The handler's metric handles.
    instruments: Arc<Instruments>,
}

/// State shared by a worker's tasks.
pub(crate) struct WorkerState {
    /// The hot path: claim and inspect (admission), settle, renew (heartbeat).
    events: Arc<dyn EventStore>,
    /// The reconciler's and the scheduler's leader leases.
    election: Arc<dyn LeaderElection>,
    /// The elected reconciler's passes.
    reconciliation: Arc<dyn Reconciliation>,
    /// The elected scheduler's reads and firings.
    schedules: Arc<dyn Schedules>,
    queue: Arc<dyn Queue>,
    handlers: HashMap<String, Arc<dyn Handler>>,
    handler_names: Vec<String>,
    /// Metric handles per handler name.
    instruments: HashMap<String, Arc<Instruments>>,
    observer: Option<Arc<dyn RunObserver>>,
    /// One permit per event this worker may hold claimed and not yet ended:
    /// `concurrency + claim_ahead`. Taken before a notification is
    /// received, returned when its handler ends.
    claims: Arc<Semaphore>,
    /// One permit per running handler: `concurrency`. Taken by a claimed
    /// event's task before its handler starts.
    slots: Arc<Semaphore>,
    runs: Mutex<HashMap<LeaseRef, RunEntry>>,
    stats: WorkerStats,
    stop_receiving: CancellationToken,
    cancel_runs: CancellationToken,
    stop_background: CancellationToken,
    tasks: TaskTracker,
    config: WorkerConfig,
}

impl WorkerState {
    fn jitter() -> f64 {
        rand::random::<f64>()
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
