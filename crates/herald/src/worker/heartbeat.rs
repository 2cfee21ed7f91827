//! Renewing every lease this worker holds, in one store call per beat.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::telemetry::RunEvent;
use super::{RunEntry, WorkerState};
use crate::escape::escaped;
use crate::model::Millis;
use crate::store::LeaseRef;

/// Every `lease / 3`: renew all leases in one call, extend their
/// notifications' deadlines, and cancel the runs whose lease is gone.
pub(super) async fn heartbeat_loop(shared: Arc<WorkerState>) {
    let every = shared.config.lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shared.stop_background.cancelled() => return,
        }
        beat(&shared).await;
    }
}

async fn beat(shared: &WorkerState) {
    let held: Vec<LeaseRef> = shared
        .runs
        .lock()
        .expect("runs lock")
        .keys()
        .copied()
        .collect();
    if held.is_empty() {
        return;
    }
    let lease = shared.config.lease;
    match shared.store.renew(&held, lease).await {
        Ok(renewed) => {
            let now = Millis::now();
            // Runs of one message share its tag: extend it once.
            let mut tags = HashSet::with_capacity(held.len());
            {
                let mut runs = shared.runs.lock().expect("runs lock");
                for (l, ok) in held.iter().zip(renewed) {
                    let Some(run) = runs.get_mut(l) else { continue };
                    if ok {
                        run.renewed_at = now;
                        shared.record(RunEvent::Renewed {
                            handler: &run.instruments,
                        });
                        tags.insert(run.message.tag.clone());
                    } else {
                        lose(shared, l, run);
                    }
                }
            }
            // Bounded by one beat: a broker that is away must not hold up
            // the next renewal in the store, which is what keeps the leases.
            let tags: Vec<_> = tags.into_iter().collect();
            match tokio::time::timeout(lease / 3, shared.queue.extend(&tags)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %escaped(&e), "cannot extend notification deadlines");
                }
                Err(_) => tracing::warn!(
                    "extending notification deadlines took over a third of the lease; given up until the next beat"
                ),
            }
        }
        Err(e) => {
            shared.record(RunEvent::StoreFailed);
            tracing::warn!(error = %escaped(&e), leases = held.len(), "lease renewal failed");
            // Past a whole lease without a renewal, the lease has surely lapsed.
            let cutoff = Millis::now().minus(lease);
            let mut runs = shared.runs.lock().expect("runs lock");
            for (l, run) in runs.iter_mut() {
                if run.renewed_at <= cutoff {
                    lose(shared, l, run);
                }
            }
        }
    }
}

fn lose(shared: &WorkerState, lease: &LeaseRef, run: &RunEntry) {
    // A run that already ended is settled by the fence, not cancelled: a
    // failed renewal may only mean its settle landed first.
    if run.ended.load(Ordering::Acquire) {
        return;
    }
    if !run.lost.swap(true, Ordering::AcqRel) {
        shared.record(RunEvent::LeaseLost {
            handler: &run.instruments,
        });
        tracing::warn!(event = %lease.id, "lease lost: cancelling the handler");
        run.cancel.cancel();
    }
}
