//! The scheduler: when this worker is elected (role `scheduler`), emit the
//! due occurrences of every schedule, once each (docs/schedules.md).
//!
//! Each tick is one query for the due schedules (judged by the store's
//! clock), then per due schedule one [`Schedules::fire_schedule`]: the cursor's
//! compare-and-set and the occurrences' events in one transaction. Two
//! leaders for a moment (a lease that lapsed under a stalled leader) both
//! fire; one compare-and-set wins. The new events are then published like
//! an emit's; a lost publish is the reconciler's to repair, as for any
//! event.
//!
//! [`Schedules::fire_schedule`]: crate::backend::Schedules::fire_schedule

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::telemetry::RunEvent;
use super::WorkerState;
use crate::backend::Scheduled;
use crate::escape::escaped;
use crate::model::Emitted;
use crate::queue::Publish;
use crate::schedule::{fire, ScheduleFiring};

/// The leader row's name.
const ROLE: &str = "scheduler";
/// Due schedules read per query.
const PAGE: usize = 500;
/// The shortest wait between two ticks, and a follower's jitter.
const MIN_PASS: Duration = Duration::from_millis(20);

pub(super) async fn schedule_loop(shared: Arc<WorkerState>) {
    let cfg = &shared.config;
    let lead_for = cfg.lease;
    // The leader renews its lease every third of it, not every tick, so an
    // idle leader sends one query per tick plus one per lease / 3.
    let renew_every = cfg.lease / 3;
    let every = cfg.schedule_every.max(MIN_PASS);
    let mut leading = false;
    let mut renewed: Option<Instant> = None;
    loop {
        let due_for_renewal = renewed.is_none_or(|at| at.elapsed() >= renew_every);
        let wait = if leading && !due_for_renewal {
            tick(&shared).await;
            every
        } else {
            match shared.election.lead(ROLE, &cfg.name, lead_for).await {
                Ok(l) => {
                    if l.leading != leading {
                        tracing::info!(worker = %cfg.name, leading = l.leading, "scheduler leadership changed");
                        leading = l.leading;
                    }
                    if leading {
                        renewed = Some(Instant::now());
                        tick(&shared).await;
                        every
                    } else {
                        renewed = None;
                        // As the reconciler: ask again as the holder's lease
                        // lapses, one query per lease while following.
                        let jitter = MIN_PASS.mul_f64(WorkerState::jitter());
                        l.left.max(MIN_PASS) + jitter
                    }
                }
                Err(e) => {
                    shared.record(RunEvent::StoreFailed);
                    tracing::warn!(error = %escaped(&e), "cannot take or keep the scheduler lease");
                    // Not renewed: stop firing until the lease is ours again.
                    leading = false;
                    renewed = None;
                    every
                }
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shared.stop_background.cancelled() => break,
        }
    }
    if leading {
        if let Err(e) = shared.election.resign(ROLE, &cfg.name).await {
            tracing::warn!(error = %escaped(&e), "cannot resign the scheduler lease");
        }
    }
}

/// One tick: every due schedule fired, the new events published.
async fn tick(shared: &WorkerState) {
    let grace = shared.config.schedule_grace;
    loop {
        if shared.stop_background.is_cancelled() {
            return;
        }
        let due = match shared.schedules.due_schedules(PAGE).await {
            Ok(d) => d,
            Err(e) => {
                shared.record(RunEvent::StoreFailed);
                tracing::warn!(error = %escaped(&e), "cannot read the due schedules");
                return;
            }
        };
        let full = due.schedules.len() >= PAGE;
        let mut created: Vec<Scheduled> = Vec::new();
        let mut progressed = false;
        for s in &due.schedules {
            let f = fire(s, due.now, grace);
            if f.next_at == s.next_at && f.occurrences.is_empty() {
                continue;
            }
            let firing = ScheduleFiring {
                tenant: s.tenant.clone(),
                name: s.name.clone(),
                expected_next_at: s.next_at,
                next_at: f.next_at,
                events: f
                    .occurrences
                    .iter()
                    .map(|&t| s.occurrence_event(t))
                    .collect(),
            };
            match shared.schedules.fire_schedule(&firing).await {
                Ok(Some(emitted)) => {
                    progressed = true;
                    if f.dropped_missed {
                        tracing::info!(tenant = %escaped(&s.tenant), schedule = %escaped(&s.name), policy = ?s.missed, from = s.next_at.0, "missed occurrences passed over by the schedule's policy");
                    }
                    tracing::debug!(tenant = %escaped(&s.tenant), schedule = %escaped(&s.name), occurrences = emitted.len(), next_at = f.next_at.0, "schedule fired");
                    shared.record(RunEvent::Scheduled(emitted.len()));
                    created.extend(emitted.into_iter().filter_map(|e| match e {
                        Emitted::Created(id) => Some(Scheduled::due(s.tenant.clone(), id)),
                        Emitted::Existing(_) => None,
                    }));
                }
                Ok(None) => {
                    tracing::debug!(tenant = %escaped(&s.tenant), schedule = %escaped(&s.name), "schedule fired by another leader");
                }
                Err(e) => {
                    shared.record(RunEvent::StoreFailed);
                    tracing::warn!(error = %escaped(&e), tenant = %escaped(&s.tenant), schedule = %escaped(&s.name), "cannot fire the schedule");
                }
            }
        }
        if !created.is_empty() {
            let n = created.len();
            let batch = Publish::group(created, shared.queue.message_limits());
            if let Err(e) = shared.queue.publish(&batch).await {
                // Stored, and stamped notified at their run_at: the
                // reconciler's sweep notifies them after its quiet period.
                tracing::warn!(error = %escaped(&e), events = n, "cannot publish scheduled events' notifications");
            }
        }
        if !full || !progressed {
            return;
        }
    }
}
