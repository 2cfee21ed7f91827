//! Renewing every lease this worker holds, in one store call per beat.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Shared, WorkerStats};
use crate::model::Millis;
use crate::store::LeaseRef;

/// Every `lease / 3`: renew all leases in one call, extend their
/// notifications' deadlines, and cancel the runs whose lease is gone.
pub(super) async fn heartbeat_loop(shared: Arc<Shared>) {
    let every = shared.config.lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shared.stop_background.cancelled() => return,
        }
        beat(&shared, every).await;
    }
}

async fn beat(shared: &Shared, every: std::time::Duration) {
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
            let mut tags = Vec::with_capacity(held.len());
            {
                let mut runs = shared.runs.lock().expect("runs lock");
                for (l, ok) in held.iter().zip(renewed) {
                    let Some(run) = runs.get_mut(l) else { continue };
                    if ok {
                        run.renewed_at = now;
                        run.instruments.renewals.increment(1);
                        tags.push(run.tag.clone());
                    } else {
                        lose(l, run);
                    }
                }
            }
            WorkerStats::add(&shared.stats.renewed, tags.len());
            // The store's lease is what counts: a queue that cannot answer
            // (its broker is down) must not hold up the next renewal.
            match tokio::time::timeout(every, shared.queue.extend(&tags)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot extend notification deadlines"),
                Err(_) => tracing::warn!(
                    waited = ?every,
                    "cannot extend notification deadlines: the queue did not answer"
                ),
            }
        }
        Err(e) => {
            WorkerStats::add(&shared.stats.store_errors, 1);
            tracing::warn!(error = %e, leases = held.len(), "lease renewal failed");
            // Past a whole lease without a renewal, the lease has surely lapsed.
            let cutoff = Millis::now().minus(lease);
            let mut runs = shared.runs.lock().expect("runs lock");
            for (l, run) in runs.iter_mut() {
                if run.renewed_at <= cutoff {
                    lose(l, run);
                }
            }
        }
    }
}

fn lose(lease: &LeaseRef, run: &super::RunEntry) {
    // A run that already ended is settled by the fence, not cancelled: a
    // failed renewal may only mean its settle landed first.
    if run.ended.load(Ordering::Acquire) {
        return;
    }
    if !run.lost.swap(true, Ordering::AcqRel) {
        run.instruments.losses.increment(1);
        tracing::warn!(event = %lease.id, "lease lost: cancelling the handler");
        run.cancel.cancel();
    }
}
