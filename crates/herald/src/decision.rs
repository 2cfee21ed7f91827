//! The worker's decision, as pure functions of plain data that return whole answers.
//!
//! This file is docs/semantics.md's decision table in code. A notification arrives;
//! the worker first tries the one-statement claim (`EventStore::claim`: due,
//! pending, unleased or expired, attempts left, a known handler, no rule,
//! room in every limit that counts it).
//! Only when that claims nothing does it load the event and ask [`admit`]
//! why. When a handler finishes, [`settle`] says what to write. Each answer
//! is a [`Plan`]: the write to make (if any) and, for each way the write can
//! turn out, the [`Reply`] to the queue and the [`Tally`] it counts as. The
//! runtime (`worker/`) carries plans out and decides nothing.
//!
//! | step | condition | outcome | reply | decided in |
//! |---|---|---|---|---|
//! | EventLoad | no such event (or not pending) | drop | ack | [`admit`]: [`Verdict::Drop`] |
//! | PauseCheck | a `block` rule matches | drop, event kept | ack | [`admit`]: [`Verdict::Drop`] |
//! | PauseCheck | a `pause` rule matches | drop, event kept | ack | [`admit`]: [`Verdict::Drop`] |
//! | LimitCheck | a limit that counts it is full | parked by the claim; a freed slot wakes it | ack | the claim statement; [`admit`]: [`Verdict::Drop`] |
//! | DelayCheck | `run_at` in the future | requeue | nack `run_at - now`, capped | [`admit`]: [`Verdict::Requeue`] |
//! | HandlerCheck | no handler of that name here | drop, event kept; the reconciler re-offers it | ack | [`admit`]: [`Verdict::Drop`] |
//! | LockCheck | a live lease is held | requeue | nack until expiry + jitter | [`admit`]: [`Verdict::Requeue`] |
//! | LockCheck | expired or no lease, no attempts left | bury: fenced move to dead | ack; fence refused: as a lost claim | [`admit`]: [`Verdict::Bury`] |
//! | LockCheck | no lease, or an expired one | claim | | the claim statement (`EventStore::claim`) |
//! | LockClaim | compare-and-set lost | requeue | nack, short | [`admit`]: [`Verdict::Claim`] |
//! | LockClaim | won | run, `attempt += 1` | extend while running | the claim statement; runs in `worker/run.rs` |
//! | Process | done | delete (or archive) | ack | [`settle`] |
//! | Process | failed, attempts left | release with the backoff | nack with the backoff | [`settle`] |
//! | Process | failed, no attempts left / failed for good | bury | ack | [`settle`] |
//! | Process | snoozed for `d` | release, attempt given back | nack `d` | [`settle`] |
//! | Process | cancelled by shutdown | release with 0, attempt given back | nack, no delay | [`settle`] |
//! | Process | lease lost | write nothing | leave it | [`settle`] |
//! | Process | the fence refused the write | nothing more | leave it | [`settle`]: [`Write::refused`] |
//! | any | the store failed | write nothing | nack, short | [`store_failed`], [`Write::failed`] |
//!
//! A notification may name several events (a batched notification). Each
//! event gets its own reply by the table above; [`close`] folds them into
//! the one answer the message gets, once every event has its reply:
//!
//! | the events' replies | the message |
//! |---|---|
//! | any leave | leave it (it comes back after its deadline, and each event is looked at again) |
//! | all ack | ack |
//! | all nack | nack with the shortest delay |
//! | some nack, the rest ack | publish a notification of one event per nack, with its delay, then ack |
//!
//! "LockClaim, lost" is [`Verdict::Claim`]: [`admit`] is asked only about
//! events the claim statement just refused, so an event it finds claimable
//! changed in between: another worker won it. The `HandlerCheck` and the
//! exhausted-`LockCheck` rows are herald's own; `docs/semantics.md` says why.

use std::time::Duration;

