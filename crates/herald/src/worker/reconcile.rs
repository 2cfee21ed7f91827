//! The reconciler: when this worker is elected, re-notify what the queue
//! lost (or never got), rescue dead workers' events, purge expired ones,
//! and give the store its upkeep (PostgreSQL's ring of leaves).

use std::sync::Arc;
use std::time::Duration;

use super::telemetry::RunEvent;
use super::WorkerState;
use crate::escape::escaped;
use crate::queue::{Publish, Retention};

/// The leader row's name.
const ROLE: &str = "reconciler";
/// Events per sweep or purge page.
const PAGE: usize = 1000;
/// The shortest wait between two passes, and a follower's jitter.
const MIN_PASS: Duration = Duration::from_millis(20);
/// The first sweep of a queue that forgets on restart also takes events
/// notified up to this long after the queue began: an emit in the
/// millisecond the queue was created, or a store whose clock runs behind
/// this process's, would otherwise wait out a quiet period. The cost is a
/// second notification of what this process notified in that time.
const CLOCK_SLACK: Duration = Duration::from_millis(100);

pub(super) async fn reconcile_loop(shared: Arc<WorkerState>) {
    let cfg = &shared.config;
    // The leader lease is an event lease, renewed on the heartbeat's beat:
    // when a leader dies, its lease lapses when its events' leases do, and a
    // follower asking just then takes over in time to rescue them.
    let lead_for = cfg.lease;
    // At least once per heartbeat, so that an expired lease is found within
    // a heartbeat of its expiry, whatever `sweep_every` says.
    let every = cfg.sweep_every.min(cfg.lease / 3).max(MIN_PASS);
    // A queue that forgets on restart: its first sweep notifies every due
    // event last notified before the queue began (an earlier process's
    // queue held those); what was notified since is in this queue.
    let mut first_sweep_since = match shared.queue.retention() {
        Retention::Durable => None,
        Retention::Process { since } => Some(since),
    };
    let mut leading = false;
    loop {
        // Passes start `every` apart, not `every` after the last one ended:
        // a pass slowed by a busy store does not push the next one back, so
        // an expired lease is found within `every` of its expiry plus at
        // most one pass.
        let began = tokio::time::Instant::now();
        let wait = match shared.election.lead(ROLE, &cfg.name, lead_for).await {
            Ok(l) => {
                if l.leading != leading {
                    tracing::info!(worker = %cfg.name, leading = l.leading, "reconciler leadership changed");
                    leading = l.leading;
                }
                if leading {
                    let quiet = first_sweep_since.map_or(cfg.sweep_quiet, |since| {
                        since
                            .elapsed()
                            .saturating_sub(CLOCK_SLACK)
                            .min(cfg.sweep_quiet)
                    });
                    if sweep(&shared, quiet).await {
                        first_sweep_since = None;
                        shared.record(RunEvent::Swept);
                    }
                    lapse(&shared).await;
                    purge(&shared).await;
                    if let Err(e) = shared.reconciliation.upkeep().await {
                        shared.record(RunEvent::StoreFailed);
                        tracing::warn!(error = %escaped(&e), "store upkeep failed");
                    }
                    every.saturating_sub(began.elapsed()).max(MIN_PASS)
                } else {
                    // Ask again as the holder's lease lapses, not sooner: the
                    // lease cannot lapse before, so an idle follower sends one
                    // query per lease, and a dead leader is replaced as its
                    // events' leases lapse. The jitter keeps followers from
                    // asking all in the same millisecond.
                    let jitter = MIN_PASS.mul_f64(WorkerState::jitter());
                    l.left.max(MIN_PASS) + jitter
                }
            }
            Err(e) => {
                shared.record(RunEvent::StoreFailed);
                tracing::warn!(error = %escaped(&e), "cannot take or keep the reconciler lease");
                every
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.stop_background.cancelled() => break,
        }
    }
    if leading {
        if let Err(e) = shared.election.resign(ROLE, &cfg.name).await {
            tracing::warn!(error = %escaped(&e), "cannot resign the reconciler lease");
        }
    }
}

/// Pages through the sweep until it is complete. Returns false if it stopped early.
async fn sweep(shared: &WorkerState, quiet: Duration) -> bool {
    let mut pass = None;
    loop {
        if shared.stop_background.is_cancelled() {
            return false;
        }
        let page = match shared.reconciliation.sweep(quiet, pass, PAGE).await {
            Ok(p) => p,
            Err(e) => {
                shared.record(RunEvent::StoreFailed);
                tracing::warn!(error = %escaped(&e), "sweep failed");
                return false;
            }
        };
        pass = Some(page.pass);
        let n = page.due.len();
        if n == 0 && page.complete {
            return true;
        }
        let batch = Publish::group(page.due, shared.queue.message_limits());
        if n > 0 {
            if let Err(e) = shared.queue.publish(&batch).await {
                // They are stamped as notified; the next quiet period brings them back.
                tracing::warn!(error = %escaped(&e), events = n, "cannot publish reconciled notifications");
                return false;
            }
        }
        shared.record(RunEvent::Reconciled(n));
        tracing::debug!(events = n, "reconciler notified events");
        if page.complete {
            return true;
        }
    }
}

/// Frees the limit slots of runs whose lease lapsed (a dead worker's) and
/// notifies the events they woke, page by page.
async fn lapse(shared: &WorkerState) {
    loop {
        let woken = match shared.reconciliation.lapse_slots(PAGE).await {
            Ok(w) => w,
            Err(e) => {
                shared.record(RunEvent::StoreFailed);
                tracing::warn!(error = %escaped(&e), "cannot free lapsed limit slots");
                return;
            }
        };
        if woken.is_empty() {
            return;
        }
        let n = woken.len();
        tracing::debug!(events = n, "lapsed limit slots woke events");
        super::settle::wake(shared, woken).await;
        shared.record(RunEvent::Reconciled(n));
        if n < PAGE {
            return;
        }
    }
}

async fn purge(shared: &WorkerState) {
    // Retentions, not cut-offs: the store counts them back from its own
    // clock, so a worker whose clock is ahead purges nothing early.
    let dead = shared.config.dead_retention;
    let done = shared.config.done_retention.unwrap_or(Duration::ZERO);
    loop {
        match shared.reconciliation.purge(dead, done, PAGE).await {
            Ok(n) if (n as usize) < PAGE => return,
            Ok(_) => continue,
            Err(e) => {
                shared.record(RunEvent::StoreFailed);
                tracing::warn!(error = %escaped(&e), "purge failed");
                return;
            }
        }
    }
}
