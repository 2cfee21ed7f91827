//! The worker's decision, as a pure function of plain data.
//!
//! This file is DESIGN.md's decision table in code. A notification arrives;
//! the worker first tries the one-statement claim (due, pending, unleased or
//! expired, no rule). Only when that claims nothing does it load the event and
//! ask [`admit`] why. When a handler finishes, [`settle`] says what to write
//! and what to tell the queue. The runtime does the I/O around both.
//!
//! | step | condition | outcome | reply |
//! |---|---|---|---|
//! | EventLoad | no such event (or not pending) | [`Admission::Drop`] | ack |
//! | PauseCheck | a `block` rule matches | [`Admission::Drop`], event kept | ack |
//! | PauseCheck | a `pause` rule matches | [`Admission::Drop`], event kept | ack |
//! | DelayCheck | `run_at` in the future | [`Admission::Requeue`] | nack `run_at - now`, capped |
//! | HandlerCheck | no handler of that name here | [`Admission::Drop`], event kept; the reconciler re-offers it | ack |
//! | LockCheck | a live lease is held | [`Admission::Requeue`] | nack until expiry + jitter |
//! | LockCheck | expired or no lease, no attempts left | [`Admission::Bury`] | ack |
//! | LockCheck | no lease, or an expired one | [`Admission::Claim`] | |
//! | LockClaim | compare-and-set lost | [`claim_lost`] | nack, short |
//! | LockClaim | won | run, `attempt += 1` | extend while running |
//! | Process | done | [`Settlement::Delete`] (or archive) | ack |
//! | Process | failed, attempts left | [`Settlement::Retry`] | nack with the backoff |
//! | Process | failed, no attempts left / failed for good | [`Settlement::Dead`] | ack |
//! | Process | snoozed for `d` | [`Settlement::Snooze`], attempt given back | nack `d` |
//! | Process | cancelled by shutdown | [`Settlement::Snooze`] with 0 | nack, no delay |
//! | Process | lease lost | [`Settlement::Leave`]: write nothing | leave it |
//! | any | the store failed | [`store_failed`]: write nothing | nack, short |
//!
//! The `HandlerCheck` and the exhausted-`LockCheck` rows go beyond DESIGN.md;
//! `docs/semantics.md` says why.

use std::time::Duration;

use crate::handler::Outcome;
use crate::model::{Event, EventState, Millis, RuleMatch};
use crate::retry::RetryPolicy;

/// What the worker tells the queue about one notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Done with it: remove it from the queue.
    Ack,
    /// Deliver it again after this delay.
    Nack(Duration),
    /// Do nothing: another worker owns the event now, and the notification's
    /// deadline will lapse on its own.
    Leave,
}

/// The knobs of the decision. Defaults are documented on each field.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// Backoff between failed attempts.
    pub retry: RetryPolicy,
    /// The longest delay the queue can hold a message for (`None`: no limit).
    /// Longer delays bounce at this maximum until due.
    pub max_queue_delay: Option<Duration>,
    /// Delay after losing a compare-and-set claim. Default 100 ms.
    pub lost_claim_delay: Duration,
    /// Extra random wait after a live lease's expiry, so that the workers who
    /// saw it do not all arrive at once. Default up to 1 s.
    pub lease_jitter: Duration,
    /// Delay before a notification whose store step failed comes back. Default 1 s.
    pub store_retry_delay: Duration,
    /// Keep done events (archive) instead of deleting them.
    pub keep_done: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            retry: RetryPolicy::default(),
            max_queue_delay: None,
            lost_claim_delay: Duration::from_millis(100),
            lease_jitter: Duration::from_secs(1),
            store_retry_delay: Duration::from_secs(1),
            keep_done: false,
        }
    }
}

impl Policy {
    fn queue_delay(&self, d: Duration) -> Duration {
        match self.max_queue_delay {
            Some(max) => d.min(max),
            None => d,
        }
    }
}

/// Everything the worker learned about an event it could not claim.
#[derive(Clone, Copy, Debug)]
pub struct Inspection<'a> {
    /// The event as loaded, if it exists.
    pub event: Option<&'a Event>,
    /// The rules that match it.
    pub rules: RuleMatch,
    /// Whether this worker has a handler of the event's name.
    pub handler_known: bool,
    /// The store's clock at the time of loading.
    pub now: Millis,
}