use crate::backend::{Finish, LeaseRef, Settle, Settled, StoreResult};
use crate::handler::Outcome;
use crate::limit::LimitWait;
use crate::model::{Event, EventId, EventState, Millis, RuleMatch};
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

/// The one answer to the queue for a message, from its events' replies:
/// see [`close`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Close {
    /// Reply so for the whole message.
    Reply(Reply),
    /// Publish a notification of each of these events, after its delay;
    /// once published, ack the message (if the publish fails, leave it).
    RequeueThenAck(Vec<(EventId, Duration)>),
}

/// Process: how to answer a message once each of its events has its reply
/// (the table in this module's documentation). A message of one event gets
/// that event's reply.
pub fn close(replies: &[(EventId, Reply)]) -> Close {
    if replies.iter().any(|(_, r)| *r == Reply::Leave) {
        return Close::Reply(Reply::Leave);
    }
    let requeue: Vec<(EventId, Duration)> = replies
        .iter()
        .filter_map(|&(id, r)| match r {
            Reply::Nack(d) => Some((id, d)),
            _ => None,
        })
        .collect();
    match requeue.iter().map(|&(_, d)| d).min() {
        None => Close::Reply(Reply::Ack),
        Some(shortest) if requeue.len() == replies.len() => Close::Reply(Reply::Nack(shortest)),
        Some(_) => Close::RequeueThenAck(requeue),
    }
}

/// How a run's end was written to the store, as told to a
/// [`RunObserver`](crate::RunObserver) and counted in the worker's stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunSettled {
    /// The handler finished: the event was deleted or archived.
    Done,
    /// The attempt failed and the event will run again.
    Retried,
    /// The attempt failed and the event moved to dead.
    Dead,
    /// The handler snoozed; the attempt was given back.
    Snoozed,
    /// Shutdown cancelled the run; the event was released to run again.
    Cancelled,
}

/// What an answer counts as in the worker's stats, metrics and observer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tally {
    /// Nothing: a run whose settle call failed is counted only as a store error.
    Nothing,
    /// A notification dropped without a run.
    Dropped,
    /// A notification put back on the queue without a run.
    Requeued,
    /// An event moved to dead without a run because its last attempt's
    /// worker died: a dropped notification, a failed attempt and a death.
    Buried,
    /// A run's end that the store accepted.
    Settled(RunSettled),
    /// A run whose lease was lost while it ran: nothing written.
    LeaseLost,
    /// A run's end that the store refused: the lease is someone else's now.
    FencedOut,
}

/// A reply to the queue and what it counts as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// What to tell the queue.
    pub reply: Reply,
    /// What to count.
    pub tally: Tally,
}

/// A fenced store write and the answer for each way it can turn out.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// What to write.
    pub settle: Settle,
    /// The store took the write.
    pub held: Answer,
    /// The store refused it: its fence (the lease token) no longer matched.
    pub refused: Answer,
    /// The store failed: nothing was written.
    pub failed: Answer,
}

impl Write {
    /// The answer for this write as the `i`th of a batch, as the store's
    /// `held` (one flag per write) says it turned out.
    pub fn answer(&self, settled: &StoreResult<Settled>, i: usize) -> Answer {
        match settled {
            Ok(s) if s.held.get(i) == Some(&true) => self.held,
            Ok(_) => self.refused,
            Err(_) => self.failed,
        }
    }
}

/// A decision's whole answer, for the runtime to carry out.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Write nothing; answer this.
    Answer(Answer),
    /// Make this write, then answer as it turned out.
    Write(Write),
}

