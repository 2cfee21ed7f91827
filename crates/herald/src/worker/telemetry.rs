//! The one place where what a worker does becomes metrics, stats and observer calls.
//!
//! The worker's tasks report [`RunEvent`]s to [`WorkerState::record`]; nothing else
//! touches a counter. The runtime reports through the [`metrics`] facade (a
//! no-op until the application installs a recorder), per handler name:
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
//! before [`WorkerBuilder::start`](super::WorkerBuilder::start). A
//! [`RunObserver`](super::RunObserver) sees runs start and settle as plain
//! calls, and [`Worker::stats`](super::Worker::stats) reads the counters.

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

use super::{WorkerState, WorkerStats};
use crate::decision::{RunSettled, Tally};

/// One handler's metric handles, registered once when the worker starts.
pub(crate) struct Instruments {
    /// The handler name.
    pub(super) name: String,
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
    pub(super) fn new(handler: &str) -> Self {
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

/// Something a worker did that is counted somewhere.
pub(super) enum RunEvent<'a> {
    /// Notifications received from the queue.
    Received(usize),
    /// Messages on the queue that were not notifications.
    Garbage(usize),
    /// Claims won in one store call.
    Claimed(usize),
    /// The run of `handler` started, `waited` after its `run_at`.
    Started {
        handler: &'a Instruments,
        waited: Duration,
    },
    /// The run's handler returned or was cancelled; `ran` is how long the
    /// handler ran (`None`: there was no handler to run).
    Ran {
        handler: &'a Instruments,
        ran: Option<Duration>,
    },
    /// A lease of a run of `handler` was renewed.
    Renewed { handler: &'a Instruments },
    /// The heartbeat found a running run's lease lost and cancelled it.
    LeaseLost { handler: &'a Instruments },
    /// A notification (or a run) was answered; `handler` is known for the
    /// answers that count in its metrics (runs and burials).
    Answered {
        tally: Tally,
        handler: Option<&'a Instruments>,
    },
    /// A store call failed.
    StoreFailed,
    /// The reconciler published this many notifications.
    Reconciled(usize),
    /// The reconciler completed a sweep.
    Swept,
    /// The scheduler stored this many occurrences' events.
    Scheduled(usize),
}

impl WorkerState {
    /// Turns a run event into its metrics, stats and observer calls.
    pub(super) fn record(&self, event: RunEvent<'_>) {
        let stats = &self.stats;
        let add = |counter, n| WorkerStats::add(counter, n);
        match event {
            RunEvent::Received(n) => add(&stats.received, n),
            RunEvent::Garbage(n) => add(&stats.garbage, n),
            RunEvent::Claimed(n) => add(&stats.claimed, n),
            RunEvent::Started { handler, waited } => {
                handler.emit_to_start.record(waited.as_secs_f64());
                handler.in_flight.increment(1.0);
                if let Some(observer) = &self.observer {
                    observer.started(&handler.name, waited);
                }
            }
            RunEvent::Ran { handler, ran } => {
                if let Some(ran) = ran {
                    handler.duration.record(ran.as_secs_f64());
                }
                handler.in_flight.decrement(1.0);
            }
            RunEvent::Renewed { handler } => {
                handler.renewals.increment(1);
                add(&stats.renewed, 1);
            }
            RunEvent::LeaseLost { handler } => handler.losses.increment(1),
            RunEvent::Answered { tally, handler } => self.tally(tally, handler),
            RunEvent::StoreFailed => add(&stats.store_errors, 1),
            RunEvent::Reconciled(n) => add(&stats.reconciled, n),
            RunEvent::Swept => add(&stats.sweeps, 1),
            RunEvent::Scheduled(n) => add(&stats.scheduled, n),
        }
    }

    fn tally(&self, tally: Tally, handler: Option<&Instruments>) {
        let stats = &self.stats;
        let add = |counter| WorkerStats::add(counter, 1);
        let settled = |how| {
            if let (Some(observer), Some(i)) = (&self.observer, handler) {
                observer.settled(&i.name, how);
            }
        };
        match tally {
            Tally::Nothing => {}
            Tally::Dropped => add(&stats.dropped),
            Tally::Requeued => add(&stats.requeued),
            Tally::LeaseLost => add(&stats.lease_lost),
            Tally::FencedOut => add(&stats.fenced_out),
            Tally::Buried => {
                // Its last attempt failed (its worker died): a failure and a death.
                if let Some(i) = handler {
                    i.failed.increment(1);
                    i.dead.increment(1);
                }
                settled(RunSettled::Dead);
                add(&stats.buried);
                add(&stats.dropped);
            }
            Tally::Settled(how) => {
                add(match how {
                    RunSettled::Done => &stats.done,
                    RunSettled::Retried => &stats.retried,
                    RunSettled::Dead => &stats.dead,
                    RunSettled::Snoozed => &stats.snoozed,
                    RunSettled::Cancelled => &stats.cancelled,
                });
                if let Some(i) = handler {
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
}
