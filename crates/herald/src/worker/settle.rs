//! Ending runs: one store call per batch of finished runs, then the
//! answers of their messages to the queue (`message.rs`).

use std::sync::{Arc, PoisonError};

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::message::{Answers, Message};
use super::telemetry::{Instruments, RunEvent};
use super::WorkerState;
use crate::backend::{Finish, LeaseRef, Scheduled, Settle};
use crate::decision::{self, Answer, Claimed, Plan, RunEnd, RunSettled, Tally, Write};
use crate::escape::escaped;
use crate::queue::Publish;

/// A run that ended and waits to be settled.
pub(crate) struct Ended {
    /// The message that notified the event.
    pub(super) message: Arc<Message>,
    pub(super) claimed: Claimed,
    /// The event's tenant, for the log line of a failed attempt.
    pub(super) tenant: String,
    pub(super) end: RunEnd,
    /// The handler's metric handles.
    pub(super) instruments: Arc<Instruments>,
    /// The run's claim, freed once the run is settled (dropped with this).
    pub(super) claim: Option<OwnedSemaphorePermit>,
}

impl Ended {
    /// Counts `answer` for this run's event and adds it to its message's.
    fn answer(&self, shared: &WorkerState, answers: &mut Answers, answer: Answer) {
        let id = self.claimed.lease.id;
        answers.add(shared, &self.message, id, answer, Some(&self.instruments));
    }
}

/// Most runs settled in one store call.
const MAX_BATCH: usize = 1024;

/// Most settle calls in flight at once.
const IN_FLIGHT: usize = 2;

/// Settles ended runs as they come, batching whatever has queued up while
/// the previous batch was written. Returns when every sender is gone and
/// every batch is settled.
///
/// A settle call waits for its commit (a flush) and for its rows, about
/// twice its statement's own time, and while it waits the claims of the
/// runs it holds are not free: with one call at a time, the settle loop
/// was the drain's critical path (busy 98 % of a drain).
/// A second call starts only with a full batch, so that calls stay large
/// (smaller ones cost PostgreSQL more per run); runs that do not fill one
/// wait for the call in flight.
pub(super) async fn settle_loop(
    shared: Arc<WorkerState>,
    mut ended: mpsc::UnboundedReceiver<Ended>,
) {
    let mut calls = tokio::task::JoinSet::new();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        if calls.len() >= IN_FLIGHT {
            log_panic(calls.join_next().await);
        }
        if ended.recv_many(&mut batch, MAX_BATCH).await == 0 {
            break;
        }
        while !calls.is_empty() && batch.len() < MAX_BATCH {
            let room = MAX_BATCH - batch.len();
            tokio::select! {
                joined = calls.join_next() => {
                    log_panic(joined);
                    break;
                }
                n = ended.recv_many(&mut batch, room) => if n == 0 { break },
            }
        }
        let full = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
        let shared = shared.clone();
        calls.spawn(async move { settle_batch(&shared, full).await });
    }
    while let Some(joined) = calls.join_next().await {
        log_panic(Some(joined));
    }
}

/// Says so when a settle call panicked (a bug): as it unwound, its runs
/// left the heartbeat ([`Registered`]) and their claims were freed; their
/// notifications, unanswered, come back after the queue's deadline, and
/// the events run again once their leases have lapsed.
fn log_panic(joined: Option<Result<(), tokio::task::JoinError>>) {
    if let Some(Err(e)) = joined {
        tracing::error!(error = %escaped(&e), "a settle call panicked; its runs were not answered");
    }
}

/// One line per failed attempt the store accepted, at the default level: a
/// retry at info (herald will run it again), a move to dead at warn. The
/// error is the handler's own: attempt and limit are fields of their own.
fn log_failure(e: &Ended, write: &Write) {
    let (event, tenant, handler, attempt, max_attempts) = (
        e.claimed.lease.id,
        e.tenant.as_str(),
        e.instruments.name.as_str(),
        e.claimed.attempt,
        e.claimed.max_attempts,
    );
    let error = e.end.error().unwrap_or_default();
    match (&write.settle.finish, write.held.tally) {
        (Finish::Release { wait, .. }, Tally::Settled(RunSettled::Retried)) => tracing::info!(
            %event, tenant, handler, attempt, max_attempts,
            retry_in = ?wait, error = %escaped(&error), "attempt failed; will retry"
        ),
        (_, Tally::Settled(RunSettled::Dead)) => tracing::warn!(
            %event, tenant, handler, attempt, max_attempts,
            error = %escaped(&error), "attempt failed; event is dead"
        ),
        _ => {}
    }
}

/// A batch's runs as the heartbeat knows them (`WorkerState::runs`):
/// removed when dropped, so also if the settle call panics. A run left
/// there would have its lease renewed for as long as the worker lives,
/// and its event would never run again.
struct Registered<'a> {
    shared: &'a WorkerState,
    leases: Vec<LeaseRef>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        // A poisoned lock still holds the map: never panic while unwinding.
        let mut runs = self
            .shared
            .runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for lease in &self.leases {
            runs.remove(lease);
        }
    }
}

/// Notifies the events that the slots these runs freed woke (un-parked in
/// the store). If the publish fails they are not lost: un-parked, they are
/// the reconciler's after its quiet period.
pub(super) async fn wake(shared: &WorkerState, woken: Vec<Scheduled>) {
    let n = woken.len();
    let batch = Publish::group(woken, shared.queue.message_limits());
    if let Err(e) = shared.queue.publish(&batch).await {
        tracing::warn!(error = %escaped(&e), events = n, "cannot notify the events a freed limit slot woke; the reconciler will");
    }
}

async fn settle_batch(shared: &WorkerState, batch: Vec<Ended>) {
    let registered = Registered {
        shared,
        leases: batch.iter().map(|e| e.claimed.lease).collect(),
    };
    let policy = shared.config.policy;
    let mut answers = Answers::default();
    let mut writes = Vec::with_capacity(batch.len());
    for e in &batch {
        match decision::settle(e.claimed, e.end.clone(), &policy, WorkerState::jitter()) {
            Plan::Answer(answer) => {
                tracing::warn!(event = %e.claimed.lease.id, "lease lost while running: handler cancelled, nothing written");
                e.answer(shared, &mut answers, answer);
            }
            Plan::Write(write) => writes.push((e, write)),
        }
    }
    if !writes.is_empty() {
        let settles: Vec<Settle> = writes.iter().map(|(_, w)| w.settle.clone()).collect();
        let settled = shared.events.settle(&settles).await;
        match &settled {
            Err(err) => {
                shared.record(RunEvent::StoreFailed);
                tracing::warn!(error = %escaped(&err), runs = settles.len(), "cannot settle runs; notifications go back to the queue");
            }
            Ok(s) if !s.woken.is_empty() => wake(shared, s.woken.clone()).await,
            Ok(_) => {}
        }
        for (i, (e, write)) in writes.iter().enumerate() {
            let answer = write.answer(&settled, i);
            match answer.tally {
                Tally::Settled(_) => log_failure(e, write),
                Tally::FencedOut => {
                    tracing::warn!(event = %write.settle.id, "late result refused: the lease is someone else's now");
                }
                _ => {}
            }
            e.answer(shared, &mut answers, answer);
        }
    }
    drop(registered);
    // Settled: their claims are free for the next events.
    for e in batch {
        drop(e.claim);
    }
    answers.send(shared).await;
}