/// The knobs of the decision. Defaults are documented on each field.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    /// Backoff between failed attempts.
    pub retry: RetryPolicy,
    /// The longest delay the queue can hold a message for (`None`: no limit).
    /// Longer delays bounce at this maximum until due. Set when a worker
    /// starts, from its queue.
    pub(crate) max_queue_delay: Option<Duration>,
    /// Delay after losing a compare-and-set claim. Default 100 ms.
    pub lost_claim_delay: Duration,
    /// Extra random wait after a live lease's expiry, so that the workers who
    /// saw it do not all arrive at once. Default up to 1 s.
    pub lease_jitter: Duration,
    /// Delay before a notification whose store step failed comes back. Default 1 s.
    pub store_retry_delay: Duration,
    /// Keep done events (archive) instead of deleting them. Set when a
    /// worker starts, from [`WorkerConfig::done_retention`](crate::WorkerConfig::done_retention).
    pub(crate) keep_done: bool,
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

#[cfg(feature = "testkit")]
impl Policy {
    /// This policy with what a worker decides when it starts: its queue's
    /// longest delay and whether done events are kept (for property tests).
    pub fn decided(mut self, max_queue_delay: Option<Duration>, keep_done: bool) -> Self {
        self.max_queue_delay = max_queue_delay;
        self.keep_done = keep_done;
        self
    }

    /// The queue's longest delay, as decided at start.
    pub fn max_queue_delay(&self) -> Option<Duration> {
        self.max_queue_delay
    }

    /// Whether done events are kept, as decided at start.
    pub fn keep_done(&self) -> bool {
        self.keep_done
    }
}

impl Policy {
    fn queue_delay(&self, d: Duration) -> Duration {
        match self.max_queue_delay {
            Some(max) => d.min(max),
            None => d,
        }
    }

    fn requeue(&self, delay: Duration) -> Answer {
        Answer {
            reply: Reply::Nack(self.queue_delay(delay)),
            tally: Tally::Requeued,
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
    /// The full limit that holds it, if one does (the claim parked it).
    pub waiting: Option<&'a LimitWait>,
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
    /// A full limit holds it: the claim parked it, and the settle that
    /// frees a slot of the limit (or the reconciler, when a run's slot
    /// lapses) wakes it.
    Limited,
    /// This worker has no handler of that name. The event stays stored and
    /// the reconciler offers it again after its quiet period. (Requeueing
    /// instead would pile up notifications: the sweep adds one every quiet
    /// period while the first keeps circulating.)
    UnknownHandler,
}

/// Why a notification goes back to the queue without a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequeueReason {
    /// `run_at` is in the future.
    NotYetDue,
    /// A live lease is held: the holder may still fail.
    Leased,
}

/// Which row of the table [`admit`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forget the notification; the event (if any) stays as it is.
    Drop(DropReason),
    /// Offer the notification again later.
    Requeue(RequeueReason),
    /// Claimable. [`admit`] is asked only after the claim statement refused
    /// the event, so it changed in between: another worker won the claim.
    Claim,
    /// The last attempt's worker died (its lease expired): the event has no
    /// attempts left, so it goes dead instead of running again.
    Bury,
}

/// The answer about a notification the claim statement did not take.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    /// The row of the table that decided.
    pub verdict: Verdict,
    /// What to carry out.
    pub plan: Plan,
}

/// EventLoad, PauseCheck, DelayCheck, HandlerCheck, LockCheck and LockClaim
/// lost, for a notification the claim statement did not take.
///
/// `jitter` is a uniform sample in `[0, 1)` from the caller.
pub fn admit(seen: Inspection<'_>, policy: &Policy, jitter: f64) -> Admission {
    let answer = |verdict, answer| Admission {
        verdict,
        plan: Plan::Answer(answer),
    };
    let drop = |reason| {
        let ack = Answer {
            reply: Reply::Ack,
            tally: Tally::Dropped,
        };
        answer(Verdict::Drop(reason), ack)
    };
    // EventLoad
    let Some(event) = seen.event else {
        return drop(DropReason::Missing);
    };
    if event.state != EventState::Pending {
        return drop(DropReason::Finished);
    }
    // PauseCheck: block is stronger, so it is checked (and reported) first.
    if seen.rules.blocked {
        return drop(DropReason::Blocked);
    }
    if seen.rules.paused {
        return drop(DropReason::Paused);
    }
    // LimitCheck: the claim statement parked it.
    if seen.waiting.is_some() {
        return drop(DropReason::Limited);
    }
    // DelayCheck
    if event.run_at > seen.now {
        let requeue = policy.requeue(seen.now.until(event.run_at));
        return answer(Verdict::Requeue(RequeueReason::NotYetDue), requeue);
    }
    // HandlerCheck
    if !seen.handler_known {
        return drop(DropReason::UnknownHandler);
    }
    // LockCheck
    if let Some(lease) = event.lease {
        if lease.expires_at > seen.now {
            let spread = policy.lease_jitter.mul_f64(jitter.clamp(0.0, 1.0));
            let requeue = policy.requeue(seen.now.until(lease.expires_at) + spread);
            return answer(Verdict::Requeue(RequeueReason::Leased), requeue);
        }
    }
    if event.attempt >= event.max_attempts {
        return bury(event, policy);
    }
    // LockClaim, lost
    answer(Verdict::Claim, lost_claim(policy))
}

