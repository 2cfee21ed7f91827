//! Running one claimed event's handler.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::message::Message;
use super::settle::Ended;
use super::telemetry::RunEvent;
use super::{RunEntry, WorkerState};
use crate::backend::LeaseRef;
use crate::decision::{Claimed, RunEnd};
use crate::escape::escaped;
use crate::handler::{Context, Handler, Outcome};
use crate::model::{Event, LeaseToken, Millis};

/// Registers the lease with the heartbeat and spawns the run: it waits for a
/// handler slot (an event claimed ahead waits here, its lease renewed), then
/// calls the handler. The slot is freed when the handler returns; the claim
/// (none for the events of a message past the free claims) once the run is
/// settled, so that runs waiting for the store count against what the
/// worker may claim. The lease is renewed until the run is settled.
pub(super) fn start(
    shared: &Arc<WorkerState>,
    event: Event,
    token: LeaseToken,
    message: Arc<Message>,
    claim: Option<OwnedSemaphorePermit>,
    to_settle: mpsc::UnboundedSender<Ended>,
    deadline: Instant,
) {
    let cancel = shared.cancel_runs.child_token();
    let lost = Arc::new(AtomicBool::new(false));
    let ended = Arc::new(AtomicBool::new(false));
    let lease = LeaseRef {
        id: event.id,
        token,
    };
    let instruments = shared.instruments(&event.handler);
    let (deadline, lease_deadline) = tokio::sync::watch::channel(deadline);
    shared.runs.lock().expect("runs lock").insert(
        lease,
        RunEntry {
            message: message.clone(),
            cancel: cancel.clone(),
            lost: lost.clone(),
            ended: ended.clone(),
            deadline,
            instruments: instruments.clone(),
        },
    );
    let handler = shared.handlers.get(&event.handler).cloned();
    let shared = shared.clone();
    shared.clone().tasks.spawn(async move {
        let claimed = Claimed {
            lease,
            attempt: event.attempt,
            max_attempts: event.max_attempts,
        };
        // Cancellation (shutdown past its grace, a lost lease) wins a tie
        // here too: an event that never started is released like a run.
        let slot = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            s = shared.slots.clone().acquire_owned() => Some(s.expect("the slot semaphore is never closed")),
        };
        let (end, ran) = match slot {
            // Claimed ahead and ended before it started: released (or left to
            // the lease's new holder) like a run that was cancelled.
            None if lost.load(Ordering::Acquire) => (RunEnd::LeaseLost, None),
            None => (RunEnd::Cancelled, None),
            Some(slot) => {
                shared.record(RunEvent::Started {
                    handler: &instruments,
                    waited: since(event.run_at),
                });
                let (end, ran) = call(handler, &event, token, &cancel, &lost, lease_deadline).await;
                shared.record(RunEvent::Ran {
                    handler: &instruments,
                    ran,
                });
                drop(slot);
                (end, ran)
            }
        };
        ended.store(true, Ordering::Release);
        tracing::debug!(event = %event.id, handler = %escaped(&event.handler), attempt = event.attempt, ?end, ?ran, "run ended");
        // The settler outlives every run (shutdown waits for runs first).
        let _ = to_settle.send(Ended {
            message,
            claimed,
            tenant: event.tenant,
            end,
            instruments,
            claim,
        });
    });
}

/// Calls the event's handler: how the run ended, and how long the handler
/// ran (`None`: there was no handler to call).
async fn call(
    handler: Option<Arc<dyn Handler>>,
    event: &Event,
    token: LeaseToken,
    cancel: &CancellationToken,
    lost: &AtomicBool,
    lease_deadline: tokio::sync::watch::Receiver<Instant>,
) -> (RunEnd, Option<Duration>) {
    let Some(h) = handler else {
        // The claim only takes events of handlers this worker has.
        let error = format!("no handler named {:?} here", event.handler);
        return (RunEnd::Returned(Outcome::retry(error)), None);
    };
    let started = Instant::now();
    let cx = Context::new(event, token, cancel.clone(), lease_deadline);
    let call = AssertUnwindSafe(h.call(&event.payload, cx)).catch_unwind();
    // Cancellation wins a tie: a handler that returns because it was
    // cancelled has not finished its work.
    let returned = tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        r = call => Some(r.unwrap_or_else(|panic| {
            Outcome::retry(format!("handler panicked: {}", panic_message(&*panic)))
        })),
    };
    let ran = started.elapsed();
    let end = match returned {
        _ if lost.load(Ordering::Acquire) => RunEnd::LeaseLost,
        Some(outcome) => RunEnd::Returned(outcome),
        None => RunEnd::Cancelled,
    };
    (end, Some(ran))
}

/// How long ago `run_at` was, by the local wall clock, to the microsecond
/// (`run_at` itself has millisecond precision); zero if it is in the future.
fn since(run_at: Millis) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as i128;
    let micros = now - i128::from(run_at.0) * 1000;
    Duration::from_micros(u64::try_from(micros.max(0)).unwrap_or(u64::MAX))
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}