/// Why a notification is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// No such event: it is done or gone.
    Missing,
    /// The event is dead or archived; only an operator retry brings it back.
    Finished,
    /// An operator's block holds it; unblock re-notifies.
    Blocked,
    /// The tenant's pause holds it; unpause re-notifies.
    Paused,
    /// This worker has no handler of that name. The event stays stored and
    /// the reconciler offers it again after its quiet period. (Requeueing
    /// instead would pile up notifications: the sweep adds one every quiet
    /// period while the first keeps circulating.)
    UnknownHandler,
}

/// Why a notification goes back to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequeueReason {
    /// `run_at` is in the future.
    NotYetDue,
    /// A live lease is held: the holder may still fail.
    Leased,
    /// Another worker won the claim.
    LostClaim,
    /// The store failed.
    StoreFailed,
}

/// The decision about a notification before any handler runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Forget the notification; the event (if any) stays as it is.
    Drop(DropReason),
    /// Offer the notification again after `delay`.
    Requeue {
        /// How long until it comes back.
        delay: Duration,
        /// Why.
        reason: RequeueReason,
    },
    /// Take the lease by compare-and-set.
    Claim,
    /// The last attempt's worker died (its lease expired): the event has no
    /// attempts left, so it goes dead instead of running again.
    Bury {
        /// The error to record.
        error: String,
    },
}

impl Admission {
    /// What to tell the queue.
    pub fn reply(&self) -> Reply {
        match self {
            Admission::Drop(_) | Admission::Bury { .. } => Reply::Ack,
            Admission::Requeue { delay, .. } => Reply::Nack(*delay),
            // The caller claims, then follows `claim_lost` or runs the handler.
            Admission::Claim => Reply::Leave,
        }
    }
}

/// EventLoad, PauseCheck, DelayCheck, HandlerCheck and LockCheck.
///
/// `jitter` is a uniform sample in `[0, 1)` from the caller.
pub fn admit(seen: Inspection<'_>, policy: &Policy, jitter: f64) -> Admission {
    // EventLoad
    let Some(event) = seen.event else {
        return Admission::Drop(DropReason::Missing);
    };
    if event.state != EventState::Pending {
        return Admission::Drop(DropReason::Finished);
    }
    // PauseCheck: block is stronger, so it is checked (and reported) first.
    if seen.rules.blocked {
        return Admission::Drop(DropReason::Blocked);
    }
    if seen.rules.paused {
        return Admission::Drop(DropReason::Paused);
    }
    // DelayCheck
    if event.run_at > seen.now {
        return Admission::Requeue {
            delay: policy.queue_delay(seen.now.until(event.run_at)),
            reason: RequeueReason::NotYetDue,
        };
    }
    // HandlerCheck
    if !seen.handler_known {
        return Admission::Drop(DropReason::UnknownHandler);
    }
    // LockCheck
    if let Some(lease) = event.lease {
        if lease.expires_at > seen.now {
            let spread = policy.lease_jitter.mul_f64(jitter.clamp(0.0, 1.0));
            return Admission::Requeue {
                delay: policy.queue_delay(seen.now.until(lease.expires_at) + spread),
                reason: RequeueReason::Leased,
            };
        }
    }
    if event.attempt >= event.max_attempts {
        return Admission::Bury {
            error: format!(
                "attempt {}/{} did not finish: its worker stopped renewing the lease",
                event.attempt, event.max_attempts
            ),
        };
    }
    Admission::Claim
}

/// LockClaim, lost: another worker won the compare-and-set.
pub fn claim_lost(policy: &Policy) -> Admission {
    Admission::Requeue {
        delay: policy.lost_claim_delay,
        reason: RequeueReason::LostClaim,
    }
}

/// Any step: the store failed. Write nothing; the queue redelivers.
pub fn store_failed(policy: &Policy) -> Admission {
    Admission::Requeue {
        delay: policy.store_retry_delay,
        reason: RequeueReason::StoreFailed,
    }
}

/// How a run ended, as the runtime saw it.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEnd {
    /// The handler returned.
    Returned(Outcome),
    /// Shutdown cancelled it after the grace period.
    Cancelled,
    /// A lease renewal failed; the handler was cancelled.
    LeaseLost,
}

/// What the run being settled looked like when it was claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// The attempt number of this run (after the claim's `+1`).
    pub attempt: u32,
    /// The event's attempt limit.
    pub max_attempts: u32,
}