/// LockCheck with no attempts left: move the event to dead without a run.
fn bury(event: &Event, policy: &Policy) -> Admission {
    let error = format!(
        "attempt {}/{} did not finish: its worker stopped renewing the lease",
        event.attempt, event.max_attempts
    );
    Admission {
        verdict: Verdict::Bury,
        plan: Plan::Write(Write {
            // Fenced by the expired lease: a worker that claims the event in
            // between makes the store refuse this write.
            settle: Settle {
                id: event.id,
                token: event.lease.map(|l| l.token),
                finish: Finish::Bury { error },
            },
            held: Answer {
                reply: Reply::Ack,
                tally: Tally::Buried,
            },
            refused: lost_claim(policy),
            failed: store_failed(policy),
        }),
    }
}

/// LockClaim, lost: another worker won the compare-and-set.
fn lost_claim(policy: &Policy) -> Answer {
    Answer {
        reply: Reply::Nack(policy.queue_delay(policy.lost_claim_delay)),
        tally: Tally::Requeued,
    }
}

/// Any step before a run: the store failed. Write nothing; the queue redelivers.
pub fn store_failed(policy: &Policy) -> Answer {
    Answer {
        reply: Reply::Nack(policy.queue_delay(policy.store_retry_delay)),
        tally: Tally::Requeued,
    }
}

/// How a run ended, as the runtime saw it: the input of [`settle`].
///
/// It wraps the handler's [`Outcome`] rather than replacing it: `Outcome` is
/// what a handler may answer (public API), while a run can also end in ways
/// no handler answers (cancelled by shutdown, lease lost). The store's
/// [`Finish`] is kept apart too: it is the store's vocabulary, free of
/// attempts and policy. [`settle`] is the one mapping from this to that.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEnd {
    /// The handler returned.
    Returned(Outcome),
    /// Shutdown cancelled it after the grace period.
    Cancelled,
    /// A lease renewal failed; the handler was cancelled.
    LeaseLost,
}

impl RunEnd {
    /// The handler's own error text, for a failed run.
    pub fn error(&self) -> Option<&str> {
        match self {
            RunEnd::Returned(Outcome::Retry { error, .. } | Outcome::Fail(error)) => Some(error),
            _ => None,
        }
    }
}

/// The run being settled, as it was claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// The event and the lease token of this run: every write is fenced by it.
    pub lease: LeaseRef,
    /// The attempt number of this run (after the claim's `+1`).
    pub attempt: u32,
    /// The event's attempt limit.
    pub max_attempts: u32,
}

