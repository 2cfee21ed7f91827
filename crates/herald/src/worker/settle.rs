//! Ending runs: one store call per batch of finished runs, then one ack and
//! one nack call to the queue.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::admission::Answers;
use super::{Instruments, RunSettled, Shared, WorkerStats};
use crate::decision::{self, Claimed, RunEnd, Settlement};
use crate::queue::DeliveryTag;
use crate::store::{Finish, LeaseRef, Settle};

/// A run that ended and waits to be settled.
pub(crate) struct Ended {
    pub(super) lease: LeaseRef,
    pub(super) tag: DeliveryTag,
    pub(super) claimed: Claimed,
    /// The event's tenant, for the log line of a failed attempt.
    pub(super) tenant: String,
    pub(super) end: RunEnd,
    /// The handler's metric handles.
    pub(super) instruments: Arc<Instruments>,
}

/// Most runs settled in one store call.
const MAX_BATCH: usize = 1024;

/// Settles ended runs as they come, batching whatever has queued up while
/// the previous batch was written. Returns when every sender is gone.
pub(super) async fn settle_loop(shared: Arc<Shared>, mut ended: mpsc::UnboundedReceiver<Ended>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while ended.recv_many(&mut batch, MAX_BATCH).await > 0 {
        settle_batch(&shared, std::mem::take(&mut batch)).await;
    }
}

/// The store write for a settlement; `None` writes nothing.
fn write_for(settlement: &Settlement) -> Option<Finish> {
    Some(match settlement {
        Settlement::Delete => Finish::Delete,
        Settlement::Archive => Finish::Archive,
        Settlement::Retry { wait, error, .. } => Finish::Release {
            wait: *wait,
            error: Some(error.clone()),
            give_back: false,
        },
        Settlement::Snooze { wait, .. } => Finish::Release {
            wait: *wait,
            error: None,
            give_back: true,
        },
        Settlement::Dead { error } => Finish::Bury {
            error: error.clone(),
        },
        Settlement::Leave => return None,
    })
}

/// Reports a settlement the store accepted to the metrics and the observer.
fn report(shared: &Shared, e: &Ended, settlement: &Settlement) {
    let how = match (&e.end, settlement) {
        (RunEnd::Cancelled, _) => RunSettled::Cancelled,
        (_, Settlement::Delete | Settlement::Archive) => RunSettled::Done,
        (_, Settlement::Retry { .. }) => RunSettled::Retried,
        (_, Settlement::Dead { .. }) => RunSettled::Dead,
        (_, Settlement::Snooze { .. }) => RunSettled::Snoozed,
        (_, Settlement::Leave) => return,
    };
    let i = &e.instruments;
    match how {
        RunSettled::Done => i.done.increment(1),
        RunSettled::Retried => i.failed.increment(1),
        RunSettled::Dead => {
            i.failed.increment(1);
            i.dead.increment(1);
        }
        RunSettled::Snoozed | RunSettled::Cancelled => {}
    }
    if let Some(observer) = &shared.observer {
        observer.settled(&i.name, how);
    }
}

fn count(stats: &WorkerStats, end: &RunEnd, settlement: &Settlement) {
    let counter = match (end, settlement) {
        (RunEnd::Cancelled, _) => &stats.cancelled,
        (RunEnd::LeaseLost, _) => &stats.lease_lost,
        (_, Settlement::Delete | Settlement::Archive) => &stats.done,
        (_, Settlement::Retry { .. }) => &stats.retried,
        (_, Settlement::Dead { .. }) => &stats.dead,
        (_, Settlement::Snooze { .. }) => &stats.snoozed,
        (_, Settlement::Leave) => return,
    };
    WorkerStats::add(counter, 1);
}

/// One line per failed attempt the store accepted, at the default level: a
/// retry at info (herald will run it again), a move to dead at warn.
fn log_failure(e: &Ended, settlement: &Settlement) {
    let (event, tenant, handler, attempt) = (
        e.lease.id,
        e.tenant.as_str(),
        e.instruments.name.as_str(),
        e.claimed.attempt,
    );
    match settlement {
        Settlement::Retry { wait, error, .. } => tracing::info!(
            %event, tenant, handler, attempt, max_attempts = e.claimed.max_attempts,
            retry_in = ?wait, %error, "attempt failed; will retry"
        ),
        Settlement::Dead { error } => tracing::warn!(
            %event, tenant, handler, attempt, max_attempts = e.claimed.max_attempts,
            %error, "attempt failed; event is dead"
        ),
        _ => {}
    }
}

async fn settle_batch(shared: &Shared, batch: Vec<Ended>) {
    let policy = shared.config.policy;
    let mut writes = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    for e in &batch {
        let settlement = decision::settle(e.claimed, e.end.clone(), &policy, Shared::jitter());
        if let Some(finish) = write_for(&settlement) {
            writes.push(Settle {
                id: e.lease.id,
                token: Some(e.lease.token),
                finish,
            });
            replies.push((e, settlement));
        } else {
            count(&shared.stats, &e.end, &settlement);
            tracing::warn!(event = %e.lease.id, "lease lost while running: handler cancelled, nothing written");
        }
    }
    let mut answers = Answers::default();
    if !writes.is_empty() {
        match shared.store.settle(&writes).await {
            Ok(held) => {
                for ((w, (e, settlement)), ok) in writes.iter().zip(replies).zip(held) {
                    if ok {
                        count(&shared.stats, &e.end, &settlement);
                        report(shared, e, &settlement);
                        log_failure(e, &settlement);
                        answers.reply(e.tag.clone(), settlement.reply());
                    } else {
                        // Someone else holds the event now; its notification is theirs to answer.
                        WorkerStats::add(&shared.stats.fenced_out, 1);
                        tracing::warn!(event = %w.id, "late result refused: the lease is someone else's now");
                    }
                }
            }
            Err(e) => {
                WorkerStats::add(&shared.stats.store_errors, 1);
                tracing::warn!(error = %e, runs = writes.len(), "cannot settle runs; notifications go back to the queue");
                for (e, _) in replies {
                    answers.reply(e.tag.clone(), decision::store_failed(&policy).reply());
                }
            }
        }
    }
    {
        let mut runs = shared.runs.lock().expect("runs lock");
        for e in &batch {
            runs.remove(&e.lease);
        }
    }
    answers.send(shared).await;
}