/// The write that ends a run. Every variant but `Leave` is fenced by the
/// run's lease token.
#[derive(Clone, Debug, PartialEq)]
pub enum Settlement {
    /// Done: delete the event.
    Delete,
    /// Done, with done-retention: keep it as `done`.
    Archive,
    /// Failed with attempts left: release the lease, run again after `wait`.
    Retry {
        /// How long until the next run (by the store's clock).
        wait: Duration,
        /// The error to record.
        error: String,
        /// The queue delay for the notification.
        delay: Duration,
    },
    /// No attempts left, or failed for good: keep as `dead`.
    Dead {
        /// The error to record.
        error: String,
    },
    /// Not now: release, run again after `wait`, give the attempt back.
    Snooze {
        /// How long until the next run (by the store's clock).
        wait: Duration,
        /// The queue delay for the notification.
        delay: Duration,
    },
    /// The lease is someone else's now: write nothing.
    Leave,
}

impl Settlement {
    /// What to tell the queue once the write succeeded.
    pub fn reply(&self) -> Reply {
        match self {
            Settlement::Delete | Settlement::Archive | Settlement::Dead { .. } => Reply::Ack,
            Settlement::Retry { delay, .. } | Settlement::Snooze { delay, .. } => {
                Reply::Nack(*delay)
            }
            Settlement::Leave => Reply::Leave,
        }
    }
}