/// Process: what to write after a run, and how to answer. `jitter` is a
/// uniform sample in `[0, 1)`.
///
/// Waits are relative: the store adds them to its own clock, the one that
/// also judges leases.
pub fn settle(run: Claimed, end: RunEnd, policy: &Policy, jitter: f64) -> Plan {
    let (outcome, cancelled) = match end {
        RunEnd::LeaseLost => {
            return Plan::Answer(Answer {
                reply: Reply::Leave,
                tally: Tally::LeaseLost,
            })
        }
        RunEnd::Cancelled => (Outcome::Snooze(Duration::ZERO), true),
        RunEnd::Returned(outcome) => (outcome, false),
    };
    let attempt = |verb: &str, error: &str| {
        format!(
            "attempt {}/{} {verb}: {error}",
            run.attempt, run.max_attempts
        )
    };
    let (finish, reply, how) = match outcome {
        Outcome::Done if policy.keep_done => (Finish::Archive, Reply::Ack, RunSettled::Done),
        Outcome::Done => (Finish::Delete, Reply::Ack, RunSettled::Done),
        Outcome::Snooze(d) => (
            Finish::Release {
                wait: d,
                error: None,
                give_back: true,
            },
            Reply::Nack(policy.queue_delay(d)),
            if cancelled {
                RunSettled::Cancelled
            } else {
                RunSettled::Snoozed
            },
        ),
        Outcome::Fail(error) => (
            Finish::Bury {
                error: attempt("failed for good", &error),
            },
            Reply::Ack,
            RunSettled::Dead,
        ),
        Outcome::Retry { error, .. } if run.attempt >= run.max_attempts => (
            Finish::Bury {
                error: attempt("failed", &error),
            },
            Reply::Ack,
            RunSettled::Dead,
        ),
        Outcome::Retry { error, after } => {
            let wait = after.unwrap_or_else(|| policy.retry.backoff(run.attempt, jitter));
            (
                Finish::Release {
                    wait,
                    error: Some(attempt("failed", &error)),
                    give_back: false,
                },
                Reply::Nack(policy.queue_delay(wait)),
                RunSettled::Retried,
            )
        }
    };
    Plan::Write(Write {
        settle: Settle {
            id: run.lease.id,
            token: Some(run.lease.token),
            finish,
        },
        held: Answer {
            reply,
            tally: Tally::Settled(how),
        },
        // The event and its notification belong to the new holder.
        refused: Answer {
            reply: Reply::Leave,
            tally: Tally::FencedOut,
        },
        // Not `requeued`, which counts notifications put back without a run.
        failed: Answer {
            reply: Reply::Nack(policy.queue_delay(policy.store_retry_delay)),
            tally: Tally::Nothing,
        },
    })
}

#[cfg(test)]
mod tests {
    //! One test per row of the decision table, named after the row.
    use super::*;

    #[test]
    fn a_message_is_answered_by_the_fold_of_its_events_replies() {
        let (a, b, c) = (EventId::new(), EventId::new(), EventId::new());
        let ms = Duration::from_millis;
        assert_eq!(close(&[(a, Reply::Ack)]), Close::Reply(Reply::Ack));
        assert_eq!(
            close(&[(a, Reply::Nack(ms(5)))]),
            Close::Reply(Reply::Nack(ms(5)))
        );
        assert_eq!(close(&[(a, Reply::Leave)]), Close::Reply(Reply::Leave));
        assert_eq!(
            close(&[(a, Reply::Ack), (b, Reply::Ack), (c, Reply::Ack)]),
            Close::Reply(Reply::Ack)
        );
        assert_eq!(
            close(&[(a, Reply::Ack), (b, Reply::Leave), (c, Reply::Nack(ms(5)))]),
            Close::Reply(Reply::Leave),
            "a left event brings the whole message back"
        );
        assert_eq!(
            close(&[(a, Reply::Nack(ms(50))), (b, Reply::Nack(ms(5)))]),
            Close::Reply(Reply::Nack(ms(5))),
            "all requeued: the message itself, at the shortest delay"
        );
        assert_eq!(
            close(&[
                (a, Reply::Ack),
                (b, Reply::Nack(ms(50))),
                (c, Reply::Nack(ms(5)))
            ]),
            Close::RequeueThenAck(vec![(b, ms(50)), (c, ms(5))])
        );
    }
    use crate::model::{EventId, Lease, LeaseToken};

