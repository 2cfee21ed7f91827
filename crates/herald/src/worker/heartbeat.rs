//! Keeping the leases this worker holds: renewing all of them in one store
//! call per beat, and cancelling each run before its lease can lapse by the
//! worker's own clock, whatever the store and the queue do.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;

use super::telemetry::RunEvent;
use super::{RunEntry, WorkerState};
use crate::backend::LeaseRef;
use crate::escape::escaped;

/// Every `lease / 3`: renew all leases in one call, extend their
/// notifications' deadlines, and cancel the runs whose lease is gone. The
/// renewal is bounded by `lease / 3`, so a store that does not answer
/// costs one beat, never the next ones; the extension runs on its own,
/// bounded likewise, so a broker that is away never delays a renewal.
pub(super) async fn heartbeat_loop(shared: Arc<WorkerState>) {
    tokio::join!(renew_loop(shared.clone()), guard_loop(shared));
}

async fn renew_loop(shared: Arc<WorkerState>) {
    let every = shared.config.lease / 3;
    let mut beats = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    beats.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = beats.tick() => {}
            _ = shared.stop_background.cancelled() => return,
        }
        beat(&shared).await;
    }
}

/// Every `lease / 12`: cancel each run past its [deadline](deadline).
/// Runs on its own so that a renewal stuck in the store cannot hold it up.
async fn guard_loop(shared: Arc<WorkerState>) {
    let every = shared.config.lease / 12;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shared.stop_background.cancelled() => return,
        }
        let now = Instant::now();
        let runs = shared.runs.lock().expect("runs lock");
        for (l, run) in runs.iter() {
            if now >= *run.deadline.borrow() {
                lose(&shared, l, run, "lease not renewed in time");
            }
        }
    }
}

/// When a run whose lease was claimed or renewed by a call sent at `sent`
/// is given up unless renewed again: a sixth of the lease before the
/// lease can lapse. The store's expiry is at least `sent + lease` (the
/// statement runs after it is sent), so by this worker's clock the run
/// ends, with the guard's tick of a twelfth, between a sixth and a twelfth
/// of the lease before anyone else can claim the event: time for its
/// cancellation (a dropped future, a killed process group) to take effect.
pub(super) fn deadline(sent: Instant, lease: Duration) -> Instant {
    sent + lease - lease / 6
}

async fn beat(shared: &Arc<WorkerState>) {
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
    // The store's new expiry is at least this plus the lease.
    let sent = Instant::now();
    let renewed = match tokio::time::timeout(lease / 3, shared.events.renew(&held, lease)).await {
        Ok(Ok(renewed)) => renewed,
        Ok(Err(e)) => {
            shared.record(RunEvent::StoreFailed);
            tracing::warn!(error = %escaped(&e), leases = held.len(), "lease renewal failed; the guard cancels runs before their leases can lapse");
            return;
        }
        Err(_) => {
            shared.record(RunEvent::StoreFailed);
            tracing::warn!(
                leases = held.len(),
                "lease renewal took over a third of the lease; given up until the next beat"
            );
            return;
        }
    };
    // Runs of one message share its tag: extend it once.
    let mut tags = HashSet::with_capacity(held.len());
    {
        let mut runs = shared.runs.lock().expect("runs lock");
        for (l, ok) in held.iter().zip(renewed) {
            let Some(run) = runs.get_mut(l) else { continue };
            if ok {
                run.deadline.send_replace(deadline(sent, lease));
                shared.record(RunEvent::Renewed {
                    handler: &run.instruments,
                });
                tags.insert(run.message.tag.clone());
            } else {
                lose(shared, l, run, "lease lost");
            }
        }
    }
    // Bounded by one beat, and on its own: the next renewal does not wait
    // for a broker that is away.
    let tags: Vec<_> = tags.into_iter().collect();
    let shared = shared.clone();
    tokio::spawn(async move {
        match tokio::time::timeout(lease / 3, shared.queue.extend(&tags)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %escaped(&e), "cannot extend notification deadlines");
            }
            Err(_) => tracing::warn!(
                "extending notification deadlines took over a third of the lease; given up until the next beat"
            ),
        }
    });
}

fn lose(shared: &WorkerState, lease: &LeaseRef, run: &RunEntry, why: &str) {
    // A run that already ended is settled by the fence, not cancelled: a
    // failed renewal may only mean its settle landed first.
    if run.ended.load(Ordering::Acquire) {
        return;
    }
    if !run.lost.swap(true, Ordering::AcqRel) {
        shared.record(RunEvent::LeaseLost {
            handler: &run.instruments,
        });
        tracing::warn!(event = %lease.id, "{why}: cancelling the handler");
        run.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_given_up_a_sixth_of_the_lease_before_it_can_lapse() {
        let sent = Instant::now();
        let lease = Duration::from_secs(9);
        assert_eq!(deadline(sent, lease), sent + Duration::from_millis(7500));
        let lease = Duration::from_millis(300);
        assert_eq!(deadline(sent, lease), sent + Duration::from_millis(250));
    }
}