/// Process: what to write after a run. `jitter` is a uniform sample in `[0, 1)`.
///
/// Waits are relative: the store adds them to its own clock, the one that
/// also judges leases.
pub fn settle(run: Claimed, end: RunEnd, policy: &Policy, jitter: f64) -> Settlement {
    let outcome = match end {
        RunEnd::LeaseLost => return Settlement::Leave,
        RunEnd::Cancelled => Outcome::Snooze(Duration::ZERO),
        RunEnd::Returned(outcome) => outcome,
    };
    match outcome {
        Outcome::Done if policy.keep_done => Settlement::Archive,
        Outcome::Done => Settlement::Delete,
        Outcome::Snooze(d) => Settlement::Snooze {
            wait: d,
            delay: policy.queue_delay(d),
        },
        Outcome::Fail(error) => Settlement::Dead {
            error: format!(
                "attempt {}/{} failed for good: {error}",
                run.attempt, run.max_attempts
            ),
        },
        Outcome::Retry { error, .. } if run.attempt >= run.max_attempts => Settlement::Dead {
            error: format!(
                "attempt {}/{} failed: {error}",
                run.attempt, run.max_attempts
            ),
        },
        Outcome::Retry { error, after } => {
            let wait = after.unwrap_or_else(|| policy.retry.backoff(run.attempt, jitter));
            Settlement::Retry {
                wait,
                error: format!(
                    "attempt {}/{} failed: {error}",
                    run.attempt, run.max_attempts
                ),
                delay: policy.queue_delay(wait),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! One test per row of the decision table, named after the row.
    use super::*;
    use crate::model::{EventId, Lease, LeaseToken};

    const NOW: Millis = Millis(1_000_000);

    fn event() -> Event {
        Event {
            id: EventId::new(),
            tenant: "acme".into(),
            handler: "send_email".into(),
            payload: "{}".into(),
            state: EventState::Pending,
            run_at: NOW,
            attempt: 0,
            max_attempts: 3,
            lease: None,
            last_error: None,
            idempotency_key: None,
            created_at: NOW,
            updated_at: NOW,
        }
    }

    fn seen(event: Option<&Event>) -> Inspection<'_> {
        Inspection {
            event,
            rules: RuleMatch::default(),
            handler_known: true,
            now: NOW,
        }
    }

    fn policy() -> Policy {
        Policy {
            retry: RetryPolicy {
                jitter: 0.0,
                ..RetryPolicy::default()
            },
            ..Policy::default()
        }
    }

    #[test]
    fn event_missing_is_dropped() {
        let a = admit(seen(None), &policy(), 0.5);
        assert_eq!(a, Admission::Drop(DropReason::Missing));
        assert_eq!(a.reply(), Reply::Ack);
    }

    #[test]
    fn finished_event_is_dropped() {
        for state in [EventState::Dead, EventState::Done] {
            let e = Event { state, ..event() };
            let a = admit(seen(Some(&e)), &policy(), 0.5);
            assert_eq!(a, Admission::Drop(DropReason::Finished));
            assert_eq!(a.reply(), Reply::Ack);
        }
    }

    #[test]
    fn blocked_is_dropped_and_kept() {
        let e = event();
        let mut s = seen(Some(&e));
        s.rules = RuleMatch {
            blocked: true,
            paused: false,
        };
        let a = admit(s, &policy(), 0.5);
        assert_eq!(a, Admission::Drop(DropReason::Blocked));
        assert_eq!(a.reply(), Reply::Ack);
    }

    #[test]
    fn paused_is_dropped_and_kept() {
        let e = event();
        let mut s = seen(Some(&e));
        s.rules = RuleMatch {
            blocked: false,
            paused: true,
        };
        let a = admit(s, &policy(), 0.5);
        assert_eq!(a, Admission::Drop(DropReason::Paused));
        assert_eq!(a.reply(), Reply::Ack);
    }

    #[test]
    fn block_wins_over_pause() {
        let e = event();
        let mut s = seen(Some(&e));
        s.rules = RuleMatch {
            blocked: true,
            paused: true,
        };
        assert_eq!(
            admit(s, &policy(), 0.5),
            Admission::Drop(DropReason::Blocked)
        );
    }

    #[test]
    fn rules_are_checked_before_the_delay() {
        let e = Event {
            run_at: NOW.plus(Duration::from_secs(60)),
            ..event()
        };
        let mut s = seen(Some(&e));
        s.rules.paused = true;
        assert_eq!(
            admit(s, &policy(), 0.5),
            Admission::Drop(DropReason::Paused)
        );
    }

    #[test]
    fn not_yet_due_requeues_with_remaining_delay() {
        let e = Event {
            run_at: NOW.plus(Duration::from_secs(42)),
            ..event()
        };
        let a = admit(seen(Some(&e)), &policy(), 0.5);
        assert_eq!(
            a,
            Admission::Requeue {
                delay: Duration::from_secs(42),
                reason: RequeueReason::NotYetDue
            }
        );
        assert_eq!(a.reply(), Reply::Nack(Duration::from_secs(42)));
    }

    #[test]
    fn not_yet_due_delay_is_capped_at_the_queue_maximum() {
        let e = Event {
            run_at: NOW.plus(Duration::from_secs(3600)),
            ..event()
        };
        let p = Policy {
            max_queue_delay: Some(Duration::from_secs(600)),
            ..policy()
        };
        assert_eq!(
            admit(seen(Some(&e)), &p, 0.5).reply(),
            Reply::Nack(Duration::from_secs(600))
        );
    }

    #[test]
    fn unknown_handler_is_dropped_and_kept() {
        let e = event();
        let mut s = seen(Some(&e));
        s.handler_known = false;
        let a = admit(s, &policy(), 0.5);
        assert_eq!(a, Admission::Drop(DropReason::UnknownHandler));
        assert_eq!(a.reply(), Reply::Ack);
    }

    #[test]
    fn live_lease_requeues_until_expiry() {
        let e = Event {
            lease: Some(Lease {
                token: LeaseToken::new(),
                expires_at: NOW.plus(Duration::from_secs(10)),
            }),
            attempt: 1,
            ..event()
        };
        let a = admit(seen(Some(&e)), &policy(), 0.5);
        assert_eq!(
            a,
            Admission::Requeue {
                delay: Duration::from_millis(10_500),
                reason: RequeueReason::Leased
            }
        );
        // Jitter only ever adds, so nobody comes back before the expiry.
        let Admission::Requeue { delay, .. } = admit(seen(Some(&e)), &policy(), 0.0) else {
            panic!("expected a requeue");
        };
        assert_eq!(delay, Duration::from_secs(10));
    }

    #[test]
    fn expired_lease_is_claimed() {
        let e = Event {
            lease: Some(Lease {
                token: LeaseToken::new(),
                expires_at: NOW.minus(Duration::from_millis(1)),
            }),
            attempt: 1,
            ..event()
        };
        assert_eq!(admit(seen(Some(&e)), &policy(), 0.5), Admission::Claim);
    }

    #[test]
    fn no_lease_is_claimed() {
        let e = event();
        assert_eq!(admit(seen(Some(&e)), &policy(), 0.5), Admission::Claim);
    }

    #[test]
    fn expired_lease_without_attempts_left_is_buried() {
        let e = Event {
            lease: Some(Lease {
                token: LeaseToken::new(),
                expires_at: NOW.minus(Duration::from_secs(1)),
            }),
            attempt: 3,
            ..event()
        };
        let a = admit(seen(Some(&e)), &policy(), 0.5);
        assert!(matches!(a, Admission::Bury { ref error } if error.contains("3/3")));
        assert_eq!(a.reply(), Reply::Ack);
    }

    #[test]
    fn lost_claim_requeues() {
        let a = claim_lost(&policy());
        assert_eq!(
            a,
            Admission::Requeue {
                delay: Duration::from_millis(100),
                reason: RequeueReason::LostClaim
            }
        );
        assert_eq!(a.reply(), Reply::Nack(Duration::from_millis(100)));
    }

    fn run(attempt: u32) -> Claimed {
        Claimed {
            attempt,
            max_attempts: 3,
        }
    }

    #[test]
    fn done_deletes() {
        let s = settle(run(1), RunEnd::Returned(Outcome::Done), &policy(), 0.5);
        assert_eq!(s, Settlement::Delete);
        assert_eq!(s.reply(), Reply::Ack);
    }

    #[test]
    fn done_with_retention_archives() {
        let p = Policy {
            keep_done: true,
            ..policy()
        };
        let s = settle(run(1), RunEnd::Returned(Outcome::Done), &p, 0.5);
        assert_eq!(s, Settlement::Archive);
        assert_eq!(s.reply(), Reply::Ack);
    }

    #[test]
    fn failure_with_attempts_left_retries_with_backoff() {
        let s = settle(
            run(2),
            RunEnd::Returned(Outcome::retry("boom")),
            &policy(),
            0.5,
        );
        assert_eq!(
            s,
            Settlement::Retry {
                wait: Duration::from_secs(2),
                error: "attempt 2/3 failed: boom".into(),
                delay: Duration::from_secs(2),
            }
        );
        assert_eq!(s.reply(), Reply::Nack(Duration::from_secs(2)));
    }

    #[test]
    fn failure_with_retry_after_uses_the_handlers_delay() {
        let out = Outcome::Retry {
            error: "rate limited".into(),
            after: Some(Duration::from_secs(7)),
        };
        let s = settle(run(1), RunEnd::Returned(out), &policy(), 0.5);
        assert!(matches!(s, Settlement::Retry { wait, .. } if wait == Duration::from_secs(7)));
    }

    #[test]
    fn failure_without_attempts_left_goes_dead() {
        let s = settle(
            run(3),
            RunEnd::Returned(Outcome::retry("boom")),
            &policy(),
            0.5,
        );
        assert_eq!(
            s,
            Settlement::Dead {
                error: "attempt 3/3 failed: boom".into()
            }
        );
        assert_eq!(s.reply(), Reply::Ack);
    }

    #[test]
    fn failure_for_good_goes_dead_at_once() {
        let s = settle(
            run(1),
            RunEnd::Returned(Outcome::fail("bad input")),
            &policy(),
            0.5,
        );
        assert!(matches!(s, Settlement::Dead { ref error } if error.contains("failed for good")));
    }

    #[test]
    fn snooze_gives_the_attempt_back() {
        let s = settle(
            run(3),
            RunEnd::Returned(Outcome::Snooze(Duration::from_secs(5))),
            &policy(),
            0.5,
        );
        // Snooze at the last attempt still snoozes: the attempt is given back.
        assert_eq!(
            s,
            Settlement::Snooze {
                wait: Duration::from_secs(5),
                delay: Duration::from_secs(5)
            }
        );
        assert_eq!(s.reply(), Reply::Nack(Duration::from_secs(5)));
    }

    #[test]
    fn shutdown_cancel_snoozes_zero() {
        let s = settle(run(1), RunEnd::Cancelled, &policy(), 0.5);
        assert_eq!(
            s,
            Settlement::Snooze {
                wait: Duration::ZERO,
                delay: Duration::ZERO
            }
        );
        assert_eq!(s.reply(), Reply::Nack(Duration::ZERO));
    }

    #[test]
    fn lost_lease_cancels_and_writes_nothing() {
        let s = settle(run(1), RunEnd::LeaseLost, &policy(), 0.5);
        assert_eq!(s, Settlement::Leave);
        assert_eq!(s.reply(), Reply::Leave);
    }

    #[test]
    fn store_error_nacks() {
        let a = store_failed(&policy());
        assert_eq!(a.reply(), Reply::Nack(Duration::from_secs(1)));
        assert!(matches!(
            a,
            Admission::Requeue {
                reason: RequeueReason::StoreFailed,
                ..
            }
        ));
    }
}