    const NOW: Millis = Millis(1_000_000);

    fn event() -> Event {
        Event {
            rate_turn: None,
            concurrency_key: None,
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
            topic: None,
            created_at: NOW,
            updated_at: NOW,
        }
    }

    fn seen(event: Option<&Event>) -> Inspection<'_> {
        Inspection {
            waiting: None,
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

    fn dropped() -> Plan {
        Plan::Answer(Answer {
            reply: Reply::Ack,
            tally: Tally::Dropped,
        })
    }

    fn requeued(delay: Duration) -> Plan {
        Plan::Answer(Answer {
            reply: Reply::Nack(delay),
            tally: Tally::Requeued,
        })
    }

    fn drop_of(reason: DropReason) -> Admission {
        Admission {
            verdict: Verdict::Drop(reason),
            plan: dropped(),
        }
    }

    #[test]
    fn event_missing_is_dropped() {
        let a = admit(seen(None), &policy(), 0.5);
        assert_eq!(a, drop_of(DropReason::Missing));
    }

    #[test]
    fn finished_event_is_dropped() {
        for state in [EventState::Dead, EventState::Done] {
            let e = Event { state, ..event() };
            let a = admit(seen(Some(&e)), &policy(), 0.5);
            assert_eq!(a, drop_of(DropReason::Finished));
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
        // Kept: a drop writes nothing.
        assert_eq!(admit(s, &policy(), 0.5), drop_of(DropReason::Blocked));
    }

    #[test]
    fn paused_is_dropped_and_kept() {
        let e = event();
        let mut s = seen(Some(&e));
        s.rules = RuleMatch {
            blocked: false,
            paused: true,
        };
        assert_eq!(admit(s, &policy(), 0.5), drop_of(DropReason::Paused));
    }

    #[test]
    fn limited_is_dropped_and_kept() {
        let e = event();
        let wait = crate::limit::LimitWait {
            handler: e.handler.clone(),
            scope: crate::limit::LimitScope::Handler,
            running: 3,
            limit: 3,
        };
        let mut s = seen(Some(&e));
        s.waiting = Some(&wait);
        assert_eq!(admit(s, &policy(), 0.5), drop_of(DropReason::Limited));
        // A rule is reported first: lifting it re-notifies the event.
        s.rules.paused = true;
        assert_eq!(admit(s, &policy(), 0.5), drop_of(DropReason::Paused));
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
            admit(s, &policy(), 0.5).verdict,
            Verdict::Drop(DropReason::Blocked)
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
            admit(s, &policy(), 0.5).verdict,
            Verdict::Drop(DropReason::Paused)
        );
    }

    #[test]
    fn not_yet_due_requeues_with_remaining_delay() {
        let e = Event {
            run_at: NOW.plus(Duration::from_secs(42)),
            ..event()
        };
        assert_eq!(
            admit(seen(Some(&e)), &policy(), 0.5),
            Admission {
                verdict: Verdict::Requeue(RequeueReason::NotYetDue),
                plan: requeued(Duration::from_secs(42)),
            }
        );
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
            admit(seen(Some(&e)), &p, 0.5).plan,
            requeued(Duration::from_secs(600))
        );
    }

    #[test]
    fn unknown_handler_is_dropped_and_kept() {
        let e = event();
        let mut s = seen(Some(&e));
        s.handler_known = false;
        assert_eq!(
            admit(s, &policy(), 0.5),
            drop_of(DropReason::UnknownHandler)
        );
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
        assert_eq!(
            admit(seen(Some(&e)), &policy(), 0.5),
            Admission {
                verdict: Verdict::Requeue(RequeueReason::Leased),
                plan: requeued(Duration::from_millis(10_500)),
            }
        );
        // Jitter only ever adds, so nobody comes back before the expiry.
        assert_eq!(
            admit(seen(Some(&e)), &policy(), 0.0).plan,
            requeued(Duration::from_secs(10))
        );
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
        assert_eq!(
            admit(seen(Some(&e)), &policy(), 0.5).verdict,
            Verdict::Claim
        );
    }

    #[test]
    fn no_lease_is_claimed() {
        let e = event();
        assert_eq!(
            admit(seen(Some(&e)), &policy(), 0.5).verdict,
            Verdict::Claim
        );
    }

    #[test]
    fn expired_lease_without_attempts_left_is_buried() {
        let token = LeaseToken::new();
        let e = Event {
            lease: Some(Lease {
                token,
                expires_at: NOW.minus(Duration::from_secs(1)),
            }),
            attempt: 3,
            ..event()
        };
        let a = admit(seen(Some(&e)), &policy(), 0.5);
        assert_eq!(a.verdict, Verdict::Bury);
        let Plan::Write(w) = a.plan else {
            panic!("a burial writes: {a:?}");
        };
        assert_eq!(w.settle.id, e.id);
        assert_eq!(w.settle.token, Some(token), "fenced by the expired lease");
        assert!(
            matches!(w.settle.finish, Finish::Bury { ref error } if error.contains("3/3")),
            "{w:?}"
        );
        assert_eq!(
            w.held,
            Answer {
                reply: Reply::Ack,
                tally: Tally::Buried
            }
        );
        // Someone claimed it in between: as a lost claim.
        assert_eq!(
            w.refused,
            Answer {
                reply: Reply::Nack(Duration::from_millis(100)),
                tally: Tally::Requeued
            }
        );
        assert_eq!(w.failed, store_failed(&policy()));
    }

    #[test]
    fn lost_claim_requeues() {
        // Asked only after the claim statement refused it: someone else won.
        let e = event();
        assert_eq!(
            admit(seen(Some(&e)), &policy(), 0.5),
            Admission {
                verdict: Verdict::Claim,
                plan: requeued(Duration::from_millis(100)),
            }
        );
    }

    fn run(attempt: u32) -> Claimed {
        Claimed {
            lease: LeaseRef {
                id: EventId::new(),
                token: LeaseToken::new(),
            },
            attempt,
            max_attempts: 3,
        }
    }

    /// The plan of a run whose end the store accepts with `finish`.
    fn written(run: Claimed, finish: Finish, reply: Reply, how: RunSettled) -> Plan {
        Plan::Write(Write {
            settle: Settle {
                id: run.lease.id,
                token: Some(run.lease.token),
                finish,
            },
            held: Answer {
                reply,
                tally: Tally::Settled(how),
            },
            refused: Answer {
                reply: Reply::Leave,
                tally: Tally::FencedOut,
            },
            failed: Answer {
                reply: Reply::Nack(Duration::from_secs(1)),
                tally: Tally::Nothing,
            },
        })
    }

    fn returned(outcome: Outcome) -> RunEnd {
        RunEnd::Returned(outcome)
    }

    #[test]
    fn done_deletes() {
        let r = run(1);
        assert_eq!(
            settle(r, returned(Outcome::Done), &policy(), 0.5),
            written(r, Finish::Delete, Reply::Ack, RunSettled::Done)
        );
    }

    #[test]
    fn done_with_retention_archives() {
        let p = Policy {
            keep_done: true,
            ..policy()
        };
        let r = run(1);
        assert_eq!(
            settle(r, returned(Outcome::Done), &p, 0.5),
            written(r, Finish::Archive, Reply::Ack, RunSettled::Done)
        );
    }

    #[test]
    fn failure_with_attempts_left_retries_with_backoff() {
        let r = run(2);
        let release = Finish::Release {
            wait: Duration::from_secs(2),
            error: Some("attempt 2/3 failed: boom".into()),
            give_back: false,
        };
        assert_eq!(
            settle(r, returned(Outcome::retry("boom")), &policy(), 0.5),
            written(
                r,
                release,
                Reply::Nack(Duration::from_secs(2)),
                RunSettled::Retried
            )
        );
    }

    #[test]
    fn failure_with_retry_after_uses_the_handlers_delay() {
        let out = Outcome::Retry {
            error: "rate limited".into(),
            after: Some(Duration::from_secs(7)),
        };
        let Plan::Write(w) = settle(run(1), returned(out), &policy(), 0.5) else {
            panic!("a failure writes");
        };
        assert!(
            matches!(w.settle.finish, Finish::Release { wait, .. } if wait == Duration::from_secs(7))
        );
        assert_eq!(w.held.reply, Reply::Nack(Duration::from_secs(7)));
    }

    #[test]
    fn failure_without_attempts_left_goes_dead() {
        let r = run(3);
        let bury = Finish::Bury {
            error: "attempt 3/3 failed: boom".into(),
        };
        assert_eq!(
            settle(r, returned(Outcome::retry("boom")), &policy(), 0.5),
            written(r, bury, Reply::Ack, RunSettled::Dead)
        );
    }

    #[test]
    fn failure_for_good_goes_dead_at_once() {
        let r = run(1);
        let bury = Finish::Bury {
            error: "attempt 1/3 failed for good: bad input".into(),
        };
        assert_eq!(
            settle(r, returned(Outcome::fail("bad input")), &policy(), 0.5),
            written(r, bury, Reply::Ack, RunSettled::Dead)
        );
    }

    #[test]
    fn snooze_gives_the_attempt_back() {
        // Snooze at the last attempt still snoozes: the attempt is given back.
        let r = run(3);
        let release = Finish::Release {
            wait: Duration::from_secs(5),
            error: None,
            give_back: true,
        };
        assert_eq!(
            settle(
                r,
                returned(Outcome::Snooze(Duration::from_secs(5))),
                &policy(),
                0.5
            ),
            written(
                r,
                release,
                Reply::Nack(Duration::from_secs(5)),
                RunSettled::Snoozed
            )
        );
    }

    #[test]
    fn shutdown_cancel_snoozes_zero() {
        let r = run(1);
        let release = Finish::Release {
            wait: Duration::ZERO,
            error: None,
            give_back: true,
        };
        assert_eq!(
            settle(r, RunEnd::Cancelled, &policy(), 0.5),
            written(
                r,
                release,
                Reply::Nack(Duration::ZERO),
                RunSettled::Cancelled
            )
        );
    }

    #[test]
    fn lost_lease_cancels_and_writes_nothing() {
        assert_eq!(
            settle(run(1), RunEnd::LeaseLost, &policy(), 0.5),
            Plan::Answer(Answer {
                reply: Reply::Leave,
                tally: Tally::LeaseLost
            })
        );
    }

    #[test]
    fn fenced_out_settle_leaves_the_notification() {
        let Plan::Write(w) = settle(run(1), returned(Outcome::Done), &policy(), 0.5) else {
            panic!("a run's end writes");
        };
        assert_eq!(
            w.refused,
            Answer {
                reply: Reply::Leave,
                tally: Tally::FencedOut
            }
        );
    }

    #[test]
    fn store_error_nacks() {
        assert_eq!(
            store_failed(&policy()),
            Answer {
                reply: Reply::Nack(Duration::from_secs(1)),
                tally: Tally::Requeued
            }
        );
        // A run whose settle failed nacks too, counted only as a store error.
        let Plan::Write(w) = settle(run(1), returned(Outcome::Done), &policy(), 0.5) else {
            panic!("a run's end writes");
        };
        assert_eq!(
            w.failed,
            Answer {
                reply: Reply::Nack(Duration::from_secs(1)),
                tally: Tally::Nothing
            }
        );
    }

    #[test]
    fn run_end_error_is_the_handlers_own_text() {
        assert_eq!(returned(Outcome::retry("boom")).error(), Some("boom"));
        assert_eq!(returned(Outcome::fail("bad")).error(), Some("bad"));
        assert_eq!(returned(Outcome::Done).error(), None);
        assert_eq!(RunEnd::Cancelled.error(), None);
    }
}
